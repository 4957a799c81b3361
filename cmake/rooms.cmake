# The rooms: the one table that both the build (CMakeLists.txt: one object
# library per room of src/, linked to exactly the rooms it uses) and the
# layering check (cmake/layering.cmake: every quoted #include) read.
#
# One line per room: its name, what it holds (directories and files,
# relative to the checkout), and after `|` the rooms it uses directly. A room
# may also use whatever those rooms may use, and itself. `public` is every
# public header (include/bufpool); `all` is everything. A path belongs to the
# room with the longest entry that holds it (src/os/uring.cc is os_uring's,
# the rest of src/os is os's). Adding a room is adding one line; a file in no
# room fails the check. A source added to a room's directory joins that room
# with no edit (the build globs each directory with CONFIGURE_DEPENDS).
set(BUFPOOL_ROOMS
  "base     include/bufpool/export.h include/bufpool/options.h |"
  "os       src/os                                          | base"
  "os_uring src/os/uring.h src/os/uring.cc                  | os"
  "arena    src/arena                                       | os"
  "pool     src/pool include/bufpool/buffer_pool.h include/bufpool/budget.h include/bufpool/holders.h include/bufpool/metrics.h include/bufpool/internal | arena os"
  "c        src/c include/bufpool/c.h                       | pool"
  "chain    src/chain include/bufpool/chain.h include/bufpool/cursor.h include/bufpool/asio.h | pool os"
  "uring    src/uring include/bufpool/uring.h               | chain pool os os_uring"
  "io       src/io include/bufpool/buffered_stream.h include/bufpool/internal/stream_base.h | pool os"
  "copy     src/copy include/bufpool/file_copy.h            | uring pool os os_uring"
  # echo: the public headers, plus os/socket.h and os/error.h (socket and
  # epoll set-up, errno -> Status), which no public header offers.
  "echo     apps/echo                                       | public os tools"
  "tools    tools                                           | public"
  "examples examples                                        | public"
  "bench    bench                                           | all"
  "test     test                                            | all"
)

# Parse the table: BUFPOOL_ROOM_NAMES, and per room room_<name>_holds,
# room_<name>_uses and room_<name>_allowed (uses, closed; with itself).
set(BUFPOOL_ROOM_NAMES)
foreach(line IN LISTS BUFPOOL_ROOMS)
  string(REGEX MATCH "^([a-z_]+) +([^|]*)\\|(.*)$" ok "${line}")
  if(NOT ok)
    message(FATAL_ERROR "rooms: bad table line '${line}'")
  endif()
  set(name "${CMAKE_MATCH_1}")
  separate_arguments(holds UNIX_COMMAND "${CMAKE_MATCH_2}")
  separate_arguments(uses UNIX_COMMAND "${CMAKE_MATCH_3}")
  list(APPEND BUFPOOL_ROOM_NAMES ${name})
  set(room_${name}_holds ${holds})
  set(room_${name}_uses ${uses})
endforeach()
foreach(name IN LISTS BUFPOOL_ROOM_NAMES)
  set(allowed ${name})
  set(todo ${room_${name}_uses})
  while(todo)
    list(POP_FRONT todo next)
    if(next IN_LIST allowed)
      continue()
    endif()
    if(NOT next STREQUAL "public" AND NOT next STREQUAL "all" AND
       NOT next IN_LIST BUFPOOL_ROOM_NAMES)
      message(FATAL_ERROR "rooms: room ${name} uses unknown room '${next}'")
    endif()
    list(APPEND allowed ${next})
    if(next IN_LIST BUFPOOL_ROOM_NAMES)
      list(APPEND todo ${room_${next}_uses})
    endif()
  endwhile()
  set(room_${name}_allowed ${allowed})
endforeach()

# bufpool_room_of(PATH OUT): the room holding PATH (relative to the
# checkout), by its longest matching entry; empty when none does.
function(bufpool_room_of path out)
  set(best "")
  set(best_len 0)
  foreach(name IN LISTS BUFPOOL_ROOM_NAMES)
    foreach(held IN LISTS room_${name}_holds)
      string(LENGTH "${held}" len)
      if((path STREQUAL held OR path MATCHES "^${held}/") AND len GREATER best_len)
        set(best ${name})
        set(best_len ${len})
      endif()
    endforeach()
  endforeach()
  set(${out} "${best}" PARENT_SCOPE)
endfunction()

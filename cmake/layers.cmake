# The layers: the one table that both the build (CMakeLists.txt: one object
# library per layer of src/, linked to exactly the layers it uses) and the
# layering check (cmake/layering.cmake: every quoted #include) read.
#
# One line per layer: its name, what it holds (directories and files,
# relative to the checkout), and after `|` the layers it uses directly. A layer
# may also use whatever those layers may use, and itself. `public` is every
# public header (include/bufpool); `all` is everything. A path belongs to the
# layer with the longest entry that holds it (src/os/uring.cc is os_uring's,
# the rest of src/os is os's). Adding a layer is adding one line; a file in no
# layer fails the check. A source added to a layer's directory joins that layer
# with no edit (the build globs each directory with CONFIGURE_DEPENDS).
set(BUFPOOL_LAYERS
  "base     include/bufpool/export.h include/bufpool/options.h |"
  "os       src/os                                          | base"
  "os_uring src/os/uring.h src/os/uring.cc                  | os"
  "arena    src/arena                                       | os"
  "pool     src/pool include/bufpool/buffer_pool.h include/bufpool/channel.h include/bufpool/budget.h include/bufpool/admission.h include/bufpool/holders.h include/bufpool/metrics.h include/bufpool/internal | arena os"
  "c        src/c include/bufpool/c.h                       | pool"
  # GoogleTest checks for users' tests (header-only; not in the libraries).
  "testing  include/bufpool/testing.h                       | pool"
  "chain    src/chain include/bufpool/chain.h include/bufpool/chain_io.h include/bufpool/internal/chain_inl.h include/bufpool/cursor.h include/bufpool/asio.h | pool os"
  "uring    src/uring include/bufpool/uring.h include/bufpool/internal/uring_inl.h | chain pool os os_uring"
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

# Parse the table: BUFPOOL_LAYER_NAMES, and per layer layer_<name>_holds,
# layer_<name>_uses and layer_<name>_allowed (uses, closed; with itself).
set(BUFPOOL_LAYER_NAMES)
foreach(line IN LISTS BUFPOOL_LAYERS)
  string(REGEX MATCH "^([a-z_]+) +([^|]*)\\|(.*)$" ok "${line}")
  if(NOT ok)
    message(FATAL_ERROR "layers: bad table line '${line}'")
  endif()
  set(name "${CMAKE_MATCH_1}")
  separate_arguments(holds UNIX_COMMAND "${CMAKE_MATCH_2}")
  separate_arguments(uses UNIX_COMMAND "${CMAKE_MATCH_3}")
  list(APPEND BUFPOOL_LAYER_NAMES ${name})
  set(layer_${name}_holds ${holds})
  set(layer_${name}_uses ${uses})
endforeach()
foreach(name IN LISTS BUFPOOL_LAYER_NAMES)
  set(allowed ${name})
  set(todo ${layer_${name}_uses})
  while(todo)
    list(POP_FRONT todo next)
    if(next IN_LIST allowed)
      continue()
    endif()
    if(NOT next STREQUAL "public" AND NOT next STREQUAL "all" AND
       NOT next IN_LIST BUFPOOL_LAYER_NAMES)
      message(FATAL_ERROR "layers: layer ${name} uses unknown layer '${next}'")
    endif()
    list(APPEND allowed ${next})
    if(next IN_LIST BUFPOOL_LAYER_NAMES)
      list(APPEND todo ${layer_${next}_uses})
    endif()
  endwhile()
  set(layer_${name}_allowed ${allowed})
endforeach()

# bufpool_layer_of(PATH OUT): the layer holding PATH (relative to the
# checkout), by its longest matching entry; empty when none does.
function(bufpool_layer_of path out)
  set(best "")
  set(best_len 0)
  foreach(name IN LISTS BUFPOOL_LAYER_NAMES)
    foreach(held IN LISTS layer_${name}_holds)
      string(LENGTH "${held}" len)
      if((path STREQUAL held OR path MATCHES "^${held}/") AND len GREATER best_len)
        set(best ${name})
        set(best_len ${len})
      endif()
    endforeach()
  endforeach()
  set(${out} "${best}" PARENT_SCOPE)
endfunction()

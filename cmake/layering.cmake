# The layering check: every quoted #include in the tree must name a header of
# a room the including file's room may use. Run as a script:
#
#   cmake -DSOURCE_DIR=<checkout> [-DSTAMP=<file>] -P cmake/layering.cmake
#
# Fails with one line per offending include. The build runs it before the
# library's rooms compile (target bufpool_layering), and CTest runs it with a
# planted bad include that it must report (test `layering_finds_a_bad_include`).
# -DEXTRA_FILE=<file> -DEXTRA_AS=<path in the tree> checks one more file as if
# it lay at that path (the planted test's way in).

cmake_minimum_required(VERSION 3.25)

# One line per room: its name, what it holds (directories and public headers,
# relative to the checkout), and after `|` the rooms it may use. A room may
# also use whatever those rooms may use, and itself. `public` is every public
# header (include/bufpool); `all` is everything. Adding a room is adding one
# line; a file in no room fails the check.
set(BUFPOOL_ROOMS
  "base     include/bufpool/export.h include/bufpool/options.h |"
  "os       src/os                                          | base"
  "arena    src/arena                                       | os"
  "pool     src/pool include/bufpool/buffer_pool.h include/bufpool/budget.h include/bufpool/holders.h include/bufpool/metrics.h include/bufpool/internal | arena"
  "c        src/c include/bufpool/c.h                       | pool"
  "chain    src/chain include/bufpool/chain.h include/bufpool/internal/chain_inl.h include/bufpool/cursor.h include/bufpool/asio.h | pool"
  "uring    src/uring include/bufpool/uring.h include/bufpool/internal/uring_inl.h | chain"
  "io       src/io include/bufpool/buffered_stream.h include/bufpool/internal/stream_base.h | pool"
  "copy     src/copy include/bufpool/file_copy.h            | io uring"
  "echo     apps/echo                                       | public os tools"
  "tools    tools                                           | public"
  "examples examples                                        | public"
  "bench    bench                                           | all"
  "test     test                                            | all"
)
# Where a quoted include is looked for when it is not beside the including
# file (the include roots the targets use). One that resolves nowhere is an
# outside library's (Abseil, GoogleTest, CLI11, liburing): not checked.
set(BUFPOOL_INCLUDE_ROOTS include src apps apps/echo tools)

if(NOT SOURCE_DIR)
  message(FATAL_ERROR "layering: pass -DSOURCE_DIR=<the checkout>")
endif()

# Parse the table: room_<name>_holds, room_<name>_uses.
set(rooms)
foreach(line IN LISTS BUFPOOL_ROOMS)
  string(REGEX MATCH "^([a-z_]+) +([^|]*)\\|(.*)$" ok "${line}")
  if(NOT ok)
    message(FATAL_ERROR "layering: bad table line '${line}'")
  endif()
  set(name "${CMAKE_MATCH_1}")
  separate_arguments(holds UNIX_COMMAND "${CMAKE_MATCH_2}")
  separate_arguments(uses UNIX_COMMAND "${CMAKE_MATCH_3}")
  list(APPEND rooms ${name})
  set(room_${name}_holds ${holds})
  set(room_${name}_uses ${uses})
endforeach()

# The rooms each room may use, closed over `uses`.
foreach(name IN LISTS rooms)
  set(allowed ${name})
  set(todo ${room_${name}_uses})
  while(todo)
    list(POP_FRONT todo next)
    if(next IN_LIST allowed)
      continue()
    endif()
    if(NOT next STREQUAL "public" AND NOT next STREQUAL "all" AND
       NOT next IN_LIST rooms)
      message(FATAL_ERROR "layering: room ${name} uses unknown room '${next}'")
    endif()
    list(APPEND allowed ${next})
    if(next IN_LIST rooms)
      list(APPEND todo ${room_${next}_uses})
    endif()
  endwhile()
  set(room_${name}_allowed ${allowed})
endforeach()

# room_of(PATH OUT): the room holding PATH (relative to the checkout), by its
# longest matching entry; empty when none does.
function(room_of path out)
  set(best "")
  set(best_len 0)
  foreach(name IN LISTS rooms)
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

# Every C and C++ file of the tree's rooms.
set(files)
foreach(dir src include apps tools examples bench test)
  file(GLOB_RECURSE found RELATIVE "${SOURCE_DIR}"
       "${SOURCE_DIR}/${dir}/*.h" "${SOURCE_DIR}/${dir}/*.cc"
       "${SOURCE_DIR}/${dir}/*.c")
  list(APPEND files ${found})
endforeach()
if(EXTRA_FILE)
  list(APPEND files "${EXTRA_AS}")
endif()

set(errors 0)
foreach(rel IN LISTS files)
  room_of("${rel}" room)
  if(room STREQUAL "")
    message(NOTICE "layering: ${rel} is in no room: add it to the table "
                   "in cmake/layering.cmake")
    math(EXPR errors "${errors} + 1")
    continue()
  endif()
  if("all" IN_LIST room_${room}_allowed)
    continue()
  endif()
  set(path "${SOURCE_DIR}/${rel}")
  if(EXTRA_FILE AND rel STREQUAL EXTRA_AS)
    set(path "${EXTRA_FILE}")
  endif()
  file(STRINGS "${path}" lines REGEX "^[ \t]*#[ \t]*include[ \t]*\"")
  get_filename_component(dir "${rel}" DIRECTORY)
  foreach(line IN LISTS lines)
    string(REGEX REPLACE "^[ \t]*#[ \t]*include[ \t]*\"([^\"]*)\".*$" "\\1"
           header "${line}")
    # As the compiler looks: beside the file, then the include roots.
    set(target "")
    foreach(base IN ITEMS "${dir}" ${BUFPOOL_INCLUDE_ROOTS})
      if(EXISTS "${SOURCE_DIR}/${base}/${header}")
        file(REAL_PATH "${SOURCE_DIR}/${base}/${header}" abs)
        file(RELATIVE_PATH target "${SOURCE_DIR}" "${abs}")
        break()
      endif()
    endforeach()
    if(target STREQUAL "")
      continue()
    endif()
    room_of("${target}" target_room)
    if(target_room STREQUAL "" OR target_room IN_LIST room_${room}_allowed)
      continue()
    endif()
    if("public" IN_LIST room_${room}_allowed AND target MATCHES "^include/")
      continue()
    endif()
    string(REPLACE ";" " " may "${room_${room}_allowed}")
    message(NOTICE "layering: ${rel} (room ${room}) includes \"${header}\" "
                   "of room ${target_room}; ${room} may use: ${may}")
    math(EXPR errors "${errors} + 1")
  endforeach()
endforeach()

if(errors GREATER 0)
  message(FATAL_ERROR "layering: ${errors} include(s) break the rooms' order "
                      "(docs/architecture.md)")
endif()
if(STAMP)
  file(TOUCH "${STAMP}")
endif()

# The layering check: every quoted #include in the tree must name a header of
# a layer the including file's layer may use. Run as a script:
#
#   cmake -DSOURCE_DIR=<checkout> [-DSTAMP=<file>] -P cmake/layering.cmake
#
# Fails with one line per offending include. The build runs it before the
# library's layers compile (target bufpool_layering), and CTest runs it with a
# planted bad include that it must report (test `layering_finds_a_bad_include`).
# -DEXTRA_FILE=<file> -DEXTRA_AS=<path in the tree> checks one more file as if
# it lay at that path (the planted test's way in).

cmake_minimum_required(VERSION 3.25)

# The layers and what each may use: cmake/layers.cmake, the table the build's
# targets are made from too.
include("${CMAKE_CURRENT_LIST_DIR}/layers.cmake")

# Where a quoted include is looked for when it is not beside the including
# file (the include roots the targets use). One that resolves nowhere is an
# outside library's (Abseil, GoogleTest, CLI11, liburing): not checked.
set(BUFPOOL_INCLUDE_ROOTS include src apps apps/echo tools)

if(NOT SOURCE_DIR)
  message(FATAL_ERROR "layering: pass -DSOURCE_DIR=<the checkout>")
endif()

# Every C and C++ file of the tree's layers.
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
  bufpool_layer_of("${rel}" layer)
  if(layer STREQUAL "")
    message(NOTICE "layering: ${rel} is in no layer: add it to the table "
                   "in cmake/layering.cmake")
    math(EXPR errors "${errors} + 1")
    continue()
  endif()
  if("all" IN_LIST layer_${layer}_allowed)
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
    bufpool_layer_of("${target}" target_layer)
    if(target_layer STREQUAL "" OR target_layer IN_LIST layer_${layer}_allowed)
      continue()
    endif()
    if("public" IN_LIST layer_${layer}_allowed AND target MATCHES "^include/")
      continue()
    endif()
    string(REPLACE ";" " " may "${layer_${layer}_allowed}")
    message(NOTICE "layering: ${rel} (layer ${layer}) includes \"${header}\" "
                   "of layer ${target_layer}; ${layer} may use: ${may}")
    math(EXPR errors "${errors} + 1")
  endforeach()
endforeach()

if(errors GREATER 0)
  message(FATAL_ERROR "layering: ${errors} include(s) break the layers' order "
                      "(docs/architecture.md)")
endif()
if(STAMP)
  file(TOUCH "${STAMP}")
endif()

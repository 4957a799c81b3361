# The README's quick start compiles as written: extracts the first ```cpp
# block of README.md, installs the built tree into a fresh prefix, builds
# the block in a project of its own with find_package(bufpool)
# (test/readme_quickstart), and runs it, which must exit 0 and print
# EXPECT. Fails on any step.
#   -DREADME= -DSOURCE_DIR= -DBUILD_DIR= -DWORK_DIR= -DEXPECT=
include("${CMAKE_CURRENT_LIST_DIR}/run_checked.cmake")
include("${CMAKE_CURRENT_LIST_DIR}/readme_block.cmake")
file(REMOVE_RECURSE "${WORK_DIR}")
file(MAKE_DIRECTORY "${WORK_DIR}")

file(READ "${README}" readme)
readme_block("${readme}" cpp code)
file(WRITE "${WORK_DIR}/quickstart.cc" "${code}\n")

set(prefix "${WORK_DIR}/prefix")
run(${CMAKE_COMMAND} --install "${BUILD_DIR}" --prefix "${prefix}")
run(${CMAKE_COMMAND} -S "${SOURCE_DIR}/test/readme_quickstart"
    -B "${WORK_DIR}/build" -DCMAKE_PREFIX_PATH=${prefix}
    -DCMAKE_BUILD_TYPE=Release -DQUICKSTART_SOURCE=${WORK_DIR}/quickstart.cc)
run(${CMAKE_COMMAND} --build "${WORK_DIR}/build")
# A shared libbufpool is found at run time like any other library.
run(${CMAKE_COMMAND} -E env "LD_LIBRARY_PATH=${prefix}/lib"
    "${WORK_DIR}/build/quickstart")
string(FIND "${last_output}" "${EXPECT}" found)
if(found LESS 0)
  message(FATAL_ERROR "the README's quick start printed:\n${last_output}\n"
                      "expected it to contain: ${EXPECT}")
endif()
message(STATUS "the README's quick start built and ran: ${last_output}")

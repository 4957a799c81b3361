# Runs the Python ctypes example of docs/c_api.md (the ```python block under
# "## From Python") with python3 exactly as printed, as a user of a custom
# prefix would: PKG_CONFIG_PATH names the prefix's pkgconfig directory (as
# for the C and C++ examples) and no LD_LIBRARY_PATH is set (the example
# loads the library by its full path). PC_DIR: that directory, from an
# install; or, for a build tree, LIB_DIR: the directory holding
# libbufpool.so, for which a bufpool.pc naming it is written in WORK_DIR.
include("${CMAKE_CURRENT_LIST_DIR}/readme_block.cmake")
file(READ "${DOC}" doc)
string(FIND "${doc}" "\n## From Python\n" at)
if(at LESS 0)
  message(FATAL_ERROR "${DOC} has no \"## From Python\" section")
endif()
string(SUBSTRING "${doc}" ${at} -1 section)
readme_block("${section}" python code)
if(NOT PC_DIR)
  if(NOT EXISTS "${LIB_DIR}/libbufpool.so")
    message(FATAL_ERROR "no libbufpool.so in ${LIB_DIR}")
  endif()
  set(PC_DIR "${WORK_DIR}/readme_python_pc")
  file(WRITE "${PC_DIR}/bufpool.pc"
    "libdir=${LIB_DIR}\nName: bufpool\nDescription: the build tree's\n"
    "Version: 0\nLibs: -L${LIB_DIR} -lbufpool\n")
endif()
file(WRITE "${WORK_DIR}/readme_example.py" "${code}")
execute_process(
  COMMAND ${CMAKE_COMMAND} -E env --unset=LD_LIBRARY_PATH
          "PKG_CONFIG_PATH=${PC_DIR}"
          "${PYTHON}" "${WORK_DIR}/readme_example.py"
  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "the Python example of docs/c_api.md failed (${rc}):\n${out}")
endif()
message(STATUS "the Python example of docs/c_api.md ran")

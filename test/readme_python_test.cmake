# Runs the Python ctypes example of docs/c_api.md (the ```python block under
# "## From Python") with python3 against a shared libbufpool in LIB_DIR, as a user
# would: its one LIB_DIR line set to that directory, and no environment
# variable (the example loads the library by its full path).
include("${CMAKE_CURRENT_LIST_DIR}/readme_block.cmake")
file(READ "${DOC}" doc)
string(FIND "${doc}" "\n## From Python\n" at)
if(at LESS 0)
  message(FATAL_ERROR "${DOC} has no \"## From Python\" section")
endif()
string(SUBSTRING "${doc}" ${at} -1 section)
readme_block("${section}" python code)
string(REGEX MATCH "\nLIB_DIR = \"[^\"\n]*\"" lib_dir_line "${code}")
if(NOT lib_dir_line)
  message(FATAL_ERROR "the Python example of docs/c_api.md has no LIB_DIR = \"...\" line")
endif()
string(REPLACE "${lib_dir_line}" "\nLIB_DIR = \"${LIB_DIR}\"" code "${code}")
# The example falls back to the loader's search only when LIB_DIR has no
# libbufpool.so; here it must load the one in LIB_DIR.
if(NOT EXISTS "${LIB_DIR}/libbufpool.so")
  message(FATAL_ERROR "no libbufpool.so in ${LIB_DIR}")
endif()
file(WRITE "${WORK_DIR}/readme_example.py" "${code}")
execute_process(
  COMMAND ${CMAKE_COMMAND} -E env --unset=LD_LIBRARY_PATH
          "${PYTHON}" "${WORK_DIR}/readme_example.py"
  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "the Python example of docs/c_api.md failed (${rc}):\n${out}")
endif()
message(STATUS "the Python example of docs/c_api.md ran")

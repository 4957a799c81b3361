# Runs the README's Python ctypes example (the ```python block under
# "## C API") with python3 against a shared libbufpool in LIB_DIR.
include("${CMAKE_CURRENT_LIST_DIR}/readme_block.cmake")
file(READ "${README}" readme)
string(FIND "${readme}" "\n## C API\n" at)
if(at LESS 0)
  message(FATAL_ERROR "README.md has no \"## C API\" section")
endif()
string(SUBSTRING "${readme}" ${at} -1 section)
readme_block("${section}" python code)
file(WRITE "${WORK_DIR}/readme_example.py" "${code}")
execute_process(
  COMMAND ${CMAKE_COMMAND} -E env "LD_LIBRARY_PATH=${LIB_DIR}"
          "${PYTHON}" "${WORK_DIR}/readme_example.py"
  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "the README's Python example failed (${rc}):\n${out}")
endif()
message(STATUS "the README's Python example ran")

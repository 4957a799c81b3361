# Installs the built tree into a fresh prefix, then configures, builds and runs
# test/install_consumer against it with find_package(bufpool CONFIG REQUIRED),
# and compiles the same program through pkg-config. Fails on any step.
file(REMOVE_RECURSE "${WORK_DIR}")
set(prefix "${WORK_DIR}/prefix")

function(run)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "failed (${rc}): ${ARGN}\n${out}")
  endif()
  set(last_output "${out}" PARENT_SCOPE)
endfunction()

run(${CMAKE_COMMAND} --install "${BUILD_DIR}" --prefix "${prefix}")
foreach(f include/bufpool/buffer_pool.h lib/cmake/bufpool/bufpoolConfig.cmake
          lib/cmake/bufpool/bufpoolConfigVersion.cmake lib/pkgconfig/bufpool.pc)
  if(NOT EXISTS "${prefix}/${f}")
    message(FATAL_ERROR "install is missing ${f}")
  endif()
endforeach()
if(EXISTS "${prefix}/include/arena" OR EXISTS "${prefix}/include/pool")
  message(FATAL_ERROR "private headers were installed")
endif()

run(${CMAKE_COMMAND} -S "${SOURCE_DIR}/test/install_consumer" -B "${WORK_DIR}/build"
    -DCMAKE_PREFIX_PATH=${prefix} -DCMAKE_BUILD_TYPE=Release)
run(${CMAKE_COMMAND} --build "${WORK_DIR}/build")
run("${WORK_DIR}/build/consumer")
if(NOT last_output MATCHES "consumer ok")
  message(FATAL_ERROR "consumer printed: ${last_output}")
endif()

# pkg-config users get the same library.
find_program(PKG_CONFIG pkg-config)
if(PKG_CONFIG)
  set(ENV{PKG_CONFIG_PATH} "${prefix}/lib/pkgconfig")
  run(${PKG_CONFIG} --cflags --libs bufpool)
  string(STRIP "${last_output}" flags)
  separate_arguments(flags UNIX_COMMAND "${flags}")
  run(c++ "${SOURCE_DIR}/test/install_consumer/consumer.cc" -o "${WORK_DIR}/consumer_pc" ${flags})
  # A shared libbufpool is found at run time like any other library.
  run(${CMAKE_COMMAND} -E env "LD_LIBRARY_PATH=${prefix}/lib" "${WORK_DIR}/consumer_pc")
  if(NOT last_output MATCHES "consumer ok")
    message(FATAL_ERROR "pkg-config consumer printed: ${last_output}")
  endif()
endif()
message(STATUS "install consumer test passed")

# Installs the built tree into a fresh prefix, checks that the CMake package
# and bufpool.pc carry the project's VERSION, then configures, builds and runs
# test/install_consumer (C++ programs on the pool and on the io_uring toolkit,
# and a C program) and test/install_consumer_c
# (the C program in a project without C++) against it with
# find_package(bufpool CONFIG REQUIRED), and compiles both programs through
# pkg-config, the C one exactly as c.h's users are told to:
#   gcc -std=c11 -Wall -Wextra -Werror prog.c $(pkg-config --cflags --libs bufpool)
# A shared package also runs the README's Python example against itself.
# Then does the same for the other linkage: a static build also links and
# installs libbufpool as a shared library (the library alone, from the
# build's own objects), and a shared build a static one, so both kinds of
# package are checked on every run.
# Fails on any step.
file(REMOVE_RECURSE "${WORK_DIR}")

include("${CMAKE_CURRENT_LIST_DIR}/run_checked.cmake")

# Runs every consumer check against the build in `build_dir`, installed into
# `work`/prefix.
function(check_package build_dir work)
  set(prefix "${work}/prefix")
  run(${CMAKE_COMMAND} --install "${build_dir}" --prefix "${prefix}")
  foreach(f include/bufpool/buffer_pool.h include/bufpool/c.h
            include/bufpool/export.h include/bufpool/options.h
            include/bufpool/uring.h lib/cmake/bufpool/bufpoolConfig.cmake
            lib/cmake/bufpool/bufpoolConfigVersion.cmake lib/pkgconfig/bufpool.pc)
    if(NOT EXISTS "${prefix}/${f}")
      message(FATAL_ERROR "install is missing ${f}")
    endif()
  endforeach()
  if(EXISTS "${prefix}/include/arena" OR EXISTS "${prefix}/include/pool")
    message(FATAL_ERROR "private headers were installed")
  endif()
  if(EXISTS "${prefix}/include/bufpool/echo_server.h" OR
     EXISTS "${prefix}/include/echo")
    message(FATAL_ERROR "the echo server (apps/echo) was installed as API")
  endif()

  # A shared libbufpool exports the public API only: C API functions and
  # bufpool:: C++ symbols (with their typeinfo), nothing of Abseil or std.
  file(GLOB shared_lib "${prefix}/lib/libbufpool.so.*.*.*")  # the real file
  if(shared_lib)
    run(nm -D --defined-only --format=posix "${shared_lib}")
    string(REPLACE "\n" ";" lines "${last_output}")
    set(c_api 0)
    foreach(line IN LISTS lines)
      string(REGEX REPLACE " .*" "" sym "${line}")
      if(sym STREQUAL "")
        continue()
      elseif(sym MATCHES "^bufpool_")
        math(EXPR c_api "${c_api} + 1")
      elseif(NOT sym MATCHES "^_Z(T[IVSHW]|GV)?NK?7bufpool" AND
             NOT sym MATCHES "^(_init|_fini|__bss_start|_edata|_end)$")
        message(FATAL_ERROR "libbufpool.so exports ${sym}, outside the public API")
      endif()
    endforeach()
    if(c_api LESS 10)
      message(FATAL_ERROR "libbufpool.so exports ${c_api} bufpool_* functions")
    endif()
  endif()

  run(${CMAKE_COMMAND} -S "${SOURCE_DIR}/test/install_consumer" -B "${work}/build"
      -DCMAKE_PREFIX_PATH=${prefix} -DCMAKE_BUILD_TYPE=Release
      -DBUFPOOL_EXPECT_VERSION=${VERSION})
  run(${CMAKE_COMMAND} --build "${work}/build")
  # A shared libbufpool is found at run time like any other library.
  set(env ${CMAKE_COMMAND} -E env "LD_LIBRARY_PATH=${prefix}/lib")
  run(${env} "${work}/build/consumer")
  if(NOT last_output MATCHES "consumer ok")
    message(FATAL_ERROR "consumer printed: ${last_output}")
  endif()
  run(${env} "${work}/build/c_consumer")
  if(NOT last_output MATCHES "c consumer ok")
    message(FATAL_ERROR "C consumer printed: ${last_output}")
  endif()
  run(${env} "${work}/build/uring_consumer")
  if(NOT last_output MATCHES "uring consumer ok")
    message(FATAL_ERROR "io_uring consumer printed: ${last_output}")
  endif()

  # A C-only project: the C compiler links.
  run(${CMAKE_COMMAND} -S "${SOURCE_DIR}/test/install_consumer_c" -B "${work}/build_c"
      -DCMAKE_PREFIX_PATH=${prefix} -DCMAKE_BUILD_TYPE=Release)
  run(${CMAKE_COMMAND} --build "${work}/build_c")
  run(${env} "${work}/build_c/c_consumer")
  if(NOT last_output MATCHES "c consumer ok")
    message(FATAL_ERROR "C-only project's consumer printed: ${last_output}")
  endif()

  # pkg-config users get the same library; C++ adds the standard itself.
  find_program(PKG_CONFIG pkg-config REQUIRED)
  set(ENV{PKG_CONFIG_PATH} "${prefix}/lib/pkgconfig")
  run(${PKG_CONFIG} --modversion bufpool)
  string(STRIP "${last_output}" pc_version)
  if(NOT pc_version STREQUAL VERSION)
    message(FATAL_ERROR "bufpool.pc says version ${pc_version}, the project ${VERSION}")
  endif()
  run(${PKG_CONFIG} --cflags --libs bufpool)
  string(STRIP "${last_output}" flags)
  separate_arguments(flags UNIX_COMMAND "${flags}")
  run(c++ -std=c++20 "${SOURCE_DIR}/test/install_consumer/consumer.cc"
      -o "${work}/consumer_pc" ${flags})
  run(${env} "${work}/consumer_pc")
  if(NOT last_output MATCHES "consumer ok")
    message(FATAL_ERROR "pkg-config consumer printed: ${last_output}")
  endif()
  run(gcc -std=c11 -Wall -Wextra -Werror
      "${SOURCE_DIR}/test/install_consumer/c_consumer.c"
      -o "${work}/c_consumer_pc" ${flags})
  run(${env} "${work}/c_consumer_pc")
  if(NOT last_output MATCHES "c consumer ok")
    message(FATAL_ERROR "pkg-config C consumer printed: ${last_output}")
  endif()
  # A program that calls liburing through bufpool/uring.h links with
  # `pkg-config --libs bufpool` alone, with the static and the shared library.
  run(c++ -std=c++20 "${SOURCE_DIR}/test/install_consumer/uring_consumer.cc"
      -o "${work}/uring_consumer_pc" ${flags})
  run(${env} "${work}/uring_consumer_pc")
  if(NOT last_output MATCHES "uring consumer ok")
    message(FATAL_ERROR "pkg-config io_uring consumer printed: ${last_output}")
  endif()

  # A shared library in this prefix is found without LD_LIBRARY_PATH by a
  # program that records its directory, as the README's quick start says:
  # -Wl,-rpath,$(pkg-config --variable=libdir bufpool).
  if(shared_lib)
    run(${PKG_CONFIG} --variable=libdir bufpool)
    string(STRIP "${last_output}" pc_libdir)
    run(c++ -std=c++20 "${SOURCE_DIR}/test/install_consumer/consumer.cc"
        -o "${work}/consumer_rpath" ${flags} "-Wl,-rpath,${pc_libdir}")
    run(${CMAKE_COMMAND} -E env --unset=LD_LIBRARY_PATH "${work}/consumer_rpath")
    if(NOT last_output MATCHES "consumer ok")
      message(FATAL_ERROR "rpath consumer printed: ${last_output}")
    endif()
  endif()

  # The README's Python example, against the installed shared library loaded
  # by its full path in the prefix, as the README shows it (no environment).
  if(shared_lib AND PYTHON)
    run(${CMAKE_COMMAND} -DREADME=${SOURCE_DIR}/README.md
        -DLIB_DIR=${prefix}/lib -DPYTHON=${PYTHON} -DWORK_DIR=${work}
        -P "${CMAKE_CURRENT_LIST_DIR}/readme_python_test.cmake")
  endif()
endfunction()

check_package("${BUILD_DIR}" "${WORK_DIR}/main")
message(STATUS "install consumer test passed for ${BUILD_DIR}")

# The other linkage: the library alone, with this build's toolchain and
# flags (OTHER_CACHE), linked from this build's objects where the build
# lists them (bufpool_objects.txt: what is checked is the package, and the
# objects are the same either way), else compiled again without
# optimisation or debug information; then checked as above.
if(BUILD_SHARED)
  set(other OFF)
else()
  set(other ON)
endif()
set(other_args)
if(EXISTS "${BUILD_DIR}/bufpool_objects.txt")
  list(APPEND other_args
    -DBUFPOOL_PREBUILT_OBJECTS_FILE=${BUILD_DIR}/bufpool_objects.txt)
elseif(BUILD_TYPE)
  string(TOUPPER "${BUILD_TYPE}" bt)
  set(ndebug "-DNDEBUG")  # asserts as the build type has them
  if(bt STREQUAL "DEBUG")
    set(ndebug "")
  endif()
  list(APPEND other_args "-DCMAKE_CXX_FLAGS_${bt}=${ndebug}"
       "-DCMAKE_C_FLAGS_${bt}=${ndebug}")
endif()
run(${CMAKE_COMMAND} -C "${OTHER_CACHE}" -S "${SOURCE_DIR}"
    -B "${WORK_DIR}/other_build"
    -DBUILD_SHARED_LIBS=${other} -DCMAKE_BUILD_TYPE=${BUILD_TYPE}
    ${other_args}
    -DBUFPOOL_BUILD_TESTS=OFF -DBUFPOOL_BUILD_BENCHMARKS=OFF
    -DBUFPOOL_BUILD_TOOLS=OFF -DBUFPOOL_BUILD_EXAMPLES=OFF)
run(${CMAKE_COMMAND} --build "${WORK_DIR}/other_build" --target bufpool)
check_package("${WORK_DIR}/other_build" "${WORK_DIR}/other")
message(STATUS "install consumer test passed (BUILD_SHARED_LIBS=${other})")

# Installs the built tree into a fresh prefix, checks that the CMake package
# and bufpool.pc carry the project's VERSION, then configures, builds and runs
# test/install_consumer (C++ programs on the pool and on the io_uring toolkit,
# and a C program, on bufpool::bufpool; a C++ program on pool and chains and
# the C program on bufpool::core, which must not need liburing: their
# needed libraries are checked with ldd and readelf) and test/install_consumer_c
# (the C program in a project without C++) against it with
# find_package(bufpool CONFIG REQUIRED), and compiles both programs through
# pkg-config, the C one exactly as c.h's users are told to:
#   gcc -std=c11 -Wall -Wextra -Werror prog.c $(pkg-config --cflags --libs bufpool)
# A shared package also runs docs/c_api.md's Python example against itself.
# Then does the same for the other linkage: a static build also links and
# installs libbufpool as a shared library (the library alone, from the
# build's own objects), and a shared build a static one, so both kinds of
# package are checked on every run.
# PART (<linkage>:<consumers>) picks one quarter: the main or the other
# linkage, the CMake or the pkg-config consumers (see the end of the file).
# Fails on any step.
cmake_policy(SET CMP0057 NEW)  # if(IN_LIST) in script mode
file(REMOVE_RECURSE "${WORK_DIR}")

include("${CMAKE_CURRENT_LIST_DIR}/run_checked.cmake")

# expect_no_liburing(PROGRAM): fails unless neither PROGRAM's own needed
# entries (readelf -d) nor the libraries it loads (ldd, with the prefix's
# lib/ on the search path) name liburing. Uses `env` and `prefix`.
function(expect_no_liburing program)
  run(readelf -d "${program}")
  if(last_output MATCHES "liburing")
    message(FATAL_ERROR "${program} needs liburing:\n${last_output}")
  endif()
  if(NOT last_output MATCHES "NEEDED")
    message(FATAL_ERROR "readelf -d ${program} listed no NEEDED entries")
  endif()
  run(${CMAKE_COMMAND} -E env "LD_LIBRARY_PATH=${prefix}/lib" ldd "${program}")
  if(last_output MATCHES "liburing")
    message(FATAL_ERROR "${program} loads liburing:\n${last_output}")
  endif()
  if(shared_lib AND NOT last_output MATCHES "libbufpool_core\\.so")
    message(FATAL_ERROR "${program} does not load libbufpool_core:\n${last_output}")
  endif()
endfunction()

# check_cmake_consumers() and check_pkgconfig_consumers(): the two halves
# of check_package below, as macros that run in its scope (prefix, work,
# env, shared_lib).
macro(check_cmake_consumers)
  run(${CMAKE_COMMAND} -S "${SOURCE_DIR}/test/install_consumer" -B "${work}/build"
      -DCMAKE_PREFIX_PATH=${prefix} -DCMAKE_BUILD_TYPE=Release
      -DBUFPOOL_EXPECT_VERSION=${VERSION})
  run(${CMAKE_COMMAND} --build "${work}/build")
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
  # The installed program runs from its prefix with no environment: the
  # package records a shared library's directory (RUNPATH), as CMake's
  # build-tree RPATH did before the install dropped it.
  run(${CMAKE_COMMAND} --install "${work}/build" --prefix "${work}/consumer_prefix")
  run(${CMAKE_COMMAND} -E env --unset=LD_LIBRARY_PATH
      "${work}/consumer_prefix/bin/consumer")
  if(NOT last_output MATCHES "consumer ok")
    message(FATAL_ERROR "installed consumer printed: ${last_output}")
  endif()
  # A user's GoogleTest suite on bufpool/testing.h: a leak fails naming its
  # site; no leak passes.
  run(${env} "${work}/build/testing_consumer")
  if(NOT last_output MATCHES "testing consumer ok")
    message(FATAL_ERROR "testing consumer printed: ${last_output}")
  endif()
  # bufpool/metrics.h names every family the library writes.
  run(${env} "${work}/build/metrics_consumer")
  string(REGEX MATCHALL "# TYPE [a-z_]+" types "${last_output}")
  list(LENGTH types ntypes)
  if(ntypes LESS 15)
    message(FATAL_ERROR "metrics consumer wrote ${ntypes} families:\n${last_output}")
  endif()
  file(READ "${prefix}/include/bufpool/metrics.h" metrics_h)
  foreach(type IN LISTS types)
    string(REPLACE "# TYPE " "" family "${type}")
    string(FIND "${metrics_h}" "${family}" at)
    if(at LESS 0)
      message(FATAL_ERROR "bufpool/metrics.h does not list ${family}")
    endif()
  endforeach()
  # bufpool::core's programs run, and neither they nor anything they load
  # needs liburing (ldd: every library loaded; readelf: the executable's
  # own entries, also when the library is static).
  foreach(prog core_consumer c_core_consumer)
    run(${env} "${work}/build/${prog}")
    if(NOT last_output MATCHES "core consumer ok|c consumer ok")
      message(FATAL_ERROR "${prog} printed: ${last_output}")
    endif()
    expect_no_liburing("${work}/build/${prog}")
  endforeach()

  # A C-only project: the C compiler links.
  run(${CMAKE_COMMAND} -S "${SOURCE_DIR}/test/install_consumer_c" -B "${work}/build_c"
      -DCMAKE_PREFIX_PATH=${prefix} -DCMAKE_BUILD_TYPE=Release)
  run(${CMAKE_COMMAND} --build "${work}/build_c")
  run(${env} "${work}/build_c/c_consumer")
  if(NOT last_output MATCHES "c consumer ok")
    message(FATAL_ERROR "C-only project's consumer printed: ${last_output}")
  endif()
  # The same on bufpool::core, configured where pkg-config finds no
  # liburing: the package and the core need none.
  run(${CMAKE_COMMAND} -E env PKG_CONFIG_PATH= PKG_CONFIG_LIBDIR=${work}/no-pc
      ${CMAKE_COMMAND} -S "${SOURCE_DIR}/test/install_consumer_c"
      -B "${work}/build_c_core" -DBUFPOOL_CORE_ONLY=ON
      -DCMAKE_PREFIX_PATH=${prefix} -DCMAKE_BUILD_TYPE=Release)
  run(${CMAKE_COMMAND} --build "${work}/build_c_core")
  run(${env} "${work}/build_c_core/c_consumer")
  if(NOT last_output MATCHES "c consumer ok")
    message(FATAL_ERROR "C-only project's core consumer printed: ${last_output}")
  endif()
  expect_no_liburing("${work}/build_c_core/c_consumer")

endmacro()

macro(check_pkgconfig_consumers)
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
  # The installed frame_server example builds from the installed package
  # alone, as its users are told: pkg-config --static bufpool, -luring.
  run(${PKG_CONFIG} --static --cflags --libs bufpool)
  string(STRIP "${last_output}" static_flags)
  separate_arguments(static_flags UNIX_COMMAND "${static_flags}")
  run(c++ -std=c++20 -Wall -Wextra
      "${prefix}/share/doc/bufpool/examples/frame_server.cc"
      -o "${work}/frame_server_pc" ${static_flags} -luring)
  execute_process(COMMAND ${env} "${work}/frame_server_pc" --buffers 0
                  RESULT_VARIABLE rc ERROR_VARIABLE err)
  if(NOT rc EQUAL 2 OR NOT err MATCHES "^frame_server: ")
    message(FATAL_ERROR "installed frame_server: exit ${rc}: ${err}")
  endif()
  # bufpool_core.pc: the C program and the pool-and-chains program, with no
  # liburing on their command lines or in what they load.
  run(${PKG_CONFIG} --cflags --libs bufpool_core)
  string(STRIP "${last_output}" core_flags)
  if(core_flags MATCHES "uring")
    message(FATAL_ERROR "bufpool_core.pc names liburing: ${core_flags}")
  endif()
  separate_arguments(core_flags UNIX_COMMAND "${core_flags}")
  run(gcc -std=c11 -Wall -Wextra -Werror
      "${SOURCE_DIR}/test/install_consumer/c_consumer.c"
      -o "${work}/c_core_consumer_pc" ${core_flags})
  run(c++ -std=c++20 "${SOURCE_DIR}/test/install_consumer/core_consumer.cc"
      -o "${work}/core_consumer_pc" ${core_flags})
  foreach(prog c_core_consumer_pc core_consumer_pc)
    run(${env} "${work}/${prog}")
    if(NOT last_output MATCHES "consumer ok")
      message(FATAL_ERROR "pkg-config ${prog} printed: ${last_output}")
    endif()
    expect_no_liburing("${work}/${prog}")
  endforeach()
  # A program that calls liburing through bufpool/uring.h links with
  # `pkg-config --libs bufpool` alone, with the static and the shared library.
  run(c++ -std=c++20 "${SOURCE_DIR}/test/install_consumer/uring_consumer.cc"
      -o "${work}/uring_consumer_pc" ${flags})
  run(${env} "${work}/uring_consumer_pc")
  if(NOT last_output MATCHES "uring consumer ok")
    message(FATAL_ERROR "pkg-config io_uring consumer printed: ${last_output}")
  endif()

  # The installed examples build with the command their comments give,
  # pkg-config's bufpool alone, and run.
  run(c++ -std=c++20 "${prefix}/share/doc/bufpool/examples/resp_server.cc"
      -o "${work}/resp_server_pc" ${flags})
  run(${env} "${work}/resp_server_pc" 0 1)

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

  # docs/c_api.md's Python example as printed, against the installed shared
  # library, found through the prefix's bufpool.pc (PKG_CONFIG_PATH, as for
  # the C and C++ examples) and loaded by its full path.
  if(shared_lib AND PYTHON)
    run(${CMAKE_COMMAND} -DDOC=${SOURCE_DIR}/docs/c_api.md
        -DPC_DIR=${prefix}/lib/pkgconfig -DPYTHON=${PYTHON} -DWORK_DIR=${work}
        -P "${CMAKE_CURRENT_LIST_DIR}/readme_python_test.cmake")
  endif()
endmacro()

# Installs the build in `build_dir` into `work`/prefix, checks what the
# install holds and exports, then runs the consumer checks of each of
# `phases` (cmake, pkg-config) against it.
function(check_package build_dir work phases)
  set(prefix "${work}/prefix")
  run(${CMAKE_COMMAND} --install "${build_dir}" --prefix "${prefix}")
  foreach(f include/bufpool/buffer_pool.h include/bufpool/c.h
            include/bufpool/export.h include/bufpool/options.h
            include/bufpool/uring.h share/doc/bufpool/docs/uring.md
            share/doc/bufpool/examples/uring_echo.cc
            share/doc/bufpool/examples/frame_server.cc
            lib/cmake/bufpool/bufpoolConfig.cmake
            lib/cmake/bufpool/bufpoolConfigVersion.cmake lib/pkgconfig/bufpool.pc
            lib/pkgconfig/bufpool_core.pc)
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
  file(GLOB shared_core "${prefix}/lib/libbufpool_core.so.*.*.*")
  if(shared_lib AND NOT shared_core)
    message(FATAL_ERROR "a shared install without libbufpool_core.so")
  endif()
  foreach(lib IN LISTS shared_lib shared_core)
    run(nm -D --defined-only --format=posix "${lib}")
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
        message(FATAL_ERROR "${lib} exports ${sym}, outside the public API")
      endif()
    endforeach()
    if(c_api LESS 10)
      message(FATAL_ERROR "${lib} exports ${c_api} bufpool_* functions")
    endif()
  endforeach()
  # The same soname scheme for both: lib<name>.so.<major>.<minor>.
  if(shared_core)
    run(readelf -d "${shared_core}")
    if(NOT last_output MATCHES "SONAME[^\n]*libbufpool_core\\.so\\.[0-9]+\\.[0-9]+\\]")
      message(FATAL_ERROR "libbufpool_core's soname:\n${last_output}")
    endif()
    if(last_output MATCHES "liburing")
      message(FATAL_ERROR "libbufpool_core.so needs liburing:\n${last_output}")
    endif()
  endif()

  # A shared libbufpool is found at run time like any other library.
  set(env ${CMAKE_COMMAND} -E env "LD_LIBRARY_PATH=${prefix}/lib")
  if("cmake" IN_LIST phases)
    check_cmake_consumers()
  endif()
  if("pkg-config" IN_LIST phases)
    check_pkgconfig_consumers()
  endif()
endfunction()

# PART is <linkage>:<consumers>: main (this build) or other (below), and
# cmake or pkg-config; test/CMakeLists.txt runs the four as separate tests
# so that they run side by side.
string(REPLACE ":" ";" part "${PART}")
list(GET part 0 linkage)
list(GET part 1 consumers)
if(linkage STREQUAL "main")
  check_package("${BUILD_DIR}" "${WORK_DIR}/main" "${consumers}")
  message(STATUS "install consumer test (${consumers}) passed for ${BUILD_DIR}")
  return()
endif()

# The other linkage: the libraries alone, with this build's toolchain and
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
if(EXISTS "${BUILD_DIR}/bufpool_objects")
  list(APPEND other_args
    -DBUFPOOL_PREBUILT_OBJECTS_DIR=${BUILD_DIR}/bufpool_objects)
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
run(${CMAKE_COMMAND} --build "${WORK_DIR}/other_build" --target bufpool bufpool_core)
check_package("${WORK_DIR}/other_build" "${WORK_DIR}/other" "${consumers}")
message(STATUS
  "install consumer test (${consumers}) passed (BUILD_SHARED_LIBS=${other})")

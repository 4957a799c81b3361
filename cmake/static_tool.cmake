# bufpool_link_dependencies_statically(TARGET): links an executable's
# dependencies that have static archives (Abseil, liburing, the C++ runtime)
# into the program itself, so that starting it maps and relocates only libc
# and libm. A copy tool is judged against cp, which starts in about 1.5 ms;
# with Abseil's 31 shared libraries bufpool-copy started in about 3.8 ms.
#
# Only where libbufpool itself is a static library: a shared libbufpool
# brings Abseil's shared libraries, and a second, static copy in the program
# would give it two of each Abseil global. Off under the sanitizers (their
# runtimes expect the shared C++ runtime), when BUFPOOL_STATIC_TOOLS is OFF,
# or when Abseil's archives are not installed (Debian's libabsl-dev ships
# them); then the program links as any other.
function(bufpool_link_dependencies_statically target)
  if(NOT BUFPOOL_STATIC_TOOLS OR BUILD_SHARED_LIBS OR
     CMAKE_CXX_FLAGS MATCHES "-fsanitize")
    return()
  endif()
  get_target_property(absl_base absl::base LOCATION)
  get_filename_component(absl_dir "${absl_base}" DIRECTORY)
  file(GLOB absl_archives "${absl_dir}/libabsl_*.a")
  find_library(BUFPOOL_LIBURING_ARCHIVE NAMES liburing.a
               HINTS ${LIBURING_LIBRARY_DIRS})
  if(NOT absl_archives OR NOT BUFPOOL_LIBURING_ARCHIVE)
    message(STATUS "${target}: Abseil's or liburing's static archives not "
                   "found; linking them as shared libraries")
    return()
  endif()
  # The archives come right after the target's own libraries, so their
  # members resolve what libbufpool needs; --as-needed then drops the shared
  # libraries the usage requirements add after them, which nothing uses.
  # One group: Abseil's archives call each other in no single order.
  target_link_libraries(${target} PRIVATE
    "-Wl,--start-group" ${absl_archives} "${BUFPOOL_LIBURING_ARCHIVE}"
    "-Wl,--end-group")
  target_link_options(${target} PRIVATE
    -static-libstdc++ -static-libgcc "LINKER:--as-needed")
endfunction()

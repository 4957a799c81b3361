# shellcheck shell=bash
# Sourced by tools/test, tools/bench, tools/fuzz and bench/run_* (bash).
# fresh_if_other_generator DIR...: the presets build with Ninja; a build
# directory that CMake configured with another generator (Unix Makefiles,
# before 0.3.0) loses its cache, so the next configure starts it afresh
# instead of failing ("does not match the generator used previously").
fresh_if_other_generator() {
  local dir
  for dir in "$@"; do
    if [ -f "$dir/CMakeCache.txt" ] &&
        ! grep -qx 'CMAKE_GENERATOR:INTERNAL=Ninja' "$dir/CMakeCache.txt"; then
      echo "preset-dirs: $dir was configured with another generator;" \
           "configuring it afresh with Ninja" >&2
      rm -rf "$dir/CMakeCache.txt" "$dir/CMakeFiles"
    fi
  done
}

/* Nothing of its own: the target that carries it (bufpool_python in
 * test/CMakeLists.txt) is the static libbufpool, whole, as a shared
 * libbufpool.so, for the README's ctypes example in a static build. */
typedef int bufpool_python_lib_has_no_code;

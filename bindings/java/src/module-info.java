/**
 * libbufpool for Java: pooled, page-aligned direct buffers over the
 * library's C API through the Foreign Function &amp; Memory API (JDK 22+).
 * Run with {@code --enable-native-access=io.bufpool} (module path) or
 * {@code --enable-native-access=ALL-UNNAMED} (class path).
 */
module io.bufpool {
  exports io.bufpool;
}

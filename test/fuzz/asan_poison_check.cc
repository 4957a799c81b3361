// Built by the fuzz preset (clang with ASan): writes into a buffer after
// releasing it, which ASan must report as use-after-poison. clang 14
// defines no __SANITIZE_ADDRESS__, so this checks that the library compiled
// by clang with ASan poisons released buffers, which the GCC asan preset's
// tests cannot see.
#include <cstdio>

#include "bufpool/buffer_pool.h"

int main() {
  auto pool = bufpool::BufferPool::Create({.buffer_count = 64});
  if (!pool.ok()) {
    std::fprintf(stderr, "%s\n", pool.status().ToString().c_str());
    return 2;
  }
  std::byte* volatile p = (*pool)->TryAcquireRaw();
  (*pool)->ReleaseRaw(p);
  p[10] = std::byte{1};  // ASan stops the process here
  std::fprintf(stderr, "a write into a released buffer was not reported\n");
  return 1;
}

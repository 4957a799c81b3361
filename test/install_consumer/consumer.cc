// Uses the installed library the way the README shows.
#include <cstdio>
#include <cstring>

#include "bufpool/buffer_pool.h"

int main() {
  auto pool = bufpool::BufferPool::Create({.buffer_count = 16});
  if (!pool.ok()) {
    std::fprintf(stderr, "%s\n", pool.status().ToString().c_str());
    return 1;
  }
  bufpool::Buffer b = (*pool)->TryAcquire();
  if (!b || b.size() != 4096) return 1;
  std::memset(b.data(), 0x5a, b.size());
  b.Reset();
  if ((*pool)->Stats().in_use != 0) return 1;
  std::puts("consumer ok");
  return 0;
}

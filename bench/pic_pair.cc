// The hot pair compiled with -fPIC into a shared object, as a plugin or a
// library that embeds the pool would call it (bench/core_benchmark.cc
// compares it with the same loop in the executable). Its references to the
// pool's slow paths and thread-local cache table resolve against the
// executable at load time.
#include <cstddef>
#include <cstdlib>

#include "bufpool/buffer_pool.h"

extern "C" __attribute__((visibility("default"))) void BenchPicPairs(
    bufpool::BufferPool* pool, size_t n) {
  for (size_t i = 0; i < n; ++i) {
    bufpool::Buffer b = pool->TryAcquire();
    if (!b) std::abort();
    std::byte* p = b.data();
    p[0] = std::byte{1};
    asm volatile("" : : "r"(p) : "memory");
  }
}

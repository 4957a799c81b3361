// Internal: what the inline fast paths of bufpool/buffer_pool.h need from
// the pool's per-CPU caches and checks. Installed because the public header
// includes it; not API, in namespace bufpool::internal, and may change
// without notice. The caches themselves, and their correctness argument,
// are in src/pool/pool_internal.h (CpuCache), src/pool/cpu_cache.cc (the
// locked caches) and bufpool/internal/rseq.h with src/pool/rseq.cc (the
// restartable sequences).
#ifndef BUFPOOL_INTERNAL_CPU_CACHE_H_
#define BUFPOOL_INTERNAL_CPU_CACHE_H_

#include <bit>
#include <cstddef>
#include <cstdint>

#include "absl/base/config.h"

// ABSL_HAVE_ADDRESS_SANITIZER: GCC's __SANITIZE_ADDRESS__ or clang's
// __has_feature(address_sanitizer) (clang 14 defines no such macro).
#if defined(ABSL_HAVE_ADDRESS_SANITIZER)
#include <sanitizer/asan_interface.h>
#define BUFPOOL_INTERNAL_POISON(p, n) ASAN_POISON_MEMORY_REGION((p), (n))
#define BUFPOOL_INTERNAL_UNPOISON(p, n) ASAN_UNPOISON_MEMORY_REGION((p), (n))
#else
#define BUFPOOL_INTERNAL_POISON(p, n) ((void)(p), (void)(n))
#define BUFPOOL_INTERNAL_UNPOISON(p, n) ((void)(p), (void)(n))
#endif

namespace bufpool::internal {

// The most free slots one CPU's cache of one pool may hold (at most 1008:
// an rseq cache's header line and slots fit in internal::rseq::kCacheStride).
inline constexpr uint32_t kMaxCacheSlots = 512;

// The slot `p` starts, or a number >= the pool's capacity when `p` is not a
// slot start of the pool at `base`: the offset rotated right by log2
// (buffer_size), so a pointer into the middle of a buffer gets its low bits
// at the top and a pointer below the region wraps to a huge offset. One
// compare against the capacity then checks all three.
inline uint64_t SlotOrHuge(const void* p, const std::byte* base,
                           unsigned shift) {
  const uint64_t off =
      reinterpret_cast<uintptr_t>(p) - reinterpret_cast<uintptr_t>(base);
  return std::rotr(off, static_cast<int>(shift));
}

}  // namespace bufpool::internal

#endif  // BUFPOOL_INTERNAL_CPU_CACHE_H_

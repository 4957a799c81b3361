// Internal: what the inline fast paths of bufpool/buffer_pool.h need. Not
// part of the API; names and layout change without notice. The design and
// its correctness argument are in src/pool/buffer_pool.cc.
#ifndef BUFPOOL_INTERNAL_THREAD_CACHE_H_
#define BUFPOOL_INTERNAL_THREAD_CACHE_H_

#include <atomic>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <mutex>

#include "bufpool/export.h"

#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/asan_interface.h>
#define BUFPOOL_INTERNAL_POISON(p, n) ASAN_POISON_MEMORY_REGION((p), (n))
#define BUFPOOL_INTERNAL_UNPOISON(p, n) ASAN_UNPOISON_MEMORY_REGION((p), (n))
#else
#define BUFPOOL_INTERNAL_POISON(p, n) ((void)(p), (void)(n))
#define BUFPOOL_INTERNAL_UNPOISON(p, n) ((void)(p), (void)(n))
#endif

// ThreadSanitizer builds only: TSan cannot see the asymmetric fence that
// lets a reclaimer take a blocked owner's free slots (src/pool/
// buffer_pool.cc, "Reclaiming"), and its runtime may itself block, in a
// futex, inside an owner's section. So there the owner also counts its
// sections in ThreadCache::tsan_busy and loads `fast` seq_cst, and a
// reclaimer also requires tsan_busy == 0: a plain Dekker handshake that TSan
// models. Other builds compile all of it away.
#if defined(__SANITIZE_THREAD__)
#define BUFPOOL_INTERNAL_SECTION_FLAGS 1
#else
#define BUFPOOL_INTERNAL_SECTION_FLAGS 0
#endif

// The thread-local cache table is reached with the initial-exec TLS model:
// one %fs-relative load, also from code compiled with -fPIC into a shared
// object (the default model there calls __tls_get_addr).
#define BUFPOOL_INTERNAL_TLS_MODEL __attribute__((tls_model("initial-exec")))

namespace bufpool {

class BufferPool;

namespace internal {

inline constexpr uint32_t kMaxCacheSlots = 512;

// One thread's cache of free slots for one pool, owned by that thread
// (src/pool/buffer_pool.cc keeps the list of each pool's caches).
//
// Layout: the most recently released slot sits in `hot`, the rest in the
// stack slots[0, count). The total is count + (hot != kNone). low_water is
// the lowest `count` since the cache last moved slots to or from the shared
// store, and never exceeds `count`.
//
// Who may touch it: the owner without a lock while `fast` is its pool (the
// inline fast paths, and the slow paths' non-blocking sections); anyone
// holding `mu` otherwise (a waiter reclaiming the slots of a blocked owner,
// the owner once `fast` was cleared). The fields are atomics, relaxed: the
// argument is in buffer_pool.cc ("Reclaiming").
struct alignas(64) ThreadCache {
  static constexpr uint32_t kNone = 0xffffffffu;
  // `pool` while the owner's fast paths may serve it without the lock;
  // nullptr while a thread waits in Acquire(), while a reclaimer holds the
  // cache, and always for a pool that scrubs.
  std::atomic<BufferPool*> fast{nullptr};
  std::atomic<BufferPool*> pool{nullptr};  // the pool served, or nullptr
  std::atomic<uint32_t> hot{kNone};        // a free slot, or kNone
  std::atomic<uint32_t> count{0};          // slots[0, count) are free
  std::atomic<uint32_t> low_water{0};      // see above
  uint32_t capacity = 0;                   // of the stack: cache_capacity - 1
  uint32_t spare = kNone;  // an empty depot magazine for the next spill
  int tid = 0;             // the owner's kernel thread id
  std::mutex mu;
  // Set when `fast` is cleared while set (the owner may be inside a fast
  // path that will still touch the cache); cleared once the owner takes
  // `mu` or is seen blocked after a fence. Written under mu or caches_mu.
  std::atomic<bool> unsettled{false};
#if BUFPOOL_INTERNAL_SECTION_FLAGS
  std::atomic<uint32_t> tsan_busy{0};  // open owner sections (see above)
#endif
  // Two spare entries let a slow path fold `hot` in and hand everything
  // over plus one slot.
  uint32_t slots[kMaxCacheSlots + 1];
};

// The order of the owner's loads of `fast` (see
// BUFPOOL_INTERNAL_SECTION_FLAGS).
inline constexpr std::memory_order kFastOrder = BUFPOOL_INTERNAL_SECTION_FLAGS
                                                    ? std::memory_order_seq_cst
                                                    : std::memory_order_relaxed;

// Marks an owner's section on its cache, from before its load of `fast` to
// after its last access; empty outside ThreadSanitizer builds.
class OwnerSection {
 public:
#if BUFPOOL_INTERNAL_SECTION_FLAGS
  explicit OwnerSection(ThreadCache* c) : c_(c) {
    c_->tsan_busy.fetch_add(1, std::memory_order_seq_cst);
  }
  ~OwnerSection() { c_->tsan_busy.fetch_sub(1, std::memory_order_seq_cst); }

 private:
  ThreadCache* c_;
#else
  explicit OwnerSection(ThreadCache*) {}
#endif
  OwnerSection(const OwnerSection&) = delete;
  OwnerSection& operator=(const OwnerSection&) = delete;
};

// For a reclaimer that cleared c.fast (seq_cst) and holds c.mu: false while
// the owner is inside a section (ThreadSanitizer builds; always true
// elsewhere, where the owner's blocked state says it).
inline bool OwnerOutsideSections(const ThreadCache& c) {
#if BUFPOOL_INTERNAL_SECTION_FLAGS
  return c.tsan_busy.load(std::memory_order_seq_cst) == 0;
#else
  (void)c;
  return true;
#endif
}

// A cache that serves no pool, so the hot path needs no null check.
BUFPOOL_EXPORT extern ThreadCache g_no_cache;

// Each pool has a fixed index into this table (BufferPool::cache_index_);
// entry i is the cache of the pool with index i this thread used last
// (&g_no_cache before first use, never null). Pools share an index only
// when more than kCacheTableSize are alive at once. constinit: no dynamic
// initialisation, so no TLS wrapper call.
inline constexpr uint32_t kCacheTableSize = 16;
BUFPOOL_EXPORT extern constinit thread_local ThreadCache*
    tls_caches[kCacheTableSize] BUFPOOL_INTERNAL_TLS_MODEL;

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

}  // namespace internal
}  // namespace bufpool

#endif  // BUFPOOL_INTERNAL_THREAD_CACHE_H_

// The contenders of the pool-vs-individual comparison (see workloads.h for
// the interface). Every one hands out 4096-byte buffers; all but
// MallocUnaligned and DPDK's are 4096-byte aligned.
#ifndef BUFPOOL_BENCH_CONTENDERS_H_
#define BUFPOOL_BENCH_CONTENDERS_H_

#include <stdlib.h>
#include <sys/mman.h>

#include <cstring>
#include <mutex>
#include <new>
#include <vector>

#include "bufpool/buffer_pool.h"
#include "bufpool/c.h"
#include "workloads.h"

namespace bufpool_bench {

// ---- Per-buffer allocation (whatever malloc the process has) ---------------

struct PosixMemalign {
  using Item = void*;
  BENCH_INLINE Item Get() {
    void* p = nullptr;
    if (posix_memalign(&p, kBufferSize, kBufferSize) != 0)
      Die("posix_memalign");
    return p;
  }
  BENCH_INLINE static std::byte* Data(Item p) {
    return static_cast<std::byte*>(p);
  }
  BENCH_INLINE void Put(Item& p) { free(p); }
};

struct AlignedAlloc {
  using Item = void*;
  BENCH_INLINE Item Get() {
    void* p = aligned_alloc(kBufferSize, kBufferSize);
    if (p == nullptr) Die("aligned_alloc");
    return p;
  }
  BENCH_INLINE static std::byte* Data(Item p) {
    return static_cast<std::byte*>(p);
  }
  BENCH_INLINE void Put(Item& p) { free(p); }
};

struct NewAligned {
  using Item = void*;
  BENCH_INLINE Item Get() {
    return ::operator new (kBufferSize, std::align_val_t{kBufferSize});
  }
  BENCH_INLINE static std::byte* Data(Item p) {
    return static_cast<std::byte*>(p);
  }
  BENCH_INLINE void Put(Item& p) {
    ::operator delete (p, std::align_val_t{kBufferSize});
  }
};

struct MallocUnaligned {  // the reference: what alignment costs
  using Item = void*;
  BENCH_INLINE Item Get() {
    void* p = malloc(kBufferSize);
    if (p == nullptr) Die("malloc");
    return p;
  }
  BENCH_INLINE static std::byte* Data(Item p) {
    return static_cast<std::byte*>(p);
  }
  BENCH_INLINE void Put(Item& p) { free(p); }
};

// A "direct buffer per request": one page mapped and unmapped each time.
struct MmapPage {
  using Item = void*;
  BENCH_INLINE Item Get() {
    void* p = mmap(nullptr, kBufferSize, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) Die("mmap");
    return p;
  }
  BENCH_INLINE static std::byte* Data(Item p) {
    return static_cast<std::byte*>(p);
  }
  BENCH_INLINE void Put(Item& p) { munmap(p, kBufferSize); }
};

// ---- The pool people write by hand ------------------------------------------

struct MutexFreeList {
  struct Shared {
    std::mutex mu;
    std::vector<void*> free;
    std::byte* region = nullptr;
  };
  static Shared& Get0() {
    static Shared* s = [] {
      auto* shared = new Shared();
      constexpr size_t kCount = 4096;
      void* region = nullptr;
      if (posix_memalign(&region, kBufferSize, kCount * kBufferSize) != 0) {
        Die("posix_memalign");
      }
      shared->region = static_cast<std::byte*>(region);
      for (size_t i = 0; i < kCount; ++i) {
        shared->region[i * kBufferSize] =
            std::byte{0};  // fault it in, as the pool does
        shared->free.push_back(shared->region + (kCount - 1 - i) * kBufferSize);
      }
      return shared;
    }();
    return *s;
  }
  using Item = void*;
  BENCH_INLINE Item Get() {
    std::lock_guard<std::mutex> lock(s_.mu);
    if (s_.free.empty()) Die("mutex free list empty");
    void* p = s_.free.back();
    s_.free.pop_back();
    return p;
  }
  BENCH_INLINE static std::byte* Data(Item p) {
    return static_cast<std::byte*>(p);
  }
  BENCH_INLINE void Put(Item& p) {
    std::lock_guard<std::mutex> lock(s_.mu);
    s_.free.push_back(p);
  }
  Shared& s_ = Get0();
};

// ---- The floor: no allocator at all -----------------------------------------

// The floors' buffers: kCount page-aligned buffers of kBufferSize, each
// faulted in, owned by one floor object.
class FloorRegion {
 public:
  static constexpr size_t kCount = 2048;
  FloorRegion() {
    void* region = nullptr;
    if (posix_memalign(&region, kBufferSize, kCount * kBufferSize) != 0) {
      Die("posix_memalign");
    }
    base_ = static_cast<std::byte*>(region);
    for (size_t i = 0; i < kCount; ++i) base_[i * kBufferSize] = std::byte{0};
  }
  ~FloorRegion() { free(base_); }
  FloorRegion(const FloorRegion&) = delete;
  FloorRegion& operator=(const FloorRegion&) = delete;
  // The buffers in the order a stack hands them out: the last one first.
  std::byte* StackEntry(size_t i) const {
    return base_ + (kCount - 1 - i) * kBufferSize;
  }

 private:
  std::byte* base_ = nullptr;
};

// A plain stack of page-aligned buffers owned by one thread: no lock, no
// atomic, no check, not shareable between threads. It is not a contender
// but the floor under every contender: what touching 4 KiB-aligned buffers
// and a push/pop cost on this machine. Registered for the single-thread
// workloads only (Pair, WorkingSet, Bulk32).
struct FloorStack {
  using Item = std::byte*;
  static constexpr size_t kCount = FloorRegion::kCount;
  FloorStack() {
    free_.reserve(kCount);
    for (size_t i = 0; i < kCount; ++i) free_.push_back(region_.StackEntry(i));
  }
  BENCH_INLINE Item Get() {
    std::byte* p = free_.back();
    free_.pop_back();
    return p;
  }
  BENCH_INLINE static std::byte* Data(Item p) { return p; }
  BENCH_INLINE void Put(Item& p) { free_.push_back(p); }
  BENCH_INLINE void GetBulk(Item* out, size_t n) {
    std::memcpy(out, free_.data() + free_.size() - n, n * sizeof(Item));
    free_.resize(free_.size() - n);
  }
  BENCH_INLINE void PutBulk(Item* in, size_t n) {
    free_.insert(free_.end(), in, in + n);
  }
  FloorRegion region_;
  std::vector<std::byte*> free_;
};

// The same stack with its top kept in memory, read and written on every
// call (relaxed atomic loads and stores, no read-modify-write), as in any
// cache that another thread may inspect or drain: each call's load of the
// top depends on the previous call's store (forwarded, or on CPUs that
// rename memory operands at a fixed address, renamed). Relaxed stores are
// the floor on x86-64; a drainable cache on AArch64 needs release stores.
// Pair and WorkingSet only.
struct FloorSharedStack {
  using Item = std::byte*;
  static constexpr size_t kCount = FloorRegion::kCount;
  FloorSharedStack() {
    for (size_t i = 0; i < kCount; ++i) slots_[i] = region_.StackEntry(i);
    top_.store(kCount, std::memory_order_relaxed);
  }
  BENCH_INLINE Item Get() {
    const uint32_t n = top_.load(std::memory_order_relaxed) - 1;
    std::byte* p = slots_[n];
    top_.store(n, std::memory_order_relaxed);
    return p;
  }
  BENCH_INLINE static std::byte* Data(Item p) { return p; }
  BENCH_INLINE void Put(Item& p) {
    const uint32_t n = top_.load(std::memory_order_relaxed);
    slots_[n] = p;
    top_.store(n + 1, std::memory_order_relaxed);
  }
  FloorRegion region_;
  std::atomic<uint32_t> top_{0};
  std::byte* slots_[kCount];
};

// The shared stack found as a per-CPU cache is: at base + index * stride,
// the index read from memory on every call (as a cache's CPU or concurrency
// id is read from the thread's rseq area), so each call's load of the top
// goes through a freshly computed address, which memory renaming does not
// cover. Pair only.
struct FloorIndexedStack {
  using Item = std::byte*;
  static constexpr size_t kCount = FloorRegion::kCount;
  FloorIndexedStack() {
    for (size_t i = 0; i < kCount; ++i) {
      stacks_[1].slots[i] = region_.StackEntry(i);
    }
    stacks_[1].top.store(kCount, std::memory_order_relaxed);
  }
  struct Stack {
    std::atomic<uint32_t> top{0};
    std::byte* slots[kCount];
  };
  BENCH_INLINE Stack& Mine() {
    return stacks_[index_.load(std::memory_order_relaxed)];
  }
  BENCH_INLINE Item Get() {
    Stack& s = Mine();
    const uint32_t n = s.top.load(std::memory_order_relaxed) - 1;
    std::byte* p = s.slots[n];
    s.top.store(n, std::memory_order_relaxed);
    return p;
  }
  BENCH_INLINE static std::byte* Data(Item p) { return p; }
  BENCH_INLINE void Put(Item& p) {
    Stack& s = Mine();
    const uint32_t n = s.top.load(std::memory_order_relaxed);
    s.slots[n] = p;
    s.top.store(n + 1, std::memory_order_relaxed);
  }
  FloorRegion region_;
  std::atomic<uint32_t> index_{1};
  Stack stacks_[2];
};

// ---- libbufpool
// -------------------------------------------------------------- Thread caches
// of 256, the size DPDK's contender gets, so both keep the same number of free
// buffers per thread.
inline constexpr size_t kPoolCache = 256;

// One pool per configuration for the whole process, so that benchmark
// threads, whose caches return to it when they exit, never outlive it.
template <size_t kCache>
bufpool::BufferPool& SharedPool() {
  static bufpool::BufferPool* pool = [] {
    auto p = bufpool::BufferPool::Create({.buffer_size = kBufferSize,
                                          .buffer_count = 8192,
                                          .cache_size = kCache});
    if (!p.ok()) Die("BufferPool::Create");
    return p->release();
  }();
  return *pool;
}

template <size_t kCache>
struct PoolBuffer {  // the Buffer handle
  using Item = bufpool::Buffer;
  BENCH_INLINE Item Get() {
    bufpool::Buffer b = pool_.TryAcquire();
    if (!b) Die("pool empty");
    return b;
  }
  BENCH_INLINE static std::byte* Data(const Item& b) { return b.data(); }
  BENCH_INLINE void Put(Item& b) { b.Reset(); }
  bufpool::BufferPool& pool_ = SharedPool<kCache>();
};

// The same handle calls on an elastic pool (max_buffer_count):
// 8,192 buffers backed of a 65,536 ceiling, so that growth is reachable but
// the workloads run inside what is backed, as the fixed pool's do. Its hot
// pair and working set must match libbufpool_buffer's.
struct PoolElastic {
  using Item = bufpool::Buffer;
  static bufpool::BufferPool& Shared() {
    static bufpool::BufferPool* pool = [] {
      auto p = bufpool::BufferPool::Create({.buffer_size = kBufferSize,
                                            .buffer_count = 8192,
                                            .cache_size = kPoolCache,
                                            .max_buffer_count = 65536});
      if (!p.ok()) Die("BufferPool::Create (elastic)");
      return p->release();
    }();
    return *pool;
  }
  BENCH_INLINE Item Get() {
    bufpool::Buffer b = pool_.TryAcquire();
    if (!b) Die("pool empty");
    return b;
  }
  BENCH_INLINE static std::byte* Data(const Item& b) { return b.data(); }
  BENCH_INLINE void Put(Item& b) { b.Reset(); }
  bufpool::BufferPool& pool_ = Shared();
};

// The same handle calls on a shared pool (PoolOptions::shared), through a
// BufferPool that joined it (Join(shared_fd()), its own caches) as another
// process would; joined in this process, so that the rows share a run.
// Its hot pair must stay within 1.2x of libbufpool_buffer's.
struct PoolJoined {
  using Item = bufpool::Buffer;
  static bufpool::BufferPool& Joined() {
    static bufpool::BufferPool* pool = [] {
      auto creator = bufpool::BufferPool::Create({.buffer_size = kBufferSize,
                                                  .buffer_count = 8192,
                                                  .cache_size = kPoolCache,
                                                  .shared = true});
      if (!creator.ok()) Die("BufferPool::Create (shared)");
      auto joined = bufpool::BufferPool::Join((*creator)->shared_fd());
      if (!joined.ok()) Die("BufferPool::Join");
      creator->release();  // kept for the process's life, as the joined one
      return joined->release();
    }();
    return *pool;
  }
  BENCH_INLINE Item Get() {
    bufpool::Buffer b = pool_.TryAcquire();
    if (!b) Die("pool empty");
    return b;
  }
  BENCH_INLINE static std::byte* Data(const Item& b) { return b.data(); }
  BENCH_INLINE void Put(Item& b) { b.Reset(); }
  bufpool::BufferPool& pool_ = Joined();
};

struct PoolRaw {  // TryAcquireRaw / ReleaseRaw
  using Item = std::byte*;
  BENCH_INLINE Item Get() {
    std::byte* p = pool_.TryAcquireRaw();
    if (p == nullptr) Die("pool empty");
    return p;
  }
  BENCH_INLINE static std::byte* Data(Item p) { return p; }
  BENCH_INLINE void Put(Item& p) { pool_.ReleaseRaw(p); }
  bufpool::BufferPool& pool_ = SharedPool<kPoolCache>();
};

template <size_t kCache>
struct PoolBulkOf : PoolBuffer<kCache> {  // TryAcquireBulk / ReleaseBulk
  using Item = bufpool::Buffer;
  BENCH_INLINE void GetBulk(Item* out, size_t n) {
    if (this->pool_.TryAcquireBulk(absl::MakeSpan(out, n)) != n) {
      Die("pool empty");
    }
  }
  BENCH_INLINE void PutBulk(Item* in, size_t n) {
    this->pool_.ReleaseBulk(absl::MakeSpan(in, n));
  }
};
using PoolBulk = PoolBulkOf<kPoolCache>;
// Caches off: the depot alone. Its Bulk32 uses the bulk calls, as
// DPDK's ring-only contender does.
using PoolCacheOff = PoolBulkOf<0>;

// TryAcquireRawBulk / ReleaseRawBulk: pointers in, pointers out, as DPDK's
// bulk calls take them.
struct PoolRawBulk : PoolRaw {
  BENCH_INLINE void GetBulk(Item* out, size_t n) {
    if (pool_.TryAcquireRawBulk(absl::MakeSpan(out, n)) != n) {
      Die("pool empty");
    }
  }
  BENCH_INLINE void PutBulk(Item* in, size_t n) {
    pool_.ReleaseRawBulk(absl::MakeSpan(in, n));
  }
};

// The C API (bufpool/c.h) as a C program calls it: bufpool_try_acquire /
// bufpool_release, one out-of-line call each around the raw pair above, and
// the bulk calls for Bulk32. Its own pool, configured as SharedPool's.
struct PoolC {
  static bufpool_pool* Pool() {
    static bufpool_pool* pool = [] {
      bufpool_options o = BUFPOOL_OPTIONS_INIT;
      o.buffer_size = kBufferSize;
      o.buffer_count = 8192;
      o.cache_size = kPoolCache;
      char* err = nullptr;
      bufpool_pool* p = bufpool_create(&o, &err);
      if (p == nullptr) Die(err);
      return p;
    }();
    return pool;
  }
  using Item = void*;
  BENCH_INLINE Item Get() {
    void* p = bufpool_try_acquire(pool_);
    if (p == nullptr) Die("pool empty");
    return p;
  }
  BENCH_INLINE static std::byte* Data(Item p) {
    return static_cast<std::byte*>(p);
  }
  BENCH_INLINE void Put(Item& p) { bufpool_release(pool_, p); }
  BENCH_INLINE void GetBulk(Item* out, size_t n) {
    if (bufpool_try_acquire_bulk(pool_, out, n) != n) Die("pool empty");
  }
  BENCH_INLINE void PutBulk(Item* in, size_t n) {
    bufpool_release_bulk(pool_, in, n);
  }
  bufpool_pool* pool_ = Pool();
};

}  // namespace bufpool_bench

#endif  // BUFPOOL_BENCH_CONTENDERS_H_

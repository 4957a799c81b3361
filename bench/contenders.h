// The contenders of the pool-vs-individual comparison (see workloads.h for
// the interface). Every one hands out 4096-byte buffers; all but
// MallocUnaligned and DPDK's are 4096-byte aligned.
#ifndef BUFPOOL_BENCH_CONTENDERS_H_
#define BUFPOOL_BENCH_CONTENDERS_H_

#include <stdlib.h>
#include <sys/mman.h>

#include <mutex>
#include <new>
#include <vector>

#include "bufpool/buffer_pool.h"
#include "workloads.h"

namespace bufpool_bench {

// ---- Per-buffer allocation (whatever malloc the process has) ---------------

struct PosixMemalign {
  using Item = void*;
  Item Get() {
    void* p = nullptr;
    if (posix_memalign(&p, kBufferSize, kBufferSize) != 0)
      Die("posix_memalign");
    return p;
  }
  static std::byte* Data(Item p) { return static_cast<std::byte*>(p); }
  void Put(Item& p) { free(p); }
};

struct AlignedAlloc {
  using Item = void*;
  Item Get() {
    void* p = aligned_alloc(kBufferSize, kBufferSize);
    if (p == nullptr) Die("aligned_alloc");
    return p;
  }
  static std::byte* Data(Item p) { return static_cast<std::byte*>(p); }
  void Put(Item& p) { free(p); }
};

struct NewAligned {
  using Item = void*;
  Item Get() {
    return ::operator new (kBufferSize, std::align_val_t{kBufferSize});
  }
  static std::byte* Data(Item p) { return static_cast<std::byte*>(p); }
  void Put(Item& p) { ::operator delete (p, std::align_val_t{kBufferSize}); }
};

struct MallocUnaligned {  // the reference: what alignment costs
  using Item = void*;
  Item Get() {
    void* p = malloc(kBufferSize);
    if (p == nullptr) Die("malloc");
    return p;
  }
  static std::byte* Data(Item p) { return static_cast<std::byte*>(p); }
  void Put(Item& p) { free(p); }
};

// A "direct buffer per request": one page mapped and unmapped each time.
struct MmapPage {
  using Item = void*;
  Item Get() {
    void* p = mmap(nullptr, kBufferSize, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) Die("mmap");
    return p;
  }
  static std::byte* Data(Item p) { return static_cast<std::byte*>(p); }
  void Put(Item& p) { munmap(p, kBufferSize); }
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
  Item Get() {
    std::lock_guard<std::mutex> lock(s_.mu);
    if (s_.free.empty()) Die("mutex free list empty");
    void* p = s_.free.back();
    s_.free.pop_back();
    return p;
  }
  static std::byte* Data(Item p) { return static_cast<std::byte*>(p); }
  void Put(Item& p) {
    std::lock_guard<std::mutex> lock(s_.mu);
    s_.free.push_back(p);
  }
  Shared& s_ = Get0();
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
                                          .thread_cache_size = kCache});
    if (!p.ok()) Die("BufferPool::Create");
    return p->release();
  }();
  return *pool;
}

template <size_t kCache>
struct PoolBuffer {  // the Buffer handle
  using Item = bufpool::Buffer;
  Item Get() {
    bufpool::Buffer b = pool_.TryAcquire();
    if (!b) Die("pool empty");
    return b;
  }
  static std::byte* Data(const Item& b) { return b.data(); }
  void Put(Item& b) { b.Reset(); }
  bufpool::BufferPool& pool_ = SharedPool<kCache>();
};

struct PoolRaw {  // TryAcquireRaw / ReleaseRaw
  using Item = std::byte*;
  Item Get() {
    std::byte* p = pool_.TryAcquireRaw();
    if (p == nullptr) Die("pool empty");
    return p;
  }
  static std::byte* Data(Item p) { return p; }
  void Put(Item& p) { pool_.ReleaseRaw(p); }
  bufpool::BufferPool& pool_ = SharedPool<kPoolCache>();
};

struct PoolBulk : PoolBuffer<kPoolCache> {  // TryAcquireBulk / ReleaseBulk
  void GetBulk(Item* out, size_t n) {
    if (pool_.TryAcquireBulk(absl::MakeSpan(out, n)) != n) Die("pool empty");
  }
  void PutBulk(Item* in, size_t n) { pool_.ReleaseBulk(absl::MakeSpan(in, n)); }
};

}  // namespace bufpool_bench

#endif  // BUFPOOL_BENCH_CONTENDERS_H_

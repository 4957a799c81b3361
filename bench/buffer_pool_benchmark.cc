// Pool vs per-buffer allocation, like with like: every contender hands out a
// 4096-byte, 4096-aligned buffer, and every buffer is written before it is
// given back, so no contender is measured on memory it never touches.
//
//   build/release/bench/buffer_pool_benchmark --benchmark_filter=Pair
//
// Pool benchmarks create their pool (populated, huge pages where allowed)
// before timing, the way a server creates it at start-up.
#include <stdlib.h>

#include <atomic>
#include <cstddef>
#include <cstdio>
#include <cstring>
#include <memory>
#include <vector>

#include "benchmark/benchmark.h"
#include "bufpool/buffer_pool.h"

namespace {

constexpr size_t kSize = 4096;

std::unique_ptr<bufpool::BufferPool> MakePool(size_t cache, size_t count = 4096) {
  auto pool = bufpool::BufferPool::Create(
      {.buffer_size = kSize, .buffer_count = count, .thread_cache_size = cache});
  if (!pool.ok()) {
    std::fprintf(stderr, "%s\n", pool.status().ToString().c_str());
    std::abort();
  }
  return *std::move(pool);
}

void Touch(std::byte* p) {
  p[0] = std::byte{1};
  benchmark::DoNotOptimize(p);
  benchmark::ClobberMemory();
}

// ---- Hot pair: acquire, write one byte, release (one thread) ---------------

void BM_Pair_PoolBuffer(benchmark::State& state) {
  auto pool = MakePool(64);
  for (auto _ : state) {
    bufpool::Buffer b = pool->TryAcquire();
    Touch(b.data());
  }
  state.SetItemsProcessed(state.iterations());
}
BENCHMARK(BM_Pair_PoolBuffer);

void BM_Pair_PoolRaw(benchmark::State& state) {
  auto pool = MakePool(64);
  for (auto _ : state) {
    std::byte* p = pool->TryAcquireRaw();
    Touch(p);
    pool->ReleaseRaw(p);
  }
  state.SetItemsProcessed(state.iterations());
}
BENCHMARK(BM_Pair_PoolRaw);

void BM_Pair_PoolCacheOff(benchmark::State& state) {
  auto pool = MakePool(0);
  for (auto _ : state) {
    bufpool::Buffer b = pool->TryAcquire();
    Touch(b.data());
  }
  state.SetItemsProcessed(state.iterations());
}
BENCHMARK(BM_Pair_PoolCacheOff);

void BM_Pair_PosixMemalign(benchmark::State& state) {
  for (auto _ : state) {
    void* p = nullptr;
    if (posix_memalign(&p, kSize, kSize) != 0) std::abort();
    Touch(static_cast<std::byte*>(p));
    free(p);
  }
  state.SetItemsProcessed(state.iterations());
}
BENCHMARK(BM_Pair_PosixMemalign);

// ---- Batches of 32 ----------------------------------------------------------

void BM_Bulk32_Pool(benchmark::State& state) {
  auto pool = MakePool(64);
  bufpool::Buffer batch[32];
  for (auto _ : state) {
    if (pool->TryAcquireBulk(batch) != 32) std::abort();
    for (bufpool::Buffer& b : batch) Touch(b.data());
    pool->ReleaseBulk(batch);
  }
  state.SetItemsProcessed(state.iterations() * 32);
}
BENCHMARK(BM_Bulk32_Pool);

void BM_Bulk32_PosixMemalign(benchmark::State& state) {
  void* batch[32];
  for (auto _ : state) {
    for (void*& p : batch) {
      if (posix_memalign(&p, kSize, kSize) != 0) std::abort();
      Touch(static_cast<std::byte*>(p));
    }
    for (void* p : batch) free(p);
  }
  state.SetItemsProcessed(state.iterations() * 32);
}
BENCHMARK(BM_Bulk32_PosixMemalign);

// ---- Hand-off: thread 0 acquires, thread 1 releases -------------------------
// A single-producer/single-consumer ring carries raw pointers between them.

struct HandoffRing {
  static constexpr size_t kSlots = 256;
  std::atomic<std::byte*> slot[kSlots] = {};
  alignas(64) size_t head = 0;  // producer only
  alignas(64) size_t tail = 0;  // consumer only
};

std::unique_ptr<bufpool::BufferPool> g_handoff_pool;
HandoffRing* g_ring = nullptr;

void BM_Handoff_Pool(benchmark::State& state) {
  if (state.thread_index() == 0) {
    delete g_ring;  // the previous run's threads have exited by now
    g_ring = new HandoffRing();
    g_handoff_pool = MakePool(64);
  }
  // Google Benchmark starts timing after every thread reaches the loop, and
  // both threads run the same number of iterations.
  for (auto _ : state) {
    if (state.thread_index() == 0) {
      std::byte* p;
      while ((p = g_handoff_pool->TryAcquireRaw()) == nullptr) {
      }
      Touch(p);
      std::atomic<std::byte*>& s = g_ring->slot[g_ring->head++ % HandoffRing::kSlots];
      while (s.load(std::memory_order_acquire) != nullptr) {
      }
      s.store(p, std::memory_order_release);
    } else {
      std::atomic<std::byte*>& s = g_ring->slot[g_ring->tail++ % HandoffRing::kSlots];
      std::byte* p;
      while ((p = s.load(std::memory_order_acquire)) == nullptr) {
      }
      s.store(nullptr, std::memory_order_relaxed);
      g_handoff_pool->ReleaseRaw(p);
    }
  }
  state.SetItemsProcessed(state.iterations());
}
BENCHMARK(BM_Handoff_Pool)->Threads(2)->UseRealTime();

}  // namespace

BENCHMARK_MAIN();

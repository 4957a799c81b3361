// The workloads every contender runs, written once as templates so that all
// contenders do exactly the same work: 4096-byte buffers, each one written
// (its first byte) before it is given back.
//
// A contender is a class with
//   using Item = ...;                      // what Get() hands out
//   Item Get();                            // aborts if it cannot
//   static std::byte* Data(const Item&);   // the buffer's first byte
//   void Put(Item&);                       // gives it back
// and optionally GetBulk(Item*, size_t) / PutBulk(Item*, size_t).
// One contender object is made per benchmark thread; shared state (a pool)
// lives in function-local statics of the contender.
//
// Benchmark names are "<Workload>/<contender>", which tools/bench_report.py
// groups into one table per workload.
#ifndef BUFPOOL_BENCH_WORKLOADS_H_
#define BUFPOOL_BENCH_WORKLOADS_H_

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "benchmark/benchmark.h"

// Every contender's Get/Put/Data is forced inline, so that all of them are
// measured as straight-line code in the loop; GCC's heuristics otherwise
// inline some and call others depending on how big this file grew.
#define BENCH_INLINE __attribute__((always_inline)) inline

namespace bufpool_bench {

inline constexpr size_t kBufferSize = 4096;
inline constexpr size_t kWorkingSet = 1024;
inline constexpr size_t kBatch = 32;

[[noreturn]] inline void Die(const char* what) {
  std::fprintf(stderr, "benchmark: %s\n", what);
  std::abort();
}

// Writes the buffer's first byte and keeps the compiler from dropping it.
inline void Touch(std::byte* p) {
  p[0] = std::byte{1};
  benchmark::DoNotOptimize(p);
  benchmark::ClobberMemory();
}

// 1. Hot pair: acquire, write one byte, release. Also run with 1, 2 and 8
//    threads (workload "Threads"), each thread with its own contender object.
template <class C>
void Pair(benchmark::State& state) {
  C c;
  for (auto _ : state) {
    auto item = c.Get();
    Touch(C::Data(item));
    c.Put(item);
  }
  state.SetItemsProcessed(state.iterations());
}

// 2. Working set: 1024 buffers live; each iteration releases all of them in
//    a fixed random order and acquires 1024 again. Time per buffer = one
//    release + one acquire + one write.
template <class C>
void WorkingSet(benchmark::State& state) {
  C c;
  using Item = decltype(c.Get());
  std::vector<Item> live;
  live.reserve(kWorkingSet);
  for (size_t i = 0; i < kWorkingSet; ++i) {
    live.push_back(c.Get());
    Touch(C::Data(live.back()));
  }
  std::vector<uint32_t> order(kWorkingSet);
  for (uint32_t i = 0; i < kWorkingSet; ++i) order[i] = i;
  std::mt19937 rng(42);  // fixed seed: the same order for every contender
  std::shuffle(order.begin(), order.end(), rng);
  for (auto _ : state) {
    for (uint32_t i : order) c.Put(live[i]);
    for (size_t i = 0; i < kWorkingSet; ++i) {
      live[i] = c.Get();
      Touch(C::Data(live[i]));
    }
  }
  for (auto& item : live) c.Put(item);
  state.SetItemsProcessed(state.iterations() * kWorkingSet);
}

// 3. Batches of 32, through the contender's bulk API when it has one.
template <class C>
void Bulk32(benchmark::State& state) {
  C c;
  using Item = decltype(c.Get());
  Item batch[kBatch] = {};
  for (auto _ : state) {
    if constexpr (requires { c.GetBulk(batch, kBatch); }) {
      c.GetBulk(batch, kBatch);
    } else {
      for (Item& item : batch) item = c.Get();
    }
    for (Item& item : batch) Touch(C::Data(item));
    if constexpr (requires { c.PutBulk(batch, kBatch); }) {
      c.PutBulk(batch, kBatch);
    } else {
      for (Item& item : batch) c.Put(item);
    }
  }
  state.SetItemsProcessed(state.iterations() * kBatch);
}

// 5. Hand-off: thread 0 acquires and writes, thread 1 releases; items travel
//    through a single-producer/single-consumer ring. Time per buffer.
template <class C>
struct HandoffRing {
  using Item = decltype(std::declval<C&>().Get());
  static constexpr size_t kSlots = 256;
  struct alignas(64) Slot {
    std::atomic<bool> full{false};
    Item item{};
  };
  Slot slots[kSlots];
};

// Spins briefly, then yields: on an oversubscribed machine a pure spin would
// burn the time slice the other side needs to make progress.
inline void WaitUntil(const std::atomic<bool>& flag, bool value) {
  for (int spins = 0; flag.load(std::memory_order_acquire) != value; ++spins) {
    if (spins > 100) std::this_thread::yield();
  }
}

template <class C>
void Handoff(benchmark::State& state) {
  static HandoffRing<C>* ring = nullptr;
  if (state.thread_index() == 0) {
    delete ring;  // the previous run's threads are gone by now
    ring = new HandoffRing<C>();
  }
  C c;
  size_t next = 0;
  // Both threads run the same number of iterations; timing starts when both
  // reach the loop.
  for (auto _ : state) {
    auto& slot = ring->slots[next++ % HandoffRing<C>::kSlots];
    if (state.thread_index() == 0) {
      auto item = c.Get();
      Touch(C::Data(item));
      WaitUntil(slot.full, false);
      slot.item = std::move(item);
      slot.full.store(true, std::memory_order_release);
    } else {
      WaitUntil(slot.full, true);
      auto item = std::move(slot.item);
      slot.full.store(false, std::memory_order_release);
      c.Put(item);
    }
  }
  state.SetItemsProcessed(state.thread_index() == 0 ? state.iterations() : 0);
}

// Registers every workload for contender C under `name`.
// `iterations_at_8_threads`: 0 lets Google Benchmark choose; a contender
// whose threads spin on each other when preempted (DPDK's ring without a
// cache) gets a fixed count there, or one measurement would take minutes.
template <class C>
void RegisterAll(const std::string& name, int iterations_at_8_threads = 0) {
  benchmark::RegisterBenchmark(("Pair/" + name).c_str(), Pair<C>);
  benchmark::RegisterBenchmark(("WorkingSet/" + name).c_str(), WorkingSet<C>);
  benchmark::RegisterBenchmark(("Bulk32/" + name).c_str(), Bulk32<C>);
  benchmark::RegisterBenchmark(("Threads/" + name).c_str(), Pair<C>)
      ->Threads(1)
      ->Threads(2)
      ->UseRealTime();
  auto* eight =
      benchmark::RegisterBenchmark(("Threads/" + name).c_str(), Pair<C>)
          ->Threads(8)
          ->UseRealTime();
  if (iterations_at_8_threads > 0) eight->Iterations(iterations_at_8_threads);
  benchmark::RegisterBenchmark(("Handoff/" + name).c_str(), Handoff<C>)
      ->Threads(2)
      ->UseRealTime();
}

}  // namespace bufpool_bench

#endif  // BUFPOOL_BENCH_WORKLOADS_H_

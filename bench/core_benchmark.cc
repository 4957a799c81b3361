// The pool's core across pools, shared objects and threads:
//   ManyPools/     the hot pair alternating over 1, 2 and 4 pools
//                  (goal: 2 and 4 pools within 1.3x of one), and the same
//                  loop over 1, 2 and 4 floor stacks (no pool)
//   SharedObject/  the hot pair called from a -fPIC shared object and from
//                  the executable (goal: within 1.3x)
//   Reclaim/       how long Acquire() takes to get a buffer that another
//                  thread parked in its CPU's cache (a drain; goal: p99 <=
//                  50 us; the p50_us/p99_us counters)
//
//   build/release/bench/core_benchmark --benchmark_filter=ManyPools/
#include <dlfcn.h>

#include <algorithm>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "benchmark/benchmark.h"
#include "bufpool/buffer_pool.h"
#include "contenders.h"

namespace {

[[noreturn]] void Die(const char* what) {
  std::fprintf(stderr, "core_benchmark: %s\n", what);
  std::abort();
}

std::unique_ptr<bufpool::BufferPool> NewPool(size_t count, size_t cache) {
  auto p =
      bufpool::BufferPool::Create({.buffer_count = count, .cache_size = cache});
  if (!p.ok()) Die("BufferPool::Create");
  return *std::move(p);
}

inline void Touch(std::byte* p) {
  p[0] = std::byte{1};
  benchmark::DoNotOptimize(p);
  benchmark::ClobberMemory();
}

// ---- ManyPools -------------------------------------------------------------

// The same loop for every row: four pool pointers taken in turn, which
// name 1, 2 or 4 distinct pools, so only the switching differs.
template <int kPools>
void ManyPools(benchmark::State& state) {
  static auto* pools = [] {
    auto* v = new std::vector<std::unique_ptr<bufpool::BufferPool>>();
    for (int i = 0; i < kPools; ++i) v->push_back(NewPool(1024, 64));
    return v;
  }();
  bufpool::BufferPool* p[4];
  for (int i = 0; i < 4; ++i) p[i] = (*pools)[i % kPools].get();
  benchmark::DoNotOptimize(p);
  unsigned next = 0;
  for (auto _ : state) {
    bufpool::Buffer b = p[next++ % 4]->TryAcquire();
    if (!b) Die("pool empty");
    Touch(b.data());
  }
  state.SetItemsProcessed(state.iterations());
}
BENCHMARK(ManyPools<1>)->Name("ManyPools/libbufpool_1pool");
BENCHMARK(ManyPools<2>)->Name("ManyPools/libbufpool_2pools");
BENCHMARK(ManyPools<4>)->Name("ManyPools/libbufpool_4pools");

// The floor under those rows: the same loop over 1, 2 or 4 per-CPU-shaped
// stacks (FloorIndexedStack: no checks, no restart, no pool), each with its
// own buffers. The ratios between these rows are what taking turns between
// caches in memory costs on this CPU, whatever the caches' code.
template <int kStacks>
void ManyStacksFloor(benchmark::State& state) {
  using Floor = bufpool_bench::FloorIndexedStack;
  static auto* stacks = [] {
    auto* v = new std::vector<std::unique_ptr<Floor>>();
    for (int i = 0; i < kStacks; ++i) v->push_back(std::make_unique<Floor>());
    return v;
  }();
  Floor* p[4];
  for (int i = 0; i < 4; ++i) p[i] = (*stacks)[i % kStacks].get();
  benchmark::DoNotOptimize(p);
  unsigned next = 0;
  for (auto _ : state) {
    Floor* s = p[next++ % 4];
    Floor::Item b = s->Get();
    Touch(Floor::Data(b));
    s->Put(b);
  }
  state.SetItemsProcessed(state.iterations());
}
BENCHMARK(ManyStacksFloor<1>)->Name("ManyPools/floor_indexed_stack_1pool");
BENCHMARK(ManyStacksFloor<2>)->Name("ManyPools/floor_indexed_stack_2pools");
BENCHMARK(ManyStacksFloor<4>)->Name("ManyPools/floor_indexed_stack_4pools");

// ---- SharedObject ----------------------------------------------------------

constexpr size_t kPairsPerCall = 64;

// The executable's copy of bench/pic_pair.cc's loop, out of line like the
// shared object's, so both pay one call per 64 pairs.
[[gnu::noinline]] void ExePairs(bufpool::BufferPool* pool, size_t n) {
  for (size_t i = 0; i < n; ++i) {
    bufpool::Buffer b = pool->TryAcquire();
    if (!b) std::abort();
    std::byte* p = b.data();
    p[0] = std::byte{1};
    asm volatile("" : : "r"(p) : "memory");
  }
}

using PairsFn = void (*)(bufpool::BufferPool*, size_t);

PairsFn LoadPicPairs() {
  void* so = dlopen(BUFPOOL_BENCH_PIC_SO, RTLD_NOW | RTLD_LOCAL);
  if (so == nullptr) Die(dlerror());
  auto fn = reinterpret_cast<PairsFn>(dlsym(so, "BenchPicPairs"));
  if (fn == nullptr) Die(dlerror());
  return fn;
}

bufpool::BufferPool& PairPool() {
  static bufpool::BufferPool* pool = NewPool(1024, 64).release();
  return *pool;
}

void SharedObjectExe(benchmark::State& state) {
  bufpool::BufferPool& pool = PairPool();
  for (auto _ : state) ExePairs(&pool, kPairsPerCall);
  state.SetItemsProcessed(state.iterations() * kPairsPerCall);
}
void SharedObjectPic(benchmark::State& state) {
  static const PairsFn pic = LoadPicPairs();
  bufpool::BufferPool& pool = PairPool();
  for (auto _ : state) pic(&pool, kPairsPerCall);
  state.SetItemsProcessed(state.iterations() * kPairsPerCall);
}
BENCHMARK(SharedObjectExe)->Name("SharedObject/libbufpool_exe");
BENCHMARK(SharedObjectPic)->Name("SharedObject/libbufpool_pic_so");

// ---- Reclaim ---------------------------------------------------------------

// A worker that, on each request, takes `kIdle` buffers, releases them into
// its own cache and blocks on a condition variable until the next request.
class IdleWorker {
 public:
  static constexpr int kIdle = 16;
  explicit IdleWorker(bufpool::BufferPool& pool)
      : pool_(pool), thread_([this] { Run(); }) {}
  ~IdleWorker() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      quit_ = true;
      cv_.notify_all();
    }
    thread_.join();
  }
  // Returns once the worker has cached its buffers and is asleep.
  void CacheAndSleep() {
    std::unique_lock<std::mutex> lock(mu_);
    ++requested_;
    cv_.notify_all();
    cv_.wait(lock, [this] { return done_ == requested_; });
  }

 private:
  void Run() {
    std::unique_lock<std::mutex> lock(mu_);
    for (;;) {
      cv_.wait(lock, [this] { return quit_ || requested_ != done_; });
      if (quit_) return;
      {
        std::vector<bufpool::Buffer> mine;
        for (int i = 0; i < kIdle; ++i) {
          mine.push_back(pool_.TryAcquire());
          if (!mine.back()) Die("worker found the pool empty");
        }
      }
      ++done_;
      cv_.notify_all();
    }
  }

  bufpool::BufferPool& pool_;
  std::mutex mu_;
  std::condition_variable cv_;
  uint64_t requested_ = 0, done_ = 0;
  bool quit_ = false;
  std::thread thread_;
};

void Reclaim(benchmark::State& state) {
  auto pool = NewPool(1024, 64);
  std::vector<bufpool::Buffer> held(1024 - IdleWorker::kIdle);
  if (pool->TryAcquireBulk(absl::MakeSpan(held)) != held.size()) {
    Die("setup");
  }
  pool->FlushCaches();
  std::vector<double> us;
  {
    IdleWorker worker(*pool);
    for (auto _ : state) {
      state.PauseTiming();
      worker.CacheAndSleep();
      state.ResumeTiming();
      const auto start = std::chrono::steady_clock::now();
      auto b = pool->Acquire(absl::Seconds(5));
      const auto end = std::chrono::steady_clock::now();
      if (!b.ok()) Die("Acquire timed out with buffers idle in a cache");
      state.SetIterationTime(
          std::chrono::duration<double>(end - start).count());
      us.push_back(
          std::chrono::duration<double, std::micro>(end - start).count());
      state.PauseTiming();
      b->Reset();
      pool->FlushCaches();  // the worker takes them again next round
      state.ResumeTiming();
    }
  }
  std::sort(us.begin(), us.end());
  if (!us.empty()) {
    state.counters["p50_us"] = us[us.size() / 2];
    state.counters["p99_us"] =
        us[std::min(us.size() - 1, us.size() * 99 / 100)];
  }
  state.SetItemsProcessed(state.iterations());
  held.clear();
}
BENCHMARK(Reclaim)
    ->Name("Reclaim/libbufpool")
    ->UseManualTime()
    ->Iterations(2000);

}  // namespace

BENCHMARK_MAIN();

// What holder tracking costs the hot pair (acquire, write one byte,
// release through the handle), one pool per level: kOff, kSampled (1 in
// 128, the default) and kAll. tools/bench runs each contender in a process
// of its own, in interleaved rounds; docs/benchmarks.md has the ratios.
//
//   build/release/bench/holders_benchmark --benchmark_filter=HolderPair/
#include "contenders.h"

namespace bufpool_bench {
namespace {

template <bufpool::TrackHolders kTrack>
bufpool::BufferPool& TrackedPool() {
  static bufpool::BufferPool* pool = [] {
    auto p = bufpool::BufferPool::Create({.buffer_size = kBufferSize,
                                          .buffer_count = 8192,
                                          .cache_size = kPoolCache,
                                          .track_holders = kTrack});
    if (!p.ok()) Die("BufferPool::Create");
    if ((*p)->track_holders() != kTrack) {
      Die("BUFPOOL_TRACK_HOLDERS is set: unset it to compare the levels");
    }
    return p->release();
  }();
  return *pool;
}

template <bufpool::TrackHolders kTrack>
struct TrackedBuffer {
  using Item = bufpool::Buffer;
  BENCH_INLINE Item Get() {
    bufpool::Buffer b = pool_.TryAcquire();
    if (!b) Die("pool empty");
    return b;
  }
  BENCH_INLINE static std::byte* Data(const Item& b) { return b.data(); }
  BENCH_INLINE void Put(Item& b) { b.Reset(); }
  bufpool::BufferPool& pool_ = TrackedPool<kTrack>();
};

int Register() {
  using bufpool::TrackHolders;
  benchmark::RegisterBenchmark("HolderPair/off",
                               Pair<TrackedBuffer<TrackHolders::kOff>>);
  benchmark::RegisterBenchmark("HolderPair/sampled_128",
                               Pair<TrackedBuffer<TrackHolders::kSampled>>);
  benchmark::RegisterBenchmark("HolderPair/all",
                               Pair<TrackedBuffer<TrackHolders::kAll>>);
  return 0;
}
const int kRegistered = Register();

}  // namespace
}  // namespace bufpool_bench

BENCHMARK_MAIN();

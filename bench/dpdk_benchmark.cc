// DPDK's rte_mempool in the same workloads: with a per-thread cache of 256
// (rte_mempool_cache_create, the way non-EAL threads get one) and without a
// cache (straight to the ring). Bulk32 uses rte_mempool_generic_get/put of
// 32 objects. EAL starts without huge pages or devices. Note: rte_mempool
// objects are cache-line aligned, not 4096-aligned as the other contenders'.
#include <rte_eal.h>
#include <rte_errno.h>
#include <rte_lcore.h>
#include <rte_mempool.h>
#include <sched.h>

#include "workloads.h"

namespace bufpool_bench {
namespace {

// g_mempools[0]: 4096-byte objects, which DPDK lays out with a 64-byte
// header and padding at a 4160-byte stride (64 bytes past a page boundary
// each time, so consecutive objects start in different L1 cache sets).
// g_mempools[1]: 4032-byte objects without padding, so header + object is
// 4096 bytes and objects sit 4096 apart like the other contenders' buffers;
// it shows what that spacing costs when a batch of buffers is touched (their
// first bytes all fall into one L1 cache set).
rte_mempool* g_mempools[2] = {nullptr, nullptr};

template <unsigned kCache, int kPool = 0>
struct Dpdk {
  static inline rte_mempool*& g_mempool = g_mempools[kPool];
  using Item = void*;
  Dpdk() {
    if (kCache != 0) {
      cache_ = rte_mempool_cache_create(kCache, SOCKET_ID_ANY);
      if (cache_ == nullptr) Die("rte_mempool_cache_create");
    }
  }
  ~Dpdk() {
    if (cache_ != nullptr) {
      rte_mempool_cache_flush(cache_, g_mempool);
      rte_mempool_cache_free(cache_);
    }
  }
  BENCH_INLINE Item Get() {
    void* obj;
    if (rte_mempool_generic_get(g_mempool, &obj, 1, cache_) != 0)
      Die("mempool empty");
    return obj;
  }
  BENCH_INLINE static std::byte* Data(Item p) {
    return static_cast<std::byte*>(p);
  }
  BENCH_INLINE void Put(Item& p) {
    rte_mempool_generic_put(g_mempool, &p, 1, cache_);
  }
  BENCH_INLINE void GetBulk(Item* out, size_t n) {
    if (rte_mempool_generic_get(g_mempool, out, static_cast<unsigned>(n),
                                cache_) != 0) {
      Die("mempool empty");
    }
  }
  BENCH_INLINE void PutBulk(Item* in, size_t n) {
    rte_mempool_generic_put(g_mempool, in, static_cast<unsigned>(n), cache_);
  }
  rte_mempool_cache* cache_ = nullptr;
};

}  // namespace
}  // namespace bufpool_bench

int main(int argc, char** argv) {
  using namespace bufpool_bench;
  const char* eal_args[] = {argv[0],
                            "--no-huge",
                            "--no-pci",
                            "-l",
                            "0",
                            "--no-shconf",
                            "-m",
                            "256",
                            "--log-level=error",
                            "--no-telemetry"};
  // EAL pins the calling thread to lcore 0; benchmark threads inherit the
  // main thread's affinity, so restore it afterwards or every thread would
  // share one CPU (the other contenders run unpinned).
  cpu_set_t all;
  sched_getaffinity(0, sizeof(all), &all);
  if (rte_eal_init(10, const_cast<char**>(eal_args)) < 0) {
    std::fprintf(stderr, "dpdk_benchmark: rte_eal_init failed: %s\n",
                 rte_strerror(rte_errno));
    return 1;
  }
  sched_setaffinity(0, sizeof(all), &all);
  // 8191 objects; no mempool-level cache: each thread brings its own (or
  // none).
  const unsigned sizes[2] = {kBufferSize, kBufferSize - 64};
  for (int i = 0; i < 2; ++i) {
    // NO_SPREAD: otherwise DPDK pads objects to spread them over memory
    // channels, which is exactly the 4160-byte stride of pool 0.
    g_mempools[i] = rte_mempool_create(
        i == 0 ? "bench" : "bench4k", 8191, sizes[i], 0, 0, nullptr, nullptr,
        nullptr, nullptr, SOCKET_ID_ANY, i == 0 ? 0 : RTE_MEMPOOL_F_NO_SPREAD);
    if (g_mempools[i] == nullptr) {
      std::fprintf(stderr, "dpdk_benchmark: rte_mempool_create failed: %s\n",
                   rte_strerror(rte_errno));
      return 1;
    }
    // Fault every object in, as the pool's populate does.
    rte_mempool_obj_iter(
        g_mempools[i],
        [](rte_mempool*, void*, void* obj, unsigned) {
          static_cast<std::byte*>(obj)[0] = std::byte{0};
        },
        nullptr);
  }
  RegisterAll<Dpdk<256>>("dpdk_mempool_cache256");
  // Without a cache, every get/put is a multi-producer ring operation whose
  // threads wait for each other; with 8 threads on 2 cores a preempted one
  // stalls the rest (milliseconds per buffer measured here), so that case
  // runs a fixed, small number of iterations.
  RegisterAll<Dpdk<0>>("dpdk_mempool_ring", 500);
  benchmark::RegisterBenchmark("Bulk32/dpdk_mempool_cache256_4k_stride",
                               Bulk32<Dpdk<256, 1>>);
  benchmark::RegisterBenchmark("Pair/dpdk_mempool_cache256_4k_stride",
                               Pair<Dpdk<256, 1>>);
  benchmark::RegisterBenchmark("WorkingSet/dpdk_mempool_cache256_4k_stride",
                               WorkingSet<Dpdk<256, 1>>);
  benchmark::Initialize(&argc, argv);
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}

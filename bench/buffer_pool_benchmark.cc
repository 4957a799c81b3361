// libbufpool (its C++ handle, raw and C API calls) against per-buffer
// allocation with glibc, one page mmap per buffer, and a mutex-guarded free
// list, every workload of workloads.h. tcmalloc, jemalloc and mimalloc replace
// malloc for the whole process, so they run the same code in
// alloc_benchmark_<name>; DPDK in dpdk_benchmark. Run with
// GLIBC_TUNABLES=glibc.pthread.rseq=0, it also has libbufpool_fallback (the
// locked caches); with BUFPOOL_RSEQ_INDEX=cpu_id, libbufpool_cpu_id (the
// rseq caches indexed by cpu_id, as on kernels before 6.3).
//
//   build/release/bench/buffer_pool_benchmark --benchmark_filter=Pair/
#include "contenders.h"

namespace bufpool_bench {
namespace {

int Register() {
  RegisterAll<PoolBuffer<kPoolCache>>("libbufpool_buffer");
  RegisterAll<PoolRaw>("libbufpool_raw");
  RegisterAll<PoolElastic>("libbufpool_elastic");  // max_buffer_count
  RegisterAll<PoolJoined>("libbufpool_joined");    // shared, joined
  RegisterAll<PoolCacheOff>("libbufpool_cache_off");
  RegisterAll<PoolC>("libbufpool_c");  // bufpool/c.h
  // The locked caches, which run where rseq is missing, exist only in a
  // process started with GLIBC_TUNABLES=glibc.pthread.rseq=0; tools/bench
  // runs this contender so, beside the rseq rows of a plain process.
  if (SharedPool<kPoolCache>().per_cpu_mode() == bufpool::PerCpuMode::kLocked) {
    RegisterAll<PoolBuffer<kPoolCache>>("libbufpool_fallback");
  }
  // The rseq caches indexed by cpu_id (kernels before 6.3), in a process
  // started with BUFPOOL_RSEQ_INDEX=cpu_id (tools/bench runs it so).
  if (SharedPool<kPoolCache>().per_cpu_mode() == bufpool::PerCpuMode::kRseq) {
    RegisterAll<PoolBuffer<kPoolCache>>("libbufpool_cpu_id");
  }
  benchmark::RegisterBenchmark("Bulk32/libbufpool_bulk", Bulk32<PoolBulk>);
  benchmark::RegisterBenchmark("Bulk32/libbufpool_raw_bulk",
                               Bulk32<PoolRawBulk>);
  RegisterAll<MutexFreeList>("mutex_freelist");
  RegisterAll<PosixMemalign>("glibc_posix_memalign");
  RegisterAll<AlignedAlloc>("glibc_aligned_alloc");
  RegisterAll<NewAligned>("glibc_new_aligned");
  RegisterAll<MallocUnaligned>("glibc_malloc_unaligned");
  RegisterAll<MmapPage>("mmap_munmap");
  // The floor (see FloorStack): single-thread workloads only.
  benchmark::RegisterBenchmark("Pair/floor_plain_stack", Pair<FloorStack>);
  benchmark::RegisterBenchmark("WorkingSet/floor_plain_stack",
                               WorkingSet<FloorStack>);
  benchmark::RegisterBenchmark("Bulk32/floor_plain_stack", Bulk32<FloorStack>);
  benchmark::RegisterBenchmark("Pair/floor_shared_stack",
                               Pair<FloorSharedStack>);
  benchmark::RegisterBenchmark("WorkingSet/floor_shared_stack",
                               WorkingSet<FloorSharedStack>);
  benchmark::RegisterBenchmark("Pair/floor_indexed_stack",
                               Pair<FloorIndexedStack>);
  return 0;
}
const int kRegistered = Register();

}  // namespace
}  // namespace bufpool_bench

BENCHMARK_MAIN();

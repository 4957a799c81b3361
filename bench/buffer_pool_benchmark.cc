// libbufpool (its C++ handle, raw and C API calls) against per-buffer
// allocation with glibc, one page mmap per buffer, and a mutex-guarded free
// list, every workload of workloads.h. tcmalloc, jemalloc and mimalloc replace
// malloc for the whole process, so they run the same code in
// alloc_benchmark_<name>; DPDK in dpdk_benchmark.
//
//   build/release/bench/buffer_pool_benchmark --benchmark_filter=Pair/
#include "contenders.h"

namespace bufpool_bench {
namespace {

int Register() {
  RegisterAll<PoolBuffer<kPoolCache>>("libbufpool_buffer");
  RegisterAll<PoolRaw>("libbufpool_raw");
  RegisterAll<PoolCacheOff>("libbufpool_cache_off");
  RegisterAll<PoolC>("libbufpool_c");  // bufpool/c.h
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
  return 0;
}
const int kRegistered = Register();

}  // namespace
}  // namespace bufpool_bench

BENCHMARK_MAIN();

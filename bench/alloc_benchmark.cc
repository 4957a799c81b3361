// The same workloads for posix_memalign(4096) + free under another malloc
// (tcmalloc, jemalloc, mimalloc). The allocator is chosen by what this
// executable links (see bench/CMakeLists.txt); BUFPOOL_BENCH_ALLOCATOR names
// it in the benchmark names.
#include "contenders.h"

namespace bufpool_bench {
namespace {

const int kRegistered = [] {
  RegisterAll<PosixMemalign>(BUFPOOL_BENCH_ALLOCATOR "_posix_memalign");
  return 0;
}();

}  // namespace
}  // namespace bufpool_bench

BENCHMARK_MAIN();

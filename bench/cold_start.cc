// Cold start, the seed experiment: in a fresh process, obtain N buffers of
// 4096 bytes and write each once. Prints one JSON line with the time and the
// minor page faults per buffer (getrusage), so tools/bench can run it as a
// new process per measurement.
//
//   cold_start <contender> [count]
//   contenders: libbufpool            Create (populated, huge pages) + acquire
//   all
//               libbufpool_lazy       Create(populate=false, kNever) + acquire
//               all <malloc>_posix_memalign  N x posix_memalign(4096, 4096)
//               mmap_munmap           N x one-page mmap
//               floor_kernel_zeroing  one populated huge-page mapping, no
//                                     pool: the kernel's zeroing alone
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/resource.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "bufpool/buffer_pool.h"

namespace {

long MinorFaults() {
  rusage ru{};
  getrusage(RUSAGE_SELF, &ru);
  return ru.ru_minflt;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2 || argc > 3) {
    std::fprintf(stderr, "usage: %s <contender> [count]\n", argv[0]);
    return 2;
  }
  const std::string contender = argv[1];
  const size_t count = argc == 3 ? std::strtoul(argv[2], nullptr, 10) : 10000;
  const std::string memalign =
      std::string(BUFPOOL_BENCH_ALLOCATOR) + "_posix_memalign";
  std::vector<std::byte*> buffers(count);  // allocated before timing
  std::unique_ptr<bufpool::BufferPool> pool;

  const long faults_before = MinorFaults();
  const auto start = std::chrono::steady_clock::now();
  if (contender == "libbufpool" || contender == "libbufpool_lazy") {
    bufpool::PoolOptions options{.buffer_size = 4096, .buffer_count = count};
    if (contender == "libbufpool_lazy") {
      options.populate = false;
      options.huge_pages = bufpool::HugePages::kNever;
    }
    auto created = bufpool::BufferPool::Create(options);
    if (!created.ok()) {
      std::fprintf(stderr, "cold_start: %s\n",
                   created.status().ToString().c_str());
      return 1;
    }
    pool = *std::move(created);
    for (size_t i = 0; i < count; ++i) {
      buffers[i] = pool->TryAcquireRaw();
      buffers[i][0] = std::byte{1};
    }
  } else if (contender == memalign) {
    for (size_t i = 0; i < count; ++i) {
      void* p = nullptr;
      if (posix_memalign(&p, 4096, 4096) != 0) return 1;
      buffers[i] = static_cast<std::byte*>(p);
      buffers[i][0] = std::byte{1};
    }
  } else if (contender == "floor_kernel_zeroing") {
    // Not a contender: one mapping populated the way the pool's arena does
    // it (huge pages, MADV_POPULATE_WRITE), with no pool at all. The kernel
    // must zero every page it hands out; this is that cost alone.
    const size_t bytes = count * 4096;
    const size_t huge = size_t{2} << 20;
    void* raw = mmap(nullptr, bytes + huge, PROT_READ | PROT_WRITE,
                     MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (raw == MAP_FAILED) return 1;
    auto* region = reinterpret_cast<std::byte*>(
        (reinterpret_cast<uintptr_t>(raw) + huge - 1) & ~(huge - 1));
    madvise(region, bytes, MADV_HUGEPAGE);
    if (madvise(region, bytes, MADV_POPULATE_WRITE) != 0) return 1;
    for (size_t i = 0; i < count; ++i) {
      buffers[i] = region + i * 4096;
      buffers[i][0] = std::byte{1};
    }
  } else if (contender == "mmap_munmap") {
    for (size_t i = 0; i < count; ++i) {
      void* p = mmap(nullptr, 4096, PROT_READ | PROT_WRITE,
                     MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
      if (p == MAP_FAILED) return 1;
      buffers[i] = static_cast<std::byte*>(p);
      buffers[i][0] = std::byte{1};
    }
  } else {
    std::fprintf(stderr, "cold_start: unknown contender '%s'\n",
                 contender.c_str());
    return 2;
  }
  const auto end = std::chrono::steady_clock::now();
  const long faults = MinorFaults() - faults_before;
  // Keep the writes observable.
  unsigned sum = 0;
  for (std::byte* p : buffers) sum += static_cast<unsigned>(p[0]);
  const double ms =
      std::chrono::duration<double, std::milli>(end - start).count();
  std::printf(
      "{\"contender\": \"%s\", \"count\": %zu, \"ms\": %.4f, "
      "\"minflt_per_buffer\": %.4f, \"check\": %u}\n",
      contender.c_str(), count, ms, static_cast<double>(faults) / count, sum);
  if (pool) {
    for (std::byte* p : buffers) pool->ReleaseRaw(p);
  }
  return 0;
}

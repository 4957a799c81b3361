// Many small copies through a shared pool with the io_uring method: a 1 GiB
// pool against a 2 MiB one. The per-file time should not depend on the
// pool's size (the copy registers only the buffers it uses).
//
//   build/release/bench/uring_copy_benchmark --benchmark_repetitions=3
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <memory>
#include <random>
#include <string>

#include "benchmark/benchmark.h"
#include "bufpool/buffer_pool.h"
#include "bufpool/file_copy.h"

namespace {

constexpr size_t kFileBytes = 64 * 1024;

std::string TempDir() {
  const char* base = std::getenv("TMPDIR");
  std::string tmpl =
      std::string(base ? base : "/tmp") + "/uring_copy_bench.XXXXXX";
  if (mkdtemp(tmpl.data()) == nullptr) std::abort();
  return tmpl;
}

void CopiesThroughSharedPool(benchmark::State& state) {
  const size_t pool_bytes = static_cast<size_t>(state.range(0)) << 20;
  auto pool = bufpool::BufferPool::Create(
      {.buffer_count = pool_bytes / bufpool::kDefaultBufferSize});
  if (!pool.ok()) {
    state.SkipWithError(std::string(pool.status().message()).c_str());
    return;
  }
  const std::string dir = TempDir();
  const std::string src = dir + "/src", dst = dir + "/dst";
  {
    std::string data(kFileBytes, '\0');
    std::mt19937 rng(1);
    for (char& c : data) c = static_cast<char>(rng());
    std::ofstream(src, std::ios::binary) << data;
  }
  bufpool::CopyOptions o;
  o.method = bufpool::CopyMethod::kUring;
  o.pool = pool->get();
  for (auto _ : state) {
    absl::StatusOr<bufpool::CopyStats> r = bufpool::CopyFile(src, dst, o);
    if (!r.ok()) {
      state.SkipWithError(std::string(r.status().message()).c_str());
      break;
    }
    benchmark::DoNotOptimize(r->bytes_copied);
  }
  state.SetBytesProcessed(state.iterations() * kFileBytes);
  state.SetItemsProcessed(state.iterations());
  unlink(src.c_str());
  unlink(dst.c_str());
  rmdir(dir.c_str());
}

// 1,000 copies per run; alternate the two pools in one process.
BENCHMARK(CopiesThroughSharedPool)
    ->Arg(2)
    ->Arg(1024)
    ->Iterations(1000)
    ->Unit(benchmark::kMicrosecond);

}  // namespace

BENCHMARK_MAIN();

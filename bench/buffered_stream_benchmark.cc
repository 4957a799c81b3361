// Per-record cost of writing and reading an int32 + int64 + 6-byte string
// field by field: BufferedWriter/BufferedReader against one system call per
// field, std::ofstream/std::ifstream and fwrite/fread. Writes go to
// /dev/null and reads come from /dev/zero, so the numbers are the user-space
// and system-call cost per record without the page cache (see
// bench/run_stream_bench for the same experiment on real files).
#include <fcntl.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>

#include "benchmark/benchmark.h"
#include "bufpool/buffer_pool.h"
#include "bufpool/buffered_stream.h"

namespace {

constexpr int64_t kRecordBytes = 4 + 8 + 6;
const char kName[6] = {'b', 'u', 'f', 'p', 'o', 'o'};

bufpool::BufferPool& Pool() {
  static bufpool::BufferPool* pool = [] {
    auto p =
        bufpool::BufferPool::Create({.buffer_size = 4096, .buffer_count = 256});
    if (!p.ok()) std::abort();
    return p->release();
  }();
  return *pool;
}

void SetCounters(benchmark::State& state) {
  state.SetItemsProcessed(state.iterations());
  state.SetBytesProcessed(state.iterations() * kRecordBytes);
}

void BM_Write_SyscallPerField(benchmark::State& state) {
  const int fd = open("/dev/null", O_WRONLY);
  int32_t a = 1;
  int64_t b = 2;
  for (auto _ : state) {
    benchmark::DoNotOptimize(write(fd, &a, 4));
    benchmark::DoNotOptimize(write(fd, &b, 8));
    benchmark::DoNotOptimize(write(fd, kName, 6));
    ++a, ++b;
  }
  close(fd);
  SetCounters(state);
}
BENCHMARK(BM_Write_SyscallPerField);

void BM_Write_Buffered(benchmark::State& state) {
  auto w = bufpool::BufferedWriter::Open("/dev/null", Pool());
  if (!w.ok()) {
    state.SkipWithError(std::string(w.status().message()).c_str());
    return;
  }
  uint32_t a = 1;
  uint64_t b = 2;
  for (auto _ : state) {
    absl::Status s = w->AppendLE<uint32_t>(a++);
    if (s.ok()) s = w->AppendLE<uint64_t>(b++);
    if (s.ok()) s = w->Append(kName, 6);
    if (!s.ok()) state.SkipWithError("append failed");
  }
  if (!w->Close().ok()) state.SkipWithError("close failed");
  SetCounters(state);
}
// Threads: one writer each, all on one pool.
BENCHMARK(BM_Write_Buffered)->Threads(1)->Threads(2);

void BM_Write_Ofstream(benchmark::State& state) {
  std::ofstream out("/dev/null", std::ios::binary);
  int32_t a = 1;
  int64_t b = 2;
  for (auto _ : state) {
    out.write(reinterpret_cast<const char*>(&a), 4);
    out.write(reinterpret_cast<const char*>(&b), 8);
    out.write(kName, 6);
    ++a, ++b;
  }
  SetCounters(state);
}
BENCHMARK(BM_Write_Ofstream);

void BM_Write_Fwrite(benchmark::State& state) {
  FILE* f = std::fopen("/dev/null", "wb");
  int32_t a = 1;
  int64_t b = 2;
  for (auto _ : state) {
    std::fwrite(&a, 4, 1, f);
    std::fwrite(&b, 8, 1, f);
    std::fwrite(kName, 6, 1, f);
    ++a, ++b;
  }
  std::fclose(f);
  SetCounters(state);
}
BENCHMARK(BM_Write_Fwrite);

void BM_Read_SyscallPerField(benchmark::State& state) {
  const int fd = open("/dev/zero", O_RDONLY);
  int32_t a;
  int64_t b;
  char s[6];
  for (auto _ : state) {
    benchmark::DoNotOptimize(read(fd, &a, 4));
    benchmark::DoNotOptimize(read(fd, &b, 8));
    benchmark::DoNotOptimize(read(fd, s, 6));
    benchmark::DoNotOptimize(a + b + s[0]);
  }
  close(fd);
  SetCounters(state);
}
BENCHMARK(BM_Read_SyscallPerField);

void BM_Read_Buffered(benchmark::State& state) {
  auto r = bufpool::BufferedReader::Open("/dev/zero", Pool());
  if (!r.ok()) {
    state.SkipWithError(std::string(r.status().message()).c_str());
    return;
  }
  char s[6];
  for (auto _ : state) {
    auto a = r->ReadLE<uint32_t>();
    auto b = r->ReadLE<uint64_t>();
    absl::Status st = r->ReadExact({reinterpret_cast<std::byte*>(s), 6});
    if (!a.ok() || !b.ok() || !st.ok()) state.SkipWithError("read failed");
    benchmark::DoNotOptimize(*a + *b + s[0]);
  }
  SetCounters(state);
}
BENCHMARK(BM_Read_Buffered)->Threads(1)->Threads(2);

void BM_Read_Ifstream(benchmark::State& state) {
  std::ifstream in("/dev/zero", std::ios::binary);
  int32_t a;
  int64_t b;
  char s[6];
  for (auto _ : state) {
    in.read(reinterpret_cast<char*>(&a), 4);
    in.read(reinterpret_cast<char*>(&b), 8);
    in.read(s, 6);
    benchmark::DoNotOptimize(a + b + s[0]);
  }
  SetCounters(state);
}
BENCHMARK(BM_Read_Ifstream);

void BM_Read_Fread(benchmark::State& state) {
  FILE* f = std::fopen("/dev/zero", "rb");
  int32_t a;
  int64_t b;
  char s[6];
  for (auto _ : state) {
    benchmark::DoNotOptimize(std::fread(&a, 4, 1, f));
    benchmark::DoNotOptimize(std::fread(&b, 8, 1, f));
    benchmark::DoNotOptimize(std::fread(s, 6, 1, f));
    benchmark::DoNotOptimize(a + b + s[0]);
  }
  std::fclose(f);
  SetCounters(state);
}
BENCHMARK(BM_Read_Fread);

}  // namespace

BENCHMARK_MAIN();

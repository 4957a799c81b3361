// ChainCursor and the frame splitters (bufpool/cursor.h) against the
// std::string and memchr ways of doing the same, in memory (no sockets, so
// the parsing is what is measured).
//
//   LengthFrames/<contender>  64 KiB "reads" of 1 KiB frames, each behind a
//       4-byte big-endian length (1028 bytes a frame, so frames straddle
//       reads and buffers); each frame's first 8 bytes are read.
//       libbufpool: the read is copied into 16 fresh 4 KiB pool buffers (as
//       the kernel would write them) and linked to the input chain;
//       LengthPrefixSplitter::Next until nullopt; each frame a chain of
//       slices, dropped after use. std_string: the read appended to a
//       std::string; each frame copied out into a std::string and erased
//       from the front (append, parse, erase). std_string_batch_erase: the
//       same, but erasing once per read. libbufpool_views:
//       LengthPrefixSplitter::ForEachFrame, each frame a view (frames that
//       cross buffers copied into one reused string). read_only_floor:
//       the reads alone, dropped whole (what every chain contender pays).
//   Lines/<contender>  64 KiB reads of 80-byte lines ("...\n"); the length
//       of each line is summed. libbufpool: LineSplitter::Next over a chain
//       of 16 4 KiB buffers (new references to filled ones, so no copy
//       is timed); libbufpool_view: LineSplitter::NextView, the same with
//       a view per line; libbufpool_foreach: LineSplitter::ForEachLine,
//       views handed to a callback. memchr_contiguous: a memchr loop over one
//       64 KiB buffer.
//   ReadLE32/<contender>  1,024 little-endian uint32 loads from one 4 KiB
//       slice: ChainCursor::ReadLE<uint32_t> against memcpy loads.
//
// Items are frames, lines or loads; allocs_per_item counts heap allocations
// (operator new, replaced in this binary) inside the timed loop.
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <new>
#include <string>
#include <thread>
#include <vector>

#include "benchmark/benchmark.h"
#include "bufpool/buffer_pool.h"
#include "bufpool/chain.h"
#include "bufpool/cursor.h"

namespace {
std::atomic<uint64_t> g_allocs{0};
}  // namespace

// Counting allocator for the whole binary (relaxed: a statistic).
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"
void* operator new(size_t n) {
  g_allocs.fetch_add(1, std::memory_order_relaxed);
  if (void* p = std::malloc(n == 0 ? 1 : n)) return p;
  throw std::bad_alloc();
}
void* operator new[](size_t n) { return operator new(n); }
void operator delete(void* p) noexcept { std::free(p); }
void operator delete[](void* p) noexcept { std::free(p); }
void operator delete(void* p, size_t) noexcept { std::free(p); }
void operator delete[](void* p, size_t) noexcept { std::free(p); }

namespace {

constexpr size_t kRead = 64 * 1024;
constexpr size_t kBuffer = 4096;
constexpr size_t kBody = 1024;
constexpr size_t kPrefixed = 4 + kBody;
constexpr size_t kLine = 80;

// Reference counts use atomics either way; start a thread so that the
// std:: side does too where libstdc++ would skip them.
const bool kThreaded = [] {
  std::thread([] {}).join();
  return true;
}();

bufpool::BufferPool& Pool() {
  static bufpool::BufferPool* pool = [] {
    auto p = bufpool::BufferPool::Create(
        {.buffer_size = kBuffer, .buffer_count = 1024});
    if (!p.ok()) std::abort();
    return p->release();
  }();
  return *pool;
}

class AllocCounter {
 public:
  AllocCounter() : start_(g_allocs.load(std::memory_order_relaxed)) {}
  void Report(benchmark::State& state, double items) {
    const uint64_t n = g_allocs.load(std::memory_order_relaxed) - start_;
    state.counters["allocs_per_item"] = static_cast<double>(n) / items;
  }

 private:
  uint64_t start_;
};

// An endless stream of length-prefixed frames, served 64 KiB at a time.
// The bytes at stream offset P depend only on P mod kPrefixed, so one read's
// worth plus a frame (in the cache, as a just-received read would be) serves
// every read.
class FrameStream {
 public:
  FrameStream() : wire_(kRead + 2 * kPrefixed, '\0') {
    for (size_t f = 0; f * kPrefixed < wire_.size(); ++f) {
      char* p = wire_.data() + f * kPrefixed;
      const uint32_t be = __builtin_bswap32(static_cast<uint32_t>(kBody));
      std::memcpy(p, &be, 4);
      if (wire_.size() - f * kPrefixed >= 12) std::memcpy(p + 4, &f, 8);
    }
  }
  const char* Next() {
    const char* p = wire_.data() + at_;
    at_ = (at_ + kRead) % kPrefixed;
    return p;
  }

 private:
  std::string wire_;
  size_t at_ = 0;
};

// The read's copy, the same for every contender: glibc's memcpy through a
// pointer the compiler cannot see through. (Inlined with a constant 4 KiB
// size it became `rep movsq`, which took 86% of the chain contenders' time
// and none of the std::string ones', whose append calls glibc's.)
void* (*volatile kernel_copy)(void*, const void*, size_t) = std::memcpy;
void KernelWrite(void* dst, const void* src, size_t n) {
  kernel_copy(dst, src, n);
}

// One 64 KiB read of `stream` into 16 fresh pool buffers, linked to `in`.
void ReadInto(FrameStream& stream, bufpool::BufferPool& pool,
              bufpool::BufferChain& in) {
  const char* src = stream.Next();
  for (size_t off = 0; off < kRead; off += kBuffer) {
    bufpool::Buffer b = pool.TryAcquire();
    if (!b) std::abort();
    KernelWrite(b.data(), src + off, kBuffer);
    in.Append(std::move(b), kBuffer);
  }
}

void BM_LengthFrames_Bufpool(benchmark::State& state) {
  FrameStream stream;
  bufpool::BufferPool& pool = Pool();
  bufpool::BufferChain in(pool);
  const bufpool::LengthPrefixSplitter frames{.max_frame = 1 << 20};
  uint64_t sum = 0, count = 0;
  auto read = [&] {
    ReadInto(stream, pool, in);
    for (;;) {
      absl::StatusOr<std::optional<bufpool::BufferChain>> f = frames.Next(in);
      if (!f.ok()) std::abort();
      if (!f->has_value()) break;
      bufpool::ChainCursor c(**f);
      sum += *c.ReadLE<uint64_t>();
      ++count;
    }
  };
  for (int i = 0; i < 4; ++i) read();  // warm-up: rings, the pool's cache
  count = 0;
  AllocCounter allocs;
  for (auto _ : state) read();
  benchmark::DoNotOptimize(sum);
  allocs.Report(state, static_cast<double>(count));
  state.SetItemsProcessed(static_cast<int64_t>(count));
  state.SetBytesProcessed(state.iterations() * kRead);
}
BENCHMARK(BM_LengthFrames_Bufpool)->Name("LengthFrames/libbufpool");

// The same reads, each frame handed out as a view (ForEachFrame()): no
// chain per frame; frames that cross buffers are copied into one string.
void BM_LengthFrames_BufpoolViews(benchmark::State& state) {
  FrameStream stream;
  bufpool::BufferPool& pool = Pool();
  bufpool::BufferChain in(pool);
  const bufpool::LengthPrefixSplitter frames{.max_frame = 1 << 20};
  std::string scratch;
  uint64_t sum = 0, count = 0;
  auto read = [&] {
    ReadInto(stream, pool, in);
    absl::StatusOr<size_t> n =
        frames.ForEachFrame(in, scratch, [&](absl::string_view f) {
          uint64_t v;
          std::memcpy(&v, f.data(), sizeof(v));
          sum += v;
        });
    if (!n.ok()) std::abort();
    count += *n;
  };
  for (int i = 0; i < 4; ++i) read();  // warm-up: rings, the pool's cache
  count = 0;
  AllocCounter allocs;
  for (auto _ : state) read();
  benchmark::DoNotOptimize(sum);
  allocs.Report(state, static_cast<double>(count));
  state.SetItemsProcessed(static_cast<int64_t>(count));
  state.SetBytesProcessed(state.iterations() * kRead);
}
BENCHMARK(BM_LengthFrames_BufpoolViews)->Name("LengthFrames/libbufpool_views");

// The floor under both chain contenders: the same reads into pool buffers,
// dropped whole without cutting a frame. A splitter can be at most
// (std_string_batch_erase / this) times faster than the string way.
void BM_LengthFrames_ReadOnly(benchmark::State& state) {
  FrameStream stream;
  bufpool::BufferPool& pool = Pool();
  bufpool::BufferChain in(pool);
  auto read = [&] {
    ReadInto(stream, pool, in);
    in.Clear();
  };
  for (int i = 0; i < 4; ++i) read();
  AllocCounter allocs;
  for (auto _ : state) read();
  allocs.Report(state, static_cast<double>(state.iterations()));
  state.SetBytesProcessed(state.iterations() * kRead);
}
BENCHMARK(BM_LengthFrames_ReadOnly)->Name("LengthFrames/read_only_floor");

void LengthFramesString(benchmark::State& state, bool batch_erase) {
  FrameStream stream;
  std::string in;
  uint64_t sum = 0, count = 0;
  auto read = [&] {
    in.append(stream.Next(), kRead);  // glibc's memcpy, as KernelWrite()
    size_t at = 0;
    while (in.size() - at >= 4) {
      uint32_t be;
      std::memcpy(&be, in.data() + at, 4);
      const size_t len = __builtin_bswap32(be);
      if (in.size() - at < 4 + len) break;
      std::string frame(in, at + 4, len);
      if (batch_erase) {
        at += 4 + len;
      } else {
        in.erase(0, 4 + len);
      }
      uint64_t v;
      std::memcpy(&v, frame.data(), sizeof(v));
      sum += v;
      ++count;
    }
    in.erase(0, at);
  };
  for (int i = 0; i < 4; ++i) read();
  count = 0;
  AllocCounter allocs;
  for (auto _ : state) read();
  benchmark::DoNotOptimize(sum);
  allocs.Report(state, static_cast<double>(count));
  state.SetItemsProcessed(static_cast<int64_t>(count));
  state.SetBytesProcessed(state.iterations() * kRead);
}
void BM_LengthFrames_String(benchmark::State& s) {
  LengthFramesString(s, false);
}
void BM_LengthFrames_StringBatch(benchmark::State& s) {
  LengthFramesString(s, true);
}
BENCHMARK(BM_LengthFrames_String)->Name("LengthFrames/std_string");
BENCHMARK(BM_LengthFrames_StringBatch)
    ->Name("LengthFrames/std_string_batch_erase");

// 64 KiB of 80-byte lines, whole lines only (819 lines and 16 bytes of a
// partial one would make the two loops differ; 65520 bytes are used).
std::string LineBytes() {
  std::string s;
  while (s.size() + kLine <= kRead) {
    s.append(kLine - 1, 'a' + static_cast<char>(s.size() / kLine % 26));
    s.push_back('\n');
  }
  return s;
}

void BM_Lines_Bufpool(benchmark::State& state) {
  const std::string bytes = LineBytes();
  bufpool::BufferChain filled(Pool());
  if (!filled.Append(bytes).ok()) std::abort();
  std::vector<bufpool::SharedBuffer> slices;
  for (size_t i = 0; i < filled.slice_count(); ++i)
    slices.push_back(filled.slice(i));
  bufpool::BufferChain in(Pool());
  bufpool::LineSplitter lines;
  uint64_t sum = 0, count = 0;
  auto read = [&] {
    for (const bufpool::SharedBuffer& s : slices) in.Append(s);
    for (;;) {
      absl::StatusOr<std::optional<bufpool::BufferChain>> line = lines.Next(in);
      if (!line.ok()) std::abort();
      if (!line->has_value()) break;
      sum += (*line)->size();
      ++count;
    }
  };
  for (int i = 0; i < 4; ++i) read();
  count = 0;
  AllocCounter allocs;
  for (auto _ : state) read();
  benchmark::DoNotOptimize(sum);
  allocs.Report(state, static_cast<double>(count));
  state.SetItemsProcessed(static_cast<int64_t>(count));
  state.SetBytesProcessed(state.iterations() * bytes.size());
}
BENCHMARK(BM_Lines_Bufpool)->Name("Lines/libbufpool");

void BM_Lines_BufpoolView(benchmark::State& state) {
  const std::string bytes = LineBytes();
  bufpool::BufferChain filled(Pool());
  if (!filled.Append(bytes).ok()) std::abort();
  std::vector<bufpool::SharedBuffer> slices;
  for (size_t i = 0; i < filled.slice_count(); ++i)
    slices.push_back(filled.slice(i));
  bufpool::BufferChain in(Pool());
  bufpool::LineSplitter lines;
  uint64_t sum = 0, count = 0;
  auto read = [&] {
    for (const bufpool::SharedBuffer& s : slices) in.Append(s);
    for (;;) {
      absl::StatusOr<std::optional<absl::string_view>> line =
          lines.NextView(in);
      if (!line.ok()) std::abort();
      if (!line->has_value()) break;
      sum += (*line)->size();
      ++count;
    }
  };
  for (int i = 0; i < 4; ++i) read();
  count = 0;
  AllocCounter allocs;
  for (auto _ : state) read();
  benchmark::DoNotOptimize(sum);
  allocs.Report(state, static_cast<double>(count));
  state.SetItemsProcessed(static_cast<int64_t>(count));
  state.SetBytesProcessed(state.iterations() * bytes.size());
}
BENCHMARK(BM_Lines_BufpoolView)->Name("Lines/libbufpool_view");

void BM_Lines_BufpoolForEach(benchmark::State& state) {
  const std::string bytes = LineBytes();
  bufpool::BufferChain filled(Pool());
  if (!filled.Append(bytes).ok()) std::abort();
  std::vector<bufpool::SharedBuffer> slices;
  for (size_t i = 0; i < filled.slice_count(); ++i)
    slices.push_back(filled.slice(i));
  bufpool::BufferChain in(Pool());
  bufpool::LineSplitter lines;
  uint64_t sum = 0, count = 0;
  auto read = [&] {
    for (const bufpool::SharedBuffer& s : slices) in.Append(s);
    absl::Status s = lines.ForEachLine(in, [&](absl::string_view line) {
      sum += line.size();
      ++count;
    });
    if (!s.ok()) std::abort();
  };
  for (int i = 0; i < 4; ++i) read();
  count = 0;
  AllocCounter allocs;
  for (auto _ : state) read();
  benchmark::DoNotOptimize(sum);
  allocs.Report(state, static_cast<double>(count));
  state.SetItemsProcessed(static_cast<int64_t>(count));
  state.SetBytesProcessed(state.iterations() * bytes.size());
}
BENCHMARK(BM_Lines_BufpoolForEach)->Name("Lines/libbufpool_foreach");

void BM_Lines_Memchr(benchmark::State& state) {
  const std::string bytes = LineBytes();
  uint64_t sum = 0, count = 0;
  for (auto _ : state) {
    const char* p = bytes.data();
    const char* end = p + bytes.size();
    while (p < end) {
      const char* nl = static_cast<const char*>(std::memchr(p, '\n', end - p));
      if (nl == nullptr) break;
      sum += static_cast<size_t>(nl - p);
      ++count;
      p = nl + 1;
    }
  }
  benchmark::DoNotOptimize(sum);
  state.SetItemsProcessed(static_cast<int64_t>(count));
  state.SetBytesProcessed(state.iterations() * bytes.size());
}
BENCHMARK(BM_Lines_Memchr)->Name("Lines/memchr_contiguous");

constexpr size_t kLoads = kBuffer / 4 - 1;  // all inside the slice

void BM_ReadLE32_Cursor(benchmark::State& state) {
  bufpool::BufferChain chain(Pool());
  if (!chain.Append(std::string(kBuffer, 'x')).ok()) std::abort();
  for (auto _ : state) {
    bufpool::ChainCursor c(chain);
    for (size_t i = 0; i < kLoads; ++i) {
      uint32_t v = *c.ReadLE<uint32_t>();
      benchmark::DoNotOptimize(v);
    }
  }
  state.SetItemsProcessed(state.iterations() * kLoads);
}
BENCHMARK(BM_ReadLE32_Cursor)->Name("ReadLE32/libbufpool");

void BM_ReadLE32_Memcpy(benchmark::State& state) {
  bufpool::BufferChain chain(Pool());
  if (!chain.Append(std::string(kBuffer, 'x')).ok()) std::abort();
  for (auto _ : state) {
    const std::byte* p = chain.slice(0).data();
    benchmark::DoNotOptimize(p);
    for (size_t i = 0; i < kLoads; ++i) {
      uint32_t v;
      std::memcpy(&v, p + 4 * i, 4);
      benchmark::DoNotOptimize(v);
    }
  }
  state.SetItemsProcessed(state.iterations() * kLoads);
}
BENCHMARK(BM_ReadLE32_Memcpy)->Name("ReadLE32/memcpy");

}  // namespace

BENCHMARK_MAIN();

// SharedBuffer and BufferChain against the std:: ways of doing the same.
//
//   Share/<contender>   copy + destroy of a reference: SharedBuffer vs
//                       std::shared_ptr (both one atomic increment and one
//                       decrement, uncontended).
//   Slice/<contender>   a sub-range reference: SharedBuffer::Slice vs
//                       std::shared_ptr aliasing constructor.
//   Framing/<contender> the framing pipeline: read 64 KiB from a socketpair,
//                       cut it into 1 KiB frames, send each frame behind its
//                       own 16-byte header. libbufpool: ReadFrom into a
//                       chain, Split, the headers packed into pool buffers
//                       and linked, WriteTo. std_string: read into a
//                       std::string, each frame built as header + payload in
//                       a std::string. Both send with one gather write per
//                       64 KiB (FramingPerFrame/: one write per frame).
//
//   Append/budget:<0|1> Append() of 100-byte pieces into a chain, consumed
//                       whole every 4 KiB (so each round takes and drops
//                       buffers): an unbound chain (0) against one bound to
//                       a budget it never reaches (1), what charging costs.
//
// Items are references (Share, Slice), pieces (Append) or frames (Framing); the
// counter allocs_per_item counts heap allocations (operator new, replaced in
// this binary) inside the timed loop.
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <new>
#include <string>
#include <thread>
#include <vector>

#include "benchmark/benchmark.h"
#include "bufpool/budget.h"
#include "bufpool/buffer_pool.h"
#include "bufpool/chain.h"

namespace {
std::atomic<uint64_t> g_allocs{0};
}  // namespace

// Counting allocator for the whole binary (relaxed: a statistic). GCC
// cannot see that these replace the global operators, and warns that free()
// does not match them.
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

constexpr size_t kChunk = 64 * 1024;
constexpr size_t kFrame = 1024;
constexpr size_t kHeader = 16;
constexpr size_t kFrames = kChunk / kFrame;

// libstdc++'s shared_ptr counts with plain, non-atomic arithmetic while the
// process has never started a thread; start one, so both contenders pay
// for the atomics a program with threads pays.
const bool kThreaded = [] {
  std::thread([] {}).join();
  return true;
}();

bufpool::BufferPool& Pool() {
  static bufpool::BufferPool* pool = [] {
    auto p = bufpool::BufferPool::Create(
        {.buffer_size = 4096, .buffer_count = 1024});
    if (!p.ok()) std::abort();
    return p->release();
  }();
  return *pool;
}

// Allocations per item over the timed loop.
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

void BM_Share_Bufpool(benchmark::State& state) {
  bufpool::SharedBuffer whole(Pool().TryAcquire());
  AllocCounter allocs;
  for (auto _ : state) {
    bufpool::SharedBuffer copy = whole;
    benchmark::DoNotOptimize(copy.data());
  }
  allocs.Report(state, static_cast<double>(state.iterations()));
  state.SetItemsProcessed(state.iterations());
}
BENCHMARK(BM_Share_Bufpool)->Name("Share/libbufpool");

void BM_Share_SharedPtr(benchmark::State& state) {
  auto whole = std::make_shared<std::vector<std::byte>>(4096);
  AllocCounter allocs;
  for (auto _ : state) {
    std::shared_ptr<std::vector<std::byte>> copy = whole;
    benchmark::DoNotOptimize(copy.get());
  }
  allocs.Report(state, static_cast<double>(state.iterations()));
  state.SetItemsProcessed(state.iterations());
}
BENCHMARK(BM_Share_SharedPtr)->Name("Share/std_shared_ptr");

void BM_Slice_Bufpool(benchmark::State& state) {
  bufpool::SharedBuffer whole(Pool().TryAcquire());
  size_t off = 0;
  AllocCounter allocs;
  for (auto _ : state) {
    bufpool::SharedBuffer part = whole.Slice(off, 100);
    benchmark::DoNotOptimize(part.data());
    off = (off + 64) & 2047;
  }
  allocs.Report(state, static_cast<double>(state.iterations()));
  state.SetItemsProcessed(state.iterations());
}
BENCHMARK(BM_Slice_Bufpool)->Name("Slice/libbufpool");

void BM_Slice_SharedPtr(benchmark::State& state) {
  auto whole = std::shared_ptr<std::byte[]>(new std::byte[4096]);
  size_t off = 0;
  AllocCounter allocs;
  for (auto _ : state) {
    std::shared_ptr<std::byte> part(whole, whole.get() + off);  // aliasing
    benchmark::DoNotOptimize(part.get());
    off = (off + 64) & 2047;
  }
  allocs.Report(state, static_cast<double>(state.iterations()));
  state.SetItemsProcessed(state.iterations());
}
BENCHMARK(BM_Slice_SharedPtr)->Name("Slice/std_shared_ptr");

// ---- Framing
// -----------------------------------------------------------------

struct Wire {
  int in[2];   // in[0]: the peer writes the 64 KiB; in[1]: we read
  int out[2];  // out[0]: we send frames; out[1]: the peer drains
  std::string input;
  std::vector<char> drain;
  Wire() : input(kChunk, 'p'), drain(kFrames * (kHeader + kFrame)) {
    if (socketpair(AF_UNIX, SOCK_STREAM, 0, in) != 0 ||
        socketpair(AF_UNIX, SOCK_STREAM, 0, out) != 0) {
      std::abort();
    }
    const int big = 4 << 20;  // room for a whole round in each direction
    for (int fd : {in[0], in[1], out[0], out[1]}) {
      setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &big, sizeof(big));
      setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &big, sizeof(big));
    }
    for (size_t i = 0; i < input.size(); ++i) input[i] = static_cast<char>(i);
  }
  ~Wire() {
    for (int fd : {in[0], in[1], out[0], out[1]}) close(fd);
  }
  // The peer's side, the same for every contender: send the chunk, and
  // drain (and check the size of) what came back last round.
  void PeerSend() {
    for (size_t done = 0; done < kChunk;) {
      const ssize_t n = write(in[0], input.data() + done, kChunk - done);
      if (n <= 0) std::abort();
      done += static_cast<size_t>(n);
    }
  }
  void PeerDrain() {
    for (size_t done = 0; done < drain.size();) {
      const ssize_t n = read(out[1], drain.data() + done, drain.size() - done);
      if (n <= 0) std::abort();
      done += static_cast<size_t>(n);
    }
  }
};

void MakeHeader(size_t seq, char* h) {
  std::memset(h, 0, kHeader);
  std::memcpy(h, &seq, sizeof(seq));
  const uint32_t len = kFrame;
  std::memcpy(h + 8, &len, sizeof(len));
}

void FramingBufpool(benchmark::State& state, bool per_frame) {
  Wire wire;
  bufpool::BufferPool& pool = Pool();
  // Reused across rounds: a chain keeps its ring, so after the first round
  // nothing here touches the heap.
  bufpool::BufferChain in(pool);
  bufpool::BufferChain headers(pool);
  bufpool::BufferChain out(pool);
  size_t seq = 0;
  auto round = [&] {
    wire.PeerSend();
    while (in.size() < kChunk) {
      absl::StatusOr<size_t> n = bufpool::ReadFrom(wire.in[1], in, kChunk);
      if (!n.ok() || *n == 0) std::abort();
    }
    for (size_t f = 0; f < kFrames; ++f) {
      char h[kHeader];
      MakeHeader(seq++, h);
      // Headers are copied into shared header buffers (256 per 4 KiB) and
      // linked; payloads are linked straight from the received buffers.
      if (!headers.Append(absl::string_view(h, kHeader)).ok()) std::abort();
      out.Append(headers.Split(kHeader));
      out.Append(in.Split(kFrame));
      if (per_frame && !bufpool::WriteTo(wire.out[0], out).ok()) std::abort();
    }
    if (!per_frame && !bufpool::WriteTo(wire.out[0], out).ok()) std::abort();
    wire.PeerDrain();
  };
  round();  // warm-up: the chains' rings and the pool's CPU cache
  AllocCounter allocs;
  for (auto _ : state) round();
  allocs.Report(state, static_cast<double>(state.iterations() * kFrames));
  state.SetItemsProcessed(state.iterations() * kFrames);
  state.SetBytesProcessed(state.iterations() * kChunk);
}

void FramingString(benchmark::State& state, bool per_frame) {
  Wire wire;
  size_t seq = 0;
  auto round = [&] {
    wire.PeerSend();
    std::string in(kChunk, '\0');
    for (size_t done = 0; done < kChunk;) {
      const ssize_t n = read(wire.in[1], in.data() + done, kChunk - done);
      if (n <= 0) std::abort();
      done += static_cast<size_t>(n);
    }
    std::vector<std::string> frames;
    frames.reserve(kFrames);
    for (size_t f = 0; f < kFrames; ++f) {
      char h[kHeader];
      MakeHeader(seq++, h);
      std::string frame(h, kHeader);
      frame.append(in, f * kFrame, kFrame);
      if (per_frame) {
        if (send(wire.out[0], frame.data(), frame.size(), MSG_NOSIGNAL) !=
            static_cast<ssize_t>(frame.size())) {
          std::abort();
        }
      } else {
        frames.push_back(std::move(frame));
      }
    }
    if (!per_frame) {  // one gather write, as WriteTo does
      iovec iov[kFrames];
      for (size_t f = 0; f < kFrames; ++f) {
        iov[f] = {frames[f].data(), frames[f].size()};
      }
      msghdr msg{};
      msg.msg_iov = iov;
      msg.msg_iovlen = kFrames;
      if (sendmsg(wire.out[0], &msg, MSG_NOSIGNAL) !=
          static_cast<ssize_t>(kFrames * (kHeader + kFrame))) {
        std::abort();
      }
    }
    wire.PeerDrain();
  };
  round();
  AllocCounter allocs;
  for (auto _ : state) round();
  allocs.Report(state, static_cast<double>(state.iterations() * kFrames));
  state.SetItemsProcessed(state.iterations() * kFrames);
  state.SetBytesProcessed(state.iterations() * kChunk);
}

void BM_Framing_Bufpool(benchmark::State& s) { FramingBufpool(s, false); }
void BM_Framing_String(benchmark::State& s) { FramingString(s, false); }
void BM_FramingPerFrame_Bufpool(benchmark::State& s) {
  FramingBufpool(s, true);
}
void BM_FramingPerFrame_String(benchmark::State& s) { FramingString(s, true); }
BENCHMARK(BM_Framing_Bufpool)->Name("Framing/libbufpool");
BENCHMARK(BM_Framing_String)->Name("Framing/std_string");
BENCHMARK(BM_FramingPerFrame_Bufpool)->Name("FramingPerFrame/libbufpool");
BENCHMARK(BM_FramingPerFrame_String)->Name("FramingPerFrame/std_string");

void BM_Append(benchmark::State& state) {
  auto pool = bufpool::BufferPool::Create({.buffer_count = 64});
  if (!pool.ok()) return state.SkipWithError("pool failed");
  auto budget = (*pool)->CreateBudget(
      {.name = "bench", .max_bytes = 64 * (*pool)->buffer_size()});
  if (!budget.ok()) return state.SkipWithError("budget failed");
  {
    bufpool::BufferChain chain = state.range(0) != 0
                                     ? bufpool::BufferChain(**budget)
                                     : bufpool::BufferChain(**pool);
    char piece[100];
    std::memset(piece, 'p', sizeof(piece));
    const absl::string_view bytes(piece, sizeof(piece));
    for (auto _ : state) {
      for (int i = 0; i < 41; ++i) {
        if (!chain.Append(bytes).ok()) std::abort();
      }
      chain.Consume(chain.size());
    }
    state.SetItemsProcessed(state.iterations() * 41);
  }
}
BENCHMARK(BM_Append)->Name("AppendBudget/libbufpool_unbound")->Arg(0);
BENCHMARK(BM_Append)->Name("AppendBudget/libbufpool_budget")->Arg(1);

}  // namespace

BENCHMARK_MAIN();

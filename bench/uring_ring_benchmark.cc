// Per received message, the ring's Take() + release + Refill() (or Visit()
// + Refill()) against the same loop written on raw liburing calls (buffer
// id == slot, the buffer re-added to the ring by hand), and plain against
// zero-copy held sends.
//
// Receive loops: 32 datagrams of `bytes` (256: under the ring's
// copy_below; 2048: above it) are written to an AF_UNIX datagram
// socketpair, then one multishot receive's 32 completions are handled.
// "/full" times the whole turn (writes, io_uring_enter, handling);
// "/handling" times only the handling of the completions (manual time),
// which is all the contenders do differently.
//
//   build/release/bench/uring_ring_benchmark
#include <liburing.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <memory>
#include <string>
#include <thread>

#include "benchmark/benchmark.h"
#include "bufpool/budget.h"
#include "bufpool/buffer_pool.h"
#include "bufpool/chain.h"
#include "bufpool/uring.h"

namespace {

constexpr int kBatch = 32;
constexpr size_t kMaxMessage = 4096;
constexpr unsigned kGroup = 7;

struct Setup {
  io_uring ring{};
  int fds[2] = {-1, -1};
  std::unique_ptr<bufpool::BufferPool> pool;
  char msg[kMaxMessage];
  size_t message = 0;
  bool ok = false;

  explicit Setup(size_t bytes) : message(bytes) {
    io_uring_params p{};
    p.flags = IORING_SETUP_SINGLE_ISSUER | IORING_SETUP_DEFER_TASKRUN;
    if (io_uring_queue_init_params(256, &ring, &p) != 0) return;
    if (socketpair(AF_UNIX, SOCK_DGRAM, 0, fds) != 0) return;
    const int big = 4 << 20;
    setsockopt(fds[0], SOL_SOCKET, SO_SNDBUF, &big, sizeof(big));
    setsockopt(fds[1], SOL_SOCKET, SO_RCVBUF, &big, sizeof(big));
    auto created = bufpool::BufferPool::Create({.buffer_count = 1024});
    if (!created.ok()) return;
    pool = *std::move(created);
    std::memset(msg, 'm', sizeof(msg));
    ok = true;
  }
  ~Setup() {
    close(fds[0]);
    close(fds[1]);
    io_uring_queue_exit(&ring);
  }
  void WriteBatch() {
    for (int i = 0; i < kBatch; ++i) {
      if (send(fds[0], msg, message, 0) != static_cast<ssize_t>(message)) {
        std::abort();
      }
    }
  }
};

using Clock = std::chrono::steady_clock;

// Our loop: each completion's bytes are taken from the ring, touched and
// dropped (back to the pool), one Refill() per batch. BM_Ring takes each
// into a new chain (Take(cqe)); BM_RingInto appends to one chain that lives
// across turns, as a connection's input queue does (Take(cqe, queue)), and
// consumes it after each message, so each completion lands in an empty
// queue, which keeps no buffer: packed at 256 B (under copy_below), linked
// at 2048 B, its buffer back to the pool when consumed; BM_RingIntoPairs
// consumes it after every second message, so the second of each pair is
// copied into the first's tail room (the copy path, at 256 B, under
// copy_below); BM_RingVisit reads each
// completion's bytes in place (Visit(), Take() for what it leaves);
// BM_RingTakeBuffer owns each message as one Buffer (TakeBuffer(), which
// swaps the held buffer into the ring; Take() for what it leaves).
// BM_RingIntoBudget and BM_RingIntoPairsBudget are BM_RingInto and
// BM_RingIntoPairs with the queue bound to a budget (bufpool/budget.h),
// whose limit the load never reaches: what charging costs.
enum class Handling {
  kNewChain,
  kInto,
  kIntoPairs,
  kIntoBudget,
  kIntoPairsBudget,
  kVisit,
  kTakeBuffer
};

template <Handling kHow>
void RingLoop(benchmark::State& state) {
  const bool handling_only = state.range(0) != 0;
  Setup s(static_cast<size_t>(state.range(1)));
  if (!s.ok) return state.SkipWithError("setup failed");
  auto bufs = bufpool::ProvidedBufferRing::Create(
      &s.ring, *s.pool,
      {.group_id = kGroup,
       .max_buffers = 256,
       .initial_buffers = 256,
       .bundles = bufpool::ProvidedBufferRingOptions::Bundles::kOff,
       // Like the raw loop's ring: one buffer per completion.
       .incremental = bufpool::ProvidedBufferRingOptions::Incremental::kOff});
  if (!bufs.ok()) return state.SkipWithError("ring failed");
  // As a loop holds its ring: no StatusOr check per completion.
  bufpool::ProvidedBufferRing& ring = **bufs;
  constexpr bool kBudget =
      kHow == Handling::kIntoBudget || kHow == Handling::kIntoPairsBudget;
  auto budget = s.pool->CreateBudget(
      {.name = "bench",
       .max_bytes = s.pool->capacity() * s.pool->buffer_size()});
  if (!budget.ok()) return state.SkipWithError("budget failed");
  bufpool::BufferChain queue =
      kBudget ? bufpool::BufferChain(**budget) : bufpool::BufferChain(*s.pool);
  // kTakeBuffer: the message the loop owns, swapped with each completion's.
  bufpool::Buffer held;
  if constexpr (kHow == Handling::kTakeBuffer) {
    held = s.pool->TryAcquire();
    if (!held) return state.SkipWithError("no buffer to hold");
  }
  bool armed = false;
  uint64_t sum = 0;
  for (auto _ : state) {
    const auto t0 = Clock::now();
    if (!armed) {
      io_uring_sqe* sqe = io_uring_get_sqe(&s.ring);
      ring.PrepareRecv(sqe, s.fds[1]);
      io_uring_sqe_set_data64(sqe, 1);
      armed = true;
    }
    s.WriteBatch();
    io_uring_submit_and_wait(&s.ring, kBatch);
    const auto t1 = Clock::now();
    io_uring_cqe* cqe;
    unsigned head, n = 0;
    io_uring_for_each_cqe(&s.ring, head, cqe) {
      ++n;
      if (!(cqe->flags & IORING_CQE_F_MORE)) armed = false;
      if constexpr (kHow == Handling::kVisit) {
        if (!ring.Visit(*cqe, [&](absl::Span<const std::byte> bytes) {
              sum += static_cast<uint8_t>(bytes[0]);
            })) {
          if (ring.Take(*cqe, queue).ok()) queue.Clear();
        }
      } else if constexpr (kHow == Handling::kTakeBuffer) {
        if (ring.TakeBuffer(*cqe, held)) {
          sum += static_cast<uint8_t>(held.data()[0]);
        } else if (ring.Take(*cqe, queue).ok()) {
          queue.Clear();
        }
      } else if constexpr (kHow == Handling::kInto ||
                           kHow == Handling::kIntoPairs ||
                           kHow == Handling::kIntoBudget ||
                           kHow == Handling::kIntoPairsBudget) {
        // kIntoPairs: n counts this completion, consumed after the even ones.
        const bool consume = kHow == Handling::kInto ||
                             kHow == Handling::kIntoBudget || n % 2 == 0;
        if (ring.Take(*cqe, queue).ok() && consume && !queue.empty()) {
          sum += static_cast<uint8_t>(queue.slice(0).data()[0]);
          queue.Consume(queue.size());
        }
      } else {
        absl::StatusOr<bufpool::BufferChain> c = ring.Take(*cqe);
        if (c.ok() && !c->empty())
          sum += static_cast<uint8_t>(c->slice(0).data()[0]);
      }
    }
    io_uring_cq_advance(&s.ring, n);
    ring.Refill();
    const auto t2 = Clock::now();
    state.SetIterationTime(
        std::chrono::duration<double>(t2 - (handling_only ? t1 : t0)).count());
  }
  benchmark::DoNotOptimize(sum);
  state.SetItemsProcessed(state.iterations() * kBatch);
  queue.Clear();  // before the budget
}

void BM_Ring(benchmark::State& state) { RingLoop<Handling::kNewChain>(state); }
void BM_RingIntoBudget(benchmark::State& state) {
  RingLoop<Handling::kIntoBudget>(state);
}
void BM_RingIntoPairsBudget(benchmark::State& state) {
  RingLoop<Handling::kIntoPairsBudget>(state);
}
void BM_RingInto(benchmark::State& state) { RingLoop<Handling::kInto>(state); }
void BM_RingIntoPairs(benchmark::State& state) {
  RingLoop<Handling::kIntoPairs>(state);
}
void BM_RingVisit(benchmark::State& state) {
  RingLoop<Handling::kVisit>(state);
}
void BM_RingTakeBuffer(benchmark::State& state) {
  RingLoop<Handling::kTakeBuffer>(state);
}

// The same loop on raw liburing: a buffer ring whose ids are slot numbers,
// each completion's buffer re-added by hand, one advance per batch.
//
// Two floors for Take() into a queue, each the raw loop plus the least a
// queue that owns the bytes must do, and nothing of a chain's generality
// (no reference counts, no slice ring, no pool checks):
//   kCopy: the bytes are copied into one buffer the loop owns, and the
//       ring's buffer is re-added (what copy_below does);
//   kSwap: the filled buffer becomes the loop's and the one it held is
//       re-added under the completion's id (what TakeBuffer() does), so
//       ids name a table of buffers.
// And one for a queue that keeps no buffer once it is empty (memory
// follows bytes down to zero), so that a consumed message's buffer must
// go back to the pool and the ring needs a new one:
//   kLink: the filled buffer (a pool Buffer, ids naming a table of them)
//       is touched and released to the pool, and a buffer acquired from
//       the pool (TryAcquire(), one per message, no batching) is re-added
//       under the completion's id: one release and one acquire per
//       message, the least a zero-idle-memory Take() + Consume() + Refill()
//       of a linked buffer does, with nothing of a chain's (no slice, no
//       reference count, no ring-id bookkeeping).
enum class RawHow { kPlain, kCopy, kSwap, kLink };

template <RawHow kHow>
void RawLoop(benchmark::State& state) {
  const bool handling_only = state.range(0) != 0;
  Setup s(static_cast<size_t>(state.range(1)));
  if (!s.ok) return state.SkipWithError("setup failed");
  constexpr unsigned kEntries = 256;
  int err = 0;
  io_uring_buf_reg reg{};
  void* mem = nullptr;
  if (posix_memalign(&mem, 4096, kEntries * sizeof(io_uring_buf)) != 0)
    std::abort();
  auto* br = static_cast<io_uring_buf_ring*>(mem);
  io_uring_buf_ring_init(br);
  reg.ring_addr = reinterpret_cast<uintptr_t>(br);
  reg.ring_entries = kEntries;
  reg.bgid = kGroup;
  if ((err = io_uring_register_buf_ring(&s.ring, &reg, 0)) != 0) {
    return state.SkipWithError("register failed");
  }
  std::byte* base = s.pool->region().data();
  const unsigned bs = static_cast<unsigned>(s.pool->buffer_size());
  const int mask = io_uring_buf_ring_mask(kEntries);
  // kLink: the pool buffers lent under the ids (acquired, not slots named
  // by hand, so that they can go back to the pool).
  std::unique_ptr<bufpool::Buffer[]> held;
  if constexpr (kHow == RawHow::kLink) {
    held = std::make_unique<bufpool::Buffer[]>(kEntries);
  }
  for (unsigned i = 0; i < kEntries; ++i) {
    std::byte* data = base + size_t{i} * bs;
    if constexpr (kHow == RawHow::kLink) {
      held[i] = s.pool->TryAcquire();
      if (!held[i]) std::abort();
      data = held[i].data();
    }
    io_uring_buf_ring_add(br, data, bs, static_cast<uint16_t>(i), mask,
                          static_cast<int>(i));
  }
  io_uring_buf_ring_advance(br, kEntries);
  // kSwap: the buffer lent under each id; the loop's own buffer (kCopy's
  // target, kSwap's spare) is the slot after the ring's.
  std::byte* lent[kEntries];
  for (unsigned i = 0; i < kEntries; ++i) lent[i] = base + size_t{i} * bs;
  std::byte* own = base + size_t{kEntries} * bs;
  bool armed = false;
  uint64_t sum = 0;
  for (auto _ : state) {
    const auto t0 = Clock::now();
    if (!armed) {
      io_uring_sqe* sqe = io_uring_get_sqe(&s.ring);
      io_uring_prep_recv_multishot(sqe, s.fds[1], nullptr, 0, 0);
      sqe->flags |= IOSQE_BUFFER_SELECT;
      sqe->buf_group = kGroup;
      io_uring_sqe_set_data64(sqe, 1);
      armed = true;
    }
    s.WriteBatch();
    io_uring_submit_and_wait(&s.ring, kBatch);
    const auto t1 = Clock::now();
    io_uring_cqe* cqe;
    unsigned head, n = 0;
    int added = 0;
    io_uring_for_each_cqe(&s.ring, head, cqe) {
      ++n;
      if (!(cqe->flags & IORING_CQE_F_MORE)) armed = false;
      if (cqe->flags & IORING_CQE_F_BUFFER) {
        const uint16_t bid =
            static_cast<uint16_t>(cqe->flags >> IORING_CQE_BUFFER_SHIFT);
        if constexpr (kHow == RawHow::kPlain) {
          std::byte* data = base + size_t{bid} * bs;
          if (cqe->res > 0) sum += static_cast<uint8_t>(data[0]);
          io_uring_buf_ring_add(br, data, bs, bid, mask, added++);
        } else if constexpr (kHow == RawHow::kCopy) {
          std::byte* data = base + size_t{bid} * bs;
          io_uring_buf_ring_add(br, data, bs, bid, mask, added++);
          if (cqe->res > 0) {
            std::memcpy(own, data, static_cast<size_t>(cqe->res));
            sum += static_cast<uint8_t>(own[0]);
          }
        } else if constexpr (kHow == RawHow::kLink) {
          bufpool::Buffer& b = held[bid];
          if (cqe->res > 0) sum += static_cast<uint8_t>(b.data()[0]);
          b.Reset();  // consumed: back to the pool
          b = s.pool->TryAcquire();
          if (!b) std::abort();
          io_uring_buf_ring_add(br, b.data(), bs, bid, mask, added++);
        } else {
          std::byte* const filled = lent[bid];
          lent[bid] = own;
          io_uring_buf_ring_add(br, own, bs, bid, mask, added++);
          own = filled;
          if (cqe->res > 0) sum += static_cast<uint8_t>(own[0]);
        }
      }
    }
    io_uring_buf_ring_advance(br, added);
    io_uring_cq_advance(&s.ring, n);
    const auto t2 = Clock::now();
    if (handling_only) {
      state.SetIterationTime(std::chrono::duration<double>(t2 - t1).count());
    } else {
      state.SetIterationTime(std::chrono::duration<double>(t2 - t0).count());
    }
  }
  benchmark::DoNotOptimize(sum);
  io_uring_unregister_buf_ring(&s.ring, kGroup);
  held.reset();  // after the kernel lets go of them
  free(mem);
  state.SetItemsProcessed(state.iterations() * kBatch);
}

void BM_RawLiburing(benchmark::State& state) { RawLoop<RawHow::kPlain>(state); }
void BM_RawLiburingCopy(benchmark::State& state) {
  RawLoop<RawHow::kCopy>(state);
}
void BM_RawLiburingSwap(benchmark::State& state) {
  RawLoop<RawHow::kSwap>(state);
}
void BM_RawLiburingLink(benchmark::State& state) {
  RawLoop<RawHow::kLink>(state);
}

// HeldSend over TCP loopback: 64 KiB chains, plain send against SEND_ZC
// (held until the notification). A reader thread drains the peer.
void BM_HeldSend(benchmark::State& state) {
  const bool zero_copy = state.range(0) != 0;
  constexpr size_t kBytes = 64 * 1024;
  io_uring ring{};
  if (io_uring_queue_init(64, &ring, 0) != 0)
    return state.SkipWithError("ring");
  auto pool = bufpool::BufferPool::Create({.buffer_count = 256});
  const int lfd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  bind(lfd, reinterpret_cast<sockaddr*>(&sa), sizeof(sa));
  listen(lfd, 1);
  socklen_t len = sizeof(sa);
  getsockname(lfd, reinterpret_cast<sockaddr*>(&sa), &len);
  const int client = socket(AF_INET, SOCK_STREAM, 0);
  connect(client, reinterpret_cast<sockaddr*>(&sa), sizeof(sa));
  const int server = accept(lfd, nullptr, nullptr);
  close(lfd);
  std::thread reader([&] {
    static char sink[1 << 16];
    while (recv(client, sink, sizeof(sink), 0) > 0) {
    }
  });
  bufpool::BufferChain source(**pool);
  std::string bytes(kBytes, 'z');
  if (!source.Append(bytes).ok()) std::abort();
  bufpool::HeldSend send;
  for (auto _ : state) {
    bufpool::BufferChain chain = source.Clone();
    while (!chain.empty()) {
      send.Prepare(io_uring_get_sqe(&ring), server, std::move(chain),
                   {.zero_copy = zero_copy});
      io_uring_submit(&ring);
      while (!send.done()) {
        io_uring_cqe* cqe;
        io_uring_wait_cqe(&ring, &cqe);
        send.OnCompletion(*cqe);
        io_uring_cqe_seen(&ring, cqe);
      }
      chain = send.TakeUnsent();
    }
  }
  source.Clear();
  shutdown(server, SHUT_RDWR);
  reader.join();
  close(server);
  close(client);
  io_uring_queue_exit(&ring);
  state.SetBytesProcessed(state.iterations() * kBytes);
}

// Memory follows bytes: a 20 KB line trickled a byte at a time through the
// ring into one chain (a connection's input). pinned_per_byte: pool bytes
// the chain pins per byte it holds (1.0 is perfect; one buffer per
// completion would be about buffer_size).
void BM_TrickleLine(benchmark::State& state) {
  constexpr size_t kLine = 20 * 1024;
  const size_t copy_below = static_cast<size_t>(state.range(0));
  const auto incremental =
      state.range(1) != 0
          ? bufpool::ProvidedBufferRingOptions::Incremental::kOn
          : bufpool::ProvidedBufferRingOptions::Incremental::kOff;
  double pinned_per_byte = 0;
  for (auto _ : state) {
    io_uring ring{};
    if (io_uring_queue_init(64, &ring, 0) != 0) {
      return state.SkipWithError("ring");
    }
    auto pool = bufpool::BufferPool::Create({.buffer_count = 8192});
    int fds[2];
    socketpair(AF_UNIX, SOCK_STREAM, 0, fds);
    {
      auto bufs =
          bufpool::ProvidedBufferRing::Create(&ring, **pool,
                                              {.group_id = kGroup,
                                               .max_buffers = 64,
                                               .copy_below = copy_below,
                                               .incremental = incremental});
      if (!bufs.ok()) return state.SkipWithError("ring failed");
      bufpool::BufferChain queue(**pool);
      io_uring_sqe* sqe = io_uring_get_sqe(&ring);
      (*bufs)->PrepareRecv(sqe, fds[1], {.bundle = false});
      io_uring_sqe_set_data64(sqe, 1);
      io_uring_submit(&ring);
      bool armed = true;
      for (size_t k = 0; k < kLine; ++k) {
        if (write(fds[0], "x", 1) != 1) std::abort();
        io_uring_cqe* cqe;
        if (io_uring_wait_cqe(&ring, &cqe) != 0) std::abort();
        const bool more = (cqe->flags & IORING_CQE_F_MORE) != 0;
        if (!(*bufs)->Take(*cqe, queue).ok()) {
          // The pool ran dry: one buffer per completion, 8192 buffers.
          io_uring_cqe_seen(&ring, cqe);
          armed = more;
          state.counters["pool_dry_at_byte"] = static_cast<double>(k);
          break;
        }
        io_uring_cqe_seen(&ring, cqe);
        (*bufs)->Refill();
        armed = more;
        if (!more) {
          armed = true;
          sqe = io_uring_get_sqe(&ring);
          (*bufs)->PrepareRecv(sqe, fds[1], {.bundle = false});
          io_uring_sqe_set_data64(sqe, 1);
          io_uring_submit(&ring);
        }
      }
      pinned_per_byte = static_cast<double>(queue.pinned_bytes()) /
                        static_cast<double>(queue.size());
      queue.Clear();
      close(fds[0]);
      io_uring_cqe* cqe;
      while (armed && io_uring_wait_cqe(&ring, &cqe) == 0) {
        const bool more = (cqe->flags & IORING_CQE_F_MORE) != 0;
        bufpool::BufferChain dropped;
        (*bufs)->Take(*cqe, dropped).IgnoreError();
        io_uring_cqe_seen(&ring, cqe);
        if (!more) break;
      }
    }
    close(fds[1]);
    io_uring_queue_exit(&ring);
  }
  state.counters["pinned_per_byte"] = pinned_per_byte;
}

// Fixed iterations: manual time counts only part of each turn.
BENCHMARK(BM_Ring)
    ->ArgNames({"handling", "bytes"})
    ->ArgsProduct({{0, 1}, {256, 2048}})
    ->UseManualTime()
    ->Iterations(20000);
BENCHMARK(BM_RingInto)
    ->ArgNames({"handling", "bytes"})
    ->ArgsProduct({{0, 1}, {256, 2048}})
    ->UseManualTime()
    ->Iterations(20000);
BENCHMARK(BM_RingIntoPairs)
    ->ArgNames({"handling", "bytes"})
    ->ArgsProduct({{0, 1}, {256}})
    ->UseManualTime()
    ->Iterations(20000);
BENCHMARK(BM_RingIntoBudget)
    ->ArgNames({"handling", "bytes"})
    ->ArgsProduct({{0, 1}, {256, 2048}})
    ->UseManualTime()
    ->Iterations(20000);
BENCHMARK(BM_RingIntoPairsBudget)
    ->ArgNames({"handling", "bytes"})
    ->ArgsProduct({{0, 1}, {256}})
    ->UseManualTime()
    ->Iterations(20000);
BENCHMARK(BM_RingVisit)
    ->ArgNames({"handling", "bytes"})
    ->ArgsProduct({{0, 1}, {256, 2048}})
    ->UseManualTime()
    ->Iterations(20000);
BENCHMARK(BM_RingTakeBuffer)
    ->ArgNames({"handling", "bytes"})
    ->ArgsProduct({{0, 1}, {256, 2048}})
    ->UseManualTime()
    ->Iterations(20000);
BENCHMARK(BM_RawLiburing)
    ->ArgNames({"handling", "bytes"})
    ->ArgsProduct({{0, 1}, {256, 2048}})
    ->UseManualTime()
    ->Iterations(20000);
BENCHMARK(BM_RawLiburingCopy)
    ->ArgNames({"handling", "bytes"})
    ->ArgsProduct({{0, 1}, {256}})
    ->UseManualTime()
    ->Iterations(20000);
BENCHMARK(BM_RawLiburingSwap)
    ->ArgNames({"handling", "bytes"})
    ->ArgsProduct({{0, 1}, {256, 2048}})
    ->UseManualTime()
    ->Iterations(20000);
BENCHMARK(BM_RawLiburingLink)
    ->ArgNames({"handling", "bytes"})
    ->ArgsProduct({{0, 1}, {256, 2048}})
    ->UseManualTime()
    ->Iterations(20000);
BENCHMARK(BM_TrickleLine)
    ->ArgNames({"copy_below", "incremental"})
    ->ArgsProduct({{0, 512}, {0, 1}})
    ->Iterations(1)
    ->Unit(benchmark::kMillisecond);
BENCHMARK(BM_HeldSend)->ArgName("zero_copy")->Arg(0)->Arg(1);

}  // namespace

BENCHMARK_MAIN();

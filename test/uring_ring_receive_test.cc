// ProvidedBufferRing's receive options and completion paths: max_bytes caps
// a receive; incremental rings receive byte-exact and refuse message
// sockets; Visit() handles bytes in place; TakeBuffer() swaps buffers with
// the ring; ParkedReceives re-arms receives when the pool's notice comes.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/utsname.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <mutex>
#include <random>
#include <stdexcept>
#include <string>
#include <string_view>
#include <thread>
#include <tuple>
#include <vector>

#include "bufpool/uring.h"
#include "gtest/gtest.h"
#include "test_util.h"
#include "uring_ring_test_util.h"
#include "uring_test_util.h"

namespace bufpool {
namespace {

using testing_util::LoadOptions;
using testing_util::LoadResult;
using testing_util::MakePairs;
using testing_util::Pairs;
using testing_util::RandomBytes;
using testing_util::Ring;
using testing_util::RingRig;
using testing_util::RunLoad;
using testing_util::SendAndTake;
using testing_util::SocketPair;
using testing_util::SubmitAndTakeOne;
using testing_util::TakenCompletion;
using testing_util::UniqueFd;
using testing_util::WriteAll;

using Bundles = ProvidedBufferRingOptions::Bundles;
using Incremental = ProvidedBufferRingOptions::Incremental;

}  // namespace
}  // namespace bufpool

namespace bufpool {
namespace {

// RecvOptions::max_bytes caps what one receive delivers in all: a multishot
// receive ends (no IORING_CQE_F_MORE) after max_bytes (where the kernel has
// no cap it is made single-shot, which ends after at most that too), a
// single-shot one reads at most that; the rest stays in the socket.
class MaxBytesTest : public testing::TestWithParam<std::tuple<bool, Bundles>> {
};

TEST_P(MaxBytesTest, AReceiveDeliversAtMostMaxBytes) {
  const auto [multishot, bundles] = GetParam();
  RingRig rig;
  ASSERT_NO_FATAL_FAILURE(rig.OpenPool({.buffer_count = 256}));
  Pairs pairs;
  MakePairs(1, &pairs);
  ASSERT_NO_FATAL_FAILURE(rig.OpenRing(
      {.max_buffers = 64, .initial_buffers = 64, .bundles = bundles}));
  if (bundles == Bundles::kProbe && !(*rig.br)->bundles()) {
    GTEST_SKIP() << "no bundles in this kernel";
  }
  const std::string data(40000, 'q');
  ASSERT_TRUE(WriteAll(pairs.client[0], data.data(), data.size()));
  constexpr size_t kCap = 9000;  // two buffers and a part
  io_uring_sqe* sqe = rig.ring.Sqe();
  (*rig.br)->PrepareRecv(sqe, pairs.server[0],
                         {.multishot = multishot, .max_bytes = kCap});
  BufferChain got(**rig.pool);
  bool more = true;
  size_t completions = 0;
  while (more) {
    ASSERT_GE(io_uring_submit_and_wait(rig.ring.get(), 1), 0);
    io_uring_cqe* cqe;
    ASSERT_EQ(io_uring_peek_cqe(rig.ring.get(), &cqe), 0);
    more = (cqe->flags & IORING_CQE_F_MORE) != 0;
    ASSERT_GE(cqe->res, 0);
    absl::Status s = (*rig.br)->Take(*cqe, got);
    io_uring_cqe_seen(rig.ring.get(), cqe);
    ASSERT_TRUE(s.ok()) << s;
    ++completions;
    if (!multishot) {
      EXPECT_FALSE(more);
    }
  }
  const size_t bs = (*rig.pool)->buffer_size();
  const bool bundle = (*rig.br)->bundles();
  if (multishot && (*rig.br)->multishot_cap()) {
    // The kernel fills whole buffers but for a bundle's last.
    EXPECT_GE(got.size(), kCap) << completions << " completions";
    EXPECT_LE(got.size(), bundle ? kCap : (kCap + bs - 1) / bs * bs);
  } else {
    EXPECT_LE(got.size(), kCap);
    EXPECT_GT(got.size(), 0u);
  }
  // The rest is still in the socket.
  std::string rest(data.size(), '\0');
  size_t left = 0;
  while (left < data.size() - got.size()) {
    const ssize_t r = recv(pairs.server[0], rest.data() + left,
                           rest.size() - left, MSG_DONTWAIT);
    if (r <= 0) break;
    left += static_cast<size_t>(r);
  }
  EXPECT_EQ(left, data.size() - got.size());
  got.Clear();
}

INSTANTIATE_TEST_SUITE_P(Modes, MaxBytesTest,
                         testing::Combine(testing::Bool(),
                                          testing::Values(Bundles::kOff,
                                                          Bundles::kProbe)));

TEST(ProvidedBufferRingTest, MultishotCapIsProbedOnThisKernel) {
  RingRig rig;
  ASSERT_NO_FATAL_FAILURE(rig.OpenPool({.buffer_count = 16}));
  ASSERT_NO_FATAL_FAILURE(rig.OpenRing({}));
  utsname u{};
  ASSERT_EQ(uname(&u), 0);
  int major = 0, minor = 0;
  ASSERT_EQ(sscanf(u.release, "%d.%d", &major, &minor), 2);
  EXPECT_EQ((*rig.br)->multishot_cap(),
            major > 6 || (major == 6 && minor >= 17))
      << u.release;
}

}  // namespace
}  // namespace bufpool

namespace bufpool {
namespace {

// Incremental consumption forced off and on, bundles forced off and on:
// every byte arrives, in order, on every connection.
class IncrementalModesTest
    : public testing::TestWithParam<std::tuple<Incremental, Bundles>> {};

TEST_P(IncrementalModesTest, ReceivesAreByteExact) {
  const auto [incremental, bundles] = GetParam();
  LoadOptions o;
  o.connections = 8;
  o.bytes_per_connection = 256 * 1024;
  o.max_message = 3 * 4096;
  o.pool = {.buffer_count = 1024};
  o.ring = {.max_buffers = 256, .bundles = bundles, .incremental = incremental};
  o.hold_turns = 1;  // slices outlive their buffer's stay in the ring
  LoadResult r;
  RunLoad(o, &r);
  if (testing::Test::HasFatalFailure()) return;
  EXPECT_EQ(r.incremental, incremental == Incremental::kOn);
  EXPECT_EQ(r.bundles, bundles == Bundles::kOn);
  if (incremental == Incremental::kOn) {
    EXPECT_GT(r.inner_slices, 0u);
  }
  // The kernel takes bundles on an incremental ring too: some completion
  // spans several buffers (messages reach three).
  if (bundles == Bundles::kOn) {
    EXPECT_GT(r.most_slices, 1u);
  }
}

INSTANTIATE_TEST_SUITE_P(
    Modes, IncrementalModesTest,
    testing::Combine(testing::Values(Incremental::kOff, Incremental::kOn),
                     testing::Values(Bundles::kOff, Bundles::kOn)));

// Messages of up to 64 KiB (at least 60) through a pool of 64 KiB
// buffers, incrementally: a buffer serves the end of one message and the
// start of the next.
TEST(IncrementalTest, SixtyFourKibMessagesThroughSixtyFourKibBuffers) {
  for (Bundles bundles : {Bundles::kOff, Bundles::kProbe}) {
    LoadOptions o;
    o.connections = 4;
    o.bytes_per_connection = 4 << 20;
    o.min_message = 60 * 1024;
    o.max_message = 64 * 1024;
    o.pool = {.buffer_size = 64 * 1024, .buffer_count = 96};
    o.ring = {.max_buffers = 32,
              .initial_buffers = 32,
              .bundles = bundles,
              .incremental = Incremental::kOn};
    LoadResult r;
    RunLoad(o, &r);
    if (testing::Test::HasFatalFailure()) return;
    EXPECT_TRUE(r.incremental);
    EXPECT_GT(r.inner_slices, 0u) << "no buffer served two completions";
  }
}

// Visit(): a completion's bytes handled where the kernel wrote them, the
// buffer lent again under its id. Four buffers serve 40 messages, and the
// handler throws on 13 of them: a buffer not lent again on a throw would
// empty the ring after four (-ENOBUFS). What Visit() cannot handle in place
// (the end of stream, an incremental ring's completion) it leaves for
// Take().
TEST(VisitTest, BytesAreHandledInPlaceAndTheBufferLentAgain) {
  RingRig rig;
  ASSERT_NO_FATAL_FAILURE(rig.OpenPool({.buffer_count = 16}));
  Pairs pairs;
  MakePairs(1, &pairs);
  ASSERT_NO_FATAL_FAILURE(rig.OpenRing({.max_buffers = 4,
                                        .initial_buffers = 4,
                                        .bundles = Bundles::kOff,
                                        .incremental = Incremental::kOff}));
  (*rig.br)->PrepareRecv(rig.ring.Sqe(), pairs.server[0]);
  auto next = [&]() -> io_uring_cqe* {
    io_uring_cqe* cqe = nullptr;
    EXPECT_GE(io_uring_submit_and_wait(rig.ring.get(), 1), 0);
    EXPECT_EQ(io_uring_peek_cqe(rig.ring.get(), &cqe), 0);
    return cqe;
  };
  std::mt19937 rng(7);
  for (int i = 0; i < 40; ++i) {
    const std::string msg = RandomBytes(1 + rng() % 4096, rng);
    ASSERT_TRUE(WriteAll(pairs.client[0], msg.data(), msg.size()));
    std::string got;
    while (got.size() < msg.size()) {
      io_uring_cqe* cqe = next();
      ASSERT_NE(cqe, nullptr);
      ASSERT_GT(cqe->res, 0);
      bool visited = false;
      try {
        visited = (*rig.br)->Visit(*cqe, [&](absl::Span<const std::byte> b) {
          got.append(reinterpret_cast<const char*>(b.data()), b.size());
          if (i % 3 == 2) throw std::runtime_error("handler failed");
        });
      } catch (const std::runtime_error&) {
        visited = i % 3 == 2;
      }
      EXPECT_TRUE(visited);
      io_uring_cqe_seen(rig.ring.get(), cqe);
      (*rig.br)->Refill();
    }
    EXPECT_EQ(got, msg) << "message " << i;
    // The ring's four buffers only: none went to a chain or the pool.
    EXPECT_EQ((*rig.pool)->Stats().in_use, 4u);
    EXPECT_EQ((*rig.br)->available(), 4u);
  }
  shutdown(pairs.client[0], SHUT_WR);
  io_uring_cqe* eof = next();
  ASSERT_NE(eof, nullptr);
  ASSERT_EQ(eof->res, 0);
  EXPECT_FALSE((*rig.br)->Visit(*eof, [](absl::Span<const std::byte>) {
    ADD_FAILURE() << "called for the end of stream";
  }));
  BufferChain rest(**rig.pool);
  EXPECT_TRUE((*rig.br)->Take(*eof, rest).ok());
  EXPECT_TRUE(rest.empty());
  io_uring_cqe_seen(rig.ring.get(), eof);
  rig.ExpectEveryBufferBack();
}

// Datagrams, the case Visit() is for, on a ring without incremental mode
// (which would put a datagram into a buffer's rest and cut it short): 200
// of random lengths up to a buffer each arrive whole, through four buffers.
TEST(VisitTest, DatagramsArriveWholeThroughFourBuffers) {
  RingRig rig;
  ASSERT_NO_FATAL_FAILURE(rig.OpenPool({.buffer_count = 16}));
  UniqueFd fds[2];
  ASSERT_EQ(SocketPair(SOCK_DGRAM | SOCK_CLOEXEC, fds), 0);
  ASSERT_NO_FATAL_FAILURE(rig.OpenRing({.max_buffers = 4,
                                        .initial_buffers = 4,
                                        .incremental = Incremental::kOff}));
  (*rig.br)->PrepareRecv(rig.ring.Sqe(), fds[1].get());
  std::mt19937 rng(11);
  for (int i = 0; i < 200; ++i) {
    const std::string msg =
        RandomBytes(1 + rng() % (*rig.pool)->buffer_size(), rng);
    ASSERT_EQ(send(fds[0].get(), msg.data(), msg.size(), 0),
              static_cast<ssize_t>(msg.size()));
    ASSERT_GE(io_uring_submit_and_wait(rig.ring.get(), 1), 0);
    io_uring_cqe* cqe;
    ASSERT_EQ(io_uring_peek_cqe(rig.ring.get(), &cqe), 0);
    const bool more = (cqe->flags & IORING_CQE_F_MORE) != 0;
    std::string got;
    EXPECT_TRUE((*rig.br)->Visit(
        *cqe,
        [&](absl::Span<const std::byte> b) {
          got.assign(reinterpret_cast<const char*>(b.data()), b.size());
        }))
        << "datagram " << i << ", res " << cqe->res;
    io_uring_cqe_seen(rig.ring.get(), cqe);
    EXPECT_EQ(got, msg) << "datagram " << i;
    (*rig.br)->Refill();
    if (!more) (*rig.br)->PrepareRecv(rig.ring.Sqe(), fds[1].get());
  }
  EXPECT_EQ((*rig.pool)->Stats().in_use, 4u);
  fds[0].reset();
  fds[1].reset();
  rig.ExpectEveryBufferBack();
}

TEST(VisitTest, AnIncrementalRingsCompletionsGoToTake) {
  RingRig rig;
  ASSERT_NO_FATAL_FAILURE(rig.OpenPool({.buffer_count = 16}));
  ASSERT_NO_FATAL_FAILURE(rig.OpenRing({.max_buffers = 4,
                                        .initial_buffers = 4,
                                        .incremental = Incremental::kProbe}));
  if (!(*rig.br)->incremental()) GTEST_SKIP() << "no incremental rings here";
  Pairs pairs;
  MakePairs(1, &pairs);
  (*rig.br)->PrepareRecv(rig.ring.Sqe(), pairs.server[0]);
  ASSERT_TRUE(WriteAll(pairs.client[0], "abc", 3));
  ASSERT_GE(io_uring_submit_and_wait(rig.ring.get(), 1), 0);
  io_uring_cqe* cqe;
  ASSERT_EQ(io_uring_peek_cqe(rig.ring.get(), &cqe), 0);
  ASSERT_EQ(cqe->res, 3);
  EXPECT_FALSE((*rig.br)->Visit(*cqe, [](absl::Span<const std::byte>) {
    ADD_FAILURE() << "called on an incremental ring";
  }));
  BufferChain got(**rig.pool);
  ASSERT_TRUE((*rig.br)->Take(*cqe, got).ok());
  io_uring_cqe_seen(rig.ring.get(), cqe);
  EXPECT_EQ(testing_util::Contents(got), "abc");
  got.Clear();
  shutdown(pairs.client[0], SHUT_WR);
  rig.br->reset();
  rig.ring.DropCompletions();
}

// Waits up to 5 s for one completion of `ring` (submitting first);
// nullptr when none came.
io_uring_cqe* NextCompletion(Ring& ring) {
  io_uring_cqe* cqe = nullptr;
  __kernel_timespec ts{.tv_sec = 5, .tv_nsec = 0};
  if (io_uring_submit_and_wait_timeout(ring.get(), &cqe, 1, &ts, nullptr) < 0)
    return nullptr;
  return cqe;
}

std::string BufferBytes(const Buffer& b, int n) {
  return std::string(reinterpret_cast<const char*>(b.data()),
                     static_cast<size_t>(n));
}

// A non-incremental ring of `n` buffers of a 16-buffer pool, its receive
// armed on the server end (fds[1].get()) of a datagram socketpair; TearDown()
// closes the pair, destroys the ring and checks that every buffer is back.
class TakeBufferTest : public testing::Test {
 protected:
  void Open(uint32_t n) {
    ASSERT_TRUE(ring.ok());
    pool = BufferPool::Create({.buffer_count = 16});
    ASSERT_TRUE(pool.ok()) << pool.status();
    ASSERT_EQ(SocketPair(SOCK_DGRAM | SOCK_CLOEXEC, fds), 0);
    br = ProvidedBufferRing::Create(ring.get(), **pool,
                                    {.max_buffers = n,
                                     .initial_buffers = n,
                                     .incremental = Incremental::kOff});
    ASSERT_TRUE(br.ok()) << br.status();
    (*br)->PrepareRecv(ring.Sqe(), fds[1].get());
  }
  // Sends one datagram to the ring's end of the pair.
  bool Send(std::string_view msg) {
    return send(fds[0].get(), msg.data(), msg.size(), 0) ==
           static_cast<ssize_t>(msg.size());
  }
  void TearDown() override {
    if (!fds[0].valid())
      return;  // Open() not called, or failed before the pair
    fds[0].reset();
    fds[1].reset();
    if (br.ok()) br->reset();
    ring.DropCompletions();
    EXPECT_EQ((*pool)->Stats().in_use, 0u);
  }

  Ring ring;
  absl::StatusOr<std::unique_ptr<BufferPool>> pool =
      absl::FailedPreconditionError("Open() not called");
  UniqueFd fds[2];
  absl::StatusOr<std::unique_ptr<ProvidedBufferRing>> br =
      absl::FailedPreconditionError("Open() not called");
};

// A ring of one buffer, so every receive lands in the buffer TakeBuffer()
// put there: the caller's buffer and the filled one trade places, the
// ring's one id is lent again at once, and nothing goes through the pool.
TEST_F(TakeBufferTest, TheCallersBufferTakesTheFilledOnesPlaceInTheRing) {
  ASSERT_NO_FATAL_FAILURE(Open(1));
  Buffer held = (*pool)->TryAcquire();
  ASSERT_TRUE(held);
  uint32_t given = held.slot();  // lent by the last TakeBuffer()
  std::mt19937 rng(5);
  for (int i = 0; i < 100; ++i) {
    const std::string msg =
        RandomBytes(1 + rng() % (*pool)->buffer_size(), rng);
    ASSERT_EQ(send(fds[0].get(), msg.data(), msg.size(), 0),
              static_cast<ssize_t>(msg.size()));
    io_uring_cqe* cqe = NextCompletion(ring);
    ASSERT_NE(cqe, nullptr);
    const bool more = (cqe->flags & IORING_CQE_F_MORE) != 0;
    const int res = cqe->res;
    const uint32_t before = held.slot();
    ASSERT_TRUE((*br)->TakeBuffer(*cqe, held)) << "datagram " << i;
    io_uring_cqe_seen(ring.get(), cqe);
    ASSERT_TRUE(held);
    EXPECT_EQ(held.pool(), pool->get());
    EXPECT_EQ(BufferBytes(held, res), msg) << "datagram " << i;
    // The one ring buffer is the one the previous call gave it.
    if (i > 0) {
      EXPECT_EQ(held.slot(), given) << "datagram " << i;
    }
    EXPECT_NE(held.slot(), before);
    given = before;
    // The caller owns the buffer: overwriting it reaches no one else.
    std::memset(held.data(), 0, held.size());
    EXPECT_EQ((*pool)->Stats().in_use, 2u);  // one lent, one held
    EXPECT_EQ((*br)->available(), 1u);
    (*br)->Refill();
    if (!more) (*br)->PrepareRecv(ring.Sqe(), fds[1].get());
  }
  EXPECT_EQ((*br)->copied(), 0u);
  held.Reset();
}

// A Buffer handle keeps no reference count: here a buffer no SharedBuffer
// ever held (count never stored) goes into the ring by TakeBuffer(), is
// filled and linked into a chain, which must count it exactly once.
TEST_F(TakeBufferTest, ABufferTakenIntoTheRingIsCountedWhenAChainGetsIt) {
  ASSERT_NO_FATAL_FAILURE(Open(1));
  BufferChain queue(**pool);
  Buffer fresh = (*pool)->TryAcquire();
  ASSERT_TRUE(fresh);
  const std::byte* fresh_data = fresh.data();
  // Each datagram is sent once the ring has its buffer again.
  ASSERT_TRUE(Send("first"));
  // A receive that empties the ring ends (no IORING_CQE_F_MORE): re-arm.
  auto rearm_after = [&](const io_uring_cqe* c) {
    if (!(c->flags & IORING_CQE_F_MORE))
      (*br)->PrepareRecv(ring.Sqe(), fds[1].get());
  };
  io_uring_cqe* cqe = NextCompletion(ring);
  ASSERT_NE(cqe, nullptr);
  ASSERT_TRUE((*br)->TakeBuffer(*cqe, fresh));  // `fresh` is now the ring's
  rearm_after(cqe);
  io_uring_cqe_seen(ring.get(), cqe);
  EXPECT_EQ(BufferBytes(fresh, 5), "first");
  (*br)->Refill();
  // Past copy_below: linked, not copied.
  const std::string second(pool->get()->buffer_size() / 2, 's');
  ASSERT_TRUE(Send(second));
  cqe = NextCompletion(ring);
  ASSERT_NE(cqe, nullptr);
  ASSERT_TRUE((*br)->Take(*cqe, queue).ok());
  rearm_after(cqe);
  io_uring_cqe_seen(ring.get(), cqe);
  ASSERT_EQ(queue.slice_count(), 1u);
  EXPECT_EQ(queue.slice(0).data(), fresh_data);
  EXPECT_EQ(testing_util::Contents(queue), second);
  EXPECT_EQ(queue.slice(0).use_count(), 1u);
  {
    BufferChain copy = queue.Clone();
    EXPECT_EQ(queue.slice(0).use_count(), 2u);
  }
  EXPECT_EQ(queue.slice(0).use_count(), 1u);
  // Consumed, the buffer goes back to the pool: the chain pins nothing.
  const size_t in_use = (*pool)->Stats().in_use;
  queue.Consume(queue.size());
  EXPECT_EQ((*pool)->Stats().in_use, in_use - 1);
  (*br)->Refill();
  ASSERT_TRUE(Send("third"));
  cqe = NextCompletion(ring);
  ASSERT_NE(cqe, nullptr);
  ASSERT_TRUE((*br)->Take(*cqe, queue).ok());
  io_uring_cqe_seen(ring.get(), cqe);
  EXPECT_EQ(testing_util::Contents(queue), "third");
  queue.Clear();
  fresh.Reset();
}

// An empty handle takes the ring's own buffer, which leaves the ring until
// Refill() lends a fresh one; a ring emptied so ends its receive with
// -ENOBUFS, which TakeBuffer() leaves to Take().
TEST_F(TakeBufferTest, AnEmptyHandleTakesTheRingsBuffer) {
  ASSERT_NO_FATAL_FAILURE(Open(2));
  std::vector<Buffer> kept;
  bool ended = false;
  for (const char* msg : {"one", "two"}) {
    if (ended) (*br)->PrepareRecv(ring.Sqe(), fds[1].get());
    ASSERT_TRUE(Send(msg));
    io_uring_cqe* cqe = NextCompletion(ring);
    ASSERT_NE(cqe, nullptr);
    Buffer b;
    ASSERT_TRUE((*br)->TakeBuffer(*cqe, b));
    const int res = cqe->res;
    ended = !(cqe->flags & IORING_CQE_F_MORE);
    io_uring_cqe_seen(ring.get(), cqe);
    ASSERT_TRUE(b);
    EXPECT_EQ(BufferBytes(b, res), msg);
    kept.push_back(std::move(b));
  }
  EXPECT_EQ((*br)->available(), 0u);
  EXPECT_EQ((*pool)->Stats().in_use, 2u);  // both with the caller
  // The third datagram finds no buffer.
  if (ended) (*br)->PrepareRecv(ring.Sqe(), fds[1].get());
  ASSERT_TRUE(Send("three"));
  io_uring_cqe* cqe = NextCompletion(ring);
  ASSERT_NE(cqe, nullptr);
  ASSERT_EQ(cqe->res, -ENOBUFS);
  Buffer none;
  EXPECT_FALSE((*br)->TakeBuffer(*cqe, none));
  EXPECT_FALSE(none);
  EXPECT_EQ((*br)->Take(*cqe).status().code(),
            absl::StatusCode::kResourceExhausted);
  io_uring_cqe_seen(ring.get(), cqe);
  EXPECT_EQ((*br)->Refill(), 2u);
  EXPECT_EQ((*pool)->Stats().in_use, 4u);
  (*br)->PrepareRecv(ring.Sqe(), fds[1].get());  // "three" is still queued
  cqe = NextCompletion(ring);
  ASSERT_NE(cqe, nullptr);
  ASSERT_TRUE((*br)->TakeBuffer(*cqe, kept[0]));  // swaps: no pool trip
  EXPECT_EQ(BufferBytes(kept[0], cqe->res), "three");
  io_uring_cqe_seen(ring.get(), cqe);
  EXPECT_EQ((*pool)->Stats().in_use, 4u);
  kept.clear();
}

// What TakeBuffer() cannot take as one buffer goes to Take(), with nothing
// changed: a buffer of another pool, the end of a stream, a bundle, and any
// completion of an incremental ring.
// Not Open(): stream sockets, a ring with bundles, a pool of 64.
TEST_F(TakeBufferTest, WhatItCannotTakeIsLeftToTakeUnchanged) {
  ASSERT_TRUE(ring.ok());
  pool = BufferPool::Create({.buffer_count = 64});
  auto other = BufferPool::Create({.buffer_count = 4});
  ASSERT_TRUE(pool.ok());
  ASSERT_TRUE(other.ok());
  const size_t bs = (*pool)->buffer_size();
  Pairs pairs;
  MakePairs(1, &pairs);
  br = ProvidedBufferRing::Create(ring.get(), **pool,
                                  {.max_buffers = 16,
                                   .initial_buffers = 16,
                                   .bundles = Bundles::kOn,
                                   .incremental = Incremental::kOff});
  ASSERT_TRUE(br.ok()) << br.status();
  // One-shot receives, each armed after its bytes are written, so what one
  // completion carries does not depend on timing.
  ProvidedBufferRing::RecvOptions once;
  once.multishot = false;
  auto arm = [&] { (*br)->PrepareRecv(ring.Sqe(), pairs.server[0], once); };
  auto take_rest = [&](io_uring_cqe* cqe) {
    absl::StatusOr<BufferChain> got = (*br)->Take(*cqe);
    io_uring_cqe_seen(ring.get(), cqe);
    EXPECT_TRUE(got.ok()) << got.status();
    return got.ok() ? testing_util::Contents(*got) : std::string();
  };

  // Another pool's buffer.
  Buffer foreign = (*other)->TryAcquire();
  ASSERT_TRUE(foreign);
  const uint32_t foreign_slot = foreign.slot();
  ASSERT_TRUE(WriteAll(pairs.client[0], "hello", 5));
  arm();
  io_uring_cqe* cqe = NextCompletion(ring);
  ASSERT_NE(cqe, nullptr);
  const size_t in_use = (*pool)->Stats().in_use;
  EXPECT_FALSE((*br)->TakeBuffer(*cqe, foreign));
  EXPECT_EQ(foreign.pool(), other->get());
  EXPECT_EQ(foreign.slot(), foreign_slot);
  EXPECT_EQ((*br)->available(), 16u);
  EXPECT_EQ((*pool)->Stats().in_use, in_use);
  EXPECT_EQ(take_rest(cqe), "hello");
  (*br)->Refill();

  // A bundle: three buffers' worth at once.
  const std::string big = RandomBytes(3 * bs, uint64_t{3});
  ASSERT_TRUE(WriteAll(pairs.client[0], big.data(), big.size()));
  usleep(20000);
  std::string got;
  Buffer mine = (*pool)->TryAcquire();
  ASSERT_TRUE(mine);
  bool saw_bundle = false;
  while (got.size() < big.size()) {
    arm();
    cqe = NextCompletion(ring);
    ASSERT_NE(cqe, nullptr);
    ASSERT_GT(cqe->res, 0);
    if (static_cast<size_t>(cqe->res) > bs) {
      saw_bundle = true;
      const uint32_t before = mine.slot();
      EXPECT_FALSE((*br)->TakeBuffer(*cqe, mine));
      EXPECT_EQ(mine.pool(), pool->get());
      EXPECT_EQ(mine.slot(), before);
      got += take_rest(cqe);
    } else {
      const int res = cqe->res;
      ASSERT_TRUE((*br)->TakeBuffer(*cqe, mine));
      io_uring_cqe_seen(ring.get(), cqe);
      got += BufferBytes(mine, res);
    }
    (*br)->Refill();
  }
  EXPECT_EQ(got, big);
  if ((*br)->bundles()) {
    EXPECT_TRUE(saw_bundle);
  }
  mine.Reset();

  // The end of the stream.
  shutdown(pairs.client[0], SHUT_WR);
  arm();
  cqe = NextCompletion(ring);
  ASSERT_NE(cqe, nullptr);
  ASSERT_EQ(cqe->res, 0);
  Buffer none;
  EXPECT_FALSE((*br)->TakeBuffer(*cqe, none));
  EXPECT_FALSE(none);
  EXPECT_EQ(take_rest(cqe), "");
  br->reset();
  ring.DropCompletions();
  EXPECT_EQ((*pool)->Stats().in_use, 0u);

  // An incremental ring's completions.
  auto inc = ProvidedBufferRing::Create(ring.get(), **pool,
                                        {.group_id = 2,
                                         .max_buffers = 4,
                                         .initial_buffers = 4,
                                         .incremental = Incremental::kProbe});
  ASSERT_TRUE(inc.ok()) << inc.status();
  if (!(*inc)->incremental()) GTEST_SKIP() << "no incremental rings here";
  Pairs more;
  MakePairs(1, &more);
  (*inc)->PrepareRecv(ring.Sqe(), more.server[0]);
  ASSERT_TRUE(WriteAll(more.client[0], "abc", 3));
  cqe = NextCompletion(ring);
  ASSERT_NE(cqe, nullptr);
  ASSERT_EQ(cqe->res, 3);
  EXPECT_FALSE((*inc)->TakeBuffer(*cqe, none));
  EXPECT_FALSE(none);
  BufferChain rest(**pool);
  ASSERT_TRUE((*inc)->Take(*cqe, rest).ok());
  io_uring_cqe_seen(ring.get(), cqe);
  EXPECT_EQ(testing_util::Contents(rest), "abc");
  rest.Clear();
  shutdown(more.client[0], SHUT_WR);
  inc->reset();
  ring.DropCompletions();
}

// An incremental ring would cut a datagram short at the end of the current
// buffer, silently: PrepareRecv() makes no receive from a message socket,
// Take() says why, and the datagrams stay in the socket, whole, for a ring
// without incremental mode. Stream sockets are received as before.
TEST(IncrementalTest, MessageSocketsAreRefusedNotTruncated) {
  RingRig rig;
  ASSERT_NO_FATAL_FAILURE(rig.OpenPool({.buffer_count = 16}));
  auto inc = ProvidedBufferRing::Create(rig.ring.get(), **rig.pool,
                                        {.group_id = 1,
                                         .max_buffers = 4,
                                         .initial_buffers = 4,
                                         .incremental = Incremental::kOn});
  if (!inc.ok()) GTEST_SKIP() << "no incremental rings: " << inc.status();
  auto plain = ProvidedBufferRing::Create(rig.ring.get(), **rig.pool,
                                          {.group_id = 2,
                                           .max_buffers = 4,
                                           .initial_buffers = 4,
                                           .incremental = Incremental::kOff});
  ASSERT_TRUE(plain.ok()) << plain.status();
  const size_t bs = (*rig.pool)->buffer_size();
  for (int type : {SOCK_SEQPACKET, SOCK_DGRAM}) {
    SCOPED_TRACE(type == SOCK_DGRAM ? "SOCK_DGRAM" : "SOCK_SEQPACKET");
    UniqueFd fds[2];
    ASSERT_EQ(SocketPair(type | SOCK_CLOEXEC, fds), 0);
    // Two datagrams that together overrun one buffer.
    const std::string first(bs / 2 + 100, 'a'), second(bs / 2 + 100, 'b');
    for (const std::string* m : {&first, &second}) {
      ASSERT_EQ(send(fds[0].get(), m->data(), m->size(), 0),
                static_cast<ssize_t>(m->size()));
    }
    const absl::Status checked = (*inc)->CheckSocket(fds[1].get());
    EXPECT_EQ(checked.code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_NE(checked.message().find("kOff"), absl::string_view::npos)
        << checked;
    EXPECT_TRUE((*plain)->CheckSocket(fds[1].get()).ok());
    (*inc)->PrepareRecv(rig.ring.Sqe(), fds[1].get());
    BufferChain out(**rig.pool);
    TakenCompletion t;
    ASSERT_NO_FATAL_FAILURE(SubmitAndTakeOne(rig.ring, **inc, out, &t));
    ASSERT_EQ(t.res, -EPROTOTYPE);
    ASSERT_EQ(t.flags & (IORING_CQE_F_BUFFER | IORING_CQE_F_MORE), 0u);
    EXPECT_EQ(t.status.code(), absl::StatusCode::kFailedPrecondition)
        << t.status;
    EXPECT_NE(t.status.message().find("not made: not a stream socket"),
              absl::string_view::npos)
        << t.status;
    EXPECT_TRUE(out.empty());
    EXPECT_EQ((*inc)->available(), 4u);  // no buffer used
    // Receive flags added to the refused receive: the kernel rejects the
    // NOP, and Take() says where to look.
    io_uring_sqe* sqe = rig.ring.Sqe();
    (*inc)->PrepareRecv(sqe, fds[1].get());
    sqe->ioprio |= IORING_RECVSEND_POLL_FIRST;
    ASSERT_NO_FATAL_FAILURE(SubmitAndTakeOne(rig.ring, **inc, out, &t));
    ASSERT_LT(t.res, 0);
    EXPECT_FALSE(t.status.ok());
    EXPECT_NE(t.status.message().find("CheckSocket"), absl::string_view::npos)
        << t.status;
    EXPECT_TRUE(out.empty());
    // Both datagrams are still there, whole, for the plain ring.
    for (const std::string* m : {&first, &second}) {
      (*plain)->PrepareRecv(rig.ring.Sqe(), fds[1].get(), {.multishot = false});
      ASSERT_NO_FATAL_FAILURE(SubmitAndTakeOne(rig.ring, **plain, out, &t));
      ASSERT_EQ(t.res, static_cast<int>(m->size()));
      ASSERT_TRUE(t.status.ok()) << t.status;
      EXPECT_EQ(testing_util::Contents(out), *m);
      out.Clear();
      (*plain)->Refill();
    }
  }
  // A stream socket on the incremental ring is received as before.
  UniqueFd s[2];
  ASSERT_EQ(SocketPair(SOCK_STREAM | SOCK_CLOEXEC, s), 0);
  EXPECT_TRUE((*inc)->CheckSocket(s[1].get()).ok());
  ASSERT_EQ(send(s[0].get(), "stream", 6, 0), 6);
  (*inc)->PrepareRecv(rig.ring.Sqe(), s[1].get(), {.multishot = false});
  BufferChain out(**rig.pool);
  TakenCompletion t;
  ASSERT_NO_FATAL_FAILURE(SubmitAndTakeOne(rig.ring, **inc, out, &t));
  EXPECT_EQ(t.res, 6);
  ASSERT_TRUE(t.status.ok()) << t.status;
  EXPECT_EQ(testing_util::Contents(out), "stream");
  out.Clear();
  s[0].reset();
  s[1].reset();
  inc->reset();
  plain->reset();
  rig.ring.DropCompletions();
  EXPECT_EQ((*rig.pool)->Stats().in_use, 0u);
}

// RecvOptions::socket_checked with a registered file: `fd` indexes the
// ring's registered files, so PrepareRecv() must not ask the process
// descriptor of that number its type. Here that number is a datagram socket's
// in the process, while the registered file at the index is a stream socket:
// received.
TEST(IncrementalTest, FixedFileReceivesSkipTheProcessDescriptorsType) {
  RingRig rig;
  ASSERT_NO_FATAL_FAILURE(rig.OpenPool({.buffer_count = 16}));
  auto inc = ProvidedBufferRing::Create(rig.ring.get(), **rig.pool,
                                        {.max_buffers = 4,
                                         .initial_buffers = 4,
                                         .incremental = Incremental::kOn});
  if (!inc.ok()) GTEST_SKIP() << "no incremental rings: " << inc.status();
  UniqueFd dgram[2], stream[2];
  ASSERT_EQ(SocketPair(SOCK_DGRAM | SOCK_CLOEXEC, dgram), 0);
  ASSERT_EQ(SocketPair(SOCK_STREAM | SOCK_CLOEXEC, stream), 0);
  const int index = dgram[1].get();
  std::vector<int> files(static_cast<size_t>(index) + 1, -1);
  files[static_cast<size_t>(index)] = stream[1].get();
  ASSERT_EQ(io_uring_register_files(rig.ring.get(), files.data(),
                                    static_cast<unsigned>(files.size())),
            0);
  ASSERT_EQ(send(stream[0].get(), "fixed", 5, 0), 5);
  ASSERT_TRUE((*inc)->CheckSocket(stream[1].get()).ok());
  io_uring_sqe* sqe = rig.ring.Sqe();
  (*inc)->PrepareRecv(sqe, index, {.multishot = false, .socket_checked = true});
  sqe->flags |= IOSQE_FIXED_FILE;
  BufferChain out(**rig.pool);
  TakenCompletion t;
  ASSERT_NO_FATAL_FAILURE(SubmitAndTakeOne(rig.ring, **inc, out, &t));
  ASSERT_EQ(t.res, 5);
  ASSERT_TRUE(t.status.ok()) << t.status;
  EXPECT_EQ(testing_util::Contents(out), "fixed");
  out.Clear();
  io_uring_unregister_files(rig.ring.get());
  for (UniqueFd* fd : {&dgram[0], &dgram[1], &stream[0], &stream[1]}) {
    fd->reset();
  }
  inc->reset();
  rig.ring.DropCompletions();
  EXPECT_EQ((*rig.pool)->Stats().in_use, 0u);
}

TEST(IncrementalTest, ProbeMatchesTheKernel) {
  RingRig rig;
  ASSERT_NO_FATAL_FAILURE(rig.OpenPool({.buffer_count = 256}));
  ASSERT_NO_FATAL_FAILURE(rig.OpenRing({.max_buffers = 64}));
  utsname u{};
  ASSERT_EQ(uname(&u), 0);
  int major = 0, minor = 0;
  ASSERT_EQ(sscanf(u.release, "%d.%d", &major, &minor), 2);
  EXPECT_EQ((*rig.br)->incremental(), major > 6 || (major == 6 && minor >= 12))
      << u.release;
  auto off = ProvidedBufferRing::Create(
      rig.ring.get(), **rig.pool,
      {.group_id = 1, .max_buffers = 64, .incremental = Incremental::kOff});
  ASSERT_TRUE(off.ok()) << off.status();
  EXPECT_FALSE((*off)->incremental());
}

}  // namespace
}  // namespace bufpool

namespace bufpool {
namespace {

// A receive that ran out of ring buffers is parked; while the pool is dry
// Rearm() leaves it parked and reads the pool's notice in the ring, which
// completes when a buffer is freed; after the notice and a Refill(), the
// next Rearm() re-arms it. Remove() takes a closing connection off.
TEST_F(TakeBufferTest, ParkedReceivesWaitForThePoolsNoticeAndRearm) {
  ASSERT_NO_FATAL_FAILURE(Open(2));
  std::vector<Buffer> hog;  // everything the ring does not hold
  while (Buffer b = (*pool)->TryAcquire()) hog.push_back(std::move(b));
  auto parked = ParkedReceives::Create(**br);
  ASSERT_TRUE(parked.ok()) << parked.status();
  std::vector<Buffer> kept;
  bool armed = true;
  for (const char* msg : {"one", "two"}) {
    if (!armed) (*br)->PrepareRecv(ring.Sqe(), fds[1].get());
    ASSERT_TRUE(Send(msg));
    io_uring_cqe* cqe = NextCompletion(ring);
    ASSERT_NE(cqe, nullptr);
    Buffer b;
    ASSERT_TRUE((*br)->TakeBuffer(*cqe, b));  // the ring's buffer leaves
    armed = cqe->flags & IORING_CQE_F_MORE;
    io_uring_cqe_seen(ring.get(), cqe);
    kept.push_back(std::move(b));
  }
  if (!armed) (*br)->PrepareRecv(ring.Sqe(), fds[1].get());
  ASSERT_TRUE(Send("three"));
  io_uring_cqe* cqe = NextCompletion(ring);
  ASSERT_NE(cqe, nullptr);
  ASSERT_EQ(cqe->res, -ENOBUFS);
  ASSERT_FALSE(cqe->flags & IORING_CQE_F_MORE);
  io_uring_cqe_seen(ring.get(), cqe);
  int conn = 0;
  (*parked)->Park(&conn);
  constexpr uint64_t kNotice = 99;
  int rearmed = 0;
  auto rearm = [&](void* who) {
    EXPECT_EQ(who, &conn);
    ++rearmed;
    (*br)->PrepareRecv(ring.Sqe(), fds[1].get());
  };
  // The pool is dry: nothing to lend, nothing re-armed, the notice asked.
  EXPECT_EQ((*br)->Refill(), 0u);
  EXPECT_EQ((*parked)->Rearm(ring.get(), kNotice, rearm), 0u);
  EXPECT_EQ(rearmed, 0);
  EXPECT_TRUE((*parked)->notice_pending());
  EXPECT_EQ((*parked)->size(), 1u);
  io_uring_submit(ring.get());
  EXPECT_NE(io_uring_peek_cqe(ring.get(), &cqe), 0);  // the read waits
  EXPECT_EQ((*parked)->Rearm(ring.get(), kNotice, rearm), 0u);  // asks once
  hog.pop_back();  // a buffer is free: the pool writes the eventfd
  cqe = NextCompletion(ring);
  ASSERT_NE(cqe, nullptr);
  EXPECT_EQ(cqe->user_data, kNotice);
  io_uring_cqe_seen(ring.get(), cqe);
  (*parked)->OnNotice();
  EXPECT_FALSE((*parked)->notice_pending());
  EXPECT_EQ((*parked)->notices(), 1u);
  EXPECT_EQ((*br)->Refill(), 1u);
  EXPECT_EQ((*parked)->Rearm(ring.get(), kNotice, rearm), 1u);
  EXPECT_EQ(rearmed, 1);
  EXPECT_TRUE((*parked)->empty());
  EXPECT_FALSE((*parked)->notice_pending());  // nothing parked: not asked
  cqe = NextCompletion(ring);  // the re-armed receive gets "three"
  ASSERT_NE(cqe, nullptr);
  absl::StatusOr<BufferChain> got = (*br)->Take(*cqe);
  io_uring_cqe_seen(ring.get(), cqe);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(testing_util::Contents(*got), "three");
  // Remove() and RearmAll().
  int a = 0, b = 0;
  (*parked)->Park(&a);
  (*parked)->Park(&b);
  EXPECT_TRUE((*parked)->Remove(&a));
  EXPECT_FALSE((*parked)->Remove(&a));
  std::vector<void*> order;
  EXPECT_EQ((*parked)->RearmAll([&](void* who) { order.push_back(who); }), 1u);
  EXPECT_EQ(order, std::vector<void*>{&b});
  EXPECT_TRUE((*parked)->empty());
  got->Clear();
  kept.clear();
  hog.clear();
}

}  // namespace
}  // namespace bufpool

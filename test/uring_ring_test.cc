// ProvidedBufferRing against the real io_uring: multishot receives over TCP
// loopback, byte-exact, with many connections, a pool smaller than the load,
// chains released on another thread, bundles forced on and off, pools of
// more than 65,536 buffers, and teardown with buffers lent and taken.
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
using testing_util::WriteAll;

using Bundles = ProvidedBufferRingOptions::Bundles;
using Incremental = ProvidedBufferRingOptions::Incremental;

class ConnectionsTest : public testing::TestWithParam<size_t> {};

TEST_P(ConnectionsTest, MultishotReceivesAreByteExact) {
  LoadOptions o;
  o.connections = GetParam();
  o.bytes_per_connection = GetParam() >= 512 ? 16 * 1024 : 96 * 1024;
  o.pool = {.buffer_count = 2048};
  o.ring = {.group_id = 3, .max_buffers = 1024};
  LoadResult r;
  RunLoad(o, &r);
}

INSTANTIATE_TEST_SUITE_P(Connections, ConnectionsTest,
                         testing::Values(size_t{1}, size_t{64}, size_t{512}));

TEST(ProvidedBufferRingTest, EveryConnectionSurvivesAPoolSmallerThanTheLoad) {
  LoadOptions o;
  o.connections = 64;
  o.bytes_per_connection = 64 * 1024;
  o.pool = {.buffer_count = 48, .cache_size = 0};
  o.ring = {.max_buffers = 32, .initial_buffers = 8};
  o.hold_turns = 2;
  LoadResult r;
  RunLoad(o, &r);
  EXPECT_GT(r.enobufs, 0u) << "the load never ran the ring dry";
}

TEST(ProvidedBufferRingTest, ChainsReleasedOnAnotherThreadAreLentAgain) {
  LoadOptions o;
  o.connections = 16;
  o.bytes_per_connection = 256 * 1024;
  // Fewer buffers than the bytes: they must come back to be lent again.
  o.pool = {.buffer_count = 256};
  o.ring = {.max_buffers = 128};
  o.release_elsewhere = true;
  LoadResult r;
  RunLoad(o, &r);
}

TEST(ProvidedBufferRingTest, BundlesForcedOnFillSeveralBuffersPerCompletion) {
  LoadOptions o;
  o.connections = 4;
  o.bytes_per_connection = 1 << 20;
  o.max_message = 256 * 1024;
  o.pool = {.buffer_count = 1024};
  o.ring = {.max_buffers = 512, .bundles = Bundles::kOn};
  LoadResult r;
  RunLoad(o, &r);
  EXPECT_TRUE(r.bundles);
  EXPECT_GT(r.most_slices, 1u);
}

TEST(ProvidedBufferRingTest, BundlesForcedOffTakeOneBufferPerCompletion) {
  LoadOptions o;
  o.connections = 4;
  o.bytes_per_connection = 1 << 20;
  o.max_message = 256 * 1024;
  o.pool = {.buffer_count = 1024};
  o.ring = {.max_buffers = 512, .bundles = Bundles::kOff};
  LoadResult r;
  RunLoad(o, &r);
  EXPECT_FALSE(r.bundles);
  EXPECT_EQ(r.most_slices, 1u);
}

// A bundle that arrives while the chain's tail has room is copied into it
// (the room filled, then fresh buffers), not linked after it: linking would
// leave one partly filled buffer inside the chain per bundle. With the pool
// dry, the rest of the bundle is linked instead, and no byte is lost (the
// bound is then not checked).
void BundlesAfterAPartialTail(size_t pool_buffers, bool* saw_bundle,
                              uint64_t* copied) {
  Ring ring;
  ASSERT_TRUE(ring.ok());
  auto pool =
      BufferPool::Create({.buffer_count = pool_buffers, .cache_size = 0});
  ASSERT_TRUE(pool.ok());
  const size_t bs = (*pool)->buffer_size();
  Pairs pairs;
  MakePairs(1, &pairs);
  auto br = ProvidedBufferRing::Create(ring.get(), **pool,
                                       {.max_buffers = 16,
                                        .initial_buffers = 16,
                                        .bundles = Bundles::kOn,
                                        .incremental = Incremental::kOff});
  if (!br.ok() || !(*br)->bundles()) {
    GTEST_SKIP() << "no bundles here";
  }
  BufferChain queue(**pool);
  ASSERT_TRUE(queue.Append("head").ok());  // a tail with room
  std::string model = "head";
  for (int round = 0; round < 3; ++round) {
    // Written before the receive is armed, so one completion can carry it
    // all in several buffers.
    const std::string msg(3 * bs + 100, static_cast<char>('a' + round));
    ASSERT_TRUE(WriteAll(pairs.client[0], msg.data(), msg.size()));
    usleep(20000);
    model += msg;
    io_uring_sqe* sqe = ring.Sqe();
    ProvidedBufferRing::RecvOptions ro;
    ro.multishot = false;
    (*br)->PrepareRecv(sqe, pairs.server[0], ro);
    size_t got = 0;
    while (got < msg.size()) {
      ASSERT_GE(io_uring_submit_and_wait(ring.get(), 1), 0);
      io_uring_cqe* cqe;
      ASSERT_EQ(io_uring_peek_cqe(ring.get(), &cqe), 0);
      ASSERT_GT(cqe->res, 0);
      const size_t res = static_cast<size_t>(cqe->res);
      got += res;
      if (res > bs) *saw_bundle = true;
      const bool more = (cqe->flags & IORING_CQE_F_MORE) != 0;
      absl::Status st = (*br)->Take(*cqe, queue);
      io_uring_cqe_seen(ring.get(), cqe);
      ASSERT_TRUE(st.ok()) << st;
      (*br)->Refill();
      if (!more && got < msg.size()) {
        (*br)->PrepareRecv(ring.Sqe(), pairs.server[0], ro);
      }
    }
    ASSERT_EQ(testing_util::Contents(queue), model) << round;
    if (pool_buffers > 64) {
      EXPECT_LE(queue.pinned_bytes(), queue.size() + 2 * bs) << round;
    }
  }
  *copied = (*br)->copied();
  queue.Clear();
  br->reset();
  ring.DropCompletions();
  EXPECT_EQ((*pool)->Stats().in_use, 0u);
}

TEST(ProvidedBufferRingCopyTest, BundlesAfterAPartialTailAreCopied) {
  bool saw_bundle = false;
  uint64_t copied = 0;
  BundlesAfterAPartialTail(256, &saw_bundle, &copied);
  if (!testing::Test::IsSkipped()) {
    EXPECT_TRUE(saw_bundle);
    EXPECT_GE(copied, 3u);  // each round's bundle, at least
  }
}

TEST(ProvidedBufferRingCopyTest,
     BundlesAfterAPartialTailWithADryPoolAreLinked) {
  // The ring's 16, the queue's one and one more: the first buffer of the
  // first bundle is copied, the rest linked; then no fresh buffer is left.
  bool saw_bundle = false;
  uint64_t copied = 0;
  BundlesAfterAPartialTail(18, &saw_bundle, &copied);
  if (!testing::Test::IsSkipped()) {
    EXPECT_TRUE(saw_bundle);
    EXPECT_EQ(copied, 1u);
  }
}

TEST(ProvidedBufferRingTest, BundlesAreProbedFromTheRingsFeatures) {
  RingRig rig;
  ASSERT_NO_FATAL_FAILURE(rig.OpenPool({.buffer_count = 64}));
  ASSERT_NO_FATAL_FAILURE(rig.OpenRing({}));
  EXPECT_EQ((*rig.br)->bundles(), (rig.ring.get()->features & (1u << 14)) != 0);
}

TEST(ProvidedBufferRingTest, LendsSlotsAboveSixtyFiveThousand) {
  LoadOptions o;
  o.connections = 8;
  o.bytes_per_connection = 128 * 1024;
  o.pool = {.buffer_count = 70000, .populate = false};
  o.reserve_below = 66000;  // only slots >= 66000 are free
  o.ring = {.max_buffers = 512};
  LoadResult r;
  RunLoad(o, &r);
  EXPECT_GE(r.lowest_slot, 66000u);
}

TEST(ProvidedBufferRingTest, TeardownReturnsLentBuffersAndTakenChainsStay) {
  RingRig rig;
  ASSERT_NO_FATAL_FAILURE(rig.OpenPool({.buffer_count = 256}));
  Pairs pairs;
  MakePairs(1, &pairs);
  BufferChain kept;
  {
    auto br = ProvidedBufferRing::Create(rig.ring.get(), **rig.pool,
                                         {.max_buffers = 64,
                                          .initial_buffers = 64,
                                          .copy_below = 0,
                                          .incremental = Incremental::kOff});
    ASSERT_TRUE(br.ok()) << br.status();
    EXPECT_EQ((*rig.pool)->Stats().in_use, 64u);
    io_uring_sqe* sqe = rig.ring.Sqe();
    (*br)->PrepareRecv(sqe, pairs.server[0]);
    ASSERT_TRUE(WriteAll(pairs.client[0], "first", 5));
    ASSERT_GE(io_uring_submit_and_wait(rig.ring.get(), 1), 0);
    io_uring_cqe* cqe;
    ASSERT_EQ(io_uring_peek_cqe(rig.ring.get(), &cqe), 0);
    absl::StatusOr<BufferChain> c = (*br)->Take(*cqe);
    io_uring_cqe_seen(rig.ring.get(), cqe);
    ASSERT_TRUE(c.ok()) << c.status();
    kept = *std::move(c);
    // A second message the kernel takes a buffer for; its completion is
    // never taken: teardown must return that buffer too.
    ASSERT_TRUE(WriteAll(pairs.client[0], "second", 6));
    ASSERT_GE(io_uring_submit_and_wait(rig.ring.get(), 1), 0);
    // The taken buffer's id was lent again with a fresh buffer; the second
    // one is still the ring's.
    EXPECT_EQ((*br)->available(), 64u);
  }  // destroyed with the multishot receive still armed
  EXPECT_EQ((*rig.pool)->Stats().in_use, 1u);  // the kept chain's buffer
  EXPECT_EQ(kept.size(), 5u);
  std::string bytes(5, '\0');
  kept.CopyTo(absl::MakeSpan(reinterpret_cast<std::byte*>(bytes.data()), 5));
  EXPECT_EQ(bytes, "first");
  kept.Clear();
  EXPECT_EQ((*rig.pool)->Stats().in_use, 0u);
  // The receive, left without its group, ends; nothing names our buffers.
  shutdown(pairs.client[0], SHUT_WR);
  rig.ring.DropCompletions();
}

TEST(ProvidedBufferRingTest, TakeReportsErrorsByTheirErrno) {
  RingRig rig;
  ASSERT_NO_FATAL_FAILURE(rig.OpenPool({.buffer_count = 64}));
  ASSERT_NO_FATAL_FAILURE(rig.OpenRing({.group_id = 9}));
  io_uring_cqe cqe{};
  cqe.res = -ENOBUFS;
  absl::StatusOr<BufferChain> c = (*rig.br)->Take(cqe);
  EXPECT_EQ(c.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ((*rig.br)->enobufs(), 1u);
  cqe.res = -ECANCELED;
  EXPECT_EQ((*rig.br)->Take(cqe).status().code(), absl::StatusCode::kCancelled);
  cqe.res = -ECONNRESET;
  c = (*rig.br)->Take(cqe);
  EXPECT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find("Connection reset"), std::string::npos)
      << c.status();
  cqe.res = 0;
  c = (*rig.br)->Take(cqe);
  ASSERT_TRUE(c.ok());
  EXPECT_TRUE(c->empty());
  cqe.res = 100;  // bytes but no buffer
  EXPECT_EQ((*rig.br)->Take(cqe).status().code(),
            absl::StatusCode::kFailedPrecondition);
  cqe.flags = IORING_CQE_F_BUFFER | (5000u << IORING_CQE_BUFFER_SHIFT);
  EXPECT_EQ((*rig.br)->Take(cqe).status().code(),
            absl::StatusCode::kFailedPrecondition);  // an id never lent
}

TEST(ProvidedBufferRingTest, TakeIntoAppendsToTheCallersChain) {
  RingRig rig;
  ASSERT_NO_FATAL_FAILURE(rig.OpenPool({.buffer_count = 64}));
  auto other = BufferPool::Create({.buffer_count = 4});  // the queue's pool
  ASSERT_TRUE(other.ok());
  Pairs pairs;
  MakePairs(1, &pairs);
  ASSERT_NO_FATAL_FAILURE(rig.OpenRing({.max_buffers = 16,
                                        .initial_buffers = 16,
                                        .bundles = Bundles::kOff,
                                        .copy_below = 0,
                                        .incremental = Incremental::kOff}));
  BufferChain queue(**other);
  ASSERT_TRUE(queue.Append("head:").ok());
  io_uring_sqe* sqe = rig.ring.Sqe();
  (*rig.br)->PrepareRecv(sqe, pairs.server[0]);
  for (const char* msg : {"one", "two!"}) {
    ASSERT_TRUE(WriteAll(pairs.client[0], msg, strlen(msg)));
    ASSERT_GE(io_uring_submit_and_wait(rig.ring.get(), 1), 0);
    io_uring_cqe* cqe;
    ASSERT_EQ(io_uring_peek_cqe(rig.ring.get(), &cqe), 0);
    absl::Status s = (*rig.br)->Take(*cqe, queue);
    io_uring_cqe_seen(rig.ring.get(), cqe);
    ASSERT_TRUE(s.ok()) << s;
  }
  // Linked, each id lent again at once with a fresh buffer of the pool.
  EXPECT_EQ((*rig.br)->available(), 16u);
  EXPECT_EQ(queue.size(), 12u);
  EXPECT_EQ(queue.slice_count(), 3u);  // linked, not copied
  std::string bytes(12, '\0');
  queue.CopyTo(absl::MakeSpan(reinterpret_cast<std::byte*>(bytes.data()), 12));
  EXPECT_EQ(bytes, "head:onetwo!");
  EXPECT_EQ((*rig.pool)->Stats().in_use, 18u);  // 16 lent + 2 in the queue

  // Errors and end of stream leave the queue as it was.
  io_uring_cqe fake{};
  for (int res : {-ENOBUFS, -ECONNRESET, 0}) {
    fake.res = res;
    absl::Status s = (*rig.br)->Take(fake, queue);
    EXPECT_EQ(s.ok(), res == 0) << res << ": " << s;
    EXPECT_EQ(queue.size(), 12u) << res;
  }
  fake.res = 7;
  fake.flags = IORING_CQE_F_BUFFER | (9999u << IORING_CQE_BUFFER_SHIFT);
  EXPECT_EQ((*rig.br)->Take(fake, queue).code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(queue.size(), 12u);

  queue.Clear();
  EXPECT_EQ((*rig.pool)->Stats().in_use, 16u);
  EXPECT_EQ((*rig.br)->Refill(), 16u);
  shutdown(pairs.client[0], SHUT_WR);
  rig.br->reset();
  rig.ring.DropCompletions();
}

TEST(ProvidedBufferRingTest, BadOptionsAndTakenGroupsAreRefused) {
  RingRig rig;
  ASSERT_NO_FATAL_FAILURE(rig.OpenPool({.buffer_count = 64}));
  auto bad = ProvidedBufferRing::Create(rig.ring.get(), **rig.pool,
                                        {.max_buffers = 40000});
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  // More than the pool has (see also budget_test).
  bad = ProvidedBufferRing::Create(rig.ring.get(), **rig.pool,
                                   {.max_buffers = 65});
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kResourceExhausted);
  auto first = ProvidedBufferRing::Create(rig.ring.get(), **rig.pool,
                                          {.group_id = 4, .max_buffers = 16});
  ASSERT_TRUE(first.ok()) << first.status();
  auto second = ProvidedBufferRing::Create(rig.ring.get(), **rig.pool,
                                           {.group_id = 4, .max_buffers = 16});
  ASSERT_FALSE(second.ok());
  EXPECT_NE(second.status().message().find("already registered"),
            std::string::npos)
      << second.status();
}

TEST(ProvidedBufferRingTest, StartsSmallAndGrowsWhileRunningLow) {
  RingRig rig;
  ASSERT_NO_FATAL_FAILURE(rig.OpenPool({.buffer_count = 1024}));
  ASSERT_NO_FATAL_FAILURE(
      rig.OpenRing({.max_buffers = 256, .initial_buffers = 16}));
  EXPECT_EQ((*rig.br)->available(), 16u);
  EXPECT_EQ((*rig.br)->Refill(), 16u);  // nothing needed: unchanged
  EXPECT_EQ((*rig.br)->target(), 16u);
  io_uring_cqe cqe{};
  cqe.res = -ENOBUFS;  // the ring ran dry: the next Refill() grows it
  EXPECT_FALSE((*rig.br)->Take(cqe).ok());
  EXPECT_EQ((*rig.br)->Refill(), 32u);
  EXPECT_EQ((*rig.br)->target(), 32u);
  EXPECT_EQ((*rig.br)->rearm_threshold(), 8u);  // a quarter of the most held
  EXPECT_TRUE((*rig.br)->ShouldRearm());
}

// The pool buffers an idle ring keeps out: those lent, and the pack buffer
// from the first short receive packed into an empty chain on; a holders
// report names the pack buffer "chain".
TEST(ProvidedBufferRingTest, AnIdleRingKeepsItsLentBuffersAndOnePackBuffer) {
  RingRig rig;
  ASSERT_NO_FATAL_FAILURE(
      rig.OpenPool({.buffer_count = 64, .track_holders = TrackHolders::kAll}));
  Pairs pairs;
  MakePairs(1, &pairs);
  ASSERT_NO_FATAL_FAILURE(rig.OpenRing({.max_buffers = 8,
                                        .initial_buffers = 8,
                                        .incremental = Incremental::kOff}));
  EXPECT_EQ((*rig.br)->pack_buffers(), 0u);
  EXPECT_EQ((*rig.pool)->Stats().in_use, (*rig.br)->available());
  (*rig.br)->PrepareRecv(rig.ring.Sqe(), pairs.server[0]);
  BufferChain conn(**rig.pool);
  SendAndTake(rig.ring, **rig.br, pairs.client[0], "PING\r\n", conn, true);
  EXPECT_EQ(conn.size(), 6u);
  EXPECT_EQ((*rig.br)->pack_buffers(), 1u);
  conn.Clear();  // the connection is idle: it pins nothing
  EXPECT_EQ((*rig.br)->Refill(), 8u);
  EXPECT_EQ((*rig.pool)->Stats().in_use,
            (*rig.br)->available() + (*rig.br)->pack_buffers());
  size_t chains = 0;
  for (const Holder& h : (*rig.pool)->Holders()) chains += h.held_by == "chain";
  EXPECT_EQ(chains, 1u);  // the pack buffer
  shutdown(pairs.client[0], SHUT_WR);
  rig.br->reset();
  EXPECT_EQ((*rig.pool)->Stats().in_use, 0u);
  rig.ring.DropCompletions();
}

// Closing a connection whose multishot receive is armed: close(fd) alone
// does not end the receive (the ring holds the socket), so its completions
// keep coming, each with a ring buffer that only Take() (or Visit(),
// TakeBuffer()) gives back; the cancel ends it with -ECANCELED and no
// buffer, and shutdown(fd, SHUT_RDWR) ends it as end of stream does: OK,
// nothing appended.
TEST(ProvidedBufferRingTest, CompletionsOfAClosedConnectionStillGoToTake) {
  RingRig rig;
  ASSERT_NO_FATAL_FAILURE(rig.OpenPool({.buffer_count = 64}));
  Pairs pairs;
  MakePairs(3, &pairs);
  ASSERT_NO_FATAL_FAILURE(rig.OpenRing({.max_buffers = 8,
                                        .initial_buffers = 8,
                                        .copy_below = 0,
                                        .incremental = Incremental::kOff}));
  constexpr uint64_t kRecv = 1;
  io_uring_sqe* sqe = rig.ring.Sqe();
  (*rig.br)->PrepareRecv(sqe, pairs.server[0]);
  io_uring_sqe_set_data64(sqe, kRecv);
  ASSERT_GE(io_uring_submit(rig.ring.get()), 1);
  ASSERT_EQ(close(pairs.server[0]), 0);  // the receive stays armed
  pairs.server[0] = -1;
  ASSERT_TRUE(WriteAll(pairs.client[0], "late", 4));
  io_uring_cqe* cqe;
  ASSERT_EQ(io_uring_wait_cqe(rig.ring.get(), &cqe), 0);
  ASSERT_EQ(cqe->res, 4);
  ASSERT_TRUE(cqe->flags & IORING_CQE_F_BUFFER);
  EXPECT_TRUE(cqe->flags & IORING_CQE_F_MORE);
  EXPECT_EQ((*rig.br)->available(), 8u);  // counted until taken
  {
    absl::StatusOr<BufferChain> dropped = (*rig.br)->Take(*cqe);  // and dropped
    ASSERT_TRUE(dropped.ok()) << dropped.status();
  }
  io_uring_cqe_seen(rig.ring.get(), cqe);
  EXPECT_EQ((*rig.br)->Refill(), 8u);
  EXPECT_EQ((*rig.pool)->Stats().in_use, 8u);
  sqe = rig.ring.Sqe();
  io_uring_prep_cancel64(sqe, kRecv, 0);
  io_uring_sqe_set_data64(sqe, 2);
  ASSERT_GE(io_uring_submit(rig.ring.get()), 1);
  for (int i = 0; i < 2; ++i) {
    ASSERT_EQ(io_uring_wait_cqe(rig.ring.get(), &cqe), 0);
    if (cqe->user_data == kRecv) {
      EXPECT_EQ(cqe->res, -ECANCELED);
      EXPECT_FALSE(cqe->flags & (IORING_CQE_F_MORE | IORING_CQE_F_BUFFER));
      EXPECT_EQ((*rig.br)->Take(*cqe).status().code(),
                absl::StatusCode::kCancelled);
    }
    io_uring_cqe_seen(rig.ring.get(), cqe);
  }
  EXPECT_EQ((*rig.br)->available(), 8u);

  // End of stream into the caller's chain: OK, the chain unchanged, the
  // receive's last completion (no IORING_CQE_F_MORE).
  sqe = rig.ring.Sqe();
  (*rig.br)->PrepareRecv(sqe, pairs.server[1]);
  ASSERT_EQ(shutdown(pairs.client[1], SHUT_WR), 0);
  ASSERT_GE(io_uring_submit_and_wait(rig.ring.get(), 1), 0);
  ASSERT_EQ(io_uring_peek_cqe(rig.ring.get(), &cqe), 0);
  EXPECT_EQ(cqe->res, 0);
  EXPECT_FALSE(cqe->flags & IORING_CQE_F_MORE);
  BufferChain input(**rig.pool);
  ASSERT_TRUE(input.Append("kept").ok());
  EXPECT_TRUE((*rig.br)->Take(*cqe, input).ok());
  io_uring_cqe_seen(rig.ring.get(), cqe);
  EXPECT_EQ(input.size(), 4u);
  EXPECT_EQ((*rig.br)->available(), 8u);

  // Our own shutdown() ends an armed receive the same way.
  sqe = rig.ring.Sqe();
  (*rig.br)->PrepareRecv(sqe, pairs.server[2]);
  ASSERT_EQ(io_uring_submit(rig.ring.get()), 1);
  ASSERT_EQ(shutdown(pairs.server[2], SHUT_RDWR), 0);
  ASSERT_EQ(io_uring_wait_cqe(rig.ring.get(), &cqe), 0);
  EXPECT_EQ(cqe->res, 0);
  EXPECT_FALSE(cqe->flags & IORING_CQE_F_MORE);
  EXPECT_TRUE((*rig.br)->Take(*cqe, input).ok());
  io_uring_cqe_seen(rig.ring.get(), cqe);
  EXPECT_EQ(input.size(), 4u);
  EXPECT_EQ((*rig.br)->available(), 8u);
}

// ParkedReceives never touches its ProvidedBufferRing when destroyed, so it
// may outlive it; with a notice pending it is destroyed after
// io_uring_queue_exit() (which cancels the eventfd read into it), and the
// pool's later notice still finds its eventfd open.
TEST(ProvidedBufferRingTest, ParkedReceivesGoesAfterTheRingAndItsExit) {
  auto pool = BufferPool::Create({.buffer_count = 8});
  ASSERT_TRUE(pool.ok());
  io_uring ring;
  ASSERT_EQ(io_uring_queue_init(8, &ring, 0), 0);
  auto br = ProvidedBufferRing::Create(
      &ring, **pool,
      {.max_buffers = 2, .initial_buffers = 2, .rearm_threshold = 3});
  ASSERT_TRUE(br.ok()) << br.status();
  std::vector<Buffer> hog;
  while (Buffer b = (*pool)->TryAcquire()) hog.push_back(std::move(b));
  auto parked = ParkedReceives::Create(**br);
  ASSERT_TRUE(parked.ok()) << parked.status();
  int conn = 0;
  (*parked)->Park(&conn);
  EXPECT_EQ((*parked)->Rearm(&ring, 7, [](void*) { ADD_FAILURE(); }), 0u);
  ASSERT_TRUE((*parked)->notice_pending());
  ASSERT_EQ(io_uring_submit(&ring), 1);  // the read waits on the eventfd
  br->reset();
  io_uring_queue_exit(&ring);
  parked->reset();
  hog.pop_back();  // the pool's notice: to an eventfd still open
  hog.clear();
  EXPECT_EQ((*pool)->Stats().in_use, 0u);

  // No notice pending: any order, before the ring's exit.
  ASSERT_EQ(io_uring_queue_init(8, &ring, 0), 0);
  br = ProvidedBufferRing::Create(&ring, **pool, {});
  ASSERT_TRUE(br.ok()) << br.status();
  parked = ParkedReceives::Create(**br);
  ASSERT_TRUE(parked.ok()) << parked.status();
  EXPECT_FALSE((*parked)->notice_pending());
  br->reset();
  parked->reset();
  io_uring_queue_exit(&ring);
}

}  // namespace
}  // namespace bufpool

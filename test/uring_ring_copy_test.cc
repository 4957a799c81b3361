// ProvidedBufferRing's memory that follows bytes (docs/uring.md): a line
// trickled a byte at a time pins about its bytes, small completions are
// packed into the ring's shared pack buffer and their ring buffers lent again
// at once, bundles after a partial tail are copied, and the inline copy path
// and the cases beside it keep every rule.
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
using testing_util::UniqueFd;
using testing_util::WriteAll;

using Bundles = ProvidedBufferRingOptions::Bundles;
using Incremental = ProvidedBufferRingOptions::Incremental;

}  // namespace
}  // namespace bufpool

namespace bufpool {
namespace {

// Memory follows bytes: a 20 KB line trickled a byte at a time on each of
// `connections` stream socketpairs and never consumed. Each connection's
// chain may pin at most B + 2 * buffer_size; the pool's high water at most
// that per connection plus what the ring has lent.
class TrickleTest
    : public testing::TestWithParam<std::tuple<size_t, Incremental>> {};

TEST_P(TrickleTest, ALineTrickledAByteAtATimePinsAboutItsBytes) {
  const auto [conns, incremental] = GetParam();
  constexpr size_t kLine = 20 * 1024;
  constexpr size_t kRingBuffers = 64;
  // high_water is exact, so it measures the chains alone.
  auto pool = testing_util::MakeUncachedPool(8192);
  const size_t bs = pool->buffer_size();
  const size_t bound =
      kRingBuffers + conns * testing_util::MostBuffersFor(kLine, bs);
  Ring ring;
  ASSERT_TRUE(ring.ok());
  std::vector<UniqueFd> reader, writer;
  ASSERT_NO_FATAL_FAILURE(testing_util::MakeTrickleSockets(
      conns, /*nonblocking_readers=*/false, &reader, &writer));
  std::string line = testing_util::TrickleLine(kLine);
  line.back() = '\n';
  std::atomic<bool> stop{false};
  std::thread trickler = testing_util::StartTrickler(
      conns, line,
      [&writer](size_t i, const char* byte) {
        return WriteAll(writer[i].get(), byte, 1);
      },
      &stop);
  {
    auto br = ProvidedBufferRing::Create(ring.get(), *pool,
                                         {.max_buffers = kRingBuffers,
                                          .initial_buffers = kRingBuffers,
                                          .incremental = incremental});
    if (!br.ok() && incremental == Incremental::kOn) {
      GTEST_SKIP() << "no incremental rings here: " << br.status();
    }
    ASSERT_TRUE(br.ok()) << br.status();
    EXPECT_EQ((*br)->incremental(), incremental == Incremental::kOn);
    std::vector<BufferChain> queue;
    for (size_t i = 0; i < conns; ++i) queue.emplace_back(*pool);
    std::vector<bool> armed(conns, false);
    std::vector<size_t> parked;
    size_t done = 0;
    auto arm = [&](size_t i) {
      io_uring_sqe* sqe = ring.Sqe();
      (*br)->PrepareRecv(sqe, reader[i].get());
      io_uring_sqe_set_data64(sqe, i);
      armed[i] = true;
    };
    for (size_t i = 0; i < conns; ++i) arm(i);
    while (done < conns) {
      (*br)->Refill();
      while (!parked.empty() && (*br)->ShouldRearm()) {
        arm(parked.back());
        parked.pop_back();
      }
      __kernel_timespec ts{0, 10000000};
      io_uring_cqe* first;
      io_uring_submit_and_wait_timeout(ring.get(), &first, 1, &ts, nullptr);
      io_uring_cqe* cqe;
      unsigned head, seen = 0;
      io_uring_for_each_cqe(ring.get(), head, cqe) {
        ++seen;
        const size_t i = static_cast<size_t>(cqe->user_data);
        if ((cqe->flags & IORING_CQE_F_MORE) == 0) armed[i] = false;
        absl::Status s = (*br)->Take(*cqe, queue[i]);
        if (s.code() == absl::StatusCode::kResourceExhausted) {
          if (!armed[i]) parked.push_back(i);
          continue;
        }
        ASSERT_TRUE(s.ok()) << s;
        ASSERT_GT(cqe->res, 0) << "connection " << i << " closed early";
        if (queue[i].size() == kLine) ++done;
        if (!armed[i] && queue[i].size() < kLine) arm(i);
      }
      io_uring_cq_advance(ring.get(), seen);
      if (pool->Stats().high_water > bound) break;  // fails below
    }
    stop = true;
    trickler.join();
    EXPECT_LE(pool->Stats().high_water, bound)
        << conns << " connections, " << done << " lines complete";
    EXPECT_GT((*br)->copied(), 0u);
    ASSERT_NO_FATAL_FAILURE(
        testing_util::ExpectEachHoldsTheLine(queue, line, bs));
    // Every receive is still armed: cancel them by closing, then drain.
    for (size_t i = 0; i < conns; ++i) shutdown(writer[i].get(), SHUT_WR);
    while (std::count(armed.begin(), armed.end(), true) > 0) {
      io_uring_cqe* cqe;
      ASSERT_EQ(io_uring_wait_cqe(ring.get(), &cqe), 0);
      const size_t i = static_cast<size_t>(cqe->user_data);
      if ((cqe->flags & IORING_CQE_F_MORE) == 0) armed[i] = false;
      BufferChain dropped;
      (*br)->Take(*cqe, dropped).IgnoreError();
      io_uring_cqe_seen(ring.get(), cqe);
    }
  }
  reader.clear();
  writer.clear();
  EXPECT_EQ(pool->Stats().in_use, 0u);
}

INSTANTIATE_TEST_SUITE_P(
    Connections, TrickleTest,
    // 100 connections in the plain build only (2 million one-byte sends
    // each, 12 s per case under TSan), as for ReadFrom and Asio.
    testing::Combine(testing::ValuesIn(testing_util::kSanitized
                                           ? std::vector<size_t>{1, 5}
                                           : std::vector<size_t>{1, 5, 100}),
                     testing::Values(Incremental::kOff, Incremental::kOn)));

}  // namespace
}  // namespace bufpool

namespace bufpool {
namespace {

// A small completion into a chain without room of its own is packed into
// the ring's pack buffer, which the chains it serves share, and its ring
// buffer lent again at once; bytes that continue a chain's own pack slice
// join it; a chain past copy_below fills a buffer of its own; a large one
// is linked; an emptied chain pins nothing; copy_below is validated.
TEST(ProvidedBufferRingCopyTest, SmallCompletionsArePackedAndRelentAtOnce) {
  RingRig rig;
  ASSERT_NO_FATAL_FAILURE(rig.OpenPool({.buffer_count = 64}));
  const size_t bs = (*rig.pool)->buffer_size();
  auto bad = ProvidedBufferRing::Create(rig.ring.get(), **rig.pool,
                                        {.copy_below = bs + 1});
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  Pairs pairs;
  MakePairs(2, &pairs);
  ASSERT_NO_FATAL_FAILURE(rig.OpenRing({.max_buffers = 16,
                                        .initial_buffers = 16,
                                        .bundles = Bundles::kOff,
                                        .incremental = Incremental::kOff}));
  EXPECT_EQ((*rig.br)->copy_below(), bs / 8);
  BufferChain queue(**rig.pool), other(**rig.pool);
  (*rig.br)->PrepareRecv(rig.ring.Sqe(), pairs.server[0]);
  (*rig.br)->PrepareRecv(rig.ring.Sqe(), pairs.server[1]);
  auto take = [&](int conn, const std::string& msg, BufferChain& q) {
    SendAndTake(rig.ring, **rig.br, pairs.client[conn], msg, q,
                /*refill=*/false);
  };
  take(0, "tiny", queue);  // packed: a slice of the pack buffer
  EXPECT_EQ((*rig.br)->copied(), 1u);
  EXPECT_EQ((*rig.br)->available(), 16u);       // lent again, no Refill()
  EXPECT_EQ((*rig.pool)->Stats().in_use, 17u);  // 16 lent, the pack buffer
  ASSERT_EQ(queue.slice_count(), 1u);
  EXPECT_GT(queue.slice(0).use_count(), 1u);  // the ring's and the queue's
  EXPECT_EQ(queue.tail_room(), 0u);           // shared: not the queue's
  const std::byte* pack = queue.slice(0).data() - queue.slice(0).offset();
  take(0, "more", queue);  // continues the queue's slice: joins it
  ASSERT_EQ(queue.slice_count(), 1u);
  EXPECT_EQ(queue.slice(0).view(), "tinymore");
  take(1, "x", other);  // another connection: the same pack buffer
  ASSERT_EQ(other.slice_count(), 1u);
  EXPECT_EQ(other.slice(0).data(), pack + 8);
  EXPECT_EQ((*rig.pool)->Stats().in_use, 17u);
  take(0, "!", queue);  // not adjacent any more: a second slice
  EXPECT_EQ(queue.slice_count(), 2u);
  EXPECT_EQ(testing_util::Contents(queue), "tinymore!");
  EXPECT_EQ((*rig.pool)->Stats().in_use, 17u);
  // Emptied, a chain pins nothing; the pack buffer, its slices all gone,
  // is filled again from its start once it is full (no fresh buffer).
  queue.Consume(queue.size());
  other.Consume(other.size());
  EXPECT_EQ(queue.slice_count(), 0u);
  EXPECT_EQ(queue.pinned_bytes(), 0u);
  EXPECT_EQ((*rig.pool)->Stats().in_use, 17u);
  const std::string fill(bs / 8 - 1, 'f');
  bool wrapped = false;
  for (size_t i = 0; i < 2 * bs / fill.size() && !wrapped; ++i) {
    take(0, fill, queue);
    ASSERT_EQ(queue.slice_count(), 1u);
    wrapped = queue.slice(0).data() == pack;
    EXPECT_EQ(queue.slice(0).data() - queue.slice(0).offset(), pack);
    queue.Consume(queue.size());
  }
  EXPECT_TRUE(wrapped);
  EXPECT_EQ((*rig.pool)->Stats().in_use, 17u);
  take(0, "again", queue);
  EXPECT_EQ(queue.slice(0).data() - queue.slice(0).offset(), pack);
  EXPECT_EQ((*rig.pool)->Stats().in_use, 17u);
  // Past copy_below the chain's next small bytes go to a buffer of its
  // own, which the ones after fill.
  const std::string part(bs / 8 - 4, 'p');  // 5 + 508 >= 512
  take(0, part, queue);
  ASSERT_EQ(queue.slice_count(), 2u);
  EXPECT_NE(queue.slice(1).data() - queue.slice(1).offset(), pack);
  EXPECT_EQ(queue.slice(1).use_count(), 1u);
  take(0, "tail", queue);
  EXPECT_EQ(queue.slice_count(), 2u);
  EXPECT_EQ(testing_util::Contents(queue), "again" + part + "tail");
  queue.Clear();
  // A buffer's worth into an empty chain: linked, not copied.
  const uint64_t copied = (*rig.br)->copied();
  take(0, std::string(bs, 'L'), queue);
  EXPECT_EQ((*rig.br)->copied(), copied);
  ASSERT_EQ(queue.slice_count(), 1u);
  EXPECT_EQ(queue.slice(0).use_count(), 1u);
  EXPECT_EQ(queue.slice(0).view(), std::string(bs, 'L'));
  queue.Clear();
  shutdown(pairs.client[0], SHUT_WR);
  shutdown(pairs.client[1], SHUT_WR);
  rig.br->reset();
  rig.ring.DropCompletions();
  EXPECT_EQ((*rig.pool)->Stats().in_use, 0u);  // the pack buffer too
}

}  // namespace
}  // namespace bufpool

namespace bufpool {
namespace {

// A chain whose pack slice ends where the full pack buffer ends moves, with
// its next bytes, to the pack's next buffer, never a slice that runs on
// into the next pool buffer (the next pack buffer is often that one,
// adjacent in the region). Every slice stays inside its buffer, and the
// bytes are intact.
TEST(ProvidedBufferRingCopyTest, APackSliceNeverRunsIntoTheNextBuffer) {
  RingRig rig;
  ASSERT_NO_FATAL_FAILURE(rig.OpenPool({.buffer_count = 64, .cache_size = 0}));
  const size_t bs = (*rig.pool)->buffer_size();
  Pairs pairs;
  MakePairs(1, &pairs);
  ASSERT_NO_FATAL_FAILURE(rig.OpenRing({.max_buffers = 16,
                                        .initial_buffers = 16,
                                        .bundles = Bundles::kOff,
                                        .copy_below = bs,
                                        .incremental = Incremental::kOff}));
  (*rig.br)->PrepareRecv(rig.ring.Sqe(), pairs.server[0]);
  BufferChain q(**rig.pool);
  std::string model;
  auto take = [&](const std::string& msg) {
    model += msg;
    SendAndTake(rig.ring, **rig.br, pairs.client[0], msg, q, /*refill=*/true);
  };
  auto consume = [&](size_t n) {
    q.Consume(n);
    model.erase(0, n);
  };
  take(std::string(2000, 'a'));
  consume(1999);
  take(std::string(bs - 2000, 'b'));  // the pack buffer is now full
  consume(bs - 2000);
  take("0123456789");
  for (size_t i = 0; i < q.slice_count(); ++i) {
    EXPECT_LE(q.slice(i).offset() + q.slice(i).size(), bs) << i;
  }
  EXPECT_EQ(testing_util::Contents(q), model);
  // The short partial left in the full buffer moved with the new bytes to
  // where the pack writes now: one slice, the full buffer gone back.
  EXPECT_EQ(q.slice_count(), 1u);
  EXPECT_EQ(q.pinned_bytes(), bs);
  q.Clear();
  shutdown(pairs.client[0], SHUT_WR);
  rig.ExpectEveryBufferBack();
}

// What a server's connections pin while idle or holding a short partial
// command (the bounds): 200 connections that each received one
// 12-byte request and consumed it pin no buffer between them; 200 that
// each hold a 100-byte half command share pack buffers: about their bytes.
TEST(ProvidedBufferRingCopyTest,
     IdleAndHalfCommandConnectionsPinAboutTheirBytes) {
  constexpr size_t kConns = 200;
  RingRig rig;
  ASSERT_NO_FATAL_FAILURE(rig.OpenPool({.buffer_count = 512, .cache_size = 0}));
  const size_t bs = (*rig.pool)->buffer_size();
  Pairs pairs;
  ASSERT_NO_FATAL_FAILURE(MakePairs(kConns, &pairs));
  ASSERT_NO_FATAL_FAILURE(rig.OpenRing({.max_buffers = 64,
                                        .initial_buffers = 64,
                                        .bundles = Bundles::kOff,
                                        .incremental = Incremental::kOff}));
  std::vector<BufferChain> in;
  for (size_t i = 0; i < kConns; ++i) {
    in.emplace_back(**rig.pool);
    (*rig.br)->PrepareRecv(rig.ring.Sqe(), pairs.server[i]);
  }
  for (size_t i = 0; i < kConns; ++i) {
    SendAndTake(rig.ring, **rig.br, pairs.client[i], "*1\r\n$4\r\nPING\r\n",
                in[i],
                /*refill=*/true);
    in[i].Consume(in[i].size());  // the request answered
  }
  // Idle: the ring's lent buffers and at most its pack buffer.
  EXPECT_LE((*rig.pool)->Stats().in_use, (*rig.br)->available() + 1);
  const std::string half =
      "*3\r\n$3\r\nSET\r\n$3\r\nkey\r\n$200\r\n" + std::string(100 - 28, 'v');
  ASSERT_EQ(half.size(), 100u);
  for (size_t i = 0; i < kConns; ++i) {
    SendAndTake(rig.ring, **rig.br, pairs.client[i], half, in[i],
                /*refill=*/true);
  }
  const size_t pinned = (*rig.pool)->Stats().in_use - (*rig.br)->available();
  // 100 bytes each, packed: kConns * 100 bytes fill this many buffers.
  EXPECT_LE(pinned, (kConns * 100 + bs - 1) / bs + 1);
  EXPECT_LE(pinned * bs / kConns, 1024u);  // the goal: <= 1 KiB each
  for (size_t i = 0; i < kConns; ++i) {
    ASSERT_EQ(testing_util::Contents(in[i]), half) << i;
  }
  in.clear();
  for (int fd : pairs.client) shutdown(fd, SHUT_WR);
  rig.ExpectEveryBufferBack();
}

// The completions Take() hands on from its inline path: a tail whose room
// is smaller than the completion (the room filled, the rest in one fresh
// buffer), a chain of another pool (small: packed; large: linked). Every
// buffer is back in its pool at the end.
TEST(ProvidedBufferRingCopyTest, CasesBesideTheInlinePathKeepEveryRule) {
  Ring ring;
  ASSERT_TRUE(ring.ok());
  auto pool = BufferPool::Create({.buffer_count = 64});
  auto other = BufferPool::Create({.buffer_count = 4});
  ASSERT_TRUE(pool.ok() && other.ok());
  const size_t bs = (*pool)->buffer_size();
  Pairs pairs;
  MakePairs(1, &pairs);
  auto br = ProvidedBufferRing::Create(ring.get(), **pool,
                                       {.max_buffers = 16,
                                        .initial_buffers = 16,
                                        .bundles = Bundles::kOff,
                                        .incremental = Incremental::kOff});
  ASSERT_TRUE(br.ok()) << br.status();
  ASSERT_EQ((*br)->copy_below(), bs / 8);
  io_uring_sqe* sqe = ring.Sqe();
  (*br)->PrepareRecv(sqe, pairs.server[0]);
  auto take = [&](const std::string& msg, BufferChain& q) {
    SendAndTake(ring, **br, pairs.client[0], msg, q, /*refill=*/true);
  };
  using testing_util::Contents;
  // A linked buffer with 10 bytes of room, then 100 bytes (under
  // copy_below): 10 into the room, 90 into one fresh buffer.
  BufferChain queue(**pool);
  const std::string big(bs - 10, 'B');
  take(big, queue);
  ASSERT_EQ(queue.slice_count(), 1u);
  ASSERT_EQ(queue.tail_room(), 10u);
  const uint64_t copied = (*br)->copied();
  const std::string small(100, 's');
  take(small, queue);
  EXPECT_EQ((*br)->copied(), copied + 1);
  EXPECT_EQ(queue.slice_count(), 2u);
  EXPECT_EQ(queue.slice(0).size(), bs);
  EXPECT_EQ(queue.slice(1).size(), 90u);
  EXPECT_EQ(queue.pinned_bytes(), 2 * bs);
  EXPECT_EQ(Contents(queue), big + small);
  queue.Clear();
  // A queue of another pool: a small completion is packed into the ring's
  // pool (a chain may hold slices of several pools); a large one linked.
  BufferChain foreign(**other);
  take("tiny", foreign);
  ASSERT_EQ(foreign.slice_count(), 1u);
  EXPECT_EQ(foreign.slice(0).pool(), pool->get());
  EXPECT_EQ(foreign.slice(0).view(), "tiny");
  EXPECT_EQ((*other)->Stats().in_use, 0u);
  foreign.Consume(foreign.size());
  const std::string large(bs / 2, 'L');
  take(large, foreign);
  ASSERT_EQ(foreign.slice_count(), 1u);
  EXPECT_EQ(foreign.slice(0).pool(), pool->get());
  EXPECT_EQ(Contents(foreign), large);
  foreign.Clear();
  // Many messages taken and consumed, then teardown: no buffer is held
  // twice or lost, and the emptied queue pins nothing.
  for (int i = 0; i < 64; ++i) {
    const std::string msg(bs / 4 + static_cast<size_t>(i), 'a' + i % 26);
    take(msg, queue);
    ASSERT_EQ(Contents(queue), msg);
    queue.Consume(queue.size());
    ASSERT_EQ(queue.pinned_bytes(), 0u);
  }
  EXPECT_EQ((*pool)->Stats().in_use, 17u);  // 16 lent, the pack buffer
  queue.Clear();
  shutdown(pairs.client[0], SHUT_WR);
  br->reset();
  ring.DropCompletions();
  EXPECT_EQ((*pool)->Stats().in_use, 0u);
}

// Take()'s inline link: a completion of at least copy_below bytes into an
// empty chain becomes the chain's only slice (the ring's buffer itself, no
// copy), a fresh pool buffer is lent under its id at once, and consuming
// the chain gives the buffer straight back to the pool: the emptied chain
// keeps nothing. With copy_below 0 even one byte is linked; a chain
// without a pool links the same.
TEST(ProvidedBufferRingCopyTest, ALargeCompletionIntoAnEmptyChainIsLinked) {
  RingRig rig;
  ASSERT_NO_FATAL_FAILURE(rig.OpenPool({.buffer_count = 64}));
  const size_t bs = (*rig.pool)->buffer_size();
  Pairs pairs;
  MakePairs(2, &pairs);
  rig.br = ProvidedBufferRing::Create(rig.ring.get(), **rig.pool,
                                      {.max_buffers = 16,
                                       .initial_buffers = 16,
                                       .bundles = Bundles::kOff,
                                       .incremental = Incremental::kOff});
  auto never = ProvidedBufferRing::Create(rig.ring.get(), **rig.pool,
                                          {.group_id = 1,
                                           .max_buffers = 4,
                                           .initial_buffers = 4,
                                           .bundles = Bundles::kOff,
                                           .copy_below = 0,
                                           .incremental = Incremental::kOff});
  ASSERT_TRUE(rig.br.ok()) << rig.br.status();
  ASSERT_TRUE(never.ok()) << never.status();
  (*rig.br)->PrepareRecv(rig.ring.Sqe(), pairs.server[0]);
  (*never)->PrepareRecv(rig.ring.Sqe(), pairs.server[1]);
  using testing_util::Contents;
  BufferChain queue(**rig.pool);
  const std::string msg(bs / 8, 'k');  // exactly copy_below: linked
  // More turns than the ring has ids: each linked buffer goes back.
  for (int i = 0; i < 40; ++i) {
    SendAndTake(rig.ring, **rig.br, pairs.client[0], msg, queue,
                /*refill=*/false);
    EXPECT_EQ((*rig.br)->available(), 16u) << i;  // the id lent again
    EXPECT_EQ((*rig.br)->copied(), 0u);
    ASSERT_EQ(queue.slice_count(), 1u);
    EXPECT_EQ(queue.slice(0).offset(), 0u);  // a buffer of its own
    EXPECT_EQ(queue.slice(0).use_count(), 1u);
    EXPECT_EQ(queue.tail_room(), bs - msg.size());
    EXPECT_EQ(queue.pinned_bytes(), bs);
    EXPECT_EQ(Contents(queue), msg);
    EXPECT_EQ((*rig.pool)->Stats().in_use, 16u + 4u + 1u);  // lent, the queue's
    queue.Consume(queue.size());
    EXPECT_EQ(queue.pinned_bytes(), 0u);
    EXPECT_EQ((*rig.pool)->Stats().in_use, 16u + 4u);  // straight back
    EXPECT_EQ((*rig.br)->Refill(), 16u);
  }
  // The next bytes fill the linked buffer's room (copied, lent again).
  SendAndTake(rig.ring, **rig.br, pairs.client[0], msg, queue, /*refill=*/true);
  SendAndTake(rig.ring, **rig.br, pairs.client[0], "more", queue,
              /*refill=*/true);
  EXPECT_EQ(queue.slice_count(), 1u);
  EXPECT_EQ((*rig.br)->copied(), 1u);
  EXPECT_EQ(Contents(queue), msg + "more");
  queue.Clear();
  // copy_below 0: one byte is linked; so is a message into a chain
  // without a pool.
  BufferChain poolless;
  SendAndTake(rig.ring, **never, pairs.client[1], "1", queue, /*refill=*/false);
  EXPECT_EQ((*never)->available(), 4u);
  ASSERT_EQ(queue.slice_count(), 1u);
  EXPECT_EQ(queue.slice(0).use_count(), 1u);
  EXPECT_EQ(Contents(queue), "1");
  SendAndTake(rig.ring, **never, pairs.client[1], msg, poolless,
              /*refill=*/false);
  EXPECT_EQ((*never)->available(), 4u);
  ASSERT_EQ(poolless.slice_count(), 1u);
  EXPECT_EQ(poolless.slice(0).pool(), rig.pool->get());
  EXPECT_EQ(Contents(poolless), msg);
  EXPECT_EQ((*never)->copied(), 0u);
  queue.Clear();
  poolless.Clear();
  EXPECT_EQ((*rig.pool)->Stats().in_use, 16u + 4u);
  shutdown(pairs.client[0], SHUT_WR);
  shutdown(pairs.client[1], SHUT_WR);
  rig.br->reset();
  never->reset();
  rig.ring.DropCompletions();
  EXPECT_EQ((*rig.pool)->Stats().in_use, 0u);
}

}  // namespace
}  // namespace bufpool

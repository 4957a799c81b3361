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
#include "uring_test_util.h"

namespace bufpool {
namespace {

using testing_util::RandomBytes;
using testing_util::Ring;

using Bundles = ProvidedBufferRingOptions::Bundles;
using Incremental = ProvidedBufferRingOptions::Incremental;

// `n` connected TCP loopback pairs: client[i] <-> server[i].
struct Pairs {
  std::vector<int> client, server;
  ~Pairs() {
    for (int fd : client) close(fd);
    for (int fd : server) close(fd);
  }
};

void MakePairs(size_t n, Pairs* out) {
  rlimit lim{};
  getrlimit(RLIMIT_NOFILE, &lim);
  if (lim.rlim_cur < 2 * n + 64) {
    lim.rlim_cur = std::min<rlim_t>(lim.rlim_max, 2 * n + 64);
    setrlimit(RLIMIT_NOFILE, &lim);
  }
  sockaddr_in sa;
  const int lfd = testing_util::ListenOnLoopback(1024, &sa);
  ASSERT_GE(lfd, 0);
  for (size_t i = 0; i < n; ++i) {
    const int c = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    ASSERT_GE(c, 0);
    ASSERT_EQ(connect(c, reinterpret_cast<sockaddr*>(&sa), sizeof(sa)), 0);
    const int s = accept4(lfd, nullptr, nullptr, SOCK_CLOEXEC);
    ASSERT_GE(s, 0);
    const int one = 1;
    setsockopt(c, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    out->client.push_back(c);
    out->server.push_back(s);
  }
  close(lfd);
}

bool WriteAll(int fd, const char* p, size_t n) {
  while (n > 0) {
    const ssize_t w = send(fd, p, n, MSG_NOSIGNAL);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return false;
    p += w;
    n -= static_cast<size_t>(w);
  }
  return true;
}

// Sends `msg` on `fd` and takes every completion of the ring's receive it
// makes into `q`, calling Refill() after each when `refill`.
void SendAndTake(Ring& ring, ProvidedBufferRing& br, int fd,
                 const std::string& msg, BufferChain& q, bool refill) {
  ASSERT_TRUE(WriteAll(fd, msg.data(), msg.size()));
  size_t got = 0;
  while (got < msg.size()) {
    ASSERT_GE(io_uring_submit_and_wait(ring.get(), 1), 0);
    io_uring_cqe* cqe;
    ASSERT_EQ(io_uring_peek_cqe(ring.get(), &cqe), 0);
    ASSERT_GT(cqe->res, 0);
    got += static_cast<size_t>(cqe->res);
    absl::Status s = br.Take(*cqe, q);
    io_uring_cqe_seen(ring.get(), cqe);
    ASSERT_TRUE(s.ok()) << s;
    if (refill) br.Refill();
  }
}

struct LoadOptions {
  size_t connections = 1;
  size_t bytes_per_connection = 64 * 1024;
  size_t max_message = 3 * 4096;  // random message sizes in [min, max]
  size_t min_message = 1;
  ProvidedBufferRingOptions ring;
  PoolOptions pool;
  // Taken chains are held this many loop turns before being dropped (0:
  // dropped at once), so the pool can run dry.
  size_t hold_turns = 0;
  // Chains are handed to another thread, which drops them.
  bool release_elsewhere = false;
  // Pool buffers with a slot below this are kept out of the ring's reach.
  uint32_t reserve_below = 0;
};

struct LoadResult {
  uint64_t enobufs = 0;
  size_t most_slices = 0;  // in one Take()
  uint32_t lowest_slot = 0xffffffffu;
  bool bundles = false;
  bool incremental = false;
  // Slices that start inside their buffer (a buffer serving several
  // completions, in incremental mode).
  size_t inner_slices = 0;
};

// Clients send random messages (one thread writes them all, then closes);
// the ring's thread receives them with multishot receives and checks every
// byte; ENOBUFS parks a connection until ShouldRearm().
void RunLoad(const LoadOptions& o, LoadResult* result) {
  auto pool = BufferPool::Create(o.pool);
  ASSERT_TRUE(pool.ok()) << pool.status();
  std::vector<Buffer> reserved;
  if (o.reserve_below != 0) {
    std::vector<Buffer> all((*pool)->capacity());
    all.resize((*pool)->TryAcquireBulk(absl::MakeSpan(all)));
    for (Buffer& b : all) {
      if (b.slot() < o.reserve_below) reserved.push_back(std::move(b));
    }
  }
  Ring ring;
  ASSERT_TRUE(ring.ok());
  Pairs pairs;
  MakePairs(o.connections, &pairs);
  if (testing::Test::HasFatalFailure()) return;

  std::mt19937 rng(static_cast<uint32_t>(o.connections * 7919 + 1));
  std::vector<std::string> sent(o.connections);
  for (std::string& s : sent) s = RandomBytes(o.bytes_per_connection, rng);
  std::thread writer([&] {
    std::mt19937 r(99);
    std::vector<size_t> at(o.connections, 0);
    size_t left = o.connections;
    while (left > 0) {
      for (size_t i = 0; i < o.connections; ++i) {
        if (at[i] == sent[i].size()) continue;
        const size_t n = std::min<size_t>(
            o.min_message + r() % (o.max_message - o.min_message + 1),
            sent[i].size() - at[i]);
        if (!WriteAll(pairs.client[i], sent[i].data() + at[i], n)) return;
        at[i] += n;
        if (at[i] == sent[i].size()) {
          shutdown(pairs.client[i], SHUT_WR);
          --left;
        }
      }
    }
  });

  // The releasing thread, when asked for.
  std::mutex mu;
  std::condition_variable cv;
  std::deque<BufferChain> handed;
  bool writer_done = false;
  std::thread releaser;
  if (o.release_elsewhere) {
    releaser = std::thread([&] {
      std::unique_lock<std::mutex> l(mu);
      while (true) {
        cv.wait(l, [&] { return !handed.empty() || writer_done; });
        if (handed.empty()) return;
        BufferChain c = std::move(handed.front());
        handed.pop_front();
        l.unlock();
        c.Clear();  // the buffers go back to the pool on this thread
        l.lock();
      }
    });
  }

  {
    auto bufs = ProvidedBufferRing::Create(ring.get(), **pool, o.ring);
    ASSERT_TRUE(bufs.ok()) << bufs.status();
    ProvidedBufferRing& br = **bufs;
    result->bundles = br.bundles();
    result->incremental = br.incremental();
    std::vector<std::string> got(o.connections);
    std::vector<bool> armed(o.connections, false), eof(o.connections, false);
    std::vector<size_t> parked;
    std::deque<std::pair<size_t, BufferChain>> held;  // (turn taken, chain)
    auto arm = [&](size_t i) {
      io_uring_sqe* sqe = ring.Sqe();
      br.PrepareRecv(sqe, pairs.server[i]);
      io_uring_sqe_set_data64(sqe, i);
      armed[i] = true;
    };
    for (size_t i = 0; i < o.connections; ++i) arm(i);
    size_t open = o.connections;
    size_t turn = 0;
    while (open > 0) {
      ++turn;
      while (!held.empty() && held.front().first + o.hold_turns <= turn) {
        held.pop_front();
      }
      br.Refill();
      while (!parked.empty() && br.ShouldRearm()) {
        arm(parked.back());
        parked.pop_back();
      }
      if (parked.empty()) {
        ASSERT_GE(io_uring_submit_and_wait(ring.get(), 1), 0);
      } else {
        // Buffers released on another thread wake nothing here: poll.
        __kernel_timespec ts{0, 1000000};
        io_uring_cqe* first;
        io_uring_submit_and_wait_timeout(ring.get(), &first, 1, &ts, nullptr);
      }
      io_uring_cqe* cqe;
      unsigned head, seen = 0;
      io_uring_for_each_cqe(ring.get(), head, cqe) {
        ++seen;
        const size_t i = static_cast<size_t>(cqe->user_data);
        const bool more = (cqe->flags & IORING_CQE_F_MORE) != 0;
        if (!more) armed[i] = false;
        absl::StatusOr<BufferChain> c = br.Take(*cqe);
        if (c.ok() && c->empty()) {
          eof[i] = true;
          --open;
        } else if (c.ok()) {
          result->most_slices = std::max(result->most_slices, c->slice_count());
          for (size_t s = 0; s < c->slice_count(); ++s) {
            result->lowest_slot =
                std::min(result->lowest_slot, c->slice(s).slot());
            if (c->slice(s).offset() != 0) ++result->inner_slices;
          }
          std::string bytes(c->size(), '\0');
          c->CopyTo(absl::MakeSpan(reinterpret_cast<std::byte*>(bytes.data()),
                                   bytes.size()));
          got[i] += bytes;
          if (o.release_elsewhere) {
            {
              std::lock_guard<std::mutex> l(mu);
              handed.push_back(*std::move(c));
            }
            cv.notify_one();
          } else if (o.hold_turns > 0) {
            held.emplace_back(turn, *std::move(c));
          }
        } else if (c.status().code() == absl::StatusCode::kResourceExhausted) {
          if (!more) parked.push_back(i);
        } else {
          ADD_FAILURE() << "connection " << i << ": " << c.status();
          eof[i] = true;
          --open;
        }
        if (!armed[i] && !eof[i] &&
            std::find(parked.begin(), parked.end(), i) == parked.end()) {
          arm(i);
        }
      }
      io_uring_cq_advance(ring.get(), seen);
    }
    held.clear();
    for (size_t i = 0; i < o.connections; ++i) {
      ASSERT_EQ(got[i].size(), sent[i].size()) << "connection " << i;
      EXPECT_TRUE(got[i] == sent[i]) << "connection " << i << " bytes differ";
    }
    result->enobufs = br.enobufs();
    // Every multishot receive has ended (end of stream): the ring holds only
    // what it lent, which its destructor returns.
  }
  writer.join();
  if (releaser.joinable()) {
    {
      std::lock_guard<std::mutex> l(mu);
      writer_done = true;
    }
    cv.notify_one();
    releaser.join();
  }
  reserved.clear();
  EXPECT_EQ((*pool)->Stats().in_use, 0u);
}

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
  Ring ring;
  ASSERT_TRUE(ring.ok());
  auto pool = BufferPool::Create({.buffer_count = 64});
  ASSERT_TRUE(pool.ok());
  auto br = ProvidedBufferRing::Create(ring.get(), **pool, {});
  ASSERT_TRUE(br.ok()) << br.status();
  EXPECT_EQ((*br)->bundles(), (ring.get()->features & (1u << 14)) != 0);
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
  Ring ring;
  ASSERT_TRUE(ring.ok());
  auto pool = BufferPool::Create({.buffer_count = 256});
  ASSERT_TRUE(pool.ok());
  Pairs pairs;
  MakePairs(1, &pairs);
  BufferChain kept;
  {
    auto br = ProvidedBufferRing::Create(ring.get(), **pool,
                                         {.max_buffers = 64,
                                          .initial_buffers = 64,
                                          .copy_below = 0,
                                          .incremental = Incremental::kOff});
    ASSERT_TRUE(br.ok()) << br.status();
    EXPECT_EQ((*pool)->Stats().in_use, 64u);
    io_uring_sqe* sqe = ring.Sqe();
    (*br)->PrepareRecv(sqe, pairs.server[0]);
    ASSERT_TRUE(WriteAll(pairs.client[0], "first", 5));
    ASSERT_GE(io_uring_submit_and_wait(ring.get(), 1), 0);
    io_uring_cqe* cqe;
    ASSERT_EQ(io_uring_peek_cqe(ring.get(), &cqe), 0);
    absl::StatusOr<BufferChain> c = (*br)->Take(*cqe);
    io_uring_cqe_seen(ring.get(), cqe);
    ASSERT_TRUE(c.ok()) << c.status();
    kept = *std::move(c);
    // A second message the kernel takes a buffer for; its completion is
    // never taken: teardown must return that buffer too.
    ASSERT_TRUE(WriteAll(pairs.client[0], "second", 6));
    ASSERT_GE(io_uring_submit_and_wait(ring.get(), 1), 0);
    EXPECT_EQ((*br)->available(), 63u);
  }  // destroyed with the multishot receive still armed
  EXPECT_EQ((*pool)->Stats().in_use, 1u);  // the kept chain's buffer
  EXPECT_EQ(kept.size(), 5u);
  std::string bytes(5, '\0');
  kept.CopyTo(absl::MakeSpan(reinterpret_cast<std::byte*>(bytes.data()), 5));
  EXPECT_EQ(bytes, "first");
  kept.Clear();
  EXPECT_EQ((*pool)->Stats().in_use, 0u);
  // The receive, left without its group, ends; nothing names our buffers.
  shutdown(pairs.client[0], SHUT_WR);
  ring.DropCompletions();
}

TEST(ProvidedBufferRingTest, TakeReportsErrorsByTheirErrno) {
  Ring ring;
  ASSERT_TRUE(ring.ok());
  auto pool = BufferPool::Create({.buffer_count = 64});
  ASSERT_TRUE(pool.ok());
  auto br = ProvidedBufferRing::Create(ring.get(), **pool, {.group_id = 9});
  ASSERT_TRUE(br.ok()) << br.status();
  io_uring_cqe cqe{};
  cqe.res = -ENOBUFS;
  absl::StatusOr<BufferChain> c = (*br)->Take(cqe);
  EXPECT_EQ(c.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ((*br)->enobufs(), 1u);
  cqe.res = -ECANCELED;
  EXPECT_EQ((*br)->Take(cqe).status().code(), absl::StatusCode::kCancelled);
  cqe.res = -ECONNRESET;
  c = (*br)->Take(cqe);
  EXPECT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find("Connection reset"), std::string::npos)
      << c.status();
  cqe.res = 0;
  c = (*br)->Take(cqe);
  ASSERT_TRUE(c.ok());
  EXPECT_TRUE(c->empty());
  cqe.res = 100;  // bytes but no buffer
  EXPECT_EQ((*br)->Take(cqe).status().code(),
            absl::StatusCode::kFailedPrecondition);
  cqe.flags = IORING_CQE_F_BUFFER | (5000u << IORING_CQE_BUFFER_SHIFT);
  EXPECT_EQ((*br)->Take(cqe).status().code(),
            absl::StatusCode::kFailedPrecondition);  // an id never lent
}

TEST(ProvidedBufferRingTest, TakeIntoAppendsToTheCallersChain) {
  Ring ring;
  ASSERT_TRUE(ring.ok());
  auto pool = BufferPool::Create({.buffer_count = 64});
  ASSERT_TRUE(pool.ok());
  auto other = BufferPool::Create({.buffer_count = 4});  // the queue's pool
  ASSERT_TRUE(other.ok());
  Pairs pairs;
  MakePairs(1, &pairs);
  auto br = ProvidedBufferRing::Create(ring.get(), **pool,
                                       {.max_buffers = 16,
                                        .initial_buffers = 16,
                                        .bundles = Bundles::kOff,
                                        .copy_below = 0,
                                        .incremental = Incremental::kOff});
  ASSERT_TRUE(br.ok()) << br.status();
  BufferChain queue(**other);
  ASSERT_TRUE(queue.Append("head:").ok());
  io_uring_sqe* sqe = ring.Sqe();
  (*br)->PrepareRecv(sqe, pairs.server[0]);
  for (const char* msg : {"one", "two!"}) {
    ASSERT_TRUE(WriteAll(pairs.client[0], msg, strlen(msg)));
    ASSERT_GE(io_uring_submit_and_wait(ring.get(), 1), 0);
    io_uring_cqe* cqe;
    ASSERT_EQ(io_uring_peek_cqe(ring.get(), &cqe), 0);
    absl::Status s = (*br)->Take(*cqe, queue);
    io_uring_cqe_seen(ring.get(), cqe);
    ASSERT_TRUE(s.ok()) << s;
  }
  EXPECT_EQ((*br)->available(), 14u);
  EXPECT_EQ(queue.size(), 12u);
  EXPECT_EQ(queue.slice_count(), 3u);  // linked, not copied
  std::string bytes(12, '\0');
  queue.CopyTo(absl::MakeSpan(reinterpret_cast<std::byte*>(bytes.data()), 12));
  EXPECT_EQ(bytes, "head:onetwo!");
  EXPECT_EQ((*pool)->Stats().in_use, 16u);  // 14 lent + 2 in the queue

  // Errors and end of stream leave the queue as it was.
  io_uring_cqe fake{};
  for (int res : {-ENOBUFS, -ECONNRESET, 0}) {
    fake.res = res;
    absl::Status s = (*br)->Take(fake, queue);
    EXPECT_EQ(s.ok(), res == 0) << res << ": " << s;
    EXPECT_EQ(queue.size(), 12u) << res;
  }
  fake.res = 7;
  fake.flags = IORING_CQE_F_BUFFER | (9999u << IORING_CQE_BUFFER_SHIFT);
  EXPECT_EQ((*br)->Take(fake, queue).code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(queue.size(), 12u);

  queue.Clear();
  EXPECT_EQ((*pool)->Stats().in_use, 14u);
  EXPECT_EQ((*br)->Refill(), 16u);
  shutdown(pairs.client[0], SHUT_WR);
  br->reset();
  ring.DropCompletions();
}

TEST(ProvidedBufferRingTest, BadOptionsAndTakenGroupsAreRefused) {
  Ring ring;
  ASSERT_TRUE(ring.ok());
  auto pool = BufferPool::Create({.buffer_count = 64});
  ASSERT_TRUE(pool.ok());
  auto bad =
      ProvidedBufferRing::Create(ring.get(), **pool, {.max_buffers = 40000});
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  // More than the pool has (see also budget_test).
  bad = ProvidedBufferRing::Create(ring.get(), **pool, {.max_buffers = 65});
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kResourceExhausted);
  auto first = ProvidedBufferRing::Create(ring.get(), **pool,
                                          {.group_id = 4, .max_buffers = 16});
  ASSERT_TRUE(first.ok()) << first.status();
  auto second = ProvidedBufferRing::Create(ring.get(), **pool,
                                           {.group_id = 4, .max_buffers = 16});
  ASSERT_FALSE(second.ok());
  EXPECT_NE(second.status().message().find("already registered"),
            std::string::npos)
      << second.status();
}

TEST(ProvidedBufferRingTest, StartsSmallAndGrowsWhileRunningLow) {
  Ring ring;
  ASSERT_TRUE(ring.ok());
  auto pool = BufferPool::Create({.buffer_count = 1024});
  ASSERT_TRUE(pool.ok());
  auto br = ProvidedBufferRing::Create(
      ring.get(), **pool, {.max_buffers = 256, .initial_buffers = 16});
  ASSERT_TRUE(br.ok()) << br.status();
  EXPECT_EQ((*br)->available(), 16u);
  EXPECT_EQ((*br)->Refill(), 16u);  // nothing needed: unchanged
  EXPECT_EQ((*br)->target(), 16u);
  io_uring_cqe cqe{};
  cqe.res = -ENOBUFS;  // the ring ran dry: the next Refill() grows it
  EXPECT_FALSE((*br)->Take(cqe).ok());
  EXPECT_EQ((*br)->Refill(), 32u);
  EXPECT_EQ((*br)->target(), 32u);
  EXPECT_EQ((*br)->rearm_threshold(), 8u);  // a quarter of the most held
  EXPECT_TRUE((*br)->ShouldRearm());
}

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
  std::vector<int> reader(conns), writer(conns);
  for (size_t i = 0; i < conns; ++i) {
    int sv[2];
    ASSERT_EQ(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
    reader[i] = sv[0];
    writer[i] = sv[1];
  }
  std::string line = testing_util::TrickleLine(kLine);
  line.back() = '\n';
  std::atomic<bool> stop{false};
  std::thread trickler = testing_util::StartTrickler(
      conns, line,
      [&writer](size_t i, const char* byte) {
        return WriteAll(writer[i], byte, 1);
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
      (*br)->PrepareRecv(sqe, reader[i]);
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
    for (size_t i = 0; i < conns; ++i) {
      ASSERT_EQ(queue[i].size(), kLine) << "connection " << i;
      EXPECT_LE(queue[i].pinned_bytes(), kLine + 2 * bs) << "connection " << i;
      std::string got(kLine, '\0');
      queue[i].CopyTo(
          absl::MakeSpan(reinterpret_cast<std::byte*>(got.data()), kLine));
      EXPECT_TRUE(got == line) << "connection " << i << " bytes differ";
    }
    // Every receive is still armed: cancel them by closing, then drain.
    for (size_t i = 0; i < conns; ++i) shutdown(writer[i], SHUT_WR);
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
  for (size_t i = 0; i < conns; ++i) {
    close(reader[i]);
    close(writer[i]);
  }
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
  Ring ring;
  ASSERT_TRUE(ring.ok());
  auto pool = BufferPool::Create({.buffer_count = 64});
  ASSERT_TRUE(pool.ok());
  const size_t bs = (*pool)->buffer_size();
  auto bad =
      ProvidedBufferRing::Create(ring.get(), **pool, {.copy_below = bs + 1});
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  Pairs pairs;
  MakePairs(2, &pairs);
  auto br = ProvidedBufferRing::Create(ring.get(), **pool,
                                       {.max_buffers = 16,
                                        .initial_buffers = 16,
                                        .bundles = Bundles::kOff,
                                        .incremental = Incremental::kOff});
  ASSERT_TRUE(br.ok()) << br.status();
  EXPECT_EQ((*br)->copy_below(), bs / 8);
  BufferChain queue(**pool), other(**pool);
  (*br)->PrepareRecv(ring.Sqe(), pairs.server[0]);
  (*br)->PrepareRecv(ring.Sqe(), pairs.server[1]);
  auto take = [&](int conn, const std::string& msg, BufferChain& q) {
    SendAndTake(ring, **br, pairs.client[conn], msg, q, /*refill=*/false);
  };
  take(0, "tiny", queue);  // packed: a slice of the pack buffer
  EXPECT_EQ((*br)->copied(), 1u);
  EXPECT_EQ((*br)->available(), 16u);       // lent again, no Refill()
  EXPECT_EQ((*pool)->Stats().in_use, 17u);  // 16 lent, the pack buffer
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
  EXPECT_EQ((*pool)->Stats().in_use, 17u);
  take(0, "!", queue);  // not adjacent any more: a second slice
  EXPECT_EQ(queue.slice_count(), 2u);
  EXPECT_EQ(testing_util::Contents(queue), "tinymore!");
  EXPECT_EQ((*pool)->Stats().in_use, 17u);
  // Emptied, a chain pins nothing; the pack buffer, its slices all gone,
  // is filled again from its start once it is full (no fresh buffer).
  queue.Consume(queue.size());
  other.Consume(other.size());
  EXPECT_EQ(queue.slice_count(), 0u);
  EXPECT_EQ(queue.pinned_bytes(), 0u);
  EXPECT_EQ((*pool)->Stats().in_use, 17u);
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
  EXPECT_EQ((*pool)->Stats().in_use, 17u);
  take(0, "again", queue);
  EXPECT_EQ(queue.slice(0).data() - queue.slice(0).offset(), pack);
  EXPECT_EQ((*pool)->Stats().in_use, 17u);
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
  const uint64_t copied = (*br)->copied();
  take(0, std::string(bs, 'L'), queue);
  EXPECT_EQ((*br)->copied(), copied);
  ASSERT_EQ(queue.slice_count(), 1u);
  EXPECT_EQ(queue.slice(0).use_count(), 1u);
  EXPECT_EQ(queue.slice(0).view(), std::string(bs, 'L'));
  queue.Clear();
  shutdown(pairs.client[0], SHUT_WR);
  shutdown(pairs.client[1], SHUT_WR);
  br->reset();
  ring.DropCompletions();
  EXPECT_EQ((*pool)->Stats().in_use, 0u);  // the pack buffer too
}

}  // namespace
}  // namespace bufpool

namespace bufpool {
namespace {

// A chain whose pack slice ends where the full pack buffer ends gets a
// buffer of its own for its next bytes, never a slice that runs on into the
// next pool buffer (the next pack buffer is often that one, adjacent in the
// region). Every slice stays inside its buffer, and the bytes are intact.
TEST(ProvidedBufferRingCopyTest, APackSliceNeverRunsIntoTheNextBuffer) {
  Ring ring;
  ASSERT_TRUE(ring.ok());
  auto pool = BufferPool::Create({.buffer_count = 64, .cache_size = 0});
  ASSERT_TRUE(pool.ok());
  const size_t bs = (*pool)->buffer_size();
  Pairs pairs;
  MakePairs(1, &pairs);
  auto br = ProvidedBufferRing::Create(ring.get(), **pool,
                                       {.max_buffers = 16,
                                        .initial_buffers = 16,
                                        .bundles = Bundles::kOff,
                                        .copy_below = bs,
                                        .incremental = Incremental::kOff});
  ASSERT_TRUE(br.ok()) << br.status();
  (*br)->PrepareRecv(ring.Sqe(), pairs.server[0]);
  BufferChain q(**pool);
  std::string model;
  auto take = [&](const std::string& msg) {
    model += msg;
    SendAndTake(ring, **br, pairs.client[0], msg, q, /*refill=*/true);
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
  EXPECT_EQ(q.slice(q.slice_count() - 1).use_count(), 1u);  // its own
  q.Clear();
  shutdown(pairs.client[0], SHUT_WR);
  br->reset();
  ring.DropCompletions();
  EXPECT_EQ((*pool)->Stats().in_use, 0u);
}

// What a server's connections pin while idle or holding a short partial
// command (the bounds): 200 connections that each received one
// 12-byte request and consumed it pin no buffer between them; 200 that
// each hold a 100-byte half command share pack buffers: about their bytes.
TEST(ProvidedBufferRingCopyTest,
     IdleAndHalfCommandConnectionsPinAboutTheirBytes) {
  constexpr size_t kConns = 200;
  Ring ring;
  ASSERT_TRUE(ring.ok());
  auto pool = BufferPool::Create({.buffer_count = 512, .cache_size = 0});
  ASSERT_TRUE(pool.ok());
  const size_t bs = (*pool)->buffer_size();
  Pairs pairs;
  ASSERT_NO_FATAL_FAILURE(MakePairs(kConns, &pairs));
  auto br = ProvidedBufferRing::Create(ring.get(), **pool,
                                       {.max_buffers = 64,
                                        .initial_buffers = 64,
                                        .bundles = Bundles::kOff,
                                        .incremental = Incremental::kOff});
  ASSERT_TRUE(br.ok()) << br.status();
  std::vector<BufferChain> in;
  for (size_t i = 0; i < kConns; ++i) {
    in.emplace_back(**pool);
    (*br)->PrepareRecv(ring.Sqe(), pairs.server[i]);
  }
  for (size_t i = 0; i < kConns; ++i) {
    SendAndTake(ring, **br, pairs.client[i], "*1\r\n$4\r\nPING\r\n", in[i],
                /*refill=*/true);
    in[i].Consume(in[i].size());  // the request answered
  }
  // Idle: the ring's lent buffers and at most its pack buffer.
  EXPECT_LE((*pool)->Stats().in_use, (*br)->available() + 1);
  const std::string half =
      "*3\r\n$3\r\nSET\r\n$3\r\nkey\r\n$200\r\n" + std::string(100 - 28, 'v');
  ASSERT_EQ(half.size(), 100u);
  for (size_t i = 0; i < kConns; ++i) {
    SendAndTake(ring, **br, pairs.client[i], half, in[i], /*refill=*/true);
  }
  const size_t pinned = (*pool)->Stats().in_use - (*br)->available();
  // 100 bytes each, packed: kConns * 100 bytes fill this many buffers.
  EXPECT_LE(pinned, (kConns * 100 + bs - 1) / bs + 1);
  EXPECT_LE(pinned * bs / kConns, 1024u);  // the goal: <= 1 KiB each
  for (size_t i = 0; i < kConns; ++i) {
    ASSERT_EQ(testing_util::Contents(in[i]), half) << i;
  }
  in.clear();
  for (int fd : pairs.client) shutdown(fd, SHUT_WR);
  br->reset();
  ring.DropCompletions();
  EXPECT_EQ((*pool)->Stats().in_use, 0u);
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
  Ring ring;
  ASSERT_TRUE(ring.ok());
  auto pool = BufferPool::Create({.buffer_count = 256});
  ASSERT_TRUE(pool.ok());
  Pairs pairs;
  MakePairs(1, &pairs);
  auto br = ProvidedBufferRing::Create(
      ring.get(), **pool,
      {.max_buffers = 64, .initial_buffers = 64, .bundles = bundles});
  ASSERT_TRUE(br.ok()) << br.status();
  if (bundles == Bundles::kProbe && !(*br)->bundles()) {
    GTEST_SKIP() << "no bundles in this kernel";
  }
  const std::string data(40000, 'q');
  ASSERT_TRUE(WriteAll(pairs.client[0], data.data(), data.size()));
  constexpr size_t kCap = 9000;  // two buffers and a part
  io_uring_sqe* sqe = ring.Sqe();
  (*br)->PrepareRecv(sqe, pairs.server[0],
                     {.multishot = multishot, .max_bytes = kCap});
  BufferChain got(**pool);
  bool more = true;
  size_t completions = 0;
  while (more) {
    ASSERT_GE(io_uring_submit_and_wait(ring.get(), 1), 0);
    io_uring_cqe* cqe;
    ASSERT_EQ(io_uring_peek_cqe(ring.get(), &cqe), 0);
    more = (cqe->flags & IORING_CQE_F_MORE) != 0;
    ASSERT_GE(cqe->res, 0);
    absl::Status s = (*br)->Take(*cqe, got);
    io_uring_cqe_seen(ring.get(), cqe);
    ASSERT_TRUE(s.ok()) << s;
    ++completions;
    if (!multishot) {
      EXPECT_FALSE(more);
    }
  }
  const size_t bs = (*pool)->buffer_size();
  const bool bundle = (*br)->bundles();
  if (multishot && (*br)->multishot_cap()) {
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
  Ring ring;
  ASSERT_TRUE(ring.ok());
  auto pool = BufferPool::Create({.buffer_count = 16});
  ASSERT_TRUE(pool.ok());
  auto br = ProvidedBufferRing::Create(ring.get(), **pool, {});
  ASSERT_TRUE(br.ok());
  utsname u{};
  ASSERT_EQ(uname(&u), 0);
  int major = 0, minor = 0;
  ASSERT_EQ(sscanf(u.release, "%d.%d", &major, &minor), 2);
  EXPECT_EQ((*br)->multishot_cap(), major > 6 || (major == 6 && minor >= 17))
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
  Ring ring;
  ASSERT_TRUE(ring.ok());
  auto pool = BufferPool::Create({.buffer_count = 16});
  ASSERT_TRUE(pool.ok());
  Pairs pairs;
  MakePairs(1, &pairs);
  auto br = ProvidedBufferRing::Create(ring.get(), **pool,
                                       {.max_buffers = 4,
                                        .initial_buffers = 4,
                                        .bundles = Bundles::kOff,
                                        .incremental = Incremental::kOff});
  ASSERT_TRUE(br.ok()) << br.status();
  (*br)->PrepareRecv(ring.Sqe(), pairs.server[0]);
  auto next = [&]() -> io_uring_cqe* {
    io_uring_cqe* cqe = nullptr;
    EXPECT_GE(io_uring_submit_and_wait(ring.get(), 1), 0);
    EXPECT_EQ(io_uring_peek_cqe(ring.get(), &cqe), 0);
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
        visited = (*br)->Visit(*cqe, [&](absl::Span<const std::byte> b) {
          got.append(reinterpret_cast<const char*>(b.data()), b.size());
          if (i % 3 == 2) throw std::runtime_error("handler failed");
        });
      } catch (const std::runtime_error&) {
        visited = i % 3 == 2;
      }
      EXPECT_TRUE(visited);
      io_uring_cqe_seen(ring.get(), cqe);
      (*br)->Refill();
    }
    EXPECT_EQ(got, msg) << "message " << i;
    // The ring's four buffers only: none went to a chain or the pool.
    EXPECT_EQ((*pool)->Stats().in_use, 4u);
    EXPECT_EQ((*br)->available(), 4u);
  }
  shutdown(pairs.client[0], SHUT_WR);
  io_uring_cqe* eof = next();
  ASSERT_NE(eof, nullptr);
  ASSERT_EQ(eof->res, 0);
  EXPECT_FALSE((*br)->Visit(*eof, [](absl::Span<const std::byte>) {
    ADD_FAILURE() << "called for the end of stream";
  }));
  BufferChain rest(**pool);
  EXPECT_TRUE((*br)->Take(*eof, rest).ok());
  EXPECT_TRUE(rest.empty());
  io_uring_cqe_seen(ring.get(), eof);
  br->reset();
  ring.DropCompletions();
  EXPECT_EQ((*pool)->Stats().in_use, 0u);
}

// Datagrams, the case Visit() is for, on a ring without incremental mode
// (which would put a datagram into a buffer's rest and cut it short): 200
// of random lengths up to a buffer each arrive whole, through four buffers.
TEST(VisitTest, DatagramsArriveWholeThroughFourBuffers) {
  Ring ring;
  ASSERT_TRUE(ring.ok());
  auto pool = BufferPool::Create({.buffer_count = 16});
  ASSERT_TRUE(pool.ok());
  int fds[2];
  ASSERT_EQ(socketpair(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0, fds), 0);
  auto br = ProvidedBufferRing::Create(ring.get(), **pool,
                                       {.max_buffers = 4,
                                        .initial_buffers = 4,
                                        .incremental = Incremental::kOff});
  ASSERT_TRUE(br.ok()) << br.status();
  (*br)->PrepareRecv(ring.Sqe(), fds[1]);
  std::mt19937 rng(11);
  for (int i = 0; i < 200; ++i) {
    const std::string msg =
        RandomBytes(1 + rng() % (*pool)->buffer_size(), rng);
    ASSERT_EQ(send(fds[0], msg.data(), msg.size(), 0),
              static_cast<ssize_t>(msg.size()));
    ASSERT_GE(io_uring_submit_and_wait(ring.get(), 1), 0);
    io_uring_cqe* cqe;
    ASSERT_EQ(io_uring_peek_cqe(ring.get(), &cqe), 0);
    const bool more = (cqe->flags & IORING_CQE_F_MORE) != 0;
    std::string got;
    EXPECT_TRUE((*br)->Visit(
        *cqe,
        [&](absl::Span<const std::byte> b) {
          got.assign(reinterpret_cast<const char*>(b.data()), b.size());
        }))
        << "datagram " << i << ", res " << cqe->res;
    io_uring_cqe_seen(ring.get(), cqe);
    EXPECT_EQ(got, msg) << "datagram " << i;
    (*br)->Refill();
    if (!more) (*br)->PrepareRecv(ring.Sqe(), fds[1]);
  }
  EXPECT_EQ((*pool)->Stats().in_use, 4u);
  close(fds[0]);
  close(fds[1]);
  br->reset();
  ring.DropCompletions();
  EXPECT_EQ((*pool)->Stats().in_use, 0u);
}

TEST(VisitTest, AnIncrementalRingsCompletionsGoToTake) {
  Ring ring;
  ASSERT_TRUE(ring.ok());
  auto pool = BufferPool::Create({.buffer_count = 16});
  ASSERT_TRUE(pool.ok());
  auto br = ProvidedBufferRing::Create(ring.get(), **pool,
                                       {.max_buffers = 4,
                                        .initial_buffers = 4,
                                        .incremental = Incremental::kProbe});
  ASSERT_TRUE(br.ok()) << br.status();
  if (!(*br)->incremental()) GTEST_SKIP() << "no incremental rings here";
  Pairs pairs;
  MakePairs(1, &pairs);
  (*br)->PrepareRecv(ring.Sqe(), pairs.server[0]);
  ASSERT_TRUE(WriteAll(pairs.client[0], "abc", 3));
  ASSERT_GE(io_uring_submit_and_wait(ring.get(), 1), 0);
  io_uring_cqe* cqe;
  ASSERT_EQ(io_uring_peek_cqe(ring.get(), &cqe), 0);
  ASSERT_EQ(cqe->res, 3);
  EXPECT_FALSE((*br)->Visit(*cqe, [](absl::Span<const std::byte>) {
    ADD_FAILURE() << "called on an incremental ring";
  }));
  BufferChain got(**pool);
  ASSERT_TRUE((*br)->Take(*cqe, got).ok());
  io_uring_cqe_seen(ring.get(), cqe);
  EXPECT_EQ(testing_util::Contents(got), "abc");
  got.Clear();
  shutdown(pairs.client[0], SHUT_WR);
  br->reset();
  ring.DropCompletions();
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
// armed on the server end (fds[1]) of a datagram socketpair; TearDown()
// closes the pair, destroys the ring and checks that every buffer is back.
class TakeBufferTest : public testing::Test {
 protected:
  void Open(uint32_t n) {
    ASSERT_TRUE(ring.ok());
    pool = BufferPool::Create({.buffer_count = 16});
    ASSERT_TRUE(pool.ok()) << pool.status();
    ASSERT_EQ(socketpair(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0, fds), 0);
    br = ProvidedBufferRing::Create(ring.get(), **pool,
                                    {.max_buffers = n,
                                     .initial_buffers = n,
                                     .incremental = Incremental::kOff});
    ASSERT_TRUE(br.ok()) << br.status();
    (*br)->PrepareRecv(ring.Sqe(), fds[1]);
  }
  // Sends one datagram to the ring's end of the pair.
  bool Send(std::string_view msg) {
    return send(fds[0], msg.data(), msg.size(), 0) ==
           static_cast<ssize_t>(msg.size());
  }
  void TearDown() override {
    if (fds[0] < 0) return;  // Open() not called, or failed before the pair
    close(fds[0]);
    close(fds[1]);
    if (br.ok()) br->reset();
    ring.DropCompletions();
    EXPECT_EQ((*pool)->Stats().in_use, 0u);
  }

  Ring ring;
  absl::StatusOr<std::unique_ptr<BufferPool>> pool =
      absl::FailedPreconditionError("Open() not called");
  int fds[2] = {-1, -1};
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
    ASSERT_EQ(send(fds[0], msg.data(), msg.size(), 0),
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
    if (!more) (*br)->PrepareRecv(ring.Sqe(), fds[1]);
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
    if (!(c->flags & IORING_CQE_F_MORE)) (*br)->PrepareRecv(ring.Sqe(), fds[1]);
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
    if (ended) (*br)->PrepareRecv(ring.Sqe(), fds[1]);
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
  if (ended) (*br)->PrepareRecv(ring.Sqe(), fds[1]);
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
  (*br)->PrepareRecv(ring.Sqe(), fds[1]);  // "three" is still queued
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

// Submits, waits for one completion and takes it into `out`: the
// completion's res and flags, and Take()'s status.
struct TakenCompletion {
  int res = 0;
  uint32_t flags = 0;
  absl::Status status;
};
void SubmitAndTakeOne(Ring& ring, ProvidedBufferRing& br, BufferChain& out,
                      TakenCompletion* taken) {
  ASSERT_GE(io_uring_submit_and_wait(ring.get(), 1), 0);
  io_uring_cqe* cqe;
  ASSERT_EQ(io_uring_peek_cqe(ring.get(), &cqe), 0);
  taken->res = cqe->res;
  taken->flags = cqe->flags;
  taken->status = br.Take(*cqe, out);
  io_uring_cqe_seen(ring.get(), cqe);
}

// An incremental ring would cut a datagram short at the end of the current
// buffer, silently: PrepareRecv() makes no receive from a message socket,
// Take() says why, and the datagrams stay in the socket, whole, for a ring
// without incremental mode. Stream sockets are received as before.
TEST(IncrementalTest, MessageSocketsAreRefusedNotTruncated) {
  Ring ring;
  ASSERT_TRUE(ring.ok());
  auto pool = BufferPool::Create({.buffer_count = 16});
  ASSERT_TRUE(pool.ok());
  auto inc = ProvidedBufferRing::Create(ring.get(), **pool,
                                        {.group_id = 1,
                                         .max_buffers = 4,
                                         .initial_buffers = 4,
                                         .incremental = Incremental::kOn});
  if (!inc.ok()) GTEST_SKIP() << "no incremental rings: " << inc.status();
  auto plain = ProvidedBufferRing::Create(ring.get(), **pool,
                                          {.group_id = 2,
                                           .max_buffers = 4,
                                           .initial_buffers = 4,
                                           .incremental = Incremental::kOff});
  ASSERT_TRUE(plain.ok()) << plain.status();
  const size_t bs = (*pool)->buffer_size();
  for (int type : {SOCK_SEQPACKET, SOCK_DGRAM}) {
    SCOPED_TRACE(type == SOCK_DGRAM ? "SOCK_DGRAM" : "SOCK_SEQPACKET");
    int fds[2];
    ASSERT_EQ(socketpair(AF_UNIX, type | SOCK_CLOEXEC, 0, fds), 0);
    // Two datagrams that together overrun one buffer.
    const std::string first(bs / 2 + 100, 'a'), second(bs / 2 + 100, 'b');
    for (const std::string* m : {&first, &second}) {
      ASSERT_EQ(send(fds[0], m->data(), m->size(), 0),
                static_cast<ssize_t>(m->size()));
    }
    const absl::Status checked = (*inc)->CheckSocket(fds[1]);
    EXPECT_EQ(checked.code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_NE(checked.message().find("kOff"), absl::string_view::npos)
        << checked;
    EXPECT_TRUE((*plain)->CheckSocket(fds[1]).ok());
    (*inc)->PrepareRecv(ring.Sqe(), fds[1]);
    BufferChain out(**pool);
    TakenCompletion t;
    ASSERT_NO_FATAL_FAILURE(SubmitAndTakeOne(ring, **inc, out, &t));
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
    io_uring_sqe* sqe = ring.Sqe();
    (*inc)->PrepareRecv(sqe, fds[1]);
    sqe->ioprio |= IORING_RECVSEND_POLL_FIRST;
    ASSERT_NO_FATAL_FAILURE(SubmitAndTakeOne(ring, **inc, out, &t));
    ASSERT_LT(t.res, 0);
    EXPECT_FALSE(t.status.ok());
    EXPECT_NE(t.status.message().find("CheckSocket"), absl::string_view::npos)
        << t.status;
    EXPECT_TRUE(out.empty());
    // Both datagrams are still there, whole, for the plain ring.
    for (const std::string* m : {&first, &second}) {
      (*plain)->PrepareRecv(ring.Sqe(), fds[1], {.multishot = false});
      ASSERT_NO_FATAL_FAILURE(SubmitAndTakeOne(ring, **plain, out, &t));
      ASSERT_EQ(t.res, static_cast<int>(m->size()));
      ASSERT_TRUE(t.status.ok()) << t.status;
      EXPECT_EQ(testing_util::Contents(out), *m);
      out.Clear();
      (*plain)->Refill();
    }
    close(fds[0]);
    close(fds[1]);
  }
  // A stream socket on the incremental ring is received as before.
  int s[2];
  ASSERT_EQ(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, s), 0);
  EXPECT_TRUE((*inc)->CheckSocket(s[1]).ok());
  ASSERT_EQ(send(s[0], "stream", 6, 0), 6);
  (*inc)->PrepareRecv(ring.Sqe(), s[1], {.multishot = false});
  BufferChain out(**pool);
  TakenCompletion t;
  ASSERT_NO_FATAL_FAILURE(SubmitAndTakeOne(ring, **inc, out, &t));
  EXPECT_EQ(t.res, 6);
  ASSERT_TRUE(t.status.ok()) << t.status;
  EXPECT_EQ(testing_util::Contents(out), "stream");
  out.Clear();
  close(s[0]);
  close(s[1]);
  inc->reset();
  plain->reset();
  ring.DropCompletions();
  EXPECT_EQ((*pool)->Stats().in_use, 0u);
}

// RecvOptions::socket_checked with a registered file: `fd` indexes the
// ring's registered files, so PrepareRecv() must not ask the process
// descriptor of that number its type. Here that number is a datagram socket's
// in the process, while the registered file at the index is a stream socket:
// received.
TEST(IncrementalTest, FixedFileReceivesSkipTheProcessDescriptorsType) {
  Ring ring;
  ASSERT_TRUE(ring.ok());
  auto pool = BufferPool::Create({.buffer_count = 16});
  ASSERT_TRUE(pool.ok());
  auto inc = ProvidedBufferRing::Create(ring.get(), **pool,
                                        {.max_buffers = 4,
                                         .initial_buffers = 4,
                                         .incremental = Incremental::kOn});
  if (!inc.ok()) GTEST_SKIP() << "no incremental rings: " << inc.status();
  int dgram[2], stream[2];
  ASSERT_EQ(socketpair(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0, dgram), 0);
  ASSERT_EQ(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, stream), 0);
  const int index = dgram[1];
  std::vector<int> files(static_cast<size_t>(index) + 1, -1);
  files[static_cast<size_t>(index)] = stream[1];
  ASSERT_EQ(io_uring_register_files(ring.get(), files.data(),
                                    static_cast<unsigned>(files.size())),
            0);
  ASSERT_EQ(send(stream[0], "fixed", 5, 0), 5);
  ASSERT_TRUE((*inc)->CheckSocket(stream[1]).ok());
  io_uring_sqe* sqe = ring.Sqe();
  (*inc)->PrepareRecv(sqe, index, {.multishot = false, .socket_checked = true});
  sqe->flags |= IOSQE_FIXED_FILE;
  BufferChain out(**pool);
  TakenCompletion t;
  ASSERT_NO_FATAL_FAILURE(SubmitAndTakeOne(ring, **inc, out, &t));
  ASSERT_EQ(t.res, 5);
  ASSERT_TRUE(t.status.ok()) << t.status;
  EXPECT_EQ(testing_util::Contents(out), "fixed");
  out.Clear();
  io_uring_unregister_files(ring.get());
  for (int fd : {dgram[0], dgram[1], stream[0], stream[1]}) close(fd);
  inc->reset();
  ring.DropCompletions();
  EXPECT_EQ((*pool)->Stats().in_use, 0u);
}

TEST(IncrementalTest, ProbeMatchesTheKernel) {
  Ring ring;
  ASSERT_TRUE(ring.ok());
  auto pool = BufferPool::Create({.buffer_count = 256});
  ASSERT_TRUE(pool.ok());
  auto br = ProvidedBufferRing::Create(ring.get(), **pool, {.max_buffers = 64});
  ASSERT_TRUE(br.ok()) << br.status();
  utsname u{};
  ASSERT_EQ(uname(&u), 0);
  int major = 0, minor = 0;
  ASSERT_EQ(sscanf(u.release, "%d.%d", &major, &minor), 2);
  EXPECT_EQ((*br)->incremental(), major > 6 || (major == 6 && minor >= 12))
      << u.release;
  auto off = ProvidedBufferRing::Create(
      ring.get(), **pool,
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
    if (!armed) (*br)->PrepareRecv(ring.Sqe(), fds[1]);
    ASSERT_TRUE(Send(msg));
    io_uring_cqe* cqe = NextCompletion(ring);
    ASSERT_NE(cqe, nullptr);
    Buffer b;
    ASSERT_TRUE((*br)->TakeBuffer(*cqe, b));  // the ring's buffer leaves
    armed = cqe->flags & IORING_CQE_F_MORE;
    io_uring_cqe_seen(ring.get(), cqe);
    kept.push_back(std::move(b));
  }
  if (!armed) (*br)->PrepareRecv(ring.Sqe(), fds[1]);
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
    (*br)->PrepareRecv(ring.Sqe(), fds[1]);
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

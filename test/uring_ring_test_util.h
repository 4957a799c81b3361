// The load and connection helpers of the ProvidedBufferRing tests
// (uring_ring_test.cc, uring_ring_copy_test.cc, uring_ring_receive_test.cc):
// TCP loopback pairs, writes that finish, and a load of many connections
// through one ring, checked byte for byte.
#ifndef BUFPOOL_TEST_URING_RING_TEST_UTIL_H_
#define BUFPOOL_TEST_URING_RING_TEST_UTIL_H_

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

namespace bufpool::testing_util {

// `n` connected TCP loopback pairs: client[i] <-> server[i].
struct Pairs {
  std::vector<int> client, server;
  ~Pairs() {
    for (int fd : client) close(fd);
    for (int fd : server) close(fd);
  }
};

inline void MakePairs(size_t n, Pairs* out) {
  RaiseFileLimit(2 * n + 64);
  sockaddr_in sa;
  const UniqueFd lfd = testing_util::ListenOnLoopback(1024, &sa);
  ASSERT_TRUE(lfd.valid());
  for (size_t i = 0; i < n; ++i) {
    LoopbackConnection c = ConnectAndAccept(lfd.get(), sa);
    ASSERT_TRUE(c.server.valid());
    const int one = 1;
    setsockopt(c.client.get(), IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    out->client.push_back(c.client.release());
    out->server.push_back(c.server.release());
  }
}

inline bool WriteAll(int fd, const char* p, size_t n) {
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
inline void SendAndTake(Ring& ring, ProvidedBufferRing& br, int fd,
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
inline void RunLoad(const LoadOptions& o, LoadResult* result) {
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

// What most ProvidedBufferRing tests set up and take down: a Ring, a pool,
// and a ProvidedBufferRing of both. OpenPool() and OpenRing() assert that
// each was made; ExpectEveryBufferBack() gives the ring's buffers back,
// drops the completions left and expects every buffer back in the pool.
struct RingRig {
  Ring ring;
  absl::StatusOr<std::unique_ptr<BufferPool>> pool =
      absl::FailedPreconditionError("OpenPool() not called");
  absl::StatusOr<std::unique_ptr<ProvidedBufferRing>> br =
      absl::FailedPreconditionError("OpenRing() not called");

  void OpenPool(const PoolOptions& o) {
    ASSERT_TRUE(ring.ok());
    pool = BufferPool::Create(o);
    ASSERT_TRUE(pool.ok()) << pool.status();
  }
  void OpenRing(const ProvidedBufferRingOptions& o) {
    br = ProvidedBufferRing::Create(ring.get(), **pool, o);
    ASSERT_TRUE(br.ok()) << br.status();
  }
  void ExpectEveryBufferBack() {
    br->reset();
    ring.DropCompletions();
    EXPECT_EQ((*pool)->Stats().in_use, 0u);
  }
};

}  // namespace bufpool::testing_util

#endif  // BUFPOOL_TEST_URING_RING_TEST_UTIL_H_

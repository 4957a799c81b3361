// ReadFrom()/WriteTo() (bufpool/chain.h) on real socketpairs, TCP loopback
// and pipes, blocking and not, with slow, closing and resetting peers; and
// faults injected through the system-call seam (src/os/syscalls.h). SIGPIPE
// keeps its default action in this binary, so a write that raised it would kill
// the test. Every test ends with the pool's in_use back at 0.
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "bufpool/chain.h"
#include "bufpool/testing.h"
#include "gtest/gtest.h"
#include "os/socket.h"
#include "os/syscalls.h"
#include "test_util.h"

namespace bufpool {
namespace {

using testing_util::Contents;
using testing_util::Pipe;
using testing_util::RandomBytes;
using testing_util::SetNonBlocking;
using testing_util::SocketPair;
using testing_util::UniqueFd;

// Two connected ends, a() and b(), each closed at the end of the test.
struct Pair {
  UniqueFd ends[2];
  int a() const { return ends[0].get(); }
  int b() const { return ends[1].get(); }
};

class ChainIoTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_EQ(::signal(SIGPIPE, SIG_DFL), SIG_DFL);
    // Debian's Abseil is not TSan-instrumented: its strerror table is built
    // lazily on first use behind a once-flag TSan cannot see, so two threads
    // formatting their first errno message at once look like a race. Build
    // it here, before any test thread starts.
    (void)os::SocketError("warm-up", EAGAIN);
    auto pool = BufferPool::Create({.buffer_size = 4096,
                                    .buffer_count = 512,
                                    .huge_pages = HugePages::kNever,
                                    .populate = false,
                                    // TearDown() names any buffer left out
                                    // by where it was acquired.
                                    .track_holders = TrackHolders::kAll});
    ASSERT_TRUE(pool.ok()) << pool.status();
    pool_ = *std::move(pool);
  }
  void TearDown() override { EXPECT_TRUE(testing::NoHolders(*pool_)); }

  // Sends `data` from fd `from` with WriteTo (waiting when it would block)
  // and reads it at `to` with ReadFrom, on two threads; returns what arrived.
  std::string Transfer(int from, int to, const std::string& data,
                       size_t read_max, bool slow_reader) {
    std::thread writer([&] {
      // Ends the stream however the writing ends, so the reader stops: a
      // socket is shut down, a pipe's write end closed (the caller forgets
      // it).
      struct EndAtExit {
        int fd;
        ~EndAtExit() {
          if (::shutdown(fd, SHUT_WR) != 0) ::close(fd);
        }
      } at_exit{from};
      BufferChain out(*pool_);
      ASSERT_TRUE(out.Append(data).ok());
      while (!out.empty()) {
        absl::StatusOr<size_t> w = WriteTo(from, out);
        if (!w.ok()) {
          ASSERT_EQ(w.status().code(), absl::StatusCode::kUnavailable)
              << w.status();
          pollfd p{.fd = from, .events = POLLOUT, .revents = 0};
          ::poll(&p, 1, -1);
        }
      }
    });
    BufferChain in(*pool_);
    std::string got;
    for (;;) {
      if (slow_reader)
        std::this_thread::sleep_for(std::chrono::microseconds(50));
      absl::StatusOr<size_t> r = ReadFrom(to, in, read_max);
      if (!r.ok()) {
        EXPECT_EQ(r.status().code(), absl::StatusCode::kUnavailable)
            << r.status();
        pollfd p{.fd = to, .events = POLLIN, .revents = 0};
        ::poll(&p, 1, -1);
        continue;
      }
      if (*r == 0) break;
      // Keep the chain short: move whole buffers out as they fill.
      got += Contents(in);
      in.Clear();
    }
    writer.join();
    return got;
  }

  std::unique_ptr<BufferPool> pool_;
};

TEST_F(ChainIoTest, BlockingSocketpairCarriesEveryByte) {
  Pair p;
  ASSERT_EQ(SocketPair(SOCK_STREAM, p.ends), 0);
  const std::string data = RandomBytes(1 << 20, 1);
  EXPECT_EQ(Transfer(p.a(), p.b(), data, 64 << 10, false), data);
}

TEST_F(ChainIoTest, NonBlockingSocketpairWithASlowReader) {
  Pair p;
  ASSERT_EQ(SocketPair(SOCK_STREAM, p.ends), 0);
  SetNonBlocking(p.a());
  SetNonBlocking(p.b());
  const std::string data = RandomBytes(1 << 20, 2);
  EXPECT_EQ(Transfer(p.a(), p.b(), data, 5000, true), data);
}

TEST_F(ChainIoTest, PipesBlockingAndNot) {
  for (bool nonblocking : {false, true}) {
    Pair p;
    UniqueFd fds[2];
    ASSERT_EQ(Pipe(fds), 0);
    p.ends[1] = std::move(fds[0]);
    p.ends[0] = std::move(fds[1]);
    if (nonblocking) {
      SetNonBlocking(p.a());
      SetNonBlocking(p.b());
    }
    const std::string data = RandomBytes(1 << 20, 3);
    // Transfer closes the pipe's write end.
    EXPECT_EQ(Transfer(p.ends[0].release(), p.b(), data, 10000, nonblocking),
              data);
  }
}

TEST_F(ChainIoTest, NothingToReadIsUnavailableAndLeavesTheChain) {
  Pair p;
  ASSERT_EQ(SocketPair(SOCK_STREAM, p.ends), 0);
  SetNonBlocking(p.b());
  BufferChain in(*pool_);
  ASSERT_TRUE(in.Append("kept").ok());
  absl::StatusOr<size_t> r = ReadFrom(p.b(), in, 4096);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kUnavailable) << r.status();
  EXPECT_EQ(Contents(in), "kept");
  EXPECT_EQ(pool_->Stats().in_use, 1u);  // the fresh buffers went back
}

TEST_F(ChainIoTest, ReadFillsTheTailRoomFirstAndReturnsUnusedBuffers) {
  Pair p;
  ASSERT_EQ(SocketPair(SOCK_STREAM, p.ends), 0);
  BufferChain in(*pool_);
  ASSERT_TRUE(in.Append("head:").ok());
  ASSERT_EQ(::write(p.a(), "abc", 3), 3);
  absl::StatusOr<size_t> r = ReadFrom(p.b(), in, 1 << 20);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(*r, 3u);
  EXPECT_EQ(Contents(in), "head:abc");
  EXPECT_EQ(in.slice_count(), 1u);
  EXPECT_EQ(pool_->Stats().in_use, 1u);
  // A read larger than the room spills into fresh buffers.
  const std::string big = RandomBytes(10000, 4);
  ASSERT_EQ(::write(p.a(), big.data(), big.size()),
            static_cast<ssize_t>(big.size()));
  size_t total = 0;
  while (total < big.size()) {
    r = ReadFrom(p.b(), in, 1 << 20);
    ASSERT_TRUE(r.ok()) << r.status();
    total += *r;
  }
  EXPECT_EQ(Contents(in), "head:abc" + big);
  EXPECT_EQ(pool_->Stats().in_use, in.slice_count());
}

TEST_F(ChainIoTest, ReadOfASharedTailStartsAFreshBuffer) {
  Pair p;
  ASSERT_EQ(SocketPair(SOCK_STREAM, p.ends), 0);
  BufferChain in(*pool_);
  ASSERT_TRUE(in.Append("abc").ok());
  SharedBuffer other = in.slice(0);  // shares the tail
  ASSERT_EQ(::write(p.a(), "XYZ", 3), 3);
  ASSERT_TRUE(ReadFrom(p.b(), in, 100).ok());
  EXPECT_EQ(Contents(in), "abcXYZ");
  EXPECT_EQ(in.slice_count(), 2u);
  EXPECT_NE(std::memcmp(other.data() + 3, "XYZ", 3), 0);
}

TEST_F(ChainIoTest, EndOfFileIsZero) {
  Pair p;
  ASSERT_EQ(SocketPair(SOCK_STREAM, p.ends), 0);
  p.ends[0].reset();
  BufferChain in(*pool_);
  absl::StatusOr<size_t> r = ReadFrom(p.b(), in, 4096);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(*r, 0u);
  EXPECT_TRUE(in.empty());
}

TEST_F(ChainIoTest, DryPoolIsResourceExhaustedAndAPartlyDryOneReadsLess) {
  Pair p;
  ASSERT_EQ(SocketPair(SOCK_STREAM, p.ends), 0);
  std::vector<Buffer> held(pool_->capacity());
  ASSERT_EQ(pool_->TryAcquireBulk(absl::MakeSpan(held)), held.size());
  ASSERT_EQ(::write(p.a(), "data", 4), 4);
  BufferChain in(*pool_);
  absl::StatusOr<size_t> r = ReadFrom(p.b(), in, 4096);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kResourceExhausted)
      << r.status();
  EXPECT_TRUE(in.empty());
  held.back().Reset();  // one buffer free: a 64 KiB read takes what fits
  const std::string big = RandomBytes(9000, 5);
  ASSERT_EQ(::write(p.a(), big.data(), big.size()),
            static_cast<ssize_t>(big.size()));
  r = ReadFrom(p.b(), in, 64 << 10);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(*r, 4096u);
  EXPECT_EQ(Contents(in), ("data" + big).substr(0, 4096));
  in.Clear();
  held.clear();
}

TEST_F(ChainIoTest, BadArgumentsAreClearErrors) {
  BufferChain in(*pool_);
  EXPECT_EQ(ReadFrom(0, in, 0).status().code(),
            absl::StatusCode::kInvalidArgument);
  BufferChain no_pool;
  EXPECT_EQ(ReadFrom(0, no_pool, 1).status().code(),
            absl::StatusCode::kFailedPrecondition);
  ASSERT_TRUE(in.Append("x").ok());
  absl::StatusOr<size_t> w = WriteTo(-1, in);
  EXPECT_EQ(w.status().code(), absl::StatusCode::kInvalidArgument)
      << w.status();
  EXPECT_NE(w.status().message().find("fd -1"), std::string::npos);
  EXPECT_EQ(Contents(in), "x");
  BufferChain empty(*pool_);
  EXPECT_EQ(*WriteTo(-1, empty), 0u);
}

TEST_F(ChainIoTest, NonBlockingWriteIsPartialThenUnavailable) {
  Pair p;
  ASSERT_EQ(SocketPair(SOCK_STREAM, p.ends), 0);
  SetNonBlocking(p.a());
  const std::string data = RandomBytes(4 << 20, 6);  // more than the buffer
  BufferChain out(*pool_);
  ASSERT_TRUE(out.Append(data.substr(0, 1 << 20)).ok());
  absl::StatusOr<size_t> w = WriteTo(p.a(), out);
  ASSERT_TRUE(w.ok()) << w.status();
  EXPECT_GT(*w, 0u);
  EXPECT_LT(*w, size_t{1} << 20);
  EXPECT_EQ(out.size(), (size_t{1} << 20) - *w);  // consumed what was sent
  const size_t left = out.size();
  absl::StatusOr<size_t> again = WriteTo(p.a(), out);
  EXPECT_EQ(again.status().code(), absl::StatusCode::kUnavailable)
      << again.status();
  EXPECT_EQ(out.size(), left);
  EXPECT_EQ(Contents(out), data.substr(*w, left));
}

TEST_F(ChainIoTest, WriteToAClosedPeerIsAnErrorNotSigpipe) {
  {
    Pair p;
    ASSERT_EQ(SocketPair(SOCK_STREAM, p.ends), 0);
    p.ends[1].reset();
    BufferChain out(*pool_);
    ASSERT_TRUE(out.Append("lost").ok());
    absl::StatusOr<size_t> w = WriteTo(p.a(), out);
    EXPECT_EQ(w.status().code(), absl::StatusCode::kFailedPrecondition)
        << w.status();
    EXPECT_NE(w.status().message().find("Broken pipe"), std::string::npos)
        << w.status();
    EXPECT_EQ(Contents(out), "lost");
  }
  {
    UniqueFd fds[2];
    ASSERT_EQ(Pipe(fds), 0);
    fds[0].reset();
    BufferChain out(*pool_);
    ASSERT_TRUE(out.Append("lost").ok());
    absl::StatusOr<size_t> w = WriteTo(fds[1].get(), out);
    EXPECT_EQ(w.status().code(), absl::StatusCode::kFailedPrecondition)
        << w.status();
    fds[1].reset();
    // The SIGPIPE the pipe write raised was consumed, not left pending.
    sigset_t pending;
    sigpending(&pending);
    EXPECT_EQ(sigismember(&pending, SIGPIPE), 0);
  }
}

TEST_F(ChainIoTest, ResetPeerIsAnErrorOnReadAndWrite) {
  testing_util::LoopbackConnection p = testing_util::ConnectOverLoopback();
  ASSERT_TRUE(p.server.valid());
  ASSERT_EQ(::write(p.client.get(), "unread", 6), 6);
  // Closing with unread bytes (or with SO_LINGER 0) sends a reset.
  const linger l{.l_onoff = 1, .l_linger = 0};
  ASSERT_EQ(::setsockopt(p.server.get(), SOL_SOCKET, SO_LINGER, &l, sizeof(l)),
            0);
  p.server.reset();
  BufferChain in(*pool_);
  absl::StatusOr<size_t> r = ReadFrom(p.client.get(), in, 4096);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kFailedPrecondition)
      << r.status();
  EXPECT_NE(r.status().message().find("reset"), std::string::npos)
      << r.status();
  BufferChain out(*pool_);
  ASSERT_TRUE(out.Append("more").ok());
  absl::StatusOr<size_t> w = WriteTo(p.client.get(), out);
  EXPECT_EQ(w.status().code(), absl::StatusCode::kFailedPrecondition)
      << w.status();
}

// ---- Faults injected through the OS layer ----------------------------------

// Scripted results for readv/sendmsg: each entry is either a byte limit
// (>= 0: pass at most that many to the real call) or -errno.
struct Script {
  std::vector<long> steps;
  size_t next = 0;
  int calls = 0;
  long Next() {
    ++calls;
    return next < steps.size() ? steps[next++] : 1L << 30;
  }
};
Script* g_script = nullptr;

// The first `bytes` bytes of iov[0, cnt), as iovecs.
std::vector<iovec> Cut(const iovec* iov, size_t cnt, size_t bytes) {
  std::vector<iovec> cut;
  for (size_t i = 0; i < cnt && bytes != 0; ++i) {
    cut.push_back({iov[i].iov_base, std::min(bytes, iov[i].iov_len)});
    bytes -= cut.back().iov_len;
  }
  return cut;
}

ssize_t ScriptedReadv(int fd, const iovec* iov, int cnt) {
  const long step = g_script->Next();
  if (step < 0) {
    errno = static_cast<int>(-step);
    return -1;
  }
  std::vector<iovec> cut =
      Cut(iov, static_cast<size_t>(cnt), static_cast<size_t>(step));
  return os::RealSyscalls().readv(fd, cut.data(), static_cast<int>(cut.size()));
}

ssize_t ScriptedSendmsg(int fd, const msghdr* msg, int flags) {
  const long step = g_script->Next();
  if (step < 0) {
    errno = static_cast<int>(-step);
    return -1;
  }
  std::vector<iovec> cut =
      Cut(msg->msg_iov, msg->msg_iovlen, static_cast<size_t>(step));
  msghdr m = *msg;
  m.msg_iov = cut.data();
  m.msg_iovlen = cut.size();
  return os::RealSyscalls().sendmsg(fd, &m, flags);
}

class ChainFaultTest : public ChainIoTest {
 protected:
  void SetUp() override {
    ChainIoTest::SetUp();
    ASSERT_EQ(SocketPair(SOCK_STREAM, p_.ends), 0);
    table_ = os::RealSyscalls();
    table_.readv = ScriptedReadv;
    table_.sendmsg = ScriptedSendmsg;
    g_script = &script_;
    seam_ = std::make_unique<os::ScopedSyscalls>(&table_);
  }
  void TearDown() override {
    seam_.reset();
    g_script = nullptr;
    ChainIoTest::TearDown();
  }

  Pair p_;
  Script script_;
  os::SyscallTable table_;
  std::unique_ptr<os::ScopedSyscalls> seam_;
};

TEST_F(ChainFaultTest, ShortReadsAndEintrAreAbsorbed) {
  ASSERT_EQ(::write(p_.a(), "0123456789", 10), 10);
  script_.steps = {-EINTR, 3, -EINTR, -EINTR, 7};
  BufferChain in(*pool_);
  absl::StatusOr<size_t> r = ReadFrom(p_.b(), in, 4096);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(*r, 3u);  // one read: a short count is success
  r = ReadFrom(p_.b(), in, 4096);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(Contents(in), "0123456789");
  EXPECT_EQ(script_.calls, 5);
}

TEST_F(ChainFaultTest, ReadErrorsMapToTheirCodesAndLeaveTheChain) {
  BufferChain in(*pool_);
  ASSERT_TRUE(in.Append("kept").ok());
  script_.steps = {-EAGAIN, -ECONNRESET, -EIO};
  EXPECT_EQ(ReadFrom(p_.b(), in, 4096).status().code(),
            absl::StatusCode::kUnavailable);
  EXPECT_EQ(ReadFrom(p_.b(), in, 4096).status().code(),
            absl::StatusCode::kFailedPrecondition);
  absl::Status io = ReadFrom(p_.b(), in, 4096).status();
  EXPECT_FALSE(io.ok());
  EXPECT_NE(io.message().find("read: fd"), std::string::npos) << io;
  EXPECT_NE(io.message().find("Input/output error"), std::string::npos) << io;
  EXPECT_EQ(Contents(in), "kept");
}

TEST_F(ChainFaultTest, ShortWritesAndEintrAreRetriedUntilAllIsSent) {
  const std::string data = RandomBytes(20000, 7);
  BufferChain out(*pool_);
  ASSERT_TRUE(out.Append(data).ok());
  script_.steps = {-EINTR, 1, 4095, -EINTR, 5000, 1};  // then unlimited
  absl::StatusOr<size_t> w = WriteTo(p_.a(), out);
  ASSERT_TRUE(w.ok()) << w.status();
  EXPECT_EQ(*w, data.size());
  EXPECT_TRUE(out.empty());
  std::string got(data.size(), '\0');
  size_t n = 0;
  while (n < got.size()) n += ::read(p_.b(), got.data() + n, got.size() - n);
  EXPECT_EQ(got, data);
}

TEST_F(ChainFaultTest, WouldBlockAfterProgressIsPartialAndErrorsKeepTheRest) {
  const std::string data = RandomBytes(10000, 8);
  BufferChain out(*pool_);
  ASSERT_TRUE(out.Append(data).ok());
  script_.steps = {3000, -EAGAIN, -EAGAIN, 2000, -EPIPE, -ECONNRESET};
  absl::StatusOr<size_t> w = WriteTo(p_.a(), out);
  ASSERT_TRUE(w.ok()) << w.status();
  EXPECT_EQ(*w, 3000u);
  EXPECT_EQ(WriteTo(p_.a(), out).status().code(),
            absl::StatusCode::kUnavailable);
  absl::StatusOr<size_t> e = WriteTo(p_.a(), out);  // 2000 sent, then EPIPE
  EXPECT_EQ(e.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(Contents(out), data.substr(5000));
  EXPECT_EQ(WriteTo(p_.a(), out).status().code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(out.size(), 5000u);
}

}  // namespace
}  // namespace bufpool

namespace bufpool {
namespace {

// Memory follows bytes through ReadFrom(): a 20 KB line trickled a byte at a
// time on each of `connections` non-blocking socketpairs, never consumed.
// Each chain pins at most B + 2 * buffer_size; the pool at most that per
// connection plus the buffers one ReadFrom() takes for the read it makes.
class ReadFromTrickleTest : public ::testing::TestWithParam<size_t> {};

TEST_P(ReadFromTrickleTest, ALineTrickledAByteAtATimePinsAboutItsBytes) {
  const size_t conns = GetParam();
  constexpr size_t kLine = 20 * 1024;
  constexpr size_t kMaxRead = 64 * 1024;
  // high_water is exact, so it measures the chains alone.
  auto pool = testing_util::MakeUncachedPool(4096);
  const size_t bs = pool->buffer_size();
  const size_t bound = conns * testing_util::MostBuffersFor(kLine, bs) +
                       (kMaxRead + bs - 1) / bs;
  std::vector<UniqueFd> rd, wr;
  ASSERT_NO_FATAL_FAILURE(testing_util::MakeTrickleSockets(
      conns, /*nonblocking_readers=*/true, &rd, &wr));
  const std::string line = testing_util::TrickleLine(kLine);
  std::thread trickler = testing_util::StartTrickler(
      conns, line, [&wr](size_t i, const char* byte) {
        return send(wr[i].get(), byte, 1, MSG_NOSIGNAL) == 1;
      });
  std::vector<BufferChain> chain;
  for (size_t i = 0; i < conns; ++i) chain.emplace_back(*pool);
  size_t done = 0;
  std::vector<pollfd> fds(conns);
  while (done < conns) {
    for (size_t i = 0; i < conns; ++i) {
      fds[i] = {chain[i].size() < kLine ? rd[i].get() : -1, POLLIN, 0};
    }
    ASSERT_GE(poll(fds.data(), fds.size(), 1000), 0);
    for (size_t i = 0; i < conns; ++i) {
      if (fds[i].revents == 0) continue;
      absl::StatusOr<size_t> n = ReadFrom(rd[i].get(), chain[i], kMaxRead);
      if (!n.ok() && n.status().code() == absl::StatusCode::kUnavailable) {
        continue;
      }
      ASSERT_TRUE(n.ok()) << n.status();
      ASSERT_GT(*n, 0u);
      if (chain[i].size() == kLine) ++done;
    }
    if (pool->Stats().high_water > bound) break;  // fails below
  }
  // Unblock a trickler that a failed bound left writing into a full socket.
  for (size_t i = 0; i < conns; ++i) shutdown(rd[i].get(), SHUT_RDWR);
  trickler.join();
  EXPECT_LE(pool->Stats().high_water, bound) << conns << " connections";
  ASSERT_NO_FATAL_FAILURE(
      testing_util::ExpectEachHoldsTheLine(chain, line, bs));
  chain.clear();
  EXPECT_TRUE(testing::NoHolders(*pool));
}

// 100 connections make 2 million one-byte sends: the plain build only.
INSTANTIATE_TEST_SUITE_P(Connections, ReadFromTrickleTest,
                         ::testing::ValuesIn(testing_util::kSanitized
                                                 ? std::vector<size_t>{1, 5}
                                                 : std::vector<size_t>{1, 5,
                                                                       100}));

}  // namespace
}  // namespace bufpool

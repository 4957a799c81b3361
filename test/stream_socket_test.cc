// BufferedWriter/BufferedReader on sockets and pipes: no SIGPIPE ever (it
// keeps its default action here, so one would kill the test), and on
// non-blocking descriptors "would block" loses nothing and leaves the
// stream usable (bufpool/buffered_stream.h, "Sockets, pipes and
// non-blocking descriptors").
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <random>
#include <string>
#include <thread>

#include "bufpool/buffered_stream.h"
#include "gtest/gtest.h"
#include "test_util.h"

namespace bufpool {
namespace {

using testing_util::Pipe;
using testing_util::RandomBytes;
using testing_util::SetNonBlocking;
using testing_util::SocketPair;
using testing_util::UniqueFd;

class StreamSocketTest : public testing::Test {
 protected:
  void SetUp() override {
    ASSERT_EQ(::signal(SIGPIPE, SIG_DFL), SIG_DFL);
    auto pool = BufferPool::Create({.buffer_count = 256,
                                    .huge_pages = HugePages::kNever,
                                    .populate = false});
    ASSERT_TRUE(pool.ok()) << pool.status();
    pool_ = *std::move(pool);
    ASSERT_EQ(SocketPair(SOCK_STREAM, fds_), 0);
  }
  void TearDown() override {
    for (UniqueFd& fd : fds_) fd.reset();
    EXPECT_EQ(pool_->Stats().in_use, 0u);
  }

  std::unique_ptr<BufferPool> pool_;
  UniqueFd fds_[2];
};

// The bug report: a non-blocking socket whose peer is slow made the writer
// fail with UNAVAILABLE and lose its buffers. Now it waits and every byte,
// from small appends and from large ones that bypass the buffers, arrives.
TEST_F(StreamSocketTest, NonBlockingWriterWithASlowPeerLosesNothing) {
  SetNonBlocking(fds_[0].get());
  const std::string data = RandomBytes(3 << 20, 1);
  std::string got;
  std::thread reader([&] {
    std::string chunk(3000, '\0');
    for (;;) {
      std::this_thread::sleep_for(std::chrono::microseconds(20));
      const ssize_t n = ::read(fds_[1].get(), chunk.data(), chunk.size());
      if (n <= 0) break;
      got.append(chunk.data(), static_cast<size_t>(n));
    }
  });
  {
    auto w = BufferedWriter::FromFd(fds_[0].get(), FdOwnership::kBorrow, *pool_,
                                    "sock", {.buffers = 4});
    ASSERT_TRUE(w.ok()) << w.status();
    std::mt19937_64 rng(2);
    size_t at = 0;
    while (at < data.size()) {
      // Mostly small records, sometimes one larger than all the buffers.
      const size_t n = std::min(data.size() - at,
                                rng() % 8 == 0 ? size_t{40000} : rng() % 700);
      ASSERT_TRUE(w->Append(data.data() + at, n).ok());
      at += n;
    }
    ASSERT_TRUE(w->Flush().ok());
    EXPECT_EQ(w->buffer_count(), 4u);  // still usable, buffers kept
    ASSERT_TRUE(w->Append("!", 1).ok());
    ASSERT_TRUE(w->Close().ok());
  }
  ::shutdown(fds_[0].get(), SHUT_WR);
  reader.join();
  EXPECT_EQ(got, data + "!");
}

TEST_F(StreamSocketTest, FlushToAClosedSocketIsAnErrorNotSigpipe) {
  fds_[1].reset();
  auto w = BufferedWriter::FromFd(fds_[0].get(), FdOwnership::kBorrow, *pool_,
                                  "sock");
  ASSERT_TRUE(w.ok()) << w.status();
  ASSERT_TRUE(w->Append("hello", 5).ok());
  absl::Status s = w->Flush();
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_EQ(s.message(), "write: sock: Broken pipe");
  EXPECT_EQ(w->Append("x", 1), s);  // sticky, like any write error
  EXPECT_EQ(w->buffer_count(), 0u);
  EXPECT_EQ(w->Close(), s);
}

TEST_F(StreamSocketTest, FlushToAClosedPipeIsAnErrorNotSigpipe) {
  UniqueFd p[2];
  ASSERT_EQ(Pipe(p), 0);
  p[0].reset();
  auto w = BufferedWriter::FromFd(p[1].release(), FdOwnership::kTake, *pool_,
                                  "pipe");
  ASSERT_TRUE(w.ok()) << w.status();
  ASSERT_TRUE(w->Append("hello", 5).ok());
  absl::Status s = w->Flush();
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_EQ(s.message(), "write: pipe: Broken pipe");
  EXPECT_EQ(w->Close(), s);
  sigset_t pending;
  sigpending(&pending);
  EXPECT_EQ(sigismember(&pending, SIGPIPE), 0);
}

TEST_F(StreamSocketTest, WriterGivesUpAfterTheTimeoutWhenThePeerNeverReads) {
  SetNonBlocking(fds_[0].get());
  auto w = BufferedWriter::FromFd(
      fds_[0].get(), FdOwnership::kBorrow, *pool_, "sock",
      {.buffers = 1, .io_timeout = absl::Milliseconds(20)});
  ASSERT_TRUE(w.ok()) << w.status();
  const std::string block(4096, 'z');
  absl::Status s;
  for (int i = 0; i < 10000 && s.ok(); ++i) s = w->Append(block.data(), 4096);
  EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded) << s;
  EXPECT_NE(s.message().find("not writable for 20ms"), std::string::npos) << s;
  EXPECT_EQ(w->buffer_count(), 0u);
}

TEST_F(StreamSocketTest, NonBlockingReaderWaitsForDataThatComesLater) {
  SetNonBlocking(fds_[1].get());
  const std::string data = RandomBytes(200000, 3);
  std::thread writer([&] {
    for (size_t at = 0; at < data.size();) {
      std::this_thread::sleep_for(std::chrono::microseconds(100));
      const size_t n = std::min<size_t>(7777, data.size() - at);
      ASSERT_EQ(::write(fds_[0].get(), data.data() + at, n),
                static_cast<ssize_t>(n));
      at += n;
    }
    ::shutdown(fds_[0].get(), SHUT_WR);
  });
  auto r = BufferedReader::FromFd(fds_[1].get(), FdOwnership::kBorrow, *pool_,
                                  "sock", {.buffers = 2});
  ASSERT_TRUE(r.ok()) << r.status();
  // Records of 1000 bytes, each read whole even when it arrives in pieces.
  std::string got(data.size(), '\0');
  for (size_t at = 0; at < data.size(); at += 1000) {
    ASSERT_TRUE(
        r->ReadExact({reinterpret_cast<std::byte*>(&got[at]), 1000}).ok());
  }
  std::byte extra;
  EXPECT_EQ(*r->Read({&extra, 1}), 0u);  // end of stream
  writer.join();
  EXPECT_EQ(got, data);
  EXPECT_TRUE(r->Close().ok());
}

TEST_F(StreamSocketTest, ReaderTimeoutLosesNothingAndTheReaderStaysUsable) {
  SetNonBlocking(fds_[1].get());
  auto r =
      BufferedReader::FromFd(fds_[1].get(), FdOwnership::kBorrow, *pool_,
                             "sock", {.io_timeout = absl::Milliseconds(10)});
  ASSERT_TRUE(r.ok()) << r.status();
  std::byte out[16];
  absl::StatusOr<size_t> got = r->Read(out);
  EXPECT_EQ(got.status().code(), absl::StatusCode::kDeadlineExceeded)
      << got.status();
  EXPECT_NE(got.status().message().find("nothing was lost"), std::string::npos);
  EXPECT_EQ(r->buffer_count(), 16u);
  ASSERT_EQ(::write(fds_[0].get(), "late", 4), 4);
  got = r->Read(out);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(*got, 4u);
  EXPECT_EQ(std::string(reinterpret_cast<char*>(out), 4), "late");
  // A record that times out part-way fails the reader for good.
  ASSERT_EQ(::write(fds_[0].get(), "half", 4), 4);
  absl::Status s = r->ReadExact(out);
  EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded) << s;
  EXPECT_NE(s.message().find("part-way through a read: got 4 of 16"),
            std::string::npos)
      << s;
  EXPECT_EQ(r->buffer_count(), 0u);
  EXPECT_EQ(r->Read(out).status(), s);
}

TEST_F(StreamSocketTest, ResetConnectionIsAReadError) {
  testing_util::LoopbackConnection c = testing_util::ConnectOverLoopback();
  ASSERT_TRUE(c.server.valid());
  const linger lg{.l_onoff = 1, .l_linger = 0};
  ASSERT_EQ(
      ::setsockopt(c.server.get(), SOL_SOCKET, SO_LINGER, &lg, sizeof(lg)), 0);
  c.server.reset();  // reset
  auto r = BufferedReader::FromFd(c.client.release(), FdOwnership::kTake,
                                  *pool_, "tcp");
  ASSERT_TRUE(r.ok()) << r.status();
  std::byte out[8];
  absl::StatusOr<size_t> got = r->Read(out);
  EXPECT_EQ(got.status().code(), absl::StatusCode::kFailedPrecondition)
      << got.status();
  EXPECT_EQ(got.status().message(), "read: tcp: Connection reset by peer");
}

TEST_F(StreamSocketTest, NegativeIoTimeoutIsABadOption) {
  auto w = BufferedWriter::FromFd(fds_[0].get(), FdOwnership::kBorrow, *pool_,
                                  "s", {.io_timeout = absl::Milliseconds(-1)});
  EXPECT_EQ(w.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(w.status().message().find("io_timeout"), std::string::npos);
}

}  // namespace
}  // namespace bufpool

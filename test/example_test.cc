// Runs examples/uring_echo briefly on loopback (and examples/asio_echo
// under bufpool-echo-load): several clients get their
// bytes back exactly, a client still connected when the time is up is shut
// down, and the program ends with every buffer back in its pool.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "test_util.h"

namespace {

using bufpool::testing_util::Child;
using bufpool::testing_util::ChildOutput;
using bufpool::testing_util::ConnectToLoopback;
using bufpool::testing_util::ExitedCleanly;
using bufpool::testing_util::ReadListeningPort;
using bufpool::testing_util::SendAndReadToEnd;
using bufpool::testing_util::StartChild;
using bufpool::testing_util::UniqueFd;

// Sends `data` in pieces of 7000 bytes and reads until end of stream.
std::string Echo(int port, const std::string& data) {
  return SendAndReadToEnd(port, data, [](size_t) { return size_t{7000}; });
}

TEST(UringEchoExampleTest, EchoesOnLoopbackAndEndsWithEveryBufferBack) {
  Child child =
      StartChild(BUFPOOL_EXAMPLE_URING_ECHO, {"uring_echo", "0", "3"});
  ASSERT_GT(child.pid, 0);
  FILE* f = child.out.get();
  const int port = ReadListeningPort(child, "listening on 127.0.0.1:%d");
  ASSERT_NE(port, 0);

  // Open when the time runs out.
  UniqueFd lingering = ConnectToLoopback(port);
  ASSERT_TRUE(lingering.valid());
  std::vector<std::thread> clients;
  std::vector<std::string> sent(8), got(8);
  std::mt19937 rng(8);
  for (size_t i = 0; i < sent.size(); ++i) {
    sent[i].resize(1 + rng() % (3 << 20));
    for (char& c : sent[i]) c = static_cast<char>(rng());
    clients.emplace_back([&, i] { got[i] = Echo(port, sent[i]); });
  }
  for (std::thread& t : clients) t.join();
  for (size_t i = 0; i < sent.size(); ++i) {
    EXPECT_TRUE(got[i] == sent[i]) << "client " << i << ": " << got[i].size()
                                   << " of " << sent[i].size() << " bytes";
  }
  // The server shuts the lingering connection down when its time is up.
  char c;
  EXPECT_LE(recv(lingering.get(), &c, 1, 0), 0);
  lingering.reset();
  char line[256] = {};
  ASSERT_NE(fgets(line, sizeof(line), f), nullptr);
  EXPECT_STREQ(line, "done: 0 buffers in use\n");
  child.out.reset();
  EXPECT_TRUE(ExitedCleanly(child));
}

// The byte at `i` of the floods below.
char FloodByte(uint64_t i) {
  return static_cast<char>((i * 7 + i / 4099) % 251);
}

// A client that sends FloodByte()s until told to stop (from a thread of
// its own), and reads them back on the caller's thread.
class Flood {
 public:
  explicit Flood(int port) : fd_(ConnectToLoopback(port)) {
    if (!fd_.valid()) return;
    sender_ = std::thread([this] {
      std::vector<char> chunk(65536);
      while (!stop_.load()) {
        for (size_t i = 0; i < chunk.size(); ++i) {
          chunk[i] = FloodByte(sent_ + i);
        }
        const ssize_t n =
            send(fd_.get(), chunk.data(), chunk.size(), MSG_NOSIGNAL);
        if (n <= 0) break;
        sent_ += static_cast<uint64_t>(n);
      }
      shutdown(fd_.get(), SHUT_WR);
    });
  }
  ~Flood() {
    if (sender_.joinable()) sender_.join();
  }
  bool ok() const { return fd_.valid(); }
  // Stops sending and reads until end of stream: true when every byte
  // sent came back in order.
  bool StopAndReadBack() {
    stop_.store(true);
    uint64_t got = 0;
    bool same = true;
    char buf[65536];
    ssize_t n;
    while ((n = recv(fd_.get(), buf, sizeof(buf), 0)) > 0) {
      for (ssize_t i = 0; i < n; ++i) same &= buf[i] == FloodByte(got + i);
      got += static_cast<uint64_t>(n);
    }
    sender_.join();
    EXPECT_EQ(got, sent_);
    return same && got == sent_;
  }

 private:
  const UniqueFd fd_;
  std::atomic<bool> stop_{false};
  uint64_t sent_ = 0;  // written by the sender, read after joining it
  std::thread sender_;
};

// Runs examples/uring_echo with `args` (its argv after the program's name),
// jams it with a client that sends without reading until it says on stderr
// that it waits for a free buffer, lets the client read everything back,
// checks a fresh echo, stops it with SIGTERM and checks its "done" line and
// clean exit. Returns the `report_lines` lines it printed after "done".
std::vector<std::string> JamAndStopUringEcho(std::vector<const char*> args,
                                             int report_lines) {
  std::vector<std::string> report;
  args.insert(args.begin(), "uring_echo");
  Child child = StartChild(BUFPOOL_EXAMPLE_URING_ECHO, args,
                           ChildOutput::kStdoutAndStderr);
  if (child.pid <= 0) return report;
  FILE* f = child.out.get();
  FILE* e = child.err.get();
  char line[256] = {};
  const int port = ReadListeningPort(child, "listening on 127.0.0.1:%d");
  if (port != 0) {
    {
      Flood flood(port);
      EXPECT_TRUE(flood.ok());
      // Blocks until jammed.
      EXPECT_NE(fgets(line, sizeof(line), e), nullptr);
      EXPECT_STREQ(line, "uring_echo: waiting for a free buffer\n");
      EXPECT_TRUE(flood.StopAndReadBack());
    }
    EXPECT_EQ(Echo(port, "after the jam"), "after the jam");
  }
  kill(child.pid, SIGTERM);
  if (fgets(line, sizeof(line), f) != nullptr) {
    EXPECT_STREQ(line, "done: 0 buffers in use\n");
    for (int i = 0; i < report_lines && fgets(line, sizeof(line), f); ++i) {
      report.emplace_back(line);
    }
  }
  EXPECT_EQ(report.size(), static_cast<size_t>(report_lines));
  child.out.reset();
  child.err.reset();
  EXPECT_TRUE(ExitedCleanly(child));
  return report;
}

// examples/uring_echo on a 16-buffer pool: a client that sends without
// reading jams every buffer, so the server's receive gets -ENOBUFS, is
// parked, and the loop waits on the pool's notice (it says so on stderr
// once it has waited a whole tick). When the client reads, the freed
// buffers fire the notice, the ring is refilled, the receive re-armed, and
// every byte comes back; the counts at the end show the park and the wake.
TEST(UringEchoExampleTest, ParksOnADryPoolAndIsWokenByItsNotice) {
  const std::vector<std::string> report =
      JamAndStopUringEcho({"0", "0", "16"}, 1);
  ASSERT_EQ(report.size(), 1u);
  unsigned long long parks = 0, wakes = 0;
  ASSERT_EQ(
      sscanf(report[0].c_str(),
             "parked %llu times, woken by the pool %llu times", &parks, &wakes),
      2)
      << report[0];
  EXPECT_GE(parks, 1u);
  EXPECT_GE(wakes, 1u);
}

// The same jam with a ceiling (BUFFERS 16, MAX_BUFFERS 48): the pool grows
// to the ceiling before the loop waits, and every byte still comes back.
// The ceiling stays below the connection's budget (kMaxUnsent, 64 buffers):
// at 64 the budget would pause the receive as the pool ran dry, and the
// loop would never wait on the pool.
TEST(UringEchoExampleTest, AnElasticPoolGrowsToItsCeilingBeforeItParks) {
  // The report: "parked ...", then the pool's growth.
  const std::vector<std::string> report =
      JamAndStopUringEcho({"0", "0", "16", "48"}, 2);
  ASSERT_EQ(report.size(), 2u);
  unsigned long long grows = 0, trims = 0;
  size_t backed = 0, ceiling = 0;
  ASSERT_EQ(sscanf(report[1].c_str(),
                   "pool grew %llu times, trimmed %llu times, %zu of %zu "
                   "buffers backed",
                   &grows, &trims, &backed, &ceiling),
            4)
      << report[1];
  EXPECT_GE(grows, 1u);
  EXPECT_EQ(ceiling, 48u);
}

#if defined(BUFPOOL_EXAMPLE_ASIO_ECHO) && defined(BUFPOOL_ECHO_LOAD)
// examples/asio_echo under bufpool-echo-load with messages of 1 to 65,536
// bytes on 8 connections: every byte comes back (the load checks them) and
// the server stops cleanly on SIGTERM.
TEST(AsioEchoExampleTest, ServesTheEchoLoadWithMessagesUpTo64KiB) {
  Child child = StartChild(BUFPOOL_EXAMPLE_ASIO_ECHO, {"asio_echo", "0"});
  ASSERT_GT(child.pid, 0);
  const int port =
      ReadListeningPort(child, "asio_echo: listening on 127.0.0.1:%d");
  ASSERT_NE(port, 0);
  const std::string target = "127.0.0.1:" + std::to_string(port);
  const pid_t load = fork();
  ASSERT_GE(load, 0);
  if (load == 0) {
    execl(BUFPOOL_ECHO_LOAD, "bufpool-echo-load", "--target", target.c_str(),
          "--connections", "8", "--messages", "2000", "--size", "1:65536",
          nullptr);
    _exit(127);
  }
  EXPECT_TRUE(ExitedCleanly(load));
  kill(child.pid, SIGTERM);
  EXPECT_TRUE(ExitedCleanly(child));
}

// examples/asio_echo on a 16-buffer pool: a client that sends without
// reading runs the pool dry (the server says so), so its session, and then
// a second client's, wait for a free buffer. The server has no timer: when
// the first client reads, the writes free buffers, the pool's notice wakes
// the waiting sessions, and both get every byte back.
TEST(AsioEchoExampleTest, ADryPoolWakesWaitingSessionsWhenFreed) {
  Child child = StartChild(BUFPOOL_EXAMPLE_ASIO_ECHO, {"asio_echo", "0", "16"});
  ASSERT_GT(child.pid, 0);
  FILE* f = child.out.get();
  const int port =
      ReadListeningPort(child, "asio_echo: listening on 127.0.0.1:%d");
  ASSERT_NE(port, 0);
  char line[256] = {};

  Flood flood(port);
  ASSERT_TRUE(flood.ok());
  // Blocks until the server has found its pool dry.
  ASSERT_NE(fgets(line, sizeof(line), f), nullptr);
  EXPECT_STREQ(line,
               "asio_echo: the pool ran dry; sessions wait for buffers\n");
  std::string probe_got;
  std::thread probe([&] { probe_got = Echo(port, "hello, dry pool"); });
  EXPECT_TRUE(flood.StopAndReadBack());
  probe.join();
  EXPECT_EQ(probe_got, "hello, dry pool");

  kill(child.pid, SIGTERM);
  ASSERT_NE(fgets(line, sizeof(line), f), nullptr);
  size_t waits = 0, in_use = 1;
  ASSERT_EQ(sscanf(line, "asio_echo: done: %zu waits for a buffer, %zu buffers",
                   &waits, &in_use),
            2)
      << line;
  EXPECT_GE(waits, 1u);
  EXPECT_EQ(in_use, 0u);
  child.out.reset();
  EXPECT_TRUE(ExitedCleanly(child));
}
#endif

}  // namespace

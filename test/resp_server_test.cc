// Runs examples/resp_server on loopback and drives it with redis-cli
// (Debian's redis-tools) and with raw sockets: the commands' replies, a
// 1 MiB value, inline and multi-bulk requests pipelined together, malformed
// input, and a client that sends half a command in small pieces and stalls
// (it must hold about its bytes, not a buffer per piece), a client whose
// unfinished command passes the query limit (it cannot starve the others),
// and the pool's counters it prints on SIGUSR1 (bench/run_resp_bench reads
// them). Each test ends the server and checks that every buffer went back to
// its pool.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <random>
#include <string>
#include <thread>

#include "gtest/gtest.h"
#include "test_util.h"

namespace {

using bufpool::testing_util::Child;
using bufpool::testing_util::ConnectToLoopback;
using bufpool::testing_util::ExitedCleanly;
using bufpool::testing_util::ReadListeningPort;
using bufpool::testing_util::StartChild;
using bufpool::testing_util::UniqueFd;

class RespServerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    child_ =
        StartChild(BUFPOOL_EXAMPLE_RESP_SERVER, {"resp_server", "0", "60"});
    ASSERT_GT(child_.pid, 0);
    port_ = ReadListeningPort(child_, "listening on 127.0.0.1:%d");
    ASSERT_NE(port_, 0);
  }
  void TearDown() override {
    if (child_.pid > 0) Stop();
  }
  // Ends the server (SIGALRM is its "time is up"); returns its last line.
  std::string Stop() {
    kill(child_.pid, SIGALRM);
    char line[256] = {};
    std::string last;
    while (fgets(line, sizeof(line), child_.out.get()) != nullptr) last = line;
    EXPECT_TRUE(ExitedCleanly(child_));
    child_.out.reset();
    EXPECT_EQ(last.rfind("done: 0 buffers in use", 0), 0u) << last;
    return last;
  }

  // redis-cli's output for `args` (its stdin from `input`, if given).
  std::string Cli(const std::string& args, const std::string& input = "") {
    std::string cmd = "redis-cli -p " + std::to_string(port_) + " " + args;
    if (!input.empty()) cmd += " < " + input;
    FILE* p = popen(cmd.c_str(), "r");
    std::string got;
    char buf[65536];
    size_t n;
    while ((n = fread(buf, 1, sizeof(buf), p)) > 0) got.append(buf, n);
    pclose(p);
    return got;
  }

  UniqueFd Connect() {
    UniqueFd fd = ConnectToLoopback(port_);
    EXPECT_TRUE(fd.valid()) << "connect: " << std::strerror(errno);
    const int one = 1;
    setsockopt(fd.get(), IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    return fd;
  }
  // Reads until `want` bytes came or the peer closed.
  static std::string ReadN(int fd, size_t want) {
    std::string got;
    char buf[65536];
    while (got.size() < want) {
      const ssize_t n = recv(fd, buf, sizeof(buf), 0);
      if (n <= 0) break;
      got.append(buf, static_cast<size_t>(n));
    }
    return got;
  }

  struct Stats {
    size_t in_use = 0, cached = 0, high_water = 0, buffer_size = 0, conns = 0;
  };
  // SIGUSR1, then the "stats:" line the server prints for it (lines before
  // it are skipped; a server that never prints fails by the test's timeout).
  Stats SignalForStats() {
    kill(child_.pid, SIGUSR1);
    char line[256];
    Stats s;
    while (fgets(line, sizeof(line), child_.out.get()) != nullptr) {
      if (sscanf(line,
                 "stats: in_use=%zu cached=%zu high_water=%zu buffer_size=%zu "
                 "conns=%zu",
                 &s.in_use, &s.cached, &s.high_water, &s.buffer_size,
                 &s.conns) == 5)
        return s;
    }
    ADD_FAILURE() << "the server's output ended before a stats line";
    return s;
  }

  Child child_;
  int port_ = 0;
};

bool HaveRedisCli() { return std::system("redis-cli -v >/dev/null 2>&1") == 0; }

TEST_F(RespServerTest, AnswersRedisCli) {
  if (!HaveRedisCli()) GTEST_SKIP() << "redis-cli (redis-tools) not installed";
  EXPECT_EQ(Cli("PING"), "PONG\n");
  EXPECT_EQ(Cli("ping hello"), "hello\n");
  EXPECT_EQ(Cli("ECHO 'hello world'"), "hello world\n");
  EXPECT_EQ(Cli("SET k v"), "OK\n");
  EXPECT_EQ(Cli("GET k"), "v\n");
  EXPECT_EQ(Cli("GET missing"), "\n");
  EXPECT_EQ(Cli("DEL k missing"), "1\n");
  EXPECT_EQ(Cli("GET k"), "\n");
  EXPECT_EQ(Cli("FLY away"),
            "ERR unknown command or wrong number of arguments for 'FLY'\n\n");
  EXPECT_EQ(Cli("GET"),
            "ERR unknown command or wrong number of arguments for 'GET'\n\n");
}

TEST_F(RespServerTest, StoresAndReturnsAOneMebibyteValue) {
  if (!HaveRedisCli()) GTEST_SKIP() << "redis-cli (redis-tools) not installed";
  std::string value(1 << 20, '\0');
  std::mt19937 rng(23);
  for (char& c : value) c = static_cast<char>('a' + rng() % 26);
  const std::string path = ::testing::TempDir() + "/resp_value";
  std::ofstream(path) << value;
  EXPECT_EQ(Cli("-x SET big", path), "OK\n");
  EXPECT_EQ(Cli("--raw GET big"), value + "\n");
  EXPECT_EQ(Cli("--raw -x ECHO", path), value + "\n");
  EXPECT_EQ(Cli("STRLEN big").rfind("ERR unknown command", 0), 0u);
}

TEST_F(RespServerTest, PipelinedInlineAndMultiBulkRequests) {
  const UniqueFd conn = Connect();
  const int fd = conn.get();
  const std::string reqs =
      "PING\r\n*3\r\n$3\r\nSET\r\n$1\r\na\r\n$5\r\nx\r\ny\n\r\n"
      "get a\n*2\r\n$3\r\nDEL\r\n$1\r\na\r\n  ECHO   spaced  \r\nGET a\r\n";
  const std::string want =
      "+PONG\r\n+OK\r\n$5\r\nx\r\ny\n\r\n:1\r\n$6\r\nspaced\r\n$-1\r\n";
  // All at once, then split at every byte (each piece its own receive).
  ASSERT_EQ(send(fd, reqs.data(), reqs.size(), 0),
            static_cast<ssize_t>(reqs.size()));
  EXPECT_EQ(ReadN(fd, want.size()), want);
  for (size_t cut = 1; cut < reqs.size(); cut += 7) {
    send(fd, reqs.data(), cut, 0);
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
    send(fd, reqs.data() + cut, reqs.size() - cut, 0);
    ASSERT_EQ(ReadN(fd, want.size()), want) << "cut at " << cut;
  }
}

TEST_F(RespServerTest, MalformedInputIsAnsweredAndTheConnectionClosed) {
  for (const auto& [req, want] :
       {std::pair<std::string, std::string>{
            "*2\r\nXYZ\r\n", "-ERR Protocol error: invalid bulk length\r\n"},
        {"*x\r\n", "-ERR Protocol error: invalid multibulk length\r\n"},
        {"*1\r\n$4\r\nPINGxx",
         "-ERR Protocol error: expected CRLF after a "
         "bulk string\r\n"},
        // Exactly the window of bytes, so the server reads all it was sent.
        {"PING\r\n" + std::string(65538, 'a'),
         "+PONG\r\n-ERR Protocol error: too big inline request\r\n"}}) {
    const UniqueFd fd = Connect();
    send(fd.get(), req.data(), req.size(), MSG_NOSIGNAL);
    EXPECT_EQ(ReadN(fd.get(), SIZE_MAX), want) << req.substr(0, 20);
  }
}

TEST_F(RespServerTest, AStalledHalfCommandHoldsAboutItsBytes) {
  const UniqueFd conn = Connect();
  const int fd = conn.get();
  const std::string head = "*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$20000\r\n";
  send(fd, head.data(), head.size(), 0);
  // 6000 bytes of the value in 300 receives of 20 bytes, then a stall.
  const std::string piece(20, 'v');
  for (int i = 0; i < 300; ++i) {
    send(fd, piece.data(), piece.size(), 0);
    std::this_thread::sleep_for(std::chrono::microseconds(300));
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  const std::string last = Stop();
  // 6042 bytes: two 4 KiB buffers, and the last receive's own.
  size_t held = 0;
  ASSERT_EQ(sscanf(last.c_str(),
                   "done: 0 buffers in use; a partial command held at most %zu",
                   &held),
            1)
      << last;
  EXPECT_LE(held, 4u) << last;
}

// One client sends a command that never ends (100 arguments of 2 MB, more
// than the whole 64 MiB pool): its budget stops it at the query limit with
// a RESP error and the connection is closed, while another client is
// answered throughout, and the pool never lends more than a fraction of
// itself (before budgets, the command took every buffer and starved the
// other client's receives).
TEST_F(RespServerTest, AHugeUnfinishedCommandCannotStarveAnotherClient) {
  UniqueFd hog_conn = Connect();
  UniqueFd other_conn = Connect();
  const int hog = hog_conn.get();
  const int other = other_conn.get();
  std::thread flood([hog] {
    const std::string head = "*100\r\n$3\r\nSET\r\n$1\r\nk\r\n";
    send(hog, head.data(), head.size(), MSG_NOSIGNAL);
    const std::string arg = "$2000000\r\n" + std::string(2000000, 'x') + "\r\n";
    for (int i = 0; i < 40; ++i) {  // 80 MB, unless the server closes first
      size_t sent = 0;
      while (sent < arg.size()) {
        const ssize_t n =
            send(hog, arg.data() + sent, arg.size() - sent, MSG_NOSIGNAL);
        if (n <= 0) return;
        sent += static_cast<size_t>(n);
      }
    }
  });
  for (int i = 0; i < 50; ++i) {
    send(other, "PING\r\n", 6, MSG_NOSIGNAL);
    const std::string pong = ReadN(other, 7);
    if (pong != "+PONG\r\n") {
      ADD_FAILURE() << "ping " << i << " got \"" << pong << "\"";
      shutdown(hog, SHUT_RDWR);  // so that the flood ends
      break;
    }
  }
  flood.join();
  // The error, then the end of the stream (or a reset, as the server closed
  // with the rest of the command unread).
  const std::string got = ReadN(hog, SIZE_MAX);
  EXPECT_EQ(got.rfind("-ERR Protocol error: query buffer limit of ", 0), 0u)
      << got.substr(0, 200);
  hog_conn.reset();
  send(other, "PING\r\n", 6, 0);
  EXPECT_EQ(ReadN(other, 7), "+PONG\r\n");
  const Stats s = SignalForStats();
  // 16384 buffers of 4 KiB: the hog's 8 MiB budget and the ring's 2048
  // lent buffers are well under half of them.
  EXPECT_LT(s.high_water * s.buffer_size, size_t{32} << 20)
      << "high water " << s.high_water << " buffers";
  other_conn.reset();
  Stop();
}

TEST_F(RespServerTest, PrintsThePoolsStatsOnSigusr1) {
  const Stats before = SignalForStats();
  EXPECT_EQ(before.conns, 0u);
  EXPECT_GT(before.buffer_size, 0u);
  EXPECT_GE(before.high_water, before.in_use);
  UniqueFd fds[3];
  for (UniqueFd& fd : fds) {
    fd = Connect();
    send(fd.get(), "PING\r\n", 6, 0);
    EXPECT_EQ(ReadN(fd.get(), 7), "+PONG\r\n");
  }
  const Stats idle = SignalForStats();  // three idle connections
  EXPECT_EQ(idle.conns, 3u);
  EXPECT_EQ(idle.buffer_size, before.buffer_size);
  EXPECT_LE(idle.in_use, before.in_use + 3) << "more than a buffer each";
  EXPECT_GE(idle.high_water, idle.in_use);
  for (UniqueFd& fd : fds) fd.reset();
  Stop();  // the stats lines come before "done: 0 buffers in use"
}

}  // namespace

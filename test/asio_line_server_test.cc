// Runs examples/asio_line_server on loopback with clients that send many
// lines ("\n" and "\r\n", empty ones, lines longer than a buffer) in random
// pieces and check every reply ("<length> <line>\n"), and one that sends a
// line over the limit and must get "ERR line too long" and end of stream;
// and a client that floods short lines before it reads.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "test_util.h"

namespace {

using bufpool::testing_util::Child;
using bufpool::testing_util::ExitedCleanly;
using bufpool::testing_util::ReadListeningPort;
using bufpool::testing_util::SendAndReadToEnd;
using bufpool::testing_util::StartChild;

// Sends `data` in random pieces of 1 to 3000 bytes, then half-closes;
// returns everything read until end of stream.
std::string Exchange(int port, const std::string& data, uint32_t seed) {
  std::mt19937 rng(seed);
  return SendAndReadToEnd(port, data,
                          [&rng](size_t) { return size_t{1 + rng() % 3000}; });
}

// Each test runs its own server on a port the kernel picks, and ends it
// with SIGTERM, after which it must exit cleanly.
class AsioLineServerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    server_ =
        StartChild(BUFPOOL_EXAMPLE_ASIO_LINE_SERVER, {"asio_line_server", "0"});
    ASSERT_GT(server_.pid, 0);
    port_ = ReadListeningPort(server_, "listening on 127.0.0.1:%d");
    ASSERT_NE(port_, 0);
  }
  void TearDown() override {
    if (port_ == 0) return;  // SetUp failed; ~Child kills the server
    kill(server_.pid, SIGTERM);
    EXPECT_TRUE(ExitedCleanly(server_));
  }

  Child server_;
  int port_ = 0;
};

TEST_F(AsioLineServerTest, AnswersEveryLineOfManyClients) {
  std::vector<std::string> sent(6), want(6), got(6);
  std::mt19937 rng(23);
  for (size_t c = 0; c < sent.size(); ++c) {
    for (int i = 0; i < 2000; ++i) {
      const size_t len = rng() % 8 == 0 ? rng() % 16384 : rng() % 100;
      std::string l(len, '\0');
      for (char& ch : l) ch = static_cast<char>(' ' + rng() % 90);
      sent[c] += l + (rng() % 2 ? "\r\n" : "\n");
      want[c] += std::to_string(len) + " " + l + "\n";
    }
  }
  std::vector<std::thread> clients;
  for (size_t c = 0; c < sent.size(); ++c) {
    clients.emplace_back([&, c] { got[c] = Exchange(port_, sent[c], c); });
  }
  for (auto& t : clients) t.join();
  for (size_t c = 0; c < sent.size(); ++c) {
    ASSERT_EQ(got[c].size(), want[c].size()) << "client " << c;
    EXPECT_TRUE(got[c] == want[c]) << "client " << c << ": replies differ";
  }

  // Over the limit (16 KiB): the lines before it are answered, then the
  // error, then end of stream.
  EXPECT_EQ(Exchange(port_, "ok\n" + std::string(16385, 'x') + "\n", 9),
            "2 ok\nERR line too long\n");
}

// A client that sends 8 MiB of two-byte lines and reads nothing for a
// second: the session's budget stops the server reading while the replies
// wait, and when the client reads, every reply comes, in order. (Linking
// each short line into its reply took a fresh buffer per line: the pool
// of 4,096 ran dry and the server closed the connection.)
TEST_F(AsioLineServerTest, ShortLinesSentWithoutReadingAreAllAnswered) {
  std::string sent;
  for (int i = 0; i < 4 << 20; ++i)
    sent += static_cast<char>('a' + i % 26), sent += '\n';
  // Reads nothing for a second; a server that stops answering fails the
  // test instead of hanging it.
  const std::string got = SendAndReadToEnd(
      port_, sent, [](size_t) { return size_t{65536}; },
      {.read_after = std::chrono::seconds(1), .io_timeout_seconds = 20});
  ASSERT_EQ(got.size(), sent.size() * 2);
  bool same = true;
  for (size_t i = 0; i < sent.size() / 2 && same; ++i) {
    same = got.compare(i * 4, 4, std::string("1 ") + sent[2 * i] + "\n") == 0;
  }
  EXPECT_TRUE(same);
}

}  // namespace

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

#include <cstdio>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "test_util.h"

namespace {

using bufpool::testing_util::Child;
using bufpool::testing_util::ConnectToLoopback;
using bufpool::testing_util::ExitedCleanly;
using bufpool::testing_util::ReadListeningPort;
using bufpool::testing_util::SendAndReadToEnd;
using bufpool::testing_util::StartWithStdoutPipe;

// Sends `data` in pieces of 7000 bytes and reads until end of stream.
std::string Echo(int port, const std::string& data) {
  return SendAndReadToEnd(port, data, [](size_t) { return size_t{7000}; });
}

TEST(UringEchoExampleTest, EchoesOnLoopbackAndEndsWithEveryBufferBack) {
  const Child child =
      StartWithStdoutPipe(BUFPOOL_EXAMPLE_URING_ECHO, {"uring_echo", "0", "3"});
  ASSERT_GT(child.pid, 0);
  FILE* f = child.out;
  const int port = ReadListeningPort(child, "listening on 127.0.0.1:%d");
  ASSERT_NE(port, 0);

  const int lingering = ConnectToLoopback(port);  // open when the time runs out
  ASSERT_GE(lingering, 0);
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
  EXPECT_LE(recv(lingering, &c, 1, 0), 0);
  close(lingering);
  char line[256] = {};
  ASSERT_NE(fgets(line, sizeof(line), f), nullptr);
  EXPECT_STREQ(line, "done: 0 buffers in use\n");
  fclose(f);
  EXPECT_TRUE(ExitedCleanly(child.pid));
}

#if defined(BUFPOOL_EXAMPLE_ASIO_ECHO) && defined(BUFPOOL_ECHO_LOAD)
// examples/asio_echo under bufpool-echo-load with messages of 1 to 65,536
// bytes on 8 connections: every byte comes back (the load checks them) and
// the server stops cleanly on SIGTERM.
TEST(AsioEchoExampleTest, ServesTheEchoLoadWithMessagesUpTo64KiB) {
  const Child child =
      StartWithStdoutPipe(BUFPOOL_EXAMPLE_ASIO_ECHO, {"asio_echo", "0"});
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
  EXPECT_TRUE(ExitedCleanly(child.pid));
  fclose(child.out);
}
#endif

}  // namespace

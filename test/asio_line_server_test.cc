// Runs examples/asio_line_server on loopback with clients that send many
// lines ("\n" and "\r\n", empty ones, lines longer than a buffer) in random
// pieces and check every reply ("<length> <line>\n"), and one that sends a
// line over the limit and must get "ERR line too long" and end of stream.
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

namespace {

int Connect(int port) {
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_port = htons(static_cast<uint16_t>(port));
  sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, reinterpret_cast<sockaddr*>(&sa), sizeof(sa)) != 0) {
    close(fd);
    return -1;
  }
  return fd;
}

// Sends `data` in random pieces (from a second thread), then half-closes;
// returns everything read until end of stream.
std::string Exchange(int port, const std::string& data, uint32_t seed) {
  const int fd = Connect(port);
  if (fd < 0) return "connect failed";
  std::thread writer([&] {
    std::mt19937 rng(seed);
    for (size_t at = 0; at < data.size();) {
      const size_t n = std::min<size_t>(1 + rng() % 3000, data.size() - at);
      const ssize_t sent = send(fd, data.data() + at, n, MSG_NOSIGNAL);
      if (sent <= 0) break;
      at += static_cast<size_t>(sent);
    }
    shutdown(fd, SHUT_WR);
  });
  std::string got;
  char buf[65536];
  ssize_t n;
  while ((n = recv(fd, buf, sizeof(buf), 0)) > 0) got.append(buf, n);
  writer.join();
  close(fd);
  return got;
}

TEST(AsioLineServerTest, AnswersEveryLineOfManyClients) {
  int out[2];
  ASSERT_EQ(pipe(out), 0);
  const pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    dup2(out[1], 1);
    execl(BUFPOOL_EXAMPLE_ASIO_LINE_SERVER, "asio_line_server", "0", nullptr);
    _exit(127);
  }
  close(out[1]);
  FILE* f = fdopen(out[0], "r");
  char line[256] = {};
  ASSERT_NE(fgets(line, sizeof(line), f), nullptr);
  int port = 0;
  ASSERT_EQ(sscanf(line, "listening on 127.0.0.1:%d", &port), 1) << line;

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
    clients.emplace_back([&, c] { got[c] = Exchange(port, sent[c], c); });
  }
  for (auto& t : clients) t.join();
  for (size_t c = 0; c < sent.size(); ++c) {
    ASSERT_EQ(got[c].size(), want[c].size()) << "client " << c;
    EXPECT_TRUE(got[c] == want[c]) << "client " << c << ": replies differ";
  }

  // Over the limit (16 KiB): the lines before it are answered, then the
  // error, then end of stream.
  EXPECT_EQ(Exchange(port, "ok\n" + std::string(16385, 'x') + "\n", 9),
            "2 ok\nERR line too long\n");

  kill(pid, SIGTERM);
  int status = 0;
  waitpid(pid, &status, 0);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
  fclose(f);
}

}  // namespace

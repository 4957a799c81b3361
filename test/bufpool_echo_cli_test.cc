// The command lines of bufpool-echo and bufpool-echo-load, run as the
// INSTALLED programs (the tools_install fixture puts them under
// BUFPOOL_INSTALLED_BIN): both flag forms, --help, and every exit code (0
// served / verified; 1 a failed bind, a refused connection, a wrong byte;
// 2 usage).
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "run_tool.h"
#include "test_util.h"

namespace {

const std::string kEcho = std::string(BUFPOOL_INSTALLED_BIN) + "/bufpool-echo";
const std::string kLoad =
    std::string(BUFPOOL_INSTALLED_BIN) + "/bufpool-echo-load";

using bufpool_test::Result;
using bufpool_test::Slurp;

using bufpool::testing_util::Child;
using bufpool::testing_util::ExitedCleanly;
using bufpool::testing_util::StartChild;
using bufpool::testing_util::UniqueFd;

class EchoCliTest : public testing::Test {
 protected:
  void SetUp() override {
    for (const std::string& bin : {kEcho, kLoad}) {
      ASSERT_EQ(access(bin.c_str(), X_OK), 0)
          << bin << ": " << std::strerror(errno) << " (is it installed?)";
    }
    std::string tmpl = "/tmp/bufpool_echo_cli_test.XXXXXX";
    ASSERT_NE(mkdtemp(tmpl.data()), nullptr) << std::strerror(errno);
    dir_ = tmpl;
  }
  void TearDown() override {
    ASSERT_EQ(std::system(("rm -rf '" + dir_ + "'").c_str()), 0);
  }

  // Runs `bin` with `args` to completion; stdin from /dev/null.
  Result Run(const std::string& bin, const std::vector<std::string>& args) {
    return bufpool_test::RunTool(bin, args, dir_);
  }

  // A running bufpool-echo, killed when it goes out of scope unless
  // stopped.
  struct Server {
    Child child;          // its pid and stdout
    std::string address;  // from "listening on HOST:PORT"
  };

  // Starts bufpool-echo with `args` and reads its first line.
  Server StartEcho(const std::vector<std::string>& args) {
    std::vector<std::string> all = {kEcho};
    all.insert(all.end(), args.begin(), args.end());
    Server s{.child = StartChild(kEcho, all), .address = {}};
    const std::string first = ReadLine(s.child.out.get());
    if (first.rfind("listening on ", 0) == 0) {
      s.address = first.substr(strlen("listening on "));
      if (!s.address.empty()) s.address.pop_back();  // '\n'
    }
    return s;
  }

  // SIGTERM; returns the exit status and the summary line.
  int Stop(Server& s, std::string* summary) {
    kill(s.child.pid, SIGTERM);
    const int status = s.child.Wait();
    *summary = ReadLine(s.child.out.get());
    s.child.out.reset();
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  }

  static std::string ReadLine(FILE* f) {
    char line[1024];
    if (f == nullptr || fgets(line, sizeof(line), f) == nullptr) return "";
    return line;
  }

  // A usage error: exit 2, one line naming `what`, nothing on stdout.
  void ExpectUsageError(const std::string& bin,
                        const std::vector<std::string>& args,
                        const std::string& what) {
    SCOPED_TRACE(args.empty() ? "(no args)" : args[0]);
    Result r = Run(bin, args);
    const std::string tool = bin.substr(bin.rfind('/') + 1);
    EXPECT_EQ(r.status, 2) << r.err;
    EXPECT_EQ(r.out, "");
    EXPECT_EQ(r.err.rfind(tool + ": ", 0), 0u) << r.err;
    EXPECT_NE(r.err.find(what), std::string::npos) << r.err;
    EXPECT_TRUE(r.err.ends_with("; see '" + tool + " --help'\n")) << r.err;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
  }

  // The body of WorkersServeOnWhenOneIsKilledAndEveryBufferComesBack.
  void WorkersServeOnWhenOneIsKilled(const std::string& engine);

  std::string dir_;
};

TEST_F(EchoCliTest, ServesAndVerifiesWithBothFlagForms) {
  const std::vector<std::vector<std::string>> echo_forms = {
      {"--listen=127.0.0.1:0", "--engine=epoll", "--buffer-count=64",
       "--buffer-size=1024", "--max-unsent=65536"},
      {"--listen", "127.0.0.1:0", "--engine", "epoll", "--buffer-count", "64",
       "--buffer-size", "1024", "--max-unsent", "65536"}};
  for (const auto& form : echo_forms) {
    Server s = StartEcho(form);
    ASSERT_GT(s.child.pid, 0);
    ASSERT_EQ(s.address.rfind("127.0.0.1:", 0), 0u) << s.address;
    const std::vector<std::vector<std::string>> load_forms = {
        {"--target=" + s.address, "--connections=2", "--messages=5",
         "--size=1:3000", "--seed=3"},
        {"--target", s.address, "--connections", "2", "--messages", "5",
         "--size", "1:3000", "--seed", "3"}};
    for (const auto& load : load_forms) {
      Result r = Run(kLoad, load);
      EXPECT_EQ(r.status, 0) << r.err;
      EXPECT_EQ(r.out.rfind("verified 10 messages", 0), 0u) << r.out;
      EXPECT_NE(r.out.find("on 2 connections"), std::string::npos) << r.out;
    }
    std::string summary;
    EXPECT_EQ(Stop(s, &summary), 0);
    EXPECT_EQ(summary.rfind("stopped: engine=epoll ", 0), 0u) << summary;
    EXPECT_NE(summary.find("connections=4 "), std::string::npos) << summary;
    EXPECT_NE(summary.find("/64 "), std::string::npos) << summary;  // pool
  }
}

// TCP sockets listening on `port` now (/proc/net/tcp, state 0A).
int ListenersOn(int port) {
  std::ifstream tcp("/proc/net/tcp");
  char want[16];
  std::snprintf(want, sizeof(want), ":%04X ", port);
  int n = 0;
  for (std::string line; std::getline(tcp, line);) {
    std::istringstream fields(line);
    std::string slot, local, remote, state;
    fields >> slot >> local >> remote >> state;
    if ((local + " ").find(want) != std::string::npos && state == "0A") ++n;
  }
  return n;
}

// --workers: three workers on one shared pool; one killed with -9 while a
// client loads the server: the parent reports it and what it reclaimed,
// the other two keep serving new clients, and at the stop every buffer of
// the pool is free again.
// Both engines: epoll, and uring, whose rings lend the shared pool's slots
// to each worker's kernel ring (epoll where io_uring is unavailable).
TEST_F(EchoCliTest, WorkersServeOnWhenOneIsKilledAndEveryBufferComesBack) {
  SKIP_FORKED_JOIN_UNDER_TSAN();  // its workers join in fork() children
  for (const char* engine : {"--engine=epoll", "--engine=uring"}) {
    SCOPED_TRACE(engine);
    WorkersServeOnWhenOneIsKilled(engine);
  }
}

void EchoCliTest::WorkersServeOnWhenOneIsKilled(const std::string& engine) {
  Child echo = StartChild(kEcho,
                          {kEcho, "--workers=3", engine, "--buffer-count=512",
                           "--buffer-size=4096", "--listen=127.0.0.1:0"},
                          bufpool::testing_util::ChildOutput::kStdoutAndStderr);
  ASSERT_GT(echo.pid, 0);
  std::string line = ReadLine(echo.out.get());
  ASSERT_EQ(line.rfind("listening on 127.0.0.1:", 0), 0u) << line;
  const std::string address = line.substr(
      strlen("listening on "), line.size() - 1 - strlen("listening on "));
  line = ReadLine(echo.out.get());
  ASSERT_EQ(line.rfind("workers: ", 0), 0u) << line;
  std::istringstream pids(line.substr(strlen("workers: ")));
  std::vector<pid_t> workers;
  for (pid_t p; pids >> p;) workers.push_back(p);
  ASSERT_EQ(workers.size(), 3u) << line;

  // Load on many connections (spread over the three by the kernel), and
  // the kill in the middle of it.
  Child load =
      StartChild(kLoad, {kLoad, "--target=" + address, "--connections=24",
                         "--messages=200000", "--size=1:20000", "--seed=5"});
  ASSERT_GT(load.pid, 0);
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  ASSERT_EQ(kill(workers[0], SIGKILL), 0);
  line = ReadLine(echo.err.get());
  const std::string died = "bufpool-echo: worker " +
                           std::to_string(workers[0]) +
                           " died (signal 9); reclaimed ";
  ASSERT_EQ(line.rfind(died, 0), 0u) << line;
  EXPECT_GT(std::atol(line.c_str() + died.size()), 0) << line;
  EXPECT_TRUE(line.ends_with(" buffers\n")) << line;
  // Its connections to the dead worker were reset: its status says nothing.
  kill(load.pid, SIGKILL);
  load.Wait();

  // The dead worker's listener goes when the kernel has torn down what the
  // process held (an io_uring ring's teardown runs after the process is
  // gone, and it holds the listener until then); connections the kernel
  // hands that listener meanwhile are reset. Then new clients are served
  // by the two left, every byte checked.
  const int port = std::atoi(address.c_str() + address.rfind(':') + 1);
  for (int i = 0; i < 500 && ListenersOn(port) != 2; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ASSERT_EQ(ListenersOn(port), 2);
  for (int i = 0; i < 3; ++i) {
    Result r = Run(kLoad, {"--target=" + address, "--connections=8",
                           "--messages=50", "--size=1:20000", "--seed=7"});
    EXPECT_EQ(r.status, 0) << r.err;
    EXPECT_EQ(r.out.rfind("verified 400 messages", 0), 0u) << r.out;
  }
  kill(echo.pid, SIGUSR1);
  line = ReadLine(echo.out.get());
  EXPECT_EQ(line.rfind("stats: workers=2/3 ", 0), 0u) << line;

  kill(echo.pid, SIGTERM);
  std::vector<std::string> stopped;
  std::string summary;
  while (!(line = ReadLine(echo.out.get())).empty()) {
    if (line.rfind("stopped: ", 0) == 0) summary = line;
    if (line.find(" stopped: engine=") != std::string::npos) {
      stopped.push_back(line);
    }
  }
  const int status = echo.Wait();
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
  EXPECT_EQ(stopped.size(), 2u);
  EXPECT_EQ(summary.rfind("stopped: workers=3 failed=1 ", 0), 0u) << summary;
  EXPECT_NE(summary.find(" pool_free=512/512\n"), std::string::npos) << summary;
}

TEST_F(EchoCliTest, EchoFailedBindIsExitOne) {
  Server first = StartEcho({"--engine=epoll", "--buffer-count=16"});
  ASSERT_GT(first.child.pid, 0);
  ASSERT_FALSE(first.address.empty());
  Result r = Run(kEcho, {"--listen", first.address, "--buffer-count=16"});
  EXPECT_EQ(r.status, 1) << r.err;
  EXPECT_EQ(r.out, "");
  EXPECT_EQ(r.err, "bufpool-echo: listen on " + first.address +
                       ": bind: Address already in use\n");
  std::string summary;
  EXPECT_EQ(Stop(first, &summary), 0);
}

TEST_F(EchoCliTest, EchoUsageErrorsExitTwo) {
  ExpectUsageError(kEcho, {"--frobnicate=1"}, "--frobnicate");
  ExpectUsageError(kEcho, {"stray"}, "stray");
  ExpectUsageError(kEcho, {"--engine=fast"}, "--engine: unknown engine 'fast'");
  ExpectUsageError(kEcho, {"--engine", "fast"}, "unknown engine 'fast'");
  ExpectUsageError(kEcho, {"--listen=foo"}, "--listen: 'foo'");
  ExpectUsageError(kEcho, {"--listen", "127.0.0.1:70000"}, "--listen");
  ExpectUsageError(kEcho, {"--buffer-count=0"},
                   "--buffer-count: 0 is out of range");
  ExpectUsageError(kEcho, {"--buffer-count", "x"}, "--buffer-count: 'x'");
  ExpectUsageError(kEcho, {"--buffer-size=100"},
                   "--buffer-size: '100' is not a power of two");
  ExpectUsageError(kEcho, {"--max-unsent=0"}, "--max-unsent");
  ExpectUsageError(kEcho, {"--listen"}, "--listen");
  ExpectUsageError(kEcho, {"--metrics-every=0"}, "--metrics-every");
  ExpectUsageError(kEcho, {"--metrics-every", "soon"}, "--metrics-every");
  ExpectUsageError(kEcho, {"--workers=0"}, "--workers: 0 is out of range");
  ExpectUsageError(kEcho, {"--workers", "many"}, "--workers: 'many'");
  ExpectUsageError(kEcho, {"--workers=2", "--max-buffers=8192"},
                   "--workers: a shared pool is a fixed pool");
}

// --metrics-every prints WriteMetrics() of the pool on stdout, each print
// ended by "# EOF", with a budget sample per open connection.
TEST_F(EchoCliTest, MetricsEveryPrintsThePoolAndItsConnectionsBudgets) {
  Server s = StartEcho(
      {"--engine=epoll", "--buffer-count=64", "--metrics-every=0.02"});
  ASSERT_GT(s.child.pid, 0);
  const size_t colon = s.address.rfind(':');
  const int port = std::stoi(s.address.substr(colon + 1));
  const UniqueFd conn = bufpool::testing_util::ConnectToLoopback(port);
  ASSERT_TRUE(conn.valid());
  ASSERT_EQ(write(conn.get(), "hello", 5),
            5);  // never read back: the bytes stay
  // Expositions until one shows the connection's budget (each print is a
  // fresh one; the count bounds the wait, not a clock).
  std::string print, seen;
  bool found = false;
  for (int prints = 0; prints < 500 && !found;) {
    const std::string line = ReadLine(s.child.out.get());
    if (line.empty()) break;  // the server died
    if (line != "# EOF\n") {
      print += line;
      continue;
    }
    ++prints;
    found = print.find(
                "bufpool_budget_pinned_bytes{pool=\"echo\",budget=\"conn ") !=
            std::string::npos;
    seen = std::move(print);
    print.clear();
  }
  EXPECT_TRUE(found) << seen;
  EXPECT_NE(seen.find("bufpool_pool_capacity_buffers{pool=\"echo\"} 64\n"),
            std::string::npos)
      << seen;
  EXPECT_NE(seen.find("# TYPE bufpool_budget_refusals_total counter\n"),
            std::string::npos)
      << seen;
  kill(s.child.pid, SIGTERM);
  EXPECT_TRUE(ExitedCleanly(s.child));
}

TEST_F(EchoCliTest, EchoHelpListsEveryFlagAndTheExitCodes) {
  for (const char* h : {"--help", "-h"}) {
    Result r = Run(kEcho, {h});
    EXPECT_EQ(r.status, 0);
    EXPECT_EQ(r.err, "");
    for (const char* word :
         {"usage: bufpool-echo", "--listen HOST:PORT", "--engine ENGINE",
          "--buffer-count, --buffers N", "--buffer-size BYTES",
          "--max-unsent BYTES", "--metrics-every SECONDS",
          "(default: 127.0.0.1:0)", "(default: uring)", "(default: 4096)",
          "(default: 262144)", "  0  success", "  1  the work failed",
          "  2  usage error"}) {
      EXPECT_NE(r.out.find(word), std::string::npos) << word;
    }
  }
}

TEST_F(EchoCliTest, LoadUsageErrorsExitTwo) {
  ExpectUsageError(kLoad, {"--target=foo"}, "--target: 'foo'");
  ExpectUsageError(kLoad, {"--target", "127.0.0.1:0"}, "--target");
  ExpectUsageError(kLoad, {}, "--target is required");
  const std::string t = "--target=127.0.0.1:9";
  ExpectUsageError(kLoad, {t, "--size=5:3"}, "MIN is larger than MAX");
  ExpectUsageError(kLoad, {t, "--size", "0:3"}, "--size: 0 is out of range");
  ExpectUsageError(kLoad, {t, "--connections=0"}, "--connections");
  ExpectUsageError(kLoad, {t, "--messages", "lots"}, "--messages: 'lots'");
  ExpectUsageError(kLoad, {t, "--seed=-1"}, "--seed");
  ExpectUsageError(kLoad, {t, "--bogus"}, "--bogus");
}

TEST_F(EchoCliTest, LoadHelpListsEveryFlagAndTheExitCodes) {
  Result r = Run(kLoad, {"--help"});
  EXPECT_EQ(r.status, 0);
  for (const char* word :
       {"usage: bufpool-echo-load", "--target HOST:PORT", "(required)",
        "--connections N", "(default: 64)", "--messages M", "(default: 1000)",
        "--size MIN:MAX", "(default: 1:4096)", "--seed S", "(default: 1)",
        "  0  success", "  1  the work failed", "  2  usage error"}) {
    EXPECT_NE(r.out.find(word), std::string::npos) << word;
  }
}

// A bound socket that does not listen: connecting to it is refused.
TEST_F(EchoCliTest, LoadRefusedConnectionIsExitOne) {
  UniqueFd fd(socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  ASSERT_TRUE(fd.valid());
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(bind(fd.get(), reinterpret_cast<sockaddr*>(&sa), sizeof(sa)), 0);
  socklen_t len = sizeof(sa);
  ASSERT_EQ(getsockname(fd.get(), reinterpret_cast<sockaddr*>(&sa), &len), 0);
  const std::string target = "127.0.0.1:" + std::to_string(ntohs(sa.sin_port));
  Result r =
      Run(kLoad, {"--target", target, "--connections=1", "--messages=1"});
  fd.reset();
  EXPECT_EQ(r.status, 1) << r.err;
  EXPECT_EQ(r.err.rfind("bufpool-echo-load: FAILED: ", 0), 0u) << r.err;
  EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
}

// A server that echoes every byte but flips the first of each read.
TEST_F(EchoCliTest, LoadMismatchIsExitOne) {
  sockaddr_in sa;
  UniqueFd listener = bufpool::testing_util::ListenOnLoopback(4, &sa);
  ASSERT_TRUE(listener.valid());
  std::thread bad([lfd = listener.get()] {
    const UniqueFd c(accept(lfd, nullptr, nullptr));
    if (!c.valid()) return;
    char buf[4096];
    for (;;) {
      const ssize_t n = read(c.get(), buf, sizeof buf);
      if (n <= 0) break;
      buf[0] ^= 0x5a;
      if (write(c.get(), buf, static_cast<size_t>(n)) != n) break;
    }
  });
  const std::string target = "127.0.0.1:" + std::to_string(ntohs(sa.sin_port));
  Result r = Run(kLoad, {"--target=" + target, "--connections=1",
                         "--messages=1", "--size=16:16"});
  bad.join();
  listener.reset();
  EXPECT_EQ(r.status, 1) << r.err;
  EXPECT_EQ(r.err.rfind("bufpool-echo-load: FAILED: DATA_LOSS", 0), 0u)
      << r.err;
}

}  // namespace

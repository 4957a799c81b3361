// Runs examples/frame_server on loopback under load: 20
// clients that send length-prefixed frames of 0-50 KB in chunks and check
// every reply byte for byte, 5 that send frames and never read, 3 that send
// half a frame and go idle, and a probe connection every 0.5 s. Checked: every
// good client gets every frame back exactly, no stretch without progress
// longer than the hang guard, at least 80% of the probes answered, no
// budget past its max_bytes (what the never-readers and idle half frames
// hold), and every buffer back in the pool at the end.
//
// The CI form (this binary run by ctest) sends a few frames per client on 160
// and on 64 buffers. The long form is the same driver with
//   FRAME_SERVER_FRAMES=200 FRAME_SERVER_GUARD_S=20 frame_server_test
// (bench/run_frame_server_bench runs it for 60 and 200 frames and both pool
// sizes, and with FRAME_SERVER_ADMISSION=off, the server as the docs used to
// describe it, which stops serving).
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
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
using bufpool::testing_util::StartChild;
using bufpool::testing_util::UniqueFd;
using Clock = std::chrono::steady_clock;

size_t EnvOr(const char* name, size_t fallback) {
  const char* v = std::getenv(name);
  return v != nullptr && *v != '\0' ? std::strtoul(v, nullptr, 10) : fallback;
}

std::string Frame(size_t payload, std::mt19937& rng) {
  std::string f(4 + payload, '\0');
  f[0] = static_cast<char>(payload >> 24);
  f[1] = static_cast<char>(payload >> 16);
  f[2] = static_cast<char>(payload >> 8);
  f[3] = static_cast<char>(payload);
  for (size_t i = 4; i < f.size(); ++i) f[i] = static_cast<char>(rng());
  return f;
}

void SetTimeouts(int fd, int ms) {
  timeval tv{ms / 1000, (ms % 1000) * 1000};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
}

// Sends all of `data` (false when the peer is gone or `stop` is set while
// the socket stays full).
bool SendAll(int fd, const char* data, size_t n,
             const std::atomic<bool>& stop) {
  while (n > 0) {
    const ssize_t w = send(fd, data, n, MSG_NOSIGNAL);
    if (w > 0) {
      data += w;
      n -= static_cast<size_t>(w);
    } else if (w < 0 && (errno == EAGAIN || errno == EINTR)) {
      if (stop.load()) return false;
    } else {
      return false;
    }
  }
  return true;
}

// Reads exactly `n` bytes; false on end of stream, error, or `stop`.
bool RecvAll(int fd, char* data, size_t n, const std::atomic<bool>& stop) {
  while (n > 0) {
    const ssize_t r = recv(fd, data, n, 0);
    if (r > 0) {
      data += r;
      n -= static_cast<size_t>(r);
    } else if (r < 0 && (errno == EAGAIN || errno == EINTR)) {
      if (stop.load()) return false;
    } else {
      return false;
    }
  }
  return true;
}

struct LoadResult {
  size_t good_done = 0;   // good clients that got every frame back
  size_t frames_ok = 0;   // frames that came back exact
  size_t mismatches = 0;  // frames that came back wrong
  size_t probes = 0, probes_answered = 0;
  double longest_gap_s = 0;  // the longest stretch without a good frame
  double seconds = 0;
  bool hung = false;  // a stretch past the guard
};

class FrameServerTest : public ::testing::Test {
 protected:
  void Start(size_t buffers, const std::string& admission = "on") {
    buffers_ = buffers;
    child_ = StartChild(
        std::string(BUFPOOL_EXAMPLE_FRAME_SERVER),
        {"frame_server", "--port", "0", "--buffers", std::to_string(buffers),
         "--buffer-size", "4096", "--stall-ms",
         std::to_string(EnvOr("FRAME_SERVER_STALL_MS", 1000)), "--admission",
         admission},
        ChildOutput::kStdoutAndStderr);
    ASSERT_GT(child_.pid, 0);
    port_ = ReadListeningPort(child_, "listening on 127.0.0.1:%d");
    ASSERT_NE(port_, 0);
    err_reader_ = std::thread([this] {
      char line[512];
      while (std::fgets(line, sizeof(line), child_.err.get()) != nullptr) {
        std::lock_guard<std::mutex> lock(mu_);
        err_.emplace_back(line);
      }
    });
  }
  void TearDown() override {
    if (child_.pid > 0) kill(child_.pid, SIGKILL);
    if (err_reader_.joinable()) err_reader_.join();
  }

  // SIGUSR1; waits for the "server:" line that ends the report and returns
  // the report's lines.
  std::vector<std::string> Stats() {
    size_t from;
    {
      std::lock_guard<std::mutex> lock(mu_);
      from = err_.size();
    }
    kill(child_.pid, SIGUSR1);
    const auto end = Clock::now() + std::chrono::seconds(10);
    while (Clock::now() < end) {
      {
        std::lock_guard<std::mutex> lock(mu_);
        for (size_t i = from; i < err_.size(); ++i) {
          if (err_[i].rfind("server:", 0) == 0) {
            return std::vector<std::string>(err_.begin() + from,
                                            err_.begin() + i + 1);
          }
        }
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    ADD_FAILURE() << "no stats report within 10 s";
    return {};
  }

  // Every budget in a report within its max_bytes, pinned and high water.
  void ExpectBudgetsWithinLimits(const std::vector<std::string>& report) {
    size_t budgets = 0, most_pinned = 0, most_high = 0, max_of_all = 0;
    for (const std::string& l : report) {
      size_t pinned, high, max;
      unsigned long long refusals;
      const size_t q = l.find("\": ");
      if (l.rfind("budget \"", 0) != 0 || q == std::string::npos) continue;
      ASSERT_EQ(std::sscanf(l.c_str() + q + 3,
                            "pinned=%zu high_water=%zu max=%zu refusals=%llu",
                            &pinned, &high, &max, &refusals),
                4)
          << l;
      ++budgets;
      most_pinned = std::max(most_pinned, pinned);
      most_high = std::max(most_high, high);
      max_of_all = std::max(max_of_all, max);
      EXPECT_LE(pinned, max) << l;
      EXPECT_LE(high, max) << l;
    }
    std::printf(
        "%zu budgets live at the end: most pinned %zu, highest high water "
        "%zu, max_bytes %zu\n",
        budgets, most_pinned, most_high, max_of_all);
  }

  // Stops the server; expects a clean exit with every buffer back.
  void StopServer() {
    kill(child_.pid, SIGTERM);
    char line[256];
    std::string last;
    while (std::fgets(line, sizeof(line), child_.out.get()) != nullptr) {
      last = line;
    }
    EXPECT_TRUE(ExitedCleanly(child_));
    EXPECT_EQ(last.rfind("done: 0 buffers in use", 0), 0u) << last;
  }

  std::string ServerErrors() {
    std::lock_guard<std::mutex> lock(mu_);
    std::string all;
    for (const std::string& l : err_) all += l;
    return all;
  }

  LoadResult RunLoad(size_t frames, double guard_s);
  void ServeTheLoadOn(size_t buffers);

  Child child_;
  int port_ = 0;
  size_t buffers_ = 0;
  std::mutex mu_;
  std::vector<std::string> err_;  // the server's stderr, by line
  std::thread err_reader_;
};

LoadResult FrameServerTest::RunLoad(size_t frames, double guard_s) {
  constexpr int kGood = 20, kNeverRead = 5, kIdleHalf = 3;
  constexpr size_t kMaxPayload = 50 * 1000;
  std::atomic<bool> stop{false}, good_over{false};
  std::atomic<size_t> frames_ok{0}, mismatches{0}, good_done{0};
  std::atomic<int64_t> last_progress{Clock::now().time_since_epoch().count()};
  const auto start = Clock::now();
  std::vector<std::thread> threads;

  for (int i = 0; i < kGood; ++i) {
    threads.emplace_back([&, i] {
      std::mt19937 rng(100 + i);
      UniqueFd fd = ConnectToLoopback(port_);
      if (!fd.valid()) return;
      SetTimeouts(fd.get(), 200);
      std::string reply;
      for (size_t f = 0; f < frames; ++f) {
        const std::string frame = Frame(rng() % (kMaxPayload + 1), rng);
        // In chunks of 1 byte to 16 KiB.
        for (size_t at = 0; at < frame.size();) {
          const size_t n =
              std::min<size_t>(frame.size() - at, 1 + rng() % (16 * 1024));
          if (!SendAll(fd.get(), frame.data() + at, n, stop)) return;
          at += n;
        }
        reply.assign(frame.size(), '\0');
        if (!RecvAll(fd.get(), reply.data(), reply.size(), stop)) return;
        if (reply != frame) {
          mismatches.fetch_add(1);
          return;
        }
        frames_ok.fetch_add(1);
        last_progress.store(Clock::now().time_since_epoch().count());
      }
      good_done.fetch_add(1);
    });
  }
  for (int i = 0; i < kNeverRead; ++i) {
    threads.emplace_back([&, i] {
      std::mt19937 rng(200 + i);
      const int fd = socket(AF_INET, SOCK_STREAM, 0);
      UniqueFd owned(fd);
      const int small = 4096;  // fills at once: the server's sends stall
      setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &small, sizeof(small));
      sockaddr_in sa{};
      sa.sin_family = AF_INET;
      sa.sin_port = htons(static_cast<uint16_t>(port_));
      sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
      if (connect(fd, reinterpret_cast<sockaddr*>(&sa), sizeof(sa)) != 0) {
        return;
      }
      SetTimeouts(fd, 200);
      while (!stop.load()) {
        const std::string frame = Frame(rng() % (kMaxPayload + 1), rng);
        if (!SendAll(fd, frame.data(), frame.size(), stop)) return;
      }
    });
  }
  for (int i = 0; i < kIdleHalf; ++i) {
    threads.emplace_back([&, i] {
      std::mt19937 rng(300 + i);
      UniqueFd fd = ConnectToLoopback(port_);
      if (!fd.valid()) return;
      SetTimeouts(fd.get(), 200);
      const std::string frame = Frame(kMaxPayload - rng() % 1000, rng);
      if (!SendAll(fd.get(), frame.data(), frame.size() / 2, stop)) return;
      while (!stop.load()) {
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
      }
    });
  }
  // Probes every 0.5 s while the good clients run (and for 3 s at least).
  std::atomic<size_t> probes{0}, answered{0};
  std::thread prober([&] {
    std::mt19937 rng(400);
    auto next = Clock::now();
    while (!good_over.load() ||
           Clock::now() - start < std::chrono::seconds(3)) {
      std::this_thread::sleep_until(next);
      next += std::chrono::milliseconds(500);
      probes.fetch_add(1);
      UniqueFd fd = ConnectToLoopback(port_);
      if (!fd.valid()) continue;
      SetTimeouts(fd.get(), 2000);
      const std::string frame = Frame(100, rng);
      std::string reply(frame.size(), '\0');
      std::atomic<bool> no_stop{true};  // one try of 2 s each way
      if (SendAll(fd.get(), frame.data(), frame.size(), no_stop) &&
          RecvAll(fd.get(), reply.data(), reply.size(), no_stop) &&
          reply == frame) {
        answered.fetch_add(1);
      }
    }
  });

  LoadResult r;
  // The hang guard: progress is a good frame back; a stretch without one
  // past the guard ends the run (the server's report is printed).
  while (good_done.load() + mismatches.load() < size_t{kGood}) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    const double gap =
        std::chrono::duration<double>(
            Clock::now() -
            Clock::time_point(Clock::duration(last_progress.load())))
            .count();
    r.longest_gap_s = std::max(r.longest_gap_s, gap);
    if (gap > guard_s) {
      r.hung = true;
      for (const std::string& l : Stats()) std::fputs(l.c_str(), stderr);
      break;
    }
  }
  r.seconds = std::chrono::duration<double>(Clock::now() - start).count();
  good_over = true;
  prober.join();
  // The never-readers and idle half frames are still connected (unless
  // the server closed them): what they hold is in the report.
  if (!r.hung) {
    const std::vector<std::string> report = Stats();
    for (const std::string& l : report) {  // the totals, not each budget
      if (l.rfind("budget ", 0) != 0) std::fputs(l.c_str(), stdout);
    }
    ExpectBudgetsWithinLimits(report);
  }
  stop = true;
  for (std::thread& t : threads) t.join();
  r.good_done = good_done.load();
  r.frames_ok = frames_ok.load();
  r.mismatches = mismatches.load();
  r.probes = probes.load();
  r.probes_answered = answered.load();
  std::printf(
      "frame_server %zu buffers, %zu frames/client: %zu/%d good clients done, "
      "%zu frames exact, %zu wrong, longest stretch without progress %.2f s, "
      "probes %zu/%zu, %.2f s%s\n",
      buffers_, frames, r.good_done, kGood, r.frames_ok, r.mismatches,
      r.longest_gap_s, r.probes_answered, r.probes, r.seconds,
      r.hung ? " (HUNG)" : "");
  return r;
}

void ExpectServed(const LoadResult& r, size_t frames) {
  EXPECT_FALSE(r.hung);
  EXPECT_EQ(r.mismatches, 0u);
  EXPECT_EQ(r.good_done, 20u);
  EXPECT_EQ(r.frames_ok, 20 * frames);
  EXPECT_GE(r.probes_answered * 5, r.probes * 4)
      << r.probes_answered << " of " << r.probes << " probes answered";
}

// Starts the server on `buffers` (admission as FRAME_SERVER_ADMISSION says,
// "on" by default), runs the load and expects every client served.
void FrameServerTest::ServeTheLoadOn(size_t buffers) {
  const char* admission = std::getenv("FRAME_SERVER_ADMISSION");
  ASSERT_NO_FATAL_FAILURE(
      Start(buffers, admission != nullptr ? admission : "on"));
  const size_t frames = EnvOr("FRAME_SERVER_FRAMES", 8);
  const LoadResult r = RunLoad(frames, EnvOr("FRAME_SERVER_GUARD_S", 8));
  ExpectServed(r, frames);
  StopServer();
  if (HasFailure()) std::fputs(ServerErrors().c_str(), stderr);
}

TEST_F(FrameServerTest, ServesEveryClientOn160Buffers) { ServeTheLoadOn(160); }

TEST_F(FrameServerTest, ServesEveryClientOn64Buffers) { ServeTheLoadOn(64); }

// Bad flags: one line naming the flag, exit status 2, no signal.
TEST_F(FrameServerTest, RefusesBadFlags) {
  for (const std::vector<std::string>& args :
       {std::vector<std::string>{"frame_server", "--buffers", "0"},
        std::vector<std::string>{"frame_server", "--port", "x"},
        std::vector<std::string>{"frame_server", "--admission", "maybe"},
        std::vector<std::string>{"frame_server", "--ring"}}) {
    Child c = StartChild(std::string(BUFPOOL_EXAMPLE_FRAME_SERVER), args,
                         ChildOutput::kStdoutAndStderr);
    ASSERT_GT(c.pid, 0);
    char line[512] = {};
    ASSERT_NE(std::fgets(line, sizeof(line), c.err.get()), nullptr);
    EXPECT_EQ(std::string(line).rfind("frame_server: ", 0), 0u) << line;
    EXPECT_NE(std::string(line).find(args[1]), std::string::npos) << line;
    int status = 0;
    ASSERT_EQ(waitpid(c.pid, &status, 0), c.pid);
    c.pid = -1;
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 2) << status;
  }
}

// A pool too small for the largest frame's grant: every frame's request is
// refused with the numbers, the connection closed, nothing lost.
TEST_F(FrameServerTest, AFrameThatCanNeverFitIsRefusedWithTheNumbers) {
  ASSERT_NO_FATAL_FAILURE(Start(24));  // ring 8, queue 12 buffers
  UniqueFd fd = ConnectToLoopback(port_);
  ASSERT_TRUE(fd.valid());
  SetTimeouts(fd.get(), 5000);
  std::mt19937 rng(5);
  const std::string big = Frame(60000, rng);  // 15 buffers + slack
  std::atomic<bool> no_stop{false};
  ASSERT_TRUE(SendAll(fd.get(), big.data(), 4, no_stop));
  char c;
  EXPECT_EQ(recv(fd.get(), &c, 1, 0), 0);  // closed, no reply
  // A small frame on a new connection is still served.
  UniqueFd ok = ConnectToLoopback(port_);
  SetTimeouts(ok.get(), 5000);
  const std::string small = Frame(5000, rng);
  std::string reply(small.size(), '\0');
  ASSERT_TRUE(SendAll(ok.get(), small.data(), small.size(), no_stop));
  ASSERT_TRUE(RecvAll(ok.get(), reply.data(), reply.size(), no_stop));
  EXPECT_EQ(reply, small);
  StopServer();
  const std::string errors = ServerErrors();
  EXPECT_NE(errors.find("AdmissionQueue(\"frames\"): budget \"conn 1\" can "
                        "never be granted 60004 bytes: they count 17 buffers"),
            std::string::npos)
      << errors;
  EXPECT_NE(errors.find("raise capacity_buffers or the pool's buffers"),
            std::string::npos)
      << errors;
}

}  // namespace

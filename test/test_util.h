// Helpers the tests share: one definition each, instead of a copy per test.
// Everything here is for tests only: a helper that cannot do its job fails
// the calling test (or, where a test could not go on safely, aborts with a
// message), so a test reads as the behaviour it checks.
#ifndef BUFPOOL_TEST_TEST_UTIL_H_
#define BUFPOOL_TEST_TEST_UTIL_H_

#include <arpa/inet.h>
#include <dirent.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <sched.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <bit>
#include <chrono>
#include <concepts>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <random>
#include <span>
#include <sstream>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/config.h"
#include "gtest/gtest.h"

// The pool and chain helpers are there for the tests that see the library's
// headers; the tests of whole programs, which do not link it, get the rest.
#if __has_include("bufpool/buffer_pool.h")
#define BUFPOOL_TEST_UTIL_HAS_LIBRARY 1
#include "bufpool/buffer_pool.h"
#include "bufpool/chain.h"
#endif

namespace bufpool::testing_util {

// True in the ASan and TSan builds, where each step costs several times
// more: loops that repeat a check many times run fewer rounds there, and a
// case that only scales an already-run check up (more connections, more
// threads) runs in the plain build alone.
#if defined(ABSL_HAVE_ADDRESS_SANITIZER) || defined(ABSL_HAVE_THREAD_SANITIZER)
inline constexpr bool kSanitized = true;
#else
inline constexpr bool kSanitized = false;
#endif

// For a test that joins a pool in a fork() child of a process that has a
// pool: under ThreadSanitizer the fork handler's re-initialised bulk gate
// (glibc's rwlock cannot be unlocked in the child, whose thread has a new
// TID) reads as a lock-order inversion there. The plain and ASan builds
// run these tests; TSan runs the single-process ones.
#if defined(ABSL_HAVE_THREAD_SANITIZER)
#define SKIP_FORKED_JOIN_UNDER_TSAN() \
  GTEST_SKIP() << "a pool joined in a fork() child: not under TSan"
#else
#define SKIP_FORKED_JOIN_UNDER_TSAN() \
  do {                                \
  } while (0)
#endif

#ifdef BUFPOOL_TEST_UTIL_HAS_LIBRARY
// ---- Pools and chains ----

// Keeps this thread (and threads it starts) on the CPU it runs on, for the
// tests that check high_water exactly: it is exact while one CPU's cache is
// in use, and a thread that migrates leaves free buffers in two.
class ScopedPin {
 public:
  ScopedPin() {
    CPU_ZERO(&saved_);
    ::sched_getaffinity(0, sizeof(saved_), &saved_);
    cpu_set_t one;
    CPU_ZERO(&one);
    CPU_SET(::sched_getcpu(), &one);
    ::sched_setaffinity(0, sizeof(one), &one);
  }
  ~ScopedPin() { ::sched_setaffinity(0, sizeof(saved_), &saved_); }

 private:
  cpu_set_t saved_;
};

// A pool made with `options`. A pool the test cannot have is a broken
// set-up, not a finding: the failure is reported and the test binary
// aborts (a death test must never "die" on a null pool instead).
inline std::unique_ptr<BufferPool> MakePool(const PoolOptions& options) {
  auto pool = BufferPool::Create(options);
  if (!pool.ok()) {
    ADD_FAILURE() << "BufferPool::Create: " << pool.status();
    std::fprintf(stderr, "BufferPool::Create: %s\n",
                 pool.status().ToString().c_str());
    std::abort();
  }
  return *std::move(pool);
}

// A small pool that maps lazily (no huge pages, no pre-faulting), so a test
// may make many: `count` buffers of `buffer_size` bytes, `cache` per CPU.
inline std::unique_ptr<BufferPool> MakePool(
    size_t buffer_size, size_t count, size_t cache = PoolOptions{}.cache_size) {
  return MakePool({.buffer_size = buffer_size,
                   .buffer_count = count,
                   .huge_pages = HugePages::kNever,
                   .populate = false,
                   .cache_size = cache});
}

// A lazily mapped pool of `count` buffers with the caches off, so that its
// high_water counts exactly the buffers that were held at once.
inline std::unique_ptr<BufferPool> MakeUncachedPool(size_t count) {
  return MakePool({.buffer_count = count,
                   .huge_pages = HugePages::kNever,
                   .populate = false,
                   .cache_size = 0});
}

// The bytes of `chain`, in order.
inline std::string Contents(const BufferChain& chain) {
  std::string s;
  for (absl::Span<const std::byte> part : chain.spans()) {
    s.append(reinterpret_cast<const char*>(part.data()), part.size());
  }
  return s;
}
#endif  // BUFPOOL_TEST_UTIL_HAS_LIBRARY

// ---- Bytes ----

// `n` bytes from `rng`, every byte of each draw (a draw per byte made
// filling megabytes the larger part of some tests under the sanitizers).
template <std::uniform_random_bit_generator Rng>
std::string RandomBytes(size_t n, Rng& rng) {
  static_assert(Rng::min() == 0 && (Rng::max() & (Rng::max() + 1ull)) == 0,
                "every bit of a draw must be random");
  constexpr size_t kBytes = std::bit_width(uint64_t{Rng::max()}) / 8;
  static_assert(kBytes >= 1 && kBytes <= 8);
  std::string s(n, '\0');
  for (size_t i = 0; i < n; i += kBytes) {
    const uint64_t w = rng();
    for (size_t j = 0; j < kBytes && i + j < n; ++j) {
      s[i + j] = static_cast<char>(w >> (8 * j));
    }
  }
  return s;
}

// `n` bytes from a fixed seed: the same bytes on every run.
inline std::string RandomBytes(size_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  return RandomBytes(n, rng);
}

// `n` bytes each drawn from `alphabet` (not empty), from a fixed seed: text
// dense in the bytes a parser looks for, such as "ab\r\n".
inline std::string RandomBytes(size_t n, uint64_t seed,
                               std::string_view alphabet) {
  std::mt19937_64 rng(seed);
  std::string s(n, '\0');
  for (char& c : s) c = alphabet[rng() % alphabet.size()];
  return s;
}

// ---- Threads ----

// A one-shot event built on std:: primitives, which ThreadSanitizer sees
// (Debian's Abseil is not instrumented, so absl::Notification would not
// be). A waiter sleeps in the kernel, as an idle worker does.
class Event {
 public:
  void Notify() {
    std::lock_guard<std::mutex> lock(mu_);
    done_ = true;
    cv_.notify_all();
  }
  void WaitForNotification() {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [this] { return done_; });
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool done_ = false;
};

// Waits until `done()` holds: true, or false after 60 s (a hang guard, not
// a timing assertion).
template <typename F>
bool Eventually(F done) {
  const auto deadline =
      std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (!done()) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  return true;
}

// Raises RLIMIT_NOFILE's soft limit to `want` (and, as root, the hard one).
inline void RaiseFileLimit(rlim_t want) {
  rlimit r{};
  ASSERT_EQ(getrlimit(RLIMIT_NOFILE, &r), 0);
  if (r.rlim_cur >= want) return;
  if (r.rlim_max < want && geteuid() == 0) r.rlim_max = want;
  r.rlim_cur = std::min(want, r.rlim_max);
  ASSERT_EQ(setrlimit(RLIMIT_NOFILE, &r), 0);
}

// ---- Files ----

// Writes `data` to `path` (created or truncated); with `mode`, chmods it.
inline void WriteFileOrDie(const std::string& path, const std::string& data,
                           std::optional<mode_t> mode = std::nullopt) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f.write(data.data(), static_cast<std::streamsize>(data.size()));
  ASSERT_TRUE(f.good()) << path;
  f.close();
  if (mode) {
    ASSERT_EQ(::chmod(path.c_str(), *mode), 0) << path;
  }
}

// The bytes of `path`; empty when it cannot be read.
inline std::string ReadFileOrDie(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

// lstat() of `path`; a failure fails the test and returns zeros.
inline struct stat Lstat(const std::string& path) {
  struct stat st {};
  EXPECT_EQ(::lstat(path.c_str(), &st), 0)
      << path << ": " << std::strerror(errno);
  return st;
}

// Names in `dir` that look like the copy engine's temporary files.
inline std::vector<std::string> TempFiles(const std::string& dir) {
  std::vector<std::string> out;
  DIR* d = ::opendir(dir.c_str());
  if (d == nullptr) return out;
  while (dirent* e = ::readdir(d)) {
    if (std::strstr(e->d_name, ".bufpool-copy.") != nullptr) {
      out.push_back(e->d_name);
    }
  }
  ::closedir(d);
  return out;
}

// ---- Descriptors ----

// Owns one file descriptor (a socket, a pipe's end, an eventfd, a file) and
// closes it when it goes out of scope, so a test that stops at a failed
// ASSERT leaks none. Holds -1 when it owns none. Move-only.
class UniqueFd {
 public:
  UniqueFd() = default;
  explicit UniqueFd(int fd) : fd_(fd) {}
  UniqueFd(UniqueFd&& other) noexcept : fd_(other.release()) {}
  UniqueFd& operator=(UniqueFd&& other) noexcept {
    reset(other.release());
    return *this;
  }
  ~UniqueFd() { reset(); }

  int get() const { return fd_; }
  bool valid() const { return fd_ >= 0; }
  // Gives the descriptor up without closing it; the caller owns it.
  int release() { return std::exchange(fd_, -1); }
  // Closes the descriptor held, if any, and holds `fd` instead.
  void reset(int fd = -1) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = fd;
  }
  // Closes the descriptor now and returns what close() returned, for a
  // test that checks it (and errno).
  int Close() { return ::close(std::exchange(fd_, -1)); }

 private:
  int fd_ = -1;
};

// socketpair(AF_UNIX, type, 0) into `fds`; returns what socketpair returned.
inline int SocketPair(int type, std::span<UniqueFd, 2> fds) {
  int raw[2];
  const int r = ::socketpair(AF_UNIX, type, 0, raw);
  if (r == 0) {
    fds[0].reset(raw[0]);
    fds[1].reset(raw[1]);
  }
  return r;
}

// pipe2(flags) into `fds` (fds[0] reads, fds[1] writes); returns what pipe2
// returned.
inline int Pipe(std::span<UniqueFd, 2> fds, int flags = 0) {
  int raw[2];
  const int r = ::pipe2(raw, flags);
  if (r == 0) {
    fds[0].reset(raw[0]);
    fds[1].reset(raw[1]);
  }
  return r;
}

// ---- Sockets ----

// Sets O_NONBLOCK on `fd`; a failure fails the calling test (call it
// through ASSERT_NO_FATAL_FAILURE where the test must stop).
inline void SetNonBlocking(int fd) {
  ASSERT_EQ(::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) | O_NONBLOCK), 0);
}

// A TCP listener on 127.0.0.1 at a port the kernel picks, with its address
// in `*bound`; none (and a test failure) when it cannot be made.
inline UniqueFd ListenOnLoopback(int backlog, sockaddr_in* bound) {
  UniqueFd fd(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  EXPECT_TRUE(fd.valid()) << std::strerror(errno);
  if (!fd.valid()) return fd;
  *bound = sockaddr_in{};
  bound->sin_family = AF_INET;
  bound->sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(*bound);
  auto* sa = reinterpret_cast<sockaddr*>(bound);
  if (::bind(fd.get(), sa, sizeof(*bound)) != 0 ||
      ::listen(fd.get(), backlog) != 0 ||
      ::getsockname(fd.get(), sa, &len) != 0) {
    ADD_FAILURE() << "listening on loopback: " << std::strerror(errno);
    return UniqueFd();
  }
  return fd;
}

// A TCP connection to 127.0.0.1:`port`, or none.
inline UniqueFd ConnectToLoopback(int port) {
  UniqueFd fd(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (!fd.valid()) return fd;
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_port = htons(static_cast<uint16_t>(port));
  sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd.get(), reinterpret_cast<sockaddr*>(&sa), sizeof(sa)) != 0) {
    return UniqueFd();
  }
  return fd;
}

// Both ends of one TCP connection over loopback.
struct LoopbackConnection {
  UniqueFd client;  // the end that connected
  UniqueFd server;  // the end the listener accepted
};

// Connects to the listener `listener` bound at `addr` and accepts the
// connection; both ends invalid (and a test failure) when it cannot.
inline LoopbackConnection ConnectAndAccept(int listener,
                                           const sockaddr_in& addr) {
  LoopbackConnection c;
  c.client.reset(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (!c.client.valid() ||
      ::connect(c.client.get(), reinterpret_cast<const sockaddr*>(&addr),
                sizeof(addr)) != 0) {
    ADD_FAILURE() << "connect: " << std::strerror(errno);
    return {};
  }
  c.server.reset(::accept4(listener, nullptr, nullptr, SOCK_CLOEXEC));
  if (!c.server.valid()) {
    ADD_FAILURE() << "accept: " << std::strerror(errno);
    return {};
  }
  return c;
}

// One TCP connection over loopback, through a listener that lives only
// while it is made; both ends invalid (and a test failure) when it cannot.
inline LoopbackConnection ConnectOverLoopback() {
  sockaddr_in addr;
  const UniqueFd listener = ListenOnLoopback(1, &addr);
  if (!listener.valid()) return {};
  return ConnectAndAccept(listener.get(), addr);
}

// A Unix stream socket bound at `path`, which leaves a socket file there;
// none (and a test failure) when it cannot be made.
inline UniqueFd BindUnixSocket(const std::string& path) {
  UniqueFd fd(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::strncpy(addr.sun_path, path.c_str(), sizeof(addr.sun_path) - 1);
  if (!fd.valid() ||
      ::bind(fd.get(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    ADD_FAILURE() << "a socket at " << path << ": " << std::strerror(errno);
    return UniqueFd();
  }
  return fd;
}

// How SendAndReadToEnd reads: after a pause (a client that sends before it
// reads anything), and with a limit on each send and receive (0: none), so
// a server that stops answering fails the test instead of hanging it.
struct ReadToEndOptions {
  std::chrono::milliseconds read_after{0};
  int io_timeout_seconds = 0;
};

// Connects to 127.0.0.1:`port`, sends `data` from a second thread in pieces
// of `piece(left)` bytes (at most `left`), half-closes, and returns every
// byte read until end of stream ("connect failed" when it cannot connect).
inline std::string SendAndReadToEnd(int port, const std::string& data,
                                    std::function<size_t(size_t)> piece,
                                    const ReadToEndOptions& options = {}) {
  const UniqueFd conn = ConnectToLoopback(port);
  if (!conn.valid()) return "connect failed";
  const int fd = conn.get();
  if (options.io_timeout_seconds > 0) {
    const timeval limit{.tv_sec = options.io_timeout_seconds, .tv_usec = 0};
    if (::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &limit, sizeof(limit)) != 0 ||
        ::setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &limit, sizeof(limit)) != 0) {
      return "setsockopt failed";
    }
  }
  std::thread writer([&] {
    for (size_t at = 0; at < data.size();) {
      const size_t n = std::min(piece(data.size() - at), data.size() - at);
      const ssize_t sent = ::send(fd, data.data() + at, n, MSG_NOSIGNAL);
      if (sent <= 0) break;
      at += static_cast<size_t>(sent);
    }
    ::shutdown(fd, SHUT_WR);
  });
  std::this_thread::sleep_for(options.read_after);
  std::string got;
  char buf[65536];
  ssize_t n;
  while ((n = ::recv(fd, buf, sizeof(buf), 0)) > 0) got.append(buf, n);
  writer.join();
  return got;
}

// ---- Programs under test ----

// Closes a FILE* (a std::unique_ptr deleter).
struct FileCloser {
  void operator()(FILE* f) const { std::fclose(f); }
};
using UniqueFile = std::unique_ptr<FILE, FileCloser>;

// Which of a started program's outputs come to the test on pipes.
enum class ChildOutput { kStdout, kStdoutAndStderr };

// A program started with its stdout (and, if asked, its stderr) on pipes
// the test reads. One not yet waited for when its Child goes out of scope or is
// assigned over (a test that stopped at a failed ASSERT) is killed and waited
// for.
struct Child {
  Child() = default;
  Child(Child&& other) noexcept
      : pid(std::exchange(other.pid, -1)),
        out(std::move(other.out)),
        err(std::move(other.err)) {}
  Child& operator=(Child&& other) noexcept {
    if (this != &other) {
      KillAndWait();
      pid = std::exchange(other.pid, -1);
      out = std::move(other.out);
      err = std::move(other.err);
    }
    return *this;
  }
  ~Child() { KillAndWait(); }

  // Waits for the program to end and returns its wait status; -1 (and a
  // test failure) when waitpid fails.
  int Wait() {
    int status = 0;
    if (::waitpid(std::exchange(pid, -1), &status, 0) < 0) {
      ADD_FAILURE() << "waitpid: " << std::strerror(errno);
      return -1;
    }
    return status;
  }

  pid_t pid = -1;  // -1 once waited for (ExitedCleanly(Child&))
  UniqueFile out;  // the program's stdout
  UniqueFile err;  // its stderr, with ChildOutput::kStdoutAndStderr

 private:
  void KillAndWait() {
    if (pid <= 0) return;
    ::kill(pid, SIGKILL);
    ::waitpid(pid, nullptr, 0);
    pid = -1;
  }
};

// Starts `path` with `args` (argv[0] first), its stdout (and, as `output`
// says, its stderr) to pipes. On failure the test fails and pid is -1.
inline Child StartChild(const char* path, const std::vector<const char*>& args,
                        ChildOutput output = ChildOutput::kStdout) {
  const bool with_err = output == ChildOutput::kStdoutAndStderr;
  UniqueFd out[2], err[2];
  if (Pipe(out, O_CLOEXEC) != 0 || (with_err && Pipe(err, O_CLOEXEC) != 0)) {
    ADD_FAILURE() << "pipe: " << std::strerror(errno);
    return {};
  }
  std::vector<const char*> argv = args;
  argv.push_back(nullptr);
  Child child;
  child.pid = ::fork();
  if (child.pid == 0) {
    ::dup2(out[1].get(), 1);
    if (with_err) ::dup2(err[1].get(), 2);
    ::execv(path, const_cast<char* const*>(argv.data()));
    ::_exit(127);
  }
  if (child.pid < 0) {
    ADD_FAILURE() << "fork: " << std::strerror(errno);
    return {};
  }
  child.out.reset(::fdopen(out[0].release(), "r"));
  if (with_err) child.err.reset(::fdopen(err[0].release(), "r"));
  return child;
}

// StartChild for arguments held as strings.
inline Child StartChild(const std::string& path,
                        const std::vector<std::string>& args,
                        ChildOutput output = ChildOutput::kStdout) {
  std::vector<const char*> argv;
  for (const std::string& a : args) argv.push_back(a.c_str());
  return StartChild(path.c_str(), argv, output);
}

// Reads the child's first line and the port in it, which `format` (a
// sscanf format with one %d) names; 0 (and a test failure) when it does not.
inline int ReadListeningPort(const Child& child, const char* format) {
  char line[256] = {};
  if (child.out == nullptr ||
      std::fgets(line, sizeof(line), child.out.get()) == nullptr) {
    ADD_FAILURE() << "no first line from the program";
    return 0;
  }
  int port = 0;
  if (std::sscanf(line, format, &port) != 1) {
    ADD_FAILURE() << "first line: " << line;
    return 0;
  }
  return port;
}

// Waits for `pid` and says whether it exited with status 0.
inline ::testing::AssertionResult ExitedCleanly(pid_t pid) {
  int status = 0;
  if (::waitpid(pid, &status, 0) != pid) {
    return ::testing::AssertionFailure() << "waitpid: " << std::strerror(errno);
  }
  if (WIFEXITED(status) && WEXITSTATUS(status) == 0) {
    return ::testing::AssertionSuccess();
  }
  return ::testing::AssertionFailure() << "wait status " << status;
}

// ExitedCleanly(child.pid), after which `child` no longer kills it.
inline ::testing::AssertionResult ExitedCleanly(Child& child) {
  return ExitedCleanly(std::exchange(child.pid, -1));
}

// ---- Trickle tests ----
//
// Memory follows bytes: a line trickled a byte at a time on each of several
// connections must pin about its bytes, not a buffer per byte.

// The trickled line: `n` letters, 'a' to 'z' over and over.
inline std::string TrickleLine(size_t n) {
  std::string line(n, '\0');
  for (size_t k = 0; k < n; ++k) line[k] = static_cast<char>('a' + k % 26);
  return line;
}

// The most buffers of `buffer_size` bytes that a chain holding `bytes` may
// pin: its bytes' buffers plus two partly filled ones.
inline size_t MostBuffersFor(size_t bytes, size_t buffer_size) {
  return (bytes + 2 * buffer_size + buffer_size - 1) / buffer_size;
}

// A thread that writes `line` one byte at a time to connection 0, 1, ...,
// `connections` - 1 in turn, through `write_byte(connection, byte)`; it
// ends when the line is written, a write fails, or `*stop` is set.
inline std::thread StartTrickler(
    size_t connections, const std::string& line,
    std::function<bool(size_t, const char*)> write_byte,
    const std::atomic<bool>* stop = nullptr) {
  return std::thread([connections, &line, write_byte, stop] {
    for (size_t k = 0; k < line.size(); ++k) {
      if (stop != nullptr && stop->load()) return;
      for (size_t i = 0; i < connections; ++i) {
        if (!write_byte(i, &line[k])) return;
      }
    }
  });
}

// `n` AF_UNIX stream socketpairs: the test reads at (*readers)[i] (made
// non-blocking with `nonblocking_readers`), the trickler writes at
// (*writers)[i]. A failure fails the test (call through
// ASSERT_NO_FATAL_FAILURE).
inline void MakeTrickleSockets(size_t n, bool nonblocking_readers,
                               std::vector<UniqueFd>* readers,
                               std::vector<UniqueFd>* writers) {
  for (size_t i = 0; i < n; ++i) {
    UniqueFd sv[2];
    ASSERT_EQ(SocketPair(SOCK_STREAM | SOCK_CLOEXEC, sv), 0);
    if (nonblocking_readers) SetNonBlocking(sv[0].get());
    readers->push_back(std::move(sv[0]));
    writers->push_back(std::move(sv[1]));
  }
}

#ifdef BUFPOOL_TEST_UTIL_HAS_LIBRARY
// Checks that each of `chains` (one a connection) holds exactly `line` and
// pins at most its bytes plus two buffers of `buffer_size`. A chain of the
// wrong size fails the test at once (call through ASSERT_NO_FATAL_FAILURE).
inline void ExpectEachHoldsTheLine(const std::vector<BufferChain>& chains,
                                   const std::string& line,
                                   size_t buffer_size) {
  for (size_t i = 0; i < chains.size(); ++i) {
    ASSERT_EQ(chains[i].size(), line.size()) << "connection " << i;
    EXPECT_LE(chains[i].pinned_bytes(), line.size() + 2 * buffer_size)
        << "connection " << i;
    EXPECT_TRUE(Contents(chains[i]) == line)
        << "connection " << i << ": bytes differ";
  }
}
#endif  // BUFPOOL_TEST_UTIL_HAS_LIBRARY

}  // namespace bufpool::testing_util

#endif  // BUFPOOL_TEST_TEST_UTIL_H_

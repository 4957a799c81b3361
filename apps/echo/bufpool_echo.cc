// bufpool-echo: a TCP echo server on a libbufpool pool (see
// apps/echo/echo_server.h for the engines and their behaviour, and
// --help or apps/echo/echo_args.cc for the command line).
//
// The first line on stdout is "listening on HOST:PORT". SIGINT or SIGTERM
// stops it gracefully and prints a one-line summary; SIGUSR1 prints the same
// line without stopping. --metrics-every SECONDS prints WriteMetrics() of
// the pool (with the connections' budgets) on stdout, the same stream, each
// exposition ended by "# EOF".
//
// --workers N: this process makes the pool shared and forks N workers; each
// joins the pool (BufferPool::Join of the inherited shared_fd()) and serves
// on its own SO_REUSEPORT listener of one port, which this process reserves
// first (bound, not listening, so no connection is queued on it). This
// process serves nothing: it watches. A worker that dies is reaped and
// ReclaimDead() gives back what it held (reported on stderr); the others
// go on. SIGINT/SIGTERM stop every worker, then it checks that every
// buffer of the pool is free again and says so.
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <pthread.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "bufpool/buffer_pool.h"
#include "bufpool/metrics.h"
#include "echo/echo_server.h"
#include "echo_args.h"

// Defined only in the benchmark build (bench/echo_alloc_counter.cc): heap
// allocations made by this process so far.
extern "C" uint64_t BufpoolEchoHeapAllocations() __attribute__((weak));

namespace {

using bufpool::tools::kExitFailure;
using bufpool::tools::kExitSuccess;
using bufpool::tools::kExitUsage;

// One line on stderr; returns `code`.
int Fail(const std::string& message, int code) {
  std::fprintf(stderr, "bufpool-echo: %s\n", message.c_str());
  return code;
}

// A failed bind or an exhausted system is the work failing (1); the
// library's InvalidArgument is about an option the user gave (2). The
// parser already keeps the options within the library's limits, so this
// is a safety net, not the usual path.
int FailStatus(const absl::Status& status) {
  return Fail(std::string(status.message()),
              absl::IsInvalidArgument(status) ? kExitUsage : kExitFailure);
}

std::string Summary(const bufpool::EchoServer& server,
                    const bufpool::BufferPool& pool) {
  const bufpool::EchoServerStats s = server.Stats();
  const bufpool::PoolStats p = pool.Stats();
  std::string line = absl::StrCat(
      "engine=", bufpool::EchoEngineName(server.engine()),
      " connections=", s.connections_accepted, " open=", s.connections_open,
      " bytes_in=", s.bytes_received, " bytes_out=", s.bytes_sent,
      " pool_high_water=", p.high_water, "/", p.capacity,
      " data_buffers_high_water=", s.buffers_holding_data_high_water,
      " pool_dry_stalls=", s.pool_dry_stalls,
      " unsent_limit_stalls=", s.unsent_limit_stalls);
  if (p.committed != p.capacity || p.grows != 0) {  // an elastic pool
    absl::StrAppend(&line, " pool_committed=", p.committed,
                    " pool_grows=", p.grows, " pool_trims=", p.trims);
  }
  rusage ru{};
  getrusage(RUSAGE_SELF, &ru);
  const uint64_t cpu_us =
      (ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) * uint64_t{1000000} +
      ru.ru_utime.tv_usec + ru.ru_stime.tv_usec;
  absl::StrAppend(&line, " cpu_us=", cpu_us);
  if (BufpoolEchoHeapAllocations != nullptr) {
    absl::StrAppend(&line, " heap_allocs=", BufpoolEchoHeapAllocations());
  }
  return line;
}

// Blocks SIGINT, SIGTERM and SIGUSR1 in this thread and the threads it
// starts after; returns them. Signals are taken synchronously by this
// thread (sigwait), so the handling code is ordinary code; the server
// thread never sees them.
sigset_t BlockSignals() {
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGUSR1);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  return signals;
}

// WriteMetrics() of the pool on stdout, ended by "# EOF".
void PrintMetrics(const bufpool::BufferPool& pool) {
  std::string text;
  bufpool::WriteMetrics(pool, &text, {.name = "echo"});
  std::fwrite(text.data(), 1, text.size(), stdout);
  std::fputs("# EOF\n", stdout);
  std::fflush(stdout);
}

// Takes `signals` until SIGINT or SIGTERM; prints the summary line for each
// SIGUSR1. This thread wakes on a tick when there is periodic work: an
// elastic pool (--max-buffers) trims idle memory once a second, so memory
// goes back even while the server makes no pool calls at all, and
// --metrics-every (`every` seconds, > 0) prints the metrics.
void WaitForStop(const sigset_t& signals, bool elastic, double every,
                 bufpool::BufferPool& pool, const bufpool::EchoServer& server) {
  using Clock = std::chrono::steady_clock;
  const auto period = std::chrono::duration_cast<Clock::duration>(
      std::chrono::duration<double>(every));
  Clock::time_point next_metrics = Clock::now() + period;
  for (;;) {
    int sig = 0;
    if (elastic || every > 0) {
      Clock::duration wait = std::chrono::seconds(1);
      if (every > 0) {
        const Clock::duration left =
            std::max(Clock::duration::zero(), next_metrics - Clock::now());
        wait = elastic ? std::min(wait, left) : left;
      }
      const auto ns =
          std::chrono::duration_cast<std::chrono::nanoseconds>(wait).count();
      const timespec tick{static_cast<time_t>(ns / 1'000'000'000),
                          static_cast<long>(ns % 1'000'000'000)};
      sig = sigtimedwait(&signals, nullptr, &tick);
      if (sig < 0) {
        if (elastic) pool.TrimIdle();
        if (every > 0 && Clock::now() >= next_metrics) {
          PrintMetrics(pool);
          next_metrics += period;
        }
        continue;
      }
    } else if (sigwait(&signals, &sig) != 0) {
      continue;
    }
    if (sig == SIGUSR1) {
      std::printf("stats: %s\n", Summary(server, pool).c_str());
      std::fflush(stdout);
      continue;
    }
    return;
  }
}

// Blocks `signals` and SIGCHLD; returns the set with SIGCHLD.
sigset_t BlockSignalsAndChild(const sigset_t& signals) {
  sigset_t all = signals;
  sigaddset(&all, SIGCHLD);
  pthread_sigmask(SIG_BLOCK, &all, nullptr);
  return all;
}

// Ends a worker without running the destructors of what it shares with
// the parent (the parent's pool object, which a child must not use).
[[noreturn]] void ExitWorker(int code) {
  std::fflush(stdout);
  std::fflush(stderr);
  _exit(code);
}

// A worker: joins the shared pool behind `pool_fd`, serves on `listen` with
// SO_REUSEPORT, writes one byte to `ready_fd` once it listens, and serves
// until SIGINT/SIGTERM. Never returns.
[[noreturn]] void RunWorker(const bufpool::tools::EchoCommand& command,
                            const std::string& listen, int pool_fd,
                            int ready_fd, const sigset_t& signals) {
  const std::string me = absl::StrCat("worker ", getpid());
  absl::StatusOr<std::unique_ptr<bufpool::BufferPool>> pool =
      bufpool::BufferPool::Join(pool_fd);
  if (!pool.ok()) {
    Fail(absl::StrCat(me, ": joining the pool: ", pool.status().message()),
         kExitFailure);
    ExitWorker(kExitFailure);
  }
  bufpool::EchoServerOptions options = command.server;
  options.listen = listen;
  options.reuse_port = true;
  options.pool = pool->get();
  absl::StatusOr<std::unique_ptr<bufpool::EchoServer>> server =
      bufpool::EchoServer::Create(options);
  if (!server.ok()) {
    Fail(absl::StrCat(me, ": ", server.status().message()), kExitFailure);
    ExitWorker(kExitFailure);
  }
  const char byte = 1;
  if (write(ready_fd, &byte, 1) != 1) ExitWorker(kExitFailure);
  close(ready_fd);
  absl::Status run_status;
  std::thread loop([&] {
    run_status = (*server)->Run();
    if (!run_status.ok()) ::kill(::getpid(), SIGTERM);
  });
  WaitForStop(signals, false, command.metrics_every_seconds, **pool, **server);
  (*server)->Stop();
  loop.join();
  if (!run_status.ok()) {
    Fail(absl::StrCat(me, ": ", run_status.message()), kExitFailure);
    ExitWorker(kExitFailure);
  }
  std::printf("%s stopped: %s\n", me.c_str(),
              Summary(**server, **pool).c_str());
  server->reset();
  pool->reset();
  ExitWorker(kExitSuccess);
}

// Binds (without listening) an SO_REUSEPORT socket to `listen`, holding
// its port for the workers; the port it got (the kernel's pick for 0) in
// *port.
absl::StatusOr<int> ReservePort(const std::string& listen, uint16_t* port) {
  const size_t colon = listen.rfind(':');
  std::string host = listen.substr(0, colon);
  if (host == "localhost") host = "127.0.0.1";
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_port = htons(static_cast<uint16_t>(
      std::strtoul(listen.c_str() + colon + 1, nullptr, 10)));
  if (inet_pton(AF_INET, host.c_str(), &sa.sin_addr) != 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("listen address '", listen, "' is not IPv4"));
  }
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return absl::ErrnoToStatus(errno, "socket");
  const int one = 1;
  socklen_t len = sizeof(sa);
  if (setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one)) != 0 ||
      setsockopt(fd, SOL_SOCKET, SO_REUSEPORT, &one, sizeof(one)) != 0 ||
      bind(fd, reinterpret_cast<sockaddr*>(&sa), sizeof(sa)) != 0 ||
      getsockname(fd, reinterpret_cast<sockaddr*>(&sa), &len) != 0) {
    const int err = errno;
    close(fd);
    return absl::ErrnoToStatus(err, absl::StrCat("listen on ", listen));
  }
  *port = ntohs(sa.sin_port);
  return fd;
}

// How many buffers this process can take from the pool now: takes them
// all and gives them back. With every worker gone, the whole pool.
size_t CountFree(bufpool::BufferPool& pool) {
  std::vector<bufpool::Buffer> all;
  while (bufpool::Buffer b = pool.TryAcquire()) all.push_back(std::move(b));
  return all.size();
}

std::string DeathText(int status) {
  if (WIFSIGNALED(status)) {
    return absl::StrCat("died (signal ", WTERMSIG(status), ")");
  }
  return absl::StrCat("exited with status ", WEXITSTATUS(status));
}

// --workers N: see the file comment.
// The worker processes of --workers, as the parent sees them.
struct Workers {
  std::vector<pid_t> all;   // in the order they were forked
  std::vector<pid_t> live;  // not reaped yet
  uint64_t failed = 0;      // did not exit 0 on their own
};

// Kills and reaps every worker started so far (a start that failed).
void KillAll(bufpool::BufferPool& pool, const Workers& w) {
  for (pid_t pid : w.all) kill(pid, SIGKILL);
  for (pid_t pid : w.all) waitpid(pid, nullptr, 0);
  pool.ReclaimDead();
}

// Forks command.workers workers that Join `pool` and serve on `listen`,
// and waits until each says it listens (one byte on a pipe; EOF first
// means one failed, and it said why on stderr).
absl::Status StartWorkers(const bufpool::tools::EchoCommand& command,
                          const std::string& listen, bufpool::BufferPool& pool,
                          int reserved, const sigset_t& signals, Workers* w) {
  int ready[2];
  if (pipe2(ready, O_CLOEXEC) != 0) {
    return absl::InternalError(absl::StrCat("pipe: ", std::strerror(errno)));
  }
  std::fflush(stdout);
  std::fflush(stderr);
  for (size_t i = 0; i < command.workers; ++i) {
    const pid_t pid = fork();
    if (pid == 0) {
      close(ready[0]);
      close(reserved);
      RunWorker(command, listen, pool.shared_fd(), ready[1], signals);
    }
    if (pid < 0) {
      const int err = errno;
      KillAll(pool, *w);
      return absl::InternalError(absl::StrCat("fork: ", std::strerror(err)));
    }
    w->all.push_back(pid);
  }
  close(ready[1]);
  for (size_t got = 0; got < w->all.size();) {
    char buf[64];
    const ssize_t n = read(ready[0], buf, sizeof(buf));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      close(ready[0]);
      KillAll(pool, *w);
      return absl::InternalError("a worker could not start");
    }
    got += static_cast<size_t>(n);
  }
  close(ready[0]);
  w->live = w->all;
  return absl::OkStatus();
}

// Reaps the workers that ended and reclaims what the dead held, saying so
// on stderr (a clean exit while stopping, with nothing to reclaim, quietly).
void Reap(bufpool::BufferPool& pool, Workers& w, bool stopping) {
  for (;;) {
    int status = 0;
    const pid_t pid = waitpid(-1, &status, WNOHANG);
    if (pid <= 0) return;
    w.live.erase(std::remove(w.live.begin(), w.live.end(), pid), w.live.end());
    const size_t reclaimed = pool.ReclaimDead();
    const bool clean = WIFEXITED(status) && WEXITSTATUS(status) == 0;
    if (!clean) ++w.failed;
    if (!clean || reclaimed != 0 || !stopping) {
      std::fprintf(stderr,
                   "bufpool-echo: worker %d %s; reclaimed %zu buffers\n",
                   static_cast<int>(pid), DeathText(status).c_str(), reclaimed);
    }
  }
}

// The parent's loop: reaps on SIGCHLD (ending when every worker is gone),
// prints stats on SIGUSR1, and on SIGINT or SIGTERM stops the workers and
// waits for them.
void Watch(bufpool::BufferPool& pool, const sigset_t& watched, Workers& w) {
  for (;;) {
    int sig = 0;
    if (sigwait(&watched, &sig) != 0) continue;
    if (sig == SIGCHLD) {
      Reap(pool, w, false);
      if (w.live.empty()) {
        Fail("every worker is gone", kExitFailure);
        return;
      }
      continue;
    }
    if (sig == SIGUSR1) {
      const bufpool::PoolStats p = pool.Stats();
      std::printf("stats: workers=%zu/%zu processes=%zu reclaimed=%llu\n",
                  w.live.size(), w.all.size(), p.processes,
                  static_cast<unsigned long long>(p.reclaimed));
      std::fflush(stdout);
      continue;
    }
    for (pid_t pid : w.live) kill(pid, SIGTERM);
    while (!w.live.empty()) {
      if (sigwait(&watched, &sig) == 0 && sig == SIGCHLD) Reap(pool, w, true);
    }
    return;
  }
}

int RunWorkers(const bufpool::tools::EchoCommand& command) {
  absl::StatusOr<std::unique_ptr<bufpool::BufferPool>> pool =
      bufpool::BufferPool::Create(command.pool);  // shared: set by the parser
  if (!pool.ok()) return FailStatus(pool.status());
  if ((*pool)->shared_fd() < 0) {
    return Fail("--workers: the pool could not be made shared", kExitFailure);
  }
  uint16_t port = 0;
  absl::StatusOr<int> reserved = ReservePort(command.server.listen, &port);
  if (!reserved.ok()) return FailStatus(reserved.status());
  const std::string host =
      command.server.listen.substr(0, command.server.listen.rfind(':'));
  const std::string listen =
      absl::StrCat(host == "localhost" ? "127.0.0.1" : host, ":", port);

  const sigset_t signals = BlockSignals();
  const sigset_t watched = BlockSignalsAndChild(signals);
  Workers w;
  if (absl::Status st =
          StartWorkers(command, listen, **pool, *reserved, signals, &w);
      !st.ok()) {
    return Fail(std::string(st.message()), kExitFailure);
  }
  std::printf("listening on %s\n", listen.c_str());
  std::string pids;
  for (pid_t pid : w.all) absl::StrAppend(&pids, pids.empty() ? "" : " ", pid);
  std::printf("workers: %s\n", pids.c_str());
  std::fflush(stdout);
  Watch(**pool, watched, w);
  close(*reserved);
  (*pool)->ReclaimDead();
  const bufpool::PoolStats p = (*pool)->Stats();
  const size_t free_now = CountFree(**pool);
  std::printf(
      "stopped: workers=%zu failed=%llu reclaimed=%llu pool_free=%zu/%zu\n",
      w.all.size(), static_cast<unsigned long long>(w.failed),
      static_cast<unsigned long long>(p.reclaimed), free_now, p.capacity);
  std::fflush(stdout);
  if (free_now != p.capacity) {
    return Fail(
        absl::StrCat("the pool lost ", p.capacity - free_now, " buffers"),
        kExitFailure);
  }
  return w.live.empty() && w.failed < w.all.size() ? kExitSuccess
                                                   : kExitFailure;
}

}  // namespace

int main(int argc, char** argv) {
  bufpool::tools::ParsedArgs<bufpool::tools::EchoCommand> parsed =
      bufpool::tools::ParseEchoArgs(argc, argv);
  if (const int code = bufpool::tools::PrintUnlessRun(parsed); code >= 0) {
    return code;
  }
  if (parsed.command.workers != 0) return RunWorkers(parsed.command);
  bufpool::EchoServerOptions options = parsed.command.server;
  absl::StatusOr<std::unique_ptr<bufpool::BufferPool>> pool =
      bufpool::BufferPool::Create(parsed.command.pool);
  if (!pool.ok()) return FailStatus(pool.status());
  options.pool = pool->get();
  absl::StatusOr<std::unique_ptr<bufpool::EchoServer>> server =
      bufpool::EchoServer::Create(options);
  if (!server.ok()) return FailStatus(server.status());
  if (!(*server)->fallback_reason().empty()) {
    std::fprintf(stderr, "bufpool-echo: %s; falling back to epoll\n",
                 (*server)->fallback_reason().c_str());
  }

  const sigset_t signals = BlockSignals();
  std::printf("listening on %s\n", (*server)->local_address().c_str());
  std::fflush(stdout);

  absl::Status run_status;
  std::thread loop([&] {
    run_status = (*server)->Run();
    if (!run_status.ok()) ::kill(::getpid(), SIGTERM);  // wake main
  });
  WaitForStop(signals, parsed.command.pool.max_buffer_count != 0,
              parsed.command.metrics_every_seconds, **pool, **server);
  (*server)->Stop();
  loop.join();
  if (!run_status.ok()) {
    return Fail(std::string(run_status.message()), kExitFailure);
  }
  std::printf("stopped: %s\n", Summary(**server, **pool).c_str());
  std::fflush(stdout);
  server->reset();  // before the pool it uses
  return kExitSuccess;
}

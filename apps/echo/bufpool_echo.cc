// bufpool-echo: a TCP echo server on a libbufpool pool (see
// apps/echo/echo_server.h for the engines and their behaviour, and
// --help or apps/echo/echo_args.cc for the command line).
//
// The first line on stdout is "listening on HOST:PORT". SIGINT or SIGTERM
// stops it gracefully and prints a one-line summary; SIGUSR1 prints the same
// line without stopping. --metrics-every SECONDS prints WriteMetrics() of
// the pool (with the connections' budgets) on stdout, the same stream, each
// exposition ended by "# EOF".
#include <pthread.h>
#include <signal.h>
#include <sys/resource.h>
#include <time.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>

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

}  // namespace

int main(int argc, char** argv) {
  bufpool::tools::ParsedArgs<bufpool::tools::EchoCommand> parsed =
      bufpool::tools::ParseEchoArgs(argc, argv);
  if (const int code = bufpool::tools::PrintUnlessRun(parsed); code >= 0) {
    return code;
  }
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

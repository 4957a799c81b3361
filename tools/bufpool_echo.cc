// bufpool-echo: a TCP echo server on a libbufpool pool (see
// include/bufpool/echo_server.h for the engines and their behaviour).
//
// The first line on stdout is "listening on HOST:PORT". SIGINT or SIGTERM
// stops it gracefully and prints a one-line summary; SIGUSR1 prints the same
// line without stopping.
#include <pthread.h>
#include <signal.h>
#include <sys/resource.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "bufpool/buffer_pool.h"
#include "bufpool/echo_server.h"

// Defined only in the benchmark build (bench/echo_alloc_counter.cc): heap
// allocations made by this process so far.
extern "C" uint64_t BufpoolEchoHeapAllocations() __attribute__((weak));

namespace {

constexpr char kUsage[] =
    "usage: bufpool-echo [--listen=HOST:PORT] [--engine=uring|epoll|malloc]\n"
    "                    [--buffers=N] [--buffer-size=B] [--max-unsent=B]\n"
    "\n"
    "A TCP echo server whose receive buffers are libbufpool pool slots.\n"
    "  --listen       address to listen on (default 127.0.0.1:0; port 0\n"
    "                 picks a free port)\n"
    "  --engine       uring (default; falls back to epoll when io_uring is\n"
    "                 unavailable), epoll (readv into pool buffers) or\n"
    "                 malloc (a fresh allocation per read: the baseline)\n"
    "  --buffers      pool buffers (default 4096)\n"
    "  --buffer-size  bytes per buffer, a power of two (default 4096)\n"
    "  --max-unsent   per connection: stop reading past this many unsent\n"
    "                 bytes (default 262144)\n"
    "Prints 'listening on HOST:PORT' first. SIGINT/SIGTERM: stop, print a\n"
    "summary, exit 0. SIGUSR1: print the summary and go on.\n";

int Fail(const std::string& message) {
  std::fprintf(stderr, "bufpool-echo: %s\n", message.c_str());
  return 2;
}

bool ParseSize(const std::string& value, size_t* out) {
  uint64_t v = 0;
  if (!absl::SimpleAtoi(value, &v)) return false;
  *out = v;
  return true;
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

}  // namespace

int main(int argc, char** argv) {
  bufpool::EchoServerOptions options;
  bufpool::PoolOptions pool_options;
  pool_options.buffer_count = 4096;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    const size_t eq = arg.find('=');
    const std::string name = arg.substr(0, eq);
    const std::string value = eq == std::string::npos ? "" : arg.substr(eq + 1);
    if (arg == "--help" || arg == "-h") {
      std::fputs(kUsage, stdout);
      return 0;
    } else if (name == "--listen" && eq != std::string::npos) {
      options.listen = value;
    } else if (name == "--engine" && eq != std::string::npos) {
      absl::StatusOr<bufpool::EchoEngine> e = bufpool::ParseEchoEngine(value);
      if (!e.ok()) return Fail(std::string(e.status().message()));
      options.engine = *e;
    } else if (name == "--buffers" && eq != std::string::npos) {
      if (!ParseSize(value, &pool_options.buffer_count)) {
        return Fail("--buffers wants a number, got '" + value + "'");
      }
    } else if (name == "--buffer-size" && eq != std::string::npos) {
      if (!ParseSize(value, &pool_options.buffer_size)) {
        return Fail("--buffer-size wants a number, got '" + value + "'");
      }
    } else if (name == "--max-unsent" && eq != std::string::npos) {
      if (!ParseSize(value, &options.max_unsent_bytes)) {
        return Fail("--max-unsent wants a number, got '" + value + "'");
      }
    } else {
      return Fail("unknown argument '" + arg + "' (try --help)");
    }
  }

  absl::StatusOr<std::unique_ptr<bufpool::BufferPool>> pool =
      bufpool::BufferPool::Create(pool_options);
  if (!pool.ok()) return Fail(std::string(pool.status().message()));
  options.pool = pool->get();
  absl::StatusOr<std::unique_ptr<bufpool::EchoServer>> server =
      bufpool::EchoServer::Create(options);
  if (!server.ok()) return Fail(std::string(server.status().message()));
  if (!(*server)->fallback_reason().empty()) {
    std::fprintf(stderr, "bufpool-echo: %s; falling back to epoll\n",
                 (*server)->fallback_reason().c_str());
  }

  // Signals are taken synchronously by this thread (sigwait), so the
  // handling code is ordinary code; the server thread never sees them.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGUSR1);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);

  std::printf("listening on %s\n", (*server)->local_address().c_str());
  std::fflush(stdout);

  absl::Status run_status;
  std::thread loop([&] {
    run_status = (*server)->Run();
    if (!run_status.ok()) ::kill(::getpid(), SIGTERM);  // wake main
  });
  for (;;) {
    int sig = 0;
    if (sigwait(&signals, &sig) != 0) continue;
    if (sig == SIGUSR1) {
      std::printf("stats: %s\n", Summary(**server, **pool).c_str());
      std::fflush(stdout);
      continue;
    }
    break;
  }
  (*server)->Stop();
  loop.join();
  if (!run_status.ok()) return Fail(std::string(run_status.message()));
  std::printf("stopped: %s\n", Summary(**server, **pool).c_str());
  std::fflush(stdout);
  server->reset();  // before the pool it uses
  return 0;
}

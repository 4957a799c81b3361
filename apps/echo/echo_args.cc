#include "echo_args.h"

#include <limits>
#include <string>

#include "CLI/CLI.hpp"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"

namespace bufpool::tools {
namespace {

constexpr char kTool[] = "bufpool-echo";

constexpr char kUsage[] = R"(usage: bufpool-echo [OPTIONS]

A TCP echo server whose receive buffers are libbufpool pool slots. Prints
'listening on HOST:PORT' first. SIGINT/SIGTERM: stop, print a summary line
('stopped: ...'), exit 0. SIGUSR1: print the summary ('stats: ...') and go
on. --metrics-every SECONDS: print the pool's metrics (Prometheus text,
its per-connection budgets included) on stdout every SECONDS, each print
closed by a line '# EOF'.

--workers N: N worker processes serve one shared pool, each on its own
SO_REUSEPORT listener of the same port; the second line on stdout is
'workers: PID...'. A worker that dies is reported on stderr ('worker PID
died (signal S); reclaimed N buffers': everything it held is back in the
pool) and the others keep serving. SIGINT/SIGTERM stop every worker (each
prints 'worker PID stopped: ...'), then 'stopped: workers=...
pool_free=F/C' (every buffer back: F = C).

)";

// Where the server listens and which engine runs it; the engine's name
// lands in `engine`.
void AddServerOptions(CLI::App& app, EchoServerOptions& server,
                      std::string& engine) {
  app.add_option("--listen", server.listen,
                 absl::StrCat("address to listen on, IPv4 HOST:PORT; port 0 "
                              "picks\na free port (default: ",
                              EchoServerOptions{}.listen, ")"))
      ->type_name("HOST:PORT")
      ->option_text("HOST:PORT")
      ->check(Ipv4HostPort(0));
  app.add_option("--engine", engine,
                 "uring (falls back to epoll when io_uring is\n"
                 "unavailable), epoll (readv into pool buffers) or\n"
                 "malloc (a fresh allocation per read: the baseline)\n"
                 "(default: uring)")
      ->type_name("ENGINE")
      ->option_text("ENGINE")
      ->check(CLI::Validator(
          [](std::string& name) -> std::string {
            if (ParseEchoEngine(name).has_value()) return "";
            return absl::StrCat("unknown engine '", name,
                                "' (expected uring, epoll or malloc)");
          },
          ""));
}

// The pool's options: how many buffers (fixed or elastic) of what size.
void AddPoolOptions(CLI::App& app, PoolOptions& pool) {
  // --buffers is the name of 0.2, a deprecated alias until 0.4 (a use adds
  // a note).
  app.add_option("--buffer-count,--buffers", pool.buffer_count,
                 absl::StrCat("pool buffers, 1 to ", kMaxEchoBuffers,
                              " (default: ", kDefaultEchoBuffers,
                              ");\n--buffers is its old name, deprecated"))
      ->type_name("N")
      ->option_text("N")
      ->transform(NumberIn(1, kMaxEchoBuffers));
  app.add_option("--max-buffers", pool.max_buffer_count,
                 absl::StrCat("an elastic pool: start with --buffer-count, "
                              "grow up to\nthis many under load, give memory "
                              "back when\nidle; 0 or --buffer-count to ",
                              kMaxEchoBuffers, " (default: 0, a fixed pool)"))
      ->type_name("N")
      ->option_text("N")
      ->transform(NumberIn(0, kMaxEchoBuffers));
  app.add_option("--buffer-size", pool.buffer_size,
                 absl::StrCat("bytes per buffer, a power of two from 64 to\n",
                              kMaxToolBufferSize,
                              " (default: ", kDefaultBufferSize, ")"))
      ->type_name("BYTES")
      ->option_text("BYTES")
      ->transform(PowerOfTwoIn(64, kMaxToolBufferSize));
}

// What a connection may leave unsent, and the periodic metrics print.
void AddLimitAndOutputOptions(CLI::App& app, EchoCommand& c) {
  app.add_option("--max-unsent", c.server.max_unsent_bytes,
                 absl::StrCat("per connection: stop reading past this many "
                              "unsent\nbytes, at least 1 (default: ",
                              EchoServerOptions{}.max_unsent_bytes, ")"))
      ->type_name("BYTES")
      ->option_text("BYTES")
      ->transform(NumberIn(1, std::numeric_limits<size_t>::max()));
  app.add_option("--metrics-every", c.metrics_every_seconds,
                 "print the pool's metrics (Prometheus text) on stdout\n"
                 "every SECONDS, 0.001 to 86400 (default: never)")
      ->type_name("SECONDS")
      ->option_text("SECONDS")
      ->check(CLI::Range(0.001, 86400.0));
  app.add_option("--workers", c.workers,
                 absl::StrCat("serve from N worker processes on one shared "
                              "pool\n(SO_REUSEPORT), 1 to ",
                              kMaxEchoWorkers, " (default: 0, this process)"))
      ->type_name("N")
      ->option_text("N")
      ->transform(NumberIn(1, kMaxEchoWorkers));
}

// After a successful parse: the checks that span options (an elastic
// pool's ceiling is at least its start), what they imply (an elastic pool
// trims when idle), and the note for a deprecated name.
void FinishEchoArgs(int argc, const char* const* argv,
                    const std::string& engine,
                    ParsedArgs<EchoCommand>& result) {
  EchoCommand& c = result.command;
  c.server.engine = *ParseEchoEngine(engine);  // checked by the validator
  if (c.pool.max_buffer_count != 0 &&
      c.pool.max_buffer_count < c.pool.buffer_count) {
    result.action = ParseAction::kUsageError;
    result.text =
        absl::StrCat(kTool, ": --max-buffers: ", c.pool.max_buffer_count,
                     " is below --buffer-count (", c.pool.buffer_count,
                     "); use 0 for a fixed pool; see '", kTool, " --help'");
    return;
  }
  if (c.workers != 0 && c.pool.max_buffer_count != 0) {
    result.action = ParseAction::kUsageError;
    result.text =
        absl::StrCat(kTool,
                     ": --workers: a shared pool is a fixed pool; drop "
                     "--max-buffers; see '",
                     kTool, " --help'");
    return;
  }
  if (c.workers != 0) c.pool.shared = true;
  if (c.pool.max_buffer_count != 0) {
    // Idle memory goes back on its own: main() ticks the idle trim.
    c.pool.trim_after_idle = absl::Seconds(1);
  }
  std::string note =
      DeprecatedNameNote(kTool, argc, argv, "--buffers", "--buffer-count");
  if (!note.empty()) result.notes.push_back(std::move(note));
}

}  // namespace

ParsedArgs<EchoCommand> ParseEchoArgs(int argc, const char* const* argv) {
  ParsedArgs<EchoCommand> result;
  EchoCommand& c = result.command;
  c.pool.buffer_count = kDefaultEchoBuffers;
  CLI::App app;
  ConfigureApp(app, kTool, kUsage,
               ExitStatusHelp("the server could not start (a bind,\n"
                              "     the pool, io_uring) or its loop failed"));
  std::string engine(EchoEngineName(EchoServerOptions{}.engine));
  AddServerOptions(app, c.server, engine);
  AddPoolOptions(app, c.pool);
  AddLimitAndOutputOptions(app, c);

  result.action = RunParser(app, argc, argv, &result.text);
  if (result.action == ParseAction::kRun) {
    FinishEchoArgs(argc, argv, engine, result);
  }
  return result;
}

}  // namespace bufpool::tools

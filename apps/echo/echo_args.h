// Private to bufpool-echo: its command line, parsed with CLI11 (see
// cli_common.h for the conventions).
#ifndef BUFPOOL_APPS_ECHO_ECHO_ARGS_H_
#define BUFPOOL_APPS_ECHO_ECHO_ARGS_H_

#include <cstdint>

#include "bufpool/buffer_pool.h"
#include "cli_common.h"
#include "echo/echo_server.h"

namespace bufpool::tools {

// PoolOptions.buffer_count must be below 2^32 - 1 (slot numbers are 32-bit).
inline constexpr uint64_t kMaxEchoBuffers = (uint64_t{1} << 32) - 2;
inline constexpr size_t kDefaultEchoBuffers = 4096;

struct EchoCommand {
  // listen (IPv4 HOST:PORT, port 0 allowed), engine and max_unsent_bytes
  // (>= 1); pool is left null for main() to fill.
  EchoServerOptions server;
  // buffer_count (1 to kMaxEchoBuffers, default 4096), buffer_size (a
  // power of two from 64 to kMaxToolBufferSize) and max_buffer_count (0, or
  // buffer_count to kMaxEchoBuffers; with it, trim_after_idle 1 s); the rest
  // as PoolOptions'.
  PoolOptions pool;
  // --metrics-every: seconds between two prints of the pool's metrics
  // (bufpool/metrics.h) on stdout; 0: never.
  double metrics_every_seconds = 0;
  // --workers: 0 serves in this process; N (1 to kMaxEchoWorkers) makes the
  // pool shared (PoolOptions::shared) and forks N worker processes that
  // join it, each with its own SO_REUSEPORT listener on the same port.
  size_t workers = 0;
};

inline constexpr uint64_t kMaxEchoWorkers = 256;

// Parses bufpool-echo's argv. Never exits, prints or opens a socket.
ParsedArgs<EchoCommand> ParseEchoArgs(int argc, const char* const* argv);

}  // namespace bufpool::tools

#endif  // BUFPOOL_APPS_ECHO_ECHO_ARGS_H_

// Private to bufpool-echo-load: its command line, parsed with CLI11 (see
// cli_common.h for the conventions).
#ifndef BUFPOOL_APPS_ECHO_ECHO_LOAD_ARGS_H_
#define BUFPOOL_APPS_ECHO_ECHO_LOAD_ARGS_H_

#include <cstdint>

#include "cli_common.h"
#include "echo/echo_load.h"

namespace bufpool::tools {

// Bounds on the load, so that what it allocates stays sane: every message
// size up to MAX is one random pattern in memory, and each round trip keeps
// a 4-byte latency.
inline constexpr uint64_t kMaxLoadConnections = 65536;
inline constexpr uint64_t kMaxLoadMessageSize = uint64_t{64} << 20;  // 64 MiB
inline constexpr uint64_t kMaxLoadRoundTrips = uint64_t{1} << 28;
inline constexpr size_t kDefaultLoadConnections = 64;
inline constexpr size_t kDefaultLoadMessages = 1000;

struct EchoLoadCommand {
  // target (IPv4 HOST:PORT, port >= 1), connections (1 to
  // kMaxLoadConnections), messages (>= 1, connections * messages at most
  // kMaxLoadRoundTrips), 1 <= min_size <= max_size <= kMaxLoadMessageSize,
  // seed; the rest as EchoLoadOptions'.
  net::EchoLoadOptions load;
};

// Parses bufpool-echo-load's argv. Never exits, prints or connects.
ParsedArgs<EchoLoadCommand> ParseEchoLoadArgs(int argc,
                                              const char* const* argv);

}  // namespace bufpool::tools

#endif  // BUFPOOL_APPS_ECHO_ECHO_LOAD_ARGS_H_

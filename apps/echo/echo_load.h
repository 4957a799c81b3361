// A load generator for echo servers (private: used by bufpool-echo-load and
// the tests, compiled into each). It opens `connections` TCP connections,
// sends `messages` messages of random length on each, one at a time, and
// checks every echoed byte against what was sent. One thread, epoll.
//
// Message m of connection c is a slice of one random pattern, at an offset
// and of a length drawn from (seed, c, m), so a dropped, duplicated or
// reordered byte is a mismatch.
#ifndef BUFPOOL_APPS_ECHO_ECHO_LOAD_H_
#define BUFPOOL_APPS_ECHO_ECHO_LOAD_H_

#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace bufpool::net {

struct EchoLoadOptions {
  std::string target;  // "HOST:PORT" (IPv4)
  size_t connections = 1;
  size_t messages = 1;  // per connection
  size_t min_size = 1;
  size_t max_size = 4096;
  uint64_t seed = 1;
  // The first `abort_connections` connections send half of their second
  // message and then reset (close with SO_LINGER 0): abrupt disconnects.
  size_t abort_connections = 0;
  // Shut down the sending side after the last message, then expect its echo
  // followed by end of stream (the server must honour a half-close).
  bool half_close = false;
  // Fail when nothing at all moves for this long.
  absl::Duration stall_timeout = absl::Seconds(60);
};

struct EchoLoadResult {
  uint64_t messages = 0;  // verified round trips
  uint64_t bytes = 0;     // verified echoed bytes
  double seconds = 0;     // from the first connect to the last byte
  // Round-trip latency of one message: first byte sent to last byte back.
  double p50_us = 0;
  double p99_us = 0;
  double max_us = 0;
};

// DataLoss on the first wrong byte (the message says where), Unavailable
// when a connection fails, DeadlineExceeded after stall_timeout.
absl::StatusOr<EchoLoadResult> RunEchoLoad(const EchoLoadOptions& options);

}  // namespace bufpool::net

#endif  // BUFPOOL_APPS_ECHO_ECHO_LOAD_H_

// bufpool-echo-load: drives an echo server with many connections, checks
// every echoed byte, and reports throughput and round-trip latency.
// Exit status: 0 when every byte came back right, 1 on a mismatch or a
// failed connection, 2 on bad arguments.
#include <cstdint>
#include <cstdio>
#include <string>

#include "absl/strings/numbers.h"
#include "net/echo_load.h"

namespace {

constexpr char kUsage[] =
    "usage: bufpool-echo-load --target=HOST:PORT [--connections=N]\n"
    "                         [--messages=M] [--size=MIN:MAX] [--seed=S]\n"
    "\n"
    "Opens N connections (default 64) to an echo server, sends M messages\n"
    "(default 1000) of MIN..MAX bytes (default 1:4096) on each, one at a\n"
    "time, verifies every echoed byte and prints throughput, messages per\n"
    "second and round-trip latency (p50, p99, max). Non-zero exit on any\n"
    "mismatch.\n";

int Fail(const std::string& message) {
  std::fprintf(stderr, "bufpool-echo-load: %s\n", message.c_str());
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  bufpool::net::EchoLoadOptions o;
  o.connections = 64;
  o.messages = 1000;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    const size_t eq = arg.find('=');
    const std::string name = arg.substr(0, eq);
    const std::string value = eq == std::string::npos ? "" : arg.substr(eq + 1);
    uint64_t n = 0;
    if (arg == "--help" || arg == "-h") {
      std::fputs(kUsage, stdout);
      return 0;
    } else if (name == "--target" && eq != std::string::npos) {
      o.target = value;
    } else if (name == "--connections" && absl::SimpleAtoi(value, &n)) {
      o.connections = n;
    } else if (name == "--messages" && absl::SimpleAtoi(value, &n)) {
      o.messages = n;
    } else if (name == "--seed" && absl::SimpleAtoi(value, &n)) {
      o.seed = n;
    } else if (name == "--size" && value.find(':') != std::string::npos) {
      uint64_t lo = 0, hi = 0;
      const size_t c = value.find(':');
      if (!absl::SimpleAtoi(value.substr(0, c), &lo) ||
          !absl::SimpleAtoi(value.substr(c + 1), &hi) || lo == 0 || lo > hi) {
        return Fail("--size wants MIN:MAX with 1 <= MIN <= MAX, got '" + value +
                    "'");
      }
      o.min_size = lo;
      o.max_size = hi;
    } else {
      return Fail("bad or unknown argument '" + arg + "' (try --help)");
    }
  }
  if (o.target.empty()) return Fail("--target=HOST:PORT is required");

  absl::StatusOr<bufpool::net::EchoLoadResult> r = bufpool::net::RunEchoLoad(o);
  if (!r.ok()) {
    std::fprintf(stderr, "bufpool-echo-load: FAILED: %s\n",
                 r.status().ToString().c_str());
    return 1;
  }
  const double mib_s = r->bytes / r->seconds / (1 << 20);
  std::printf(
      "verified %llu messages (%llu bytes) on %zu connections in %.3f s\n",
      static_cast<unsigned long long>(r->messages),
      static_cast<unsigned long long>(r->bytes), o.connections, r->seconds);
  std::printf(
      "throughput_mib_s=%.1f msgs_per_s=%.0f p50_us=%.1f p99_us=%.1f "
      "max_us=%.1f\n",
      mib_s, r->messages / r->seconds, r->p50_us, r->p99_us, r->max_us);
  return 0;
}

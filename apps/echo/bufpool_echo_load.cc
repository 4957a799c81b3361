// bufpool-echo-load: drives an echo server with many connections, checks
// every echoed byte, and reports throughput and round-trip latency (see
// --help or apps/echo/echo_load_args.cc for the command line).
#include <cstdint>
#include <cstdio>
#include <string>

#include "absl/status/status.h"
#include "echo/echo_load.h"
#include "echo_load_args.h"

int main(int argc, char** argv) {
  using bufpool::tools::kExitFailure;
  using bufpool::tools::kExitSuccess;
  using bufpool::tools::kExitUsage;
  bufpool::tools::ParsedArgs<bufpool::tools::EchoLoadCommand> parsed =
      bufpool::tools::ParseEchoLoadArgs(argc, argv);
  if (const int code = bufpool::tools::PrintUnlessRun(parsed); code >= 0) {
    return code;
  }
  const bufpool::net::EchoLoadOptions& o = parsed.command.load;
  absl::StatusOr<bufpool::net::EchoLoadResult> r = bufpool::net::RunEchoLoad(o);
  if (!r.ok()) {
    // InvalidArgument is about the options (a safety net: the parser keeps
    // them within RunEchoLoad's limits); anything else is the load failing.
    const bool usage = absl::IsInvalidArgument(r.status());
    std::fprintf(stderr, "bufpool-echo-load: %s%s\n",
                 usage ? "" : "FAILED: ", r.status().ToString().c_str());
    return usage ? kExitUsage : kExitFailure;
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
  return kExitSuccess;
}

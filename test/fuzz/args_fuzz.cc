// Fuzz target 4: the command-line parsers of bufpool-copy, bufpool-echo and
// bufpool-echo-load (tools/*_args.h) over arbitrary argument vectors.
//
// Input: the first byte picks the tool; the rest is the arguments, separated
// by NUL bytes (args_fuzz.dict holds the options' names and the limits'
// values). Every parse must give:
//   * kHelp: the help text, ending in '\n', starting with "usage: ";
//   * kUsageError: one line "<tool>: <what>; see '<tool> --help'";
//   * kRun: a command whose every option is within the limits the header
//     states (buffer sizes powers of two in range, counts and depths in
//     range, bytes per operation at most 1 GiB, operands present and never
//     "-" or empty, HOST:PORT with an IPv4 host, MIN <= MAX, ...).
#include <arpa/inet.h>
#include <fuzzer/FuzzedDataProvider.h>

#include <cstdint>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "copy_args.h"
#include "echo_args.h"
#include "echo_load_args.h"
#include "fuzz_check.h"

namespace {

using bufpool::tools::ParseAction;

bool PowerOfTwoIn(uint64_t v, uint64_t lo, uint64_t hi) {
  return v >= lo && v <= hi && (v & (v - 1)) == 0;
}

// "HOST:PORT" as EchoServerOptions::listen / EchoLoadOptions::target take.
bool IsHostPort(const std::string& s, uint32_t min_port) {
  const size_t colon = s.rfind(':');
  if (colon == std::string::npos) return false;
  const std::string host = s.substr(0, colon);
  const std::string port = s.substr(colon + 1);
  uint32_t p = 0;
  if (port.empty() || port.size() > 5 ||
      port.find_first_not_of("0123456789") != std::string::npos ||
      !absl::SimpleAtoi(port, &p) || p < min_port || p > 65535) {
    return false;
  }
  in_addr a{};
  return host == "localhost" || inet_pton(AF_INET, host.c_str(), &a) == 1;
}

template <typename Command>
void CheckText(const bufpool::tools::ParsedArgs<Command>& r,
               const std::string& tool) {
  switch (r.action) {
    case ParseAction::kHelp:
      FUZZ_CHECK(absl::StartsWith(r.text, "usage: " + tool) &&
                     absl::EndsWith(r.text, "\n"),
                 "%s: help text '%.80s...'", tool.c_str(), r.text.c_str());
      break;
    case ParseAction::kUsageError:
      FUZZ_CHECK(absl::StartsWith(r.text, tool + ": ") &&
                     absl::EndsWith(r.text, "; see '" + tool + " --help'") &&
                     r.text.find('\n') == std::string::npos &&
                     r.text.size() > tool.size() * 2 + 16,
                 "%s: usage error is not one line naming the tool: '%s'",
                 tool.c_str(), r.text.c_str());
      break;
    case ParseAction::kRun:
      break;
  }
}

void CheckCopy(int argc, const char* const* argv) {
  const auto r = bufpool::tools::ParseCopyArgs(argc, argv);
  CheckText(r, "bufpool-copy");
  if (r.action != ParseAction::kRun) return;
  const bufpool::tools::CopyCommand& c = r.command;
  const bufpool::CopyOptions& o = c.copy;
  FUZZ_CHECK(
      PowerOfTwoIn(o.buffer_size, 64, bufpool::tools::kMaxToolBufferSize),
      "bufpool-copy: buffer_size %zu", o.buffer_size);
  FUZZ_CHECK(o.batch_buffers <= bufpool::tools::kMaxCopyBatchBuffers,
             "bufpool-copy: batch_buffers %zu", o.batch_buffers);
  FUZZ_CHECK(o.queue_depth <= bufpool::tools::kMaxCopyQueueDepth,
             "bufpool-copy: queue_depth %zu", o.queue_depth);
  FUZZ_CHECK(uint64_t{o.buffer_size} * o.batch_buffers <=
                 bufpool::tools::kMaxCopyBytesPerOperation,
             "bufpool-copy: %zu x %zu bytes per operation", o.buffer_size,
             o.batch_buffers);
  FUZZ_CHECK(o.pool == nullptr, "bufpool-copy: pool set");
  FUZZ_CHECK(!c.sources.empty(), "bufpool-copy: no source");
  std::vector<std::string> operands = c.sources;
  operands.push_back(c.target);
  for (const std::string& op : operands) {
    FUZZ_CHECK(!op.empty() && op != "-", "bufpool-copy: operand '%s'",
               op.c_str());
  }
  bool method_known = false;
  for (const char* m : {"auto", "readwrite", "direct", "uring", "kernel"}) {
    auto parsed = bufpool::ParseCopyMethod(m);
    method_known |= parsed.has_value() && *parsed == o.method;
  }
  FUZZ_CHECK(method_known, "bufpool-copy: method %d",
             static_cast<int>(o.method));
}

void CheckEcho(int argc, const char* const* argv) {
  const auto r = bufpool::tools::ParseEchoArgs(argc, argv);
  CheckText(r, "bufpool-echo");
  if (r.action != ParseAction::kRun) return;
  const bufpool::tools::EchoCommand& c = r.command;
  FUZZ_CHECK(IsHostPort(c.server.listen, 0), "bufpool-echo: listen '%s'",
             c.server.listen.c_str());
  FUZZ_CHECK(c.server.max_unsent_bytes >= 1, "bufpool-echo: max_unsent 0");
  FUZZ_CHECK(c.server.pool == nullptr, "bufpool-echo: pool set");
  const auto engine =
      bufpool::ParseEchoEngine(bufpool::EchoEngineName(c.server.engine));
  FUZZ_CHECK(engine.has_value() && *engine == c.server.engine,
             "bufpool-echo: engine %d", static_cast<int>(c.server.engine));
  FUZZ_CHECK(c.pool.buffer_count >= 1 &&
                 c.pool.buffer_count <= bufpool::tools::kMaxEchoBuffers,
             "bufpool-echo: buffer_count %zu", c.pool.buffer_count);
  FUZZ_CHECK(
      PowerOfTwoIn(c.pool.buffer_size, 64, bufpool::tools::kMaxToolBufferSize),
      "bufpool-echo: buffer_size %zu", c.pool.buffer_size);
}

void CheckEchoLoad(int argc, const char* const* argv) {
  const auto r = bufpool::tools::ParseEchoLoadArgs(argc, argv);
  CheckText(r, "bufpool-echo-load");
  if (r.action != ParseAction::kRun) return;
  const bufpool::net::EchoLoadOptions& o = r.command.load;
  FUZZ_CHECK(IsHostPort(o.target, 1), "bufpool-echo-load: target '%s'",
             o.target.c_str());
  FUZZ_CHECK(o.connections >= 1 &&
                 o.connections <= bufpool::tools::kMaxLoadConnections,
             "bufpool-echo-load: connections %zu", o.connections);
  FUZZ_CHECK(o.messages >= 1 && uint64_t{o.connections} * o.messages <=
                                    bufpool::tools::kMaxLoadRoundTrips,
             "bufpool-echo-load: %zu x %zu round trips", o.connections,
             o.messages);
  FUZZ_CHECK(o.min_size >= 1 && o.min_size <= o.max_size &&
                 o.max_size <= bufpool::tools::kMaxLoadMessageSize,
             "bufpool-echo-load: sizes %zu:%zu", o.min_size, o.max_size);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0 || size > 2048) return 0;
  const int tool = data[0] % 3;
  static const char* const kNames[] = {"bufpool-copy", "bufpool-echo",
                                       "bufpool-echo-load"};
  std::vector<std::string> args = {kNames[tool]};
  std::string cur;
  for (size_t i = 1; i < size; ++i) {
    if (data[i] == 0) {
      args.push_back(cur);
      cur.clear();
    } else {
      cur.push_back(static_cast<char>(data[i]));
    }
  }
  if (!cur.empty()) args.push_back(cur);
  if (args.size() > 64) return 0;
  std::vector<const char*> argv;
  for (const std::string& a : args) argv.push_back(a.c_str());
  argv.push_back(nullptr);
  const int argc = static_cast<int>(args.size());
  switch (tool) {
    case 0:
      CheckCopy(argc, argv.data());
      break;
    case 1:
      CheckEcho(argc, argv.data());
      break;
    default:
      CheckEchoLoad(argc, argv.data());
      break;
  }
  return 0;
}

#include "echo_load_args.h"

#include <limits>
#include <optional>
#include <string>
#include <vector>

#include "CLI/CLI.hpp"
#include "absl/strings/str_cat.h"

namespace bufpool::tools {
namespace {

constexpr char kTool[] = "bufpool-echo-load";

constexpr char kUsage[] =
    R"(usage: bufpool-echo-load --target HOST:PORT [OPTIONS]

Opens N connections to an echo server, sends M messages of MIN..MAX bytes on
each, one at a time, verifies every echoed byte and prints throughput,
messages per second and round-trip latency (p50, p99, max).

)";

// --target, --connections and --messages: where the load goes and how much.
void AddTrafficOptions(CLI::App& app, net::EchoLoadOptions& o) {
  app.add_option("--target", o.target,
                 "the echo server, IPv4 HOST:PORT (required)")
      ->type_name("HOST:PORT")
      ->option_text("HOST:PORT")
      ->required()
      ->check(Ipv4HostPort(1));
  app.add_option("--connections", o.connections,
                 absl::StrCat("connections, 1 to ", kMaxLoadConnections,
                              " (default: ", kDefaultLoadConnections, ")"))
      ->type_name("N")
      ->option_text("N")
      ->transform(NumberIn(1, kMaxLoadConnections));
  app.add_option("--messages", o.messages,
                 absl::StrCat("messages per connection, at least 1; "
                              "connections\nx messages at most ",
                              kMaxLoadRoundTrips,
                              " (default: ", kDefaultLoadMessages, ")"))
      ->type_name("M")
      ->option_text("M")
      ->transform(NumberIn(1, kMaxLoadRoundTrips));
}

// --size (into `size`, checked after parsing) and --seed: what the messages
// hold. Returns the --size option, to see whether it was given.
CLI::Option* AddMessageOptions(CLI::App& app, net::EchoLoadOptions& o,
                               std::vector<size_t>& size) {
  // MIN:MAX is two numbers split at ':' by CLI11 ("--size 1 4096" works
  // too); the validator checks each, the bounds between them come after.
  CLI::Option* size_option =
      app.add_option("--size", size,
                     absl::StrCat("message sizes in bytes, MIN:MAX with\n"
                                  "1 <= MIN <= MAX <= ",
                                  kMaxLoadMessageSize, " (default: ",
                                  o.min_size, ":", o.max_size, ")"))
          ->type_name("MIN:MAX")
          ->option_text("MIN:MAX")
          ->delimiter(':')
          ->expected(2)
          ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll)
          ->transform(NumberIn(1, kMaxLoadMessageSize));
  app.add_option("--seed", o.seed,
                 absl::StrCat("seed of the message pattern and sizes, 0 "
                              "to\n",
                              std::numeric_limits<uint64_t>::max(),
                              " (default: ", o.seed, ")"))
      ->type_name("S")
      ->option_text("S")
      ->transform(NumberIn(0, std::numeric_limits<uint64_t>::max()));
  return size_option;
}

// Sets min_size and max_size from the values of every --size given (the
// last pair counts); the error, or nullopt.
std::optional<std::string> ApplySize(const std::vector<size_t>& size,
                                     net::EchoLoadOptions& o) {
  if (size.size() % 2 != 0 || size.size() < 2) return "--size wants MIN:MAX";
  const size_t lo = size[size.size() - 2], hi = size.back();
  if (lo > hi) {
    return absl::StrCat("--size ", lo, ":", hi, ": MIN is larger than MAX");
  }
  o.min_size = lo;
  o.max_size = hi;
  return std::nullopt;
}

}  // namespace

ParsedArgs<EchoLoadCommand> ParseEchoLoadArgs(int argc,
                                              const char* const* argv) {
  ParsedArgs<EchoLoadCommand> result;
  net::EchoLoadOptions& o = result.command.load;
  o.connections = kDefaultLoadConnections;
  o.messages = kDefaultLoadMessages;
  CLI::App app;
  ConfigureApp(app, kTool, kUsage,
               ExitStatusHelp("a byte came back wrong, a connection\n"
                              "     failed or the load stalled"));
  AddTrafficOptions(app, o);
  std::vector<size_t> size;
  CLI::Option* size_option = AddMessageOptions(app, o, size);

  result.action = RunParser(app, argc, argv, &result.text);
  if (result.action != ParseAction::kRun) return result;

  std::optional<std::string> error;
  // TakeAll keeps every value of every --size.
  if (size_option->count() > 0) error = ApplySize(size, o);
  if (!error && uint64_t{o.connections} * o.messages > kMaxLoadRoundTrips) {
    error = absl::StrCat("--connections ", o.connections, " x --messages ",
                         o.messages, " is over ", kMaxLoadRoundTrips,
                         " round trips");
  }
  if (error) {
    result.action = ParseAction::kUsageError;
    result.text = UsageLine(kTool, *error);
  }
  return result;
}

}  // namespace bufpool::tools

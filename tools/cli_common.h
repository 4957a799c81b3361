// Private to the command-line tools (not installed): the conventions that
// bufpool-copy, bufpool-echo and bufpool-echo-load share on top of CLI11.
//
// Each tool's arguments are parsed by a function of the form
//
//   ParsedArgs<Command> ParseXArgs(int argc, const char* const* argv);
//
// which never exits, never prints and never touches the file system or the
// network: it returns the help text, a one-line usage error, or a Command
// whose options are all within the library's limits. main() prints and picks
// the exit code; a fuzz target can call it over any argv.
//
// Thread safety: the functions here keep no state; each call is independent.
#ifndef BUFPOOL_TOOLS_CLI_COMMON_H_
#define BUFPOOL_TOOLS_CLI_COMMON_H_

#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

// CLI11 is a large header-only library: only the files that build a parser
// include it (CLI/CLI.hpp); the tools and tests that call ParseXArgs() do not.
namespace CLI {
class App;
class Validator;
}  // namespace CLI

namespace bufpool::tools {

// Exit status, the same in every tool (and written in each --help).
inline constexpr int kExitSuccess = 0;
inline constexpr int kExitFailure = 1;  // the work failed: a copy, a bind, ...
inline constexpr int kExitUsage = 2;    // bad or unknown option, bad operands

// The largest pool buffer the tools ask for. The library's pools take any
// power of two >= 64; one buffer above this is never useful for a copy or an
// echo and would make single reads and writes run into the kernel's 2 GiB
// per-call limit and io_uring's 32-bit lengths.
inline constexpr uint64_t kMaxToolBufferSize = uint64_t{4} << 20;  // 4 MiB

enum class ParseAction {
  kRun,         // options are valid: do the work
  kHelp,        // --help: print `text` on stdout, exit 0
  kUsageError,  // print `text` on stderr, exit 2
};

template <typename Command>
struct ParsedArgs {
  ParseAction action = ParseAction::kUsageError;
  // kHelp: the whole help text, ending in '\n'. kUsageError: one line
  // without '\n': "<tool>: <what is wrong>; see '<tool> --help'".
  std::string text;
  Command command;  // meaningful only for kRun
  // kRun: one-line notes without '\n' for stderr that do not stop the run
  // (a deprecated option name was used).
  std::vector<std::string> notes;
};

// For a parse that is not kRun: prints the help on stdout or the usage error
// on stderr and returns the exit code (kExitSuccess, kExitUsage); -1 for
// kRun, when the tool goes on to do its work, after printing the notes on
// stderr.
template <typename Command>
int PrintUnlessRun(const ParsedArgs<Command>& parsed) {
  switch (parsed.action) {
    case ParseAction::kHelp:
      std::fputs(parsed.text.c_str(), stdout);
      return kExitSuccess;
    case ParseAction::kUsageError:
      std::fprintf(stderr, "%s\n", parsed.text.c_str());
      return kExitUsage;
    case ParseAction::kRun:
      for (const std::string& note : parsed.notes) {
        std::fprintf(stderr, "%s\n", note.c_str());
      }
      break;
  }
  return -1;
}

// Sets the conventions on a fresh App: the program name, -h/--help, a help
// layout that starts with `usage` (the usage lines and a paragraph saying
// what the tool does; the options follow) and ends with `footer` followed by
// the exit-status paragraph; a repeated option takes its last value.
void ConfigureApp(CLI::App& app, const std::string& name,
                  const std::string& usage, const std::string& footer);

// Runs app.parse(argc, argv). kRun when it parsed; kHelp with the help text;
// kUsageError with the one-line message naming the option. argv[0] is the
// program name and is not parsed; argc may be 0, and a null entry before
// argv[argc] ends the arguments there.
ParseAction RunParser(CLI::App& app, int argc, const char* const* argv,
                      std::string* text);

// "<tool>: <old_name> is deprecated and goes in 0.4; use <new_name>" when an
// argument of argv before "--" is the option `old_name` ("--name" or
// "--name=VALUE"); empty otherwise. For ParsedArgs::notes after a kRun parse
// (CLI11 does not say which of an option's names was given).
std::string DeprecatedNameNote(const std::string& tool, int argc,
                               const char* const* argv,
                               const std::string& old_name,
                               const std::string& new_name);

// "<tool>: <message>; see '<tool> --help'", one line: control characters
// in `message` (a quoted argument may hold any) are escaped, '\n' as "\\n",
// the others as "\\xHH".
std::string UsageLine(const std::string& tool, const std::string& message);

// The paragraph on exit codes that ends every tool's --help; `failure`
// says what exit 1 means for this tool.
std::string ExitStatusHelp(const std::string& failure);

// Validators that also normalise the value to plain decimal for CLI11's
// conversion. A whole decimal number in [lo, hi] (no sign, no base prefix,
// no unit); the message names the range.
CLI::Validator NumberIn(uint64_t lo, uint64_t hi);
// A power of two in [lo, hi].
CLI::Validator PowerOfTwoIn(uint64_t lo, uint64_t hi);
// "HOST:PORT" with an IPv4 HOST (or "localhost") and a PORT in
// [min_port, 65535]: the form EchoServerOptions::listen and
// EchoLoadOptions::target take.
CLI::Validator Ipv4HostPort(uint32_t min_port);

}  // namespace bufpool::tools

#endif  // BUFPOOL_TOOLS_CLI_COMMON_H_

#include "cli_common.h"

#include <arpa/inet.h>

#include <exception>
#include <memory>
#include <utility>

#include "CLI/CLI.hpp"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

namespace bufpool::tools {
namespace {

// The help layout: the tool's own usage paragraph, then the options (one per
// line, "--name VALUE   what it does (default: ...)"), then the footer.
class ToolFormatter : public CLI::Formatter {
 public:
  explicit ToolFormatter(std::string usage) : usage_(std::move(usage)) {
    column_width(26);
  }
  std::string make_help(const CLI::App* app, std::string,
                        CLI::AppFormatMode mode) const override {
    return absl::StrCat(usage_, make_groups(app, mode), "\n", make_footer(app));
  }
  // "-n, --no-clobber": every name, without CLI11's "{false}" marks.
  std::string make_option_name(const CLI::Option* opt, bool) const override {
    std::string names;
    for (const std::string& n : opt->get_snames()) {
      absl::StrAppend(&names, names.empty() ? "" : ", ", "-", n);
    }
    for (const std::string& n : opt->get_lnames()) {
      absl::StrAppend(&names, names.empty() ? "" : ", ", "--", n);
    }
    return names;
  }
  // A flag shows nothing after its names; an option shows its VALUE word.
  std::string make_option_opts(const CLI::Option* opt) const override {
    return opt->get_option_text().empty() ? "" : " " + opt->get_option_text();
  }

 private:
  std::string usage_;
};

// A plain decimal number: digits only (no sign, space, 0x or unit), and no
// overflow.
bool ParseDecimal(const std::string& value, uint64_t* out) {
  if (value.empty() || value.size() > 20) return false;
  for (char c : value) {
    if (c < '0' || c > '9') return false;
  }
  return absl::SimpleAtoi(value, out);
}

}  // namespace

void ConfigureApp(CLI::App& app, const std::string& name,
                  const std::string& usage, const std::string& footer) {
  app.name(name);
  app.set_help_flag("-h,--help", "show this help and exit");
  app.formatter(std::make_shared<ToolFormatter>(usage));
  app.footer(footer);
  // As with most Unix tools, a later --x=2 overrides an earlier --x=1.
  app.option_defaults()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
}

std::string UsageLine(const std::string& tool, const std::string& message) {
  // The message may quote an argument, which may hold any byte: control
  // characters are escaped so that the error stays one line.
  std::string line;
  for (const char c : message) {
    const auto u = static_cast<unsigned char>(c);
    if (c == '\n') {
      line += "\\n";
    } else if (u < 0x20 || u == 0x7f) {
      absl::StrAppend(&line, "\\x", absl::Hex(u, absl::kZeroPad2));
    } else {
      line.push_back(c);
    }
  }
  return absl::StrCat(tool, ": ", line, "; see '", tool, " --help'");
}

std::string DeprecatedNameNote(const std::string& tool, int argc,
                               const char* const* argv,
                               const std::string& old_name,
                               const std::string& new_name) {
  if (argv == nullptr) return "";
  for (int i = 1; i < argc && argv[i] != nullptr; ++i) {
    const absl::string_view arg = argv[i];
    if (arg == "--") break;
    if (arg == old_name || absl::StartsWith(arg, absl::StrCat(old_name, "="))) {
      return absl::StrCat(tool, ": ", old_name,
                          " is deprecated and goes in 0.4; use ", new_name);
    }
  }
  return "";
}

ParseAction RunParser(CLI::App& app, int argc, const char* const* argv,
                      std::string* text) {
  static const char* const kNoArgs[] = {"", nullptr};
  if (argc < 1 || argv == nullptr || argv[0] == nullptr) {
    argc = 1;
    argv = kNoArgs;
  }
  // An argv cut short by a null entry ends there.
  for (int i = 1; i < argc; ++i) {
    if (argv[i] == nullptr) argc = i;
  }
  // CLI11 2.1 reads "--name=" (an empty value) as "--name" and takes the
  // next argument as its value; none of the tools has an option whose value
  // may be empty, so that is refused here, naming the option.
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--") break;
    if (arg.size() > 3 && arg.starts_with("--") && arg.ends_with("=") &&
        arg.find('=') == arg.size() - 1) {
      *text = UsageLine(
          app.get_name(),
          absl::StrCat(arg.substr(0, arg.size() - 1), ": an empty value"));
      return ParseAction::kUsageError;
    }
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp&) {
    *text = app.help();
    return ParseAction::kHelp;
  } catch (const CLI::ParseError& e) {
    // CLI11's words name the option ("--queue-depth: ...", "The following
    // argument was not expected: --bogus"); they are one line.
    std::string what = e.what();
    for (char& c : what) {
      if (c == '\n') c = ' ';
    }
    *text = UsageLine(app.get_name(), what);
    return ParseAction::kUsageError;
  } catch (const std::exception& e) {
    // CLI11 converts a flag's value ("--no-progress=N") with std::stoll,
    // whose out_of_range and invalid_argument are not ParseErrors.
    *text = UsageLine(app.get_name(),
                      absl::StrCat("a flag's value is not a number CLI11 can "
                                   "read (",
                                   e.what(), ")"));
    return ParseAction::kUsageError;
  }
  return ParseAction::kRun;
}

std::string ExitStatusHelp(const std::string& failure) {
  return absl::StrCat(
      "Exit status (the same for bufpool-copy, bufpool-echo and "
      "bufpool-echo-load):\n"
      "  0  success\n"
      "  1  the work failed: ",
      failure,
      "\n"
      "  2  usage error: an unknown option, a bad value or wrong operands\n"
      "     (nothing was done)\n"
      "Errors are one line on stderr, starting with the program's name.\n");
}

CLI::Validator NumberIn(uint64_t lo, uint64_t hi) {
  return CLI::Validator(
      [lo, hi](std::string& value) -> std::string {
        uint64_t v = 0;
        if (!ParseDecimal(value, &v)) {
          return absl::StrCat("'", value, "' is not a whole number (", lo,
                              " to ", hi, ")");
        }
        if (v < lo || v > hi) {
          return absl::StrCat(value, " is out of range (", lo, " to ", hi, ")");
        }
        value = absl::StrCat(v);
        return "";
      },
      "");
}

CLI::Validator PowerOfTwoIn(uint64_t lo, uint64_t hi) {
  return CLI::Validator(
      [lo, hi](std::string& value) -> std::string {
        uint64_t v = 0;
        if (!ParseDecimal(value, &v) || v < lo || v > hi ||
            (v & (v - 1)) != 0) {
          return absl::StrCat("'", value, "' is not a power of two from ", lo,
                              " to ", hi);
        }
        value = absl::StrCat(v);
        return "";
      },
      "");
}

CLI::Validator Ipv4HostPort(uint32_t min_port) {
  return CLI::Validator(
      [min_port](std::string& value) -> std::string {
        const size_t colon = value.rfind(':');
        const std::string host =
            colon == std::string::npos ? "" : value.substr(0, colon);
        const std::string port =
            colon == std::string::npos ? "" : value.substr(colon + 1);
        in_addr addr{};
        uint64_t p = 0;
        if (colon == std::string::npos || !ParseDecimal(port, &p) ||
            p < min_port || p > 65535 ||
            inet_pton(AF_INET, host == "localhost" ? "127.0.0.1" : host.c_str(),
                      &addr) != 1) {
          return absl::StrCat("'", value,
                              "' is not HOST:PORT with an IPv4 HOST and a "
                              "PORT from ",
                              min_port, " to 65535");
        }
        return "";
      },
      "");
}

}  // namespace bufpool::tools

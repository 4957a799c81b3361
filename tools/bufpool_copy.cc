// bufpool-copy: copies files with libbufpool's copy engine, following cp's
// conventions (see --help, tools/copy_args.cc).
#include <stdio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <set>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "bufpool/file_copy.h"
#include "copy_args.h"

namespace {

using bufpool::tools::kExitFailure;
using bufpool::tools::kExitSuccess;
using bufpool::tools::kExitUsage;

void Fail(const std::string& line) {
  std::fprintf(stderr, "bufpool-copy: %s\n", line.c_str());
}

std::string HumanBytes(double b) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  while (b >= 1024 && u < 4) {
    b /= 1024;
    ++u;
  }
  // Two calls: StrFormat checks a constant format string at compile time.
  return u == 0 ? absl::StrFormat("%.0f %s", b, units[u])
                : absl::StrFormat("%.1f %s", b, units[u]);
}

std::string JsonString(absl::string_view s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (static_cast<unsigned char>(c) < 0x20) {
      out += absl::StrFormat("\\u%04x", c);
    } else {
      out += c;
    }
  }
  return out + "\"";
}

// This process's peak resident memory (VmHWM), in bytes; 0 if unknown.
// Unlike getrusage's ru_maxrss it does not include the memory of the
// program that fork()ed us before exec.
uint64_t PeakRssBytes() {
  FILE* f = std::fopen("/proc/self/status", "r");
  if (f == nullptr) return 0;
  char line[256];
  unsigned long long kib = 0;
  while (std::fgets(line, sizeof line, f) != nullptr) {
    if (std::sscanf(line, "VmHWM: %llu kB", &kib) == 1) break;
  }
  std::fclose(f);
  return kib * 1024;
}

std::string StatsJson(const bufpool::CopyStats& s) {
  std::string fallbacks;
  for (const std::string& f : s.fallbacks) {
    absl::StrAppend(&fallbacks, fallbacks.empty() ? "" : ", ", JsonString(f));
  }
  const double secs = absl::ToDoubleSeconds(s.elapsed);
  return absl::StrCat(
      "{\"destination\": ", JsonString(s.destination),
      ", \"bytes_copied\": ", s.bytes_copied, ", \"file_size\": ", s.file_size,
      ", \"method_requested\": ",
      JsonString(bufpool::CopyMethodName(s.method_requested)),
      ", \"method\": ", JsonString(bufpool::CopyMethodName(s.method)),
      ", \"replace\": ",
      s.replace == bufpool::CopyOptions::Replace::kAtomic ? "\"atomic\""
                                                          : "\"in_place\"",
      ", \"created\": ", s.created ? "true" : "false",
      ", \"verified\": ", s.verified ? "true" : "false",
      ", \"direct_io\": ", s.direct_io ? "true" : "false",
      ", \"buffer_bytes\": ", s.buffer_bytes,
      ", \"fixed_buffers\": ", s.fixed_buffers ? "true" : "false",
      ", \"fallbacks\": [", fallbacks, "]",
      ", \"elapsed_seconds\": ", absl::StrFormat("%.6f", secs),
      ", \"bytes_per_second\": ",
      absl::StrFormat("%.0f", secs > 0 ? s.bytes_copied / secs : 0.0),
      ", \"syscalls\": ", s.syscalls, ", \"submissions\": ", s.submissions,
      ", \"operations\": ", s.operations,
      ", \"peak_rss_bytes\": ", PeakRssBytes(), "}");
}

struct Progress;
void EndProgressLine(const Progress* progress);

// -r: one directory SRC; every entry's error on its own line (after the
// progress line is ended, when one was drawn).
int CopyDirectory(const std::string& src, const std::string& target,
                  const bufpool::CopyOptions& options, bool json, bool verbose,
                  const Progress* progress) {
  absl::StatusOr<bufpool::TreeStats> t =
      bufpool::CopyTree(src, target, options);
  if (t.ok() && options.progress) {
    // The final count, drawn whatever the drawer's rate limit.
    options.progress({t->bytes_copied, 0, t->elapsed, t->files});
  }
  EndProgressLine(progress);
  if (verbose && t.ok()) {
    std::fprintf(stderr, "bufpool-copy: %s: %s\n", src.c_str(),
                 t->ring ? (t->ring_fixed_buffers
                                ? "small files through one io_uring ring "
                                  "(fixed buffers), larger ones with CopyFile"
                                : "small files through one io_uring ring, "
                                  "larger ones with CopyFile")
                         : t->ring_fallback.c_str());
  }
  if (!t.ok()) {
    Fail(std::string(t.status().message()));
    return kExitFailure;
  }
  for (const std::string& e : t->errors) Fail(e);
  if (json) {
    std::printf(
        "{\"destination\": %s, \"files\": %llu, \"directories\": %llu, "
        "\"symlinks\": %llu, \"nodes\": %llu, \"bytes_copied\": %llu, "
        "\"errors\": %zu, \"replace\": %s, \"elapsed_seconds\": %.6f}\n",
        JsonString(t->destination).c_str(),
        static_cast<unsigned long long>(t->files),
        static_cast<unsigned long long>(t->directories),
        static_cast<unsigned long long>(t->symlinks),
        static_cast<unsigned long long>(t->nodes),
        static_cast<unsigned long long>(t->bytes_copied), t->errors.size(),
        options.replace == bufpool::CopyOptions::Replace::kAtomic
            ? "\"atomic\""
            : "\"in_place\"",
        absl::ToDoubleSeconds(t->elapsed));
    std::fflush(stdout);
  }
  return t->errors.empty() ? kExitSuccess : kExitFailure;
}

// The progress line on stderr, redrawn at most every 200 ms and at the end;
// `drew` says whether a line needs ending.
struct Progress {
  absl::Time last = absl::InfinitePast();
  bool drew = false;
  uint64_t last_files = 0, last_bytes = 0;

  void Draw(const bufpool::CopyProgress& p) {
    const absl::Time now = absl::Now();
    // A tree's final count repeats the last one seen: always drawn.
    const bool tree_end = p.files_done > 0 && p.files_done == last_files &&
                          p.bytes_done == last_bytes;
    last_files = p.files_done;
    last_bytes = p.bytes_done;
    if (now - last < absl::Milliseconds(200) && !tree_end &&
        (p.bytes_total == 0 || p.bytes_done < p.bytes_total)) {
      return;
    }
    last = now;
    const double secs = std::max(1e-9, absl::ToDoubleSeconds(p.elapsed));
    const double rate = p.bytes_done / secs;
    std::string line;
    if (p.files_done > 0 && p.bytes_total == 0) {
      line = absl::StrFormat("%llu files  %s  %s/s",
                             static_cast<unsigned long long>(p.files_done),
                             HumanBytes(p.bytes_done), HumanBytes(rate));
    } else if (p.bytes_total > 0) {
      const double left = rate > 0 ? (p.bytes_total - p.bytes_done) / rate : 0;
      line = absl::StrFormat("%3.0f%%  %s / %s  %s/s  %.0fs left",
                             100.0 * p.bytes_done / p.bytes_total,
                             HumanBytes(p.bytes_done),
                             HumanBytes(p.bytes_total), HumanBytes(rate), left);
    } else {
      line = absl::StrFormat("%s  %s/s", HumanBytes(p.bytes_done),
                             HumanBytes(rate));
    }
    std::fprintf(stderr, "\r%-60s", line.c_str());
    drew = true;
  }
};

void EndProgressLine(const Progress* progress) {
  if (progress != nullptr && progress->drew) std::fputc('\n', stderr);
}

// One run of the tool over its sources.
class CopyRun {
 public:
  explicit CopyRun(const bufpool::tools::CopyCommand& cmd)
      : cmd_(cmd), options_(cmd.copy) {
    if (cmd.progress.value_or(isatty(STDERR_FILENO) != 0)) {
      options_.progress = [this](const bufpool::CopyProgress& p) {
        progress_.Draw(p);
      };
    }
  }

  int Main() {
    // cp: with several sources the target must be a directory, and nothing
    // is copied when it is not.
    const bufpool::PathInfo target = bufpool::InspectPath(cmd_.target);
    if (cmd_.sources.size() > 1 && !target.directory) {
      Fail(absl::StrCat(
          "target '", cmd_.target,
          "': ", std::strerror(target.error != 0 ? target.error : ENOTDIR)));
      return kExitFailure;
    }
    std::set<std::string> sources_seen;
    for (const std::string& src : cmd_.sources) {
      // cp's words for each of these; the other sources go on.
      if (!sources_seen.insert(src).second) {
        Fail(absl::StrCat("warning: source file '", src,
                          "' specified more than once"));
      } else if (bufpool::InspectPath(src).directory) {
        Directory(src);
      } else {
        File(src);
      }
    }
    return status_;
  }

 private:
  void Directory(const std::string& src) {
    if (!cmd_.recursive) {
      Fail(absl::StrCat("-r not specified; omitting directory '", src, "'"));
      status_ = kExitFailure;
      return;
    }
    progress_ = Progress();
    const int rc = CopyDirectory(src, cmd_.target, options_, cmd_.json,
                                 cmd_.verbose, &progress_);
    if (rc != kExitSuccess) status_ = kExitFailure;
  }

  void File(const std::string& src) {
    const std::string dst = bufpool::CopyDestination(src, cmd_.target);
    if (created_.contains(dst)) {
      Fail(absl::StrCat("will not overwrite just-created '", dst, "' with '",
                        src, "'"));
      status_ = kExitFailure;
      return;
    }
    progress_ = Progress();
    absl::StatusOr<bufpool::CopyStats> s =
        bufpool::CopyFile(src, cmd_.target, options_);
    if (progress_.drew) std::fputc('\n', stderr);
    if (!s.ok()) {
      // -n: an existing destination is skipped silently, as cp -n does.
      if (options_.no_clobber &&
          s.status().code() == absl::StatusCode::kAlreadyExists) {
        return;
      }
      Fail(std::string(s.status().message()));
      status_ = kExitFailure;
      return;
    }
    bufpool::CopyStats stats = *std::move(s);
    created_.insert(dst);
    if (cmd_.verbose) {
      // How the copy ran: the method and why, then each fallback taken.
      std::fprintf(stderr, "bufpool-copy: '%s' -> '%s': %s\n", src.c_str(),
                   stats.destination.c_str(), stats.method_reason.c_str());
      for (const std::string& f : stats.fallbacks) {
        std::fprintf(stderr, "bufpool-copy: '%s': fallback: %s\n", src.c_str(),
                     f.c_str());
      }
    }
    if (cmd_.verify) {
      absl::StatusOr<bool> verified =
          bufpool::VerifyCopy(src, stats.destination);
      if (!verified.ok()) {
        Fail(std::string(verified.status().message()));
        status_ = kExitFailure;
        return;
      }
      stats.verified = *verified;
    }
    if (cmd_.json) {
      std::printf("%s\n", StatsJson(stats).c_str());
      std::fflush(stdout);
    }
  }

  const bufpool::tools::CopyCommand& cmd_;
  bufpool::CopyOptions options_;
  Progress progress_;
  std::set<std::string> created_;
  int status_ = kExitSuccess;
};

}  // namespace

int main(int argc, char** argv) {
  bufpool::tools::ParsedArgs<bufpool::tools::CopyCommand> parsed =
      bufpool::tools::ParseCopyArgs(argc, argv);
  if (const int code = bufpool::tools::PrintUnlessRun(parsed); code >= 0) {
    return code;
  }
  return CopyRun(parsed.command).Main();
}

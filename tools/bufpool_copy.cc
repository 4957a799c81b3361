// bufpool-copy: copies files with libbufpool's copy engine, following cp's
// conventions (see --help, tools/copy_args.cc).
#include <fcntl.h>
#include <stdio.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <set>
#include <string>
#include <vector>

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
  return absl::StrFormat(u == 0 ? "%.0f %s" : "%.1f %s", b, units[u]);
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

// Re-reads both files and compares them; "" when equal, else the error.
std::string Verify(const std::string& a, const std::string& b) {
  const int fa = open(a.c_str(), O_RDONLY | O_CLOEXEC);
  if (fa < 0) return absl::StrCat("verify: ", a, ": ", std::strerror(errno));
  const int fb = open(b.c_str(), O_RDONLY | O_CLOEXEC);
  if (fb < 0) {
    const int err = errno;
    close(fa);
    return absl::StrCat("verify: ", b, ": ", std::strerror(err));
  }
  std::vector<char> x(1 << 20), y(1 << 20);
  std::string result;
  uint64_t pos = 0;
  // Reads up to n bytes (fewer only at end of file); -1 on error.
  auto read_full = [](int fd, char* p, size_t n) -> ssize_t {
    size_t done = 0;
    while (done < n) {
      const ssize_t r = read(fd, p + done, n - done);
      if (r < 0 && errno == EINTR) continue;
      if (r < 0) return -1;
      if (r == 0) break;
      done += static_cast<size_t>(r);
    }
    return static_cast<ssize_t>(done);
  };
  while (result.empty()) {
    const ssize_t na = read_full(fa, x.data(), x.size());
    if (na < 0) {
      result = absl::StrCat("verify: ", a, ": ", std::strerror(errno));
      break;
    }
    const ssize_t nb = read_full(fb, y.data(), y.size());
    if (nb < 0) {
      result = absl::StrCat("verify: ", b, ": ", std::strerror(errno));
      break;
    }
    const size_t n = static_cast<size_t>(std::min(na, nb));
    if (std::memcmp(x.data(), y.data(), n) != 0 || na != nb) {
      size_t i = 0;
      while (i < n && x[i] == y[i]) ++i;
      result = absl::StrCat("verify: ", b, ": differs from ", a, " at byte ",
                            pos + i);
      break;
    }
    if (na == 0) break;
    pos += static_cast<uint64_t>(na);
  }
  close(fa);
  close(fb);
  return result;
}

// The last path component of `path`, trailing slashes ignored (as
// CopyFile names a copy into a directory).
std::string BaseName(std::string path) {
  while (path.size() > 1 && path.back() == '/') path.pop_back();
  const size_t slash = path.rfind('/');
  return slash == std::string::npos ? path : path.substr(slash + 1);
}

bool IsDirectory(const std::string& path) {
  struct stat st;
  return stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

// -r: one directory SRC; every entry's error on its own line.
int CopyDirectory(const std::string& src, const std::string& target,
                  const bufpool::CopyOptions& options, bool json) {
  absl::StatusOr<bufpool::TreeStats> t =
      bufpool::CopyTree(src, target, options);
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

// cp: with several sources the target must be a directory, and nothing is
// copied when it is not.
int FailNotADirectory(const std::string& target) {
  struct stat st;
  Fail(absl::StrCat("target '", target, "': ",
                    stat(target.c_str(), &st) == 0 ? std::strerror(ENOTDIR)
                                                   : std::strerror(errno)));
  return kExitFailure;
}

// The progress line on stderr: redrawn at most every 200 ms, and when a
// file is done.
class ProgressLine {
 public:
  // Before each file: its first report draws at once.
  void Start() {
    drew_ = false;
    last_ = absl::InfinitePast();
  }
  // After each file: ends a line that was drawn.
  void Finish() {
    if (drew_) std::fputc('\n', stderr);
  }
  void Draw(const bufpool::CopyProgress& p) {
    const absl::Time now = absl::Now();
    if (now - last_ < absl::Milliseconds(200) &&
        (p.bytes_total == 0 || p.bytes_done < p.bytes_total)) {
      return;
    }
    last_ = now;
    const double secs = std::max(1e-9, absl::ToDoubleSeconds(p.elapsed));
    const double rate = p.bytes_done / secs;
    std::string line;
    if (p.bytes_total > 0) {
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
    drew_ = true;
  }

 private:
  absl::Time last_ = absl::InfinitePast();
  bool drew_ = false;
};

// A directory SRC: copied with -r, refused (exit 1) without.
int CopyDirectorySource(const std::string& src,
                        const bufpool::tools::CopyCommand& cmd,
                        const bufpool::CopyOptions& options) {
  if (!cmd.recursive) {
    Fail(absl::StrCat("-r not specified; omitting directory '", src, "'"));
    return kExitFailure;
  }
  return CopyDirectory(src, cmd.target, options, cmd.json);
}

// After one file's copy: --verify (a regular destination only) and --json.
int VerifyAndReport(const std::string& src, bufpool::CopyStats stats,
                    const bufpool::tools::CopyCommand& cmd) {
  // A device or FIFO cannot be read back as what was written to it.
  struct stat written;
  const bool regular = stat(stats.destination.c_str(), &written) == 0 &&
                       S_ISREG(written.st_mode);
  if (cmd.verify && regular) {
    if (std::string err = Verify(src, stats.destination); !err.empty()) {
      Fail(err);
      return kExitFailure;
    }
    stats.verified = true;
  }
  if (cmd.json) {
    std::printf("%s\n", StatsJson(stats).c_str());
    std::fflush(stdout);
  }
  return kExitSuccess;
}

// A file SRC (anything but a directory), to the target or into it; each
// destination written once per run, as cp does.
int CopyFileSource(const std::string& src,
                   const bufpool::tools::CopyCommand& cmd,
                   const bufpool::CopyOptions& options, bool into_directory,
                   std::set<std::string>& created, ProgressLine& progress) {
  const std::string dst =
      into_directory
          ? absl::StrCat(cmd.target, cmd.target.ends_with('/') ? "" : "/",
                         BaseName(src))
          : cmd.target;
  if (created.contains(dst)) {
    Fail(absl::StrCat("will not overwrite just-created '", dst, "' with '", src,
                      "'"));
    return kExitFailure;
  }
  progress.Start();
  absl::StatusOr<bufpool::CopyStats> s =
      bufpool::CopyFile(src, cmd.target, options);
  progress.Finish();
  if (!s.ok()) {
    // -n: an existing destination is skipped silently, as cp -n does.
    if (options.no_clobber &&
        s.status().code() == absl::StatusCode::kAlreadyExists) {
      return kExitSuccess;
    }
    Fail(std::string(s.status().message()));
    return kExitFailure;
  }
  created.insert(dst);
  return VerifyAndReport(src, *std::move(s), cmd);
}

}  // namespace

int main(int argc, char** argv) {
  bufpool::tools::ParsedArgs<bufpool::tools::CopyCommand> parsed =
      bufpool::tools::ParseCopyArgs(argc, argv);
  if (const int code = bufpool::tools::PrintUnlessRun(parsed); code >= 0) {
    return code;
  }
  const bufpool::tools::CopyCommand& cmd = parsed.command;
  bufpool::CopyOptions options = cmd.copy;

  const bool into_directory = IsDirectory(cmd.target);
  if (cmd.sources.size() > 1 && !into_directory) {
    return FailNotADirectory(cmd.target);
  }
  ProgressLine progress;
  if (cmd.progress.value_or(isatty(STDERR_FILENO) != 0)) {
    options.progress = [&progress](const bufpool::CopyProgress& p) {
      progress.Draw(p);
    };
  }

  int status = kExitSuccess;
  std::set<std::string> sources_seen, created;
  for (const std::string& src : cmd.sources) {
    // cp's words for each of these; the other sources go on.
    if (!sources_seen.insert(src).second) {
      Fail(absl::StrCat("warning: source file '", src,
                        "' specified more than once"));
      continue;
    }
    const int copied = IsDirectory(src)
                           ? CopyDirectorySource(src, cmd, options)
                           : CopyFileSource(src, cmd, options, into_directory,
                                            created, progress);
    if (copied != kExitSuccess) status = kExitFailure;
  }
  return status;
}

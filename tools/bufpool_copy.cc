// bufpool-copy: copies a file with libbufpool's copy engine (see --help).
#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "bufpool/file_copy.h"

namespace {

constexpr char kHelp[] = R"(usage: bufpool-copy [options] SRC DST

Copies SRC to DST (or into DST/ when DST is a directory), replacing DST
atomically: the data goes to a temporary file beside DST that is renamed over
it only when complete, so a failed copy leaves DST as it was. Sparse holes,
permission bits and files that report size 0 (/proc) are handled.

Options:
  --method=METHOD   how to move the bytes (default: auto)
      auto        the method measured fastest for the pair of files
                  (copy_file_range for regular files; readwrite otherwise).
      readwrite   preadv/pwritev, gathering 32 pooled 4 KiB buffers (128 KiB)
                  per call. Works everywhere; use it when the others are
                  refused.
      direct      O_DIRECT on both files, many aligned reads and writes in
                  flight through io_uring: bypasses the page cache, so copying
                  a huge file does not evict everything else. Use for big
                  files on real disks. Falls back to buffered I/O when the
                  file system refuses O_DIRECT.
      uring       io_uring with the buffer pool registered as fixed buffers,
                  reads and writes overlapped. Use for fast devices with a
                  cold cache; add --direct-io to bypass the page cache.
      kernel      copy_file_range (then sendfile): the kernel moves the data
                  without copying it to user space, and may reflink or
                  offload it on file systems that can. Falls back to readwrite
                  across file systems or where it is refused.
  --direct-io       with --method=uring: open both files with O_DIRECT
  --fsync           sync the data before the rename and the directory after
  --progress        show progress on stderr (default when it is a terminal)
  --no-progress     never show progress
  --verify          after copying, re-read both files and compare them
  --json            print the copy statistics as JSON on stdout
  --help            show this help

Exit status: 0 on success, 1 when the copy or verification fails, 2 for a
usage error. Errors are one line on stderr:
  bufpool-copy: <what failed>: <path>: <the system's words>
)";

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

}  // namespace

int main(int argc, char** argv) {
  bufpool::CopyOptions options;
  bool verify = false, json = false, direct_io = false;
  int progress = isatty(STDERR_FILENO) ? 1 : 0;
  std::vector<std::string> paths;
  bool flags_done = false;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (flags_done || arg.size() < 2 || arg[0] != '-') {
      paths.push_back(arg);
    } else if (arg == "--") {
      flags_done = true;
    } else if (arg == "--help" || arg == "-h") {
      std::fputs(kHelp, stdout);
      return 0;
    } else if (arg.rfind("--method=", 0) == 0) {
      const auto m = bufpool::ParseCopyMethod(arg.substr(9));
      if (!m) {
        Fail(absl::StrCat("unknown method: ", arg.substr(9),
                          " (auto, readwrite, direct, uring or kernel)"));
        return 2;
      }
      options.method = *m;
    } else if (arg == "--fsync") {
      options.fsync = true;
    } else if (arg == "--progress") {
      progress = 1;
    } else if (arg == "--no-progress") {
      progress = 0;
    } else if (arg == "--verify") {
      verify = true;
    } else if (arg == "--json") {
      json = true;
    } else if (arg == "--direct-io") {
      direct_io = true;
    } else {
      Fail(absl::StrCat("unknown flag: ", arg, " (see --help)"));
      return 2;
    }
  }
  if (paths.size() != 2) {
    Fail(absl::StrCat("expected SRC and DST, got ", paths.size(),
                      " paths (see --help)"));
    return 2;
  }
  options.direct_io = direct_io;

  absl::Time last = absl::InfinitePast();
  bool drew = false;
  if (progress) {
    options.progress = [&](const bufpool::CopyProgress& p) {
      const absl::Time now = absl::Now();
      if (now - last < absl::Milliseconds(200) &&
          (p.bytes_total == 0 || p.bytes_done < p.bytes_total)) {
        return;
      }
      last = now;
      const double secs = std::max(1e-9, absl::ToDoubleSeconds(p.elapsed));
      const double rate = p.bytes_done / secs;
      std::string line;
      if (p.bytes_total > 0) {
        const double left =
            rate > 0 ? (p.bytes_total - p.bytes_done) / rate : 0;
        line = absl::StrFormat(
            "%3.0f%%  %s / %s  %s/s  %.0fs left",
            100.0 * p.bytes_done / p.bytes_total, HumanBytes(p.bytes_done),
            HumanBytes(p.bytes_total), HumanBytes(rate), left);
      } else {
        line = absl::StrFormat("%s  %s/s", HumanBytes(p.bytes_done),
                               HumanBytes(rate));
      }
      std::fprintf(stderr, "\r%-60s", line.c_str());
      drew = true;
    };
  }

  absl::StatusOr<bufpool::CopyStats> stats =
      bufpool::CopyFile(paths[0], paths[1], options);
  if (drew) std::fputc('\n', stderr);
  if (!stats.ok()) {
    Fail(std::string(stats.status().message()));
    return 1;
  }
  if (verify) {
    if (std::string err = Verify(paths[0], stats->destination); !err.empty()) {
      Fail(err);
      return 1;
    }
  }
  if (json) std::printf("%s\n", StatsJson(*stats).c_str());
  return 0;
}

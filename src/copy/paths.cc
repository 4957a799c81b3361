// The copy engine's questions about paths, for callers that decide what to
// copy (bufpool-copy): what a path is, where a copy goes, and whether a copy
// reads back equal. Every call goes through the system-call seam.
#include <fcntl.h>
#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "bufpool/file_copy.h"
#include "copy/copy_internal.h"
#include "os/file.h"
#include "os/syscalls.h"

namespace bufpool {
namespace {

// A descriptor opened for reading, closed when it goes.
struct ReadFd {
  explicit ReadFd(const std::string& path)
      : fd(os::Sys().open(path.c_str(), O_RDONLY, 0)) {}
  ~ReadFd() {
    if (fd >= 0) os::Sys().close(fd);
  }
  ReadFd(const ReadFd&) = delete;
  ReadFd& operator=(const ReadFd&) = delete;
  int fd;
};

// Reads up to the size of `buf` (fewer bytes only at end of file).
absl::StatusOr<size_t> ReadChunk(int fd, std::vector<char>& buf,
                                 const std::string& path) {
  const iovec iov{buf.data(), buf.size()};
  absl::StatusOr<size_t> n = os::ReadFull(fd, &iov, 1, -1, path);
  if (!n.ok()) {
    return absl::Status(n.status().code(),
                        absl::StrCat("verify: ", n.status().message()));
  }
  return n;
}

}  // namespace

PathInfo InspectPath(absl::string_view path) {
  const std::string p(path);
  struct stat st;
  PathInfo info;
  if (os::Sys().stat(p.c_str(), &st) != 0) {
    info.error = errno;
    return info;
  }
  info.directory = S_ISDIR(st.st_mode);
  info.regular = S_ISREG(st.st_mode);
  return info;
}

std::string CopyDestination(absl::string_view src, absl::string_view dst) {
  if (InspectPath(dst).directory) {
    return absl::StrCat(dst, !dst.empty() && dst.back() == '/' ? "" : "/",
                        copy_internal::BaseName(src));
  }
  return std::string(dst);
}

absl::StatusOr<bool> VerifyCopy(absl::string_view src_view,
                                absl::string_view dst_view) {
  const std::string src(src_view), dst(dst_view);
  if (!InspectPath(dst).regular) return false;
  ReadFd a(src);
  if (a.fd < 0) return copy_internal::IoError("verify", src, errno);
  ReadFd b(dst);
  if (b.fd < 0) return copy_internal::IoError("verify", dst, errno);
  std::vector<char> x(1 << 20), y(1 << 20);
  for (uint64_t pos = 0;;) {
    absl::StatusOr<size_t> na = ReadChunk(a.fd, x, src);
    if (!na.ok()) return na.status();
    absl::StatusOr<size_t> nb = ReadChunk(b.fd, y, dst);
    if (!nb.ok()) return nb.status();
    const size_t n = std::min(*na, *nb);
    if (std::memcmp(x.data(), y.data(), n) != 0 || *na != *nb) {
      const size_t i = static_cast<size_t>(
          std::mismatch(x.begin(), x.begin() + n, y.begin()).first - x.begin());
      return absl::DataLossError(absl::StrCat(
          "verify: ", dst, ": differs from ", src, " at byte ", pos + i));
    }
    if (*na == 0) return true;
    pos += *na;
  }
}

}  // namespace bufpool

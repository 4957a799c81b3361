#include "os/file.h"

#include <limits.h>

#include <algorithm>
#include <cerrno>
#include <vector>

#include "absl/strings/str_cat.h"
#include "os/error.h"
#include "os/syscalls.h"

namespace bufpool::os {
namespace {

// Skips `done` bytes of `iov`, writing the remainder's iovecs into `out`.
void Advance(const iovec* iov, int iovcnt, size_t done,
             std::vector<iovec>& out) {
  out.clear();
  for (int i = 0; i < iovcnt; ++i) {
    if (done >= iov[i].iov_len) {
      done -= iov[i].iov_len;
      continue;
    }
    out.push_back(
        {static_cast<char*>(iov[i].iov_base) + done, iov[i].iov_len - done});
    done = 0;
  }
}

size_t Total(const iovec* iov, int iovcnt) {
  size_t n = 0;
  for (int i = 0; i < iovcnt; ++i) n += iov[i].iov_len;
  return n;
}

enum class Direction { kRead, kWrite };

// The loop behind WriteAll() and ReadFull(): one vectored call after another
// until every byte moved, retrying EINTR and resuming after short transfers.
// They differ only where a call moves nothing: end of file for a read, EIO
// for a write (no progress and no error must not spin).
absl::StatusOr<size_t> Transfer(Direction direction, int fd, const iovec* iov,
                                int iovcnt, off_t offset,
                                absl::string_view path, IoLoopOptions options) {
  const bool reading = direction == Direction::kRead;
  const char* const verb = reading ? "read: " : "write: ";
  const size_t total = Total(iov, iovcnt);
  size_t done = 0;
  // The caller's iovecs until a short transfer; what is left after that.
  const iovec* cur = iov;
  size_t cur_cnt = static_cast<size_t>(iovcnt);
  std::vector<iovec> rest;
  while (done < total) {
    const int cnt = static_cast<int>(std::min<size_t>(cur_cnt, IOV_MAX));
    const off_t at = offset + static_cast<off_t>(done);
    if (options.calls != nullptr) ++*options.calls;
    ssize_t n;
    if (reading) {
      n = offset < 0 ? Sys().readv(fd, cur, cnt)
                     : Sys().preadv(fd, cur, cnt, at);
    } else {
      n = offset < 0 ? Sys().writev(fd, cur, cnt)
                     : Sys().pwritev(fd, cur, cnt, at);
    }
    if (n < 0) {
      if (errno == EINTR) continue;
      return PosixError(absl::StrCat(verb, path), errno);
    }
    if (n == 0) {
      if (reading) break;  // end of file
      return PosixError(absl::StrCat(verb, path), EIO);
    }
    done += static_cast<size_t>(n);
    if (reading && options.stop_unaligned != 0 &&
        done % options.stop_unaligned != 0) {
      break;
    }
    if (done == total) break;
    Advance(iov, iovcnt, done, rest);
    cur = rest.data();
    cur_cnt = rest.size();
  }
  return done;
}

}  // namespace

absl::Status WriteAll(int fd, const iovec* iov, int iovcnt, off_t offset,
                      absl::string_view path, IoLoopOptions options) {
  return Transfer(Direction::kWrite, fd, iov, iovcnt, offset, path, options)
      .status();
}

absl::StatusOr<size_t> ReadFull(int fd, const iovec* iov, int iovcnt,
                                off_t offset, absl::string_view path,
                                IoLoopOptions options) {
  return Transfer(Direction::kRead, fd, iov, iovcnt, offset, path, options);
}

absl::Status Close(int fd, absl::string_view path) {
  if (Sys().close(fd) != 0 && errno != EINTR) {
    return PosixError(absl::StrCat("close ", path), errno);
  }
  return absl::OkStatus();
}

}  // namespace bufpool::os

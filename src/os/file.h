// Files: the loops that turn the seam's calls (os/syscalls.h) into "all or a
// clear error", retrying EINTR and resuming after short transfers.
//
// Thread safety: every function may be called from any thread, on
// descriptors the caller does not use concurrently elsewhere.
#ifndef BUFPOOL_SRC_OS_FILE_H_
#define BUFPOOL_SRC_OS_FILE_H_

#include <sys/types.h>
#include <sys/uio.h>

#include <cstddef>
#include <cstdint>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace bufpool::os {

// What WriteAll and ReadFull may do besides their defaults.
struct IoLoopOptions {
  // Incremented once per system call made (EINTR retries included).
  uint64_t* calls = nullptr;
  // ReadFull only: stop once the bytes read are not a multiple of this
  // (0: never). An O_DIRECT read that ends inside a block has reached end of
  // file, and reading on from the unaligned offset would fail with EINVAL.
  size_t stop_unaligned = 0;
};

// Writes every byte of iov[0, iovcnt) to `fd`: with pwritev at `offset`, or
// with writev at the file position when `offset` is -1. Retries EINTR and
// continues after short writes; a write that moves nothing is EIO. On failure
// the Status reads "write: <path>: <the system's words>", e.g. "write:
// /tmp/x: No space left on device"; bytes written before the failure are not
// rolled back. `iov` is not modified. At most IOV_MAX iovecs go to one call.
absl::Status WriteAll(int fd, const iovec* iov, int iovcnt, off_t offset,
                      absl::string_view path, IoLoopOptions options = {});

// Reads into iov[0, iovcnt) until it is full or end of file: with preadv at
// `offset`, or readv at the file position when `offset` is -1. Retries EINTR
// and continues after short reads. Returns the bytes read (less than the
// total only at end of file); errors read "read: <path>: <words>".
absl::StatusOr<size_t> ReadFull(int fd, const iovec* iov, int iovcnt,
                                off_t offset, absl::string_view path,
                                IoLoopOptions options = {});

// close(), with its error reported (it can carry a delayed write error).
// EINTR is not retried: on Linux the descriptor is closed regardless.
absl::Status Close(int fd, absl::string_view path);

}  // namespace bufpool::os

#endif  // BUFPOOL_SRC_OS_FILE_H_

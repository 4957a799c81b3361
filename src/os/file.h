// Thin OS layer for files and sockets: every system call the I/O layers
// (copy engine, buffered streams, echo server) make goes through one table,
// so tests can inject faults (short transfers, EINTR, ENOSPC, EIO) without
// touching the real system; plus the loops that turn those calls into
// "all or a clear error".
//
// Thread safety: Sys() may be called from any thread. Installing a table with
// ScopedSyscalls is not synchronised: do it before starting the threads that
// use it, and remove it after they stop.
#ifndef BUFPOOL_SRC_OS_FILE_H_
#define BUFPOOL_SRC_OS_FILE_H_

#include <dirent.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/uio.h>
#include <time.h>

#include <cstddef>
#include <cstdint>
#include <memory>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace bufpool::os {

class Uring;  // os/uring.h

// Every entry behaves like the libc call of the same name (returns -1 and
// sets errno on failure). Add entries here rather than calling libc directly.
struct SyscallTable {
  int (*open)(const char* path, int flags, mode_t mode);
  int (*close)(int fd);
  ssize_t (*read)(int fd, void* buf, size_t n);
  ssize_t (*write)(int fd, const void* buf, size_t n);
  ssize_t (*readv)(int fd, const iovec* iov, int iovcnt);
  ssize_t (*writev)(int fd, const iovec* iov, int iovcnt);
  ssize_t (*preadv)(int fd, const iovec* iov, int iovcnt, off_t offset);
  ssize_t (*pwritev)(int fd, const iovec* iov, int iovcnt, off_t offset);
  int (*fsync)(int fd);
  int (*fstat)(int fd, struct stat* st);
  int (*ftruncate)(int fd, off_t length);
  off_t (*lseek)(int fd, off_t offset, int whence);
  int (*rename)(const char* from, const char* to);
  int (*unlink)(const char* path);
  ssize_t (*copy_file_range)(int fd_in, off_t* off_in, int fd_out,
                             off_t* off_out, size_t len, unsigned flags);
  ssize_t (*sendfile)(int out_fd, int in_fd, off_t* offset, size_t count);
  // Added for the copy engine (src/copy).
  int (*stat)(const char* path, struct stat* st);
  int (*fchmod)(int fd, mode_t mode);
  // Added for O_DIRECT copies: reserving the destination's blocks first.
  int (*fallocate)(int fd, int mode, off_t offset, off_t len);
  // io_uring: creates a ring (see os/uring.h); returns 0 or -errno.
  int (*uring_create)(unsigned entries, std::unique_ptr<Uring>* out);
  // Added for writing destinations as cp does (in place or atomic, owners,
  // modes, times, no-clobber).
  int (*lstat)(const char* path, struct stat* st);
  int (*fchown)(int fd, uid_t owner, gid_t group);
  int (*futimens)(int fd, const struct timespec times[2]);
  int (*renameat2)(int olddirfd, const char* from, int newdirfd, const char* to,
                   unsigned flags);
  int (*link)(const char* from, const char* to);
  // realpath(path, nullptr): the result is malloc'ed; the caller frees it.
  char* (*realpath)(const char* path, char* resolved);
  // Added for tree copies (CopyTree).
  int (*mkdir)(const char* path, mode_t mode);
  int (*symlink)(const char* target, const char* path);
  ssize_t (*readlink)(const char* path, char* buf, size_t size);
  int (*mknod)(const char* path, mode_t mode, dev_t dev);
  int (*chmod)(const char* path, mode_t mode);
  int (*lchown)(const char* path, uid_t owner, gid_t group);
  int (*utimensat)(int dirfd, const char* path, const struct timespec times[2],
                   int flags);
  DIR* (*opendir)(const char* path);
  dirent* (*readdir)(DIR* dir);
  int (*closedir)(DIR* dir);
};

// The real system calls.
const SyscallTable& RealSyscalls();

// The table in use: RealSyscalls() unless a test installed another.
const SyscallTable& Sys();

// Test seam: makes `table` the one Sys() returns until destroyed. Nestable.
class ScopedSyscalls {
 public:
  explicit ScopedSyscalls(const SyscallTable* table);
  ~ScopedSyscalls();
  ScopedSyscalls(const ScopedSyscalls&) = delete;
  ScopedSyscalls& operator=(const ScopedSyscalls&) = delete;

 private:
  const SyscallTable* previous_;
};

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

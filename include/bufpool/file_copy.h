// libbufpool: copy one file to another on pooled, page-aligned buffers.
//
//   bufpool::CopyOptions options;                  // kAuto, private pool
//   absl::StatusOr<bufpool::CopyStats> stats =
//       bufpool::CopyFile("/data/in.bin", "/backup/", options);
//   if (!stats.ok()) { /* "write: /backup/in.bin: No space left on device" */ }
//
// Methods (CopyMethod):
//   kReadWrite  preadv/pwritev gathering many pooled buffers per call (one
//               iovec per run of adjacent slots), so 4 KiB buffers never
//               mean 4 KiB system calls.
//   kDirect     O_DIRECT on both files (bypasses the page cache) with the
//               pool's aligned buffers, reads and writes overlapped through
//               io_uring when it is available (a synchronous loop otherwise).
//               Falls back to buffered I/O when a file system refuses O_DIRECT.
//               The destination's blocks are reserved (fallocate) before they
//               are written (also for kUring with `direct_io`); a full disk
//               then fails the reservation ("allocate space for: <dst>: No
//               space left on device").
//   kUring      io_uring with the buffers the copy uses registered as fixed
//               buffers (only those, so the cost does not grow with a
//               shared pool's size; each thread keeps its ring between
//               copies), many operations in flight, reads and writes
//               overlapped. Falls back to unregistered buffers when
//               registration fails (RLIMIT_MEMLOCK) and to kReadWrite when
//               io_uring is unavailable. `direct_io` adds O_DIRECT.
//   kKernel     copy_file_range, then sendfile; falls back to kReadWrite on
//               EXDEV, EINVAL, ENOSYS, EOPNOTSUPP, EBADF and for files whose
//               size the kernel reports as 0 (/proc).
//   kAuto       kKernel for a regular file of nonzero size (copy_file_range
//               keeps the bytes in the kernel), kReadWrite for anything else;
//               CopyStats::method says which one ran.
// Every fallback is recorded in CopyStats::fallbacks.
//
// Semantics, the same for every method:
//   * The bytes of `dst` equal those of `src`; holes of a sparse source stay
//     holes (SEEK_DATA/SEEK_HOLE); a file that reports size 0 (/proc/version)
//     is read to end of file. The permission bits (07777) are copied.
//   * `dst` is replaced atomically: the data goes to a temporary file
//     ".<name>.bufpool-copy.XXXXXX" in the destination's directory, renamed
//     over `dst` only when every byte is written (and with `fsync`, synced,
//     then the directory synced). On error the temporary file is removed and
//     an existing `dst` is left as it was. A process killed mid-copy leaves
//     the old `dst` and possibly a temporary file with that name.
//   * When `dst` is an existing directory the copy goes to dst/basename(src).
//     Copying a file onto itself (same device and inode, e.g. a hard link)
//     and a directory as source are refused before anything is touched.
//     A symbolic link at `dst` is followed for that check, then replaced by
//     the rename (the link itself becomes the copy, as with `cp
//     --remove-destination`).
//   * Memory is bounded by the buffers used (queue_depth * batch_buffers
//     buffers: by default 128 KiB for kReadWrite and kKernel, 512 KiB for
//     kUring, 4 MiB with O_DIRECT), whatever the file size.
//
// Errors: absl::Status whose message reads "<what failed>: <path>: <the
// system's words>", e.g. "open source: /x: No such file or directory".
//
// Thread safety: CopyFile may run on many threads at once (each call uses
// its own file descriptors, ring and buffers). A shared BufferPool is
// thread-safe. The progress callback runs on the calling thread.
//
// Ownership: CopyFile does not take ownership of `options.pool`; it must
// outlive the call. Every buffer taken from it is returned before the call
// returns.
#ifndef BUFPOOL_FILE_COPY_H_
#define BUFPOOL_FILE_COPY_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "bufpool/buffer_pool.h"
#include "bufpool/export.h"

namespace bufpool {

enum class CopyMethod { kAuto, kReadWrite, kDirect, kUring, kKernel };

// "auto", "readwrite", "direct", "uring", "kernel".
BUFPOOL_EXPORT absl::string_view CopyMethodName(CopyMethod method);
// The inverse of CopyMethodName; nullopt for an unknown name.
BUFPOOL_EXPORT std::optional<CopyMethod> ParseCopyMethod(
    absl::string_view name);

struct CopyProgress {
  uint64_t bytes_done = 0;   // data bytes written so far
  uint64_t bytes_total = 0;  // data bytes expected; 0 when unknown (/proc)
  absl::Duration elapsed;
};

struct CopyOptions {
  CopyMethod method = CopyMethod::kAuto;
  // Buffers are drawn from here when set (not owned; must outlive the call);
  // otherwise from a private pool of queue_depth * batch_buffers buffers of
  // buffer_size bytes, created and destroyed by the call.
  BufferPool* pool = nullptr;
  size_t buffer_size = kDefaultBufferSize;  // private pool only
  // Buffers gathered into one system call or io_uring operation; 0: the
  // method's default, 32 (128 KiB per call with 4 KiB buffers, the size dd
  // uses) for readwrite and uring, 256 (1 MiB) with O_DIRECT.
  size_t batch_buffers = 0;
  // Operations in flight at once (kUring, kDirect); 0: the default, 4.
  size_t queue_depth = 0;
  // kUring: open both files with O_DIRECT (falls back to buffered I/O when
  // a file system refuses it).
  bool direct_io = false;
  // fsync the data before the rename and the directory after it. An fsync
  // error is reported and never retried.
  bool fsync = false;
  // Called on the calling thread after each batch is written.
  std::function<void(const CopyProgress&)> progress;
};

struct CopyStats {
  uint64_t bytes_copied = 0;  // data bytes moved (holes excluded)
  uint64_t file_size = 0;     // size of the destination
  CopyMethod method_requested = CopyMethod::kAuto;
  CopyMethod method =
      CopyMethod::kAuto;       // the method that ran, after fallbacks
  bool direct_io = false;      // O_DIRECT was in effect for the data
  bool fixed_buffers = false;  // io_uring used registered (fixed) buffers
  std::vector<std::string> fallbacks;  // one line per fallback taken, why
  std::string destination;             // the path written (dst or dst/name)
  uint64_t buffer_bytes = 0;           // bytes of pool buffers the copy held
  absl::Duration elapsed;
  uint64_t syscalls = 0;     // data-moving system calls (read, write, ...)
  uint64_t submissions = 0;  // io_uring_enter calls (kUring, kDirect)
  uint64_t operations = 0;   // io_uring operations completed
};

// Copies `src` to `dst` as described at the top of this file.
BUFPOOL_EXPORT absl::StatusOr<CopyStats> CopyFile(
    absl::string_view src, absl::string_view dst,
    const CopyOptions& options = {});

}  // namespace bufpool

#endif  // BUFPOOL_FILE_COPY_H_

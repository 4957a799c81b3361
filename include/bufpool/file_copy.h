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
//   kAuto       kKernel for a regular file of nonzero size written to a
//               regular file (copy_file_range keeps the bytes in the kernel;
//               between two file systems, where copy_file_range is refused,
//               it starts with sendfile), kReadWrite for anything else: the
//               fastest here of kernel, readwrite and uring on ext4 and
//               tmpfs, 4 KiB to 512 MiB (docs/benchmarks.md).
//               CopyStats::method says which one ran, method_reason why.
// Every fallback is recorded in CopyStats::fallbacks.
//
// Semantics, the same for every method:
//   * The bytes of `dst` equal those of `src`; holes of a sparse source stay
//     holes (SEEK_DATA/SEEK_HOLE); a file that reports size 0 (/proc/version)
//     is read to end of file.
//   * When `dst` is an existing directory the copy goes to dst/basename(src).
//     Copying a file onto itself (same device and inode, also through a hard
//     or symbolic link) and a directory as source are refused before
//     anything is touched.
//
// Destinations, as cp writes them:
//   * A new file is created with open(..., mode): the source's permission
//     bits without set-user-ID, set-group-ID and sticky, so the umask (or a
//     default ACL) applies; `preserve_mode` keeps all of them.
//   * Replace::kInPlace (the default): an existing destination is opened,
//     truncated and written; its inode, mode, owner, group and other hard
//     links stay, only the bytes change. A failed copy leaves it partly
//     written (as cp does); a file the call created is removed.
//   * Replace::kAtomic: the data goes to a temporary file
//     ".<name>.bufpool-copy.XXXXXX" beside the destination, which gets the
//     existing file's mode, owner and group and is renamed over it only when
//     every byte is written (with `fsync`: synced, then the directory). On
//     error it is removed and the destination is left as it was. Refused
//     with FailedPrecondition, touching nothing, for a destination with other
//     hard links (they would keep the old bytes); when the owner cannot be
//     given to the new file or the directory takes no new names, the error
//     says so: an in-place copy works there. CopyStats::replace says which
//     ran.
//   * A character or block device or a FIFO is written in place, never
//     replaced, whatever `replace` says (with kReadWrite, at the file
//     position). A socket is refused with FailedPrecondition naming it.
//   * A symbolic link at `dst` is followed: its target is written (kAtomic
//     replaces the target; the link stays). A dangling one is refused ("not
//     writing through dangling symlink"), as cp refuses it.
//   * `no_clobber`: anything at `dst` is left alone and AlreadyExistsError
//     returned, also when it appears during the copy (O_EXCL for a new file,
//     RENAME_NOREPLACE or link() for kAtomic).
//   * `preserve_*` (cp -p) apply to the copy after the data: owner and group
//     where permitted, mode, access and modification times.
//   * Memory is bounded by the buffers used (queue_depth * batch_buffers
//     buffers: by default 128 KiB for kReadWrite, 512 KiB for kUring, 4 MiB
//     with O_DIRECT), whatever the file size. kKernel takes none (nor a
//     private pool) unless it falls back to readwrite, then 128 KiB.
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
  // CopyTree only: regular files copied so far (bytes_done then counts the
  // whole tree's bytes and bytes_total stays 0).
  uint64_t files_done = 0;
};

struct CopyOptions {
  CopyMethod method = CopyMethod::kAuto;
  // Buffers are drawn from here when set (not owned; must outlive the call);
  // otherwise from a private pool of queue_depth * batch_buffers buffers of
  // buffer_size bytes, created and destroyed by the call.
  BufferPool* pool = nullptr;
  size_t buffer_size = kDefaultBufferSize;  // private pool only
  // The largest batch_buffers and queue_depth CopyFile accepts.
  static constexpr size_t kMaxBatchBuffers = 4096;
  static constexpr size_t kMaxQueueDepth = 4096;
  // Buffers gathered into one system call or io_uring operation; 0: the
  // method's default, 32 (128 KiB per call with 4 KiB buffers, the size dd
  // uses) for readwrite and uring, 256 (1 MiB) with O_DIRECT.
  size_t batch_buffers = 0;
  // Operations in flight at once (kUring, kDirect); 0: the default, 4.
  size_t queue_depth = 0;
  // kUring: open both files with O_DIRECT (falls back to buffered I/O when
  // a file system refuses it).
  bool direct_io = false;
  // fsync the data (and, after a rename, the directory). An fsync error is
  // reported and never retried.
  bool fsync = false;
  // How an existing regular destination is written (see "Destinations" at
  // the top of this file). Non-regular destinations are always written in
  // place.
  enum class Replace { kInPlace, kAtomic };
  Replace replace = Replace::kInPlace;
  // Never write over anything at the destination: CopyFile returns
  // AlreadyExistsError instead. Race-free: a new file is created with
  // O_EXCL, an atomic copy renamed with RENAME_NOREPLACE (or link()).
  bool no_clobber = false;
  // Give the copy the source's mode including the set-user-ID, set-group-ID
  // and sticky bits (cp -p). Set-user-ID and set-group-ID are dropped when
  // the owner or group could not be kept as well.
  bool preserve_mode = false;
  // Give the copy the source's owner and group where permitted: a refusal
  // (EPERM, as for an unprivileged user) is not an error; the group alone is
  // then tried.
  bool preserve_ownership = false;
  // Give the copy the source's access and modification times.
  bool preserve_timestamps = false;
  // CopyTree: copy small files through io_uring where the kernel has the
  // operations (see CopyTree); false: every file by CopyFile on worker
  // threads.
  bool tree_ring = true;
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
  // Why this method: "auto: kernel: ..." with the facts kAuto chose on, or
  // "<method>: as asked".
  std::string method_reason;
  std::string destination;  // the path written (dst or dst/name)
  // How the destination was written: kAtomic when a temporary file was
  // renamed into place (Replace::kAtomic, also for a new file); kInPlace for
  // Replace::kInPlace and for a non-regular destination whatever was asked.
  CopyOptions::Replace replace = CopyOptions::Replace::kInPlace;
  bool created = false;  // the destination did not exist before
  // Whether the copy was read back and compared with the source. CopyFile
  // never verifies (it is always false there); callers that compare the
  // files afterwards with VerifyCopy (bufpool-copy --verify) set it.
  bool verified = false;
  uint64_t buffer_bytes = 0;  // bytes of pool buffers the copy held
  absl::Duration elapsed;
  uint64_t syscalls = 0;     // data-moving system calls (read, write, ...)
  uint64_t submissions = 0;  // io_uring_enter calls (kUring, kDirect)
  uint64_t operations = 0;   // io_uring operations completed
};

// Copies `src` to `dst` as described at the top of this file.
BUFPOOL_EXPORT absl::StatusOr<CopyStats> CopyFile(
    absl::string_view src, absl::string_view dst,
    const CopyOptions& options = {});

// What a path names, symbolic links followed (as cp treats its operands).
struct PathInfo {
  int error = 0;  // stat's errno when nothing could be stat'ed, else 0
  bool directory = false;
  bool regular = false;
};
BUFPOOL_EXPORT PathInfo InspectPath(absl::string_view path);

// The path CopyFile(src, dst) writes: dst/basename(src) when `dst` is an
// existing directory (symbolic links followed), else `dst`.
BUFPOOL_EXPORT std::string CopyDestination(absl::string_view src,
                                           absl::string_view dst);

// Reads `src` and its copy `dst` back and compares them. A `dst` that is
// not a regular file (a device, a FIFO) cannot be read back as what was
// written to it and is not read: false. True when the bytes are equal;
// DataLoss "verify: <dst>: differs from <src> at byte N" when not (also
// when one is longer); an I/O error reads "verify: <what>: <path>: <the
// system's words>". Thread safety as CopyFile.
BUFPOOL_EXPORT absl::StatusOr<bool> VerifyCopy(absl::string_view src,
                                               absl::string_view dst);

struct TreeStats {
  uint64_t files = 0;        // regular files copied
  uint64_t directories = 0;  // directories created or merged into
  uint64_t symlinks = 0;     // symbolic links recreated
  uint64_t nodes = 0;        // FIFOs and device nodes recreated
  uint64_t bytes_copied = 0;
  std::string destination;  // the root written (dst or dst/name)
  // One line per entry that failed or was skipped, "<what>: <path>: <the
  // system's words>"; the other entries were still copied.
  std::vector<std::string> errors;
  absl::Duration elapsed;
  // Whether small files went through the io_uring tree copy (see CopyTree);
  // when not, why not (e.g. "io_uring: the kernel has no IORING_OP_STATX").
  bool ring = false;
  bool ring_fixed_buffers = false;  // its buffers were registered
  std::string ring_fallback;
};

// Copies the directory `src_dir` and everything below it to `dst` (or to
// dst/basename(src_dir) when `dst` is an existing directory), as cp -R
// does: directories recreated (mode as for new files; an existing one is
// merged into), regular files through CopyFile with `options`, symbolic
// links recreated as links (never followed), FIFOs and device nodes
// recreated (devices need CAP_MKNOD), sockets and other types reported and
// skipped. Hard links become separate files. `preserve_*` apply to every
// entry. A failing entry is reported in TreeStats::errors and the rest
// continue; the Status is an error only when nothing could be copied
// (`src_dir` is no directory, `dst` is inside it, the root cannot be made).
// Regular files of at most one buffer going into directories the call
// creates are copied on the calling thread through one io_uring ring, many
// at once (statx, openat both, read, write, close both as ring operations,
// the destination created with O_EXCL and the mode CopyFile gives it);
// every other file by CopyFile on a few worker threads. All of them draw on
// one pool (options.pool, or a private one for the whole tree), so memory
// is bounded by the pool whatever the tree's size. The ring is not used
// (TreeStats::ring_fallback says why) when io_uring or one of those
// operations is missing, and for kAtomic, O_DIRECT or fsync. `progress`,
// when set, is called on the calling thread at most every 100 ms and at the
// end, with files_done and bytes_done of the whole tree. Directory modes and
// times are set after their contents. Thread safety as CopyFile; every
// worker is joined before the call returns.
BUFPOOL_EXPORT absl::StatusOr<TreeStats> CopyTree(
    absl::string_view src_dir, absl::string_view dst,
    const CopyOptions& options = {});

}  // namespace bufpool

#endif  // BUFPOOL_FILE_COPY_H_

// Private pieces of the copy engine (src/copy): the per-copy context and the
// movers, one per method, that copy a byte range of the source to the same
// range of the destination's temporary file.
//
// Who uses whom, one way only (each file calls only those below it):
//   tree.cc          CopyTree: walks the tree, calls CopyFile per file or
//                    hands small files to TreeRing
//   tree_ring.cc     TreeRing: small files as io_uring operations
//   file_copy.cc     CopyFile: opens, picks a mover, copies, finishes
//   destination.cc   Target: the destination rules
//   kernel_copy.cc   the kernel mover, falling back to the readwrite one
//   uring_copy.cc    the io_uring mover
//   readwrite.cc     the readwrite and sync O_DIRECT movers
//   copy_internal.cc IoError, Preallocate, buffer counts, Context::Advance
#ifndef BUFPOOL_SRC_COPY_COPY_INTERNAL_H_
#define BUFPOOL_SRC_COPY_COPY_INTERNAL_H_

#include <sys/stat.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "bufpool/buffer_pool.h"
#include "bufpool/file_copy.h"

namespace bufpool::copy_internal {

// O_DIRECT offsets and lengths are kept multiples of this.
inline constexpr uint64_t kDirectAlign = 4096;
// Copy(offset, kToEof) copies until the source's end of file.
inline constexpr uint64_t kToEof = ~uint64_t{0};

// Buffers per call or operation for `options` (its batch_buffers, or the
// method's default); and the buffers one copy with `options` uses, which a
// private pool is sized to.
size_t BatchBuffers(const CopyOptions& options, bool direct);
size_t DefaultBufferCount(const CopyOptions& options);

// "<what>: <path>: <strerror(err)>", via os::PosixError.
absl::Status IoError(absl::string_view what, absl::string_view path, int err);

// Everything one CopyFile call shares with its movers. Single-threaded.
struct Context {
  int in_fd = -1;            // source, buffered
  int out_fd = -1;           // temporary file, buffered
  int in_direct_fd = -1;     // source with O_DIRECT, or -1
  int out_direct_fd = -1;    // temporary file with O_DIRECT, or -1
  bool seekable = true;      // the source supports pread
  bool out_seekable = true;  // the destination supports pwrite (regular)
  std::string src_path;      // for messages
  std::string dst_path;      // for messages: the destination, not the temp
  BufferPool* pool = nullptr;
  std::vector<Buffer>* buffers = nullptr;  // every buffer this copy may use
  size_t batch = 1;                        // buffers per call / operation
  size_t queue_depth = 1;
  CopyStats* stats = nullptr;
  const CopyOptions* options = nullptr;
  uint64_t total = 0;           // expected data bytes (0: unknown)
  bool sendfile_first = false;  // the kernel mover skips copy_file_range
  absl::Time start;

  // Takes the buffers into `buffers` when the copy started without them
  // (the kernel mover needs none until it falls back to readwrite); unset
  // when they were taken up front.
  std::function<absl::Status()> take_buffers;

  // Counts `n` more bytes written and reports progress.
  void Advance(uint64_t n);
};

// The last component of `path`, trailing slashes ignored; its directory.
std::string BaseName(absl::string_view path);
std::string DirName(absl::string_view path);

// The file one CopyFile call writes, resolved and opened as cp does (see
// "Destinations" in bufpool/file_copy.h). Owns `fd` and the temporary file
// or new file it created: Abandon() removes what a failed copy leaves.
struct Target {
  std::string path;        // dst, or dst/basename(src): for messages, stats
  std::string write_path;  // the file opened (a symbolic link's target)
  bool exists = false;     // something was at `path` (followed)
  struct stat st {};       // of the existing file, when `exists`
  CopyOptions::Replace replace = CopyOptions::Replace::kInPlace;
  bool regular = true;  // the file written is a regular file
  int fd = -1;
  std::string temp;      // kAtomic: the temporary file, while it exists
  bool created = false;  // kInPlace: this call created the file
  bool done = false;     // FinishTarget succeeded: nothing is removed
  bool sized = false;    // the file already has its final size

  ~Target() { Abandon(); }
  // Closes `fd` and removes the temporary or newly created file, if any.
  void Abandon();
};

// Resolves `dst` for `src` (a directory gets basename(src)), applies the
// refusals (same file, directory, socket, dangling symlink, no_clobber,
// kAtomic's hard links), and opens the file to write: the existing one
// (kInPlace; see TruncateForWriting), a new one created with the source's
// mode under the umask, or a temporary file beside it (kAtomic).
absl::Status OpenTarget(const std::string& src, const struct stat& src_st,
                        absl::string_view dst, const CopyOptions& options,
                        Target& t);

// Empties an existing regular file opened in place (done last before the
// data is written, so that a refusal before it leaves the file as it was).
absl::Status TruncateForWriting(Target& t);

// After the data: sets the size (regular files), owner, mode and times as
// the options and the rules say, fsyncs when asked, closes, and renames a
// temporary file into place (RENAME_NOREPLACE with no_clobber).
absl::Status FinishTarget(const struct stat& src_st, uint64_t size,
                          const CopyOptions& options, Target& t);

// Sets owner, mode and times of an open descriptor (or, with fd < 0, of
// `path` without following a symbolic link) from `src_st` as `options`
// preserve them. EPERM and EINVAL on the owner are not errors (the group
// alone is tried, set-ID bits are then dropped).
absl::Status PreserveAttributes(int fd, const std::string& path,
                                const struct stat& src_st,
                                const CopyOptions& options);

// Copies source bytes [offset, offset + len) to the same offsets of the
// temporary file. Returns the bytes copied: `len`, or fewer when the source
// ended first (then the copy stops there).
class Mover {
 public:
  virtual ~Mover() = default;
  virtual absl::StatusOr<uint64_t> Copy(uint64_t offset, uint64_t len) = 0;
};

// Reserves the blocks of [offset, offset + len) of the temporary file (and
// extends its size over them) before O_DIRECT writes fill them. Writes past
// the end of file make ext4 take its exclusive inode lock, so io_uring hands
// each one to a worker thread; into reserved blocks they run inline, with no
// io-wq workers.
// Errors: ENOSPC and EDQUOT are reported ("allocate space for: <dst>: ...");
// any other refusal (EOPNOTSUPP, ...) just skips the reservation.
absl::Status Preallocate(Context& ctx, int fd, uint64_t offset, uint64_t len);

// preadv/pwritev of `batch` buffers per call (readv when not seekable).
std::unique_ptr<Mover> MakeReadWriteMover(Context& ctx);
// preadv/pwritev on the O_DIRECT descriptors; switches to the buffered ones
// (recorded as a fallback) when the kernel answers EINVAL.
std::unique_ptr<Mover> MakeSyncDirectMover(Context& ctx);
// io_uring on a ring this thread keeps between copies. Only the buffers this
// copy moves data through (up to queue_depth runs of `batch` contiguous
// slots) are registered as fixed buffers, for the length of the copy; the
// pool's region as a whole never is. When registration fails (e.g.
// RLIMIT_MEMLOCK) the copy runs on unregistered buffers, noted in
// stats->fallbacks. Fails with the kernel's -errno in the Status message when
// no ring can be created; the caller then falls back.
absl::StatusOr<std::unique_ptr<Mover>> MakeUringMover(Context& ctx,
                                                      bool direct);
// copy_file_range, then sendfile, then readwrite.
std::unique_ptr<Mover> MakeKernelMover(Context& ctx);

// The io_uring side of CopyTree (tree_ring.cc): regular files of at most
// one buffer, into directories the walk created, copied as ring operations
// on the walking thread, many files in flight at once; and the directories
// and symbolic links the walk makes, where the kernel has those operations.
class TreeRing {
 public:
  // Where each file's outcome goes. Called on the walking thread from
  // inside Add() and Drain().
  class Sink {
   public:
    virtual ~Sink() = default;
    virtual void FileDone(uint64_t bytes) = 0;
    virtual void FileFailed(const absl::Status& status) = 0;
    // Not for the ring (larger than a buffer, sparse, an existing
    // destination, changed meanwhile): copy it with CopyFile.
    virtual void Handoff(std::string src, std::string dst) = 0;
    // No longer a regular file: walk the entry again.
    virtual void Revisit(std::string src, std::string dst) = 0;
    // The outcome of Mkdir (`err` 0 or an errno) and of Symlink.
    virtual void DirectoryMade(std::string src, const struct stat& st,
                               std::string dst, int err) = 0;
    virtual void SymlinkMade(const struct stat& st, const std::string& dst,
                             int err) = 0;
  };

  // A ring through UringSys().uring_create and up to 64 buffers of `pool`
  // (half its capacity at most, so none from a pool of one), held until
  // destruction. An error when no
  // ring can be made, the kernel lacks one of the operations (asked once,
  // IORING_REGISTER_PROBE) or the pool has no free buffer: the caller then
  // copies every file with CopyFile.
  static absl::StatusOr<std::unique_ptr<TreeRing>> Create(
      const CopyOptions& options, BufferPool& pool, Sink& sink);
  // Drains (see Drain), then gives the buffers back.
  virtual ~TreeRing() = default;
  // Copies `src` (a regular file when the walk listed it) to `dst`, a new
  // name; waits for a free slot first when every one is in use.
  virtual void Add(std::string src, std::string dst) = 0;
  // mkdir(dst, mode) (src and its lstat `st` are passed back) and
  // symlink(target, dst) as ring operations: false, with nothing done, when
  // the kernel lacks IORING_OP_MKDIRAT / IORING_OP_SYMLINKAT (5.15) or the
  // ring has failed; the caller then makes them with system calls. True:
  // the outcome comes through the Sink, DirectoryMade or SymlinkMade,
  // exactly once (from a system call if the ring fails before the kernel
  // had the operation).
  virtual bool Mkdir(std::string src, const struct stat& st, std::string dst,
                     mode_t mode) = 0;
  virtual bool Symlink(std::string target, const struct stat& st,
                       std::string dst) = 0;
  // Waits until every file, directory and link added has its outcome.
  virtual void Drain() = 0;
  // Whether the slots' buffers are registered with the ring.
  virtual bool fixed() const = 0;
};

}  // namespace bufpool::copy_internal

#endif  // BUFPOOL_SRC_COPY_COPY_INTERNAL_H_

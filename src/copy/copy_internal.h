// Private pieces of the copy engine (src/copy): the per-copy context and the
// movers, one per method, that copy a byte range of the source to the same
// range of the destination's temporary file.
#ifndef BUFPOOL_SRC_COPY_COPY_INTERNAL_H_
#define BUFPOOL_SRC_COPY_COPY_INTERNAL_H_

#include <cstdint>
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

// "<what>: <path>: <strerror(err)>", via os::PosixError.
absl::Status IoError(absl::string_view what, absl::string_view path, int err);

// Everything one CopyFile call shares with its movers. Single-threaded.
struct Context {
  int in_fd = -1;          // source, buffered
  int out_fd = -1;         // temporary file, buffered
  int in_direct_fd = -1;   // source with O_DIRECT, or -1
  int out_direct_fd = -1;  // temporary file with O_DIRECT, or -1
  bool seekable = true;    // the source supports pread
  std::string src_path;    // for messages
  std::string dst_path;    // for messages: the destination, not the temp
  BufferPool* pool = nullptr;
  std::vector<Buffer>* buffers = nullptr;  // every buffer this copy may use
  size_t batch = 1;                        // buffers per call / operation
  size_t queue_depth = 1;
  CopyStats* stats = nullptr;
  const CopyOptions* options = nullptr;
  uint64_t total = 0;  // expected data bytes (0: unknown)
  absl::Time start;

  // Counts `n` more bytes written and reports progress.
  void Advance(uint64_t n);
};

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
// io_uring with the pool's region registered when possible. Fails with the
// kernel's -errno in the Status message when no ring can be created; the
// caller then falls back.
absl::StatusOr<std::unique_ptr<Mover>> MakeUringMover(Context& ctx,
                                                      bool direct);
// copy_file_range, then sendfile, then readwrite.
std::unique_ptr<Mover> MakeKernelMover(Context& ctx);

}  // namespace bufpool::copy_internal

#endif  // BUFPOOL_SRC_COPY_COPY_INTERNAL_H_

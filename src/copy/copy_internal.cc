// The pieces of copy_internal.h that every mover, the destination rules and
// CopyFile share: error words, progress, preallocation and buffer counts.
// Defined here, below all of them, so that no file of the engine calls up
// into CopyFile's file (see "Who uses whom" in copy_internal.h).
#include "copy/copy_internal.h"

#include <fcntl.h>

#include <cerrno>

#include "absl/strings/str_cat.h"
#include "os/error.h"
#include "os/syscalls.h"

namespace bufpool::copy_internal {

absl::Status IoError(absl::string_view what, absl::string_view path, int err) {
  return os::PosixError(absl::StrCat(what, ": ", path), err);
}

absl::Status Preallocate(Context& ctx, int fd, uint64_t offset, uint64_t len) {
  if (len == 0 || len == kToEof) return absl::OkStatus();
  const uint64_t first = offset & ~(kDirectAlign - 1);
  const uint64_t end = (offset + len + kDirectAlign - 1) & ~(kDirectAlign - 1);
  if (os::Sys().fallocate(fd, 0, static_cast<off_t>(first),
                          static_cast<off_t>(end - first)) == 0) {
    return absl::OkStatus();
  }
  if (errno == ENOSPC || errno == EDQUOT) {
    return IoError("allocate space for", ctx.dst_path, errno);
  }
  return absl::OkStatus();  // an optimisation only: the writes still work
}

size_t BatchBuffers(const CopyOptions& options, bool direct) {
  if (options.batch_buffers != 0) return options.batch_buffers;
  return direct ? 256 : 32;
}

size_t DefaultBufferCount(const CopyOptions& options) {
  const CopyMethod m = options.method;
  const bool direct = m == CopyMethod::kDirect ||
                      (m == CopyMethod::kUring && options.direct_io);
  const bool queued = m == CopyMethod::kUring || m == CopyMethod::kDirect;
  const size_t depth = options.queue_depth != 0 ? options.queue_depth : 4;
  return BatchBuffers(options, direct) * (queued ? depth : 1);
}

void Context::Advance(uint64_t n) {
  stats->bytes_copied += n;
  if (options->progress) {
    options->progress({stats->bytes_copied, total, absl::Now() - start});
  }
}

}  // namespace bufpool::copy_internal

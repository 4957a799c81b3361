// StreamBase: what BufferedWriter and BufferedReader share (see
// bufpool/internal/stream_base.h): taking the first buffers under the
// empty-pool policy, opening or adopting the descriptor, moving, closing.
#include "bufpool/internal/stream_base.h"

#include <fcntl.h>
#include <sys/stat.h>

#include <cerrno>
#include <utility>

#include "absl/strings/str_cat.h"
#include "bufpool/buffered_stream.h"
#include "os/error.h"
#include "os/file.h"
#include "os/syscalls.h"

namespace bufpool::internal {
namespace {

absl::Status CheckOptions(const StreamOptions& options) {
  if (options.buffers < 1 || options.buffers > kMaxStreamBuffers) {
    return absl::InvalidArgumentError(
        absl::StrCat("StreamOptions.buffers must be in [1, ", kMaxStreamBuffers,
                     "], got ", options.buffers));
  }
  if (options.open_timeout < absl::ZeroDuration()) {
    return absl::InvalidArgumentError(
        absl::StrCat("StreamOptions.open_timeout must not be negative, got ",
                     absl::FormatDuration(options.open_timeout)));
  }
  if (options.io_timeout < absl::ZeroDuration()) {
    return absl::InvalidArgumentError(
        absl::StrCat("StreamOptions.io_timeout must not be negative, got ",
                     absl::FormatDuration(options.io_timeout)));
  }
  return absl::OkStatus();
}

// Sockets and everything else that is not a file can block and raise
// SIGPIPE; see "Sockets, pipes and non-blocking descriptors" in the header.
internal::FdKind KindOf(int fd) {
  struct stat st;
  if (os::Sys().fstat(fd, &st) != 0) return internal::FdKind::kFile;
  if (S_ISREG(st.st_mode) || S_ISBLK(st.st_mode))
    return internal::FdKind::kFile;
  if (S_ISSOCK(st.st_mode)) return internal::FdKind::kSocket;
  return internal::FdKind::kOther;
}

int64_t TimeoutMs(absl::Duration d) {
  if (d == absl::InfiniteDuration()) return -1;
  return absl::ToInt64Milliseconds(absl::Ceil(d, absl::Milliseconds(1)));
}

// The empty-pool policy: wait up to open_timeout for the first buffer, take
// the others only if they are free now.
absl::StatusOr<std::vector<Buffer>> TakeBuffers(BufferPool& pool,
                                                const StreamOptions& options,
                                                absl::string_view what,
                                                absl::string_view name) {
  if (absl::Status s = CheckOptions(options); !s.ok()) {
    return absl::Status(s.code(),
                        absl::StrCat(what, "(", name, "): ", s.message()));
  }
  absl::StatusOr<Buffer> first = pool.Acquire(options.open_timeout);
  if (!first.ok()) {
    return absl::ResourceExhaustedError(absl::StrCat(
        what, "(", name, "): no free buffer in the pool (", pool.capacity(),
        " buffers of ", pool.buffer_size(), " bytes, all in use) after ",
        absl::FormatDuration(options.open_timeout)));
  }
  std::vector<Buffer> bufs(options.buffers);
  bufs[0] = *std::move(first);
  const size_t more = pool.TryAcquireBulk(absl::MakeSpan(bufs).subspan(1));
  bufs.resize(1 + more);
  return bufs;
}

std::string FdName(int fd, std::string name) {
  return name.empty() ? absl::StrCat("fd ", fd) : std::move(name);
}

}  // namespace

absl::StatusOr<StreamBase::Parts> StreamBase::OpenPath(
    const std::string& path, int flags, BufferPool& pool,
    const StreamOptions& options, absl::string_view what,
    absl::string_view purpose) {
  // Buffers first: a writer that cannot get one must not truncate the file.
  absl::StatusOr<std::vector<Buffer>> bufs =
      TakeBuffers(pool, options, what, path);
  if (!bufs.ok()) return bufs.status();
  const int fd = os::Sys().open(path.c_str(), flags, 0644);
  if (fd < 0) {
    return os::PosixError(absl::StrCat("open ", path, " for ", purpose), errno);
  }
  return Parts{.pool = &pool,
               .fd = fd,
               .owns_fd = true,
               .name = path,
               .bufs = *std::move(bufs)};
}

absl::StatusOr<StreamBase::Parts> StreamBase::AdoptFd(
    int fd, FdOwnership ownership, BufferPool& pool, std::string name,
    const StreamOptions& options, absl::string_view what) {
  name = FdName(fd, std::move(name));
  if (fd < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, "(", name, "): bad descriptor"));
  }
  const bool owns = ownership == FdOwnership::kTake;
  absl::StatusOr<std::vector<Buffer>> bufs =
      TakeBuffers(pool, options, what, name);
  if (!bufs.ok()) {
    if (owns) (void)os::Close(fd, name);  // documented: kTake closes on failure
    return bufs.status();
  }
  return Parts{.pool = &pool,
               .fd = fd,
               .owns_fd = owns,
               .name = std::move(name),
               .bufs = *std::move(bufs)};
}

StreamBase::StreamBase(Parts parts, const StreamOptions& options)
    : bufs_(std::move(parts.bufs)),
      pool_(parts.pool),
      fd_(parts.fd),
      owns_fd_(parts.owns_fd),
      kind_(KindOf(parts.fd)),
      io_timeout_ms_(TimeoutMs(options.io_timeout)),
      name_(std::move(parts.name)) {}

void StreamBase::MoveBaseFrom(StreamBase& other) noexcept {
  bufs_ = std::move(other.bufs_);
  other.bufs_.clear();
  pool_ = std::exchange(other.pool_, nullptr);
  fd_ = std::exchange(other.fd_, -1);
  owns_fd_ = std::exchange(other.owns_fd_, false);
  closed_ = std::exchange(other.closed_, true);
  kind_ = other.kind_;
  io_timeout_ms_ = other.io_timeout_ms_;
  name_ = std::move(other.name_);
  status_ = std::move(other.status_);
}

void StreamBase::ReleasePooled() {
  if (pool_ != nullptr) pool_->ReleaseBulk(absl::MakeSpan(bufs_));
  bufs_.clear();
}

absl::Status StreamBase::CloseBase() {
  closed_ = true;
  ReleasePooled();
  if (owns_fd_ && fd_ >= 0) {
    absl::Status s = os::Close(fd_, name_);
    if (status_.ok() && !s.ok()) status_ = std::move(s);
  }
  fd_ = -1;
  return status_;
}

}  // namespace bufpool::internal

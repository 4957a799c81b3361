// BufferedWriter / BufferedReader: the slow paths (refill, flush, open,
// close). The fast paths are inline in include/bufpool/buffered_stream.h.
//
// Invariants (writer, while open and not failed):
//   * bufs_ is non-empty; bufs_[0, cur_) are full, bufs_[cur_] holds
//     cursor_ - bufs_[cur_].data() bytes, end_ == bufs_[cur_].data() + size.
//   * flushed_ + BufferedBytes() == bytes appended.
// Invariants (reader, while open and not failed):
//   * bufs_[0, filled_) hold the bytes of the last refill in file order
//     (all full except the last, which holds last_len_); cur_ < filled_ or
//     filled_ == 0, and [cursor_, limit_) is the unread part of bufs_[cur_].
//   * fetched_ - Buffered() == bytes returned to the caller.
#include "bufpool/buffered_stream.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/stat.h>
#include <sys/uio.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <utility>

#include "absl/strings/str_cat.h"
#include "os/error.h"
#include "os/file.h"
#include "os/socket.h"
#include "os/syscalls.h"

namespace bufpool {
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

void ReportToStderr(absl::string_view what, absl::string_view name,
                    const absl::Status& s) {
  std::fprintf(stderr, "bufpool: %.*s %.*s: %s (not reported: call Close())\n",
               static_cast<int>(what.size()), what.data(),
               static_cast<int>(name.size()), name.data(),
               std::string(s.message()).c_str());
}

}  // namespace

// ---- BufferedWriter ---------------------------------------------------------

BufferedWriter::BufferedWriter(BufferPool* pool, int fd, bool owns_fd,
                               std::string name, std::vector<Buffer> bufs,
                               const StreamOptions& options)
    : bufs_(std::move(bufs)),
      pool_(pool),
      fd_(fd),
      owns_fd_(owns_fd),
      kind_(KindOf(fd)),
      io_timeout_ms_(TimeoutMs(options.io_timeout)),
      name_(std::move(name)) {
  cursor_ = bufs_[0].data();
  end_ = cursor_ + bufs_[0].size();
}

absl::StatusOr<BufferedWriter> BufferedWriter::Open(
    const std::string& path, BufferPool& pool, const StreamOptions& options) {
  // Buffers first: a writer that cannot get one must not truncate the file.
  absl::StatusOr<std::vector<Buffer>> bufs =
      TakeBuffers(pool, options, "BufferedWriter::Open", path);
  if (!bufs.ok()) return bufs.status();
  const int fd =
      os::Sys().open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (fd < 0) {
    return os::PosixError(absl::StrCat("open ", path, " for writing"), errno);
  }
  return BufferedWriter(&pool, fd, /*owns_fd=*/true, path, *std::move(bufs),
                        options);
}

absl::StatusOr<BufferedWriter> BufferedWriter::FromFd(
    int fd, FdOwnership ownership, BufferPool& pool, std::string name,
    const StreamOptions& options) {
  name = FdName(fd, std::move(name));
  if (fd < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("BufferedWriter::FromFd(", name, "): bad descriptor"));
  }
  const bool owns = ownership == FdOwnership::kTake;
  absl::StatusOr<std::vector<Buffer>> bufs =
      TakeBuffers(pool, options, "BufferedWriter::FromFd", name);
  if (!bufs.ok()) {
    if (owns) (void)os::Close(fd, name);  // documented: kTake closes on failure
    return bufs.status();
  }
  return BufferedWriter(&pool, fd, owns, std::move(name), *std::move(bufs),
                        options);
}

void BufferedWriter::MoveFrom(BufferedWriter& other) noexcept {
  cursor_ = std::exchange(other.cursor_, nullptr);
  end_ = std::exchange(other.end_, nullptr);
  cur_ = std::exchange(other.cur_, 0);
  bufs_ = std::move(other.bufs_);
  other.bufs_.clear();
  pool_ = std::exchange(other.pool_, nullptr);
  fd_ = std::exchange(other.fd_, -1);
  owns_fd_ = std::exchange(other.owns_fd_, false);
  closed_ = std::exchange(other.closed_, true);
  kind_ = other.kind_;
  io_timeout_ms_ = other.io_timeout_ms_;
  flushed_ = other.flushed_;
  name_ = std::move(other.name_);
  status_ = std::move(other.status_);
}

BufferedWriter::BufferedWriter(BufferedWriter&& other) noexcept {
  MoveFrom(other);
}

BufferedWriter& BufferedWriter::operator=(BufferedWriter&& other) noexcept {
  if (this != &other) {
    CloseForDestructor();
    MoveFrom(other);
  }
  return *this;
}

BufferedWriter::~BufferedWriter() { CloseForDestructor(); }

void BufferedWriter::CloseForDestructor() noexcept {
  if (pool_ == nullptr || closed_) return;  // moved from, or closed already
  if (absl::Status s = Close(); !s.ok()) {
    ReportToStderr("BufferedWriter", name_, s);
  }
}

size_t BufferedWriter::BufferedBytes() const {
  if (bufs_.empty() || cursor_ == nullptr) return 0;
  return cur_ * bufs_[0].size() +
         static_cast<size_t>(cursor_ - bufs_[cur_].data());
}

uint64_t BufferedWriter::position() const { return flushed_ + BufferedBytes(); }

void BufferedWriter::ReleaseBuffers() {
  cursor_ = end_ = nullptr;
  cur_ = 0;
  if (pool_ != nullptr) pool_->ReleaseBulk(absl::MakeSpan(bufs_));
  bufs_.clear();
}

absl::Status BufferedWriter::Fail(absl::Status s) {
  if (status_.ok()) status_ = std::move(s);
  ReleaseBuffers();  // a failed writer gives its memory back at once
  return status_;
}

absl::Status BufferedWriter::WriteBuffered(const std::byte* extra,
                                           size_t extra_len) {
  iovec iov[kMaxStreamBuffers + 1];
  int cnt = 0;
  size_t total = 0;
  for (size_t i = 0; i <= cur_; ++i) {
    const size_t len = i < cur_
                           ? bufs_[i].size()
                           : static_cast<size_t>(cursor_ - bufs_[i].data());
    if (len == 0) continue;
    iov[cnt++] = {bufs_[i].data(), len};
    total += len;
  }
  if (extra_len != 0) {
    iov[cnt++] = {const_cast<std::byte*>(extra), extra_len};
    total += extra_len;
  }
  if (cnt == 0) return absl::OkStatus();
  absl::Status s = kind_ == internal::FdKind::kFile
                       ? os::WriteAll(fd_, iov, cnt, /*offset=*/-1, name_)
                       : WriteAllWaiting(iov, cnt);
  if (!s.ok()) return Fail(std::move(s));
  flushed_ += total;
  cur_ = 0;
  cursor_ = bufs_[0].data();
  end_ = cursor_ + bufs_[0].size();
  return absl::OkStatus();
}

absl::Status BufferedWriter::WriteAllWaiting(iovec* iov, int cnt) {
  int first = 0;
  while (first < cnt) {
    absl::StatusOr<size_t> n =
        kind_ == internal::FdKind::kSocket
            ? os::SendV(fd_, iov + first, cnt - first, name_)
            : os::WriteVNoSigpipe(fd_, iov + first, cnt - first, name_);
    if (!n.ok()) {
      if (n.status().code() != absl::StatusCode::kUnavailable) {
        return n.status();
      }
      absl::StatusOr<bool> ready =
          os::WaitReady(fd_, POLLOUT, io_timeout_ms_, name_);
      if (!ready.ok()) return ready.status();
      if (!*ready) {
        size_t left = 0;
        for (int i = first; i < cnt; ++i) left += iov[i].iov_len;
        return absl::DeadlineExceededError(absl::StrCat(
            "write: ", name_, ": not writable for ", io_timeout_ms_,
            "ms (StreamOptions.io_timeout; the peer stopped reading); ", left,
            " bytes not written"));
      }
      continue;
    }
    if (*n == 0) return os::PosixError(absl::StrCat("write: ", name_), EIO);
    for (size_t k = *n; k != 0;) {  // skip what was written
      if (k >= iov[first].iov_len) {
        k -= iov[first++].iov_len;
      } else {
        iov[first].iov_base = static_cast<char*>(iov[first].iov_base) + k;
        iov[first].iov_len -= k;
        k = 0;
      }
    }
  }
  return absl::OkStatus();
}

absl::Status BufferedWriter::AppendSlow(const std::byte* p, size_t n) {
  if (!status_.ok()) return status_;
  if (closed_ || pool_ == nullptr) {
    return absl::FailedPreconditionError(
        absl::StrCat("append to closed BufferedWriter ", name_));
  }
  const size_t buffer_size = bufs_[0].size();
  // Larger than a buffer: hand it to the kernel behind the buffered bytes,
  // in the same writev, without copying it.
  if (n > buffer_size) return WriteBuffered(p, n);
  while (n > 0) {
    if (cursor_ == end_) {
      if (cur_ + 1 < bufs_.size()) {
        ++cur_;
        cursor_ = bufs_[cur_].data();
        end_ = cursor_ + buffer_size;
      } else if (absl::Status s = WriteBuffered(nullptr, 0); !s.ok()) {
        return s;
      }
    }
    const size_t k = std::min(n, static_cast<size_t>(end_ - cursor_));
    std::memcpy(cursor_, p, k);
    cursor_ += k;
    p += k;
    n -= k;
  }
  return absl::OkStatus();
}

absl::Status BufferedWriter::Flush() {
  if (!status_.ok()) return status_;
  if (closed_ || pool_ == nullptr) {
    return absl::FailedPreconditionError(
        absl::StrCat("flush of closed BufferedWriter ", name_));
  }
  return WriteBuffered(nullptr, 0);
}

absl::Status BufferedWriter::Sync() {
  if (absl::Status s = Flush(); !s.ok()) return s;
  if (os::Sys().fsync(fd_) != 0) {
    return Fail(os::PosixError(absl::StrCat("fsync ", name_), errno));
  }
  return absl::OkStatus();
}

absl::Status BufferedWriter::Close() {
  if (closed_ || pool_ == nullptr) return status_;
  if (status_.ok())
    (void)WriteBuffered(nullptr, 0);  // a failure lands in status_
  closed_ = true;
  ReleaseBuffers();
  if (owns_fd_ && fd_ >= 0) {
    absl::Status s = os::Close(fd_, name_);
    if (status_.ok() && !s.ok()) status_ = std::move(s);
  }
  fd_ = -1;
  return status_;
}

// ---- BufferedReader ---------------------------------------------------------

BufferedReader::BufferedReader(BufferPool* pool, int fd, bool owns_fd,
                               std::string name, std::vector<Buffer> bufs,
                               const StreamOptions& options)
    : bufs_(std::move(bufs)),
      pool_(pool),
      fd_(fd),
      owns_fd_(owns_fd),
      kind_(KindOf(fd)),
      io_timeout_ms_(TimeoutMs(options.io_timeout)),
      name_(std::move(name)) {
  // Nothing buffered yet: cursor_ == limit_ (non-null), so reads refill.
  cursor_ = limit_ = bufs_[0].data();
}

absl::StatusOr<BufferedReader> BufferedReader::Open(
    const std::string& path, BufferPool& pool, const StreamOptions& options) {
  absl::StatusOr<std::vector<Buffer>> bufs =
      TakeBuffers(pool, options, "BufferedReader::Open", path);
  if (!bufs.ok()) return bufs.status();
  const int fd = os::Sys().open(path.c_str(), O_RDONLY, 0);
  if (fd < 0) {
    return os::PosixError(absl::StrCat("open ", path, " for reading"), errno);
  }
  return BufferedReader(&pool, fd, /*owns_fd=*/true, path, *std::move(bufs),
                        options);
}

absl::StatusOr<BufferedReader> BufferedReader::FromFd(
    int fd, FdOwnership ownership, BufferPool& pool, std::string name,
    const StreamOptions& options) {
  name = FdName(fd, std::move(name));
  if (fd < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("BufferedReader::FromFd(", name, "): bad descriptor"));
  }
  const bool owns = ownership == FdOwnership::kTake;
  absl::StatusOr<std::vector<Buffer>> bufs =
      TakeBuffers(pool, options, "BufferedReader::FromFd", name);
  if (!bufs.ok()) {
    if (owns) (void)os::Close(fd, name);
    return bufs.status();
  }
  return BufferedReader(&pool, fd, owns, std::move(name), *std::move(bufs),
                        options);
}

void BufferedReader::MoveFrom(BufferedReader& other) noexcept {
  cursor_ = std::exchange(other.cursor_, nullptr);
  limit_ = std::exchange(other.limit_, nullptr);
  cur_ = std::exchange(other.cur_, 0);
  filled_ = std::exchange(other.filled_, 0);
  last_len_ = std::exchange(other.last_len_, 0);
  bufs_ = std::move(other.bufs_);
  other.bufs_.clear();
  pool_ = std::exchange(other.pool_, nullptr);
  fd_ = std::exchange(other.fd_, -1);
  owns_fd_ = std::exchange(other.owns_fd_, false);
  closed_ = std::exchange(other.closed_, true);
  kind_ = other.kind_;
  io_timeout_ms_ = other.io_timeout_ms_;
  fetched_ = other.fetched_;
  name_ = std::move(other.name_);
  status_ = std::move(other.status_);
}

BufferedReader::BufferedReader(BufferedReader&& other) noexcept {
  MoveFrom(other);
}

BufferedReader& BufferedReader::operator=(BufferedReader&& other) noexcept {
  if (this != &other) {
    CloseForDestructor();
    MoveFrom(other);
  }
  return *this;
}

BufferedReader::~BufferedReader() { CloseForDestructor(); }

void BufferedReader::CloseForDestructor() noexcept {
  if (pool_ == nullptr || closed_) return;
  // A read error was already returned by the read that hit it; only a
  // failure of close(2) itself would otherwise go unseen.
  const bool had_error = !status_.ok();
  if (absl::Status s = Close(); !s.ok() && !had_error) {
    ReportToStderr("BufferedReader", name_, s);
  }
}

size_t BufferedReader::Buffered() const {
  if (cursor_ == nullptr || filled_ == 0) return 0;
  size_t n = static_cast<size_t>(limit_ - cursor_);
  for (size_t i = cur_ + 1; i < filled_; ++i) n += LengthOf(i);
  return n;
}

uint64_t BufferedReader::position() const { return fetched_ - Buffered(); }

void BufferedReader::ReleaseBuffers() {
  cursor_ = limit_ = nullptr;
  cur_ = filled_ = last_len_ = 0;
  if (pool_ != nullptr) pool_->ReleaseBulk(absl::MakeSpan(bufs_));
  bufs_.clear();
}

size_t BufferedReader::CopyBuffered(std::byte* out, size_t n) {
  size_t done = 0;
  while (done < n && filled_ != 0) {
    if (cursor_ == limit_) {
#ifdef BUFPOOL_FUZZ_PLANT
      // Planted defect for test/fuzz/reader_fuzz: a missing bounds check
      // steps past the last filled buffer.
      if (cur_ + 1 > filled_) break;
#else
      if (cur_ + 1 >= filled_) break;
#endif
      ++cur_;
      cursor_ = bufs_[cur_].data();
      limit_ = cursor_ + LengthOf(cur_);
      continue;
    }
    const size_t k = std::min(n - done, static_cast<size_t>(limit_ - cursor_));
    std::memcpy(out + done, cursor_, k);
    cursor_ += k;
    done += k;
  }
  return done;
}

absl::Status BufferedReader::Refill() {
  iovec iov[kMaxStreamBuffers];
  for (size_t i = 0; i < bufs_.size(); ++i) {
    iov[i] = {bufs_[i].data(), bufs_[i].size()};
  }
  absl::StatusOr<size_t> got = ReadOnce(iov, static_cast<int>(bufs_.size()));
  if (!got.ok()) return got.status();
  const size_t n = *got;
  const size_t buffer_size = bufs_[0].size();
  fetched_ += n;
  cur_ = 0;
  filled_ = n == 0 ? 0 : (n + buffer_size - 1) / buffer_size;
  last_len_ = n == 0 ? 0 : n - (filled_ - 1) * buffer_size;
  cursor_ = bufs_[0].data();
  limit_ = cursor_ + LengthOf(0);
  return absl::OkStatus();
}

absl::StatusOr<size_t> BufferedReader::ReadOnce(const iovec* iov, int cnt) {
  for (;;) {
    // One iovec is a read straight into the caller's memory: read(2).
    const ssize_t got =
        cnt == 1 ? os::Sys().read(fd_, iov[0].iov_base, iov[0].iov_len)
                 : os::Sys().readv(fd_, iov, cnt);
    if (got >= 0) return static_cast<size_t>(got);
    const int err = errno;
    if (err == EINTR) continue;
    if (kind_ != internal::FdKind::kFile &&
        (err == EAGAIN || err == EWOULDBLOCK)) {
      absl::StatusOr<bool> ready =
          os::WaitReady(fd_, POLLIN, io_timeout_ms_, name_);
      if (ready.ok() && *ready) continue;
      if (ready.ok()) {
        return absl::DeadlineExceededError(absl::StrCat(
            "read: ", name_, ": no data for ", io_timeout_ms_,
            "ms (StreamOptions.io_timeout); nothing was lost, read again"));
      }
      status_ = ready.status();
    } else {
      const std::string what = absl::StrCat("read: ", name_);
      status_ = kind_ == internal::FdKind::kFile ? os::PosixError(what, err)
                                                 : os::SocketError(what, err);
    }
    ReleaseBuffers();
    return status_;
  }
}

absl::Status BufferedReader::Readable() const {
  if (!status_.ok()) return status_;
  if (closed_ || pool_ == nullptr) {
    return absl::FailedPreconditionError(
        absl::StrCat("read from closed BufferedReader ", name_));
  }
  return absl::OkStatus();
}

absl::StatusOr<size_t> BufferedReader::ReadSlow(std::byte* out, size_t n) {
  if (absl::Status s = Readable(); !s.ok()) return s;
  if (n == 0) return 0;
  size_t done = CopyBuffered(out, n);
  if (done == n) return n;
  // The buffers are empty now. One system call for the rest: straight into
  // `out` when it would fill all our buffers anyway, otherwise a refill.
  const size_t capacity = bufs_.size() * bufs_[0].size();
  // A timeout loses nothing: the bytes copied so far are returned.
  if (n - done >= capacity) {
    const iovec direct = {out + done, n - done};
    absl::StatusOr<size_t> got = ReadOnce(&direct, 1);
    if (!got.ok()) {
      if (done != 0 && status_.ok()) return done;
      return got.status();
    }
    fetched_ += *got;
    return done + *got;
  }
  if (absl::Status s = Refill(); !s.ok()) {
    if (done != 0 && status_.ok()) return done;
    return s;
  }
  return done + CopyBuffered(out + done, n - done);
}

absl::Status BufferedReader::ReadExactSlow(absl::Span<std::byte> out) {
  // As Read(): a failed or closed reader says so, even for no bytes.
  if (absl::Status s = Readable(); !s.ok()) return s;
  const uint64_t start = position();
  size_t done = 0;
  while (done < out.size()) {
    absl::StatusOr<size_t> got = Read(out.subspan(done));
    if (!got.ok()) {
      if (done != 0 && status_.ok()) {  // a timeout part-way: the record's
        status_ = absl::DeadlineExceededError(absl::StrCat(  // start is gone
            name_, ": timed out part-way through a read: got ", done, " of ",
            out.size(), " bytes at offset ", start, " (",
            got.status().message(), ")"));
        ReleaseBuffers();
        return status_;
      }
      return got.status();
    }
    if (*got == 0) {
      if (done == 0) {
        return absl::OutOfRangeError(
            absl::StrCat("end of file ", name_, " at offset ", start));
      }
      return absl::DataLossError(absl::StrCat(
          name_, " ends part-way through a read: got ", done, " of ",
          out.size(), " bytes at offset ", start, " (truncated file?)"));
    }
    done += *got;
  }
  return absl::OkStatus();
}

absl::Status BufferedReader::Close() {
  if (closed_ || pool_ == nullptr) return status_;
  closed_ = true;
  ReleaseBuffers();
  if (owns_fd_ && fd_ >= 0) {
    absl::Status s = os::Close(fd_, name_);
    if (status_.ok() && !s.ok()) status_ = std::move(s);
  }
  fd_ = -1;
  return status_;
}

}  // namespace bufpool

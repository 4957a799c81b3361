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

void ReportToStderr(absl::string_view what, absl::string_view name,
                    const absl::Status& s) {
  std::fprintf(stderr, "bufpool: %.*s %.*s: %s (not reported: call Close())\n",
               static_cast<int>(what.size()), what.data(),
               static_cast<int>(name.size()), name.data(),
               std::string(s.message()).c_str());
}

}  // namespace

// ---- BufferedWriter ---------------------------------------------------------

BufferedWriter::BufferedWriter(Parts parts, const StreamOptions& options)
    : StreamBase(std::move(parts), options) {
  cursor_ = bufs_[0].data();
  end_ = cursor_ + bufs_[0].size();
}

absl::StatusOr<BufferedWriter> BufferedWriter::Open(
    const std::string& path, BufferPool& pool, const StreamOptions& options) {
  absl::StatusOr<Parts> parts =
      OpenPath(path, O_WRONLY | O_CREAT | O_TRUNC, pool, options,
               "BufferedWriter::Open", "writing");
  if (!parts.ok()) return parts.status();
  return BufferedWriter(*std::move(parts), options);
}

absl::StatusOr<BufferedWriter> BufferedWriter::FromFd(
    int fd, FdOwnership ownership, BufferPool& pool, std::string name,
    const StreamOptions& options) {
  absl::StatusOr<Parts> parts = AdoptFd(fd, ownership, pool, std::move(name),
                                        options, "BufferedWriter::FromFd");
  if (!parts.ok()) return parts.status();
  return BufferedWriter(*std::move(parts), options);
}

void BufferedWriter::MoveFrom(BufferedWriter& other) noexcept {
  cursor_ = std::exchange(other.cursor_, nullptr);
  end_ = std::exchange(other.end_, nullptr);
  cur_ = std::exchange(other.cur_, 0);
  flushed_ = other.flushed_;
  MoveBaseFrom(other);
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
  if (!open()) return;  // moved from, or closed already
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
  ReleasePooled();
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
  if (!open()) {
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
  if (!open()) {
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
  if (!open()) return status_;
  if (status_.ok()) {
    (void)WriteBuffered(nullptr, 0);  // a failure lands in status_
  }
  cursor_ = end_ = nullptr;
  cur_ = 0;
  return CloseBase();
}

// ---- BufferedReader ---------------------------------------------------------

BufferedReader::BufferedReader(Parts parts, const StreamOptions& options)
    : StreamBase(std::move(parts), options) {
  // Nothing buffered yet: cursor_ == limit_ (non-null), so reads refill.
  cursor_ = limit_ = bufs_[0].data();
}

absl::StatusOr<BufferedReader> BufferedReader::Open(
    const std::string& path, BufferPool& pool, const StreamOptions& options) {
  absl::StatusOr<Parts> parts = OpenPath(path, O_RDONLY, pool, options,
                                         "BufferedReader::Open", "reading");
  if (!parts.ok()) return parts.status();
  return BufferedReader(*std::move(parts), options);
}

absl::StatusOr<BufferedReader> BufferedReader::FromFd(
    int fd, FdOwnership ownership, BufferPool& pool, std::string name,
    const StreamOptions& options) {
  absl::StatusOr<Parts> parts = AdoptFd(fd, ownership, pool, std::move(name),
                                        options, "BufferedReader::FromFd");
  if (!parts.ok()) return parts.status();
  return BufferedReader(*std::move(parts), options);
}

void BufferedReader::MoveFrom(BufferedReader& other) noexcept {
  cursor_ = std::exchange(other.cursor_, nullptr);
  limit_ = std::exchange(other.limit_, nullptr);
  cur_ = std::exchange(other.cur_, 0);
  filled_ = std::exchange(other.filled_, 0);
  last_len_ = std::exchange(other.last_len_, 0);
  fetched_ = other.fetched_;
  MoveBaseFrom(other);
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
  if (!open()) return;
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
  ReleasePooled();
}

size_t BufferedReader::CopyBuffered(std::byte* out, size_t n) {
  size_t done = 0;
  while (done < n && filled_ != 0) {
    if (cursor_ == limit_) {
      if (cur_ + 1 >= filled_) break;
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
  if (!open()) {
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
  if (!open()) return status_;
  cursor_ = limit_ = nullptr;
  cur_ = filled_ = last_len_ = 0;
  return CloseBase();
}

}  // namespace bufpool

// The synchronous movers: buffered preadv/pwritev and the O_DIRECT loop.
#include <fcntl.h>
#include <limits.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <vector>

#include "copy/copy_internal.h"
#include "os/file.h"

namespace bufpool::copy_internal {
namespace {

// Drops the first `done` bytes of iov[0, n); returns the new count.
int Skip(iovec* iov, int n, size_t done) {
  int i = 0;
  while (i < n && done >= iov[i].iov_len) done -= iov[i++].iov_len;
  if (i < n) {
    iov[i].iov_base = static_cast<char*>(iov[i].iov_base) + done;
    iov[i].iov_len -= done;
  }
  std::copy(iov + i, iov + n, iov);
  return n - i;
}

size_t Total(const iovec* iov, int n) {
  size_t t = 0;
  for (int i = 0; i < n; ++i) t += iov[i].iov_len;
  return t;
}

// Fills `iov` with up to `want` bytes of buffers; returns the count.
// Adjacent slots become one iovec: the kernel copies a long segment into
// the page cache much faster than many 4 KiB ones (perf showed
// copy_folio_from_iter_atomic at 78% of a 64 x 4 KiB pwritev copy).
int Gather(std::vector<Buffer>& buffers, size_t first, size_t count,
           uint64_t want, std::vector<iovec>& iov) {
  iov.clear();
  for (size_t i = first; i < first + count && want > 0; ++i) {
    const size_t n = std::min<uint64_t>(buffers[i].size(), want);
    std::byte* p = buffers[i].data();
    if (!iov.empty() &&
        static_cast<std::byte*>(iov.back().iov_base) + iov.back().iov_len ==
            p) {
      iov.back().iov_len += n;
    } else {
      iov.push_back({p, n});
    }
    want -= n;
  }
  return static_cast<int>(iov.size());
}

void SortBySlot(std::vector<Buffer>& buffers) {
  std::sort(
      buffers.begin(), buffers.end(),
      [](const Buffer& a, const Buffer& b) { return a.index() < b.index(); });
}

class ReadWriteMover final : public Mover {
 public:
  explicit ReadWriteMover(Context& ctx) : ctx_(ctx) {
    SortBySlot(*ctx.buffers);
  }

  absl::StatusOr<uint64_t> Copy(uint64_t offset, uint64_t len) override {
    const size_t count = std::min(ctx_.batch, ctx_.buffers->size());
    const uint64_t batch_bytes = count * ctx_.pool->buffer_size();
    uint64_t pos = offset;
    const uint64_t end = len == kToEof ? kToEof : offset + len;
    while (pos < end) {
      const uint64_t want = std::min(batch_bytes, end - pos);
      const int cnt = Gather(*ctx_.buffers, 0, count, want, iov_);
      absl::StatusOr<size_t> n =
          ReadFull(ctx_, ctx_.in_fd, iov_.data(), cnt,
                   ctx_.seekable ? static_cast<int64_t>(pos) : -1, false);
      if (!n.ok()) return n.status();
      if (*n == 0) break;
      const int wcnt = Gather(*ctx_.buffers, 0, count, *n, iov_);
      if (absl::Status s = WriteFull(ctx_, ctx_.out_fd, iov_.data(), wcnt,
                                     static_cast<int64_t>(pos));
          !s.ok()) {
        return s;
      }
      pos += *n;
      ctx_.Advance(*n);
      if (*n < want) break;  // end of file
    }
    return pos - offset;
  }

 private:
  Context& ctx_;
  std::vector<iovec> iov_;
};

class SyncDirectMover final : public Mover {
 public:
  explicit SyncDirectMover(Context& ctx) : ctx_(ctx) {
    SortBySlot(*ctx.buffers);
  }

  absl::StatusOr<uint64_t> Copy(uint64_t offset, uint64_t len) override {
    const size_t count = std::min(ctx_.batch, ctx_.buffers->size());
    const uint64_t batch_bytes = count * ctx_.pool->buffer_size();
    // O_DIRECT needs aligned offsets and lengths: widen the range to whole
    // blocks. The extra bytes are the source's own (or zeros past its end,
    // cut off by the final ftruncate), so the copy stays exact.
    const uint64_t first = offset & ~(kDirectAlign - 1);
    const uint64_t end = offset + len;
    uint64_t pos = first;
    uint64_t valid_end = end;  // where the source ended, if before `end`
    if (!buffered_) {
      if (absl::Status s = Preallocate(ctx_, ctx_.out_direct_fd, offset, len);
          !s.ok()) {
        return s;
      }
    }
    while (pos < end) {
      const uint64_t want = std::min(batch_bytes, end - pos);
      const uint64_t want_aligned = std::min(
          batch_bytes, (want + kDirectAlign - 1) & ~(kDirectAlign - 1));
      const int cnt = Gather(*ctx_.buffers, 0, count, want_aligned, iov_);
      const bool direct = !buffered_;
      absl::StatusOr<size_t> n =
          ReadFull(ctx_, direct ? ctx_.in_direct_fd : ctx_.in_fd, iov_.data(),
                   cnt, static_cast<int64_t>(pos), direct);
      if (!n.ok()) {
        if (direct && absl::IsInvalidArgument(n.status())) {
          SwitchToBuffered(n.status());
          continue;
        }
        return n.status();
      }
      if (*n == 0) {
        valid_end = std::min(valid_end, pos);
        break;
      }
      size_t to_write = *n;
      if (direct && to_write % kDirectAlign != 0) {
        // Source ended inside this block: write whole blocks, zero-filled.
        const size_t padded =
            (to_write + kDirectAlign - 1) & ~(kDirectAlign - 1);
        ZeroFrom(to_write, padded);
        to_write = padded;
      }
      const int wcnt = Gather(*ctx_.buffers, 0, count, to_write, iov_);
      absl::Status s =
          WriteFull(ctx_, direct ? ctx_.out_direct_fd : ctx_.out_fd,
                    iov_.data(), wcnt, static_cast<int64_t>(pos));
      if (!s.ok()) {
        if (direct && absl::IsInvalidArgument(s)) {
          SwitchToBuffered(s);
          continue;  // rewrite this block buffered (re-read is harmless)
        }
        return s;
      }
      const uint64_t got_end = pos + *n;
      ctx_.Advance(std::min(got_end, end) - std::max(pos, offset));
      pos += *n;
      if (*n < want_aligned && *n < want) {
        valid_end = std::min(valid_end, got_end);
        break;
      }
    }
    return std::max(valid_end, offset) - offset;
  }

 private:
  void SwitchToBuffered(const absl::Status& why) {
    buffered_ = true;
    ctx_.stats->direct_io = false;
    ctx_.stats->fallbacks.push_back(std::string("O_DIRECT transfer refused (") +
                                    std::string(why.message()) +
                                    "): continuing with buffered I/O");
  }

  void ZeroFrom(size_t from, size_t to) {
    const size_t bs = ctx_.pool->buffer_size();
    for (size_t i = from; i < to;) {
      const size_t b = i / bs, o = i % bs;
      const size_t n = std::min(bs - o, to - i);
      std::memset((*ctx_.buffers)[b].data() + o, 0, n);
      i += n;
    }
  }

  Context& ctx_;
  bool buffered_ = false;
  std::vector<iovec> iov_;
};

}  // namespace

absl::StatusOr<size_t> ReadFull(Context& ctx, int fd, const iovec* iov_in,
                                int iovcnt, int64_t offset, bool direct) {
  std::vector<iovec> iov(iov_in, iov_in + iovcnt);
  const size_t total = Total(iov_in, iovcnt);
  size_t done = 0;
  int n = iovcnt;
  while (done < total) {
    const int cnt = std::min(n, IOV_MAX);
    ++ctx.stats->syscalls;
    const ssize_t r = offset < 0
                          ? os::Sys().readv(fd, iov.data(), cnt)
                          : os::Sys().preadv(fd, iov.data(), cnt,
                                             offset + static_cast<off_t>(done));
    if (r < 0) {
      if (errno == EINTR) continue;
      return IoError("read", ctx.src_path, errno);
    }
    if (r == 0) break;
    done += static_cast<size_t>(r);
    // An O_DIRECT read that stops inside a block has reached end of file;
    // reading on from an unaligned offset would fail with EINVAL.
    if (direct && done % kDirectAlign != 0) break;
    n = Skip(iov.data(), n, static_cast<size_t>(r));
  }
  return done;
}

absl::Status WriteFull(Context& ctx, int fd, const iovec* iov_in, int iovcnt,
                       int64_t offset) {
  std::vector<iovec> iov(iov_in, iov_in + iovcnt);
  const size_t total = Total(iov_in, iovcnt);
  size_t done = 0;
  int n = iovcnt;
  while (done < total) {
    const int cnt = std::min(n, IOV_MAX);
    ++ctx.stats->syscalls;
    const ssize_t r = os::Sys().pwritev(fd, iov.data(), cnt,
                                        offset + static_cast<off_t>(done));
    if (r < 0) {
      if (errno == EINTR) continue;
      return IoError("write", ctx.dst_path, errno);
    }
    if (r == 0) return IoError("write", ctx.dst_path, EIO);  // no progress
    done += static_cast<size_t>(r);
    n = Skip(iov.data(), n, static_cast<size_t>(r));
  }
  return absl::OkStatus();
}

std::unique_ptr<Mover> MakeReadWriteMover(Context& ctx) {
  return std::make_unique<ReadWriteMover>(ctx);
}

std::unique_ptr<Mover> MakeSyncDirectMover(Context& ctx) {
  return std::make_unique<SyncDirectMover>(ctx);
}

}  // namespace bufpool::copy_internal

// The synchronous movers: buffered preadv/pwritev and the O_DIRECT loop.
#include <algorithm>
#include <cstring>
#include <vector>

#include "copy/copy_internal.h"
#include "os/file.h"

namespace bufpool::copy_internal {
namespace {

// Fills `iov` with up to `want` bytes of buffers; returns the count.
// Adjacent slots become one iovec: the kernel copies a long segment into
// the page cache much faster than many 4 KiB ones (with 4 KiB segments perf
// shows copy_folio_from_iter_atomic dominating a pwritev copy).
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
      [](const Buffer& a, const Buffer& b) { return a.slot() < b.slot(); });
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
          os::ReadFull(ctx_.in_fd, iov_.data(), cnt,
                       ctx_.seekable ? static_cast<off_t>(pos) : -1,
                       ctx_.src_path, {.calls = &ctx_.stats->syscalls});
      if (!n.ok()) return n.status();
      if (*n == 0) break;
      const int wcnt = Gather(*ctx_.buffers, 0, count, *n, iov_);
      if (absl::Status s =
              os::WriteAll(ctx_.out_fd, iov_.data(), wcnt,
                           ctx_.out_seekable ? static_cast<off_t>(pos) : -1,
                           ctx_.dst_path, {.calls = &ctx_.stats->syscalls});
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
          os::ReadFull(direct ? ctx_.in_direct_fd : ctx_.in_fd, iov_.data(),
                       cnt, static_cast<off_t>(pos), ctx_.src_path,
                       {.calls = &ctx_.stats->syscalls,
                        .stop_unaligned = direct ? kDirectAlign : 0});
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
          os::WriteAll(direct ? ctx_.out_direct_fd : ctx_.out_fd, iov_.data(),
                       wcnt, static_cast<off_t>(pos), ctx_.dst_path,
                       {.calls = &ctx_.stats->syscalls});
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

std::unique_ptr<Mover> MakeReadWriteMover(Context& ctx) {
  return std::make_unique<ReadWriteMover>(ctx);
}

std::unique_ptr<Mover> MakeSyncDirectMover(Context& ctx) {
  return std::make_unique<SyncDirectMover>(ctx);
}

}  // namespace bufpool::copy_internal

// The io_uring mover: the pool's buffers are grouped into chunks of
// contiguous slots, each chunk cycles read -> write -> idle with up to
// queue_depth chunks in flight, so reads of later chunks overlap writes of
// earlier ones. The chunks are registered as fixed buffers (chunk i is
// registered buffer i), so operations are READ_FIXED / WRITE_FIXED (no page
// pinning per operation).
//
//   chunk: idle --read--> reading --(full or EOF)--> writing --> idle
//          short completion: requeue the rest; -EAGAIN/-EINTR: requeue as is
//
// Rings and registration. Each thread keeps one ring between copies (made
// through the OS seam; setting a ring up is costlier than a small copy),
// and each copy registers only the chunks it moves data through, then
// unregisters them when it ends. What is pinned is therefore the copy's own
// bounded memory (queue_depth * batch buffers, 512 KiB by default, cheap to
// register), never the caller's whole pool: registering a large shared pool
// costs in proportion to its size on every call, and a registration kept
// past the call could neither tell when the caller destroys that pool (it
// would keep the dead pool's pages pinned, and a new pool mapped at the same
// address would read into the old pages) nor be shared with another pool on
// the same thread. Whole-region registration for rings whose lifetime the
// caller controls is bufpool::FixedBuffers in the toolkit.
#include <algorithm>
#include <cerrno>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "bufpool/uring.h"
#include "copy/copy_internal.h"
#include "os/file.h"
#include "os/syscalls.h"
#include "os/uring.h"

namespace bufpool::copy_internal {
namespace {

// The kernel's limit on one registered buffer, defined once beside the
// public registration API.
constexpr size_t kMaxRegisteredBytes = FixedBuffers::kMaxRegisteredBytes;

// This thread's idle ring, kept between copies (see the file comment). Only
// rings from the real OS table are kept: a ring made through a test's seam
// is that test's.
struct CachedRing {
  std::unique_ptr<os::Uring> ring;
  unsigned entries = 0;
};
thread_local CachedRing t_cached_ring;

bool RingsAreCacheable() {
  return os::UringSys().uring_create == os::RealUringSyscalls().uring_create;
}

class UringMover final : public Mover {
 public:
  UringMover(Context& ctx, std::unique_ptr<os::Uring> ring, unsigned entries,
             bool direct)
      : ctx_(ctx), ring_(std::move(ring)), entries_(entries), direct_(direct) {}

  // Gives the ring back to this thread when it is clean: nothing in flight,
  // the chunks unregistered, from the real OS table, and no other ring kept
  // meanwhile (a copy started from a progress callback).
  ~UringMover() override {
    if (fixed_ && ring_->UnregisterBuffers() < 0) broken_ = true;
    if (!broken_ && RingsAreCacheable() && t_cached_ring.ring == nullptr) {
      t_cached_ring.ring = std::move(ring_);
      t_cached_ring.entries = entries_;
    }
  }

  void Init() {
    // Group the buffers (sorted by slot) into runs of <= batch contiguous
    // slots: one operation moves one run.
    std::vector<Buffer>& bufs = *ctx_.buffers;
    std::sort(bufs.begin(), bufs.end(), [](const Buffer& a, const Buffer& b) {
      return a.slot() < b.slot();
    });
    const size_t bs = ctx_.pool->buffer_size();
    for (size_t i = 0; i < bufs.size();) {
      size_t j = i + 1;
      while (j < bufs.size() && j - i < ctx_.batch &&
             bufs[j].slot() == bufs[j - 1].slot() + 1) {
        ++j;
      }
      // An operation's length is 32 bits: keep runs to 1 GiB.
      chunks_.push_back(
          {bufs[i].data(), std::min((j - i) * bs, kMaxRegisteredBytes)});
      i = j;
    }
    // Keep at most queue_depth chunks: that is the depth asked for.
    if (chunks_.size() > ctx_.queue_depth) chunks_.resize(ctx_.queue_depth);

    // Chunk i is registered buffer i: only what this copy uses is pinned.
    std::vector<iovec> iov;
    for (const Chunk& c : chunks_) iov.push_back({c.data, c.cap});
    const int rc =
        ring_->RegisterBuffers(iov.data(), static_cast<unsigned>(iov.size()));
    if (rc < 0) {
      ctx_.stats->fallbacks.push_back(
          absl::StrCat("io_uring buffer registration failed (",
                       std::strerror(-rc), "): using unregistered buffers"));
      return;
    }
    fixed_ = true;
    ctx_.stats->fixed_buffers = true;
  }

  absl::StatusOr<uint64_t> Copy(uint64_t offset, uint64_t len) override {
    end_ = len == kToEof ? kToEof : offset + len;
    user_begin_ = offset;
    eof_ = kToEof;
    next_ = direct_ ? offset & ~(kDirectAlign - 1) : offset;
    inflight_ = 0;
    failed_submits_ = 0;
    error_ = absl::OkStatus();
    if (direct_) {
      if (absl::Status s = Preallocate(ctx_, ctx_.out_direct_fd, offset, len);
          !s.ok()) {
        return s;
      }
    }
    while (true) {
      StartIdleChunks();
      if (inflight_ == 0) break;
      const Submitted submitted = Submit();
      if (submitted == Submitted::kBroken) return error_;
      if (submitted == Submitted::kRetry) continue;
      os::Uring::Completion cqe;
      while (ring_->PopCompletion(&cqe)) Complete(cqe);
    }
    if (!error_.ok()) return error_;
    const uint64_t stop = std::min(end_, eof_);
    return stop > offset ? stop - offset : 0;
  }

 private:
  enum State { kIdle, kReading, kWriting };
  struct Chunk {
    std::byte* data;
    size_t cap;
    uint64_t offset = 0;
    size_t len = 0;    // bytes to move in the current phase
    size_t done = 0;   // bytes moved in the current phase
    size_t valid = 0;  // source bytes in the buffer (before padding)
    State state = kIdle;
  };
  enum class Submitted { kReap, kRetry, kBroken };

  static uint64_t RoundUp(uint64_t n) {
    return (n + kDirectAlign - 1) & ~(kDirectAlign - 1);
  }

  // Starts a read in every idle chunk while the range has bytes left and no
  // operation has failed (no new operations start after an error).
  void StartIdleChunks() {
    for (Chunk& c : chunks_) {
      if (!error_.ok() || next_ >= end_ || next_ >= eof_) break;
      if (c.state != kIdle) continue;
      c.offset = next_;
      c.len = std::min<uint64_t>(c.cap, end_ - next_);
      if (direct_) c.len = std::min<uint64_t>(c.cap, RoundUp(c.len));
      next_ += c.len;
      c.done = 0;
      c.state = kReading;
      Queue(c);
    }
  }

  // Submits what is queued and waits for one completion. An interrupted or
  // busy submit is retried. After an error the caller keeps reaping what is
  // in flight; if the ring stays broken it gives up: destroying the ring
  // cancels the rest, and the buffers stay pinned by the kernel until then.
  Submitted Submit() {
    const int rc = ring_->SubmitAndWait(1);
    ++ctx_.stats->submissions;
    if (rc >= 0) return Submitted::kReap;
    if (rc == -EINTR || rc == -EAGAIN || rc == -EBUSY) return Submitted::kRetry;
    if (error_.ok()) error_ = IoError("io_uring submit", ctx_.src_path, -rc);
    if (++failed_submits_ > 3) {
      broken_ = true;  // operations may be in flight: never reuse it
      return Submitted::kBroken;
    }
    return Submitted::kReap;
  }

  // One completion: -EAGAIN/-EINTR are queued again as they were; the first
  // error is kept and the chunk goes idle; after an error completions are
  // only drained.
  void Complete(const os::Uring::Completion& cqe) {
    --inflight_;
    ++ctx_.stats->operations;
    Chunk& c = chunks_[cqe.user_data];
    if (cqe.res == -EAGAIN || cqe.res == -EINTR) {
      Queue(c);
      return;
    }
    if (cqe.res < 0) {
      if (error_.ok()) {
        error_ = c.state == kReading
                     ? IoError("read", ctx_.src_path, -cqe.res)
                     : IoError("write", ctx_.dst_path, -cqe.res);
      }
      c.state = kIdle;
      return;
    }
    if (!error_.ok()) {
      c.state = kIdle;
      return;
    }
    const size_t res = static_cast<size_t>(cqe.res);
    if (c.state == kReading) {
      ReadDone(c, res);
    } else {
      WriteDone(c, res);
    }
  }

  // A read moved `res` bytes: read the rest after a short read, else write
  // what was read (zero-padded to the block with O_DIRECT). A read that
  // returns 0, or ends inside a block with O_DIRECT, is the end of file.
  void ReadDone(Chunk& c, size_t res) {
    c.done += res;
    const bool at_eof = res == 0 || (direct_ && c.done % kDirectAlign != 0);
    if (!at_eof && c.done < c.len) {
      Queue(c);
      return;
    }
    if (at_eof) eof_ = std::min(eof_, c.offset + c.done);
    if (c.done == 0) {
      c.state = kIdle;
      return;
    }
    c.valid = c.done;
    c.len = c.done;
    if (direct_ && c.len % kDirectAlign != 0) {
      const size_t padded = RoundUp(c.len);
      std::memset(c.data + c.len, 0, padded - c.len);
      c.len = padded;
    }
    c.done = 0;
    c.state = kWriting;
    Queue(c);
  }

  // A write moved `res` bytes: write the rest after a short write (one that
  // moves nothing is EIO), else count the caller's bytes in the chunk.
  void WriteDone(Chunk& c, size_t res) {
    c.done += res;
    if (res == 0) {
      error_ = IoError("write", ctx_.dst_path, EIO);
      c.state = kIdle;
      return;
    }
    if (c.done < c.len) {
      Queue(c);
      return;
    }
    c.state = kIdle;
    const uint64_t lo = std::max(c.offset, user_begin_);
    const uint64_t hi = std::min(c.offset + c.valid, end_);
    if (hi > lo) ctx_.Advance(hi - lo);
  }

  // Queues the chunk's current phase for the bytes not yet moved; counts it
  // in flight.
  void Queue(Chunk& c) {
    const uint64_t id = static_cast<uint64_t>(&c - chunks_.data());
    const int fd = c.state == kReading
                       ? (direct_ ? ctx_.in_direct_fd : ctx_.in_fd)
                       : (direct_ ? ctx_.out_direct_fd : ctx_.out_fd);
    std::byte* p = c.data + c.done;
    const unsigned n = static_cast<unsigned>(c.len - c.done);
    const int index = fixed_ ? static_cast<int>(id) : -1;
    // The ring has a slot per chunk, so the queue cannot be full.
    if (c.state == kReading) {
      ring_->PrepareRead(fd, p, n, c.offset + c.done, index, id);
    } else {
      ring_->PrepareWrite(fd, p, n, c.offset + c.done, index, id);
    }
    ++inflight_;
  }

  Context& ctx_;
  std::unique_ptr<os::Uring> ring_;
  const unsigned entries_;
  const bool direct_;
  bool fixed_ = false;
  bool broken_ = false;  // the ring may have operations in flight
  std::vector<Chunk> chunks_;
  // The range of the current Copy() call.
  uint64_t end_ = 0;
  uint64_t user_begin_ = 0;
  uint64_t eof_ = kToEof;
  uint64_t next_ = 0;  // the next offset to read
  size_t inflight_ = 0;
  int failed_submits_ = 0;
  absl::Status error_;  // the first error; none start after it
};

}  // namespace

absl::StatusOr<std::unique_ptr<Mover>> MakeUringMover(Context& ctx,
                                                      bool direct) {
  std::unique_ptr<os::Uring> ring;
  unsigned entries =
      static_cast<unsigned>(std::max<size_t>(ctx.queue_depth, 1));
  if (RingsAreCacheable() && t_cached_ring.ring != nullptr &&
      t_cached_ring.entries >= entries) {
    ring = std::move(t_cached_ring.ring);
    entries = t_cached_ring.entries;
  } else {
    const int rc = os::UringSys().uring_create(entries, &ring);
    if (rc < 0) return IoError("io_uring setup", ctx.src_path, -rc);
  }
  auto mover =
      std::make_unique<UringMover>(ctx, std::move(ring), entries, direct);
  mover->Init();
  return mover;
}

}  // namespace bufpool::copy_internal

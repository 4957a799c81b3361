// TreeRing: the regular files of a tree copied as io_uring operations on
// the walking thread, many files in flight through one ring.
//
// Per file, in three rounds (each round's operations are queued by the
// completions of the one before, and submitted together with every other
// file's):
//
//   1. statx(src, AT_SYMLINK_NOFOLLOW)         type, mode, size, owner, times
//   2. openat(src, O_RDONLY | O_NOFOLLOW)      both at once, not linked
//      openat(dst, O_WRONLY | O_CREAT | O_EXCL, the mode cp gives)
//   3. read(src, buf, size)   --soft link-->   the read must move every byte
//      write(dst, buf, size)  --hard link-->   the closes run whatever happens
//      close(src)             --hard link-->
//      close(dst)                              (kept open for preserve_*)
//
// Directories and symbolic links the walk makes are one operation each
// (mkdirat, symlinkat; kernel 5.15, probed with the ring), sharing the
// slots with the files; their outcome goes to the Sink as it completes.
//
// Only files of at most one buffer take this path, into directories the
// walk created (so the destination name is new: O_EXCL). Anything else (a
// larger or sparse file, an existing destination, a file that changed
// between the rounds) goes back to the walk (Sink::Handoff) to be copied by
// CopyFile with the existing movers; an entry that is no longer a regular
// file goes back to be walked again (Sink::Revisit).
//
// Buffers: one per slot, taken from the pool for the ring's lifetime and
// registered as fixed buffers (slot i is registered buffer i) when the
// kernel allows it. Memory is therefore kSlots buffers plus the slot
// states, whatever the tree's size.
//
// Errors: each file's failure is reported once through the Sink with the
// words CopyFile uses ("open source: ...", "create: ...", "read: ...",
// "write: ...", "close: ..."); a destination this ring created is removed
// when its copy fails, as CopyFile removes a file it created. Descriptors
// are closed on every path; a chain the kernel cancelled is closed here.
//
// Single-threaded: one walking thread drives the ring.
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "copy/copy_internal.h"
#include "os/file.h"
#include "os/syscalls.h"
#include "os/uring.h"

namespace bufpool::copy_internal {
namespace {

using Op = os::Uring::Op;
using Link = os::Uring::Link;

// Files in flight at once. Each has at most four operations in flight, so
// the ring (kEntries submissions, twice as many completions) never
// overflows its completion queue.
constexpr unsigned kSlots = 64;
constexpr unsigned kEntries = 4 * kSlots;
// Operations queued before the walk submits them without waiting.
constexpr unsigned kSubmitBatch = 16;

// What a completion belongs to: user_data = slot << kKindBits | kind.
enum Kind : uint64_t {
  kStatx,
  kOpenIn,
  kOpenOut,
  kRead,
  kWrite,
  kCloseIn,
  kCloseOut,
  kMkdir,
  kSymlink,
};
constexpr unsigned kKindBits = 4;

struct stat StatFromStatx(const struct statx& x) {
  struct stat st {};
  st.st_mode = x.stx_mode;
  st.st_uid = x.stx_uid;
  st.st_gid = x.stx_gid;
  st.st_size = static_cast<off_t>(x.stx_size);
  st.st_blocks = static_cast<blkcnt_t>(x.stx_blocks);
  st.st_ino = x.stx_ino;
  st.st_dev = makedev(x.stx_dev_major, x.stx_dev_minor);
  st.st_nlink = x.stx_nlink;
  st.st_atim = {x.stx_atime.tv_sec, x.stx_atime.tv_nsec};
  st.st_mtim = {x.stx_mtime.tv_sec, x.stx_mtime.tv_nsec};
  st.st_ctim = {x.stx_ctime.tv_sec, x.stx_ctime.tv_nsec};
  return st;
}

class RingFiles final : public TreeRing {
 public:
  RingFiles(const CopyOptions& options, Sink& sink,
            std::unique_ptr<os::Uring> ring, std::vector<Buffer> buffers)
      : options_(options),
        sink_(sink),
        ring_(std::move(ring)),
        buffers_(std::move(buffers)),
        slots_(buffers_.size()) {
    preserve_ = options.preserve_mode || options.preserve_ownership ||
                options.preserve_timestamps;
    for (size_t i = 0; i < slots_.size(); ++i) {
      slots_[i].buf = buffers_[i].data();
      free_.push_back(static_cast<unsigned>(slots_.size() - 1 - i));
    }
  }

  ~RingFiles() override {
    Drain();
    if (fixed_) ring_->UnregisterBuffers();
  }

  // Registers the slots' buffers; unregistered ones work too.
  void Register() {
    if (!ring_->Supports(Op::kReadFixed) || !ring_->Supports(Op::kWriteFixed)) {
      return;
    }
    std::vector<iovec> iov;
    for (const Buffer& b : buffers_) iov.push_back({b.data(), b.size()});
    fixed_ = ring_->RegisterBuffers(iov.data(),
                                    static_cast<unsigned>(iov.size())) == 0;
  }

  size_t buffer_size() const { return buffers_.front().size(); }
  bool fixed() const override { return fixed_; }

  void Add(std::string src, std::string dst) override {
    if (broken_) return sink_.Handoff(std::move(src), std::move(dst));
    while (free_.empty() && !broken_) Pump(1);
    if (broken_) return sink_.Handoff(std::move(src), std::move(dst));
    const unsigned i = free_.back();
    free_.pop_back();
    Slot& s = slots_[i];
    current_ = i;
    std::byte* buf = s.buf;
    s = Slot{};
    s.buf = buf;
    s.src = std::move(src);
    s.dst = std::move(dst);
    ++active_;
    Room(1);
    if (broken_) return Handoff(s);
    s.pending = 1;
    s.queued_at = submits_;
    ring_->PrepareStatx(AT_FDCWD, s.src.c_str(), AT_SYMLINK_NOFOLLOW,
                        STATX_BASIC_STATS, &s.stx, Data(i, kStatx));
    if (++queued_ >= kSubmitBatch) Pump(0);
  }

  void Drain() override {
    while (active_ > 0 && !broken_) Pump(1);
  }

  bool Mkdir(std::string src, const struct stat& st, std::string dst,
             mode_t mode) override {
    Slot* s = Take(mkdirat_);
    if (s == nullptr) return false;
    s->src = std::move(src);
    s->dst = std::move(dst);
    s->st = st;
    s->job = kMkdir;
    s->mode = mode;
    ring_->PrepareMkdirat(AT_FDCWD, s->dst.c_str(), mode,
                          Data(Index(*s), kMkdir));
    Queued();
    return true;
  }

  bool Symlink(std::string target, const struct stat& st,
               std::string dst) override {
    Slot* s = Take(symlinkat_);
    if (s == nullptr) return false;
    s->src = std::move(target);
    s->dst = std::move(dst);
    s->st = st;
    s->job = kSymlink;
    ring_->PrepareSymlinkat(s->src.c_str(), AT_FDCWD, s->dst.c_str(),
                            Data(Index(*s), kSymlink));
    Queued();
    return true;
  }

  // Which of the optional operations the kernel has (probed with the ring).
  void ProbeEntries() {
    mkdirat_ = ring_->Supports(Op::kMkdirat);
    symlinkat_ = ring_->Supports(Op::kSymlinkat);
  }

 private:
  struct Slot {
    std::byte* buf = nullptr;
    std::string src, dst;  // for kSymlink, src is the link's target
    Kind job = kStatx;     // kMkdir, kSymlink, or a file (kStatx)
    mode_t mode = 0;       // kMkdir
    struct statx stx {};
    struct stat st {};
    unsigned pending = 0;    // operations of the current round in flight
    uint64_t queued_at = 0;  // submits_ when they were queued
    int in = -1, out = -1;
    int res[kSymlink + 1] = {};
  };

  static uint64_t Data(unsigned slot, Kind kind) {
    return uint64_t{slot} << kKindBits | kind;
  }

  unsigned Index(const Slot& s) const {
    return static_cast<unsigned>(&s - slots_.data());
  }

  // A free slot with room for one submission, for a directory or a link;
  // null (nothing taken) when `supported` is false or the ring has failed.
  Slot* Take(bool supported) {
    if (!supported || broken_) return nullptr;
    while (free_.empty() && !broken_) Pump(1);
    if (broken_) return nullptr;
    const unsigned i = free_.back();
    current_ = i;
    Room(1);
    current_ = ~0u;
    if (broken_) return nullptr;
    free_.pop_back();
    Slot& s = slots_[i];
    std::byte* buf = s.buf;
    s = Slot{};
    s.buf = buf;
    ++active_;
    s.pending = 1;
    s.queued_at = submits_;
    return &s;
  }

  void Queued() {
    if (++queued_ >= kSubmitBatch) Pump(0);
  }

  // A directory or link's outcome to the Sink; the slot is freed first, so
  // the Sink may add more.
  void Made(Slot& s, int err) {
    std::string src = std::move(s.src), dst = std::move(s.dst);
    const struct stat st = s.st;
    const Kind job = s.job;
    Free(s);
    if (job == kMkdir) {
      sink_.DirectoryMade(std::move(src), st, std::move(dst), err);
    } else {
      sink_.SymlinkMade(st, dst, err);
    }
  }

  // A directory or link the kernel never had (the ring failed first): made
  // with the system call.
  void MakeNow(Slot& s) {
    const int rc = s.job == kMkdir
                       ? os::Sys().mkdir(s.dst.c_str(), s.mode)
                       : os::Sys().symlink(s.src.c_str(), s.dst.c_str());
    Made(s, rc == 0 ? 0 : errno);
  }

  // Makes room for `n` submissions (a chain is queued whole).
  void Room(unsigned n) {
    while (ring_->SubmissionSpace() < n && !broken_) Submit(0);
  }

  // Submits what is queued and waits for `wait` completions; EINTR, EAGAIN
  // and EBUSY are retried. Any other failure of the ring itself ends its
  // use: the files in flight are reported and the rest of the tree goes
  // through CopyFile.
  void Submit(unsigned wait) {
    queued_ = 0;
    for (int tries = 0;; ++tries) {
      const int rc = ring_->SubmitAndWait(wait);
      if (rc >= 0) {
        ++submits_;
        return;
      }
      if ((rc == -EINTR || rc == -EAGAIN || rc == -EBUSY) && tries < 1000) {
        continue;
      }
      Break(-rc);
      return;
    }
  }

  // The ring failed. A file whose current operations were queued after the
  // last submit that worked never reached the kernel: CopyFile copies it
  // (over the destination made here, if any, in place). A file with
  // operations in the kernel is reported: they may still run until the ring
  // is destroyed, which cancels them (as for the single-file mover, a read
  // still in flight then may land in its slot's buffer after the buffer is
  // back in the pool; a ring whose io_uring_enter fails for good is the
  // only way there).
  void Break(int err) {
    broken_ = true;
    for (unsigned i = 0; i < slots_.size(); ++i) {
      Slot& s = slots_[i];
      // The slot being worked on is handed off by its caller.
      if (s.src.empty() || i == current_) continue;
      if (s.job == kMkdir || s.job == kSymlink) {
        if (s.queued_at == submits_) {
          MakeNow(s);
        } else {
          Made(s, err);  // reported as the operation's failure
        }
        continue;
      }
      if (s.queued_at == submits_) {
        CloseNow(s.in);
        CloseNow(s.out);
        Handoff(s);
        continue;
      }
      Fail(s, IoError("io_uring submit", s.src, err), false);
    }
  }

  void Pump(unsigned wait) {
    current_ = ~0u;  // no slot is half-way through being queued
    Submit(wait);
    os::Uring::Completion c;
    while (!broken_ && ring_->PopCompletion(&c)) Complete(c);
  }

  void Complete(const os::Uring::Completion& c) {
    const unsigned i = static_cast<unsigned>(c.user_data >> kKindBits);
    const Kind kind = static_cast<Kind>(c.user_data & ((1u << kKindBits) - 1));
    Slot& s = slots_[i];
    current_ = i;
    s.res[kind] = c.res;
    if (kind == kOpenIn && c.res >= 0) s.in = c.res;
    if (kind == kOpenOut && c.res >= 0) s.out = c.res;
    if (kind == kCloseIn && c.res != -ECANCELED) s.in = -1;
    if (kind == kCloseOut && c.res != -ECANCELED) s.out = -1;
    if (--s.pending > 0) return;
    switch (kind) {
      case kMkdir:
      case kSymlink:
        return Made(s, -c.res);
      case kStatx:
        return Stated(i, s);
      case kOpenIn:
      case kOpenOut:
        return Opened(i, s);
      default:
        return Moved(i, s);
    }
  }

  // Round 1 done: queue the opens, or hand the file back.
  void Stated(unsigned i, Slot& s) {
    if (s.res[kStatx] < 0) {
      return Fail(s, IoError("stat", s.src, -s.res[kStatx]), false);
    }
    s.st = StatFromStatx(s.stx);
    if (!S_ISREG(s.st.st_mode)) return Revisit(s);
    const uint64_t size = static_cast<uint64_t>(s.st.st_size);
    // Larger files use the movers; a file with holes keeps them there.
    if (size > buffer_size() ||
        static_cast<uint64_t>(s.st.st_blocks) * 512 < size) {
      return Handoff(s);
    }
    const mode_t mode = s.st.st_mode & (options_.preserve_mode ? 07777 : 0777);
    Room(2);
    if (broken_) return Handoff(s);
    s.queued_at = submits_;
    s.pending = 1;
    ring_->PrepareOpenat(AT_FDCWD, s.dst.c_str(),
                         O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW, mode,
                         Data(i, kOpenOut));
    if (size > 0) {
      ++s.pending;
      ring_->PrepareOpenat(AT_FDCWD, s.src.c_str(), O_RDONLY | O_NOFOLLOW, 0,
                           Data(i, kOpenIn));
    }
    queued_ += s.pending;
  }

  // Round 2 done: queue the data chain, or report why not.
  void Opened(unsigned i, Slot& s) {
    const uint64_t size = static_cast<uint64_t>(s.st.st_size);
    const int out_err = s.out < 0 ? -s.res[kOpenOut] : 0;
    const int in_err = size > 0 && s.in < 0 ? -s.res[kOpenIn] : 0;
    if (out_err != 0) {
      CloseNow(s.in);
      if (out_err == EEXIST) {
        // Made meanwhile: skipped under no_clobber (cp -n), else copied by
        // CopyFile in place.
        if (options_.no_clobber) return Free(s);
        return Handoff(s);
      }
      return Fail(s, IoError("create", s.dst, out_err), false);
    }
    if (in_err != 0) {
      // A name that became a symbolic link (ELOOP) is walked again.
      if (in_err == ELOOP) {
        CloseNow(s.out);
        Unlink(s);
        return Revisit(s);
      }
      return Fail(s, IoError("open source", s.src, in_err), true);
    }
    Room(4);
    if (broken_) {
      CloseNow(s.in);
      CloseNow(s.out);
      return Handoff(s);
    }
    s.queued_at = submits_;
    s.pending = 0;
    const int index = fixed_ ? static_cast<int>(i) : -1;
    const unsigned n = static_cast<unsigned>(size);
    if (size > 0) {
      ring_->PrepareRead(s.in, s.buf, n, 0, index, Data(i, kRead));
      ring_->LinkLast(Link::kSoft);
      ring_->PrepareWrite(s.out, s.buf, n, 0, index, Data(i, kWrite));
      ring_->LinkLast(Link::kHard);
      ring_->PrepareClose(s.in, Data(i, kCloseIn));
      s.pending += 3;
      if (!preserve_) ring_->LinkLast(Link::kHard);
    }
    if (!preserve_) {
      ring_->PrepareClose(s.out, Data(i, kCloseOut));
      ++s.pending;
    }
    queued_ += s.pending;
    if (s.pending == 0) Moved(i, s);  // empty, with preserve_*: finish here
  }

  // Round 3 done: check every result, finish with preserve_*, count.
  void Moved(unsigned, Slot& s) {
    const uint64_t size = static_cast<uint64_t>(s.st.st_size);
    CloseNow(s.in);  // a cancelled close leaves it to us
    if (size > 0) {
      const int r = s.res[kRead];
      if (r < 0) return Fail(s, IoError("read", s.src, -r), true);
      if (static_cast<uint64_t>(r) != size) {
        // The source changed size since statx: CopyFile copies it as it is
        // now, into the file made here.
        CloseNow(s.out);
        return Handoff(s);
      }
      const int w = s.res[kWrite];
      if (w < 0) return Fail(s, IoError("write", s.dst, -w), true);
      if (static_cast<uint64_t>(w) < size) {
        if (absl::Status st = FinishShortWrite(s, static_cast<size_t>(w));
            !st.ok()) {
          return Fail(s, st, true);
        }
      }
    }
    if (preserve_ && s.out >= 0) {
      if (absl::Status st = PreserveAttributes(s.out, s.dst, s.st, options_);
          !st.ok()) {
        return Fail(s, st, true);
      }
      const int fd = std::exchange(s.out, -1);
      if (os::Sys().close(fd) != 0 && errno != EINTR) {
        return Fail(s, IoError("close", s.dst, errno), true);
      }
    } else if (s.out >= 0) {
      // The chain's close was cancelled.
      CloseNow(s.out);
    } else if (s.res[kCloseOut] < 0) {
      return Fail(s, IoError("close", s.dst, -s.res[kCloseOut]), true);
    }
    sink_.FileDone(size);
    Free(s);
  }

  // A write that moved fewer bytes than asked (a full disk, a quota): the
  // rest is written with pwrite, whose error is the one reported.
  absl::Status FinishShortWrite(Slot& s, size_t done) {
    const size_t size = static_cast<size_t>(s.st.st_size);
    int fd = s.out;
    if (fd < 0) {
      fd = os::Sys().open(s.dst.c_str(), O_WRONLY | O_NOFOLLOW, 0);
      if (fd < 0) return IoError("write", s.dst, errno);
    }
    absl::Status result;
    while (done < size) {
      const iovec iov{s.buf + done, size - done};
      const ssize_t n =
          os::Sys().pwritev(fd, &iov, 1, static_cast<off_t>(done));
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) {
        result = IoError("write", s.dst, n < 0 ? errno : EIO);
        break;
      }
      done += static_cast<size_t>(n);
    }
    if (fd != s.out && os::Sys().close(fd) != 0 && errno != EINTR &&
        result.ok()) {
      result = IoError("close", s.dst, errno);
    }
    return result;
  }

  void CloseNow(int& fd) {
    if (fd >= 0) os::Sys().close(std::exchange(fd, -1));
  }

  void Unlink(Slot& s) { os::Sys().unlink(s.dst.c_str()); }

  // Reports `status`, closes what is open and, when `created`, removes the
  // destination this ring made.
  void Fail(Slot& s, const absl::Status& status, bool created) {
    CloseNow(s.in);
    CloseNow(s.out);
    if (created) Unlink(s);
    sink_.FileFailed(status);
    Free(s);
  }

  void Handoff(Slot& s) {
    sink_.Handoff(std::move(s.src), std::move(s.dst));
    Free(s);
  }

  void Revisit(Slot& s) {
    sink_.Revisit(std::move(s.src), std::move(s.dst));
    Free(s);
  }

  void Free(Slot& s) {
    s.src.clear();
    s.dst.clear();
    s.in = s.out = -1;
    free_.push_back(static_cast<unsigned>(&s - slots_.data()));
    --active_;
  }

  const CopyOptions& options_;
  Sink& sink_;
  std::unique_ptr<os::Uring> ring_;
  std::vector<Buffer> buffers_;  // slot i's buffer is buffers_[i]
  std::vector<Slot> slots_;
  std::vector<unsigned> free_;  // free slots
  size_t active_ = 0;           // slots in use
  unsigned queued_ = 0;         // operations queued since the last submit
  bool preserve_ = false;
  bool fixed_ = false;
  bool mkdirat_ = false;    // the kernel has IORING_OP_MKDIRAT
  bool symlinkat_ = false;  // ... and IORING_OP_SYMLINKAT
  bool broken_ = false;     // the ring failed: everything goes to CopyFile
  uint64_t submits_ = 0;    // submits that worked
  unsigned current_ = ~0u;  // the slot Add or Complete is working on
};

}  // namespace

absl::StatusOr<std::unique_ptr<TreeRing>> TreeRing::Create(
    const CopyOptions& options, BufferPool& pool, Sink& sink) {
  std::unique_ptr<os::Uring> ring;
  if (const int rc = os::UringSys().uring_create(kEntries, &ring); rc < 0) {
    return IoError("io_uring setup", "tree", -rc);
  }
  for (const auto& [op, name] :
       {std::pair{Op::kRead, "READ"}, std::pair{Op::kWrite, "WRITE"},
        std::pair{Op::kOpenat, "OPENAT"}, std::pair{Op::kStatx, "STATX"},
        std::pair{Op::kClose, "CLOSE"}}) {
    if (!ring->Supports(op)) {
      return absl::UnimplementedError(
          absl::StrCat("io_uring: the kernel has no IORING_OP_", name));
    }
  }
  // Half the pool at most (none from a pool of one buffer): CopyFile's
  // movers draw on it too.
  std::vector<Buffer> buffers(std::min<size_t>(kSlots, pool.capacity() / 2));
  buffers.resize(pool.TryAcquireBulk(absl::MakeSpan(buffers)));
  if (buffers.empty()) {
    return absl::ResourceExhaustedError("io_uring: no free buffer in the pool");
  }
  auto files = std::make_unique<RingFiles>(options, sink, std::move(ring),
                                           std::move(buffers));
  files->Register();
  files->ProbeEntries();
  return files;
}

}  // namespace bufpool::copy_internal

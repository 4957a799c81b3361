// CopyFile: opens the source and the destination (destination.cc), moves
// the bytes through one mover, and finishes the destination.
#include "bufpool/file_copy.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "copy/copy_internal.h"
#include "os/error.h"
#include "os/file.h"
#include "os/syscalls.h"

namespace bufpool {

absl::string_view CopyMethodName(CopyMethod method) {
  switch (method) {
    case CopyMethod::kAuto:
      return "auto";
    case CopyMethod::kReadWrite:
      return "readwrite";
    case CopyMethod::kDirect:
      return "direct";
    case CopyMethod::kUring:
      return "uring";
    case CopyMethod::kKernel:
      return "kernel";
  }
  return "?";
}

std::optional<CopyMethod> ParseCopyMethod(absl::string_view name) {
  for (CopyMethod m :
       {CopyMethod::kAuto, CopyMethod::kReadWrite, CopyMethod::kDirect,
        CopyMethod::kUring, CopyMethod::kKernel}) {
    if (CopyMethodName(m) == name) return m;
  }
  return std::nullopt;
}

namespace copy_internal {
namespace {

// The source's descriptors; the destination's live in Target.
struct Job {
  ~Job() {
    for (int* fd : {&in_direct, &out_direct, &in}) {
      if (*fd >= 0) os::Sys().close(*fd);
    }
  }
  int in = -1, in_direct = -1, out_direct = -1;
};

// The method kAuto runs, and why (CopyStats::method_reason). Measured on
// ext4 and tmpfs (docs/benchmarks.md, "Copies"): for regular files from
// 4 KiB to 512 MiB the kernel method was the fastest of kernel, readwrite
// and uring, on one file system (copy_file_range: one copy in the kernel,
// no buffers) and across two (sendfile, since copy_file_range refuses
// copies between file systems with EXDEV: starting there saves the refused
// call). A source without a size (/proc, a pipe) or a destination that is
// not a regular file is read to end of file with readwrite.
struct AutoChoice {
  CopyMethod method = CopyMethod::kReadWrite;
  bool sendfile_first = false;
  std::string why;
};
AutoChoice ChooseAuto(const struct stat& st, const Target& target) {
  AutoChoice c;
  if (!S_ISREG(st.st_mode) || st.st_size == 0) {
    c.why =
        "auto: readwrite: the source reports no size (not a regular file, or "
        "/proc): read to end of file";
    return c;
  }
  if (!target.regular) {
    c.why =
        "auto: readwrite: the destination is not a regular file: written "
        "from one sequential read";
    return c;
  }
  c.method = CopyMethod::kKernel;
  struct stat out;
  const bool other_fs =
      os::Sys().fstat(target.fd, &out) == 0 && out.st_dev != st.st_dev;
  if (other_fs) {
    c.sendfile_first = true;
    c.why = absl::StrCat(
        "auto: kernel (sendfile): source (device ", major(st.st_dev), ":",
        minor(st.st_dev), ") and destination (device ", major(out.st_dev), ":",
        minor(out.st_dev),
        ") are on different file systems, where copy_file_range is "
        "refused; sendfile keeps the bytes in the kernel, the fastest here "
        "(tmpfs to ext4, 512 MiB: ahead of readwrite and uring)");
  } else {
    c.why =
        "auto: kernel: a regular file on the destination's file system: "
        "copy_file_range keeps the bytes in the kernel (one copy, or shared "
        "blocks where the file system can) and needs no buffers, the "
        "fastest here (ext4, 4 KiB to 512 MiB: ahead of readwrite and "
        "uring)";
  }
  return c;
}

// Opens the O_DIRECT descriptors; false (with a fallback noted) when a file
// system refuses them.
absl::StatusOr<bool> OpenDirect(const std::string& src, const Target& t,
                                Job& job, CopyStats& stats,
                                size_t buffer_size) {
  const std::string& dst = t.path;
  if (buffer_size % kDirectAlign != 0) {
    stats.fallbacks.push_back(absl::StrCat(
        "buffer size ", buffer_size,
        " is not a multiple of 4096: O_DIRECT not used, buffered I/O"));
    return false;
  }
  job.in_direct = os::Sys().open(src.c_str(), O_RDONLY | O_DIRECT, 0);
  if (job.in_direct < 0) {
    const int err = errno;
    if (err != EINVAL) return IoError("open source (O_DIRECT)", src, err);
    stats.fallbacks.push_back(absl::StrCat("O_DIRECT refused on ", src, " (",
                                           std::strerror(err),
                                           "): buffered I/O"));
    return false;
  }
  // A second descriptor for the file t.fd writes, checked to be the same
  // file. A new file created without write permission (a read-only source's
  // mode) cannot be opened again: then buffered I/O.
  const std::string& out = t.temp.empty() ? t.write_path : t.temp;
  job.out_direct = os::Sys().open(out.c_str(), O_WRONLY | O_DIRECT, 0);
  struct stat a, b;
  if (job.out_direct >= 0 && (os::Sys().fstat(job.out_direct, &a) != 0 ||
                              os::Sys().fstat(t.fd, &b) != 0 ||
                              a.st_ino != b.st_ino || a.st_dev != b.st_dev)) {
    os::Sys().close(job.out_direct);
    job.out_direct = -1;
    errno = ESTALE;
  }
  if (job.out_direct < 0) {
    const int err = errno;
    if (err != EINVAL && err != EACCES && err != ESTALE) {
      return IoError("open destination (O_DIRECT)", dst, err);
    }
    stats.fallbacks.push_back(absl::StrCat("O_DIRECT refused on ", dst, " (",
                                           std::strerror(err),
                                           "): buffered I/O"));
    os::Sys().close(job.in_direct);
    job.in_direct = -1;
    return false;
  }
  return true;
}

// Copies every data range of the source (holes stay holes); returns the
// size the destination must have.
absl::StatusOr<uint64_t> CopyRanges(Context& ctx, Mover& mover, uint64_t size,
                                    bool may_have_holes) {
  uint64_t pos = 0;
  // A file with as many blocks as bytes has no holes to look for: two
  // lseek calls saved per file, which counts for trees of small files.
  bool sparse_ok = may_have_holes;
  while (pos < size) {
    uint64_t data = pos, hole = size;
    if (sparse_ok) {
      const off_t d =
          os::Sys().lseek(ctx.in_fd, static_cast<off_t>(pos), SEEK_DATA);
      if (d < 0) {
        if (errno == ENXIO) break;  // only a hole remains
        if (errno != EINVAL && errno != EOPNOTSUPP) {
          return IoError("seek", ctx.src_path, errno);
        }
        sparse_ok = false;  // no SEEK_DATA here: copy everything
      } else {
        data = static_cast<uint64_t>(d);
        const off_t h = os::Sys().lseek(ctx.in_fd, d, SEEK_HOLE);
        if (h < 0) return IoError("seek", ctx.src_path, errno);
        hole = std::min<uint64_t>(static_cast<uint64_t>(h), size);
      }
    }
    if (data >= size) break;
    absl::StatusOr<uint64_t> n = mover.Copy(data, hole - data);
    if (!n.ok()) return n.status();
    if (*n < hole - data) return data + *n;  // the source shrank: stop there
    pos = hole;
  }
  return size;
}

// The limits CopyOptions documents, checked before anything is opened.
absl::Status CheckOptions(const CopyOptions& options) {
  if (options.batch_buffers > CopyOptions::kMaxBatchBuffers ||
      options.queue_depth > CopyOptions::kMaxQueueDepth) {
    return absl::InvalidArgumentError(absl::StrCat(
        "copy options: batch_buffers (", options.batch_buffers,
        ") must be <= ", CopyOptions::kMaxBatchBuffers, " and queue_depth (",
        options.queue_depth, ") <= ", CopyOptions::kMaxQueueDepth));
  }
  return absl::OkStatus();
}

// Opens the source and stats it; a directory is refused.
absl::Status OpenSource(const std::string& src, Job& job, struct stat& st) {
  job.in = os::Sys().open(src.c_str(), O_RDONLY, 0);
  if (job.in < 0) return IoError("open source", src, errno);
  if (os::Sys().fstat(job.in, &st) != 0) {
    return IoError("stat source", src, errno);
  }
  if (S_ISDIR(st.st_mode)) return IoError("source is a directory", src, EISDIR);
  return absl::OkStatus();
}

// What one copy runs: the method, whether it copies a known size, and the
// buffers it moves data through.
struct Plan {
  CopyMethod method = CopyMethod::kReadWrite;
  bool sized = false;         // a regular source with a size, to a regular file
  bool wants_direct = false;  // O_DIRECT asked for (opened later, may fail)
  size_t batch = 1;           // buffers per call or operation
  size_t depth = 1;           // operations in flight
  size_t want = 1;            // buffers in all
  bool sendfile_first = false;  // kKernel: start with sendfile
};

// Chooses the method and the buffer counts. A device or FIFO is written at
// its file position from one sequential read of the source, with readwrite.
Plan ChoosePlan(const CopyOptions& options, const struct stat& st,
                const Target& target, CopyStats& stats) {
  Plan plan;
  plan.sized = S_ISREG(st.st_mode) && st.st_size > 0 && target.regular;
  if (options.method == CopyMethod::kAuto) {
    AutoChoice c = ChooseAuto(st, target);
    plan.method = c.method;
    plan.sendfile_first = c.sendfile_first;
    stats.method_reason = std::move(c.why);
  } else {
    plan.method = options.method;
    stats.method_reason =
        absl::StrCat(CopyMethodName(options.method), ": as asked");
  }
  if (!plan.sized && plan.method != CopyMethod::kReadWrite) {
    stats.fallbacks.push_back(absl::StrCat(
        CopyMethodName(plan.method),
        target.regular ? ": source reports size 0 or is not a regular file"
                       : ": destination is not a regular file",
        ": reading to end of file with readwrite"));
    plan.method = CopyMethod::kReadWrite;
  }
  stats.method = plan.method;
  const bool queued =
      plan.method == CopyMethod::kUring || plan.method == CopyMethod::kDirect;
  plan.wants_direct = plan.method == CopyMethod::kDirect ||
                      (plan.method == CopyMethod::kUring && options.direct_io);
  // Defaults chosen with bench/run_copy_bench. Buffered preadv/pwritev:
  // 128 KiB per call, the size dd uses; larger calls were faster on a quiet
  // machine but fell into a slow mode of page-cache writes under load, where
  // dd bs=128k did not. io_uring: 128 KiB operations, several in flight;
  // O_DIRECT: large (1 MiB) requests.
  plan.batch = BatchBuffers(options, plan.wants_direct);
  plan.depth = options.queue_depth != 0 ? options.queue_depth : 4;
  plan.want = plan.batch * (queued ? plan.depth : 1);
  return plan;
}

// The buffers one copy holds, from the caller's pool or a private one.
// `buffers` is declared after `private_pool`, so it is destroyed first:
// every buffer goes back before a private pool is destroyed.
struct Buffers {
  std::unique_ptr<BufferPool> private_pool;
  BufferPool* pool = nullptr;
  std::vector<Buffer> buffers;
};

// Takes up to `want` buffers without waiting; when the pool has none free,
// waits up to 30 s for one.
absl::Status TakeBuffers(const CopyOptions& options, size_t want,
                         const std::string& dst, Buffers& out) {
  out.pool = options.pool;
  if (out.pool == nullptr) {
    PoolOptions po;
    po.buffer_size = options.buffer_size;
    po.buffer_count = want;
    po.cache_size = 0;
    absl::StatusOr<std::unique_ptr<BufferPool>> p = BufferPool::Create(po);
    if (!p.ok()) return p.status();
    out.private_pool = *std::move(p);
    out.pool = out.private_pool.get();
  }
  out.buffers.resize(std::min(want, out.pool->capacity()));
  out.buffers.resize(out.pool->TryAcquireBulk(absl::MakeSpan(out.buffers)));
  if (out.buffers.empty()) {
    absl::StatusOr<Buffer> one = out.pool->Acquire(absl::Seconds(30));
    if (!one.ok()) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "no free buffer in the pool: ", dst, ": ", one.status().message()));
    }
    out.buffers.push_back(*std::move(one));
  }
  return absl::OkStatus();
}

// Opens the O_DIRECT descriptors when the plan wants them (a refusal falls
// back to buffered I/O, and kDirect to readwrite), then makes the mover for
// the method; io_uring falls back to a synchronous mover when no ring can be
// made.
absl::StatusOr<std::unique_ptr<Mover>> MakeMover(Context& ctx, Plan& plan,
                                                 const Target& target,
                                                 Job& job) {
  CopyStats& stats = *ctx.stats;
  bool direct = plan.wants_direct;
  if (direct) {
    absl::StatusOr<bool> d =
        OpenDirect(ctx.src_path, target, job, stats, ctx.pool->buffer_size());
    if (!d.ok()) return d.status();
    direct = *d;
    ctx.in_direct_fd = job.in_direct;
    ctx.out_direct_fd = job.out_direct;
    if (!direct && plan.method == CopyMethod::kDirect) {
      stats.method = plan.method = CopyMethod::kReadWrite;
    }
  }
  stats.direct_io = direct;
  switch (plan.method) {
    case CopyMethod::kUring:
    case CopyMethod::kDirect: {
      absl::StatusOr<std::unique_ptr<Mover>> m = MakeUringMover(ctx, direct);
      if (m.ok()) return m;
      stats.fallbacks.push_back(absl::StrCat(
          "io_uring unavailable (", m.status().message(), "): using ",
          direct ? "synchronous O_DIRECT" : "readwrite"));
      if (!direct) stats.method = CopyMethod::kReadWrite;
      return direct ? MakeSyncDirectMover(ctx) : MakeReadWriteMover(ctx);
    }
    case CopyMethod::kKernel:
      return MakeKernelMover(ctx);
    default:
      return MakeReadWriteMover(ctx);
  }
}

// Moves the data: every data range of a sized source (holes stay holes), or
// everything to end of file. Returns the size the destination must have.
absl::StatusOr<uint64_t> MoveData(Context& ctx, const Plan& plan,
                                  const Target& target, Job& job,
                                  const struct stat& st) {
  Plan chosen = plan;
  absl::StatusOr<std::unique_ptr<Mover>> mover =
      MakeMover(ctx, chosen, target, job);
  if (!mover.ok()) return mover.status();
  if (!chosen.sized) return (*mover)->Copy(0, kToEof);
  const uint64_t size = static_cast<uint64_t>(st.st_size);
  return CopyRanges(ctx, **mover, size,
                    static_cast<uint64_t>(st.st_blocks) * 512 < size);
}

// Closes the O_DIRECT descriptors, reporting a delayed write error.
absl::Status CloseDirect(Job& job, const std::string& dst) {
  for (int* fd : {&job.in_direct, &job.out_direct}) {
    if (*fd >= 0) {
      const int f = std::exchange(*fd, -1);
      if (os::Sys().close(f) != 0 && errno != EINTR) {
        return IoError("close", dst, errno);
      }
    }
  }
  return absl::OkStatus();
}

// Opens the source (fstat into `st`) and resolves and opens the
// destination into `target`; records where it goes in `stats`.
absl::Status OpenBoth(const std::string& src, absl::string_view dst,
                      const CopyOptions& options, Job& job, struct stat& st,
                      Target& target, CopyStats& stats) {
  if (absl::Status s = OpenSource(src, job, st); !s.ok()) return s;
  if (absl::Status s = OpenTarget(src, st, dst, options, target); !s.ok()) {
    return s;
  }
  stats.destination = target.path;
  stats.replace = target.replace;
  stats.created = !target.exists;
  return absl::OkStatus();
}

// What the movers share, for the plan's method on the opened files; the
// buffers and the start time are the caller's to set.
Context MakeContext(const std::string& src, const struct stat& st,
                    const CopyOptions& options, const Plan& plan,
                    const Target& target, const Job& job, CopyStats& stats) {
  Context ctx;
  ctx.in_fd = job.in;
  ctx.out_fd = target.fd;
  ctx.seekable = S_ISREG(st.st_mode);
  ctx.out_seekable = target.regular;
  ctx.src_path = src;
  ctx.dst_path = target.path;
  ctx.batch = plan.batch;
  ctx.queue_depth = plan.depth;
  ctx.stats = &stats;
  ctx.options = &options;
  ctx.total = plan.sized ? static_cast<uint64_t>(st.st_size) : 0;
  ctx.sendfile_first = plan.sendfile_first;
  return ctx;
}

// Empties the destination when it is written in place, then moves the data
// through the plan's mover with the buffers it needs. The kernel method
// moves the bytes without buffers: they are taken only if it falls back to
// readwrite (a private pool per file would cost more than a small file's
// copy). Returns the size the destination must have.
absl::StatusOr<uint64_t> CopyData(const std::string& src, const struct stat& st,
                                  const CopyOptions& options, const Plan& plan,
                                  Target& target, Job& job, CopyStats& stats,
                                  absl::Time start) {
  const std::string& dst = target.path;
  Buffers held;
  auto take = [&]() -> absl::Status {
    if (absl::Status s = TakeBuffers(options, plan.want, dst, held); !s.ok()) {
      return s;
    }
    stats.buffer_bytes = held.buffers.size() * held.pool->buffer_size();
    return absl::OkStatus();
  };
  const bool lazy = plan.method == CopyMethod::kKernel;
  if (!lazy) {
    if (absl::Status s = take(); !s.ok()) return s;
  }

  Context ctx = MakeContext(src, st, options, plan, target, job, stats);
  ctx.start = start;
  ctx.pool = held.pool;
  ctx.buffers = &held.buffers;
  if (lazy) {
    ctx.take_buffers = [&]() -> absl::Status {
      if (absl::Status s = take(); !s.ok()) return s;
      ctx.pool = held.pool;
      return absl::OkStatus();
    };
  }

  if (absl::Status s = TruncateForWriting(target); !s.ok()) return s;
  // The mover lives inside MoveData, so it is gone (its registrations
  // dropped) before `held` gives the buffers back.
  return MoveData(ctx, plan, target, job, st);
}

// Closes the O_DIRECT descriptors, then sets the destination's size and
// attributes and puts it in place (FinishTarget).
absl::Status Finish(const struct stat& st, uint64_t final_size,
                    const CopyOptions& options, const CopyStats& stats,
                    Job& job, Target& target) {
  if (absl::Status s = CloseDirect(job, target.path); !s.ok()) return s;
  // The file written started empty (new, temporary or truncated); written
  // without holes and without O_DIRECT's rounded-up reservations, it has
  // its size already and needs no truncate.
  target.sized = !stats.direct_io && stats.bytes_copied == final_size;
  return FinishTarget(st, final_size, options, target);
}

}  // namespace
}  // namespace copy_internal

// The steps: check the options, open both ends, choose how to move the
// bytes, move them, finish the destination.
absl::StatusOr<CopyStats> CopyFile(absl::string_view src_view,
                                   absl::string_view dst_view,
                                   const CopyOptions& options) {
  using namespace copy_internal;  // NOLINT: this file's own internals
  const absl::Time start = absl::Now();
  const std::string src(src_view);
  CopyStats stats;
  stats.method_requested = options.method;
  if (absl::Status s = CheckOptions(options); !s.ok()) return s;

  Job job;
  struct stat st;
  Target target;
  if (absl::Status s = OpenBoth(src, dst_view, options, job, st, target, stats);
      !s.ok()) {
    return s;
  }
  const Plan plan = ChoosePlan(options, st, target, stats);
  absl::StatusOr<uint64_t> final_size =
      CopyData(src, st, options, plan, target, job, stats, start);
  if (!final_size.ok()) return final_size.status();
  if (absl::Status s = Finish(st, *final_size, options, stats, job, target);
      !s.ok()) {
    return s;
  }
  stats.file_size = *final_size;
  stats.elapsed = absl::Now() - start;
  return stats;
}

}  // namespace bufpool

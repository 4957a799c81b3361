// CopyFile: opens the source and the destination (destination.cc), moves
// the bytes through one mover, and finishes the destination.
#include "bufpool/file_copy.h"

#include <fcntl.h>
#include <sys/stat.h>
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

// The method kAuto runs. For a file in the page cache on one file system,
// copy_file_range (in-kernel, no copy to user space) was the fastest in
// bench/run_copy_bench; it falls back by itself where the kernel refuses.
CopyMethod ChooseAuto(const struct stat& st) {
  return S_ISREG(st.st_mode) && st.st_size > 0 ? CopyMethod::kKernel
                                               : CopyMethod::kReadWrite;
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

}  // namespace
}  // namespace copy_internal

absl::StatusOr<CopyStats> CopyFile(absl::string_view src_view,
                                   absl::string_view dst_view,
                                   const CopyOptions& options) {
  using namespace copy_internal;  // NOLINT: this file's own internals
  const absl::Time start = absl::Now();
  const std::string src(src_view);
  std::string dst(dst_view);
  CopyStats stats;
  stats.method_requested = options.method;

  if (options.batch_buffers > 4096 || options.queue_depth > 4096) {
    return absl::InvalidArgumentError(absl::StrCat(
        "copy options: batch_buffers (", options.batch_buffers,
        ") and queue_depth (", options.queue_depth, ") must be <= 4096"));
  }

  Job job;
  job.in = os::Sys().open(src.c_str(), O_RDONLY, 0);
  if (job.in < 0) return IoError("open source", src, errno);
  struct stat st;
  if (os::Sys().fstat(job.in, &st) != 0) {
    return IoError("stat source", src, errno);
  }
  if (S_ISDIR(st.st_mode)) return IoError("source is a directory", src, EISDIR);

  Target target;
  if (absl::Status s = OpenTarget(src, st, dst, options, target); !s.ok()) {
    return s;
  }
  dst = target.path;
  stats.destination = dst;
  stats.replace = target.replace;
  stats.created = !target.exists;

  // Which method runs. A device or FIFO is written at its file position
  // from one sequential read of the source.
  const bool sized = S_ISREG(st.st_mode) && st.st_size > 0 && target.regular;
  CopyMethod method =
      options.method == CopyMethod::kAuto ? ChooseAuto(st) : options.method;
  if (!sized && method != CopyMethod::kReadWrite) {
    stats.fallbacks.push_back(absl::StrCat(
        CopyMethodName(method),
        target.regular ? ": source reports size 0 or is not a regular file"
                       : ": destination is not a regular file",
        ": reading to end of file with readwrite"));
    method = CopyMethod::kReadWrite;
  }
  stats.method = method;

  // Buffers: from the caller's pool or a private one, enough for the method.
  const bool queued =
      method == CopyMethod::kUring || method == CopyMethod::kDirect;
  const bool wants_direct = method == CopyMethod::kDirect ||
                            (method == CopyMethod::kUring && options.direct_io);
  // Defaults chosen with bench/run_copy_bench (the timings are in the
  // commits that set them). Buffered preadv/pwritev: 128 KiB per call, the
  // size dd uses; larger calls were faster on a quiet machine but fell into
  // a slow mode of page-cache writes under load, where dd bs=128k did not.
  // io_uring: 128 KiB operations, several in flight; O_DIRECT: large
  // (1 MiB) requests.
  const size_t batch = BatchBuffers(options, wants_direct);
  const size_t depth = options.queue_depth != 0 ? options.queue_depth : 4;
  const size_t want = batch * (queued ? depth : 1);
  std::unique_ptr<BufferPool> private_pool;
  BufferPool* pool = options.pool;
  if (pool == nullptr) {
    PoolOptions po;
    po.buffer_size = options.buffer_size;
    po.buffer_count = want;
    po.cache_size = 0;
    absl::StatusOr<std::unique_ptr<BufferPool>> p = BufferPool::Create(po);
    if (!p.ok()) return p.status();
    private_pool = *std::move(p);
    pool = private_pool.get();
  }
  std::vector<Buffer> buffers(std::min(want, pool->capacity()));
  buffers.resize(pool->TryAcquireBulk(absl::MakeSpan(buffers)));
  if (buffers.empty()) {
    absl::StatusOr<Buffer> one = pool->Acquire(absl::Seconds(30));
    if (!one.ok()) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "no free buffer in the pool: ", dst, ": ", one.status().message()));
    }
    buffers.push_back(*std::move(one));
  }

  stats.buffer_bytes = buffers.size() * pool->buffer_size();

  Context ctx;
  ctx.in_fd = job.in;
  ctx.out_fd = target.fd;
  ctx.seekable = S_ISREG(st.st_mode);
  ctx.out_seekable = target.regular;
  ctx.src_path = src;
  ctx.dst_path = dst;
  ctx.pool = pool;
  ctx.buffers = &buffers;
  ctx.batch = batch;
  ctx.queue_depth = depth;
  ctx.stats = &stats;
  ctx.options = &options;
  ctx.total = sized ? static_cast<uint64_t>(st.st_size) : 0;
  ctx.start = start;

  if (absl::Status s = TruncateForWriting(target); !s.ok()) return s;
  absl::StatusOr<uint64_t> final_size;
  {
    std::unique_ptr<Mover> mover;
    bool direct = wants_direct;
    if (direct) {
      absl::StatusOr<bool> d =
          OpenDirect(src, target, job, stats, pool->buffer_size());
      if (!d.ok()) return d.status();
      direct = *d;
      ctx.in_direct_fd = job.in_direct;
      ctx.out_direct_fd = job.out_direct;
      if (!direct && method == CopyMethod::kDirect) {
        stats.method = method = CopyMethod::kReadWrite;
      }
    }
    stats.direct_io = direct;
    switch (method) {
      case CopyMethod::kUring:
      case CopyMethod::kDirect: {
        absl::StatusOr<std::unique_ptr<Mover>> m = MakeUringMover(ctx, direct);
        if (m.ok()) {
          mover = *std::move(m);
        } else {
          stats.fallbacks.push_back(absl::StrCat(
              "io_uring unavailable (", m.status().message(), "): using ",
              direct ? "synchronous O_DIRECT" : "readwrite"));
          if (!direct) stats.method = CopyMethod::kReadWrite;
          mover = direct ? MakeSyncDirectMover(ctx) : MakeReadWriteMover(ctx);
        }
        break;
      }
      case CopyMethod::kKernel:
        mover = MakeKernelMover(ctx);
        break;
      default:
        mover = MakeReadWriteMover(ctx);
        break;
    }
    final_size =
        sized ? CopyRanges(ctx, *mover, static_cast<uint64_t>(st.st_size),
                           static_cast<uint64_t>(st.st_blocks) * 512 <
                               static_cast<uint64_t>(st.st_size))
              : mover->Copy(0, kToEof);
  }
  // Every buffer goes back before a private pool is destroyed.
  buffers.clear();
  if (!final_size.ok()) return final_size.status();

  for (int* fd : {&job.in_direct, &job.out_direct}) {
    if (*fd >= 0) {
      const int f = std::exchange(*fd, -1);
      if (os::Sys().close(f) != 0 && errno != EINTR) {
        return IoError("close", dst, errno);
      }
    }
  }
  // The file written started empty (new, temporary or truncated); written
  // without holes and without O_DIRECT's rounded-up reservations, it has
  // its size already and needs no truncate.
  target.sized = !stats.direct_io && stats.bytes_copied == *final_size;
  if (absl::Status s = FinishTarget(st, *final_size, options, target);
      !s.ok()) {
    return s;
  }
  stats.file_size = *final_size;
  stats.elapsed = absl::Now() - start;
  return stats;
}

}  // namespace bufpool

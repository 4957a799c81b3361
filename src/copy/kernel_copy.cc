// The kernel mover: copy_file_range moves the bytes inside the kernel (and
// may reflink or offload them); sendfile where it is refused; the readwrite
// mover where both are.
#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "copy/copy_internal.h"
#include "os/file.h"
#include "os/syscalls.h"

namespace bufpool::copy_internal {
namespace {

// One call moves at most this much, so progress is reported as it goes.
constexpr size_t kMaxPerCall = size_t{64} << 20;

bool KernelRefuses(int err) {
  return err == EXDEV || err == EINVAL || err == ENOSYS || err == EOPNOTSUPP ||
         err == ENOTSUP || err == EBADF;
}

class KernelMover final : public Mover {
 public:
  explicit KernelMover(Context& ctx)
      : ctx_(ctx), mode_(ctx.sendfile_first ? kSendfile : kCopyFileRange) {}

  absl::StatusOr<uint64_t> Copy(uint64_t offset, uint64_t len) override {
    uint64_t pos = offset;
    const uint64_t end = offset + len;
    while (pos < end) {
      const size_t want = std::min<uint64_t>(kMaxPerCall, end - pos);
      ssize_t n;
      int err = 0;
      ++ctx_.stats->syscalls;
      if (mode_ == kCopyFileRange) {
        off_t in = static_cast<off_t>(pos), out = static_cast<off_t>(pos);
        n = os::Sys().copy_file_range(ctx_.in_fd, &in, ctx_.out_fd, &out, want,
                                      0);
      } else if (mode_ == kSendfile) {
        // sendfile writes at the output's file position.
        if (os::Sys().lseek(ctx_.out_fd, static_cast<off_t>(pos), SEEK_SET) <
            0) {
          return IoError("seek", ctx_.dst_path, errno);
        }
        off_t in = static_cast<off_t>(pos);
        n = os::Sys().sendfile(ctx_.out_fd, ctx_.in_fd, &in, want);
      } else {
        absl::StatusOr<uint64_t> rest = fallback_->Copy(pos, end - pos);
        if (!rest.ok()) return rest.status();
        return pos + *rest - offset;
      }
      if (n < 0) err = errno;
      if (n < 0 && err == EINTR) continue;
      if (n < 0 && KernelRefuses(err)) {
        if (absl::Status s = Demote(err); !s.ok()) return s;
        continue;
      }
      if (n < 0) {
        return IoError(mode_ == kCopyFileRange ? "copy_file_range" : "sendfile",
                       ctx_.dst_path, err);
      }
      if (n == 0) break;  // end of file
      pos += static_cast<uint64_t>(n);
      ctx_.Advance(static_cast<uint64_t>(n));
    }
    return pos - offset;
  }

 private:
  enum Mode { kCopyFileRange, kSendfile, kReadWrite };

  // The next way down; readwrite takes its buffers now when the copy
  // started without them.
  absl::Status Demote(int err) {
    const char* from = mode_ == kCopyFileRange ? "copy_file_range" : "sendfile";
    if (mode_ == kCopyFileRange) {
      mode_ = kSendfile;
    } else {
      if (ctx_.take_buffers) {
        if (absl::Status s = ctx_.take_buffers(); !s.ok()) return s;
      }
      mode_ = kReadWrite;
      fallback_ = MakeReadWriteMover(ctx_);
      ctx_.stats->method = CopyMethod::kReadWrite;
    }
    ctx_.stats->fallbacks.push_back(
        absl::StrCat(from, " refused (", std::strerror(err), "): using ",
                     mode_ == kSendfile ? "sendfile" : "readwrite"));
    return absl::OkStatus();
  }

  Context& ctx_;
  Mode mode_;
  std::unique_ptr<Mover> fallback_;
};

}  // namespace

std::unique_ptr<Mover> MakeKernelMover(Context& ctx) {
  return std::make_unique<KernelMover>(ctx);
}

}  // namespace bufpool::copy_internal

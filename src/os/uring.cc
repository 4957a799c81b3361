#include "os/uring.h"

#include <fcntl.h>
#include <liburing.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <utility>

namespace bufpool::os {
namespace {

class LiburingRing final : public Uring {
 public:
  LiburingRing() = default;
  ~LiburingRing() override {
    if (initialised_) io_uring_queue_exit(&ring_);
  }

  int Init(unsigned entries) {
    const int rc = io_uring_queue_init(entries, &ring_, 0);
    initialised_ = rc == 0;
    if (initialised_) {
      // One probe per ring: which operations this kernel has.
      if (io_uring_probe* probe = io_uring_get_probe_ring(&ring_)) {
        for (const auto& [op, code] : kOpcodes) {
          if (io_uring_opcode_supported(probe, code)) {
            supported_ |= 1u << static_cast<unsigned>(op);
          }
        }
        io_uring_free_probe(probe);
      }
    }
    return rc;
  }

  bool Supports(Op op) override {
    return (supported_ & (1u << static_cast<unsigned>(op))) != 0;
  }

  bool PrepareOpenat(int dirfd, const char* path, int flags, mode_t mode,
                     uint64_t user_data) override {
    io_uring_sqe* sqe = Next();
    if (sqe == nullptr) return false;
    io_uring_prep_openat(sqe, dirfd, path, flags | O_CLOEXEC, mode);
    io_uring_sqe_set_data64(sqe, user_data);
    return true;
  }

  bool PrepareStatx(int dirfd, const char* path, int flags, unsigned mask,
                    struct statx* out, uint64_t user_data) override {
    io_uring_sqe* sqe = Next();
    if (sqe == nullptr) return false;
    io_uring_prep_statx(sqe, dirfd, path, flags, mask, out);
    io_uring_sqe_set_data64(sqe, user_data);
    return true;
  }

  bool PrepareClose(int fd, uint64_t user_data) override {
    io_uring_sqe* sqe = Next();
    if (sqe == nullptr) return false;
    io_uring_prep_close(sqe, fd);
    io_uring_sqe_set_data64(sqe, user_data);
    return true;
  }

  bool PrepareMkdirat(int dirfd, const char* path, mode_t mode,
                      uint64_t user_data) override {
    io_uring_sqe* sqe = Next();
    if (sqe == nullptr) return false;
    io_uring_prep_mkdirat(sqe, dirfd, path, mode);
    io_uring_sqe_set_data64(sqe, user_data);
    return true;
  }

  bool PrepareSymlinkat(const char* target, int dirfd, const char* path,
                        uint64_t user_data) override {
    io_uring_sqe* sqe = Next();
    if (sqe == nullptr) return false;
    io_uring_prep_symlinkat(sqe, target, dirfd, path);
    io_uring_sqe_set_data64(sqe, user_data);
    return true;
  }

  void LinkLast(Link link) override {
    if (last_ != nullptr) {
      last_->flags |= link == Link::kHard ? IOSQE_IO_HARDLINK : IOSQE_IO_LINK;
    }
  }

  unsigned SubmissionSpace() override { return io_uring_sq_space_left(&ring_); }

  int RegisterBuffers(const iovec* iov, unsigned n) override {
    return io_uring_register_buffers(&ring_, iov, n);
  }

  int UnregisterBuffers() override {
    return io_uring_unregister_buffers(&ring_);
  }

  bool PrepareRead(int fd, void* buf, unsigned len, uint64_t offset,
                   int buf_index, uint64_t user_data) override {
    io_uring_sqe* sqe = Next();
    if (sqe == nullptr) return false;
    if (buf_index >= 0) {
      io_uring_prep_read_fixed(sqe, fd, buf, len, offset, buf_index);
    } else {
      io_uring_prep_read(sqe, fd, buf, len, offset);
    }
    io_uring_sqe_set_data64(sqe, user_data);
    return true;
  }

  bool PrepareWrite(int fd, const void* buf, unsigned len, uint64_t offset,
                    int buf_index, uint64_t user_data) override {
    io_uring_sqe* sqe = Next();
    if (sqe == nullptr) return false;
    if (buf_index >= 0) {
      io_uring_prep_write_fixed(sqe, fd, buf, len, offset, buf_index);
    } else {
      io_uring_prep_write(sqe, fd, buf, len, offset);
    }
    io_uring_sqe_set_data64(sqe, user_data);
    return true;
  }

  int SubmitAndWait(unsigned wait_nr) override {
    return io_uring_submit_and_wait(&ring_, wait_nr);
  }

  bool PopCompletion(Completion* out) override {
    io_uring_cqe* cqe = nullptr;
    if (io_uring_peek_cqe(&ring_, &cqe) != 0 || cqe == nullptr) return false;
    out->user_data = io_uring_cqe_get_data64(cqe);
    out->res = cqe->res;
    io_uring_cqe_seen(&ring_, cqe);
    return true;
  }

 private:
  static constexpr std::pair<Op, int> kOpcodes[] = {
      {Op::kRead, IORING_OP_READ},
      {Op::kWrite, IORING_OP_WRITE},
      {Op::kReadFixed, IORING_OP_READ_FIXED},
      {Op::kWriteFixed, IORING_OP_WRITE_FIXED},
      {Op::kOpenat, IORING_OP_OPENAT},
      {Op::kStatx, IORING_OP_STATX},
      {Op::kClose, IORING_OP_CLOSE},
      {Op::kMkdirat, IORING_OP_MKDIRAT},
      {Op::kSymlinkat, IORING_OP_SYMLINKAT}};

  // A fresh submission entry (remembered for LinkLast), or null when the
  // queue is full. The prep functions clear its flags; LinkLast sets them
  // after.
  io_uring_sqe* Next() {
    io_uring_sqe* sqe = io_uring_get_sqe(&ring_);
    last_ = sqe;
    return sqe;
  }

  io_uring ring_{};
  io_uring_sqe* last_ = nullptr;
  unsigned supported_ = 0;
  bool initialised_ = false;
};

}  // namespace

int CreateUring(unsigned entries, std::unique_ptr<Uring>* out) {
  auto ring = std::make_unique<LiburingRing>();
  const int rc = ring->Init(entries);
  if (rc < 0) return rc;
  *out = std::move(ring);
  return 0;
}

namespace {

// liburing 2.3 declares io_uring_enable_rings() but does not export it.
int EnableRings(int ring_fd) {
  return ::syscall(__NR_io_uring_register, ring_fd,
                   IORING_REGISTER_ENABLE_RINGS, nullptr, 0) < 0
             ? -errno
             : 0;
}

constexpr UringSyscallTable kRealUring = {
    .uring_create = CreateUring,
    .uring_queue_init_params = ::io_uring_queue_init_params,
    .uring_enable_rings = EnableRings,
};

// Relaxed, as os/syscalls.cc's table: installed before the threads that use
// it start, so thread creation already orders the store.
std::atomic<const UringSyscallTable*> g_uring_table{&kRealUring};

}  // namespace

const UringSyscallTable& RealUringSyscalls() { return kRealUring; }

const UringSyscallTable& UringSys() {
  return *g_uring_table.load(std::memory_order_relaxed);
}

ScopedUringSyscalls::ScopedUringSyscalls(const UringSyscallTable* table)
    : previous_(g_uring_table.exchange(table, std::memory_order_relaxed)) {}

ScopedUringSyscalls::~ScopedUringSyscalls() {
  g_uring_table.store(previous_, std::memory_order_relaxed);
}

}  // namespace bufpool::os

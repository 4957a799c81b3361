#include "os/uring.h"

#include <liburing.h>

#include <cerrno>

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
    return rc;
  }

  int RegisterBuffers(const iovec* iov, unsigned n) override {
    return io_uring_register_buffers(&ring_, iov, n);
  }

  int UnregisterBuffers() override {
    return io_uring_unregister_buffers(&ring_);
  }

  bool PrepareRead(int fd, void* buf, unsigned len, uint64_t offset,
                   int buf_index, uint64_t user_data) override {
    io_uring_sqe* sqe = io_uring_get_sqe(&ring_);
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
    io_uring_sqe* sqe = io_uring_get_sqe(&ring_);
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
  io_uring ring_{};
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

}  // namespace bufpool::os

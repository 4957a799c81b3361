// The io_uring helpers the tests share (test_util.h is for every test; this
// one only for those that link liburing): one definition each.
#ifndef BUFPOOL_TEST_URING_TEST_UTIL_H_
#define BUFPOOL_TEST_URING_TEST_UTIL_H_

#include <liburing.h>

#include <cstdint>

#include "absl/status/status.h"
#include "bufpool/chain.h"
#include "bufpool/uring.h"
#include "gtest/gtest.h"

namespace bufpool::testing_util {

// An io_uring instance for one test, torn down with it. `entries` submission
// entries; `cq_entries` completion entries (IORING_SETUP_CQSIZE), or 0 for
// the kernel's default of twice `entries`. ok() is false when the ring could
// not be set up (the test asserts it). Not thread-safe, as io_uring is not.
class Ring {
 public:
  explicit Ring(unsigned entries = 1024, unsigned cq_entries = 16384) {
    io_uring_params p{};
    if (cq_entries != 0) {
      p.flags = IORING_SETUP_CQSIZE;
      p.cq_entries = cq_entries;
    }
    ok_ = io_uring_queue_init_params(entries, &ring_, &p) == 0;
  }
  Ring(const Ring&) = delete;
  Ring& operator=(const Ring&) = delete;
  ~Ring() {
    if (ok_) io_uring_queue_exit(&ring_);
  }
  io_uring* get() { return &ring_; }
  bool ok() const { return ok_; }
  // A free submission entry, submitting what is queued until one frees up.
  io_uring_sqe* Sqe() {
    io_uring_sqe* sqe = io_uring_get_sqe(&ring_);
    while (sqe == nullptr) {
      io_uring_submit(&ring_);
      sqe = io_uring_get_sqe(&ring_);
    }
    return sqe;
  }
  // Marks every completion that has arrived as seen.
  void DropCompletions() {
    io_uring_cqe* cqe;
    while (io_uring_peek_cqe(&ring_, &cqe) == 0) io_uring_cqe_seen(&ring_, cqe);
  }

 private:
  io_uring ring_{};
  bool ok_ = false;
};

// What SubmitAndTakeOne found: the completion's res and flags, and
// Take()'s status.
struct TakenCompletion {
  int res = 0;
  uint32_t flags = 0;
  absl::Status status;
};

// Submits, waits for one completion and takes it into `out` through `br`.
// A failed submit or an empty queue fails the test (call through
// ASSERT_NO_FATAL_FAILURE).
inline void SubmitAndTakeOne(Ring& ring, ProvidedBufferRing& br,
                             BufferChain& out, TakenCompletion* taken) {
  ASSERT_GE(io_uring_submit_and_wait(ring.get(), 1), 0);
  io_uring_cqe* cqe;
  ASSERT_EQ(io_uring_peek_cqe(ring.get(), &cqe), 0);
  taken->res = cqe->res;
  taken->flags = cqe->flags;
  taken->status = br.Take(*cqe, out);
  io_uring_cqe_seen(ring.get(), cqe);
}

}  // namespace bufpool::testing_util

#endif  // BUFPOOL_TEST_URING_TEST_UTIL_H_

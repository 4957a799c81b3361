// ParkedReceives: the out-of-line parts (bufpool/uring.h).
#include <liburing.h>
#include <sys/eventfd.h>

#include <algorithm>

#include "bufpool/uring.h"
#include "os/socket.h"

namespace bufpool {

absl::StatusOr<std::unique_ptr<ParkedReceives>> ParkedReceives::Create(
    ProvidedBufferRing& ring) {
  absl::StatusOr<int> efd = os::EventFd(0, EFD_CLOEXEC);
  if (!efd.ok()) return efd.status();
  return std::unique_ptr<ParkedReceives>(new ParkedReceives(ring, *efd));
}

ParkedReceives::~ParkedReceives() {
  // A pending notice: the pool may still write to the eventfd (see the
  // class comment), so it stays open.
  if (!notice_pending_) os::CloseSocket(efd_).IgnoreError();  // close(2)
}

bool ParkedReceives::Remove(void* who) {
  auto it = std::find(parked_.begin(), parked_.end(), who);
  if (it == parked_.end()) return false;
  parked_.erase(it);
  return true;
}

void ParkedReceives::AskForNotice(io_uring* uring, uint64_t notice_user_data) {
  io_uring_sqe* sqe = io_uring_get_sqe(uring);
  if (sqe == nullptr) {  // the SQ is full: make room, then try once more
    io_uring_submit(uring);
    sqe = io_uring_get_sqe(uring);
    if (sqe == nullptr) return;  // the next Rearm() tries again
  }
  if (!ring_->pool().NotifyWhenFree(efd_).ok()) {
    // Only a negative fd is refused, which efd_ is not; leave the sqe a NOP
    // that completes with the notice's user_data, as a notice would.
    io_uring_prep_nop(sqe);
  } else {
    io_uring_prep_read(sqe, efd_, &value_, sizeof(value_), 0);
  }
  io_uring_sqe_set_data64(sqe, notice_user_data);
  notice_pending_ = true;
}

}  // namespace bufpool

// HeldSend: a send of a chain that keeps its bytes until the kernel is done.
#include <liburing.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <utility>

#include "bufpool/internal/shared_access.h"
#include "bufpool/uring.h"

namespace bufpool {

void HeldSend::DieBusy() {
  std::fprintf(stderr,
               "bufpool: HeldSend destroyed while the kernel may still "
               "read its bytes (wait for done())\n");
  std::abort();
}

// Holder tracking (bufpool/holders.h): the slots of `chain` are held as
// `note` says (in a send in flight, or no longer). Nothing where the pool
// keeps no records.
static void NoteSlices(const BufferChain& chain, uint32_t note) {
  if (chain.pool() == nullptr ||
      !internal::SharedAccess::Tracked(*chain.pool())) {
    return;
  }
  for (size_t i = 0; i < chain.slice_count(); ++i) {
    const SharedBuffer& s = chain.slice(i);
    internal::SharedAccess::NoteHeld(*s.pool(), s.slot(), note);
  }
}

// True when a slice of `chain` is a shared pool's (PoolOptions::shared).
// Such a slot must not stay in the kernel's hands past this process's
// death: a zero-copy send leaves its pages in the socket's send and
// retransmit queues until the peer acknowledges them, while another
// process's ReclaimDead() frees the slot as soon as this process's
// liveness lock drops, and the slot's next owner writes into bytes TCP may
// still (re)transmit. A copying send is done with the pages at its
// completion.
static bool HasSharedSlice(const BufferChain& chain) {
  for (size_t i = 0; i < chain.slice_count(); ++i) {
    const BufferPool* pool = chain.slice(i).pool();
    if (pool != nullptr && pool->shared_fd() >= 0) return true;
  }
  return false;
}

void HeldSend::Prepare(io_uring_sqe* sqe, int fd, BufferChain&& chain,
                       const Options& options) {
  if (busy() || chain.empty()) {
    std::fprintf(stderr, "bufpool: HeldSend::Prepare %s\n",
                 busy() ? "while a send is in flight" : "of an empty chain");
    std::abort();
  }
  const size_t want = std::min(chain.slice_count(), kMaxIovecs);
  if (want > iov_cap_) {
    size_t cap = std::max<size_t>(iov_cap_, 4);
    while (cap < want) cap *= 2;
    cap = std::min(cap, kMaxIovecs);
    iov_.reset(new iovec[cap]);  // the only step that can throw
    iov_cap_ = cap;
  }
  chain_ = std::move(chain);
  // Empty, of the sent chain's pool: what a complete send leaves for
  // TakeUnsent() (a partial or failed one moves chain_'s rest in). Keeps
  // unsent_'s grown ring, if any.
  unsent_ =
      chain_.pool() != nullptr ? BufferChain(*chain_.pool()) : BufferChain();
  result_ = 0;
  // A shared pool's slices fall back to a copying send (see above).
  zero_copy_ = options.zero_copy && !HasSharedSlice(chain_);
  await_notif_ = false;
  const size_t k = chain_.FillIovecs(absl::MakeSpan(iov_.get(), iov_cap_));
  NoteSlices(chain_, internal::kHeldSending);
  requested_ = 0;
  for (size_t i = 0; i < k; ++i) requested_ += iov_[i].iov_len;
  if (k == 1) {
    // One slice: a plain send spares the kernel importing a msghdr.
    void* base = iov_[0].iov_base;
    const size_t len = iov_[0].iov_len;
    if (!zero_copy_) {
      io_uring_prep_send(sqe, fd, base, len, options.msg_flags);
    } else if (const int index =
                   options.fixed != nullptr ? options.fixed->IndexOf(base) : -1;
               index >= 0) {
      io_uring_prep_send_zc_fixed(sqe, fd, base, len, options.msg_flags, 0,
                                  static_cast<unsigned>(index));
    } else {
      io_uring_prep_send_zc(sqe, fd, base, len, options.msg_flags, 0);
    }
  } else {
    msg_ = {};
    msg_.msg_iov = iov_.get();
    msg_.msg_iovlen = k;
    if (zero_copy_) {
      io_uring_prep_sendmsg_zc(sqe, fd, &msg_, options.msg_flags);
    } else {
      io_uring_prep_sendmsg(sqe, fd, &msg_, options.msg_flags);
    }
  }
  state_ = State::kSent;
}

bool HeldSend::OnCompletion(const io_uring_cqe& cqe) {
  if ((cqe.flags & IORING_CQE_F_NOTIF) != 0) {
    // The kernel no longer references the pages: drop what was sent.
    if (state_ == State::kResult && await_notif_) {
      NoteSlices(chain_, internal::kHeldAsAcquired);
      chain_.Clear();
      state_ = State::kDone;
    }
    return done();
  }
  if (state_ != State::kSent) return done();
  result_ = cqe.res;
  // The sent bytes stay held; the rest is the caller's again.
  if (result_ > 0) {
    const size_t sent = std::min(static_cast<size_t>(result_), requested_);
    if (sent < chain_.size()) {
      BufferChain held = chain_.Split(sent);
      unsent_ = std::move(chain_);
      chain_ = std::move(held);
    }  // else all of it was sent: chain_ holds exactly the sent bytes
  } else {
    unsent_ = std::move(chain_);
    chain_ = BufferChain();
  }
  NoteSlices(unsent_, internal::kHeldAsAcquired);
  NoteSlices(chain_, internal::kHeldSending);  // a slot split between them
  state_ = State::kResult;
  // A zero-copy send whose first completion has F_MORE has a notification
  // to come; until it does, the network stack may still read the pages.
  await_notif_ = zero_copy_ && (cqe.flags & IORING_CQE_F_MORE) != 0;
  if (!await_notif_) {
    NoteSlices(chain_, internal::kHeldAsAcquired);
    chain_.Clear();
    state_ = State::kDone;
  }
  return done();
}

BufferChain HeldSend::TakeUnsent() { return std::move(unsent_); }

void HeldSend::PrependUnsent(BufferChain& queue) {
  // The rest first, then the queue's bytes; both chains' slice rings are
  // kept (move assignment swaps grown rings), so a connection that resumes
  // sends allocates only while growing.
  unsent_.Append(std::move(queue));  // all or nothing
  queue = std::move(unsent_);
}

}  // namespace bufpool

// AdmissionQueue and Admission (bufpool/admission.h).
//
// The queue is an intrusive doubly linked FIFO of the Admissions that wait,
// and a count of the buffers granted, both under one mutex. Invariants,
// under mu_:
//   1. granted_ <= capacity_, and granted_ is the sum of buffers_ over the
//      Admissions in state kGranted with queue_ == this;
//   2. the list holds exactly the Admissions in state kWaiting with
//      queue_ == this, oldest first; waiting_ is its length;
//   3. after any call returns, the head (if any) does not fit:
//      head_->buffers_ > capacity_ - granted_ (GrantWaiting() runs after
//      every change that frees buffers). So a request never overtakes an
//      earlier one: FIFO across budgets, and a large request is not starved
//      by a stream of small ones.
// state_ is written under mu_ with release order and read with acquire by
// the Admission's owner, which may poll granted() without the lock.
#include "bufpool/admission.h"

#include <cstdio>
#include <cstdlib>
#include <utility>

#include "absl/strings/str_cat.h"

namespace bufpool {

absl::StatusOr<std::unique_ptr<AdmissionQueue>> AdmissionQueue::Create(
    BufferPool& pool, const AdmissionOptions& o) {
  const std::string who = absl::StrCat("AdmissionQueue(\"", o.name, "\")");
  if (o.slack_buffers > 64) {
    return absl::InvalidArgumentError(
        absl::StrCat(who, ": slack_buffers ", o.slack_buffers,
                     " is more than 64; a chain pins at most 2 buffers past "
                     "its bytes"));
  }
  const size_t free = internal::UncommittedBuffers(pool);
  const size_t promised = pool.capacity() - free;
  size_t capacity = o.capacity_buffers != 0 ? o.capacity_buffers : free;
  if (capacity == 0 || capacity > free) {
    return absl::ResourceExhaustedError(absl::StrCat(
        who, ": ",
        o.capacity_buffers != 0
            ? absl::StrCat("capacity_buffers ", o.capacity_buffers)
            : std::string("an automatic capacity"),
        " does not fit the pool (", pool.capacity(), " buffers, ", promised,
        " already promised to budgets' reservations, rings and admission "
        "queues, ",
        free, " left); lower capacity_buffers to at most ", free,
        ", or the rings' max_buffers or reservations, or grow the pool"));
  }
  // Commits as a ring's lending does, so that rings and reservations made
  // later are checked against it too; a race with another commitment since
  // UncommittedBuffers() is refused here, with its numbers.
  absl::Status committed = internal::CommitLending(
      pool, capacity, who, internal::Commitment::kAdmissionQueue);
  if (!committed.ok()) return committed;

  std::unique_ptr<AdmissionQueue> q(new AdmissionQueue);
  q->pool_ = &pool;
  q->name_ = o.name;
  q->buffer_size_ = pool.buffer_size();
  q->slack_ = o.slack_buffers;
  q->capacity_ = capacity;
  return q;
}

AdmissionQueue::~AdmissionQueue() {
  size_t live;
  {
    std::lock_guard<std::mutex> lock(mu_);
    live = live_;
  }
  if (live != 0) {
    std::fprintf(stderr,
                 "bufpool: admission queue \"%s\" destroyed while %zu "
                 "admissions wait or hold grants (Reset() them first)\n",
                 name_.c_str(), live);
    std::abort();
  }
  internal::UncommitLending(*pool_, capacity_,
                            internal::Commitment::kAdmissionQueue);
}

absl::StatusOr<bool> AdmissionQueue::Request(const BufferBudget& budget,
                                             size_t bytes, Admission& admission,
                                             std::function<void()> on_grant) {
  if (&budget.pool() != pool_) {
    return absl::InvalidArgumentError(
        absl::StrCat("AdmissionQueue(\"", name_, "\"): budget \"",
                     budget.name(), "\" belongs to another pool"));
  }
  if (admission.state() != Admission::kIdle) {
    return absl::FailedPreconditionError(absl::StrCat(
        "AdmissionQueue(\"", name_, "\"): budget \"", budget.name(),
        "\" asked for ", bytes, " bytes with an Admission that already ",
        admission.waiting() ? "waits" : "holds a grant",
        " (Reset() it first)"));
  }
  const size_t want = BuffersFor(bytes);
  const size_t want_bytes = want * buffer_size_;
  if (want_bytes > budget.max_bytes()) {
    refusals_.fetch_add(1, std::memory_order_relaxed);
    return absl::ResourceExhaustedError(
        absl::StrCat("AdmissionQueue(\"", name_, "\"): budget \"",
                     budget.name(), "\" can never be granted ", bytes,
                     " bytes: they count ", want, " buffers (", want_bytes,
                     " bytes with ", slack_, " of slack), over its max_bytes ",
                     budget.max_bytes(), "; raise max_bytes to at least ",
                     want_bytes, " or lower the largest message"));
  }
  if (want > capacity_) {
    refusals_.fetch_add(1, std::memory_order_relaxed);
    return absl::ResourceExhaustedError(absl::StrCat(
        "AdmissionQueue(\"", name_, "\"): budget \"", budget.name(),
        "\" can never be granted ", bytes, " bytes: they count ", want,
        " buffers (with ", slack_, " of slack), over the queue's capacity of ",
        capacity_, " (pool of ", pool_->capacity(),
        " buffers); raise capacity_buffers or the pool's buffers, or lower "
        "the largest message"));
  }
  std::lock_guard<std::mutex> lock(mu_);
  admission.queue_ = this;
  admission.budget_ = &budget;
  admission.bytes_ = bytes;
  admission.buffers_ = want;
  ++live_;
  // relaxed: statistics, read as a moment's values.
  if (head_ == nullptr && want <= capacity_ - granted_) {
    granted_ += want;
    admission.state_.store(Admission::kGranted, std::memory_order_release);
    grants_.fetch_add(1, std::memory_order_relaxed);
    PublishCounts();
    return true;
  }
  admission.on_grant_ = std::move(on_grant);
  admission.since_ = absl::Now();
  admission.prev_ = tail_;
  admission.next_ = nullptr;
  (tail_ != nullptr ? tail_->next_ : head_) = &admission;
  tail_ = &admission;
  ++waiting_;
  admission.state_.store(Admission::kWaiting, std::memory_order_release);
  waited_.fetch_add(1, std::memory_order_relaxed);
  if (waiting_ > longest_queue_.load(std::memory_order_relaxed)) {
    longest_queue_.store(waiting_, std::memory_order_relaxed);
  }
  PublishCounts();
  return false;
}

void AdmissionQueue::Unlink(Admission* a) {
  (a->prev_ != nullptr ? a->prev_->next_ : head_) = a->next_;
  (a->next_ != nullptr ? a->next_->prev_ : tail_) = a->prev_;
  a->prev_ = a->next_ = nullptr;
  --waiting_;
}

void AdmissionQueue::GrantWaiting() {
  while (head_ != nullptr && head_->buffers_ <= capacity_ - granted_) {
    Admission* a = head_;
    Unlink(a);
    granted_ += a->buffers_;
    // release: pairs with granted()'s acquire on the owner's thread.
    a->state_.store(Admission::kGranted, std::memory_order_release);
    grants_.fetch_add(1, std::memory_order_relaxed);
    // Under the lock, so that a Reset() on the owner's thread either runs
    // before this (and the callback never runs) or after it returns.
    std::function<void()> cb = std::move(a->on_grant_);
    a->on_grant_ = nullptr;
    if (cb) cb();
  }
  PublishCounts();
}

void AdmissionQueue::PublishCounts() {
  // relaxed: moment's values for readers on other threads.
  queue_length_.store(waiting_, std::memory_order_relaxed);
  granted_count_.store(granted_, std::memory_order_relaxed);
}

AdmissionStats AdmissionQueue::Stats() const {
  return {capacity_,
          granted_count_.load(std::memory_order_relaxed),
          queue_length_.load(std::memory_order_relaxed),
          longest_queue_.load(std::memory_order_relaxed),
          grants_.load(std::memory_order_relaxed),
          waited_.load(std::memory_order_relaxed),
          refusals_.load(std::memory_order_relaxed)};
}

absl::Duration AdmissionQueue::oldest_wait() const {
  std::lock_guard<std::mutex> lock(mu_);
  return head_ == nullptr ? absl::ZeroDuration() : absl::Now() - head_->since_;
}

void Admission::Shrink(size_t bytes) {
  AdmissionQueue* q = queue_;
  if (q == nullptr) return;
  std::lock_guard<std::mutex> lock(q->mu_);
  if (state_.load(std::memory_order_relaxed) != kGranted) return;
  const size_t keep = bytes == 0 ? 0 : q->BuffersFor(bytes);
  if (keep >= buffers_) return;
  q->granted_ -= buffers_ - keep;
  buffers_ = keep;
  bytes_ = bytes;
  q->GrantWaiting();
}

void Admission::Reset() {
  AdmissionQueue* q = queue_;
  if (q == nullptr) return;
  std::lock_guard<std::mutex> lock(q->mu_);
  if (state_.load(std::memory_order_relaxed) == kWaiting) {
    const bool was_head = q->head_ == this;
    q->Unlink(this);
    on_grant_ = nullptr;
    // A large head that leaves may let smaller ones behind it in.
    if (was_head) q->GrantWaiting();
  } else {
    q->granted_ -= buffers_;
    q->GrantWaiting();
  }
  --q->live_;
  q->PublishCounts();
  state_.store(kIdle, std::memory_order_release);
  queue_ = nullptr;
  budget_ = nullptr;
  bytes_ = buffers_ = 0;
}

}  // namespace bufpool

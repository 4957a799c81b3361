// libbufpool: admission, so that a server on a bounded pool keeps making
// progress under memory pressure without admission code of its own.
//
// A connection that wants memory for a message (the rest of a frame whose
// length a splitter has read, LengthPrefixSplitter::FrameSize()) asks the
// pool's AdmissionQueue for it, all or nothing. The queue grants requests
// first come, first served across every budget of the pool, out of a
// capacity it has committed against the pool when it was created; a request
// that does not fit waits, pinning nothing more, and is granted when grants
// given back free enough. A connection receives only what it was granted
// (cap its receive at the grant: ProvidedBufferRing::RecvOptions::max_bytes,
// or a read's length), so every message that has started can finish, and
// the pool never runs dry under connections that each wait for the others.
//
//   auto queue = bufpool::AdmissionQueue::Create(*pool, {.name = "frames"});
//   // per connection: a budget, and an Admission (its place in the queue)
//   size_t frame = **splitter.FrameSize(conn.in);       // header read
//   auto now = (*queue)->Request(*conn.budget, frame, conn.admission,
//                                [&conn, &ready] { ready.push_back(&conn); });
//   if (!now.ok()) Close(conn);                 // can never fit: the message
//   else if (*now) ArmReceive(conn, frame - conn.in.size());   // granted
//   // else: waiting; the callback runs when granted, then arm the receive
//   ... once the frame's reply is sent:  conn.admission.Reset();
//
// Sizing: a grant of B bytes counts ceil(B / buffer_size) + slack_buffers
// buffers (a chain that holds B bytes pins at most B + 2 buffers,
// docs/uring.md). The queue's capacity, the pool's rings' max_buffers and
// the budgets' reservations together may not exceed the pool: each is
// checked when it is created and refused with the numbers. What progress
// needs of them is in docs/uring.md ("Sizing a bounded server").
//
// Thread safety. An AdmissionQueue may be used from any threads at once: a
// mutex guards its FIFO and counts (held for O(1) work, plus one on_grant
// call per request it grants). An Admission is used by one thread at a time
// (its connection's), except that the queue marks it granted from whatever
// thread gave back memory. on_grant runs on that thread, under the queue's
// lock: it must be short and must not call the queue or any Admission (set
// a flag, push onto a list, write an eventfd: see below); once Reset() or
// ~Admission() has returned it does not run. It may still be running when
// granted() turns true: declare what it touches before the Admission (so
// ~Admission(), which waits for it, runs first), and do not take in it a
// lock that a thread may hold while it calls Reset() or Shrink() (it runs
// on that thread). queue_length(), Stats() and Admission::granted() may be
// read from any thread at any time.
//
// For a loop on another thread (io_uring or epoll), on_grant writes an
// eventfd the loop waits on, and the loop then looks at its waiting
// connections' granted(); for a loop on the releasing thread itself (a
// single-threaded server), on_grant may queue the connection for the loop's
// next turn directly.
//
// Ownership. The caller owns the queue (unique_ptr) and each Admission (a
// member of its connection). An Admission may not be moved (the queue points
// to it while it waits). Every Admission must be Reset() or destroyed
// before its queue (~AdmissionQueue aborts, naming the queue and the count,
// while any waits or holds a grant), and the queue before its pool.
#ifndef BUFPOOL_ADMISSION_H_
#define BUFPOOL_ADMISSION_H_

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "bufpool/budget.h"
#include "bufpool/buffer_pool.h"
#include "bufpool/export.h"
#include "bufpool/metrics.h"

namespace bufpool {

struct AdmissionOptions {
  // Appears in refusals, reports and Stats().
  std::string name = "admission";
  // The most buffers granted at once. 0: all the pool has not promised to
  // budgets' reservations and to rings when Create() runs. Committed
  // against the pool like a ring's lending (a ring or reservation created
  // later must fit beside it; the pool's refusals count it with what rings
  // may lend).
  size_t capacity_buffers = 0;
  // Buffers a grant counts beyond its bytes' own: what a chain may pin past
  // its bytes (a partly consumed first buffer, a partly filled last one).
  size_t slack_buffers = 2;
};

struct AdmissionStats {
  size_t capacity_buffers;  // as resolved
  size_t granted_buffers;   // held by grants now
  size_t queue_length;      // requests waiting now
  size_t longest_queue;     // the most that have waited at once
  uint64_t grants;          // requests granted, at once or after waiting
  uint64_t waited;          // of those, the ones that waited
  uint64_t refusals;        // requests refused (they could never fit)
};

class AdmissionQueue;

// One requester's place in an AdmissionQueue: idle, waiting, or holding a
// grant (see the file comment for threads and ownership).
class BUFPOOL_EXPORT Admission {
 public:
  Admission() = default;
  ~Admission() { Reset(); }
  Admission(const Admission&) = delete;
  Admission& operator=(const Admission&) = delete;

  // Waiting in the queue for a grant.
  bool waiting() const { return state() == kWaiting; }
  // Holding a grant (any thread; acquire: what on_grant's thread did before
  // granting is visible after granted() returns true).
  bool granted() const { return state() == kGranted; }
  // The bytes asked for (0 when idle), and the buffers they count.
  size_t bytes() const { return bytes_; }
  size_t buffers() const { return buffers_; }

  // Keeps of the grant only what `bytes` more need (the rest of a message
  // being sent, say), giving the surplus back; no-op unless granted or when
  // it would not shrink. Gives back every buffer at 0 (still granted).
  void Shrink(size_t bytes);
  // Gives the grant back, or leaves the queue; then idle. Requests that the
  // freed buffers now fit are granted (their on_grant runs on this thread).
  void Reset();

 private:
  friend class AdmissionQueue;
  enum State : uint8_t { kIdle, kWaiting, kGranted };
  State state() const { return state_.load(std::memory_order_acquire); }

  AdmissionQueue* queue_ = nullptr;  // set while waiting or granted
  const BufferBudget* budget_ = nullptr;
  size_t bytes_ = 0;
  size_t buffers_ = 0;
  std::function<void()> on_grant_;
  absl::Time since_;           // when it began to wait
  Admission* prev_ = nullptr;  // the FIFO, guarded by the queue's mutex
  Admission* next_ = nullptr;
  std::atomic<State> state_{kIdle};
};

// First come, first served admission of memory across a pool's budgets
// (see the file comment). Made by Create(); not copyable or movable.
class BUFPOOL_EXPORT AdmissionQueue {
 public:
  // Commits the capacity against the pool. Errors, nothing changed:
  // InvalidArgument for slack_buffers over 64; ResourceExhausted, naming the
  // pool's buffers, what budgets and rings hold and what to lower, when the
  // capacity does not fit (or, for 0, nothing is left).
  static absl::StatusOr<std::unique_ptr<AdmissionQueue>> Create(
      BufferPool& pool, const AdmissionOptions& options = {});
  // Aborts while an Admission waits or holds a grant; gives the capacity
  // back to the pool.
  ~AdmissionQueue();
  AdmissionQueue(const AdmissionQueue&) = delete;
  AdmissionQueue& operator=(const AdmissionQueue&) = delete;

  // Asks for `bytes` for `budget`'s chains, with `admission` (idle) as the
  // place in the queue. true: granted now (nobody waits and the capacity
  // has room; on_grant does not run). false: waiting, in FIFO order behind
  // earlier requests; on_grant runs once when it is granted. Errors,
  // nothing queued: FailedPrecondition when `admission` is not idle;
  // ResourceExhausted when the request could never be granted: its buffers
  // exceed the budget's max_bytes or the queue's capacity (the message
  // names the budget, the numbers and what to raise or lower); a
  // `budget` of another pool: InvalidArgument.
  absl::StatusOr<bool> Request(const BufferBudget& budget, size_t bytes,
                               Admission& admission,
                               std::function<void()> on_grant);

  // The buffers a grant of `bytes` counts: ceil(bytes / buffer_size) +
  // slack_buffers.
  size_t BuffersFor(size_t bytes) const {
    return (bytes + buffer_size_ - 1) / buffer_size_ + slack_;
  }
  // Requests waiting now (any thread; a moment's value).
  size_t queue_length() const {
    return queue_length_.load(std::memory_order_relaxed);
  }
  // How long the oldest waiting request has waited (zero when none): a
  // server that sees it grow past what a message takes knows that grant
  // holders have stopped moving (peers that stop mid-message or never read)
  // and may close the ones that stalled. Any thread; takes the lock.
  absl::Duration oldest_wait() const;
  size_t capacity_buffers() const { return capacity_; }
  const std::string& name() const { return name_; }
  BufferPool& pool() const { return *pool_; }
  AdmissionStats Stats() const;  // any thread

 private:
  friend class Admission;
  AdmissionQueue() = default;
  // Grants waiting requests in order while the head fits; under mu_.
  void GrantWaiting();
  void Unlink(Admission* a);
  void PublishCounts();  // the relaxed copies Stats() reads; under mu_

  BufferPool* pool_ = nullptr;
  std::string name_;
  size_t buffer_size_ = 1;
  size_t slack_ = 0;
  size_t capacity_ = 0;

  mutable std::mutex mu_;
  // Guarded by mu_: the FIFO (head_ oldest) and the buffers granted.
  Admission* head_ = nullptr;
  Admission* tail_ = nullptr;
  size_t waiting_ = 0;
  size_t granted_ = 0;
  size_t live_ = 0;  // Admissions waiting or granted
  // Written under mu_, read by Stats() and queue_length() on any thread.
  std::atomic<size_t> queue_length_{0};
  std::atomic<size_t> granted_count_{0};
  std::atomic<size_t> longest_queue_{0};
  std::atomic<uint64_t> grants_{0};
  std::atomic<uint64_t> waited_{0};
  std::atomic<uint64_t> refusals_{0};
};

// Appends the queue's families to *out, in the Prometheus text format of
// bufpool/metrics.h (labels: pool, and queue="<its name>"), from one
// Stats() and one oldest_wait(); any thread:
//   bufpool_admission_queue_length, bufpool_admission_oldest_wait_seconds,
//   bufpool_admission_granted_buffers, bufpool_admission_capacity_buffers
//                                                       gauges
//   bufpool_admission_grants_total, bufpool_admission_waited_total,
//   bufpool_admission_refusals_total                    counters
BUFPOOL_EXPORT void WriteMetrics(const AdmissionQueue& queue, std::string* out,
                                 const MetricsOptions& options = {});

}  // namespace bufpool

#endif  // BUFPOOL_ADMISSION_H_

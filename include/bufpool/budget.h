// libbufpool: budgets, a named share of one pool's buffers for one consumer
// (a connection, a tenant, a stage of a pipeline).
//
//   auto budget = pool->CreateBudget({.name = "conn 7",
//                                     .max_bytes = 64 * 4096,
//                                     .high_watermark = 48 * 4096,
//                                     .low_watermark = 24 * 4096,
//                                     .on_high = [&] { conn.PauseReading(); },
//                                     .on_low = [&] { conn.ResumeReading(); },
//                                     .reserved_bytes = 2 * 4096});
//   bufpool::BufferChain input(**budget), output(**budget);
//
// PauseReading() and ResumeReading() are the caller's own: the library never
// stops a receive (for an io_uring one, ProvidedBufferRing says how).
//
// Accounting. A budget is charged for what its chains (BufferChain(
// BufferBudget&)) keep out of the pool, by these rules:
//   - A buffer counts buffer_size once for the budget, however many of its
//     chains hold slices of it (an input chain and the reply that links
//     its bytes; Split(); Clone()): the first chain of the budget to link
//     it charges it, the last to let go releases it.
//   - A buffer that another budget already counts is that budget's alone:
//     linking it charges nothing (when that budget lets go, the next link
//     of it by this one counts it). So a buffer is counted by at most one
//     budget, and a budget is not charged for bytes another one pays for.
//   - A slice of a ReceivePack's shared buffer (a short partial received
//     with copy_below) counts its bytes rounded up to 64
//     (BufferChain::kPackGranule), per run of such slices in each chain
//     that holds one, not the buffer the pack shares among connections.
//   - Receiving into a chain's tail room charges nothing.
// A budget's chains and slot records live beside the pool's reference
// counts (one word a slot; internal/shared_access.h), so a bound chain pays
// a load and a store of that word per buffer it starts or stops holding.
//
// Invariant (asserted by the chain fuzz target after every step and by the
// tests): the sum over a pool's budgets of pinned_bytes() never exceeds
// the bytes of the distinct non-pack buffers their chains hold plus, for
// each chain, its packed runs rounded up to 64. Hence it never exceeds the
// pool bytes out for their chains plus buffer_size per budget while no
// budget's chains hold more than buffer_size / 64 packed runs of one pack
// buffer (which only Clone() or many small splits of a packed partial
// make). And high_water_bytes <= max_bytes, given the arming rule below. A
// chain's pinned_bytes() says what that chain alone would keep out; the
// budget's is what its chains keep out together.
//
// The cap. pinned_bytes() never passes max_bytes through any call that
// takes memory from the pool on the budget's behalf before the bytes move:
// Append(bytes), AppendPacked() and Compact() refuse (nothing taken or
// changed),
// ReadFrom() and AsioReadBuffers(chain, ...) read only into buffers the
// budget has room for, and ProvidedBufferRing::Take() packs or links into
// an empty chain only with room for a buffer. Linking (Append of a
// SharedBuffer, a Buffer or a chain; Split(); Clone()) takes nothing from
// the pool: it cannot fail, and it claims a buffer no budget counts only
// while the budget has room for it (otherwise the buffer stays as it was,
// counted by none), so it never passes the cap either; packed bytes that
// arrive with no room are likewise counted only as far as there is room,
// the rest at a later recount. One way remains:
// bytes the kernel or an Asio read has already written into pool buffers
// (a ring completion that cannot go into the tail's room, pack or an empty
// chain with room; AsioReadBuffers(pool, ...)::CommitTo()) are kept and
// charged even past max_bytes, and the call returns ResourceExhausted. The
// rule that keeps high_water_bytes <= max_bytes there too: arm such a
// receive for a bound chain only while room_bytes() covers what it may
// bring (buffer_size for a one-buffer receive; its max_bytes rounded up to
// buffers for a bundle), and re-arm a multishot receive only then.
//
// Refusals. Each ResourceExhausted names the budget, its limit, what it
// pins and needs, what became of the bytes (the caller's span or the
// socket keeps them; nothing is lost) and what to change, and counts one
// refusal in Stats().
//
// Watermarks, with hysteresis: on_high runs when pinned_bytes() rises to
// high_watermark or above, and not again until on_low has run; on_low runs
// when, after on_high, pinned_bytes() falls to low_watermark or below.
// Both run on the thread whose chain call crossed the mark, inside that
// call: they may set flags, cancel or arm receives and touch other objects,
// but must not use or destroy the budget or any chain bound to it. Set
// low_watermark above the most an unfinished message may pin (a line up to
// LineSplitter's max_line, a command's declared length): bytes that wait
// for their message's end are not consumed, so a connection paused with
// more than that never falls to low_watermark and never resumes.
// Watermarks bound one connection; they do not keep a pool shared by many
// from filling with unfinished messages that wait for each other (caps that
// fit a message, times the connections, exceed the pool): admit messages
// by size with an AdmissionQueue (bufpool/admission.h), whose grants, not
// the caps' sum, stay under the pool (docs/uring.md, "Sizing a bounded
// server").
//
// Reservation. reserved_bytes (rounded up to whole buffers) are taken from
// the pool at CreateBudget() and kept by the budget while its chains pin
// less than that: the budget's first reserved_bytes of fresh buffers come
// from this reserve, so they are there even when other consumers have
// drained the pool. When a chain gives a buffer back and the budget pins
// less than its reservation again, the budget takes a buffer from the pool
// to refill the reserve (on a thread that just gave one back, the pool's
// per-CPU cache hands that one back; a buffer another holder still shares,
// a clone or a send in flight, refills it at a later release). So the
// budget keeps max(reserved_bytes, pinned_bytes()) of the pool out, and a
// server whose connections each reserve one message plus its reply can
// always finish a message and build the reply.
//
// Lifetime and ownership. CreateBudget() returns a std::unique_ptr: a
// budget has one owner (the connection or tenant it caps), like the pool,
// and chains refer to it by pointer, so binding costs no reference count.
// A budget must outlive every non-empty chain bound to it (destroying it
// while they pin buffers aborts, naming the budget and the bytes, as
// ~BufferPool does for buffers), and must be destroyed before its pool (its
// reserve is buffers of the pool: ~BufferPool aborts "still in use" while
// a budget with a reservation lives). An empty chain bound to a destroyed
// budget may be destroyed but not used. Split() and Clone() of a bound chain
// are bound too; bytes meant to outlive the budget's owner leave it when
// appended to an unbound chain (BufferChain::Append(BufferChain&&) moves the
// charge with the slices).
//
// Thread safety. A budget and the chains bound to it are used by one thread
// at a time (the connection's loop), like a chain: charges are single-writer
// counters, no atomic read-modify-write. Stats(), pinned_bytes() and
// WriteMetrics() may be called from any thread at any time (they read
// relaxed atomics: a moment's values, each exact). CreateBudget() and
// ~BufferBudget() may run on any threads at once.
//
// Costs. A bound chain pays, per buffer it starts or stops pinning, a
// comparison with its neighbour slice, a load and a store of the slot's
// owner word (a compare-and-swap when it links a buffer it did not take
// fresh) and a few loads and stores of the budget; an unbound chain one
// predictable branch per slice linked or dropped. Receives into tail room
// cost nothing more. CreateBudget() and ~BufferBudget() take a process-wide
// mutex (the pool's budget list).
#ifndef BUFPOOL_BUDGET_H_
#define BUFPOOL_BUDGET_H_

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "bufpool/buffer_pool.h"
#include "bufpool/export.h"
#include "bufpool/internal/shared_access.h"

namespace bufpool {

struct BudgetOptions {
  // Appears in refusals, reports and metrics (the `budget` label).
  std::string name;
  // Pool bytes the budget's chains may keep out (see "Accounting"), in
  // whole buffers (rounded down); at least one buffer_size. SIZE_MAX: no
  // limit.
  size_t max_bytes = 0;
  // on_high runs when pinned bytes rise to high_watermark or above, on_low
  // when they fall back to low_watermark or below (see the file comment).
  // high_watermark 0: no watermarks; otherwise low_watermark <
  // high_watermark <= max_bytes.
  size_t high_watermark = 0;
  size_t low_watermark = 0;
  std::function<void()> on_high = nullptr;
  std::function<void()> on_low = nullptr;
  // Taken from the pool up front, rounded up to whole buffers: always
  // available to this budget (see "Reservation"). At most max_bytes.
  size_t reserved_bytes = 0;
  // Budgets of one group (say, every connection of a listener) are written
  // by WriteMetrics() as one series per group, their sums, instead of one
  // per budget ("": a series of its own, for few budgets).
  std::string group = "";
};

struct BudgetStats {
  size_t pinned_bytes;      // pinned by the budget's chains now
  size_t high_water_bytes;  // the most they have pinned at once
  uint64_t refusals;        // ResourceExhausted returned for this budget
};

class BufferBudget;

namespace internal {
struct BudgetAccess;  // below: what BufferChain and the I/O sources call
}  // namespace internal

// A named share of one pool (see the file comment). Made by
// BufferPool::CreateBudget(); not copyable or movable (chains point to it).
class BUFPOOL_EXPORT BufferBudget {
 public:
  ~BufferBudget();
  BufferBudget(const BufferBudget&) = delete;
  BufferBudget& operator=(const BufferBudget&) = delete;

  const std::string& name() const { return name_; }
  // BudgetOptions::group ("" for none).
  const std::string& group() const { return group_; }
  BufferPool& pool() const { return *pool_; }
  // max_bytes rounded down to whole buffers (SIZE_MAX: no limit).
  size_t max_bytes() const { return max_bytes_; }
  // reserved_bytes rounded up to whole buffers.
  size_t reserved_bytes() const { return reserved_buffers_ * buffer_size_; }
  // Bytes the budget's chains pin now (any thread).
  size_t pinned_bytes() const {
    return pinned_.load(std::memory_order_relaxed);
  }
  // Bytes more the chains may pin before a refusal: max_bytes() minus
  // pinned_bytes(), 0 when at or past the limit.
  size_t room_bytes() const {
    const size_t p = pinned_bytes();
    return p < max_bytes_ ? max_bytes_ - p : 0;
  }
  // Buffers held in the reserve now (out of the pool, pinned by no chain).
  size_t reserve_buffers() const {
    return reserve_count_.load(std::memory_order_relaxed);
  }
  // Any thread (see "Thread safety").
  BudgetStats Stats() const;

 private:
  friend class BufferPool;
  friend struct internal::BudgetAccess;
  BufferBudget() = default;

  // Counts a refusal and says why: ResourceExhausted naming the budget, its
  // limit, what it pins, `wanted` more bytes that `what` needed (0: none
  // more, the bytes were taken) and `then`, what became of them.
  absl::Status Refuse(absl::string_view what, size_t wanted,
                      absl::string_view then);
  // Pins `bytes` more (a buffer's worth, from a chain) past any limit.
  void Charge(size_t bytes) {
    const size_t p = pinned_.load(std::memory_order_relaxed) + bytes;
    // relaxed stores: one writer (see "Thread safety"); readers on other
    // threads want a recent value, not an order with anything else.
    pinned_.store(p, std::memory_order_relaxed);
    // A new high water is a charge event too, so the common charge is one
    // compare.
    if (p >= charge_event_) [[unlikely]]
      OnChargeEvent(p);
  }
  void Release(size_t bytes) {
    const size_t p = pinned_.load(std::memory_order_relaxed) - bytes;
    pinned_.store(p, std::memory_order_relaxed);
    if (p < release_below_) [[unlikely]]
      OnReleaseEvent(p);
  }
  // The rare steps, one compare each on the charge and release paths:
  // a new high water, crossing a watermark, trimming or refilling the
  // reserve.
  void OnChargeEvent(size_t p);
  void OnReleaseEvent(size_t p);
  // Sets charge_event_ and release_below_ from the state (see there).
  void Rearm();
  // A fresh buffer for a chain: from the reserve while it has one, else
  // from the pool; empty when both are dry.
  Buffer TakeFresh() {
    if (reserve_size_ != 0) [[unlikely]]
      return TakeReserved();
    return pool_->TryAcquire();
  }
  Buffer TakeReserved();
  // Tells a tracking pool that `b` is now in the reserve (`in`), or out of
  // it again, for the holder report's "budget <name>".
  void NoteReserve(const Buffer& b, bool in) const;
  // Takes back a buffer TakeFresh() gave that no chain linked: into the
  // reserve while it is short, else to the pool.
  void GiveBack(Buffer&& b);
  void CrossHigh();
  void CrossLow();
  // Keeps reserve_size_ * buffer_size_ + pinned near floor_ (the
  // reservation in bytes): gives surplus reserve back to the pool, and
  // refills a short reserve from it.
  void TrimReserve();
  void RefillReserve();

  BufferPool* pool_ = nullptr;
  std::string name_;
  std::string group_;
  // Names this budget in holder notes (24 bits, process-wide, never 0).
  uint32_t holder_id_ = 0;
  // Names this budget in the slots' owner words (internal/shared_access.h):
  // unique among live budgets, 1 .. kMaxAccounts, reused after it goes.
  uint32_t account_ = 0;
  size_t buffer_size_ = 0;
  size_t max_bytes_ = 0;
  size_t high_mark_ = ~size_t{0};  // ~0: no watermarks
  size_t low_mark_ = 0;
  size_t floor_ = 0;  // the reservation in bytes
  size_t reserved_buffers_ = 0;
  bool above_high_ = false;
  // Charge() calls OnChargeEvent() once pinned reaches charge_event_ (the
  // high mark while below it; one past the high water; the point past which
  // the reserve is surplus), Release() calls OnReleaseEvent() below
  // release_below_ (past the low mark while above high; the point below which
  // the reserve is short). SIZE_MAX and 0: nothing to do.
  size_t charge_event_ = ~size_t{0};
  size_t release_below_ = 0;
  std::function<void()> on_high_, on_low_;
  // The reserve: reserve_size_ buffers in reserve_[0, reserve_size_).
  std::vector<Buffer> reserve_;
  size_t reserve_size_ = 0;
  // Written by the budget's one thread; read by Stats() on any.
  std::atomic<size_t> pinned_{0};
  std::atomic<size_t> high_water_{0};
  std::atomic<uint64_t> refusals_{0};
  std::atomic<size_t> reserve_count_{0};
};

namespace internal {

// For BufferChain and the I/O sources that feed chains (ReadFrom, the ring,
// the Asio adapters): not for users, whose code goes through chains.
struct BudgetAccess {
  // The most budgets live at once (the owner words' id field).
  static constexpr uint32_t kMaxAccounts = (uint32_t{1} << 20) - 2;
  // The owner word of a slot that `b` counts, less its run count.
  static uint32_t OwnerId(const BufferBudget& b) {
    return b.account_ << internal::SharedAccess::kOwnerRunBits;
  }
  static void Charge(BufferBudget& b, size_t bytes) { b.Charge(bytes); }
  static void Release(BufferBudget& b, size_t bytes) { b.Release(bytes); }
  static Buffer TakeFresh(BufferBudget& b) { return b.TakeFresh(); }
  static void GiveBack(BufferBudget& b, Buffer&& buffer) {
    b.GiveBack(std::move(buffer));
  }
  static absl::Status Refuse(BufferBudget& b, absl::string_view what,
                             size_t wanted, absl::string_view then = "") {
    return b.Refuse(what, wanted, then);
  }
};

// Pool commitments: reservations, ring lending and admission queues'
// capacities may not together exceed the pool's capacity. CommitLending()
// adds a ring's most-lent buffers or a queue's capacity (ResourceExhausted
// naming the numbers when they do not fit); UncommitLending() takes them
// back when the ring or queue goes.
enum class Commitment { kRing, kAdmissionQueue };
BUFPOOL_EXPORT absl::Status CommitLending(BufferPool& pool, size_t buffers,
                                          absl::string_view who,
                                          Commitment kind = Commitment::kRing);
BUFPOOL_EXPORT void UncommitLending(BufferPool& pool, size_t buffers,
                                    Commitment kind = Commitment::kRing);
// The pool's capacity less its reservations and ring lending.
BUFPOOL_EXPORT size_t UncommittedBuffers(const BufferPool& pool);

// Long-lived lenders inside the library (a ProvidedBufferRing): pool
// buffers they hold on the kernel's behalf, which HoldersReport() counts
// apart from other holders. A report calls `count` on its own thread, under
// the pool's lender lock, while the lender's thread runs, so `count` reads
// only atomics (RelaxedCount) and what was set before AddLender(); it
// appends what it counted to `detail` and returns the number. After
// RemoveLender() returns, `count` runs no more (a report in progress holds
// the lock). The acquire and release paths never look at the list.
using LentCount = std::function<size_t(std::string* detail)>;
BUFPOOL_EXPORT void AddLender(const BufferPool& pool, const void* lender,
                              LentCount count);
BUFPOOL_EXPORT void RemoveLender(const BufferPool& pool, const void* lender);

// A count that one thread writes and any thread may read: relaxed loads and
// stores, each a plain move where it compiles (x86-64, AArch64), so the
// writer pays what a size_t costs. No read-modify-write: a second writer
// would lose updates. A reader sees some value the writer stored (no torn
// read), which is all a report needs: the count it prints is a snapshot.
class RelaxedCount {
 public:
  operator size_t() const { return v_.load(std::memory_order_relaxed); }
  RelaxedCount& operator+=(size_t d) {
    v_.store(*this + d, std::memory_order_relaxed);
    return *this;
  }
  RelaxedCount& operator-=(size_t d) {
    v_.store(*this - d, std::memory_order_relaxed);
    return *this;
  }
  RelaxedCount& operator--() { return *this -= 1; }

 private:
  std::atomic<size_t> v_{0};
};

// The pool's live budgets, for WriteMetrics(): fn(const BufferBudget&) for
// each, under the budget list's lock (fn must not create or destroy one).
BUFPOOL_EXPORT void ForEachBudget(
    const BufferPool& pool, const std::function<void(const BufferBudget&)>& fn);

}  // namespace internal
}  // namespace bufpool

#endif  // BUFPOOL_BUDGET_H_

// Internal: the inline bodies of bufpool/chain.h (included at its end; do
// not include directly): SharedBuffer's reference counting, BufferChain's
// slice ring and its receive fast paths, and SpanRange.
#ifndef BUFPOOL_INTERNAL_CHAIN_INL_H_
#define BUFPOOL_INTERNAL_CHAIN_INL_H_

#include <algorithm>
#include <atomic>
#include <cstring>
#include <new>
#include <optional>
#include <utility>

#include "absl/utility/utility.h"
#include "bufpool/chain.h"

namespace bufpool {

// ---- SharedBuffer -----------------------------------------------------------
//
// Reference counts (internal::SharedAccess::Ref). Copies add with relaxed
// order: a new reference is made from an existing one, so the count cannot
// reach 0 meanwhile and nothing else needs ordering (as std::shared_ptr).
// A drop subtracts with acq_rel: release so this holder's reads and writes
// of the buffer happen-before whichever drop is last, acquire so the last
// one, which returns the buffer for reuse, sees them all. A drop that loads
// 1 (acquire, pairing with the others' release subtractions) holds the only
// reference, which no other thread can copy, so it skips the subtraction.
//
// Reserves. A handle may own reserve_ references beyond its own, added in
// the same relaxed add as a cut's (BufferChain::ShareFront()): made from the
// handle's existing reference, so, as for a copy, the count cannot reach 0
// meanwhile. A later cut of the same handle takes one of them without an
// atomic: the reference moves from one handle to another inside the thread
// that holds both (a chain is used by one thread at a time), so the count
// stays the sum, over live handles, of 1 + reserve_. A drop subtracts its
// 1 + reserve_ at once, acq_rel as above, and skips the subtraction when it
// loads exactly that many (then no other handle exists to copy from). A
// handle moved to another thread takes its reserve along (the caller's
// hand-over orders it), and a copy takes none. BufferChain::kMaxReserve
// bounds what one handle adds to its buffer's count.
//
// The private helpers: ShareFront(n, cut) cuts the front slice's first n
// (0 < n < its size) bytes off as a handle of their own, `cut` (the size of
// the whole cut) being the guess at the next cuts' size for the reserve;
// SplitInto() is Split() into an empty chain with this one's pool and
// budget; Drop<kReleaseInline>() drops a handle's 1 + reserve_ references,
// returning the buffer when they were its last, inline or through
// ReleaseLast(); ResetSeldomLast() is Reset() with that return out of line,
// for callers whose handle is seldom the last (a chain's destructor), so
// that the rest inlines.
//
// A chain's entries. The slices are At(0) .. At(count_ - 1); other entries
// hold nothing or, in inline_, may be raw storage: an entry past the slices
// is written only with Place(). inline_ is a union member so that a chain
// is made without writing its entries and destroyed without visiting them
// (an entry holding nothing has nothing to destroy). ChargeLink(),
// PopFrontBudgeted() and PopBackBudgeted() are inline because a bound
// chain's receive and consume paths call them once per buffer; ReleaseAll()
// releases the budget's charge for every run of slices that leave in bulk.

inline SharedBuffer::SharedBuffer(SharedBuffer&& other) noexcept
    : pool_(std::exchange(other.pool_, nullptr)),
      data_(std::exchange(other.data_, nullptr)),
      size_(std::exchange(other.size_, 0)),
      slot_(other.slot_),
      reserve_(std::exchange(other.reserve_, 0)) {}

// A handle of a reference already counted, with `reserve` more.
inline SharedBuffer::SharedBuffer(BufferPool* pool, std::byte* data,
                                  size_t size, uint32_t slot,
                                  uint32_t reserve) noexcept
    : pool_(pool), data_(data), size_(size), slot_(slot), reserve_(reserve) {}

inline absl::string_view SharedBuffer::view() const {
  return {reinterpret_cast<const char*>(data_), size_};
}

inline size_t SharedBuffer::offset() const {
  return pool_ ? static_cast<size_t>(data_ - pool_->SlotData(slot_)) : 0;
}

inline size_t SharedBuffer::room() const {
  return pool_ ? pool_->buffer_size() - offset() - size_ : 0;
}

inline void BufferChain::Place(SharedBuffer& at, SharedBuffer&& s) {
  ::new (static_cast<void*>(&at)) SharedBuffer(std::move(s));
}

inline SharedBuffer::SharedBuffer(Buffer&& buffer) noexcept {
  if (!buffer) return;
  BufferPool& pool = *buffer.pool();
  uint32_t* refs = internal::SharedAccess::Refs(pool);
  slot_ = internal::SharedAccess::TakeSlot(buffer);
  // relaxed: the slot is ours alone; the pool's hand-over ordered its
  // previous holders' accesses before this. No budget counts it yet (the
  // owner word beside the count, shared_access.h).
  uint32_t* const word = refs + slot_ * internal::SharedAccess::kRefStride;
  std::atomic_ref<uint32_t>(word[0]).store(1, std::memory_order_relaxed);
  std::atomic_ref<uint32_t>(word[1]).store(0, std::memory_order_relaxed);
  pool_ = &pool;
  data_ = pool.SlotData(slot_);
  size_ = pool.buffer_size();
}

inline SharedBuffer::SharedBuffer(const SharedBuffer& other) noexcept
    : pool_(other.pool_),
      data_(other.data_),
      size_(other.size_),
      slot_(other.slot_) {
  if (pool_ != nullptr) {
    internal::SharedAccess::Ref(*pool_, slot_)
        .fetch_add(1, std::memory_order_relaxed);
  }
}

inline SharedBuffer& SharedBuffer::operator=(
    const SharedBuffer& other) noexcept {
  if (this != &other) {
    SharedBuffer copy(other);
    *this = std::move(copy);
  }
  return *this;
}

inline SharedBuffer& SharedBuffer::operator=(SharedBuffer&& other) noexcept {
  if (this != &other) {
    Reset();
    pool_ = std::exchange(other.pool_, nullptr);
    data_ = std::exchange(other.data_, nullptr);
    size_ = std::exchange(other.size_, 0);
    slot_ = other.slot_;
    reserve_ = std::exchange(other.reserve_, 0);
  }
  return *this;
}

ABSL_ATTRIBUTE_ALWAYS_INLINE inline void SharedBuffer::Reset() { Drop<true>(); }

inline void SharedBuffer::ResetSeldomLast() { Drop<false>(); }

template <bool kReleaseInline>
ABSL_ATTRIBUTE_ALWAYS_INLINE inline void SharedBuffer::Drop() {
  BufferPool* const pool = pool_;
  if (pool == nullptr) return;
  const uint32_t mine = 1 + reserve_;  // the references this handle owns
  pool_ = nullptr;
  data_ = nullptr;  // no view of a buffer that may be reused already
  size_ = 0;
  reserve_ = 0;
  std::atomic_ref<uint32_t> ref = internal::SharedAccess::Ref(*pool, slot_);
  if (ref.load(std::memory_order_acquire) == mine ||
      ref.fetch_sub(mine, std::memory_order_acq_rel) == mine) {
    if constexpr (kReleaseInline) {
      internal::SharedAccess::ReleaseSlot(*pool, slot_);
    } else {
      ReleaseLast(*pool, slot_);
    }
  }
}

inline uint32_t SharedBuffer::use_count() const {
  if (pool_ == nullptr) return 0;
  return internal::SharedAccess::Ref(*pool_, slot_)
             .load(std::memory_order_acquire) -
         reserve_;
}

inline SharedBuffer SharedBuffer::Slice(size_t offset, size_t length) const {
  if (pool_ == nullptr || offset > size_ || length > size_ - offset)
      [[unlikely]] {
    DieBadSlice(offset, length);
  }
  SharedBuffer s(*this);
  s.data_ += offset;
  s.size_ = length;
  return s;
}

// ---- BufferChain ----------------------------------------------------------

// A chain of one inline slice (a frame a splitter cut) moves inline.
inline BufferChain::BufferChain(BufferChain&& other) noexcept
    : pool_(other.pool_), budget_(other.budget_), slices_(inline_) {
  if (other.slices_ == other.inline_ && other.count_ <= 1) {
    if (other.count_ == 0) return;
    Place(inline_[0], std::move(other.At(0)));
    count_ = 1;
    size_ = std::exchange(other.size_, 0);
    packed_ = std::exchange(other.packed_, 0);
    other.count_ = 0;
    other.head_ = 0;
    return;
  }
  StealFrom(other);
}

inline BufferChain& BufferChain::operator=(BufferChain&& other) noexcept {
  if (count_ == 0 && other.count_ == 0 && slices_ == inline_ &&
      other.slices_ == other.inline_) {
    pool_ = other.pool_;
    budget_ = other.budget_;
    return *this;
  }
  return MoveAssignSlow(other);
}

inline BufferChain::~BufferChain() {
  if (count_ == 1 && slices_ == inline_ && budget_ == nullptr) {
    inline_[head_].ResetSeldomLast();
    return;
  }
  if (count_ != 0 || slices_ != inline_) DestroySlow();
}

inline const SharedBuffer& BufferChain::slice(size_t i) const {
#ifndef NDEBUG
  if (i >= count_) DieBadIndex(i);
#endif
  return At(i);
}

// The common cases inline: a cut inside the front slice of an unbound
// chain (one parsed message of several a receive brought), and the whole
// of a one-slice chain; anything that drops slices of a longer chain goes
// out of line.
inline void BufferChain::Consume(size_t n) {
  // A bound chain's front may be packed bytes, counted by their size
  // (ConsumeSlow() recounts them).
  if (count_ != 0 && n < At(0).size_) {
    if (budget_ != nullptr) [[unlikely]] {
      ConsumeSlow(n);
      return;
    }
    SharedBuffer& front = At(0);
    front.data_ += n;
    front.size_ -= n;
    size_ -= n;
    return;
  }
  if (count_ == 1) {
    size_ = 0;
    PopBack();
    return;
  }
  ConsumeSlow(n);
}

// The common append inline: bytes that fit the room after the tail, in a
// buffer this chain alone holds (replies built piece by piece); anything
// that needs a fresh buffer, or a tail another handle shares, goes out of
// line.
inline absl::Status BufferChain::Append(absl::Span<const std::byte> bytes) {
  const size_t n = bytes.size();
  if (count_ != 0 && n != 0) {
    SharedBuffer& t = At(count_ - 1);
    if (n <= t.room() && t.use_count() == 1) {
      std::memcpy(t.data_ + t.size_, bytes.data(), n);
      t.size_ += n;
      size_ += n;
      return absl::OkStatus();
    }
  }
  return AppendSlow(bytes);
}

inline BufferChain BufferChain::Split(size_t n) {
  BufferChain first;
  first.pool_ = pool_;
  first.budget_ = budget_;
  SplitInto(first, n);
  return first;
}

// The common cut inline: within the front slice, of an unbound chain (a
// frame of a splitter); anything else goes out of line.
ABSL_ATTRIBUTE_ALWAYS_INLINE inline void BufferChain::SplitInto(
    BufferChain& first, size_t n) {
  if (count_ != 0 && n != 0 && budget_ == nullptr) [[likely]] {
    SharedBuffer& front = slices_[head_];
    if (n < front.size_) {
      Place(first.inline_[0], ShareFront(n, n));
    } else if (n == front.size_) {
      Place(first.inline_[0], std::move(front));
      head_ = (head_ + 1) & (cap_ - 1);
      --count_;
    } else {
      SplitSlow(first, n);
      return;
    }
    first.count_ = 1;
    first.size_ = n;
    size_ -= n;
    return;
  }
  SplitSlow(first, n);
}

// The new handle takes one of the front's reserved references; with none
// left, one relaxed add (made from the front's reference, see the top of
// this file) counts this cut's and, as the front's reserve, one for each
// further cut of `cut` bytes its rest holds but the last (which takes the
// front itself). A guess that runs out costs one more add; what is left
// over goes with the front handle, dropped in its one subtraction.
ABSL_ATTRIBUTE_ALWAYS_INLINE inline SharedBuffer BufferChain::ShareFront(
    size_t n, size_t cut) {
  SharedBuffer& front = slices_[head_];
  if (front.reserve_ != 0) {
    --front.reserve_;
  } else {
    const size_t rest = front.size_ - n;  // > 0
    const uint32_t more = rest > cut ? static_cast<uint32_t>(std::min<size_t>(
                                           (rest - 1) / cut, kMaxReserve))
                                     : 0;
    internal::SharedAccess::Ref(*front.pool_, front.slot_)
        .fetch_add(1 + more, std::memory_order_relaxed);
    front.reserve_ = more;
  }
  SharedBuffer s(front.pool_, front.data_, n, front.slot_, 0);
  front.data_ += n;
  front.size_ -= n;
  return s;
}

inline void BufferChain::Reserve(size_t slices) {
  if (slices > cap_) [[unlikely]]
    ReserveSlow(slices);
}

inline absl::Span<std::byte> BufferChain::Preallocate() const {
  const size_t room = TailRoom();
  if (room == 0) return {};
  const SharedBuffer& t = At(count_ - 1);
  return {t.data_ + t.size_, room};
}

inline void BufferChain::Postallocate(size_t n) {
  if (n == 0) return;
  if (count_ == 0 || n > At(count_ - 1).room()) [[unlikely]] {
    DieBadPostallocate(n);
  }
  At(count_ - 1).size_ += n;
  size_ += n;
}

// Receive()'s common link inline: an empty chain has no tail room to fill,
// and n >= copy_below bytes are too many to pack (copy_below 0: never
// copied), so the buffer becomes the only slice (count_ 0 < cap_: PushBack
// cannot grow, so nothing throws). Everything else, the n == 0 and n past
// the buffer checks among it, goes to ReceiveSlow().
ABSL_ATTRIBUTE_ALWAYS_INLINE inline bool BufferChain::Receive(
    Buffer& buffer, size_t n, const ReceiveOptions& options) {
  if (count_ == 0 && n >= options.copy_below && n != 0 && n <= buffer.size())
      [[likely]] {
    AppendFilled(std::move(buffer), n);
    return true;
  }
  return ReceiveSlow(buffer, n, options);
}

inline bool BufferChain::GrowTail(const std::byte* at, size_t n) {
  if (count_ == 0) return false;
  SharedBuffer& t = At(count_ - 1);
  // Adjacent addresses may be the next buffer's: the tail grows only
  // inside its own.
  if (t.data_ + t.size_ != at || t.room() < n) return false;
  t.size_ += n;
  size_ += n;
  return true;
}

inline bool BufferChain::AppendPacked(absl::Span<const std::byte> bytes,
                                      ReceivePack& pack) {
  if (count_ == 0 && AppendPackedInline(bytes.data(), bytes.size(), pack))
      [[likely]] {
    return true;
  }
  return AppendPackedSlow(bytes.data(), bytes.size(), pack, false);
}

inline SharedBuffer& BufferChain::At(size_t i) const {
  return slices_[(head_ + static_cast<uint32_t>(i)) & (cap_ - 1)];
}

// Room in the tail's buffer that Append() may write (see the file
// comment): 0 unless the tail is the only reference to its buffer; 0 for
// an empty chain.
inline size_t BufferChain::TailRoom() const {
  if (count_ == 0) return 0;
  const SharedBuffer& t = At(count_ - 1);
  return t.use_count() == 1 ? t.room() : 0;
}

// Links `s` after the tail. A bound chain tells its budget (see
// "Accounting" below); an unbound one pays one branch.
inline void BufferChain::PushBack(SharedBuffer&& s) {
  if (count_ == cap_) Grow();
  if (budget_ != nullptr) [[unlikely]] {
    PushBackBudgeted(std::move(s));
    return;
  }
  Place(At(count_), std::move(s));
  ++count_;
}

inline void BufferChain::PopFront() {
  if (budget_ != nullptr) [[unlikely]] {
    PopFrontBudgeted();
    return;
  }
  slices_[head_].Reset();
  head_ = (head_ + 1) & (cap_ - 1);
  --count_;
}

inline void BufferChain::PopBack() {
  if (budget_ != nullptr) [[unlikely]] {
    PopBackBudgeted();
    return;
  }
  At(count_ - 1).Reset();
  --count_;
}

// Whether slices a and b are of one buffer.
inline bool BufferChain::SameBuffer(const SharedBuffer& a,
                                    const SharedBuffer& b) {
  return a.pool_ == b.pool_ && a.slot_ == b.slot_;
}

// A fresh buffer for Append() and Compact(): the budget's (its reserve
// first) when bound, else the pool's.
inline Buffer BufferChain::AcquireFresh() {
  if (budget_ != nullptr) [[unlikely]]
    return internal::BudgetAccess::TakeFresh(*budget_);
  return pool_->TryAcquire();
}

inline void BufferChain::AppendFilled(Buffer&& buffer, size_t n) {
  SharedBuffer s(std::move(buffer));
  s.size_ = n;
  size_ += n;
  if (budget_ != nullptr) [[unlikely]] {
    PushFresh(std::move(s));
    return;
  }
  PushBack(std::move(s));
}

// ReceivePack: the pack writes only past the bytes its slices cover, so
// chains reading their slices on other threads never see a write; once every
// slice of its buffer is gone it fills it again from the start, and when the
// buffer is full while slices remain it takes a fresh one from the pool (the
// old one goes back with its last slice).
//
// An empty chain packed without a call: the slice takes one of the pack's
// spare references (already in the buffer's count), so no atomic is made.
ABSL_ATTRIBUTE_ALWAYS_INLINE inline bool BufferChain::AppendPackedInline(
    const std::byte* src, size_t len, ReceivePack& pack) {
  SharedBuffer& b = pack.buf_;
  if (pack.spare_ == 0 || b.size_ - pack.used_ < len || len == 0) {
    return false;
  }
  if (budget_ != nullptr && budget_->room_bytes() < PackCharge(len))
      [[unlikely]] {
    return false;  // the slow path refuses it too
  }
  std::byte* const dst = b.data_ + pack.used_;
  // At(0) holds nothing (the chain is empty).
  Place(At(0), SharedBuffer(b.pool_, dst, len, b.slot_, 0));
  --pack.spare_;
  pack.used_ += static_cast<uint32_t>(len);
  count_ = 1;
  size_ = len;
  // The chain was empty: it holds this slice alone, counted by its bytes.
  if (budget_ != nullptr) [[unlikely]] {
    const uint32_t charge = PackCharge(len);
    packed_ = charge;
    internal::BudgetAccess::Charge(*budget_, charge);
  }
  std::memcpy(dst, src, len);
  return true;
}

// ---- Accounting (bufpool/budget.h) -----------------------------------------
//
// A bound chain keeps, for each slot it holds a run of (adjacent slices of
// one buffer), the slot's owner word (internal/shared_access.h) up to
// date:
//   - linking a run's first slice: if the word names this chain's budget,
//     one run more (no charge); if it is 0, the budget claims it (a
//     compare-and-swap, as another budget's thread may claim it at once)
//     and is charged buffer_size; if it names another budget, nothing: the
//     buffer is that budget's. A fresh buffer (PushFresh()) is this chain's
//     alone, so the claim is a plain store.
//   - unlinking a run's last slice, before the slice is dropped (the slot
//     may be reused as soon as it is): if the word names this budget, one
//     run fewer, and at none the word goes back to 0 and buffer_size is
//     released.
// So the budget is charged a buffer once however many runs of it its
// chains hold, and what it is charged and released always match: a run
// linked while another budget counted the slot releases nothing even if
// this budget counts it by then (it decrements a count that its own claim
// set, and the last of its runs to go releases the one charge).
// Only the budget's thread writes a word naming it; others only read it or
// swap it from 0, so a load and a store suffice where it is ours. Relaxed
// throughout: the word orders nothing, and a slot is reused only after
// every slice of it was dropped (the drop's release order publishes the
// last store).
//
// Slices of a ReceivePack's buffer (owner word kOwnerPack) are counted by
// their bytes instead: packed_ is what the chain is charged for them,
// PackedTarget() what it should be (each run of them rounded up to
// kPackGranule), and RecountPacked() charges or releases the difference
// whenever a chain links or drops one, so release always matches charge.
// So packed_ never exceeds PackedTarget() except while the tail grows in
// place (Postallocate() into a pack buffer its pack let go of: counted at
// the next recount).

ABSL_ATTRIBUTE_ALWAYS_INLINE inline uint32_t BufferChain::PackCharge(
    size_t bytes) {
  return static_cast<uint32_t>(std::min<size_t>(
      (bytes + kPackGranule - 1) & ~(kPackGranule - 1), ~uint32_t{0} / 2));
}

// Linking `s`, the first slice of a run here, whose owner word read
// `owner`, with `room` bytes the budget may still be charged: the bytes to
// charge. A buffer no budget counts is claimed only when there is room:
// linking takes nothing from the pool, so a buffer that arrives with no
// room stays as it was, counted by no budget.
ABSL_ATTRIBUTE_ALWAYS_INLINE inline size_t BufferChain::LinkRun(
    const SharedBuffer& s, uint32_t owner, size_t room) {
  std::atomic_ref<uint32_t> word =
      internal::SharedAccess::Owner(*s.pool_, s.slot_);
  const uint32_t me = internal::BudgetAccess::OwnerId(*budget_);
  if ((owner & ~internal::SharedAccess::kOwnerRuns) == me) {
    // Saturated: the run goes uncounted (the budget then releases the
    // buffer while some of its runs remain: less charged, never more).
    if ((owner & internal::SharedAccess::kOwnerRuns) !=
        internal::SharedAccess::kOwnerRuns) {
      word.store(owner + 1, std::memory_order_relaxed);
    }
    return 0;
  }
  const size_t bs = s.pool_->buffer_size();
  if (owner == 0 && room >= bs &&
      word.compare_exchange_strong(owner, me | 1, std::memory_order_relaxed)) {
    return bs;
  }
  return 0;  // another budget's, or no room
}

ABSL_ATTRIBUTE_ALWAYS_INLINE inline void BufferChain::PushBackBudgeted(
    SharedBuffer&& s) {
  const uint32_t owner = internal::SharedAccess::Owner(*s.pool_, s.slot_)
                             .load(std::memory_order_relaxed);
  if (owner == internal::SharedAccess::kOwnerPack) [[unlikely]] {
    Place(At(count_), std::move(s));
    ++count_;
    RecountPacked();
    return;
  }
  const size_t charge = count_ == 0 || !SameBuffer(At(count_ - 1), s)
                            ? LinkRun(s, owner, budget_->room_bytes())
                            : 0;
  Place(At(count_), std::move(s));
  ++count_;
  if (charge != 0) internal::BudgetAccess::Charge(*budget_, charge);
}

// A bound chain links `s`, a slice of a buffer it holds alone (just made
// from a Buffer): its budget claims the slot with a store.
ABSL_ATTRIBUTE_ALWAYS_INLINE inline void BufferChain::PushFresh(
    SharedBuffer&& s) {
  if (count_ == cap_) Grow();
  internal::SharedAccess::Owner(*s.pool_, s.slot_)
      .store(internal::BudgetAccess::OwnerId(*budget_) | 1,
             std::memory_order_relaxed);
  const size_t bs = s.pool_->buffer_size();
  Place(At(count_), std::move(s));
  ++count_;
  internal::BudgetAccess::Charge(*budget_, bs);
}

// A slice of `slot` of `pool` leaves a bound chain (before it is dropped);
// `ends`: no slice of its buffer next to it stays, so its run goes. The
// bytes to release; *pack set for a slice of a pack buffer (then the
// caller recounts).
ABSL_ATTRIBUTE_ALWAYS_INLINE inline size_t BufferChain::UnlinkRun(
    BufferPool* pool, uint32_t slot, bool ends, bool* pack) {
  std::atomic_ref<uint32_t> word = internal::SharedAccess::Owner(*pool, slot);
  const uint32_t owner = word.load(std::memory_order_relaxed);
  if (owner == internal::SharedAccess::kOwnerPack) [[unlikely]] {
    *pack = true;
    return 0;
  }
  if (!ends || (owner & ~internal::SharedAccess::kOwnerRuns) !=
                   internal::BudgetAccess::OwnerId(*budget_)) {
    return 0;
  }
  if ((owner & internal::SharedAccess::kOwnerRuns) > 1) {
    word.store(owner - 1, std::memory_order_relaxed);
    return 0;
  }
  word.store(0, std::memory_order_relaxed);
  return pool->buffer_size();
}

// The slice is dropped before the budget hears of it, so that a budget
// refilling its reserve finds the buffer back in the pool.
inline void BufferChain::PopFrontBudgeted() {
  SharedBuffer& f = slices_[head_];
  bool pack = false;
  const size_t bs =
      UnlinkRun(f.pool_, f.slot_, count_ == 1 || !SameBuffer(f, At(1)), &pack);
  f.Reset();
  head_ = (head_ + 1) & (cap_ - 1);
  --count_;
  if (pack) [[unlikely]] {
    // The last slice (a packed partial consumed whole): all of packed_.
    if (count_ != 0) {
      RecountPacked();
    } else if (packed_ != 0) {
      internal::BudgetAccess::Release(*budget_, std::exchange(packed_, 0));
    }
  }
  if (bs != 0) internal::BudgetAccess::Release(*budget_, bs);
}

inline void BufferChain::PopBackBudgeted() {
  SharedBuffer& t = At(count_ - 1);
  bool pack = false;
  const size_t bs = UnlinkRun(
      t.pool_, t.slot_, count_ == 1 || !SameBuffer(At(count_ - 2), t), &pack);
  t.Reset();
  --count_;
  if (pack) [[unlikely]] {
    if (count_ != 0) {
      RecountPacked();
    } else if (packed_ != 0) {
      internal::BudgetAccess::Release(*budget_, std::exchange(packed_, 0));
    }
  }
  if (bs != 0) internal::BudgetAccess::Release(*budget_, bs);
}

namespace internal {

// For the splitters (bufpool/cursor.h), which build the chain they return
// in its place: a returned chain is an object in memory (its ring points
// into it), so one cut into a temporary and moved costs a copy of it (and a
// stalled load of the bytes just stored).
struct ChainAccess {
  // in.Split(n), into `out`, an empty chain made with BufferChain().
  // in.Split(n) as a splitter returns it, built in place (a lone return of
  // a named local).
  static absl::StatusOr<std::optional<BufferChain>> SplitFront(BufferChain& in,
                                                               size_t n) {
    absl::StatusOr<std::optional<BufferChain>> out(absl::in_place,
                                                   std::in_place);
    BufferChain& frame = **out;
    frame.pool_ = in.pool_;
    frame.budget_ = in.budget_;
    in.SplitInto(frame, n);
    return out;
  }
  // The references `s` holds beyond its own (see Reserves above): for
  // tests that account for every reference of a buffer.
  static uint32_t Reserved(const SharedBuffer& s) { return s.reserve_; }
};

}  // namespace internal

class BufferChain::SpanRange {
 public:
  class iterator {
   public:
    using iterator_category = std::input_iterator_tag;
    using value_type = absl::Span<const std::byte>;
    using difference_type = std::ptrdiff_t;
    using pointer = void;
    using reference = value_type;

    iterator() = default;
    value_type operator*() const { return chain_->At(i_).span(); }
    iterator& operator++() {
      ++i_;
      return *this;
    }
    iterator operator++(int) {
      iterator old = *this;
      ++i_;
      return old;
    }
    bool operator==(const iterator& o) const { return i_ == o.i_; }

   private:
    friend class SpanRange;
    iterator(const BufferChain* chain, size_t i) : chain_(chain), i_(i) {}
    const BufferChain* chain_ = nullptr;
    size_t i_ = 0;
  };

  iterator begin() const { return {chain_, 0}; }
  iterator end() const { return {chain_, chain_->slice_count()}; }
  size_t size() const { return chain_->slice_count(); }

 private:
  friend class BufferChain;
  explicit SpanRange(const BufferChain* chain) : chain_(chain) {}
  const BufferChain* chain_;
};

inline BufferChain::SpanRange BufferChain::spans() const {
  return SpanRange(this);
}

}  // namespace bufpool

#endif  // BUFPOOL_INTERNAL_CHAIN_INL_H_

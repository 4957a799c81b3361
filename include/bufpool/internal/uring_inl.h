// Internal: the inline bodies of bufpool/uring.h (included at its end; do
// not include directly): the provided-buffer ring's entries and its
// completion fast paths, and the small inline members of FixedBuffers,
// ParkedReceives and HeldSend.
#ifndef BUFPOOL_INTERNAL_URING_INL_H_
#define BUFPOOL_INTERNAL_URING_INL_H_

#include <liburing.h>

#include <cstdint>
#include <cstring>
#include <utility>

#include "absl/base/attributes.h"
#include "bufpool/internal/shared_access.h"
#include "bufpool/uring.h"

namespace bufpool {

// ProvidedBufferRing's invariants: every buffer lent is in exactly one
// place: in the ring (the kernel may select it), consumed by the kernel but
// not yet Take()n, or in a chain Take() filled (then no longer the ring's).
// available() counts the first two; the kernel consumes ring entries in
// order, which is what lets Take() find the later buffers of a bundle.
// Buffer ids are the ring's own: lent_ maps each id to the pool slot lent
// under it, so pools of any size work (the kernel's ids are 16 bits).
//
// Per buffer id: the pool buffer lent under it, as its bytes and its
// slot (data nullptr when the id is free or, on an incremental ring, when
// shared_ holds the buffer), and the ring position it was added at, side
// by side, so a completion touches one entry (the id added at a position
// last is that entry's bid in br_, which the kernel never writes). The
// ring owns each such slot as a Buffer handle would (TakeSlot(); GiveSlot()
// makes the handle again): a bare slot, so the inline path moves no
// handle. Its reference count is not kept while it is lent: every way
// out of the ring makes a Buffer handle again (TakeLent()), and a slice
// made of the handle stores the count.
struct ProvidedBufferRing::Lent {
  std::byte* data = nullptr;
  uint32_t slot = 0;
  uint32_t pos = 0;
};

inline int FixedBuffers::IndexOf(const void* p) const {
  const uintptr_t off =
      reinterpret_cast<uintptr_t>(p) - reinterpret_cast<uintptr_t>(base_);
  if (off >= bytes_) return -1;
  const auto index = static_cast<unsigned>(off >> shift_);
  if (registered_.empty() || ((registered_[index >> 6] >> (index & 63)) & 1))
    return static_cast<int>(index);
  return RegisterChunk(index);
}

ABSL_ATTRIBUTE_ALWAYS_INLINE inline absl::Status ProvidedBufferRing::Take(
    const io_uring_cqe& cqe, BufferChain& out) {
  if (TakeInline(cqe, out)) [[likely]] {
    return absl::OkStatus();
  }
  return TakeSlow(cqe, out);
}

// Adds buffer `id` (whose bytes start at `data`) at ring position `at`
// (mod entries_; the kernel's head and tail run mod 2^16, which the mask
// keeps within): the entry's fields one by one, as io_uring_buf_ring_add()
// writes them (entry 0's resv is the ring's tail). The len too: the kernel
// rewrites it on an incremental ring, and on others where a capped
// receive ends inside the buffer it selected.
inline void ProvidedBufferRing::AddAt(uint16_t id, std::byte* data,
                                      uint32_t at) {
  const uint32_t pos = at & mask_;
  lent_[id].pos = pos;
  io_uring_buf& e = br_->bufs[pos];
  e.addr = reinterpret_cast<uintptr_t>(data);
  e.len = buffer_size_;
  e.bid = id;
}

// Lends buffer `id` again: writes its entry after the tail; the next
// Refill() publishes it with the rest of the turn's entries.
//
// The same buffer (or the one TakeBuffer() swapped in), same id, after the
// tail and the entries re-lent before it in this turn; Refill() publishes
// them all with one tail update. The entry it was consumed from counts in
// in_ring_ until taken, so in_ring_ (unchanged) stays <= target_ <=
// entries_ and no entry that is published and not yet taken, nor one
// waiting here, is overwritten.
inline void ProvidedBufferRing::Relend(uint16_t id, std::byte* data) {
  AddAt(id, data, next_++);
}

template <typename Fn>
size_t ParkedReceives::Rearm(io_uring* uring, uint64_t notice_user_data,
                             Fn&& rearm) {
  const size_t n = ring_->ShouldRearm() ? RearmAll(rearm) : 0;
  if (!parked_.empty() && !notice_pending_) {
    AskForNotice(uring, notice_user_data);
  }
  return n;
}

template <typename Fn>
size_t ParkedReceives::RearmAll(Fn&& rearm) {
  batch_.swap(parked_);  // both keep their capacity: no allocation
  for (void* who : batch_) rearm(who);
  const size_t n = batch_.size();
  batch_.clear();
  return n;
}

inline void ParkedReceives::OnNotice() {
  notice_pending_ = false;
  ++notices_;
}

inline HeldSend::~HeldSend() {
  if (busy()) [[unlikely]]
    DieBusy();
}

inline void HeldSend::ReturnUnsentTo(BufferChain& queue) {
  if (!unsent_.empty()) PrependUnsent(queue);
}

// ---- Inline fast path -------------------------------------------------------
//
// Take()'s common cases, decided with the fewest loads (leaving `out`
// holding what TakeSlow() would leave it), for a completion with
// IORING_CQE_F_BUFFER, 1 <= res <= buffer_size (one buffer), an id the ring
// lent, on a ring without incremental mode:
//   - into an empty chain (its budget, if any, with room for a buffer),
//     res >= copy_below: the buffer is linked as the chain's only slice
//     (TakeOne(), Receive()'s inline case) and a fresh pool buffer is lent
//     under its id at once;
//   - into an empty chain, res < copy_below: packed (ReceivePack);
//   - into a chain whose tail is the only reference to its buffer and whose
//     room holds all res bytes (copying on): copied there.
// A buffer copied from is lent again at once under the same id (Relend),
// so no buffer goes through the pool. Nothing allocates or throws. Every
// other completion (no buffer, errors, EOF, bundles, a full or shared
// tail, a budget without room, a foreign id) goes to TakeSlow(), which
// checks and reports it.
// The inline paths' (TakeInline, Visit, TakeBuffer) common checks: the
// lent_ entry of the completion's one buffer (data != nullptr), or nullptr
// unless the completion carries one (IORING_CQE_F_BUFFER, 1 <= res <=
// buffer_size) under an id the ring lent, on a ring without incremental
// mode. *id and *len: the completion's buffer id and res.
ABSL_ATTRIBUTE_ALWAYS_INLINE inline ProvidedBufferRing::Lent*
ProvidedBufferRing::InlineLent(const io_uring_cqe& cqe, uint32_t* id,
                               uint32_t* len) {
  const uint32_t flags = cqe.flags;
  *id = flags >> IORING_CQE_BUFFER_SHIFT;
  // res <= 0 wraps to a huge len - 1, so one compare bounds res to [1,
  // buffer_size_].
  *len = static_cast<uint32_t>(cqe.res);
  if ((flags & IORING_CQE_F_BUFFER) == 0 || *len - 1 >= buffer_size_ ||
      *id >= inline_ids_) [[unlikely]] {
    return nullptr;
  }
  Lent* const lent = &lent_[*id];
  if (lent->data == nullptr) [[unlikely]]
    return nullptr;  // not lent: TakeSlow() says so
  return lent;
}

// Take() of a one-buffer completion of `len` bytes (buffer id `id`, lent):
// BufferChain::Receive() copies it (the buffer is lent again at once) or
// links it. A linked buffer is replaced at once: a buffer from the pool
// (one inline acquire from this CPU's cache, where the consumed chains
// release theirs, so a loop that takes and consumes a message at a time
// alternates a release and an acquire there, and never runs the cache past
// what it may hand out without accounting) is lent again under the same id
// (Relend, in_ring_ unchanged, as after a copy). The first replacement
// that finds the pool dry leaves its id free and stops the tries until
// Refill(), which lends what the pool then has. Inline, for TakeInline()'s
// link into an empty chain, which Receive() does inline too.
ABSL_ATTRIBUTE_ALWAYS_INLINE inline void ProvidedBufferRing::TakeOne(
    uint16_t id, size_t len, BufferChain& out) {
  out.Reserve(out.slice_count() + 2);  // then Receive() cannot throw
  Lent& lent = lent_[id];
  std::byte* const data = lent.data;
  // A handle of the lent slot for Receive(); the ring keeps the slot
  // unless the chain takes the handle.
  Buffer buffer = internal::SharedAccess::GiveSlot(*pool_, lent.slot);
  if (out.Receive(buffer, len, {.copy_below = copy_below_, .pack = &*pack_}))
      [[likely]] {
    internal::SharedAccess::NoteHeld(*pool_, lent.slot,
                                     internal::kHeldAsAcquired);
    Buffer fresh;
    if (!replace_failed_) [[likely]] {
      fresh = pool_->TryAcquire();
      replace_failed_ = !fresh;
    }
    if (fresh) [[likely]] {
      std::byte* const d = fresh.data();
      lent.slot = internal::SharedAccess::TakeSlot(fresh);
      lent.data = d;
      internal::SharedAccess::NoteLent(*pool_, lent.slot, group_id_);
      Relend(id, d);
      ++replaced_;
    } else {
      lent.data = nullptr;
      free_ids_.push_back(id);  // reserved for every id: never reallocates
      --in_ring_;
    }
    // Low as Refill() counts it: what is left of the ring had no buffer
    // been replaced.
    if (in_ring_ - replaced_ < target_ / 4) ran_low_ = true;
  } else {
    internal::SharedAccess::TakeSlot(buffer);  // still the ring's
    Relend(id, data);
    ++copied_;
  }
}

ABSL_ATTRIBUTE_ALWAYS_INLINE inline bool ProvidedBufferRing::TakeInline(
    const io_uring_cqe& cqe, BufferChain& out) {
  uint32_t id, len;
  Lent* const found = InlineLent(cqe, &id, &len);
  if (found == nullptr) [[unlikely]]
    return false;
  Lent& lent = *found;
  std::byte* const src = lent.data;
  const auto bid = static_cast<uint16_t>(id);
  if (out.empty()) {
    // Either way the bytes pin a buffer: a bound chain whose budget has no
    // room for one goes to TakeSlow(), which takes the bytes and reports
    // the budget's limit.
    if (out.budget() != nullptr && out.budget()->room_bytes() < buffer_size_) {
      return false;
    }
    if (len >= copy_below_) {
      // Too many to pack: the buffer is linked as the chain's only slice
      // (Receive()'s inline case).
      TakeOne(bid, len, out);
      return true;
    }
    // A short partial of an empty chain: packed (see "Memory").
    if (!out.AppendPacked(absl::MakeConstSpan(src, len), *pack_)) {
      return false;
    }
    Relend(bid, src);
    ++copied_;
    return true;
  }
  // A short chain goes to the pack (TakeSlow(), BufferChain::Receive()),
  // not into room that would keep a buffer for its few bytes.
  if (copy_below_ == 0 || out.size() + len < copy_below_) return false;
  const absl::Span<std::byte> room = out.Preallocate();
  if (room.size() < len) return false;
  std::byte* const dst = room.data();
  // The bookkeeping first, so the copy is the last step (nothing to reload
  // after the call).
  out.Postallocate(len);
  Relend(bid, src);
  ++copied_;
  std::memcpy(dst, src, len);
  return true;
}

// TakeBuffer(): the caller's buffer and the lent one trade places; both are
// bare slots owned as handles own them (see lent_), so no count is touched.
ABSL_ATTRIBUTE_ALWAYS_INLINE inline bool ProvidedBufferRing::TakeBuffer(
    const io_uring_cqe& cqe, Buffer& buffer) noexcept {
  uint32_t id, len;
  Lent* const found = InlineLent(cqe, &id, &len);
  if (found == nullptr) [[unlikely]]
    return false;
  const auto bid = static_cast<uint16_t>(id);
  if (buffer.pool() != pool_ || !buffer) [[unlikely]] {
    if (buffer) return false;  // another pool's: Take() links the bytes
    TakeOut(bid, buffer);
    return true;
  }
  Lent& lent = *found;
  const uint32_t mine = internal::SharedAccess::ExchangeSlot(buffer, lent.slot);
  internal::SharedAccess::NoteTraded(*pool_, mine, lent.slot, group_id_);
  std::byte* const data = base_ + size_t{mine} * buffer_size_;
  lent.slot = mine;
  lent.data = data;
  Relend(bid, data);
  return true;
}

template <typename Fn>
ABSL_ATTRIBUTE_ALWAYS_INLINE inline bool ProvidedBufferRing::Visit(
    const io_uring_cqe& cqe, Fn&& fn) {
  uint32_t id, len;
  const Lent* const lent = InlineLent(cqe, &id, &len);
  if (lent == nullptr) [[unlikely]]
    return false;
  std::byte* const data = lent->data;
  // Lent again before fn runs, so that an exception leaves nothing behind:
  // the kernel cannot write the buffer before the next Refill() publishes
  // the entry.
  Relend(static_cast<uint16_t>(id), data);
  std::forward<Fn>(fn)(absl::Span<const std::byte>(data, len));
  return true;
}

}  // namespace bufpool

#endif  // BUFPOOL_INTERNAL_URING_INL_H_

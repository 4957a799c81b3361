// The pool's side of SharedBuffer: per-slot reference counts and taking a
// slot out of a Buffer handle. Not for users; bufpool/chain.h is the API.
//
// The counts are one uint32_t per slot, out of band like the pool's other
// per-slot data (never inside a buffer), in an array the pool calloc's the
// first time a SharedBuffer is made from it (AllocateRefs) and frees in its
// destructor. Each count has its slot's owner word beside it (the array
// holds kRefStride words a slot: count, owner), so the two share a cache
// line: which budget counts the slot, or that it is a ReceivePack's buffer
// (bufpool/budget.h, "Accounting"; BufferChain keeps them). A SharedBuffer
// made from a Buffer stores 0 there with the count's 1, so no owner word
// outlives the slices it describes. A slot's count is meaningful only
// while SharedBuffers hold it
// (or a ProvidedBufferRing lends it: then it is 1, see bufpool/uring.h):
// the first one stores 1, and the last one returns the slot to the pool
// without storing 0 (the next first one overwrites it).
//
// Memory ordering. The array pointer is published with a release CAS and
// read with an acquire load where a SharedBuffer is made from a Buffer, or
// where a ProvidedBufferRing lends a slot (Refs()); every other use of a count
// (Ref()) reads the pointer relaxed: it starts from an existing SharedBuffer,
// whose creation, and so the publish, happens-before the use (the SharedBuffer
// reached this thread through the caller's synchronisation), or from a
// ProvidedBufferRing, whose Create() read it with acquire (its first Refill())
// before the ring could be used (TakeBuffer()); the pointer never changes
// after it is set.
#ifndef BUFPOOL_INTERNAL_SHARED_ACCESS_H_
#define BUFPOOL_INTERNAL_SHARED_ACCESS_H_

#include <atomic>
#include <cstdint>
#include <utility>

#include "absl/base/attributes.h"
#include "bufpool/buffer_pool.h"
#include "bufpool/export.h"

namespace bufpool::internal {

// What holds a slot, where the pool alone cannot tell (BufferPool's holder
// records, src/pool/holders.h): the low byte a kind, a ring's group above.
enum HolderNote : uint32_t {
  kHeldAsAcquired = 0,  // as the pool sees it: handle, raw pointer, chain
  kHeldLent = 1,        // lent to a ProvidedBufferRing; group in bits 8..23
  kHeldSending = 2,     // in a HeldSend the kernel may still read
  kHeldReserved = 3,    // in a budget's reserve; its holder id in bits 8..31
};

struct BUFPOOL_EXPORT SharedAccess {
  // Words a slot in the counts array: [0] the count, [1] the owner word.
  static constexpr uint32_t kRefStride = 2;
  // Owner words. 0: no budget counts the slot. kOwnerPack: a ReceivePack's
  // buffer, whose slices chains count by their bytes. Otherwise a budget's
  // account id (BufferBudget::account_) above kOwnerRunBits bits holding
  // how many runs of the slot that budget's chains hold (saturating).
  static constexpr uint32_t kOwnerPack = ~uint32_t{0};
  static constexpr uint32_t kOwnerRunBits = 12;
  static constexpr uint32_t kOwnerRuns = (uint32_t{1} << kOwnerRunBits) - 1;

  // The counts array of `pool`, allocated on first use.
  ABSL_ATTRIBUTE_ALWAYS_INLINE static uint32_t* Refs(BufferPool& pool) {
    uint32_t* refs = pool.shared_refs_.load(std::memory_order_acquire);
    return refs != nullptr ? refs : AllocateRefs(pool);
  }
  // The count of `slot`, which a live SharedBuffer holds (see above).
  ABSL_ATTRIBUTE_ALWAYS_INLINE static std::atomic_ref<uint32_t> Ref(
      const BufferPool& pool, uint32_t slot) {
    return std::atomic_ref<uint32_t>(
        pool.shared_refs_.load(std::memory_order_relaxed)[slot * kRefStride]);
  }
  // The owner word of `slot`, which a live SharedBuffer holds (pointer as
  // for Ref()). Written only by the budget whose account it names, or from
  // 0 by a compare-and-swap, or by whoever holds the slot alone.
  ABSL_ATTRIBUTE_ALWAYS_INLINE static std::atomic_ref<uint32_t> Owner(
      const BufferPool& pool, uint32_t slot) {
    return std::atomic_ref<uint32_t>(pool.shared_refs_.load(
        std::memory_order_relaxed)[slot * kRefStride + 1]);
  }
  // Takes the slot out of a non-empty handle without returning it: the
  // handle becomes empty and the slot stays out (counted in in_use).
  ABSL_ATTRIBUTE_ALWAYS_INLINE static uint32_t TakeSlot(Buffer& buffer) {
    buffer.pool_ = nullptr;
    return buffer.slot_;
  }
  // A handle of a slot taken with TakeSlot() (the reverse of TakeSlot()).
  ABSL_ATTRIBUTE_ALWAYS_INLINE static Buffer GiveSlot(BufferPool& pool,
                                                      uint32_t slot) {
    return Buffer(&pool, slot);
  }
  // Puts `slot` (a slot out of its pool, as TakeSlot() leaves one) in a
  // non-empty handle in place of the one it held, which is returned, now
  // the caller's as TakeSlot() would leave it.
  ABSL_ATTRIBUTE_ALWAYS_INLINE static uint32_t ExchangeSlot(Buffer& buffer,
                                                            uint32_t slot) {
    return std::exchange(buffer.slot_, slot);
  }
  // Returns a slot taken with TakeSlot() to its pool.
  ABSL_ATTRIBUTE_ALWAYS_INLINE static void ReleaseSlot(BufferPool& pool,
                                                       uint32_t slot) {
    pool.ReleaseSlot(slot);
  }

  // Holder notes (bufpool/holders.h): `slot`, which the caller holds, is
  // now held as `note` says. A load and a branch where the pool does not
  // track holders; the note is kept only for a recorded slot.
  ABSL_ATTRIBUTE_ALWAYS_INLINE static void NoteHeld(const BufferPool& pool,
                                                    uint32_t slot,
                                                    uint32_t note) {
    if (pool.holders_ != nullptr) [[unlikely]] {
      pool.NoteHolder(slot, note);
    }
  }
  ABSL_ATTRIBUTE_ALWAYS_INLINE static void NoteLent(const BufferPool& pool,
                                                    uint32_t slot,
                                                    uint16_t group) {
    NoteHeld(pool, slot, kHeldLent | uint32_t{group} << 8);
  }
  // A ring's trade (ProvidedBufferRing::TakeBuffer): `lent` goes into the
  // ring, `back` comes out of it as a handle. One branch when untracked.
  ABSL_ATTRIBUTE_ALWAYS_INLINE static void NoteTraded(const BufferPool& pool,
                                                      uint32_t lent,
                                                      uint32_t back,
                                                      uint16_t group) {
    if (pool.holders_ != nullptr) [[unlikely]] {
      pool.NoteHolder(lent, kHeldLent | uint32_t{group} << 8);
      pool.NoteHolder(back, kHeldAsAcquired);
    }
  }
  // Whether `pool` keeps holder records (then the notes above are kept).
  static bool Tracked(const BufferPool& pool) {
    return pool.holders_ != nullptr;
  }

  // Out of line (src/pool/pool_calls.cc): calloc, then publish with a CAS;
  // a thread that loses the race frees its array and uses the winner's.
  // Aborts when calloc fails.
  static uint32_t* AllocateRefs(BufferPool& pool);
};

}  // namespace bufpool::internal

#endif  // BUFPOOL_INTERNAL_SHARED_ACCESS_H_

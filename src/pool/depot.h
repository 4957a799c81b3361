// Depot: the pool's store of free slots, between the CPU caches.
//
// The CPU caches refill and spill in batches of `batch` slots. Kept in the
// FreeList alone, a refill would walk the batch's next links one dependent
// load at a time (a visible share of the working-set benchmark; and when
// another core wrote the links, as in a hand-off, every step is a cache
// miss). So the
// depot also keeps whole batches as magazines: fixed arrays of `batch` slot
// numbers, out of band like the links. A spill copies a batch into an empty
// magazine and pushes the magazine's number onto `full_`; a refill pops one
// and copies it out. Two Treiber stacks of magazine numbers (`full_`,
// `empty_`, each a FreeList) hold them; a cache may keep one emptied
// magazine as its `spare` for its next spill, so a CPU cache that refills and
// spills alternately (the steady state of one busy CPU) does one CAS per
// batch each way, as the list alone did. Partial batches (one slot or a
// ReleaseBulk chunk with caches off, a drain, the hand-over to a
// waiter) go onto the slot list.
//
//   full_:  [m7] -> [m2] -> ...      each m: slots[batch], all free
//   empty_: [m4] -> [m0] -> ...      each m: contents meaningless
//   list_:  s12 -> s40 -> ...        single slots (FreeList)
//
// Invariants:
//   1. A free slot is in exactly one place: one full magazine, the list, or a
//      CPU cache (the pool's caches; not here).
//   2. A magazine number is in exactly one place: full_, empty_, one cache's
//      spare, or the hands of the one Push/Pop that popped it.
//   3. A magazine's contents are read or written only by the thread holding
//      its number (invariant 2), so they are plain integers.
//   4. Pop() returns 0 only when the list and full_ were both seen empty.
//
// Memory ordering: every hand-over of a magazine number goes through a
// FreeList push (seq_cst CAS: release) and pop (seq_cst CAS: acquire), so the
// writer's stores to the contents happen before the next holder's reads, and a
// reader's loads happen before the next writer's stores. The slots' buffers
// ride along the same edges. The list's and full_'s heads take part in the
// pool's sleeping-Acquire handshake exactly as the FreeList alone did (see
// PoolAccess::WakeWaiters): a push onto either is a seq_cst CAS, and a waiter's
// Pop() loads both heads seq_cst after registering.
//
// Thread safety: all methods may be called concurrently; `spare` belongs to
// the caller (a cache, under its lock).
#ifndef BUFPOOL_SRC_POOL_DEPOT_H_
#define BUFPOOL_SRC_POOL_DEPOT_H_

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <memory>
#include <utility>

#include "pool/free_list.h"

namespace bufpool {

class Depot {
 public:
  static constexpr uint32_t kNoSlot = FreeList::kNoSlot;
  // Below this a magazine saves too little walking to pay for its two CASes.
  static constexpr uint32_t kMinBatch = 4;

  // An empty depot for slots [0, capacity) whose caches move `batch` slots
  // at a time; batch < kMinBatch (caches off, or tiny) keeps no magazines.
  // Magazines: enough for every free slot, plus one spare for each of 64
  // caches; past that, spills fall back to the list (slower, still correct).
  Depot(uint32_t capacity, uint32_t batch)
      : batch_(batch >= kMinBatch ? batch : 0),
        magazines_(batch_ == 0 ? 0 : capacity / batch_ + 64),
        list_(capacity),
        full_(magazines_),
        empty_(magazines_),
        contents_(new uint32_t[size_t{magazines_} * batch_]) {
    for (uint32_t m = magazines_; m > 0; --m) {
      const uint32_t id = m - 1;
      empty_.PushOne(id);
    }
  }

  // Slots per magazine; 0 when the depot keeps none.
  uint32_t batch() const { return batch_; }

  // Pushes slots[0, n): whole magazines while they last (starting with
  // *spare when given), the rest onto the list. Pops of at least a batch
  // then return slots[0] first when nothing else is pushed in between
  // (smaller pops take from the list, which holds the tail).
  void Push(const uint32_t* slots, uint32_t n, uint32_t* spare) {
    const uint32_t whole = batch_ == 0 ? 0 : n / batch_;
    if (whole * batch_ != n) {  // the tail goes under the magazines' slots
      list_.Push(slots + whole * batch_, n - whole * batch_);
    }
    // Last batch first, so the first ends on top.
    for (uint32_t k = whole; k > 0; --k) {
      if (!PushMagazine(slots + (k - 1) * batch_, spare)) {
        list_.Push(slots, k * batch_);  // out of magazines: the rest, one CAS
        return;
      }
    }
  }

  // One slot (caches off): onto the list.
  void PushOne(uint32_t slot) { list_.PushOne(slot); }

  // Pops up to `max` slots into out[0, n), the most recently pushed first:
  // whole magazines while `max` has room for one, then the list. If that
  // finds nothing and `max` is smaller than a magazine, opens one: takes
  // `max` slots and puts the others onto the list, adding their number to
  // *reshelved (the caller owes waiters a wake-up for them). Returns 0 only
  // when full_ and the list were each seen empty (invariant 4), or max == 0.
  // With no magazines (batch() == 0) the list is the whole depot, and
  // *left, when given, is set to the slots it held right after this pop
  // (exact, as FreeList::Pop).
  uint32_t Pop(uint32_t* out, uint32_t max, uint32_t* spare,
               uint32_t* reshelved, uint32_t* left = nullptr) {
    uint32_t got = 0;
    while (batch_ != 0 && max - got >= batch_ &&
           PopMagazine(out + got, spare)) {
      got += batch_;
    }
    if (got < max) got += list_.Pop(out + got, max - got, left);
    if (got == 0 && max != 0 && max < batch_) {
      uint32_t m;
      if (full_.Pop(&m, 1) == 0) return 0;
      const uint32_t* const in = Contents(m);
      std::memcpy(out, in, max * sizeof(uint32_t));
      list_.Push(in + max, batch_ - max);  // at least one slot
      *reshelved += batch_ - max;
      Release(m, spare);
      got = max;
    }
    return got;
  }

  // One slot, or kNoSlot when empty: Pop(&slot, 1, nullptr, reshelved) with
  // the common case, the list, inline. Returned by value, so the caller's
  // slot stays in a register (passed by address, it slowed the uncached pair,
  // Pair/libbufpool_cache_off, measurably). Sets *left to
  // the free slots the depot held just after (exact for the list, which is
  // the whole depot when it keeps no magazines; see Size() otherwise).
  uint32_t PopOne(uint32_t* reshelved, uint32_t* left) {
    uint32_t slot;
    if (list_.Pop(&slot, 1, left) != 0) {
      if (batch_ != 0) {  // 64-bit: a racy read of full_ may overshoot
        *left = static_cast<uint32_t>(std::min<uint64_t>(
            uint64_t{*left} + uint64_t{full_.Depth()} * batch_, UINT32_MAX));
      }
      return slot;
    }
    if (batch_ == 0) return kNoSlot;
    slot = OpenOne(reshelved);
    *left = static_cast<uint32_t>(std::min<uint64_t>(Size(), UINT32_MAX));
    return slot;
  }

  // Free slots in the depot: exact whenever no push or pop is in flight
  // (FreeList::Depth).
  uint64_t Size() const {
    return list_.Depth() + uint64_t{full_.Depth()} * batch_;
  }

  // True when the list and full_ were each seen empty, their heads loaded
  // seq_cst (see FreeList::SeenEmpty).
  bool SeenEmpty() const { return list_.SeenEmpty() && full_.SeenEmpty(); }

  // Returns a cache's spare magazine.
  void ReturnSpare(uint32_t* spare) {
    if (*spare == kNoSlot) return;
    empty_.PushOne(*spare);
    *spare = kNoSlot;
  }

 private:
  [[gnu::noinline]] uint32_t OpenOne(uint32_t* reshelved) {
    uint32_t slot;
    return Pop(&slot, 1, nullptr, reshelved) != 0 ? slot : kNoSlot;
  }

  uint32_t* Contents(uint32_t m) { return &contents_[size_t{m} * batch_]; }

  // Fills a magazine (the spare, or one from empty_) with slots[0, batch_)
  // and publishes it; false when no empty magazine is left.
  bool PushMagazine(const uint32_t* slots, uint32_t* spare) {
    uint32_t m;
    if (spare != nullptr && *spare != kNoSlot) {
      m = std::exchange(*spare, kNoSlot);
    } else if (empty_.Pop(&m, 1) == 0) {
      return false;
    }
    std::memcpy(Contents(m), slots, batch_ * sizeof(uint32_t));
    full_.PushOne(m);  // release: publishes the contents (see top)
    return true;
  }

  // Takes a full magazine's slots into out[0, batch_); false when none.
  bool PopMagazine(uint32_t* out, uint32_t* spare) {
    uint32_t m;
    if (full_.Pop(&m, 1) == 0) return false;  // acquire: see top
    std::memcpy(out, Contents(m), batch_ * sizeof(uint32_t));
    Release(m, spare);
    return true;
  }

  // An emptied magazine becomes the caller's spare, or goes onto empty_.
  void Release(uint32_t m, uint32_t* spare) {
    if (spare != nullptr && *spare == kNoSlot) {
      *spare = m;
    } else {
      empty_.PushOne(m);
    }
  }

  const uint32_t batch_;
  const uint32_t magazines_;
  FreeList list_;
  FreeList full_;
  FreeList empty_;
  std::unique_ptr<uint32_t[]> contents_;
};

}  // namespace bufpool

#endif  // BUFPOOL_SRC_POOL_DEPOT_H_

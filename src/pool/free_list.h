// FreeList: the pool's shared, lock-free stack of free slot indices.
//
// A Treiber stack whose head is one 64-bit word, (tag << 32) | index, swapped
// with a single CAS. The tag counts successful pops, so a pop that read head
// A, was delayed while A was popped and pushed back, and then CASes against
// the stale word fails instead of installing a stale next link (the ABA
// problem), without double-width CAS or pointer bits. Pushes need not bump
// it: pushes alone can never bring back a head index that is still in the
// list. The tag wraps after 2^32 pops, so a stale CAS could only succeed if
// one pop were stalled across four billion others.
//
// Next links live out of band in `next_[slot]`, never inside a buffer, so a
// racing pop never reads user memory and users may overwrite whole buffers.
//
// Invariants:
//   1. A slot is in at most one place: this stack, one thread cache, or a
//      user's hands.
//   2. `next_[s]` is meaningful only while `s` is in the stack, and changes
//      only while `s` is outside it (the pusher links before its CAS).
//   3. Every value ever stored in `next_` or in the head's index is a slot
//      number < capacity or kNil, so even a stale walk stays in bounds.
//
// Memory ordering:
//   * Push: links are stored relaxed, then the head CAS is `seq_cst` (at
//     least release), which publishes the links and everything the releaser
//     wrote into the buffers to the thread that pops them.
//   * Pop: the head is loaded with `seq_cst` (at least acquire), and the CAS
//     reloads it with seq_cst on failure. Every change of the head is a CAS (a
//     read-modify-write), so the head's release sequence carries every earlier
//     push: the links of all slots reachable from the head we read are visible.
//     A link read after a concurrent pop/push may be newer, but then the tag
//     has moved and our CAS fails. A successful CAS means no push or pop
//     happened in between, so the chain we walked is the one we removed.
//   * Why seq_cst rather than release/acquire: BufferPool's sleeping
//     Acquire() must not miss a push (a store-load handshake with its
//     waiters_ counter, see PoolAccess::WakeWaiters). On x86 it is free: the
//     CAS is a locked instruction either way and a seq_cst load is a move.
//
// Thread safety: all methods may be called concurrently.
#ifndef BUFPOOL_SRC_POOL_FREE_LIST_H_
#define BUFPOOL_SRC_POOL_FREE_LIST_H_

#include <atomic>
#include <cstdint>
#include <memory>

namespace bufpool {

class FreeList {
 public:
  static constexpr uint32_t kNil = 0xffffffffu;

  // An empty stack for slots [0, capacity); capacity < kNil.
  explicit FreeList(uint32_t capacity)
      : next_(new std::atomic<uint32_t>[capacity]) {
    for (uint32_t i = 0; i < capacity; ++i) {
      next_[i].store(kNil, std::memory_order_relaxed);
    }
  }

  // Pushes slots[0, n) with one CAS (n >= 1); slots[0] becomes the new top.
  void Push(const uint32_t* slots, uint32_t n) {
    for (uint32_t i = 0; i + 1 < n; ++i) {
      next_[slots[i]].store(slots[i + 1], std::memory_order_relaxed);
    }
    PushChain(slots[0], slots[n - 1]);
  }

  // Push(&slot, 1), with the slot passed by value: kept in a register, not
  // stored and reloaded through memory on the uncached release path.
  void PushOne(uint32_t slot) { PushChain(slot, slot); }

  // Pops up to `max` slots into out[0, n) with one successful CAS; returns n
  // (0 when empty).
  uint32_t Pop(uint32_t* out, uint32_t max) {
    uint64_t head = head_.load(std::memory_order_seq_cst);
    for (;;) {
      uint32_t cur = IndexOf(head);
      if (cur == kNil || max == 0) return 0;
      uint32_t n = 0;
      out[n++] = cur;
      uint32_t next = next_[cur].load(std::memory_order_relaxed);
      while (n < max && next != kNil) {
        cur = next;
        out[n++] = cur;
        next = next_[cur].load(std::memory_order_relaxed);
      }
      // seq_cst on failure too: a retry that finds the list empty must be
      // ordered like the first load (see the file comment).
      if (head_.compare_exchange_weak(head, Pack(next, TagOf(head) + 1),
                                      std::memory_order_seq_cst,
                                      std::memory_order_seq_cst)) {
        return n;
      }
    }
  }

  bool empty() const {
    return IndexOf(head_.load(std::memory_order_relaxed)) == kNil;
  }

 private:
  // Pushes the chain first -> ... -> last, already linked, with one CAS.
  void PushChain(uint32_t first, uint32_t last) {
    uint64_t head = head_.load(std::memory_order_relaxed);
    uint64_t desired;
    do {
      next_[last].store(IndexOf(head), std::memory_order_relaxed);
      desired = Pack(first, TagOf(head));  // see the file comment
    } while (!head_.compare_exchange_weak(
        head, desired, std::memory_order_seq_cst, std::memory_order_relaxed));
  }

  static uint64_t Pack(uint32_t index, uint32_t tag) {
    return (uint64_t{tag} << 32) | index;
  }
  static uint32_t IndexOf(uint64_t word) { return static_cast<uint32_t>(word); }
  static uint32_t TagOf(uint64_t word) {
    return static_cast<uint32_t>(word >> 32);
  }

  std::unique_ptr<std::atomic<uint32_t>[]> next_;
  alignas(64) std::atomic<uint64_t> head_{Pack(kNil, 0)};
};

}  // namespace bufpool

#endif  // BUFPOOL_SRC_POOL_FREE_LIST_H_

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
// Links live out of band in `link_[slot]`, never inside a buffer, so a
// racing pop never reads user memory and users may overwrite whole buffers.
// A link holds the next slot down and the number of slots below it, so the
// list's length is known without a shared counter: a pop learns how many
// slots it left from the last link it read, and Depth() reads the top's.
// (With caches off the pool keeps its free-buffer count exact this way; a
// counter beside the list would cost two more locked instructions per
// uncached acquire/release pair.)
//
// Invariants:
//   1. A slot is in at most one place: this stack, one CPU's cache, or a
//      user's hands.
//   2. `link_[s]` is meaningful only while `s` is in the stack, and changes
//      only while `s` is outside it (the pusher links before its CAS).
//   3. Every next slot ever stored in `link_` or in the head's index is a slot
//      number < capacity or kNoSlot, so even a stale walk stays in bounds.
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
//   * Depths: a push reads the top's link to learn the depth below its own
//     slots, so its head loads (first and on CAS failure) are acquire: the
//     link it reads is then at least the one the top's pusher published. If
//     the top moved after that load, the CAS fails and the push relinks.
//   * Why seq_cst rather than release/acquire: BufferPool's sleeping
//     Acquire() must not miss a push (a store-load handshake with its
//     count of waiters, see PoolAccess::WakeWaiters). On x86 it is free: the
//     CAS is a locked instruction either way and a seq_cst load is a move.
//
// Thread safety: all methods may be called concurrently.
#ifndef BUFPOOL_SRC_POOL_FREE_LIST_H_
#define BUFPOOL_SRC_POOL_FREE_LIST_H_

#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <new>

namespace bufpool {

class FreeList {
 public:
  static constexpr uint32_t kNoSlot = 0xffffffffu;

  // An empty stack for slots [0, capacity); capacity < kNoSlot. The links
  // come zeroed from calloc, Link(0, 0): slot 0, in bounds (invariant 3),
  // and a large array's pages stay untouched until their slots are first
  // pushed, so an elastic pool's ceiling costs no memory here. Throws
  // std::bad_alloc when calloc fails.
  explicit FreeList(uint32_t capacity)
      : link_(static_cast<std::atomic<uint64_t>*>(std::calloc(
            capacity == 0 ? 1 : capacity, sizeof(std::atomic<uint64_t>)))) {
    static_assert(sizeof(std::atomic<uint64_t>) == sizeof(uint64_t) &&
                  std::atomic<uint64_t>::is_always_lock_free);
    if (link_ == nullptr) throw std::bad_alloc();
  }

  // Pushes slots[0, n) with one CAS (n >= 1); slots[0] becomes the new top.
  void Push(const uint32_t* slots, uint32_t n) {
    uint64_t head = head_.load(std::memory_order_acquire);  // for DepthOf
    do {
      // The links hold depths, which depend on the list below: (re)written
      // on every try. A retry needs a CAS lost to another thread; chains
      // run up to 64 slots (a caches-off ReleaseBulk chunk), longer only at
      // Create, thread exit and when magazines run out.
      uint32_t next = IndexOf(head);
      uint32_t below = DepthOf(head);
      for (uint32_t i = n; i > 0; --i) {
        link_[slots[i - 1]].store(Link(next, below), std::memory_order_relaxed);
        next = slots[i - 1];
        ++below;
      }
    } while (!head_.compare_exchange_weak(head, Pack(slots[0], TagOf(head)),
                                          std::memory_order_seq_cst,
                                          std::memory_order_acquire));
  }

  // Push(&slot, 1), with the slot passed by value: kept in a register, not
  // stored and reloaded through memory on the uncached release path.
  void PushOne(uint32_t slot) {
    uint64_t head = head_.load(std::memory_order_acquire);  // for DepthOf
    do {
      link_[slot].store(Link(IndexOf(head), DepthOf(head)),
                        std::memory_order_relaxed);
    } while (!head_.compare_exchange_weak(head, Pack(slot, TagOf(head)),
                                          std::memory_order_seq_cst,
                                          std::memory_order_acquire));
  }

  // Pops up to `max` slots into out[0, n) with one successful CAS; returns n
  // (0 when empty). When n > 0 and `left` is given, *left is the number of
  // slots the list held right after this pop (exact: read from the last
  // popped link, which the CAS validated).
  uint32_t Pop(uint32_t* out, uint32_t max, uint32_t* left = nullptr) {
    uint64_t head = head_.load(std::memory_order_seq_cst);
    for (;;) {
      uint32_t cur = IndexOf(head);
      if (cur == kNoSlot || max == 0) return 0;
      uint32_t n = 0;
      out[n++] = cur;
      uint64_t link = link_[cur].load(std::memory_order_relaxed);
      while (n < max && NextOf(link) != kNoSlot) {
        cur = NextOf(link);
        out[n++] = cur;
        link = link_[cur].load(std::memory_order_relaxed);
      }
      // seq_cst on failure too: a retry that finds the list empty must be
      // ordered like the first load (see the file comment).
      if (head_.compare_exchange_weak(head, Pack(NextOf(link), TagOf(head) + 1),
                                      std::memory_order_seq_cst,
                                      std::memory_order_seq_cst)) {
        if (left != nullptr) *left = BelowOf(link);
        return n;
      }
    }
  }

  // Slots in the list: exact whenever no push or pop is in flight.
  uint32_t Depth() const {
    return DepthOf(head_.load(std::memory_order_acquire));
  }

  bool empty() const {
    return IndexOf(head_.load(std::memory_order_relaxed)) == kNoSlot;
  }
  // empty(), with the head loaded seq_cst: for the pool's waiter handshake
  // (a check that must not miss a push, see src/pool/drain.cc).
  bool SeenEmpty() const {
    return IndexOf(head_.load(std::memory_order_seq_cst)) == kNoSlot;
  }

 private:
  static uint64_t Pack(uint32_t index, uint32_t tag) {
    return (uint64_t{tag} << 32) | index;
  }
  static uint32_t IndexOf(uint64_t word) { return static_cast<uint32_t>(word); }
  static uint32_t TagOf(uint64_t word) {
    return static_cast<uint32_t>(word >> 32);
  }
  // A link: the next slot down, and how many slots lie below this one.
  static uint64_t Link(uint32_t next, uint32_t below) {
    return (uint64_t{below} << 32) | next;
  }
  static uint32_t NextOf(uint64_t link) { return static_cast<uint32_t>(link); }
  static uint32_t BelowOf(uint64_t link) {
    return static_cast<uint32_t>(link >> 32);
  }
  // The number of slots in the list whose head word is `head`. Racy when
  // read outside a successful CAS (the top may have moved; see Push), which
  // is harmless: a stale top fails the CAS that follows.
  uint32_t DepthOf(uint64_t head) const {
    const uint32_t top = IndexOf(head);
    if (top == kNoSlot) return 0;
    return BelowOf(link_[top].load(std::memory_order_relaxed)) + 1;
  }

  struct Free {
    void operator()(std::atomic<uint64_t>* p) const { std::free(p); }
  };
  std::unique_ptr<std::atomic<uint64_t>[], Free> link_;
  alignas(64) std::atomic<uint64_t> head_{Pack(kNoSlot, 0)};
};

}  // namespace bufpool

#endif  // BUFPOOL_SRC_POOL_FREE_LIST_H_

// Accounting: in_use, cached, high_water and the failure counters, and
// Stats(), which reads them without a lock.
//
// The free slots are those in the depot and in the CPU caches:
//
//   in_use = committed - D - sum over caches of count(c)
//
// exact whenever no call is in flight. `committed` (Shared::committed) is
// the capacity of a fixed pool; an elastic pool raises it before grown
// slots reach the depot and lowers it after Trim() took slots out, so those
// moves, like the others, only ever count a slot in transit as in use. D is the
// depot's size: with caches off the depot is a single list whose links carry
// depths (exact at every pop, no counter); with caches on,
// `Shared::depot_free`, updated by one atomic add per batch moved. Moves keep
// an order so that a slot in transit counts as in use, never as free twice: a
// pop lowers depot_free before the cache's count rises, a push raises it after
// the count fell.
//
// High water. With caches off, a pop's `left` is the depot's exact size, so
// committed - left is in_use at that instant: high_water is exact. With
// caches on, the hits write nothing shared, so the pool cannot see when two
// caches' hits made a peak together; instead it bounds what hits can do.
// Each cache has a floor (CpuCache::floor; word 1 of an rseq cache, rseq.h)
// with floor <= count: a single pop hits only while count > floor, a single
// push only while count - floor < lend (BufferPool::lend_, one refill
// batch). The slots above the floor are lent: hits may hand them out without
// telling the pool. Shared::held_or_lent keeps
//
//   H = (buffers held by users) + sum over caches of (count - floor)
//
// A pop hit moves one slot from lent to held, a push hit one back: H does
// not change on a hit. It changes only out of line: a slow path hands out or
// takes back slots (Lent / Returned below), lends a cache more by lowering
// its floor (Lend: H rises by what the floor fell), reclaims what a cache
// lends (Reclaim, and the push that finds lend slots lent: H falls), or
// drains a cache (its lent slots are revoked). Batch moves between a cache
// and the depot move count and floor together, so they change neither term.
//
// Invariants, and why they give the promise:
//   1. The atomic is never below H: a rise is added before the change it
//      accounts for (before a Lend section, before a slot reaches its user),
//      a fall is subtracted after (after a Reclaim section, after the slot
//      left its user). A Lend that lends less than it added gives the rest
//      back afterwards.
//   2. Every rise records its result in high_water (UpdateMax), and a fall
//      only lowers the atomic, so high_water >= the atomic at every instant.
//   3. held <= H, since count - floor >= 0 in every cache.
// Hence high_water >= held at every instant: never below the true peak.
// Above it: at the moment high_water was recorded, H - held is what the
// caches lent and had not handed out. A cache lends at most `lend` (a Lend
// lowers the floor to count - lend, a push stops at count - floor = lend),
// so high_water <= peak + lend x (caches that lend at that moment), plus a
// Lend added ahead and not granted (at most lend, given back at once). Two
// threads taking turns (two caches) stay within peak + 2 x lend = two
// refill batches. A drain revokes what the drained cache lends.
//
// Memory ordering: every counter here is relaxed. They are statistics: each
// read-modify-write returns the exact value before it, and a reader that
// overlaps moves reads a moving picture (documented on Stats()).
#include <algorithm>
#include <cstdio>
#include <cstdlib>

#include "pool/pool_internal.h"

namespace bufpool {

void PoolAccess::DieCorrupt(const BufferPool& p, const char* what,
                            uint64_t value) {
  std::fprintf(stderr, "bufpool: internal error: %s (%llu) in pool %p\n", what,
               static_cast<unsigned long long>(value),
               static_cast<const void*>(&p));
  std::abort();
}

void PoolAccess::Popped(BufferPool& p, uint32_t n, uint32_t left,
                        uint32_t handed) {
  BufferPool::Shared& s = S(p);
  if (p.cache_capacity_ == 0) {
    // Caches off, elastic: held_or_lent counts the buffers users hold
    // (nothing is lent), raised here and lowered after each release, since
    // `left` misses the slots a grower or trimmer has in transit.
    if (s.growth != nullptr) {
      Lent(p, handed);
      return;
    }
    // Caches off, fixed: `left` is the depot's size after the pop, exact.
    const size_t committed = s.committed.load(std::memory_order_relaxed);
    internal::UpdateMax(s.high_water, static_cast<int64_t>(committed) - left,
                        committed);
    return;
  }
  s.depot_free.fetch_sub(n, std::memory_order_relaxed);
  if (handed != 0) Lent(p, handed);
}

void PoolAccess::Pushed(BufferPool& p, uint32_t n, uint32_t returned) {
  if (p.cache_capacity_ == 0) return;  // a push never raises in_use
  S(p).depot_free.fetch_add(n, std::memory_order_relaxed);
  if (returned != 0) Returned(p, returned);
  // A shared pool gives what it does not need back (shared_pool.cc).
  if (S(p).xproc != nullptr) [[unlikely]]
    SharedMaybeGive(p);
}

int64_t PoolAccess::DepotSize(const BufferPool& p) {
  return p.cache_capacity_ != 0
             ? S(p).depot_free.load(std::memory_order_relaxed)
             : static_cast<int64_t>(S(p).depot.Size());
}

int64_t PoolAccess::Cached(const BufferPool& p) {
  const BufferPool::Shared& s = S(p);
  int64_t total = 0;
  for (uint32_t i = 0; i < s.ncaches; ++i) total += CachedCount(s, i);
  return total;
}

uint32_t PoolAccess::TakeFromDepot(BufferPool& p, uint32_t* reshelved) {
  BufferPool::Shared& s = S(p);
  uint32_t slot;
  if (p.cache_capacity_ == 0) {
    uint32_t left;
    slot = s.depot.PopOne(reshelved, &left);
    if (slot == BufferPool::kNoSlot) return BufferPool::kNoSlot;
    Popped(p, 1, left, /*handed=*/1);
    return slot;
  }
  if (s.depot.Pop(&slot, 1, nullptr, reshelved) == 0) {
    return BufferPool::kNoSlot;
  }
  Popped(p, 1, 0, /*handed=*/1);
  return slot;
}

PoolStats BufferPool::Stats() const {
  const Shared& s = *shared_;
  const int64_t depot = PoolAccess::DepotSize(*this);
  int64_t cached = 0;
  for (uint32_t i = 0; i < s.ncaches; ++i) {
    cached += PoolAccess::CachedCount(s, i);
  }
  // Backed slots: the capacity of a fixed pool (see the top).
  const int64_t cap =
      static_cast<int64_t>(s.committed.load(std::memory_order_relaxed));
  return PoolStats{
      .capacity = capacity_,
      .in_use = static_cast<size_t>(
          std::clamp<int64_t>(cap - depot - cached, 0, cap)),
      .high_water = s.high_water.load(std::memory_order_relaxed),
      .acquire_failures = s.failures.load(std::memory_order_relaxed),
      .acquire_timeouts = s.timeouts.load(std::memory_order_relaxed),
      .cached = static_cast<size_t>(std::clamp<int64_t>(cached, 0, cap)),
      .committed = static_cast<size_t>(cap),
      .grows = s.growth == nullptr
                   ? 0
                   : s.growth->grows.load(std::memory_order_relaxed),
      .trims = s.growth == nullptr
                   ? 0
                   : s.growth->trims.load(std::memory_order_relaxed),
      .grow_failures = s.growth == nullptr ? 0
                                           : s.growth->grow_failures.load(
                                                 std::memory_order_relaxed),
      .processes = s.xproc == nullptr ? 1 : PoolAccess::SharedProcesses(*this),
      .reclaimed = s.xproc == nullptr ? 0
                                      : s.xproc->hdr->reclaimed.load(
                                            std::memory_order_relaxed),
  };
}

}  // namespace bufpool

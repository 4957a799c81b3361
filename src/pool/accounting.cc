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
// High water. Every change of depot_free is an event made by one cache (or
// by a call without one, low = 0): it raises high_water to
//
//   capacity - (depot_free just before the change) - low_water(c)
//
// and then restarts c's window (low_water = its count). Why it is never
// below the true peak: take the peak at time t*, and the first change of
// depot_free after it, made by cache c (or the next Stats()). depot_free did
// not change between t* and that event, so the value just before the event
// is D(t*); c made no move in between, so its window contains t* and
// low_water(c) <= count(c)(t*). Hence the estimate >= capacity - D(t*) -
// count(c)(t*) >= in_use(t*). It needs no read of another cache, so no
// interleaving can make it low. It counts the other caches' free slots as
// in use, so it may exceed the peak by them (at most cache_capacity() x
// CPUs); with caches off, or one cache in use, it is exact. Stats() adds its
// own estimate from every cache's low_water, so a peak made by cache hits
// after the last event is seen too. The rseq caches keep no low_water (a
// window restart would be a store outside their sequences): there low is 0
// throughout, the estimate capacity - D, never below the peak and above it
// by at most the cached slots.
//
// Memory ordering: every counter here is relaxed. They are statistics: each
// read-modify-write returns the exact value before it, and a reader that
// overlaps moves reads a moving picture (documented on Stats()).
#include <algorithm>
#include <cstdio>
#include <cstdlib>

#include "pool/pool_internal.h"

namespace bufpool {

namespace {

void UpdateMax(std::atomic<size_t>& target, int64_t value, size_t limit) {
  if (value <= 0) return;
  value = std::min<int64_t>(value, static_cast<int64_t>(limit));
  size_t seen = target.load(std::memory_order_relaxed);
  while (static_cast<size_t>(value) > seen &&
         !target.compare_exchange_weak(seen, static_cast<size_t>(value),
                                       std::memory_order_relaxed)) {
  }
}

}  // namespace

void PoolAccess::DieCorrupt(const BufferPool& p, const char* what,
                            uint64_t value) {
  std::fprintf(stderr, "bufpool: internal error: %s (%llu) in pool %p\n", what,
               static_cast<unsigned long long>(value),
               static_cast<const void*>(&p));
  std::abort();
}

void PoolAccess::Popped(BufferPool& p, uint32_t n, uint32_t left, uint32_t low,
                        uint32_t handed) {
  BufferPool::Shared& s = S(p);
  const int64_t before =
      p.cache_capacity_ != 0
          ? s.depot_free.fetch_sub(n, std::memory_order_relaxed)
          : int64_t{left} + n;
  const size_t committed = s.committed.load(std::memory_order_relaxed);
  UpdateMax(s.high_water,
            static_cast<int64_t>(committed) - before - low + handed, committed);
}

void PoolAccess::Pushed(BufferPool& p, uint32_t n, uint32_t low) {
  if (p.cache_capacity_ == 0) return;  // a push never raises in_use
  BufferPool::Shared& s = S(p);
  const int64_t before = s.depot_free.fetch_add(n, std::memory_order_relaxed);
  const size_t committed = s.committed.load(std::memory_order_relaxed);
  UpdateMax(s.high_water, static_cast<int64_t>(committed) - before - low,
            committed);
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
    Popped(p, 1, left, 0, /*handed=*/1);
    return slot;
  }
  if (s.depot.Pop(&slot, 1, nullptr, reshelved) == 0) {
    return BufferPool::kNoSlot;
  }
  Popped(p, 1, 0, 0, /*handed=*/1);
  return slot;
}

PoolStats BufferPool::Stats() const {
  const Shared& s = *shared_;
  const int64_t depot = PoolAccess::DepotSize(*this);
  int64_t cached = 0;
  int64_t lows = 0;
  for (uint32_t i = 0; i < s.ncaches; ++i) {
    const int64_t count = PoolAccess::CachedCount(s, i);
    cached += count;
    lows += std::min<int64_t>(
        count, s.caches[i].low_water.load(std::memory_order_relaxed));
  }
  // Backed slots: the capacity of a fixed pool (see the top).
  const int64_t cap =
      static_cast<int64_t>(s.committed.load(std::memory_order_relaxed));
  // Every cache's window contains any peak since the last event (see "High
  // water"), so the sum of their lows bounds the free slots then. Not
  // stored: read while another thread moves a batch, this picture can count
  // the batch in neither place, and the next event records the peak anyway.
  const auto open_windows =
      static_cast<size_t>(std::clamp<int64_t>(cap - depot - lows, 0, cap));
  return PoolStats{
      .capacity = capacity_,
      .in_use = static_cast<size_t>(
          std::clamp<int64_t>(cap - depot - cached, 0, cap)),
      .high_water =
          std::max(s.high_water.load(std::memory_order_relaxed), open_windows),
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
  };
}

}  // namespace bufpool

// BufferPool's own calls: creation and destruction, the single-buffer slow
// paths that the inline calls end in, the bulk and raw-pointer calls, and
// the checks that catch a bad raw pointer. Each reaches the caches through
// cpu_cache.cc and, when they and the depot are empty, drains through
// drain.cc.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <mutex>
#include <new>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "bufpool/internal/rseq.h"
#include "bufpool/internal/shared_access.h"
#include "pool/holders.h"
#include "pool/pool_internal.h"

namespace bufpool {

// The bulk calls move slots between the pool and the caller's span through a
// local array of this many.
constexpr uint32_t kBulkChunk = 64;

// ---- Creation and destruction ----------------------------------------------

namespace {

// The cache size `options` asks for, or the first option that is out of
// range, named in the error.
absl::StatusOr<size_t> CheckedCacheSize(const PoolOptions& options,
                                        uint32_t no_slot) {
  const size_t size = options.buffer_size;
  if (size < 64 || (size & (size - 1)) != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "PoolOptions.buffer_size must be a power of two >= 64, got ", size));
  }
  const size_t count = options.buffer_count;
  if (count == 0) {
    return absl::InvalidArgumentError(
        "PoolOptions.buffer_count must be at least 1, got 0");
  }
  if (count >= no_slot) {
    return absl::InvalidArgumentError(
        absl::StrCat("PoolOptions.buffer_count must be below ", no_slot,
                     " (slot numbers are 32-bit), got ", count));
  }
  if (count > std::numeric_limits<size_t>::max() / 2 / size) {
    return absl::InvalidArgumentError(
        absl::StrCat("PoolOptions.buffer_size * buffer_count overflows: ", size,
                     " * ", count));
  }
  // The 0.2 spelling, when given, names the field in the message too. It is
  // deprecated for callers; the library still reads it until 0.4.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
  const bool old_name = options.thread_cache_size != PoolOptions::kUseCacheSize;
  const size_t cache_size =
      old_name ? options.thread_cache_size : options.cache_size;
#pragma GCC diagnostic pop
  if (cache_size > kMaxCacheSize) {
    return absl::InvalidArgumentError(absl::StrCat(
        "PoolOptions.", old_name ? "thread_cache_size" : "cache_size",
        " must be at most kMaxCacheSize (", kMaxCacheSize, "), got ",
        cache_size));
  }
  return cache_size;
}

// `why` as Create()'s error: its code, and its message after the pool's
// size.
absl::Status CreateError(const PoolOptions& options, const absl::Status& why) {
  return absl::Status(
      why.code(),
      absl::StrCat("BufferPool::Create(", options.buffer_count, " x ",
                   options.buffer_size, " bytes): ", why.message()));
}

// The region: buffer_count buffers mapped (populated and locked as
// `options` ask), `ceiling` reserved.
absl::StatusOr<Arena> MapRegion(const PoolOptions& options, size_t ceiling) {
  const size_t size = options.buffer_size;
  absl::StatusOr<Arena> arena = Arena::Map({.size = size * options.buffer_count,
                                            .huge_pages = options.huge_pages,
                                            .populate = options.populate,
                                            .lock_memory = options.lock_memory,
                                            .reserve = size * ceiling});
  if (!arena.ok()) return CreateError(options, arena.status());
  return arena;
}

}  // namespace

void PoolAccess::InitFixedFields(BufferPool& p, const Arena& arena,
                                 const PoolOptions& options, size_t cache_size,
                                 size_t ceiling) {
  const size_t size = options.buffer_size;
  p.base_ = arena.data();
  p.huge_pages_ = arena.huge_pages();
  p.buffer_size_ = size;
  p.capacity_ = ceiling;
  p.region_bytes_ = ceiling * size;
  p.cache_capacity_ = std::min(cache_size, options.buffer_count / 8);
  // One refill batch: the crossings of the lend window then coincide with
  // the refills and spills a working set makes anyway; two caches lending
  // at once overstate high_water by at most two batches (accounting.cc,
  // "High water").
  p.lend_ = std::max<uint32_t>(1, RefillBatch(p));
  SetWaiters(p, 0, std::memory_order_relaxed);
  p.shift_ = static_cast<unsigned>(__builtin_ctzll(size));
  p.scrub_ = options.scrub_on_release;
  // State bytes: a power of two >= count and >= 64 entries, all "not
  // raw". Slot i's byte is at (i * kStateMix) & state_mask_, a bijection,
  // so slots near each other land on different cache lines and two
  // threads cycling their own slots do not write one line from two cores.
  size_t states = 64;
  while (states < ceiling) states *= 2;
  p.state_mask_ = static_cast<uint32_t>(states - 1);
  p.state_ = std::make_unique<std::atomic<uint8_t>[]>(states);
}

absl::StatusOr<size_t> PoolAccess::InitShared(BufferPool& p, Arena&& arena,
                                              const PoolOptions& options) {
  p.shared_ = std::make_unique<SharedState>(
      std::move(arena), static_cast<uint32_t>(p.capacity_),
      p.cache_capacity_ == 0 ? 0 : RefillBatch(p), CpuCount(),
      static_cast<uint32_t>(p.cache_capacity_));
  const absl::Status caches =
      InitCaches(*p.shared_, static_cast<uint32_t>(p.cache_capacity_));
  if (!caches.ok()) return caches;
  return InitGrowth(p, *p.shared_, options);
}

void PoolAccess::FillDepot(BufferPool& p, std::vector<uint32_t>& ready) {
  const auto n = static_cast<uint32_t>(ready.size());
  // Slot 0 on top, so a fresh pool hands buffers out in address order.
  for (uint32_t i = 0; i < n; ++i) ready[i] = i;
  p.shared_->depot.Push(ready.data(), n, nullptr);
  p.shared_->depot_free.store(static_cast<int64_t>(n),
                              std::memory_order_relaxed);
  BUFPOOL_INTERNAL_POISON(p.base_, p.buffer_size_ * n);
}

void PoolAccess::InitInlinePaths(BufferPool& p, TrackHolders track) {
  if (p.shared_->rseq) {
    p.rseq_base_ = p.shared_->rseq_base;
    p.rseq_cpus_ = p.shared_->ncaches;
    p.rseq_index_ = static_cast<uint32_t>(p.shared_->rseq_index);
    p.rseq_release_cpus_ = p.scrub_ ? 0 : p.rseq_cpus_;
  }
  if (p.holders_ != nullptr) {
    if (track == TrackHolders::kAll) {
      // Every single acquire and release fails its inline sequence at the
      // index check and comes out of line, to AcquireTracked() and
      // ReleaseTracked() (holders.cc), which run the same sequences with
      // the real cache count and record each acquire.
      p.rseq_cpus_ = 0;
      p.rseq_release_cpus_ = 0;
    } else {
      // kSampled stays inline: a countdown on each acquire, a mark read on
      // each release (internal/buffer_pool_inl.h).
      p.holder_marks_ = p.holders_->marks();
    }
  }
  p.inline_index_ =
      p.rseq_index_ |
      (p.holder_marks_ != nullptr ? internal::rseq::kSampledTag : 0);
}

absl::StatusOr<std::unique_ptr<BufferPool>> BufferPool::Create(
    const PoolOptions& options) {
  const absl::StatusOr<size_t> cache_size = CheckedCacheSize(options, kNoSlot);
  if (!cache_size.ok()) return cache_size.status();
  if (absl::Status s = PoolAccess::CheckGrowthOptions(options); !s.ok()) {
    return s;
  }
  const absl::StatusOr<TrackHolders> track = ResolveTrackHolders(options);
  if (!track.ok()) return track.status();
  if (options.shared) {  // shared_pool.cc
    return PoolAccess::CreateShared(options, *cache_size, *track);
  }
  // Slots: the ceiling of an elastic pool (growth.cc), all reserved now.
  const size_t ceiling = options.max_buffer_count != 0
                             ? options.max_buffer_count
                             : options.buffer_count;
  absl::StatusOr<Arena> arena = MapRegion(options, ceiling);
  if (!arena.ok()) return arena.status();

  // Everything Create() allocates, and the caches' area, can fail: each
  // failure is a Status, never an exception. A pool whose Create() failed
  // is destroyed without shared_ (see ~BufferPool).
  std::unique_ptr<BufferPool> pool;
  std::vector<uint32_t> ready;  // slots free at once: rounded up when elastic
  try {
    pool.reset(new BufferPool());
    PoolAccess::InitFixedFields(*pool, *arena, options, *cache_size, ceiling);
    const absl::StatusOr<size_t> backed =
        PoolAccess::InitShared(*pool, std::move(*arena), options);
    if (!backed.ok()) {
      pool->shared_.reset();
      return CreateError(options, backed.status());
    }
    ready.resize(*backed);
    if (*track != TrackHolders::kOff) {
      pool->holders_ = std::make_unique<HolderTable>(
          *track, options.holder_sample_every, ceiling);
    }
  } catch (const std::bad_alloc&) {
    if (pool != nullptr) pool->shared_.reset();
    return CreateError(
        options, absl::ResourceExhaustedError(
                     "out of memory for the pool's bookkeeping (state bytes, "
                     "depot, caches, holder records)"));
  }
  PoolAccess::FillDepot(*pool, ready);
  PoolAccess::InitInlinePaths(*pool, *track);
  PoolAccess::Register(*pool);
  return pool;
}

BufferPool::~BufferPool() {
  if (shared_ == nullptr) return;  // Create() failed before the pool was made
  if (shared_->xproc != nullptr && shared_->xproc->forked) {
    // A fork() child's copy of its parent's shared pool: the parent owns
    // what it holds; only the mappings and descriptors go.
    PoolAccess::Unregister(*this);
    return;
  }
  // Raw pointers out are marked in state_ and can be named; handles are not,
  // so the total comes from the accounting, exact here because nothing may
  // run concurrently with destruction. The scan needs no lock.
  size_t raw = 0;
  std::string where;
  for (size_t i = 0; i < capacity_; ++i) {
    if (State(static_cast<uint32_t>(i)).load(std::memory_order_relaxed) ==
        kSlotRaw) {
      if (raw < 8) absl::StrAppend(&where, raw == 0 ? "slots " : ", ", i);
      ++raw;
    }
  }
  if (raw > 8) absl::StrAppend(&where, ", ...");
  const int64_t free_now =
      PoolAccess::DepotSize(*this) + PoolAccess::Cached(*this);
  // Backed slots (the capacity, or what an elastic pool has grown to).
  const auto backed =
      static_cast<int64_t>(shared_->committed.load(std::memory_order_relaxed));
  const size_t out = std::max<size_t>(
      raw,
      static_cast<size_t>(std::clamp<int64_t>(backed - free_now, 0, backed)));
  if (out != 0) {
    if (out > raw) {
      absl::StrAppend(&where, raw == 0 ? "" : " as raw pointers; ", out - raw,
                      " held by Buffer handles, chains or rings");
    }
    std::fprintf(stderr,
                 "bufpool: BufferPool destroyed while %zu buffer(s) still in "
                 "use (%s); not unmapping memory that is held\n",
                 out, where.c_str());
    // Who holds them: acquire sites when tracked, else counts and the
    // switch that turns tracking on (holders.cc).
    std::fputs(Report(20, out).c_str(), stderr);
    std::abort();
  }
  if (shared_->xproc != nullptr) PoolAccess::SharedLeave(*this);
  PoolAccess::Unregister(*this);
  BUFPOOL_INTERNAL_UNPOISON(base_, capacity_ * buffer_size_);
  std::free(shared_refs_.load(std::memory_order_relaxed));
}

uint32_t* internal::SharedAccess::AllocateRefs(BufferPool& pool) {
  // calloc: zeroed pages the program never touches cost nothing, and pools
  // that never make a SharedBuffer never pay for the array at all.
  auto* fresh = static_cast<uint32_t*>(
      std::calloc(pool.capacity_ * kRefStride, sizeof(uint32_t)));
  if (fresh == nullptr) {
    std::fprintf(stderr,
                 "bufpool: out of memory for the SharedBuffer reference "
                 "counts of a pool of %zu buffers\n",
                 pool.capacity_);
    std::abort();
  }
  // Publish once. acq_rel: the release half makes the zeroed array visible
  // to whoever loads the pointer with acquire (SharedAccess::Refs); on
  // failure the acquire load sees the winner's array, and ours is dropped.
  uint32_t* expected = nullptr;
  if (pool.shared_refs_.compare_exchange_strong(expected, fresh,
                                                std::memory_order_acq_rel,
                                                std::memory_order_acquire)) {
    return fresh;
  }
  std::free(fresh);
  return expected;
}

// ---- Single buffers ---------------------------------------------------------

uint32_t BufferPool::AcquireSlow() noexcept {
  PoolAccess::CheckNotForked(*this);
  if (holders_ != nullptr) [[unlikely]] {
    return AcquireTracked();
  }
  return AcquireUntracked();
}

uint32_t BufferPool::AcquireUntracked() noexcept {
  uint32_t reshelved = 0;
  uint32_t slot = kNoSlot;
  if (rseq_base_ != nullptr) {  // the hit: one sequence (rseq.h)
    // shared_->ncaches, not rseq_cpus_, which is 0 in a tracked pool.
    slot = internal::rseq::Pop(rseq_base_, shared_->ncaches, rseq_index_);
    if (slot != internal::rseq::kNoSlot) [[likely]] {
      BUFPOOL_INTERNAL_UNPOISON(SlotData(slot), buffer_size_);
      return slot;
    }
    // This CPU's cache lends nothing: its lend or refill, without popping
    // it again; the other caches only when that finds nothing.
    slot = PoolAccess::RseqTakeMissed(*this, &reshelved);
  }
  if (slot == kNoSlot) {
    slot = PoolAccess::TakeAnywhere(*this, /*lock_all=*/false, &reshelved);
  }
  if (PoolAccess::Refills(*this)) [[unlikely]] {  // growth.cc, shared_pool.cc
    if (slot == kNoSlot) slot = PoolAccess::GrowAndTake(*this, &reshelved);
    PoolAccess::IdleTick(*this);
  }
  PoolAccess::WakeWaiters(*this, reshelved);
  if (slot == kNoSlot) {
    shared_->failures.fetch_add(1, std::memory_order_relaxed);
    return kNoSlot;
  }
  BUFPOOL_INTERNAL_UNPOISON(SlotData(slot), buffer_size_);
  return slot;
}

void BufferPool::ReleaseSlow(uint32_t slot) noexcept {
  PoolAccess::CheckNotForked(*this);
  if (holders_ != nullptr) [[unlikely]] {
    return ReleaseTracked(slot);
  }
  ReleaseUntracked(slot);
}

void BufferPool::ReleaseUntracked(uint32_t slot) noexcept {
  if (scrub_) std::memset(SlotData(slot), 0, buffer_size_);
  BUFPOOL_INTERNAL_POISON(SlotData(slot), buffer_size_);
  if (shared_->ncaches == 0) {
    shared_->depot.PushOne(slot);
    // Elastic: after the push (accounting.cc, Popped).
    if (shared_->growth != nullptr) [[unlikely]] {
      PoolAccess::Returned(*this, 1);
    }
    if (shared_->xproc != nullptr) [[unlikely]] {
      PoolAccess::SharedMaybeGive(*this);
    }
    PoolAccess::WakeWaiters(*this, 1);
    return;
  }
  if (rseq_base_ != nullptr) {
    if (internal::rseq::Push(rseq_base_, shared_->ncaches, rseq_index_,
                             &release_limit_, lend_, slot)) [[likely]] {
      return;  // the hit: one sequence
    }
    PoolAccess::WakeWaiters(*this, PoolAccess::RseqGive(*this, slot));
    return;
  }
  CpuCache& c = PoolAccess::ThisCpu(*this);
  uint32_t pushed = 0;
  {
    // Held by a drainer (or another thread on this CPU): the depot,
    // without waiting (drain.cc, "No thread waits for a drainer").
    std::unique_lock<std::mutex> lock(c.mu, std::try_to_lock);
    if (!lock.owns_lock()) {
      if (const PassBy pass(shared_->passing, shared_->forking); pass.ok()) {
        pushed = PoolAccess::RseqGiveBulk(*this, &slot, 1);
      } else {
        lock.lock();  // a fork() holds it
      }
    }
    if (lock.owns_lock()) pushed = PoolAccess::PushLocked(*this, c, slot);
  }
  PoolAccess::WakeWaiters(*this, pushed);
}

PerCpuMode BufferPool::per_cpu_mode() const {
  if (shared_->ncaches == 0) return PerCpuMode::kOff;
  if (!shared_->rseq) return PerCpuMode::kLocked;
  return shared_->rseq_index == internal::rseq::kMmCidField
             ? PerCpuMode::kRseqMmCid
             : PerCpuMode::kRseq;
}

namespace {

// AcquireBulkImpl's takes, one for each way the pool keeps its free slots:
// each hands `hand_out` up to `want` slots, in the order to hand them out,
// fewer only when it found no more. *reshelved: as in Depot::Pop.

// The rseq caches: a chunk per turn: a section, the depot, a drain.
template <class HandOut>
void TakeBulkRseq(BufferPool& p, size_t want, uint32_t* reshelved,
                  HandOut& hand_out) {
  uint32_t chunk[kBulkChunk];
  for (size_t got = 0; got < want;) {
    const uint32_t n = PoolAccess::RseqTakeChunk(
        p, chunk,
        static_cast<uint32_t>(std::min<size_t>(kBulkChunk, want - got)),
        reshelved);
    if (n == 0) break;
    for (uint32_t i = 0; i < n; ++i) hand_out(chunk[i]);
    got += n;
  }
}

// The locked caches: this CPU's cache, refilled from the depot, then the
// other CPUs' caches.
template <class HandOut>
void TakeBulkLocked(BufferPool& p, size_t want, uint32_t* reshelved,
                    HandOut& hand_out) {
  size_t got = 0;
  CpuCache& c = PoolAccess::ThisCpu(p);
  // Held by a drainer: straight to the loop below, whose first stop is
  // the depot.
  if (const std::unique_lock<std::mutex> lock(c.mu, std::try_to_lock);
      lock.owns_lock()) {
    while (got < want) {
      uint32_t n = c.count.load(std::memory_order_relaxed);
      if (n == 0) {
        // While someone waits, take no more than this call hands out, so
        // nothing is parked here that a waiter needs.
        const uint32_t batch =
            PoolAccess::Waiting(p)
                ? static_cast<uint32_t>(
                      std::min<size_t>(want - got, PoolAccess::RefillBatch(p)))
                : PoolAccess::RefillBatch(p);
        n = PoolAccess::Refill(p, c, batch, reshelved);
        if (n == 0) break;
      }
      const auto take = static_cast<uint32_t>(std::min<size_t>(n, want - got));
      n -= take;
      // Held now: the slots taken, less those c lent (accounting.cc).
      if (c.floor > n) {
        PoolAccess::Lent(p, c.floor - n);
        c.floor = n;
      }
      c.count.store(n, std::memory_order_relaxed);
      // The cache's top (most recently freed) first.
      for (uint32_t i = n + take; i > n; --i) hand_out(c.slots[i - 1]);
      got += take;
    }
  }
  // This CPU's cache and the depot are empty: the other CPUs' caches.
  for (; got < want; ++got) {
    const uint32_t slot =
        PoolAccess::TakeAnywhere(p, /*lock_all=*/false, reshelved);
    if (slot == Depot::kNoSlot) break;
    hand_out(slot);
  }
}

// No caches: the depot, a chunk per pop.
template <class HandOut>
void TakeBulkDepot(BufferPool& p, size_t want, uint32_t* reshelved,
                   HandOut& hand_out) {
  uint32_t direct[kBulkChunk];
  for (size_t got = 0; got < want;) {
    uint32_t left = 0;
    const uint32_t n = PoolAccess::S(p).depot.Pop(
        direct, static_cast<uint32_t>(std::min<size_t>(kBulkChunk, want - got)),
        nullptr, reshelved, &left);
    if (n == 0) break;
    PoolAccess::Popped(p, n, left, /*handed=*/n);
    for (uint32_t i = 0; i < n; ++i) hand_out(direct[i]);  // top first
    got += n;
  }
}

}  // namespace

// The bulk paths, shared by the handle and raw-pointer APIs. `emit(i, slot)`
// stores the i-th slot handed out (and, for raw pointers, marks it).
template <class Emit>
size_t BufferPool::AcquireBulkImpl(size_t want, Emit emit) {
  PoolAccess::CheckNotForked(*this);
  const SharedForkGate gate(shared_->bulk_gate);  // all before or after a fork
  size_t got = 0;
  uint32_t reshelved = 0;  // as in Depot::Pop
  auto hand_out = [&](uint32_t slot) {
    BUFPOOL_INTERNAL_UNPOISON(SlotData(slot), buffer_size_);
    if (holders_ != nullptr) [[unlikely]] {
      holders_->Acquired(*this, slot);
    }
    emit(got++, slot);
  };
  if (shared_->rseq) {
    TakeBulkRseq(*this, want, &reshelved, hand_out);
  } else if (shared_->ncaches != 0) {
    TakeBulkLocked(*this, want, &reshelved, hand_out);
  } else {
    TakeBulkDepot(*this, want, &reshelved, hand_out);
  }
  // Everything free is taken: an elastic pool grows for the rest.
  while (got < want && PoolAccess::Refills(*this)) {
    const uint32_t slot = PoolAccess::GrowAndTake(*this, &reshelved);
    if (slot == kNoSlot) break;
    hand_out(slot);
  }
  if (got < want) shared_->failures.fetch_add(1, std::memory_order_relaxed);
  PoolAccess::WakeWaiters(*this, reshelved);
  return got;
}

// `take_slot(i)` checks and takes the i-th entry, returning its slot, or
// kNoSlot to skip it; `clear(first, last)` empties entries [first, last)
// once they are read. A span that lives inside this pool's region may sit in
// one of the buffers released, so it is read whole before any buffer goes
// back (scrubbed, poisoned, or reused by another thread); other spans go in
// chunks of kBulkChunk, each read and cleared before its buffers go back.
template <class TakeSlot, class Clear>
void BufferPool::ReleaseBulkImpl(size_t count, const void* span_bytes,
                                 TakeSlot take_slot, Clear clear) {
  PoolAccess::CheckNotForked(*this);
  // A span inside the region is read whole first; its room is allocated
  // before the gate below, so no malloc lock is taken while holding it.
  const bool whole = count > kBulkChunk && Contains(span_bytes);
  std::vector<uint32_t> all;
  if (whole) all.reserve(count);
  // From the first slot taken out of the span to the last one given back,
  // all before or all after a fork (ForkGate).
  const SharedForkGate gate(shared_->bulk_gate);
  auto give = [this](uint32_t* slots, uint32_t k) {
    if (k == 0) return;
    for (uint32_t i = 0; i < k; ++i) {
      if (holders_ != nullptr) [[unlikely]] {
        holders_->Released(slots[i]);
      }
      if (scrub_) std::memset(SlotData(slots[i]), 0, buffer_size_);
      BUFPOOL_INTERNAL_POISON(SlotData(slots[i]), buffer_size_);
    }
    uint32_t pushed = k;
    if (shared_->ncaches == 0) {
      shared_->depot.Push(slots, k, nullptr);
      // Elastic: after the push (accounting.cc, Popped).
      if (shared_->growth != nullptr) PoolAccess::Returned(*this, k);
      if (shared_->xproc != nullptr) PoolAccess::SharedMaybeGive(*this);
    } else if (shared_->rseq) {
      // This CPU's cache in one section while it has room; the rest to
      // the depot in one push.
      const uint32_t cached = internal::rseq::PushBatch(
          rseq_base_, shared_->ncaches, rseq_index_, &release_limit_, slots, k);
      // Under the floor: no longer held, and not lent (accounting.cc).
      if (cached != 0) PoolAccess::Returned(*this, cached);
      pushed = cached == k ? 0
                           : PoolAccess::RseqGiveBulk(*this, slots + cached,
                                                      k - cached);
    } else {
      CpuCache& c = PoolAccess::ThisCpu(*this);
      const std::unique_lock<std::mutex> lock(c.mu, std::try_to_lock);
      pushed = lock.owns_lock() ? PoolAccess::PushManyLocked(*this, c, slots, k)
                                : PoolAccess::RseqGiveBulk(*this, slots, k);
    }
    PoolAccess::WakeWaiters(*this, pushed);
  };
  if (whole) {
    for (size_t i = 0; i < count; ++i) {
      const uint32_t slot = take_slot(i);
      if (slot != kNoSlot) all.push_back(slot);
    }
    clear(0, count);
    for (size_t first = 0; first < all.size(); first += kBulkChunk) {
      give(all.data() + first, static_cast<uint32_t>(std::min<size_t>(
                                   kBulkChunk, all.size() - first)));
    }
    return;
  }
  uint32_t freed[kBulkChunk];
  for (size_t first = 0; first < count;) {
    const size_t last = std::min<size_t>(count, first + kBulkChunk);
    uint32_t k = 0;
    for (size_t i = first; i < last; ++i) {
      const uint32_t slot = take_slot(i);
      if (slot != kNoSlot) freed[k++] = slot;
    }
    clear(first, last);
    first = last;
    give(freed, k);
  }
}

size_t BufferPool::TryAcquireBulk(absl::Span<Buffer> out) {
  for (Buffer& b : out) b.Reset();
  Buffer* const dst = out.data();
  return AcquireBulkImpl(out.size(), [this, dst](size_t i, uint32_t slot) {
    dst[i].pool_ = this;  // empty since the Reset above
    dst[i].slot_ = slot;
  });
}

void BufferPool::ReleaseBulk(absl::Span<Buffer> in) {
  static_assert(std::is_standard_layout_v<Buffer> && sizeof(Buffer) == 16);
  Buffer* const src = in.data();
  // Another pool's handles wait until the whole span is read (their buffer
  // may hold it), then go home one by one.
  std::vector<Buffer> foreign;
  // Room for them before the fork gate is taken (see ReleaseBulkImpl).
  size_t foreign_count = 0;
  for (const Buffer& b : in) {
    foreign_count += b.pool_ != this && b.pool_ != nullptr;
  }
  if (foreign_count != 0) foreign.reserve(foreign_count);
  ReleaseBulkImpl(
      in.size(), src,
      [this, src, &foreign](size_t i) {
        Buffer& b = src[i];
        if (b.pool_ != this) {
          if (b.pool_ != nullptr) foreign.push_back(std::move(b));
          return kNoSlot;
        }
        return b.slot_;
      },
      [src](size_t first, size_t last) {
        // Every handle of the chunk is empty now in effect; one pass of wide
        // stores rather than one store each inside the loop.
        std::memset(static_cast<void*>(src + first), 0,
                    (last - first) * sizeof(Buffer));
      });
  foreign.clear();  // after every chunk was read: one may hold the span
}

size_t BufferPool::TryAcquireRawBulk(absl::Span<std::byte*> out) {
  std::byte** const dst = out.data();
  // Locals: the stores below (a byte, a pointer) could otherwise alias these
  // members and force a reload per buffer.
  std::byte* const base = base_;
  const size_t size = buffer_size_;
  std::atomic<uint8_t>* const states = state_.get();
  const uint32_t state_mask = state_mask_;
  const size_t got = AcquireBulkImpl(out.size(), [&](size_t i, uint32_t slot) {
    states[(slot * kStateMix) & state_mask].store(kSlotRaw,
                                                  std::memory_order_relaxed);
    dst[i] = base + static_cast<size_t>(slot) * size;
  });
  std::fill(out.begin() + got, out.end(), nullptr);
  return got;
}

void BufferPool::ReleaseRawBulk(absl::Span<std::byte* const> in) {
  std::byte* const* const src = in.data();
  const std::byte* const base = base_;  // locals: see TryAcquireRawBulk
  const unsigned shift = shift_;
  const size_t capacity = capacity_;
  std::atomic<uint8_t>* const states = state_.get();
  const uint32_t state_mask = state_mask_;
  ReleaseBulkImpl(
      in.size(), src,
      [&](size_t i) {
        if (src[i] == nullptr) return kNoSlot;  // the tail of a short fill
        const uint64_t index = internal::SlotOrHuge(src[i], base, shift);
        if (index >= capacity) [[unlikely]]
          DieNotFromPool(src[i]);
        const auto slot = static_cast<uint32_t>(index);
        std::atomic<uint8_t>& state = states[(slot * kStateMix) & state_mask];
        if (state.load(std::memory_order_relaxed) != kSlotRaw) [[unlikely]] {
          DieNotRaw("ReleaseRawBulk", slot);
        }
        state.store(kSlotNotRaw, std::memory_order_relaxed);
        return slot;
      },
      [](size_t, size_t) {});
}

Buffer BufferPool::Adopt(std::byte* p) {
  const uint64_t index = SlotOrHuge(p);
  if (index >= capacity_) DieNotFromPool(p);
  const auto slot = static_cast<uint32_t>(index);
  if (State(slot).load(std::memory_order_relaxed) != kSlotRaw) {
    DieNotRaw("Adopt", slot);
  }
  State(slot).store(kSlotNotRaw, std::memory_order_relaxed);  // a handle's now
  return Buffer(this, slot);
}

std::byte* BufferPool::TryAcquireRawSlow() noexcept {
  const uint32_t slot = TryAcquireSlot();
  if (slot == kNoSlot) return nullptr;
  State(slot).store(kSlotRaw, std::memory_order_relaxed);
  return SlotData(slot);
}

void BufferPool::ReleaseRawSlow(const std::byte* p) noexcept {
  const uint64_t index = SlotOrHuge(p);
  if (index >= capacity_) DieNotFromPool(p);
  DieNotRaw("ReleaseRaw", static_cast<uint32_t>(index));
}

void BufferPool::DieNotFromPool(const void* p) const {
  std::fprintf(stderr,
               "bufpool: released pointer %p is not from this pool (not the "
               "start of a buffer in [%p, %p), buffer_size %zu)\n",
               p, static_cast<void*>(base_),
               static_cast<void*>(base_ + capacity_ * buffer_size_),
               buffer_size_);
  std::abort();
}

void BufferPool::DieNotRaw(const char* call, uint32_t slot) const {
  std::fprintf(stderr,
               "bufpool: %s: double release of slot %u (%p): the buffer is "
               "not out as a raw pointer; it is free already, or a Buffer "
               "handle owns it (a handle returns it itself; Detach() it to "
               "take the raw pointer)%s\n",
               call, slot, static_cast<void*>(SlotData(slot)),
               PoolAccess::OwnerNote(*this, slot).c_str());
  std::abort();
}

}  // namespace bufpool

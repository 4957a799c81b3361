// BufferPool: slow paths, thread caches, creation and destruction.
//
// The cache-hit fast paths are inline in include/bufpool/buffer_pool.h; this
// file holds everything that touches shared state.
//
// Accounting. The depot knows how many free slots it holds (Depot::Size():
// its lists keep depths in their links), so no counter follows it and an
// uncached acquire or release pays no counter update. The thread caches'
// free slots are counted "as last reported":
//
//   in_caches = sum over caches of c.reported
//
// A cache reports (folds) its count only on its owner's slow paths, so cache
// hits touch no shared counter either. Then, exactly whenever no
// acquire/release is in flight,
//
//   in_use = capacity - depot.Size() - in_caches
//            - sum over caches of (c.count - c.reported).
//
// Between two folds a cache's lowest count (`low_water`) marks its thread's
// peak, so at each fold the pool's high-water mark is raised to capacity -
// (the depot and in_caches, less c.reported, as before the fold's own move)
// - c.low_water: exact for a single thread. With several threads it may be
// off by their unreported cache movements, and by a move another thread
// makes between the reads of the depot and of in_caches (two loads now, no
// longer one counter). An uncached acquire raises it to
// capacity - (the depot right after its pop + in_caches), exact with caches
// off: the pop reads the depot's size from the link it removed. Stats()
// adds up the depot and the caches only between moves of slots from one to
// the other (PoolAccess::MoveGuard), so it never counts a moving batch in
// neither place.
//
// Locks. g_registry_mu guards the link between pools and thread caches
// (Shared::caches, writes of ThreadCache::pool, thread exit). Each pool's
// Shared::caches_mu guards writes of its caches' `fast` tags and, with the
// registry, changes to Shared::caches (so either lock suffices to read it):
// a thread about to sleep in Acquire() clears the tags under it alone, not
// behind a process-wide lock. Shared::wait_mu guards only the Acquire()
// sleep. Order: registry before caches_mu, wait_mu before caches_mu
// (caches_mu is innermost); Acquire() attaches its cache before taking
// wait_mu so it never needs the registry while holding wait_mu.
#include "bufpool/buffer_pool.h"

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <mutex>
#include <type_traits>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "arena/arena.h"
#include "bufpool/internal/shared_access.h"
#include "pool/depot.h"

namespace bufpool {

namespace internal {
ThreadCache g_no_cache;
constinit thread_local ThreadCache* tls_cache = &g_no_cache;
}  // namespace internal

using internal::ThreadCache;

namespace {

constinit std::mutex g_registry_mu;
// Set once this thread's caches are torn down: later releases (from other
// thread_local destructors) go straight to the shared depot.
constinit thread_local bool tl_exiting = false;

// This thread's caches, one per pool it has used. Only the owning thread
// changes the vector; entries whose pool died are pruned under the registry.
class ThreadCaches {
 public:
  ~ThreadCaches();
  std::vector<std::unique_ptr<ThreadCache>> caches;
};

thread_local ThreadCaches tl_caches;

// Raises `target` to `value`, clamped to `limit`: estimates taken while
// other threads move buffers can overshoot for an instant.
void UpdateMax(std::atomic<size_t>& target, int64_t value, size_t limit) {
  if (value <= 0) return;
  value = std::min<int64_t>(value, static_cast<int64_t>(limit));
  size_t seen = target.load(std::memory_order_relaxed);
  while (static_cast<size_t>(value) > seen &&
         !target.compare_exchange_weak(seen, static_cast<size_t>(value),
                                       std::memory_order_relaxed)) {
  }
}

absl::Status DeadlineError(const BufferPool& pool, absl::Duration timeout) {
  return absl::DeadlineExceededError(absl::StrCat(
      "BufferPool::Acquire: no buffer became free within ",
      absl::FormatDuration(timeout), " (capacity ", pool.capacity(), " x ",
      pool.buffer_size(),
      " bytes; none in the shared list, and other threads' caches may hold "
      "up to ",
      pool.cache_capacity(), " idle buffers each)"));
}

}  // namespace

struct BufferPool::Shared {
  Shared(Arena a, uint32_t capacity, uint32_t batch)
      : arena(std::move(a)), depot(capacity, batch) {}

  Arena arena;
  Depot depot;
  // See "Accounting" above. Relaxed: statistics only; no decision that
  // guards memory depends on them.
  alignas(64) std::atomic<int64_t> in_caches{0};
  // Moves of slots between a cache and the depot, begun and finished (see
  // PoolAccess::MoveGuard and Stats()).
  std::atomic<uint64_t> moves_begun{0};
  std::atomic<uint64_t> moves_done{0};
  std::atomic<size_t> high_water{0};
  std::atomic<uint64_t> failures{0};
  std::mutex wait_mu;
  std::condition_variable wait_cv;
  std::mutex caches_mu;              // see "Locks" above
  std::vector<ThreadCache*> caches;  // registry + caches_mu; either to read
};

// The pool's out-of-line operations, as a friend so they can stay out of
// the public header.
struct PoolAccess {
  // An internal invariant broke: a bug in this file, never a user error.
  [[noreturn]] static void DieCorrupt(const BufferPool& p, const char* what,
                                      uint64_t value) {
    std::fprintf(stderr, "bufpool: internal error: %s (%llu) in pool %p\n",
                 what, static_cast<unsigned long long>(value),
                 static_cast<const void*>(&p));
    std::abort();
  }

  // Brackets a move of slots between a thread cache and the depot, from
  // before the depot changes until the cache has folded it in. Stats() takes
  // its picture only while no move is open, and retries when one began
  // during it: otherwise it could read the depot after a refill and the
  // cache before it, see the refilled slots nowhere, and raise high_water by
  // a whole batch that was never in use. (A seqlock with many writers: the
  // counts say "none open", the release fence orders the begin before the
  // move's stores, as Stats()'s acquire fence orders its loads.)
  class MoveGuard {
   public:
    explicit MoveGuard(BufferPool& p) : s_(*p.shared_) {
      s_.moves_begun.fetch_add(1, std::memory_order_relaxed);
      std::atomic_thread_fence(std::memory_order_release);
    }
    ~MoveGuard() { s_.moves_done.fetch_add(1, std::memory_order_release); }
    MoveGuard(const MoveGuard&) = delete;
    MoveGuard& operator=(const MoveGuard&) = delete;

   private:
    BufferPool::Shared& s_;
  };

  static uint32_t RefillBatch(const BufferPool& p) {
    return static_cast<uint32_t>(std::max<size_t>(1, p.cache_capacity_ / 2));
  }

  // This thread's cache for `p`, attaching one on first use; nullptr when
  // caches are off or the thread is exiting.
  static ThreadCache* CacheFor(BufferPool& p) {
    if (p.cache_capacity_ == 0) return nullptr;
    if (ThreadCache* c = p.MyCache()) {
      if (c->fast.load(std::memory_order_relaxed) != &p) [[unlikely]] {
        RestoreFast(p, *c);
      }
      return c;
    }
    return Attach(p);
  }

  // Whether the fast paths may serve `p` (ThreadCache::fast). Read under
  // caches_mu, which Acquire() holds while it turns every cache's fast paths
  // off: if Acquire() locked first, its waiters_ increment is visible here;
  // if we did, its clear comes after our store and wins. So a sleeper's
  // clear is never undone while it sleeps.
  static BufferPool* FastFor(BufferPool& p) {
    return p.scrub_ || p.waiters_.load(std::memory_order_seq_cst) != 0 ? nullptr
                                                                       : &p;
  }

  // A slow path found the fast paths off; turns them back on once nobody
  // waits. Rare: once per cache after each period of waiting.
  [[gnu::noinline]] static void RestoreFast(BufferPool& p, ThreadCache& c) {
    if (p.scrub_ || p.waiters_.load(std::memory_order_relaxed) != 0) return;
    std::lock_guard<std::mutex> lock(p.shared_->caches_mu);
    c.fast.store(FastFor(p), std::memory_order_relaxed);
  }

  // Acquire() is about to sleep (waiters_ already counts it): every cache's
  // releases must now take the slow path, which hands buffers over. A
  // release that still took a fast path between Acquire()'s failed Take and
  // this clear stays in its thread's cache until that thread's next release
  // (see the header on Acquire()).
  static void StopFastPaths(BufferPool& p) {
    std::lock_guard<std::mutex> lock(p.shared_->caches_mu);
    for (ThreadCache* c : p.shared_->caches) {
      c->fast.store(nullptr, std::memory_order_relaxed);
    }
  }

  // CacheFor's first use on this thread (or after using another pool): out
  // of line, so that the checks above inline into every slow path.
  [[gnu::noinline]] static ThreadCache* Attach(BufferPool& p) {
    if (tl_exiting) return nullptr;
    ThreadCaches& mine = tl_caches;
    for (auto& owned : mine.caches) {
      if (owned->pool.load(std::memory_order_relaxed) == &p) {
        internal::tls_cache = owned.get();
        return owned.get();
      }
    }
    auto owned = std::make_unique<ThreadCache>();
    ThreadCache& c = *owned;
    c.capacity = static_cast<uint32_t>(p.cache_capacity_ - 1);  // + hot
    {
      std::lock_guard<std::mutex> lock(g_registry_mu);
      std::erase_if(mine.caches, [](const std::unique_ptr<ThreadCache>& o) {
        return o->pool.load(std::memory_order_relaxed) == nullptr;
      });
      c.pool.store(&p, std::memory_order_relaxed);
      std::lock_guard<std::mutex> tags(p.shared_->caches_mu);
      c.fast.store(FastFor(p), std::memory_order_relaxed);
      p.shared_->caches.push_back(&c);
    }
    mine.caches.push_back(std::move(owned));
    internal::tls_cache = &c;
    return &c;
  }

  // Free buffers: the depot's and the caches' (see "Accounting" above).
  // Caller holds g_registry_mu (for the cache list).
  static int64_t FreeNow(const BufferPool& p) {
    int64_t free_now = static_cast<int64_t>(p.shared_->depot.Size()) +
                       p.shared_->in_caches.load(std::memory_order_relaxed);
    for (const ThreadCache* c : p.shared_->caches) {
      free_now += static_cast<int64_t>(Total(*c)) -
                  c->reported.load(std::memory_order_relaxed);
    }
    return free_now;
  }
  static size_t InUse(const BufferPool& p, int64_t free_now) {
    const int64_t cap = static_cast<int64_t>(p.capacity_);
    return static_cast<size_t>(std::clamp<int64_t>(cap - free_now, 0, cap));
  }

  static uint32_t Total(const ThreadCache& c) {
    return c.count.load(std::memory_order_relaxed) +
           (c.hot.load(std::memory_order_relaxed) != ThreadCache::kNone);
  }

  // Moves `hot` onto the stack (which has a spare entry for it), so slow
  // paths deal with the stack alone. Invariant: outside a slow path the
  // stack holds at most `capacity`; a slow path that folds `hot` in then
  // takes from the stack or spills it before returning.
  static void FoldHot(ThreadCache& c) {
    const uint32_t hot = c.hot.load(std::memory_order_relaxed);
    if (hot == ThreadCache::kNone) return;
    const uint32_t n = c.count.load(std::memory_order_relaxed);
    c.slots[n] = hot;
    c.count.store(n + 1, std::memory_order_relaxed);
    c.hot.store(ThreadCache::kNone, std::memory_order_relaxed);
  }

  // Moves the cache's unreported movements into `in_caches`, after the
  // caller moved `to_shared` slots into (positive) or out of (negative) the
  // depot, and raises the high-water mark from the window just closed.
  static void Fold(BufferPool& p, ThreadCache& c, int64_t to_shared) {
    BufferPool::Shared& s = *p.shared_;
    const int64_t count = Total(c);
    const int64_t reported = c.reported.load(std::memory_order_relaxed);
    // Free outside this cache during the window: the depot before the move.
    const int64_t elsewhere = static_cast<int64_t>(s.depot.Size()) - to_shared +
                              s.in_caches.load(std::memory_order_relaxed) -
                              reported;
    const int64_t peak =
        static_cast<int64_t>(p.capacity_) - elsewhere -
        static_cast<int64_t>(c.low_water.load(std::memory_order_relaxed));
    UpdateMax(s.high_water, peak, p.capacity_);
    s.in_caches.fetch_add(count - reported, std::memory_order_relaxed);
    c.reported.store(static_cast<uint32_t>(count), std::memory_order_relaxed);
    // The stack alone, not the total: the invariant low_water <= count lets
    // the cache-hit acquire take `hot` without checking low_water (see
    // ThreadCache). Every caller folds `hot` in first, except Give's spill,
    // whose `hot` was released just now; the total was `count` a moment
    // before, so the new window starts at a value the total really had.
    c.low_water.store(c.count.load(std::memory_order_relaxed),
                      std::memory_order_relaxed);
  }

  // Takes one free slot (cache, refill, or shared depot) and hands it out
  // (HandOut); kNoSlot when none is free. Counts no failure. Adds to *reshelved
  // the slots it put back into the depot, for which the caller owes waiters
  // a wake-up (WakeWaiters, or notify when it holds wait_mu).
  static uint32_t Take(BufferPool& p, uint32_t* reshelved) {
    ThreadCache* const c = CacheFor(p);
    if (c == nullptr) return TakeUncached(p, reshelved);
    FoldHot(*c);
    uint32_t n = c->count.load(std::memory_order_relaxed);
    if (n == 0) {
      const MoveGuard move(p);
      // While threads wait, take one at a time so a refill never strands
      // buffers in this cache that a waiter needs.
      const bool waiting = p.waiters_.load(std::memory_order_relaxed) != 0;
      n = p.shared_->depot.Pop(c->slots, waiting ? 1 : RefillBatch(p),
                               &c->spare, reshelved);
      if (n == 0) return BufferPool::kNoSlot;
      // Pop wrote the shared top first; the cache's top is its last entry.
      std::reverse(c->slots, c->slots + n);
      c->count.store(n, std::memory_order_relaxed);
      Fold(p, *c, -static_cast<int64_t>(n));
    }
    --n;
    const uint32_t slot = c->slots[n];
    c->count.store(n, std::memory_order_relaxed);
    if (n < c->low_water.load(std::memory_order_relaxed)) {
      c->low_water.store(n, std::memory_order_relaxed);
    }
    HandOut(p, slot);
    return slot;
  }

  // Take() for a caller without a cache: caches off (AcquireSlow() calls this
  // directly, to keep the uncached pair's path short) or a thread past its
  // caches' teardown. One pop from the depot's list, which also says how
  // many slots it left (see "Accounting").
  static uint32_t TakeUncached(BufferPool& p, uint32_t* reshelved) {
    BufferPool::Shared& s = *p.shared_;
    uint32_t left;
    const uint32_t slot = s.depot.PopOne(reshelved, &left);
    if (slot == BufferPool::kNoSlot) return BufferPool::kNoSlot;
    const int64_t free_now =  // in_caches is 0 with caches off
        left + s.in_caches.load(std::memory_order_relaxed);
    UpdateMax(s.high_water, static_cast<int64_t>(p.capacity_) - free_now,
              p.capacity_);
    HandOut(p, slot);
    return slot;
  }

  // The slot leaves the pool: under ASan its buffer becomes usable. (Raw
  // acquires also mark the state byte; that is theirs to do, see state_.)
  static void HandOut(BufferPool& p, uint32_t slot) {
    BUFPOOL_INTERNAL_UNPOISON(p.SlotData(slot), p.buffer_size_);
  }

  // Puts a slot back that the caller already released (raw: state cleared;
  // scrubbed and poisoned by ReleaseSlow or the bulk path).
  static void Give(BufferPool& p, uint32_t slot) {
    ThreadCache* const c = CacheFor(p);
    if (c == nullptr) return GiveUncached(p, slot);
    const bool waiting = p.waiters_.load(std::memory_order_relaxed) != 0;
    if (!waiting &&
        c->hot.load(std::memory_order_relaxed) == ThreadCache::kNone) {
      c->hot.store(slot, std::memory_order_relaxed);
      return;
    }
    FoldHot(*c);
    const uint32_t n = c->count.load(std::memory_order_relaxed);
    if (n > c->capacity + 1) [[unlikely]] {
      DieCorrupt(p, "thread cache over capacity", n);
    }
    if (!waiting && n <= c->capacity) {
      // Room after all: we got here because the cache's fast tag is off
      // (a scrubbing pool, or a wait just ended), this thread last used
      // another pool, or from ReleaseBulk; not because the cache is full.
      c->hot.store(slot, std::memory_order_relaxed);
      return;
    }
    Depot& depot = p.shared_->depot;
    uint32_t pushed;
    {
      const MoveGuard move(p);
      if (waiting) {
        // Someone sleeps in Acquire(): hand over this slot and every idle
        // one we hold (slots has room for capacity + 2).
        c->slots[n] = slot;
        pushed = n + 1;
        depot.Push(c->slots, pushed, &c->spare);
        c->count.store(0, std::memory_order_relaxed);
      } else {
        // Full (n == capacity + 1): spill the older entries down to about
        // half the stack, in whole refill batches so that they travel as
        // magazines (see Depot); the released slot becomes the hot one.
        const uint32_t batch = RefillBatch(p);
        pushed = std::max(batch, (n - c->capacity / 2) / batch * batch);
        depot.Push(c->slots, pushed, &c->spare);
        std::memmove(c->slots, c->slots + pushed,
                     (n - pushed) * sizeof(uint32_t));
        c->count.store(n - pushed, std::memory_order_relaxed);
        c->hot.store(slot, std::memory_order_relaxed);
      }
      Fold(p, *c, pushed);
    }
    WakeWaiters(p, pushed);
  }

  // Give() for a caller without a cache (see TakeUncached).
  static void GiveUncached(BufferPool& p, uint32_t slot) {
    p.shared_->depot.PushOne(slot);
    WakeWaiters(p, 1);
  }
  // The same for slots[0, n), n >= 1 (ReleaseBulk with caches off): one
  // push, as the depot takes a chain in one CAS.
  static void GiveUncached(BufferPool& p, const uint32_t* slots, uint32_t n) {
    p.shared_->depot.Push(slots, n, nullptr);
    WakeWaiters(p, n);
  }

  // Called after pushing `pushed` slots into the depot. The push's CAS (onto
  // the slot list or the full magazines), this load, Acquire()'s
  // waiters_.fetch_add and its pop's loads of both heads are all seq_cst, so
  // they fall in one total order: either the waiter's increment comes first and
  // we see it (and wake it), or our push comes first and the waiter's pop,
  // which follows its increment, sees it. No wake-up is lost. On x86 this costs
  // nothing: the CAS is a locked instruction already and seq_cst loads are
  // plain moves.
  static void WakeWaiters(BufferPool& p, uint32_t pushed) {
    if (p.waiters_.load(std::memory_order_seq_cst) == 0) return;
    { std::lock_guard<std::mutex> lock(p.shared_->wait_mu); }
    if (pushed == 1) {
      p.shared_->wait_cv.notify_one();
    } else {
      p.shared_->wait_cv.notify_all();
    }
  }

  // Returns every slot of `c` (and its spare magazine) to the depot and
  // detaches it from `p`.
  // Caller holds g_registry_mu.
  static void Detach(BufferPool& p, ThreadCache& c) {
    FoldHot(c);
    const uint32_t n = c.count.load(std::memory_order_relaxed);
    if (n != 0) p.shared_->depot.Push(c.slots, n, &c.spare);
    p.shared_->depot.ReturnSpare(&c.spare);
    c.count.store(0, std::memory_order_relaxed);
    Fold(p, c, n);
    {
      std::lock_guard<std::mutex> tags(p.shared_->caches_mu);
      std::erase(p.shared_->caches, &c);
      c.fast.store(nullptr, std::memory_order_relaxed);
    }
    c.pool.store(nullptr, std::memory_order_relaxed);
    if (n != 0) WakeWaiters(p, n);
  }
};

namespace {

ThreadCaches::~ThreadCaches() {
  tl_exiting = true;
  internal::tls_cache = &internal::g_no_cache;
  std::lock_guard<std::mutex> lock(g_registry_mu);
  for (auto& c : caches) {
    if (BufferPool* pool = c->pool.load(std::memory_order_relaxed)) {
      PoolAccess::Detach(*pool, *c);
    }
  }
  caches.clear();
}

}  // namespace

// ---- Creation and destruction
// ------------------------------------------------

absl::StatusOr<std::unique_ptr<BufferPool>> BufferPool::Create(
    const PoolOptions& options) {
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
  if (count >= kNoSlot) {
    return absl::InvalidArgumentError(
        absl::StrCat("PoolOptions.buffer_count must be below ", kNoSlot,
                     " (slot numbers are 32-bit), got ", count));
  }
  if (count > std::numeric_limits<size_t>::max() / 2 / size) {
    return absl::InvalidArgumentError(
        absl::StrCat("PoolOptions.buffer_size * buffer_count overflows: ", size,
                     " * ", count));
  }

  absl::StatusOr<Arena> arena =
      Arena::Map({.size = size * count,
                  .huge_pages = options.huge_pages,
                  .populate = options.populate,
                  .lock_memory = options.lock_memory});
  if (!arena.ok()) {
    return absl::Status(arena.status().code(),
                        absl::StrCat("BufferPool::Create(", count, " x ", size,
                                     " bytes): ", arena.status().message()));
  }

  std::unique_ptr<BufferPool> pool(new BufferPool());
  pool->base_ = arena->data();
  pool->huge_pages_ = arena->huge_pages();
  pool->buffer_size_ = size;
  pool->capacity_ = count;
  pool->region_bytes_ = count * size;
  pool->cache_capacity_ =
      std::min({options.thread_cache_size, count / 8, kMaxThreadCacheSize});
  pool->shift_ = static_cast<unsigned>(__builtin_ctzll(size));
  pool->scrub_ = options.scrub_on_release;
  // A power of two >= count and >= 64 (see State()); all free.
  size_t states = 64;
  while (states < count) states *= 2;
  pool->state_mask_ = static_cast<uint32_t>(states - 1);
  pool->state_ = std::make_unique<std::atomic<uint8_t>[]>(states);
  pool->shared_ = std::make_unique<Shared>(
      std::move(*arena), static_cast<uint32_t>(count),
      pool->cache_capacity_ == 0 ? 0 : PoolAccess::RefillBatch(*pool));

  // Slot 0 on top, so a fresh pool hands buffers out in address order.
  std::vector<uint32_t> all(count);
  for (uint32_t i = 0; i < count; ++i) all[i] = i;
  pool->shared_->depot.Push(all.data(), static_cast<uint32_t>(count), nullptr);
  BUFPOOL_INTERNAL_POISON(pool->base_, size * count);
  return pool;
}

BufferPool::~BufferPool() {
  // Raw pointers out are marked in state_ and can be named; handles are not
  // (see state_), so the total comes from the accounting, exact here because
  // nothing may run concurrently with destruction. The scan needs no lock;
  // keep it out of the registry lock, which every pool's threads share.
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
  std::lock_guard<std::mutex> lock(g_registry_mu);
  const size_t out =
      std::max(raw, PoolAccess::InUse(*this, PoolAccess::FreeNow(*this)));
  if (out != 0) {
    if (out > raw) {
      absl::StrAppend(&where, raw == 0 ? "" : " as raw pointers; ", out - raw,
                      " held by Buffer handles");
    }
    std::fprintf(stderr,
                 "bufpool: BufferPool destroyed while %zu buffer(s) still in "
                 "use (%s); not unmapping memory that is held\n",
                 out, where.c_str());
    std::abort();
  }
  std::lock_guard<std::mutex> tags(shared_->caches_mu);
  for (ThreadCache* c : shared_->caches) {
    c->fast.store(nullptr, std::memory_order_relaxed);
    c->pool.store(nullptr, std::memory_order_relaxed);
  }
  shared_->caches.clear();
  BUFPOOL_INTERNAL_UNPOISON(base_, capacity_ * buffer_size_);
  std::free(shared_refs_.load(std::memory_order_relaxed));
}

uint32_t* internal::SharedAccess::AllocateRefs(BufferPool& pool) {
  // calloc: zeroed pages the program never touches cost nothing, and pools
  // that never make a SharedBuffer never pay for the array at all.
  auto* fresh =
      static_cast<uint32_t*>(std::calloc(pool.capacity_, sizeof(uint32_t)));
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

// ---- Slow paths
// --------------------------------------------------------------

uint32_t BufferPool::AcquireSlow() {
  uint32_t reshelved = 0;
  const uint32_t slot = cache_capacity_ == 0
                            ? PoolAccess::TakeUncached(*this, &reshelved)
                            : PoolAccess::Take(*this, &reshelved);
  if (reshelved != 0) PoolAccess::WakeWaiters(*this, reshelved);
  if (slot == kNoSlot)
    shared_->failures.fetch_add(1, std::memory_order_relaxed);
  return slot;
}

void BufferPool::ReleaseSlow(uint32_t slot) {
  // ReleaseSlot() missed the cache's fast path; the scrub and the poison
  // happen here, off the hit path.
  if (scrub_) std::memset(SlotData(slot), 0, buffer_size_);
  BUFPOOL_INTERNAL_POISON(SlotData(slot), buffer_size_);
  if (cache_capacity_ == 0) {
    PoolAccess::GiveUncached(*this, slot);  // see TakeUncached
  } else {
    PoolAccess::Give(*this, slot);
  }
}

absl::StatusOr<Buffer> BufferPool::Acquire(absl::Duration timeout) {
  PoolAccess::CacheFor(*this);  // attach now: never under wait_mu (see top)
  uint32_t reshelved = 0;
  uint32_t slot = PoolAccess::Take(*this, &reshelved);
  if (slot != kNoSlot) {
    if (reshelved != 0) PoolAccess::WakeWaiters(*this, reshelved);
    return Buffer(this, slot);
  }

  using Clock = std::chrono::steady_clock;
  if (timeout <= absl::ZeroDuration()) {
    // A poll: nothing to wait for, so no waiter to register (which would
    // switch every thread's cache to its slow path for a moment).
    shared_->failures.fetch_add(1, std::memory_order_relaxed);
    return DeadlineError(*this, timeout);
  }
  // Beyond a century is forever (and would overflow the clock's arithmetic).
  const bool forever = timeout > absl::Hours(24 * 365 * 100);
  const Clock::time_point deadline =
      forever ? Clock::time_point::max()
              : Clock::now() + absl::ToChronoNanoseconds(timeout);
  // seq_cst: see PoolAccess::WakeWaiters.
  waiters_.fetch_add(1, std::memory_order_seq_cst);
  PoolAccess::StopFastPaths(*this);  // before wait_mu (lock order, see top)
  {
    std::unique_lock<std::mutex> lock(shared_->wait_mu);
    for (;;) {
      slot = PoolAccess::Take(*this, &reshelved);
      if (slot != kNoSlot) break;
      if (forever) {
        shared_->wait_cv.wait(lock);
      } else if (shared_->wait_cv.wait_until(lock, deadline) ==
                     std::cv_status::timeout &&
                 Clock::now() >= deadline) {
        slot = PoolAccess::Take(*this, &reshelved);
        break;
      }
    }
  }
  waiters_.fetch_sub(1, std::memory_order_relaxed);  // a late wake is harmless
  // Out of wait_mu, which WakeWaiters takes: slots Take put back may be what
  // another sleeper needs.
  if (reshelved != 0) PoolAccess::WakeWaiters(*this, reshelved);
  if (slot != kNoSlot) return Buffer(this, slot);
  shared_->failures.fetch_add(1, std::memory_order_relaxed);
  return DeadlineError(*this, timeout);
}

// The bulk paths, shared by the handle and raw-pointer APIs. `emit(i, slot)`
// stores the i-th slot handed out (and, for raw pointers, marks it).
template <class Emit>
size_t BufferPool::AcquireBulkImpl(size_t want, Emit emit) {
  size_t got = 0;
  uint32_t reshelved = 0;  // as in PoolAccess::Take
  ThreadCache* c = PoolAccess::CacheFor(*this);
  uint32_t direct[64];
  auto hand_out = [&](uint32_t slot) {
    BUFPOOL_INTERNAL_UNPOISON(SlotData(slot), buffer_size_);
    emit(got++, slot);
  };
  while (got < want) {
    if (c != nullptr) {
      uint32_t n;
      PoolAccess::FoldHot(*c);  // count <= capacity + 1; we take from it now
      n = c->count.load(std::memory_order_relaxed);
      if (n == 0) {
        const PoolAccess::MoveGuard move(*this);
        // While threads wait, take no more than this call hands out, so
        // nothing is stranded in this cache (as in PoolAccess::Take).
        const uint32_t batch =
            waiters_.load(std::memory_order_relaxed) != 0
                ? static_cast<uint32_t>(std::min<size_t>(
                      want - got, PoolAccess::RefillBatch(*this)))
                : PoolAccess::RefillBatch(*this);
        n = shared_->depot.Pop(c->slots, batch, &c->spare, &reshelved);
        if (n == 0) break;
        std::reverse(c->slots, c->slots + n);  // the shared top on top
        c->count.store(n, std::memory_order_relaxed);
        PoolAccess::Fold(*this, *c, -static_cast<int64_t>(n));
      }
      const uint32_t take =
          static_cast<uint32_t>(std::min<size_t>(n, want - got));
      n -= take;
      c->count.store(n, std::memory_order_relaxed);
      if (n < c->low_water.load(std::memory_order_relaxed)) {
        c->low_water.store(n, std::memory_order_relaxed);
      }
      // The cache's top (most recently freed) first.
      for (uint32_t i = n + take; i > n; --i) hand_out(c->slots[i - 1]);
    } else {
      uint32_t left = 0;
      const uint32_t n = shared_->depot.Pop(
          direct, static_cast<uint32_t>(std::min<size_t>(64, want - got)),
          nullptr, &reshelved, &left);
      if (n == 0) break;
      // With caches off the pop's own count is exact, even while other
      // threads push and pop (reading Size() after it was not: the review's
      // race missed the peak in 1% of runs). A thread past its caches'
      // teardown in a caching pool has magazines to count too.
      const int64_t free_now =
          (cache_capacity_ == 0 ? int64_t{left}
                                : static_cast<int64_t>(shared_->depot.Size())) +
          shared_->in_caches.load(std::memory_order_relaxed);
      UpdateMax(shared_->high_water, static_cast<int64_t>(capacity_) - free_now,
                capacity_);
      for (uint32_t i = 0; i < n; ++i) hand_out(direct[i]);  // top first
    }
  }
  if (got < want) shared_->failures.fetch_add(1, std::memory_order_relaxed);
  if (reshelved != 0) PoolAccess::WakeWaiters(*this, reshelved);
  return got;
}

// `take_slot(i)` checks and takes the i-th entry, returning its slot, or
// kNoSlot to skip it; `taken(first, last)` runs once those of a chunk are
// taken, before any of its slots goes back. The chunk then moves into this
// thread's cache in one copy, spilling only what does not fit.
template <class TakeSlot, class Taken>
void BufferPool::ReleaseBulkImpl(size_t count, TakeSlot take_slot,
                                 Taken taken) {
  uint32_t freed[64];
  const bool scrub = scrub_;
  for (size_t first = 0; first < count;) {
    const size_t last = std::min<size_t>(count, first + 64);
    uint32_t k = 0;
    for (size_t i = first; i < last; ++i) {
      const uint32_t slot = take_slot(i);
      if (slot == kNoSlot) continue;
      if (scrub) std::memset(SlotData(slot), 0, buffer_size_);
      BUFPOOL_INTERNAL_POISON(SlotData(slot), buffer_size_);
      freed[k++] = slot;
    }
    taken(first, last);
    first = last;
    if (k == 0) continue;
    ThreadCache* c = PoolAccess::CacheFor(*this);
    if (c == nullptr) {  // caches off: the whole chunk in one push
      PoolAccess::GiveUncached(*this, freed, k);
      continue;
    }
    uint32_t done = 0;
    // relaxed: as in ReleaseSlot(); a waiter registering meanwhile may miss
    // up to this chunk, which stays in this cache (see Acquire()).
    if (waiters_.load(std::memory_order_relaxed) == 0) {
      const uint32_t n = c->count.load(std::memory_order_relaxed);
      done = std::min(k, c->capacity - n);
      std::memcpy(c->slots + n, freed, done * sizeof(uint32_t));
      c->count.store(n + done, std::memory_order_relaxed);
    }
    for (; done < k; ++done) PoolAccess::Give(*this, freed[done]);
  }
}

size_t BufferPool::TryAcquireBulk(absl::Span<Buffer> out) {
  for (Buffer& b : out) b.Reset();
  Buffer* const dst = out.data();
  return AcquireBulkImpl(out.size(), [this, dst](size_t i, uint32_t slot) {
    dst[i].pool_ = this;  // empty since the Reset above
    dst[i].index_ = slot;
  });
}

void BufferPool::ReleaseBulk(absl::Span<Buffer> in) {
  static_assert(std::is_standard_layout_v<Buffer> && sizeof(Buffer) == 16);
  Buffer* const src = in.data();
  ReleaseBulkImpl(
      in.size(),
      [this, src](size_t i) {
        Buffer& b = src[i];
        if (b.pool_ != this) {
          b.Reset();  // empty, or another pool's handle: it knows its way home
          return kNoSlot;
        }
        return b.index_;
      },
      [src](size_t first, size_t last) {
        // Every handle of the chunk is empty now in effect; clear them in one
        // pass of wide stores rather than one store each inside the loop,
        // where each store waited behind the caller's writes to the buffers
        // (Bulk32: 151-181 -> 137-161 ns per batch). Before the slots go
        // back, in case the span lives in one of those buffers.
        std::memset(static_cast<void*>(src + first), 0,
                    (last - first) * sizeof(Buffer));
      });
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
      in.size(),
      [&](size_t i) {
        if (src[i] == nullptr) return kNoSlot;  // the tail of a short fill
        const uint64_t index = SlotOrHuge(src[i], base, shift);
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

PoolStats BufferPool::Stats() const {
  std::lock_guard<std::mutex> lock(g_registry_mu);  // the cache list
  Shared& s = *shared_;
  // A picture of the depot and the caches taken while no cache moves slots
  // to or from the depot (see PoolAccess::MoveGuard); cache hits may run,
  // they move one slot between a cache and a user. After kTries pictures
  // that overlapped moves, the last one's in_use is returned, and nothing
  // is raised from it.
  constexpr int kTries = 64;
  int64_t free_now = 0;
  int64_t peak = 0;
  bool clean = false;
  std::vector<std::pair<int64_t, int64_t>> seen;  // each cache: total, low
  seen.reserve(s.caches.size());
  for (int attempt = 0; attempt < kTries && !clean; ++attempt) {
    const uint64_t done = s.moves_done.load(std::memory_order_acquire);
    const uint64_t begun = s.moves_begun.load(std::memory_order_acquire);
    // Each cache's total is read once and used twice: read again for its
    // window below, a release in between (up to a whole ReleaseBulk) would
    // count as a peak that never was.
    free_now = static_cast<int64_t>(s.depot.Size()) +
               s.in_caches.load(std::memory_order_relaxed);
    seen.clear();
    for (const ThreadCache* c : s.caches) {
      const int64_t total = PoolAccess::Total(*c);
      free_now += total - c->reported.load(std::memory_order_relaxed);
      seen.emplace_back(total, c->low_water.load(std::memory_order_relaxed));
    }
    peak = static_cast<int64_t>(capacity_) - free_now;
    // Each cache's open window: its lowest count, with everything else as
    // now.
    for (const auto& [total, low] : seen) {
      peak = std::max(
          peak, static_cast<int64_t>(capacity_) - (free_now - total) - low);
    }
    std::atomic_thread_fence(std::memory_order_acquire);
    clean =
        begun == done && s.moves_begun.load(std::memory_order_relaxed) == begun;
  }
  if (clean) UpdateMax(s.high_water, peak, capacity_);
  return PoolStats{
      .capacity = capacity_,
      .in_use = PoolAccess::InUse(*this, free_now),
      .high_water = s.high_water.load(std::memory_order_relaxed),
      .acquire_failures = s.failures.load(std::memory_order_relaxed),
  };
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
               "take the raw pointer)\n",
               call, slot, static_cast<void*>(SlotData(slot)));
  std::abort();
}

}  // namespace bufpool

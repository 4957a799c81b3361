// BufferPool: slow paths, thread caches, reclaiming, creation and destruction.
//
// The cache-hit fast paths are inline in include/bufpool/internal/
// buffer_pool_inl.h; this file holds everything that touches shared state.
//
// Thread caches. Each pool has a fixed index into the thread-local table
// internal::tls_caches (assigned at Create() to the index the fewest live
// pools share), so a thread that alternates between pools finds each pool's
// cache with one load. Entries are replaced on a miss (Attach), and a thread
// keeps one ThreadCache per pool it used; caches of destroyed pools are
// detached by the pool and freed at the thread's next attach.
//
// Accounting. The free slots are those in the depot and in the caches:
//
//   in_use = capacity - D - sum over caches of Total(c)
//
// exact whenever no call is in flight. D is the depot's size: with caches
// off the depot is a single list whose links carry depths (exact at every
// pop, no counter); with caches on, `Shared::depot_free`, updated by one
// atomic add per batch moved. Moves keep an order so that a slot in transit
// counts as in use, never as free twice: a pop lowers depot_free before the
// cache's count rises, a push raises it after the count fell.
//
// High water. Every change of depot_free is an event made by one cache (or
// by a thread without one, low = 0): it raises high_water to
//
//   capacity - (depot_free just before the change) - low_water(c)
//
// and then restarts c's window (low_water = its count). Why it is never
// below the true peak: take the peak at time t*, and the first change of
// depot_free after it, made by cache c (or the next Stats()). depot_free did
// not change between t* and that event, so the value just before the event
// is D(t*); c made no move in between, so its window contains t* and
// low_water(c) <= Total(c)(t*). Hence the estimate >= capacity - D(t*) -
// Total(c)(t*) >= in_use(t*). It needs no read of another thread's cache,
// so no interleaving can make it low. It counts the other caches' free
// slots as in use, so it may exceed the peak by them (at most threads x
// cache_capacity); with one thread, or caches off, it is exact. Stats()
// adds its own estimate from every cache's low_water, so a peak made by
// cache hits after the last event is seen too.
//
// Reclaiming. A thread blocked in the kernel (on a condition variable, in
// epoll_wait, asleep) may hold free slots in its caches that a waiter needs.
// Acquire() takes them (Reclaim) without adding anything to the owner's
// cache hit path, which stays plain loads and stores:
//   1. The owner touches its cache without a lock only in sections that
//      begin by reading fast == pool and contain no system call (the inline
//      fast paths, and the slow paths' unlocked sections, WithCache); in
//      every other case it holds the cache's `mu`.
//   2. A reclaimer locks the cache's `mu` (so the owner is in no locked
//      section), clears `fast`, and runs os::HeavyFence() (membarrier): from
//      then on every section the owner begins reads fast == nullptr and
//      takes the lock instead. The fence stands in for the fence that the
//      owner's section would otherwise need between its load of `fast` and
//      its accesses (the asymmetric-fence pattern of folly's hazard
//      pointers and of liburcu).
//   3. It then asks the kernel whether the owner is asleep in a system call
//      (os::GetThreadState), or gone (a child after fork()). If so, the owner
//      is in no section (sections make no system calls), will begin none before
//      it returns, and every one it begins after sees the cleared tag (2): the
//      reclaimer may take every slot. If the owner is running it is skipped;
//      the waiter's StopFastPaths made that owner's next release hand its slots
//      over.
//   4. The owner's next slow path finds `fast` cleared, locks, and turns
//      the fast paths back on (RestoreFast) once nobody waits.
// ThreadSanitizer builds add a Dekker flag to rule 1 that TSan can model
// (internal/thread_cache.h, BUFPOOL_INTERNAL_SECTION_FLAGS); the protocol
// above is what every other build runs. The cost lies on the rare side only: a
// lock, one membarrier and one read of /proc per non-empty cache, when the
// depot is empty and a thread asks to wait. (A flag the owner set and cleared
// around each operation would have cost two stores on every cache hit.)
//
// Locks. g_registry_mu guards the link between pools and thread caches
// (Shared::caches, ThreadCache::pool, thread exit, the table indexes) and
// serializes reclaimers. Each pool's Shared::caches_mu guards writes of its
// caches' `fast` tags to non-null and, with the registry, changes to
// Shared::caches. ThreadCache::mu: see above. Shared::wait_mu guards only
// the Acquire() sleep. Order: registry, then ThreadCache::mu, then
// caches_mu; wait_mu before ThreadCache::mu. Nothing takes the registry or
// wait_mu while holding a ThreadCache::mu, and Acquire() attaches its cache
// and reclaims outside wait_mu.
#include "bufpool/buffer_pool.h"

#include <pthread.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <mutex>
#include <new>
#include <type_traits>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "arena/arena.h"
#include "bufpool/internal/shared_access.h"
#include "os/thread.h"
#include "pool/depot.h"

namespace bufpool {

namespace internal {
ThreadCache g_no_cache;
constinit thread_local ThreadCache*
    tls_caches[kCacheTableSize] BUFPOOL_INTERNAL_TLS_MODEL = {
        &g_no_cache, &g_no_cache, &g_no_cache, &g_no_cache,
        &g_no_cache, &g_no_cache, &g_no_cache, &g_no_cache,
        &g_no_cache, &g_no_cache, &g_no_cache, &g_no_cache,
        &g_no_cache, &g_no_cache, &g_no_cache, &g_no_cache,
};
static_assert(kCacheTableSize == 16, "initialise every entry above");
}  // namespace internal

using internal::ThreadCache;

namespace {

constinit std::mutex g_registry_mu;
// Live pools per table index (registry).
constinit uint32_t g_index_users[internal::kCacheTableSize] = {};
// Set once this thread's caches are torn down: later releases (from other
// thread_local destructors) go straight to the shared depot.
constinit thread_local bool tl_exiting = false;

// This thread's caches, one per pool it has used. Only the owning thread
// changes the vector; entries whose pool died are pruned on the next attach.
class ThreadCaches {
 public:
  ~ThreadCaches();
  std::vector<std::unique_ptr<ThreadCache>> caches;
};

thread_local ThreadCaches tl_caches;

// In a child after fork() the forking thread has a new kernel id; its caches
// must name it, or a reclaimer would ask /proc about another thread.
void RetagCachesAfterFork() {
  const int tid = os::CurrentThreadId();
  for (auto& c : tl_caches.caches) c->tid = tid;
}

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
      pool.buffer_size(), " bytes, all in use)"));
}

}  // namespace

struct BufferPool::Shared {
  Shared(Arena a, uint32_t capacity, uint32_t batch)
      : arena(std::move(a)), depot(capacity, batch) {}

  Arena arena;
  Depot depot;
  // The depot's size with caches on (see "Accounting"); relaxed: a
  // statistic, and each read-modify-write returns the exact value before it.
  alignas(64) std::atomic<int64_t> depot_free{0};
  std::atomic<size_t> high_water{0};
  std::atomic<uint64_t> failures{0};
  std::atomic<uint64_t> timeouts{0};
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

  static uint32_t RefillBatch(const BufferPool& p) {
    return static_cast<uint32_t>(std::max<size_t>(1, p.cache_capacity_ / 2));
  }

  static uint32_t Total(const ThreadCache& c) {
    return c.count.load(std::memory_order_relaxed) +
           (c.hot.load(std::memory_order_relaxed) != ThreadCache::kNone);
  }

  // ---- Finding this thread's cache

  // This thread's cache for `p`, attaching one on first use; nullptr when
  // caches are off or the thread is exiting.
  static ThreadCache* CacheFor(BufferPool& p) {
    if (p.cache_capacity_ == 0) return nullptr;
    ThreadCache* c = internal::tls_caches[p.cache_index_];
    if (c->pool.load(std::memory_order_relaxed) == &p) return c;
    return Attach(p);
  }

  // This thread's cache for `p` if it has one (attaches none).
  static ThreadCache* FindCache(BufferPool& p) {
    if (p.cache_capacity_ == 0 || tl_exiting) return nullptr;
    ThreadCache* c = internal::tls_caches[p.cache_index_];
    if (c->pool.load(std::memory_order_relaxed) == &p) return c;
    for (auto& owned : tl_caches.caches) {
      if (owned->pool.load(std::memory_order_relaxed) == &p) return owned.get();
    }
    return nullptr;
  }

  // CacheFor's miss: this thread's existing cache for `p` (another pool
  // took the table entry), or a new one; nullptr (the caller goes to the
  // shared store uncached) when the memory for one cannot be had, so that
  // the noexcept slow paths never meet std::bad_alloc. Every allocation
  // happens before the cache is registered anywhere. Out of line, so that
  // the check above inlines into every slow path.
  [[gnu::noinline]] static ThreadCache* Attach(BufferPool& p) {
    if (tl_exiting) return nullptr;
    ThreadCaches& mine = tl_caches;
    for (auto& owned : mine.caches) {
      if (owned->pool.load(std::memory_order_relaxed) == &p) {
        internal::tls_caches[p.cache_index_] = owned.get();
        return owned.get();
      }
    }
    std::unique_ptr<ThreadCache> owned(new (std::nothrow) ThreadCache());
    if (owned == nullptr) return nullptr;
    try {
      mine.caches.reserve(mine.caches.size() + 1);
    } catch (const std::bad_alloc&) {
      return nullptr;
    }
    ThreadCache& c = *owned;
    c.capacity = static_cast<uint32_t>(p.cache_capacity_ - 1);  // + hot
    c.tid = os::CurrentThreadId();
    static const bool retag_registered =
        pthread_atfork(nullptr, nullptr, RetagCachesAfterFork) == 0;
    (void)retag_registered;
    {
      std::lock_guard<std::mutex> lock(g_registry_mu);
      // Caches of destroyed pools (detached: pool == nullptr) go now; no
      // list holds them, and no table entry may keep pointing at one.
      std::erase_if(mine.caches, [](const std::unique_ptr<ThreadCache>& o) {
        if (o->pool.load(std::memory_order_relaxed) != nullptr) return false;
        for (ThreadCache*& entry : internal::tls_caches) {
          if (entry == o.get()) entry = &internal::g_no_cache;
        }
        return true;
      });
      std::lock_guard<std::mutex> tags(p.shared_->caches_mu);
      try {
        p.shared_->caches.reserve(p.shared_->caches.size() + 1);
      } catch (const std::bad_alloc&) {
        return nullptr;
      }
      c.pool.store(&p, std::memory_order_relaxed);
      c.fast.store(FastFor(p), std::memory_order_relaxed);
      p.shared_->caches.push_back(&c);  // reserved: does not throw
    }
    mine.caches.push_back(std::move(owned));  // reserved: does not throw
    internal::tls_caches[p.cache_index_] = &c;
    return &c;
  }

  // ---- Fast tags

  // Whether the fast paths may serve `p`. Read under caches_mu, which
  // Acquire() holds while it turns every cache's fast paths off: if
  // Acquire() locked first, its waiters_ increment is visible here; if we
  // did, its clear comes after our store and wins.
  static BufferPool* FastFor(BufferPool& p) {
    return p.scrub_ || p.waiters_.load(std::memory_order_seq_cst) != 0 ? nullptr
                                                                       : &p;
  }

  // The owner, holding c.mu, found the fast paths off; turns them back on
  // once nobody waits (a reclaimer holds c.mu while it needs them off).
  static void RestoreFast(BufferPool& p, ThreadCache& c) {
    if (c.fast.load(std::memory_order_relaxed) == &p || p.scrub_ ||
        p.waiters_.load(std::memory_order_relaxed) != 0) {
      return;
    }
    std::lock_guard<std::mutex> lock(p.shared_->caches_mu);
    c.fast.store(FastFor(p), std::memory_order_relaxed);
  }

  // Acquire() is about to sleep (waiters_ already counts it): every cache's
  // releases must now take the slow path, which hands buffers over.
  static void StopFastPaths(BufferPool& p) {
    std::lock_guard<std::mutex> lock(p.shared_->caches_mu);
    for (ThreadCache* c : p.shared_->caches) {
      if (c->fast.load(std::memory_order_relaxed) != nullptr) {
        c->unsettled.store(true, std::memory_order_relaxed);
      }
      c->fast.store(nullptr, std::memory_order_seq_cst);
    }
  }

  // Runs f() on the owner's cache `c`: unlocked while its fast tag is set
  // (f must then make no system call; see "Reclaiming", rule 1), else under
  // c.mu.
  template <class F>
  static auto WithCache(BufferPool& p, ThreadCache& c, F&& f) {
    {
      const internal::OwnerSection section(&c);
      if (c.fast.load(internal::kFastOrder) == &p) return f();
    }
    std::lock_guard<std::mutex> lock(c.mu);
    c.unsettled.store(false, std::memory_order_relaxed);  // in no fast path
    RestoreFast(p, c);
    return f();
  }

  // Moves `hot` onto the stack (which has a spare entry for it), so slow
  // paths deal with the stack alone.
  static void FoldHot(ThreadCache& c) {
    const uint32_t hot = c.hot.load(std::memory_order_relaxed);
    if (hot == ThreadCache::kNone) return;
    const uint32_t n = c.count.load(std::memory_order_relaxed);
    c.slots[n] = hot;
    c.count.store(n + 1, std::memory_order_relaxed);
    c.hot.store(ThreadCache::kNone, std::memory_order_relaxed);
  }

  // ---- Depot moves and their accounting (see "Accounting", "High water")

  // After popping n > 0 slots (the depot's list held `left` after the pop
  // when it keeps no magazines). `low` is the popping cache's low_water (0
  // without a cache); `to_user` when the slots go to users, not a cache.
  static void Popped(BufferPool& p, uint32_t n, uint32_t left, uint32_t low,
                     bool to_user) {
    BufferPool::Shared& s = *p.shared_;
    const int64_t before =
        p.cache_capacity_ != 0
            ? s.depot_free.fetch_sub(n, std::memory_order_relaxed)
            : int64_t{left} + n;
    UpdateMax(s.high_water,
              static_cast<int64_t>(p.capacity_) - before - low +
                  (to_user ? int64_t{n} : 0),
              p.capacity_);
  }

  // After pushing n slots that have already left the cache's count.
  static void Pushed(BufferPool& p, uint32_t n, uint32_t low) {
    if (p.cache_capacity_ == 0) return;  // a push never raises in_use
    BufferPool::Shared& s = *p.shared_;
    const int64_t before = s.depot_free.fetch_add(n, std::memory_order_relaxed);
    UpdateMax(s.high_water, static_cast<int64_t>(p.capacity_) - before - low,
              p.capacity_);
  }

  // Refills c's empty stack with up to `max` slots; the count it holds now.
  static uint32_t Refill(BufferPool& p, ThreadCache& c, uint32_t max,
                         uint32_t* reshelved) {
    const uint32_t low = c.low_water.load(std::memory_order_relaxed);
    const uint32_t n =
        p.shared_->depot.Pop(c.slots, max, &c.spare, reshelved, nullptr);
    if (n == 0) return 0;
    Popped(p, n, 0, low, /*to_user=*/false);
    // Pop wrote the shared top first; the cache's top is its last entry.
    std::reverse(c.slots, c.slots + n);
    c.count.store(n, std::memory_order_relaxed);
    c.low_water.store(n, std::memory_order_relaxed);
    return n;
  }

  // Moves every free slot of `c` to the depot; the number moved. The caller
  // is the owner in a section (rule 1) or holds c.mu with the owner blocked
  // or gone.
  static uint32_t Evict(BufferPool& p, ThreadCache& c) {
    FoldHot(c);
    const uint32_t n = c.count.load(std::memory_order_relaxed);
    if (n == 0) return 0;
    const uint32_t low = c.low_water.load(std::memory_order_relaxed);
    c.count.store(0, std::memory_order_relaxed);
    p.shared_->depot.Push(c.slots, n, &c.spare);
    Pushed(p, n, low);
    c.low_water.store(0, std::memory_order_relaxed);
    return n;
  }

  // ---- Acquire side

  // Takes one free slot (this thread's cache, or the depot) and hands it
  // out; kNoSlot when none is free. Counts no failure. Adds to *reshelved
  // the slots it put back into the depot, for which the caller owes waiters
  // a wake-up.
  static uint32_t Take(BufferPool& p, uint32_t* reshelved) {
    ThreadCache* const c = CacheFor(p);
    if (c == nullptr) return TakeUncached(p, reshelved);
    return WithCache(p, *c, [&] {
      FoldHot(*c);
      uint32_t n = c->count.load(std::memory_order_relaxed);
      if (n == 0) {
        // While threads wait, take one at a time so a refill never strands
        // buffers in this cache that a waiter needs.
        const bool waiting = p.waiters_.load(std::memory_order_relaxed) != 0;
        n = Refill(p, *c, waiting ? 1 : RefillBatch(p), reshelved);
        if (n == 0) return BufferPool::kNoSlot;
      }
      --n;
      const uint32_t slot = c->slots[n];
      c->count.store(n, std::memory_order_relaxed);
      if (n < c->low_water.load(std::memory_order_relaxed)) {
        c->low_water.store(n, std::memory_order_relaxed);
      }
      HandOut(p, slot);
      return slot;
    });
  }

  // Take() without a cache: caches off (AcquireSlow() calls this directly,
  // to keep the uncached pair's path short) or a thread past its caches'
  // teardown.
  static uint32_t TakeUncached(BufferPool& p, uint32_t* reshelved) {
    BufferPool::Shared& s = *p.shared_;
    uint32_t slot;
    if (p.cache_capacity_ == 0) {
      uint32_t left;
      slot = s.depot.PopOne(reshelved, &left);
      if (slot == BufferPool::kNoSlot) return BufferPool::kNoSlot;
      Popped(p, 1, left, 0, /*to_user=*/true);
    } else if (s.depot.Pop(&slot, 1, nullptr, reshelved, nullptr) != 0) {
      Popped(p, 1, 0, 0, /*to_user=*/true);
    } else {
      return BufferPool::kNoSlot;
    }
    HandOut(p, slot);
    return slot;
  }

  // The slot leaves the pool: under ASan its buffer becomes usable. (Raw
  // acquires also mark the state byte; that is theirs to do.)
  static void HandOut(BufferPool& p, uint32_t slot) {
    BUFPOOL_INTERNAL_UNPOISON(p.SlotData(slot), p.buffer_size_);
  }

  // ---- Release side

  // Puts a slot back that the caller already released (raw: state cleared;
  // scrubbed and poisoned).
  static void Give(BufferPool& p, uint32_t slot) {
    ThreadCache* const c = CacheFor(p);
    if (c == nullptr) return GiveUncached(p, &slot, 1);
    const uint32_t pushed = WithCache(p, *c, [&]() -> uint32_t {
      const bool waiting = p.waiters_.load(std::memory_order_relaxed) != 0;
      if (!waiting &&
          c->hot.load(std::memory_order_relaxed) == ThreadCache::kNone) {
        c->hot.store(slot, std::memory_order_relaxed);
        return 0;
      }
      FoldHot(*c);
      const uint32_t n = c->count.load(std::memory_order_relaxed);
      if (n > c->capacity + 1) [[unlikely]] {
        DieCorrupt(p, "thread cache over capacity", n);
      }
      if (!waiting && n <= c->capacity) {
        // Room after all: the fast tag is off (a scrubbing pool, a wait just
        // ended, a reclaim), not a full cache.
        c->hot.store(slot, std::memory_order_relaxed);
        return 0;
      }
      if (waiting) {
        // Someone sleeps in Acquire(): hand over this slot and every idle
        // one we hold (slots has room for capacity + 2).
        c->slots[n] = slot;
        c->count.store(n + 1, std::memory_order_relaxed);
        return Evict(p, *c);
      }
      // Full (n == capacity + 1): spill the older entries down to about
      // half the stack, in whole refill batches so that they travel as
      // magazines (see Depot); the released slot becomes the hot one.
      const uint32_t batch = RefillBatch(p);
      const uint32_t pushed =
          std::max(batch, (n - c->capacity / 2) / batch * batch);
      const uint32_t low = c->low_water.load(std::memory_order_relaxed);
      p.shared_->depot.Push(c->slots, pushed, &c->spare);
      std::memmove(c->slots, c->slots + pushed,
                   (n - pushed) * sizeof(uint32_t));
      c->count.store(n - pushed, std::memory_order_relaxed);
      Pushed(p, pushed, low);
      c->low_water.store(n - pushed, std::memory_order_relaxed);
      c->hot.store(slot, std::memory_order_relaxed);
      return pushed;
    });
    WakeWaiters(p, pushed);
  }

  // slots[0, n) released (scrubbed, poisoned) by ReleaseBulk: into the
  // cache while it has room, the rest straight to the depot, all of it while
  // a thread waits.
  static void GiveMany(BufferPool& p, const uint32_t* slots, uint32_t n) {
    ThreadCache* const c = CacheFor(p);
    if (c == nullptr) return GiveUncached(p, slots, n);
    const uint32_t pushed = WithCache(p, *c, [&]() -> uint32_t {
      if (p.waiters_.load(std::memory_order_relaxed) != 0) {
        const uint32_t mine = Evict(p, *c);  // restarts the window at 0
        p.shared_->depot.Push(slots, n, nullptr);
        Pushed(p, n, 0);
        return mine + n;
      }
      const uint32_t have = c->count.load(std::memory_order_relaxed);
      const uint32_t room = have < c->capacity ? c->capacity - have : 0;
      const uint32_t keep = std::min(n, room);
      std::memcpy(c->slots + have, slots, keep * sizeof(uint32_t));
      c->count.store(have + keep, std::memory_order_relaxed);
      if (keep == n) return 0;
      p.shared_->depot.Push(slots + keep, n - keep, &c->spare);
      Pushed(p, n - keep, c->low_water.load(std::memory_order_relaxed));
      c->low_water.store(have + keep, std::memory_order_relaxed);
      return n - keep;
    });
    WakeWaiters(p, pushed);
  }

  // Give() without a cache (see TakeUncached), for slots[0, n), n >= 1.
  static void GiveUncached(BufferPool& p, const uint32_t* slots, uint32_t n) {
    if (n == 1 && p.cache_capacity_ == 0) {
      p.shared_->depot.PushOne(slots[0]);
    } else {
      p.shared_->depot.Push(slots, n, nullptr);
      Pushed(p, n, 0);
    }
    WakeWaiters(p, n);
  }

  // Called after pushing `pushed` slots into the depot. The push's CAS (onto
  // the slot list or the full magazines), this load, Acquire()'s
  // waiters_.fetch_add and its pop's loads of both heads are all seq_cst, so
  // they fall in one total order: either the waiter's increment comes first
  // and we see it (and wake it), or our push comes first and the waiter's
  // pop, which follows its increment, sees it. No wake-up is lost.
  static void WakeWaiters(BufferPool& p, uint32_t pushed) {
    if (pushed == 0 || p.waiters_.load(std::memory_order_seq_cst) == 0) return;
    { std::lock_guard<std::mutex> lock(p.shared_->wait_mu); }
    if (pushed == 1) {
      p.shared_->wait_cv.notify_one();
    } else {
      p.shared_->wait_cv.notify_all();
    }
  }

  // ---- Reclaiming (see the top of this file)

  // Moves the free slots of every cache of `p` whose owner is blocked into
  // the depot, and wakes waiters for them; returns how many. Sets *busy
  // when a cache with free slots belongs to a running thread. `mine` (this
  // thread's cache, or nullptr) is skipped.
  // `waiting`: the caller will sleep if this finds nothing, so caches whose
  // owner may be inside a fast path count too; a poll looks only at caches
  // that hold free slots (a release still in flight has not happened yet).
  static uint32_t Reclaim(BufferPool& p, const ThreadCache* mine, bool waiting,
                          bool* busy) {
    if (p.cache_capacity_ == 0) return 0;
    uint32_t moved = 0;
    {
      std::lock_guard<std::mutex> registry(g_registry_mu);
      std::vector<ThreadCache*> held;
      for (ThreadCache* c : p.shared_->caches) {
        if (c == mine) continue;
        // A cache that looks empty matters too while its owner may be inside
        // a fast path that is about to release into it.
        if (Total(*c) == 0 &&
            (!waiting ||
             (!c->unsettled.load(std::memory_order_relaxed) &&
              c->fast.load(std::memory_order_relaxed) == nullptr))) {
          continue;
        }
        c->mu.lock();  // rule 2: the owner is in no locked section
        if (c->fast.load(std::memory_order_relaxed) != nullptr) {
          c->unsettled.store(true, std::memory_order_relaxed);
        }
        c->fast.store(nullptr, std::memory_order_seq_cst);
        held.push_back(c);
      }
      if (!held.empty()) os::HeavyFence();  // one fence for all of them
      for (ThreadCache* c : held) {
        const os::ThreadState state = os::GetThreadState(c->tid);
        if (state != os::ThreadState::kRunning &&  // rule 3
            internal::OwnerOutsideSections(*c)) {
          c->unsettled.store(false, std::memory_order_relaxed);
          moved += Evict(p, *c);
        } else if (Total(*c) != 0 ||
                   c->unsettled.load(std::memory_order_relaxed)) {
          *busy = true;
        }
        c->mu.unlock();
      }
    }
    WakeWaiters(p, moved);
    return moved;
  }

  // Returns every slot of `c` (and its spare magazine) to the depot and
  // detaches it from `p`. Caller holds g_registry_mu, and is c's owner
  // (exiting) or the pool's destructor.
  static void Detach(BufferPool& p, ThreadCache& c) {
    const uint32_t n = Evict(p, c);
    p.shared_->depot.ReturnSpare(&c.spare);
    {
      std::lock_guard<std::mutex> tags(p.shared_->caches_mu);
      std::erase(p.shared_->caches, &c);
      c.fast.store(nullptr, std::memory_order_relaxed);
    }
    c.pool.store(nullptr, std::memory_order_relaxed);
    WakeWaiters(p, n);
  }

  // The depot's free slots (see "Accounting").
  static int64_t DepotSize(const BufferPool& p) {
    return p.cache_capacity_ != 0
               ? p.shared_->depot_free.load(std::memory_order_relaxed)
               : static_cast<int64_t>(p.shared_->depot.Size());
  }
};

namespace {

ThreadCaches::~ThreadCaches() {
  tl_exiting = true;
  for (ThreadCache*& entry : internal::tls_caches) {
    entry = &internal::g_no_cache;
  }
  std::lock_guard<std::mutex> lock(g_registry_mu);
  for (auto& c : caches) {
    if (BufferPool* pool = c->pool.load(std::memory_order_relaxed)) {
      PoolAccess::Detach(*pool, *c);
    }
  }
  caches.clear();
}

}  // namespace

// ---- Creation and destruction ----------------------------------------------

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
  if (options.thread_cache_size > kMaxThreadCacheSize) {
    return absl::InvalidArgumentError(absl::StrCat(
        "PoolOptions.thread_cache_size must be at most kMaxThreadCacheSize (",
        kMaxThreadCacheSize, "), got ", options.thread_cache_size));
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
  pool->cache_capacity_ = std::min(options.thread_cache_size, count / 8);
  pool->shift_ = static_cast<unsigned>(__builtin_ctzll(size));
  pool->scrub_ = options.scrub_on_release;
  // State bytes: a power of two >= count and >= 64 entries, all "not raw".
  // Slot i's byte is at (i * kStateMix) & state_mask_, a bijection, so
  // slots near each other land on different cache lines and two threads
  // cycling their own slots do not write one line from two cores.
  size_t states = 64;
  while (states < count) states *= 2;
  pool->state_mask_ = static_cast<uint32_t>(states - 1);
  pool->state_ = std::make_unique<std::atomic<uint8_t>[]>(states);
  pool->shared_ = std::make_unique<Shared>(
      std::move(*arena), static_cast<uint32_t>(count),
      pool->cache_capacity_ == 0 ? 0 : PoolAccess::RefillBatch(*pool));
  {
    std::lock_guard<std::mutex> lock(g_registry_mu);
    uint32_t best = 0;
    for (uint32_t i = 1; i < internal::kCacheTableSize; ++i) {
      if (g_index_users[i] < g_index_users[best]) best = i;
    }
    ++g_index_users[best];
    pool->cache_index_ = best;
  }

  // Slot 0 on top, so a fresh pool hands buffers out in address order.
  std::vector<uint32_t> all(count);
  for (uint32_t i = 0; i < count; ++i) all[i] = i;
  pool->shared_->depot.Push(all.data(), static_cast<uint32_t>(count), nullptr);
  pool->shared_->depot_free.store(static_cast<int64_t>(count),
                                  std::memory_order_relaxed);
  BUFPOOL_INTERNAL_POISON(pool->base_, size * count);
  return pool;
}

BufferPool::~BufferPool() {
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
  std::lock_guard<std::mutex> lock(g_registry_mu);
  int64_t free_now = PoolAccess::DepotSize(*this);
  for (const ThreadCache* c : shared_->caches) {
    free_now += PoolAccess::Total(*c);
  }
  const size_t out =
      std::max<size_t>(raw, static_cast<size_t>(std::clamp<int64_t>(
                                static_cast<int64_t>(capacity_) - free_now, 0,
                                static_cast<int64_t>(capacity_))));
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
  {
    std::lock_guard<std::mutex> tags(shared_->caches_mu);
    for (ThreadCache* c : shared_->caches) {
      c->fast.store(nullptr, std::memory_order_relaxed);
      c->pool.store(nullptr, std::memory_order_relaxed);
    }
    shared_->caches.clear();
  }
  --g_index_users[cache_index_];
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

// ---- Slow paths -------------------------------------------------------------

uint32_t BufferPool::AcquireSlow() noexcept {
  uint32_t reshelved = 0;
  const uint32_t slot = cache_capacity_ == 0
                            ? PoolAccess::TakeUncached(*this, &reshelved)
                            : PoolAccess::Take(*this, &reshelved);
  PoolAccess::WakeWaiters(*this, reshelved);
  if (slot == kNoSlot) {
    shared_->failures.fetch_add(1, std::memory_order_relaxed);
  }
  return slot;
}

void BufferPool::ReleaseSlow(uint32_t slot) noexcept {
  // ReleaseSlot() missed the cache's fast path; the scrub and the poison
  // happen here, off the hit path.
  if (scrub_) std::memset(SlotData(slot), 0, buffer_size_);
  BUFPOOL_INTERNAL_POISON(SlotData(slot), buffer_size_);
  if (cache_capacity_ == 0) {
    PoolAccess::GiveUncached(*this, &slot, 1);
  } else {
    PoolAccess::Give(*this, slot);
  }
}

void BufferPool::FlushThreadCache() {
  ThreadCache* const c = PoolAccess::FindCache(*this);
  if (c == nullptr) return;
  const uint32_t moved = PoolAccess::WithCache(
      *this, *c, [&] { return PoolAccess::Evict(*this, *c); });
  PoolAccess::WakeWaiters(*this, moved);
}

absl::StatusOr<Buffer> BufferPool::Acquire(absl::Duration timeout) {
  // Attach now: never under wait_mu (see "Locks").
  const ThreadCache* const mine = PoolAccess::CacheFor(*this);
  uint32_t reshelved = 0;
  bool busy = false;
  uint32_t slot = PoolAccess::Take(*this, &reshelved);
  if (slot == kNoSlot &&
      PoolAccess::Reclaim(*this, mine, /*waiting=*/false, &busy) != 0) {
    slot = PoolAccess::Take(*this, &reshelved);
  }
  if (slot != kNoSlot || timeout <= absl::ZeroDuration()) {
    PoolAccess::WakeWaiters(*this, reshelved);
    if (slot != kNoSlot) return Buffer(this, slot);
    // A poll: nothing to wait for, so no waiter registers (which would
    // switch every thread's cache to its slow path for a moment).
    shared_->failures.fetch_add(1, std::memory_order_relaxed);
    return DeadlineError(*this, timeout);
  }

  using Clock = std::chrono::steady_clock;
  // Beyond a century is forever (and would overflow the clock's arithmetic).
  const bool forever = timeout > absl::Hours(24 * 365 * 100);
  const Clock::time_point deadline =
      forever ? Clock::time_point::max()
              : Clock::now() + absl::ToChronoNanoseconds(timeout);
  // While a thread that is running holds cached buffers, it may block
  // without releasing one; look again this often.
  constexpr auto kRecheck = std::chrono::milliseconds(1);
  // seq_cst: see PoolAccess::WakeWaiters.
  waiters_.fetch_add(1, std::memory_order_seq_cst);
  PoolAccess::StopFastPaths(*this);  // before wait_mu (lock order)
  for (;;) {
    slot = PoolAccess::Take(*this, &reshelved);
    if (slot != kNoSlot) break;
    busy = false;
    if (PoolAccess::Reclaim(*this, mine, /*waiting=*/true, &busy) != 0) {
      continue;
    }
    std::unique_lock<std::mutex> lock(shared_->wait_mu);
    // Under wait_mu: a push after this Take sees waiters_ and notifies us
    // only once we sleep (WakeWaiters takes wait_mu).
    slot = PoolAccess::Take(*this, &reshelved);
    if (slot != kNoSlot) break;
    const Clock::time_point now = Clock::now();
    if (now >= deadline) break;
    const Clock::time_point until =
        busy && deadline - now > kRecheck ? now + kRecheck : deadline;
    if (until == Clock::time_point::max()) {
      shared_->wait_cv.wait(lock);
    } else {
      shared_->wait_cv.wait_until(lock, until);
    }
  }
  waiters_.fetch_sub(1, std::memory_order_relaxed);  // a late wake is harmless
  // Out of wait_mu: slots Take put back may be what another sleeper needs.
  PoolAccess::WakeWaiters(*this, reshelved);
  if (slot != kNoSlot) return Buffer(this, slot);
  shared_->timeouts.fetch_add(1, std::memory_order_relaxed);
  return DeadlineError(*this, timeout);
}

// The bulk paths, shared by the handle and raw-pointer APIs. `emit(i, slot)`
// stores the i-th slot handed out (and, for raw pointers, marks it).
template <class Emit>
size_t BufferPool::AcquireBulkImpl(size_t want, Emit emit) {
  size_t got = 0;
  uint32_t reshelved = 0;  // as in PoolAccess::Take
  auto hand_out = [&](uint32_t slot) {
    BUFPOOL_INTERNAL_UNPOISON(SlotData(slot), buffer_size_);
    emit(got++, slot);
  };
  if (ThreadCache* const c = PoolAccess::CacheFor(*this)) {
    PoolAccess::WithCache(*this, *c, [&] {
      while (got < want) {
        PoolAccess::FoldHot(*c);  // count <= capacity + 1; we take from it
        uint32_t n = c->count.load(std::memory_order_relaxed);
        if (n == 0) {
          // While threads wait, take no more than this call hands out, so
          // nothing is stranded in this cache (as in PoolAccess::Take).
          const uint32_t batch =
              waiters_.load(std::memory_order_relaxed) != 0
                  ? static_cast<uint32_t>(std::min<size_t>(
                        want - got, PoolAccess::RefillBatch(*this)))
                  : PoolAccess::RefillBatch(*this);
          n = PoolAccess::Refill(*this, *c, batch, &reshelved);
          if (n == 0) break;
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
      }
      return 0;
    });
  } else {
    uint32_t direct[64];
    while (got < want) {
      uint32_t left = 0;
      const uint32_t n = shared_->depot.Pop(
          direct, static_cast<uint32_t>(std::min<size_t>(64, want - got)),
          nullptr, &reshelved, &left);
      if (n == 0) break;
      PoolAccess::Popped(*this, n, left, 0, /*to_user=*/true);
      for (uint32_t i = 0; i < n; ++i) hand_out(direct[i]);  // top first
    }
  }
#ifdef BUFPOOL_FUZZ_PLANT
  // Planted defect for test/fuzz/pool_fuzz: a fill short by one buffer is
  // not counted as a failure.
  if (got + 1 < want) shared_->failures.fetch_add(1, std::memory_order_relaxed);
#else
  if (got < want) shared_->failures.fetch_add(1, std::memory_order_relaxed);
#endif
  PoolAccess::WakeWaiters(*this, reshelved);
  return got;
}

// `take_slot(i)` checks and takes the i-th entry, returning its slot, or
// kNoSlot to skip it; `clear(first, last)` empties entries [first, last)
// once they are read. A span that lives inside this pool's region may sit in
// one of the buffers released, so it is read whole before any buffer goes
// back (scrubbed, poisoned, or reused by another thread); other spans go in
// chunks of 64, each read and cleared before its buffers go back.
template <class TakeSlot, class Clear>
void BufferPool::ReleaseBulkImpl(size_t count, const void* span_bytes,
                                 TakeSlot take_slot, Clear clear) {
  auto give = [this](uint32_t* slots, uint32_t k) {
    if (k == 0) return;
    for (uint32_t i = 0; i < k; ++i) {
      if (scrub_) std::memset(SlotData(slots[i]), 0, buffer_size_);
      BUFPOOL_INTERNAL_POISON(SlotData(slots[i]), buffer_size_);
    }
    if (cache_capacity_ == 0) {
      PoolAccess::GiveUncached(*this, slots, k);
    } else {
      PoolAccess::GiveMany(*this, slots, k);
    }
  };
  if (count > 64 && Contains(span_bytes)) {
    std::vector<uint32_t> all;
    all.reserve(count);
    for (size_t i = 0; i < count; ++i) {
      const uint32_t slot = take_slot(i);
      if (slot != kNoSlot) all.push_back(slot);
    }
    clear(0, count);
    for (size_t first = 0; first < all.size(); first += 64) {
      give(all.data() + first,
           static_cast<uint32_t>(std::min<size_t>(64, all.size() - first)));
    }
    return;
  }
  uint32_t freed[64];
  for (size_t first = 0; first < count;) {
    const size_t last = std::min<size_t>(count, first + 64);
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
    dst[i].index_ = slot;
  });
}

void BufferPool::ReleaseBulk(absl::Span<Buffer> in) {
  static_assert(std::is_standard_layout_v<Buffer> && sizeof(Buffer) == 16);
  Buffer* const src = in.data();
  // Another pool's handles wait until the whole span is read (their buffer
  // may hold it), then go home one by one.
  std::vector<Buffer> foreign;
  ReleaseBulkImpl(
      in.size(), src,
      [this, src, &foreign](size_t i) {
        Buffer& b = src[i];
        if (b.pool_ != this) {
          if (b.pool_ != nullptr) foreign.push_back(std::move(b));
          return kNoSlot;
        }
        return b.index_;
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

PoolStats BufferPool::Stats() const {
  std::lock_guard<std::mutex> lock(g_registry_mu);  // the cache list
  Shared& s = *shared_;
  const int64_t depot = PoolAccess::DepotSize(*this);
  int64_t free_now = depot;
  int64_t lows = 0;
  for (const ThreadCache* c : s.caches) {
    const int64_t total = PoolAccess::Total(*c);
    free_now += total;
    lows +=
        std::min<int64_t>(total, c->low_water.load(std::memory_order_relaxed));
  }
  const int64_t cap = static_cast<int64_t>(capacity_);
  // Every cache's window contains any peak since the last event (see "High
  // water"), so the sum of their lows bounds the free slots then. Not
  // stored: read while another thread moves a batch, this picture can count
  // the batch in neither place, and the next event records the peak anyway.
  const auto open_windows =
      static_cast<size_t>(std::clamp<int64_t>(cap - depot - lows, 0, cap));
  return PoolStats{
      .capacity = capacity_,
      .in_use =
          static_cast<size_t>(std::clamp<int64_t>(cap - free_now, 0, cap)),
      .high_water =
          std::max(s.high_water.load(std::memory_order_relaxed), open_windows),
      .acquire_failures = s.failures.load(std::memory_order_relaxed),
      .acquire_timeouts = s.timeouts.load(std::memory_order_relaxed),
  };
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
               "take the raw pointer)\n",
               call, slot, static_cast<void*>(SlotData(slot)));
  std::abort();
}

}  // namespace bufpool

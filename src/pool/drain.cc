// Draining and waiting: taking free slots out of other CPUs' caches, the
// sleeping Acquire(), NotifyWhenFree(), FlushCaches(), the wake-ups, and the
// fork() handlers that keep every pool usable in a child.
//
// Draining. A drainer try-locks one CPU's cache at a time and moves its
// slots out: O(CPUs) lock attempts, whatever any thread is doing, since no
// cache belongs to a thread (cpu_cache.cc). The one exception is the rseq
// drain of every cache with mm_cid (RseqDrainAll, rseq.cc), which holds the
// caches it try-locked and stopped across its one fence. TryAcquire() drains
// before it answers empty; it skips caches whose count reads 0 without the
// lock, so an exhausted pool costs O(CPUs) loads and no lock. That skip is
// sound for an answer that does not sleep: a release that happened before
// the call is seen (coherence: a store that happens-before a load is what
// the load reads, or later), and one concurrent with it may be ordered
// after it. A cache whose lock stays busy through kBusyRounds yields is
// passed by too: what it holds is in another call's hands (a drainer moving
// it to the depot, or the cache's own thread), so TryAcquire() may answer
// empty while such a cache holds a free slot.
//
// No thread waits for a drainer. Every lock of a cache's mu is a try-lock,
// but the fork() prepare handler's (fork() waits for every call anyway). A
// thread whose own cache is busy (a drainer holds it, stopped in a handler
// or preempted, or another thread on the same CPU or index is in its slow
// path) passes the cache by: an acquire pops from the depot, a release
// pushes there and wakes waiters as every push does (TakeHere; RseqTakeBulk
// and RseqGive, rseq.cc; BufferPool::ReleaseSlow and the bulk calls,
// pool_calls.cc). Passing by moves slots only between the caller and the
// depot, by the depot's CASes, and leaves the cache as its holder sees it,
// so no slot is handed out twice or lost, and the caches' bound holds
// (nothing enters a cache but under its lock or in its section). A drainer
// that finds a cache busy skips it and comes back after a yield,
// kBusyRounds times; it never waits either. So a drainer stopped anywhere
// delays only the slots it holds, and its own call. The one wait left is
// for fork(): a single call that passes its cache by is counted (PassBy,
// pool_internal.h), the prepare handler waits for those before it locks
// the caches, and a call that comes while it prepares waits for its
// cache's lock as before, so a fork() never splits a depot pop that opens
// a magazine (two steps) outside every lock.
//
// Sleeping. A thread that is about to sleep must not miss a release that
// comes after its last look. The pool counts sleepers and pending
// NotifyWhenFree() requests in release_limit_ (the cache capacity minus
// kOneWaiter per waiter, so negative while anyone waits: one compare in a
// release's section tests both room and waiters, rseq.h); a release that
// reaches a cache reads it (under the cache's lock, or in its section) and,
// when anyone waits, puts the slot and everything the cache holds into the
// depot and wakes (cpu_cache.cc, PushLocked; rseq.cc, RseqGive). The
// sleeper:
//   1. raises the count (subtracts kOneWaiter from release_limit_, seq_cst);
//   2. locks every cache in turn, even those that look empty, and takes a
//      slot if one holds any. For each cache X, a release's section on X
//      either precedes the sleeper's (its slot is in X, or went to the depot
//      before the sleeper looks there) or follows it, and then the mutex
//      orders the raise before that section's load of the limit, which sends
//      the slot to the depot with a wake. A cache whose lock stays busy
//      ("No thread waits for a drainer") is not covered: its holder may
//      have read the limit before the raise (a failed try-lock orders
//      nothing) and leave a slot there. So a scan that skipped a busy cache
//      does not count as step 2: the sleeper sleeps at most 1 ms and goes
//      through step 2 again, until a scan gets every lock. A holder that
//      keeps X (a drainer stopped in a handler) keeps X's slots from the
//      sleeper only while it holds them; any other release still reaches
//      the sleeper through steps 2 and 3;
//   3. under wait_mu, looks at the depot again, then sleeps on wait_cv,
//      which releases wait_mu atomically. A push onto the depot is a seq_cst
//      CAS followed by a seq_cst load of the limit (WakeWaiters), and the
//      sleeper's raise is seq_cst before its seq_cst loads of the depot's
//      heads: in the single total order either the pusher sees the raise
//      (and takes wait_mu to notify, which cannot fall between the
//      sleeper's look and its sleep), or the sleeper's look sees the push.
// So Acquire() sleeps only while every buffer is in use, and any release
// wakes it. NotifyWhenFree() is the same handshake with an eventfd for the
// condition variable.
//
// fork(). The prepare handler takes, for every pool, the bulk calls' gate
// exclusive (it waits for the bulk calls in flight and holds off new ones),
// then wait_mu and then every cache's lock (the order every other path
// uses: the gate before wait_mu before a cache's lock, and several caches'
// locks only by RseqDrainAll, which try-locks), so no cache move, no depot move
// made under a lock and no bulk call is half done when the address space is
// copied; the child's handler releases them (a fresh gate: see ForkGate),
// rebuilds the condition variable (the parent's sleepers are not in the child,
// and glibc's condition variable would wait for them) and resets the count to
// the pending eventfd requests. What is left outside every lock is one
// slot at a time: a single acquire or release with caches off is one CAS
// on the depot (with caches on, one that passed its busy cache by is done
// before the caches are locked: PassBy), and a slot popped by any single
// acquire belongs to that call from the pop on. So at a fork each buffer is in
// the depot, in a cache, or held by a thread (its handle or pointer, or the
// call that is returning it): the child finds every buffer no other thread
// held.
#include <pthread.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <mutex>
#include <new>
#include <thread>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "bufpool/internal/rseq.h"
#include "os/syscalls.h"
#include "os/thread.h"
#include "pool/holders.h"
#include "pool/pool_internal.h"

namespace bufpool {

namespace {

// Visits caches 0 .. n-1 once each under their lock without ever waiting
// for one (see "No thread waits for a drainer"): a cache that empty(i)
// says holds nothing is passed over unlocked; one whose lock is busy is
// tried again after a yield, for at most `busy_rounds` more rounds.
// visit(i) runs with cache i's lock held and returns true to stop at once.
// Returns whether a cache was still busy (skipped) at the end.
template <typename MutexOf, typename Empty, typename Visit>
bool TryLockEachCache(uint32_t n, uint32_t busy_rounds, MutexOf&& mutex_of,
                      Empty&& empty, Visit&& visit) {
  uint64_t pending[kMaxCaches / 64] = {};  // n <= kMaxCaches (clamped)
  for (uint32_t i = 0; i < n; ++i) pending[i / 64] |= uint64_t{1} << (i % 64);
  for (uint32_t round = 0;; ++round) {
    bool left = false;
    for (uint32_t i = 0; i < n; ++i) {
      if ((pending[i / 64] >> (i % 64) & 1) == 0) continue;
      if (empty(i)) {
        pending[i / 64] &= ~(uint64_t{1} << (i % 64));
        continue;
      }
      const std::unique_lock<std::mutex> lock(mutex_of(i), std::try_to_lock);
      if (!lock.owns_lock()) {
        left = true;
        continue;
      }
      pending[i / 64] &= ~(uint64_t{1} << (i % 64));
      if (visit(i)) return false;
    }
    if (!left || round == busy_rounds) return left;
    std::this_thread::yield();
  }
}

// Every live pool's Shared, for the fork() handlers.
constinit std::mutex g_pools_mu;
constinit PoolAccess::SharedState* g_pools = nullptr;

// The Acquire() calls of this thread, innermost first (a signal handler may
// call Acquire() inside another). A fork() child has only the thread that
// forked, whose calls may be among these (a handler that forks where
// Acquire() holds no lock: buffer_pool.h forbids forking from a handler
// that may interrupt a pool call, since where it holds a lock the fork
// deadlocks, but where it holds none the count stays right): ForkChild
// counts again those whose addition to the waiter count is done and whose
// removal is not, so that each removal in the child finds its addition and
// no addition is counted twice. The addition (or removal) and the flag
// that says it is done change together with every signal blocked, so a
// handler, and so a fork() from one, sees both or neither (see Count()).
// The signal fences keep the list's stores on their side of a handler on
// this thread.
class CountedWait;
constinit thread_local CountedWait* t_counted_waits = nullptr;
class CountedWait {
 public:
  explicit CountedWait(BufferPool* pool)
      : pool_(pool), outer_(t_counted_waits) {
    t_counted_waits = this;
    std::atomic_signal_fence(std::memory_order_seq_cst);
  }
  ~CountedWait() {
    if (counted_) Uncount();
    std::atomic_signal_fence(std::memory_order_seq_cst);
    t_counted_waits = outer_;
  }
  CountedWait(const CountedWait&) = delete;
  CountedWait& operator=(const CountedWait&) = delete;

  // "Sleeping", step 1: adds this call to the waiter count (seq_cst).
  void Count() {
    if (PoolAccess::before_count_for_test != nullptr) [[unlikely]] {
      PoolAccess::before_count_for_test(*pool_);
    }
    {
      const os::ScopedBlockSignals blocked;
      PoolAccess::AddWaiters(*pool_, 1, std::memory_order_seq_cst);
      counted_ = true;
      std::atomic_signal_fence(std::memory_order_seq_cst);
    }
    if (PoolAccess::after_count_for_test != nullptr) [[unlikely]] {
      PoolAccess::after_count_for_test(*pool_);
    }
  }
  // Takes the addition back (a late wake is harmless).
  void Uncount() {
    const os::ScopedBlockSignals blocked;
    PoolAccess::RemoveWaiters(*pool_, 1, std::memory_order_relaxed);
    counted_ = false;
    std::atomic_signal_fence(std::memory_order_seq_cst);
  }
  const BufferPool* pool() const { return pool_; }
  bool counted() const { return counted_; }
  const CountedWait* outer() const { return outer_; }

 private:
  BufferPool* const pool_;
  CountedWait* const outer_;
  bool counted_ = false;
};

absl::Status DeadlineError(const BufferPool& pool, absl::Duration timeout,
                           const absl::Status& grow_error) {
  return absl::DeadlineExceededError(absl::StrCat(
      "BufferPool::Acquire: no buffer became free within ",
      absl::FormatDuration(timeout), " (capacity ", pool.capacity(), " x ",
      pool.buffer_size(), " bytes, all in use", grow_error.ok() ? "" : "; ",
      grow_error.message(), ")"));
}

void WriteEvent(int fd) {
  const uint64_t one = 1;
  ssize_t n;
  do {
    n = os::Sys().write(fd, &one, sizeof(one));
  } while (n < 0 && errno == EINTR);
  // Any other error is ignored: EAGAIN means the counter is full, which is
  // readable already; EBADF is the caller's closed fd.
}

}  // namespace

// With this CPU's cache locked: its slot or a refill from the depot. Caches
// off: the depot alone.
static uint32_t TakeHere(BufferPool& p, uint32_t* reshelved) {
  if (PoolAccess::S(p).ncaches == 0) {
    return PoolAccess::TakeFromDepot(p, reshelved);
  }
  if (PoolAccess::S(p).rseq) return PoolAccess::RseqTake(p, reshelved);
  CpuCache& mine = PoolAccess::ThisCpu(p);
  // Held by a drainer (or a thread sharing the CPU's cache): the depot,
  // without waiting ("No thread waits for a drainer").
  std::unique_lock<std::mutex> lock(mine.mu, std::try_to_lock);
  if (!lock.owns_lock()) {
    PoolAccess::SharedState& s = PoolAccess::S(p);
    if (const PassBy pass(s.passing, s.forking); pass.ok()) {
      return PoolAccess::TakeFromDepot(p, reshelved);
    }
    lock.lock();  // a fork() holds it
  }
  return PoolAccess::PopLocked(p, mine, reshelved);
}

uint32_t PoolAccess::TakeAnywhere(BufferPool& p, bool lock_all,
                                  uint32_t* reshelved, bool* busy_left) {
  if (busy_left != nullptr) *busy_left = false;
  uint32_t slot = TakeHere(p, reshelved);
  if (slot != BufferPool::kNoSlot) return slot;
  BufferPool::Shared& s = S(p);
  // rseq: one fence of every CPU stands for locking every cache: a section
  // that began before it has committed (its slot shows in a count read
  // after it) or restarts and sees the raise (rseq.h, "Waiters").
  if (s.rseq && lock_all && s.ncaches != 0) os::RseqFence(-1);
  if (s.rseq && lock_all && s.rseq_index == internal::rseq::kMmCidField) {
    // mm_cid: every cache's fence reaches every CPU, so all at once.
    slot = RseqDrainAll(p, /*take_one=*/true, reshelved, busy_left);
    if (slot != BufferPool::kNoSlot) return slot;
    return TakeHere(p, reshelved);
  }
  // One cache at a time, try-locked; busy ones again after a yield.
  const bool left = TryLockEachCache(
      s.ncaches, kBusyRounds,
      [&](uint32_t i) -> std::mutex& { return s.caches[i].mu; },
      [&](uint32_t i) {
        return (!lock_all || s.rseq) && CachedCount(s, i) == 0;
      },
      [&](uint32_t i) {
        if (s.rseq) {
          slot = RseqDrain(p, i, /*take_one=*/true, reshelved);
          return slot != BufferPool::kNoSlot;
        }
        CpuCache& c = s.caches[i];
        if (after_stop_for_test != nullptr) [[unlikely]]
          after_stop_for_test(i);
        if (c.count.load(std::memory_order_relaxed) == 0) return false;
        // One for us; the rest to the depot, where every CPU finds them.
        slot = PopLocked(p, c, reshelved, /*lend_ahead=*/false);
        *reshelved += Evict(p, c);
        return true;
      });
  if (slot != BufferPool::kNoSlot) return slot;
  if (busy_left != nullptr) *busy_left = left;
  // A release may have reached the depot while we looked at the caches.
  return TakeHere(p, reshelved);
}

uint32_t PoolAccess::DrainAll(BufferPool& p) {
  BufferPool::Shared& s = S(p);
  uint32_t moved = 0;
  if (s.rseq && s.rseq_index == internal::rseq::kMmCidField) {
    RseqDrainAll(p, /*take_one=*/false, &moved);  // one fence for all
    return moved;
  }
  // One cache at a time, try-locked; busy ones again after a yield (their
  // holder is a drainer that empties them, or their own thread's call).
  TryLockEachCache(
      s.ncaches, kBusyRounds,
      [&](uint32_t i) -> std::mutex& { return s.caches[i].mu; },
      [&](uint32_t i) { return s.rseq && CachedCount(s, i) == 0; },
      [&](uint32_t i) {
        if (s.rseq) {
          RseqDrain(p, i, /*take_one=*/false, &moved);
        } else {
          if (after_stop_for_test != nullptr) [[unlikely]]
            after_stop_for_test(i);
          moved += Evict(p, s.caches[i]);
        }
        return false;
      });
  return moved;
}

void PoolAccess::WakeWaiters(BufferPool& p, uint32_t pushed) {
  // seq_cst: the pusher's half of the handshake (see "Sleeping").
  if (pushed == 0 || !Waiting(p, std::memory_order_seq_cst)) return;
  BufferPool::Shared& s = S(p);
  std::vector<int> fds;  // swapped out, so nothing allocates here
  {
    const std::lock_guard<std::mutex> lock(s.wait_mu);
    fds.swap(s.notify_fds);
    RemoveWaiters(p, static_cast<uint32_t>(fds.size()),
                  std::memory_order_relaxed);
  }
  if (pushed == 1) {
    s.wait_cv.notify_one();
  } else {
    s.wait_cv.notify_all();
  }
  for (const int fd : fds) WriteEvent(fd);
}

// ---- The process-wide list and fork() ---------------------------------------

void PoolAccess::InstallForkHandlers() {
  static const bool registered =
      ::pthread_atfork(ForkPrepare, ForkParent, ForkChild) == 0;
  (void)registered;  // without handlers (ENOMEM) a child may find locks held
}

std::unique_lock<std::mutex> PoolAccess::LockPoolList() {
  return std::unique_lock<std::mutex>(g_pools_mu);
}

void PoolAccess::Register(BufferPool& p) {
  InstallForkHandlers();
  const std::lock_guard<std::mutex> lock(g_pools_mu);
  RegisterLocked(p);
}

void PoolAccess::RegisterLocked(BufferPool& p) {
  BufferPool::Shared& s = S(p);
  s.pool = &p;
  s.next = g_pools;
  if (g_pools != nullptr) g_pools->prev = &s;
  g_pools = &s;
}

void PoolAccess::Unregister(BufferPool& p) {
  BufferPool::Shared& s = S(p);
  const std::lock_guard<std::mutex> lock(g_pools_mu);
  if (s.prev != nullptr) s.prev->next = s.next;
  if (s.next != nullptr) s.next->prev = s.prev;
  if (g_pools == &s) g_pools = s.next;
}

void PoolAccess::ForkPrepare() {
  g_pools_mu.lock();
  for (BufferPool::Shared* s = g_pools; s != nullptr; s = s->next) {
    s->bulk_gate.Lock();  // before wait_mu: a bulk call may wake waiters
    // No Trim() half done (growth.cc): after the gate, which a bulk call
    // holds while it grows, before wait_mu, which a trimmer takes to wake.
    // A grower between its claim and its push counts in `passing`, waited
    // for below (growth.cc, "fork()").
    if (s->growth != nullptr) s->growth->mu.lock();
    s->wait_mu.lock();
    // No single call between its cache and the depot (PassBy), and no
    // grower between its claim and its push (ResizePass), from here on.
    s->forking.store(true, std::memory_order_seq_cst);
    while (s->passing.load(std::memory_order_seq_cst) != 0) {
      std::this_thread::yield();
    }
    for (uint32_t i = 0; i < s->ncaches; ++i) s->caches[i].mu.lock();
  }
}

void PoolAccess::ForkParent() {
  for (BufferPool::Shared* s = g_pools; s != nullptr; s = s->next) {
    for (uint32_t i = s->ncaches; i > 0; --i) s->caches[i - 1].mu.unlock();
    s->forking.store(false,
                     std::memory_order_relaxed);  // callers pass by again
    s->wait_mu.unlock();
    if (s->growth != nullptr) s->growth->mu.unlock();
    s->bulk_gate.Unlock();
  }
  g_pools_mu.unlock();
}

void PoolAccess::ForkChild() {
  for (BufferPool::Shared* s = g_pools; s != nullptr; s = s->next) {
    for (uint32_t i = s->ncaches; i > 0; --i) s->caches[i - 1].mu.unlock();
    // The parent's other threads are not here: none passes by.
    s->passing.store(0, std::memory_order_relaxed);
    s->forking.store(false, std::memory_order_relaxed);
    // The parent's sleepers are not here: a fresh condition variable, and
    // the waiters counted are the pending eventfd requests and this
    // thread's own Acquire() calls on the pool.
    new (&s->wait_cv) std::condition_variable();
    BufferPool& p = *s->pool;
    if (s->xproc != nullptr) SharedForkChild(p);
    int64_t waiters = static_cast<int64_t>(s->notify_fds.size());
    for (const CountedWait* w = t_counted_waits; w != nullptr; w = w->outer()) {
      waiters += w->pool() == &p && w->counted() ? 1 : 0;
    }
    SetWaiters(p, waiters, std::memory_order_relaxed);
    s->wait_mu.unlock();
    if (s->growth != nullptr) s->growth->mu.unlock();
    s->bulk_gate.Reset();
  }
  g_pools_mu.unlock();
}

// ---- BufferPool's waiting calls ---------------------------------------------

void BufferPool::FlushCaches() {
  PoolAccess::WakeWaiters(*this, PoolAccess::DrainAll(*this));
}

absl::StatusOr<Buffer> BufferPool::Acquire(absl::Duration timeout) {
  PoolAccess::CheckNotForked(*this);
  uint32_t reshelved = 0;
  uint32_t slot = PoolAccess::TakeAnywhere(*this, false, &reshelved);
  // An elastic pool grows before it waits (growth.cc).
  absl::Status grow_error;
  if (slot == kNoSlot && PoolAccess::Refills(*this)) {
    slot = PoolAccess::GrowAndTake(*this, &reshelved, &grow_error);
  }
  if (slot != kNoSlot || timeout <= absl::ZeroDuration()) {
    PoolAccess::WakeWaiters(*this, reshelved);
    if (slot != kNoSlot) {
      BUFPOOL_INTERNAL_UNPOISON(SlotData(slot), buffer_size_);
      if (holders_ != nullptr) holders_->Acquired(*this, slot);
      return Buffer(this, slot);
    }
    shared_->failures.fetch_add(1, std::memory_order_relaxed);
    return DeadlineError(*this, timeout, grow_error);
  }
  using Clock = std::chrono::steady_clock;
  // Beyond a century is forever (and would overflow the clock's arithmetic).
  const bool forever = timeout > absl::Hours(24 * 365 * 100);
  const Clock::time_point deadline =
      forever ? Clock::time_point::max()
              : Clock::now() + absl::ToChronoNanoseconds(timeout);
  // "Sleeping", step 1.
  CountedWait counted(this);
  counted.Count();
  for (;;) {
    bool busy_left = false;
    slot = PoolAccess::TakeAnywhere(*this, /*lock_all=*/true, &reshelved,
                                    &busy_left);
    if (slot == kNoSlot && PoolAccess::Refills(*this)) {
      // A Trim() may have taken what a release freed ("Sleepers").
      slot = PoolAccess::GrowAndTake(*this, &reshelved, &grow_error);
    }
    if (slot != kNoSlot) break;
    std::unique_lock<std::mutex> lock(shared_->wait_mu);
    // Step 3: the depot again (the caches' releases go there now).
    slot = TakeHere(*this, &reshelved);
    if (slot != kNoSlot) break;
    const Clock::time_point now = Clock::now();
    if (now >= deadline) break;
    if (busy_left || shared_->xproc != nullptr) {
      // Step 2 skipped a cache whose lock stayed busy: look again soon
      // ("No thread waits for a drainer"). A shared pool's other
      // processes release into the shared depot without waking us: it
      // looks there again each millisecond.
      shared_->wait_cv.wait_until(
          lock, std::min(deadline, now + std::chrono::milliseconds(1)));
    } else if (forever) {
      shared_->wait_cv.wait(lock);
    } else {
      shared_->wait_cv.wait_until(lock, deadline);
    }
  }
  counted.Uncount();
  // Slots put back may be what another sleeper needs.
  PoolAccess::WakeWaiters(*this, reshelved);
  if (slot != kNoSlot) {
    BUFPOOL_INTERNAL_UNPOISON(SlotData(slot), buffer_size_);
    if (holders_ != nullptr) holders_->Acquired(*this, slot);
    return Buffer(this, slot);
  }
  shared_->timeouts.fetch_add(1, std::memory_order_relaxed);
  return DeadlineError(*this, timeout, grow_error);
}

absl::Status BufferPool::NotifyWhenFree(int event_fd) {
  if (event_fd < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "BufferPool::NotifyWhenFree: event_fd must be an open file "
        "descriptor, got ",
        event_fd));
  }
  Shared& s = *shared_;
  {
    const std::lock_guard<std::mutex> lock(s.wait_mu);
    try {
      s.notify_fds.push_back(event_fd);
    } catch (const std::bad_alloc&) {
      return absl::ResourceExhaustedError(
          "BufferPool::NotifyWhenFree: out of memory for the request");
    }
    // "Sleeping", step 1.
    PoolAccess::AddWaiters(*this, 1, std::memory_order_seq_cst);
  }
  // Steps 2 and 3 without taking anything: is a buffer free now?
  bool free_now = !s.depot.SeenEmpty();
  if (!free_now && s.rseq && s.ncaches != 0) os::RseqFence(-1);
  for (uint32_t i = 0; !free_now && i < s.ncaches; ++i) {
    if (s.rseq) {
      free_now = PoolAccess::CachedCount(s, i) != 0;
      continue;
    }
    // A busy cache may hold a free slot that its holder keeps there: fire
    // now rather than wait for the holder.
    const std::unique_lock<std::mutex> lock(s.caches[i].mu, std::try_to_lock);
    free_now = !lock.owns_lock() ||
               s.caches[i].count.load(std::memory_order_relaxed) != 0;
  }
  if (!free_now) free_now = !s.depot.SeenEmpty();
  if (!free_now) return absl::OkStatus();  // the next release fires it
  bool still_pending = false;
  {
    const std::lock_guard<std::mutex> lock(s.wait_mu);
    auto it = std::find(s.notify_fds.begin(), s.notify_fds.end(), event_fd);
    if (it != s.notify_fds.end()) {
      s.notify_fds.erase(it);
      PoolAccess::RemoveWaiters(*this, 1, std::memory_order_relaxed);
      still_pending = true;
    }
  }
  if (still_pending) WriteEvent(event_fd);  // else a release fired it
  return absl::OkStatus();
}

}  // namespace bufpool

// The pool's private state and the out-of-line operations shared by the
// files of src/pool, each of which owns one concept:
//
//   cpu_cache.cc   the per-CPU caches: choosing this CPU's, the moves
//                  between a cache and the depot, with the correctness
//                  argument for the locks that guard them
//   drain.cc       emptying other CPUs' caches, waiting (Acquire, the
//                  eventfd notices), waking, fork()
//   accounting.cc  in_use, cached, high_water, the counters, Stats()
//   pool_calls.cc  BufferPool's own calls: Create, the destructor, the
//                  single, bulk and raw paths, the checks
//   growth.cc      an elastic pool (max_buffer_count): the reserve, growing
//                  on the slow path, Trim() and the idle trim
//
// Free slots live in exactly one place: the depot (pool/depot.h), or one
// CPU's cache (CpuCache). A slot in transit between the two is counted as in
// use, never as free twice (see accounting.cc).
#ifndef BUFPOOL_SRC_POOL_POOL_INTERNAL_H_
#define BUFPOOL_SRC_POOL_POOL_INTERNAL_H_

#include <pthread.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "arena/arena.h"
#include "bufpool/budget.h"
#include "bufpool/buffer_pool.h"
#include "pool/depot.h"
#include "pool/shared_region.h"

namespace bufpool {

// The most CPU caches a pool keeps (CPUs beyond it share caches).
inline constexpr uint32_t kMaxCaches = 4096;

// One CPU's cache of free slots for one pool. Every field but the count's
// relaxed reads is touched only with `mu` held (see cpu_cache.cc, "Why the
// locks suffice"). `count` is an atomic so that Stats() and the
// exhausted-pool check can read it without the lock.
struct alignas(64) CpuCache {
  std::mutex mu;
  std::atomic<uint32_t> count{0};  // slots[0, count) are free
  // floor <= count: slots[floor, count) are lent, the ones a pop may take
  // without the pool's accounting (accounting.cc, "High water"). The locked
  // caches' own; an rseq cache keeps its floor in its header (rseq.h).
  uint32_t floor = 0;
  uint32_t spare = Depot::kNoSlot;  // an empty magazine for a spill
  uint32_t* slots = nullptr;        // cache_capacity entries
};

// What makes a bulk call all-before or all-after a fork(): bulk calls hold
// it shared for their whole move (slots out of the depot or a cache and
// into the caller's span, or out of the span and back), fork()'s prepare
// handler holds it exclusive. Between those steps a bulk call's slots are
// on its stack only, and a thread that is not in the child would take up to
// a whole call's slots with it. Writer preference, so that a stream of bulk
// calls on other threads cannot starve a fork; no bulk call nests another
// on the same pool, so the reader side never recurses.
class ForkGate {
 public:
  ForkGate() { Init(); }
  ~ForkGate() { ::pthread_rwlock_destroy(&rw_); }
  ForkGate(const ForkGate&) = delete;
  ForkGate& operator=(const ForkGate&) = delete;

  void LockShared() { Check(::pthread_rwlock_rdlock(&rw_)); }
  void UnlockShared() { Check(::pthread_rwlock_unlock(&rw_)); }
  void Lock() { Check(::pthread_rwlock_wrlock(&rw_)); }
  void Unlock() { Check(::pthread_rwlock_unlock(&rw_)); }
  // In a fork() child, instead of Unlock(): the parent's hold belongs to a
  // thread id the child's thread no longer has, so a fresh lock.
  void Reset() { Init(); }

 private:
  void Init() {
    pthread_rwlockattr_t attr;
    ::pthread_rwlockattr_init(&attr);
    ::pthread_rwlockattr_setkind_np(
        &attr, PTHREAD_RWLOCK_PREFER_WRITER_NONRECURSIVE_NP);
    Check(::pthread_rwlock_init(&rw_, &attr));
    ::pthread_rwlockattr_destroy(&attr);
  }
  static void Check(int err) {
    if (err != 0) [[unlikely]] {
      std::fprintf(stderr, "bufpool: pthread_rwlock: %s\n", std::strerror(err));
      std::abort();
    }
  }

  pthread_rwlock_t rw_;
};

// Holds a ForkGate shared for a scope.
class SharedForkGate {
 public:
  explicit SharedForkGate(ForkGate& g) : g_(g) { g_.LockShared(); }
  ~SharedForkGate() { g_.UnlockShared(); }
  SharedForkGate(const SharedForkGate&) = delete;
  SharedForkGate& operator=(const SharedForkGate&) = delete;

 private:
  ForkGate& g_;
};

// A call whose own cache's lock is busy (drain.cc, "No thread waits for a
// drainer"): ok() when it may go to the depot instead, counted in
// Shared::passing for its scope; false while a fork() is being prepared,
// whose handler holds (or is about to take) the lock: then the caller waits
// for the lock, since fork() waits for every call anyway.
class PassBy {
 public:
  explicit PassBy(std::atomic<uint32_t>& passing, std::atomic<bool>& forking)
      : passing_(passing) {
    passing_.fetch_add(1, std::memory_order_seq_cst);
    ok_ = !forking.load(std::memory_order_seq_cst);
    if (!ok_) passing_.fetch_sub(1, std::memory_order_release);
  }
  ~PassBy() {
    // release: the depot moves are done before the handler goes on.
    if (ok_) passing_.fetch_sub(1, std::memory_order_release);
  }
  PassBy(const PassBy&) = delete;
  PassBy& operator=(const PassBy&) = delete;
  bool ok() const { return ok_; }

 private:
  std::atomic<uint32_t>& passing_;
  bool ok_ = false;
};

// An elastic pool's growth state (growth.cc). The region is cut into chunks
// of `chunk_slots` slots (chunk_bytes each: a whole number of commit units
// and of buffers); a chunk is backed (its slots are free in the depot or a
// cache, or in use), unbacked (its bit set in `unbacked`: the reserve), or
// in transit (claimed by one grower or trimmer, its slots in no free store).
// Growth claims the lowest unbacked chunks; Trim() gives back free ones,
// the highest first. No acquire, release or growth takes a lock here.
struct Growth {
  size_t chunk_bytes = 0;
  uint32_t chunk_slots = 0;      // slots per chunk (the last may have fewer)
  uint32_t chunks = 0;           // in the region
  uint32_t step_chunks = 0;      // chunks per growth step (grow_step)
  uint32_t max_step_chunks = 0;  // the most a doubled step reaches
  int64_t idle_ns = 0;           // trim_after_idle; 0: off
  // Serializes the trimmers (Trim(), the idle trim's try-lock) with each
  // other, with PinRegion() and with the fork() prepare handler (taken
  // after the bulk calls' gate, before wait_mu). No acquire, release or
  // growth takes it, so a trimmer stopped while holding it stalls no call
  // that needs a buffer (growth.cc, "Nobody waits").
  std::mutex mu;
  // Bit c of word c / 64: chunk c is unbacked and unclaimed. A grower
  // claims chunks by clearing their bits (fetch_and, acquire: after the
  // trimmer's decommit); a trimmer sets a chunk's bit after its decommit
  // (fetch_or, release). [words]
  std::unique_ptr<std::atomic<uint64_t>[]> unbacked;
  uint32_t words = 0;
  // Chunks whose bits are set, give or take a claim or an unclaim in
  // flight: a grower lowers it after its fetch_and, a trimmer raises it
  // after its fetch_or, so it may lag the bits and, while a grower claims
  // bits a trimmer has set but not yet counted, read below zero (signed:
  // a reader treats <= 0 as "nothing to claim"; such a reader overlaps the
  // unclaim, which may be ordered after it). seq_cst: an exhausted caller's
  // load of it and of `trimming` pairs with a sleeping Acquire()'s count
  // (see growth.cc).
  std::atomic<int64_t> unbacked_chunks{0};
  // The chunks the next growth on demand backs: step_chunks, doubled by
  // each such growth up to max_step_chunks; back to step_chunks after a
  // trim that gave memory back. Relaxed: a heuristic.
  std::atomic<uint32_t> next_step{0};
  // True while a trimmer holds free slots out of the depot (seq_cst both
  // ways; growth.cc, "Exhaustion").
  std::atomic<bool> trimming{false};
  // The trimmer's free slots, open to any caller that misses meanwhile:
  // entry i holds slot + 1, or 0 once taken (by a caller, or back by the
  // trimmer); [held_n] are written. Each entry leaves by an exchange, so a
  // slot is taken once (growth.cc, "Trimming"). [capacity], calloc'd: the
  // pages are touched by trims only.
  std::unique_ptr<std::atomic<uint32_t>[], void (*)(void*)> held {
    nullptr, &std::free
  };
  std::atomic<uint32_t> held_n{0};
  std::atomic<uint32_t> take_from{0};  // where takers start looking; relaxed
  // Counters for Stats(); relaxed, like the pool's other statistics.
  std::atomic<uint64_t> grows{0};
  std::atomic<uint64_t> trims{0};
  std::atomic<uint64_t> grow_failures{0};
  // The idle trim: the window's start (steady-clock ns) and the fewest free
  // slots the depot was seen holding in it (relaxed: a heuristic).
  std::atomic<int64_t> window_start{0};
  std::atomic<int64_t> window_low{0};
  // The most recent growth failure, for Acquire()'s error; under error_mu,
  // which guards nothing else and is never held across a system call.
  std::mutex error_mu;
  absl::Status last_error;
  // FixedBuffers registrations of this pool alive now: Trim() gives back
  // nothing while the kernel holds the pages. Raised under `mu` (so never
  // during a Trim()), read by Trim() under `mu`; acq_rel/acquire for the
  // unpin, which comes without the lock (BufferPool::PinRegion).
  std::atomic<uint32_t> pinned{0};
};

// Unmaps Shared::rseq_area (cpu_cache.cc).
struct RseqAreaUnmap {
  size_t bytes = 0;
  void operator()(char* p) const;
};

struct BufferPool::Shared {
  Shared(Arena a, uint32_t capacity, uint32_t batch, uint32_t ncaches,
         uint32_t cache_capacity);

  Arena arena;
  Depot depot;
  const uint32_t ncaches;                   // one per CPU the system may run
  std::unique_ptr<CpuCache[]> caches;       // [ncaches]; empty with caches off
  std::unique_ptr<uint32_t[]> cache_slots;  // their slots arrays
  // rseq mode (rseq.h): the caches' counts and slots live here instead,
  // index i's at rseq_base + i * kCacheStride, in an anonymous mapping (its
  // pages are zero, and only the caches of the indexes in use are written);
  // CpuCache::mu still serializes the slow paths and drains of index i, and
  // CpuCache::spare is its spare.
  bool rseq = false;
  uint64_t rseq_index = 0;  // the rseq area field (kCpuIdField, kMmCidField)
  std::unique_ptr<char, RseqAreaUnmap> rseq_area;
  char* rseq_base = nullptr;
  // The depot's size with caches on (see accounting.cc); relaxed: a
  // statistic, and each read-modify-write returns the exact value before it.
  alignas(64) std::atomic<int64_t> depot_free{0};
  std::atomic<size_t> high_water{0};
  // Caches on: buffers held by users plus the slots the caches lend
  // (accounting.cc, "High water"); never below the true value.
  std::atomic<int64_t> held_or_lent{0};
  // Backed slots: the capacity of a fixed pool; for an elastic one, raised
  // by growth before the new slots reach the depot and lowered by Trim()
  // after it took them out, so a slot in transit counts as in use (see
  // accounting.cc). Relaxed: a statistic like the counts beside it.
  std::atomic<size_t> committed{0};
  std::unique_ptr<Growth> growth;  // elastic pools only (max_buffer_count)
  // A shared pool (PoolOptions::shared): the memfd's state and this
  // process's place in it (shared_pool.cc); nullptr for a private pool.
  // Then `committed` counts the slots this process owns.
  std::unique_ptr<ProcessShare> xproc;
  // A private pool's ledger for Export/Import within the process: the
  // shared ledger's words (shared_region.h), all of process 0, kFree
  // meaning "not exported"; calloc'd at the first Export (a pool that never
  // exports pays nothing), installed with a CAS whose loser frees its own.
  // Ordering: the CAS (acq_rel) and Load (acquire) make the zeroed words
  // visible before the pointer is used.
  struct LazyWords {
    std::atomic<std::atomic<uint64_t>*> words{nullptr};
    LazyWords() = default;
    LazyWords(const LazyWords&) = delete;
    LazyWords& operator=(const LazyWords&) = delete;
    ~LazyWords() { std::free(words.load(std::memory_order_relaxed)); }
    std::atomic<uint64_t>* Load() const {
      return words.load(std::memory_order_acquire);
    }
    // The words, allocated first if need be; nullptr when out of memory.
    std::atomic<uint64_t>* GetOrMake(size_t n) {
      std::atomic<uint64_t>* w = Load();
      if (w != nullptr) return w;
      auto* made = static_cast<std::atomic<uint64_t>*>(
          std::calloc(n, sizeof(std::atomic<uint64_t>)));
      if (made == nullptr) return nullptr;
      if (words.compare_exchange_strong(w, made, std::memory_order_acq_rel,
                                        std::memory_order_acquire)) {
        return made;
      }
      std::free(made);  // another thread installed its own first
      return w;
    }
  };
  LazyWords local_ledger;
  std::atomic<uint64_t> failures{0};
  std::atomic<uint64_t> timeouts{0};
  ForkGate bulk_gate;  // held shared by the bulk calls (see ForkGate)
  // A single call whose own cache is busy moves slots between itself and
  // the depot outside every lock (PassBy); opening a magazine there is two
  // steps, which a fork() must not split. `passing` counts those calls,
  // `forking` is set by the fork() prepare handler, which waits for
  // passing == 0 before it locks the caches (seq_cst both ways: either the
  // call sees forking and waits for its cache's lock as before, or the
  // handler sees the call and waits for it).
  std::atomic<uint32_t> passing{0};
  std::atomic<bool> forking{false};
  // The wait paths (drain.cc): Acquire()'s sleep and the eventfd requests.
  std::mutex wait_mu;
  std::condition_variable wait_cv;
  std::vector<int> notify_fds;  // under wait_mu
  // Long-lived lenders (internal::AddLender, holders.cc): read by reports
  // only, under lenders_mu.
  std::mutex lenders_mu;
  std::vector<std::pair<const void*, internal::LentCount>> lenders;
  // The process-wide list of pools, for the fork() handlers (drain.cc).
  BufferPool* pool = nullptr;
  Shared* prev = nullptr;
  Shared* next = nullptr;
};

// The pool's out-of-line operations, as a friend so that they stay out of
// the public header.
struct PoolAccess {
  using SharedState = BufferPool::Shared;

  // An internal invariant broke: a bug in src/pool, never a user error.
  [[noreturn]] static void DieCorrupt(const BufferPool& p, const char* what,
                                      uint64_t value);

  static BufferPool::Shared& S(const BufferPool& p) { return *p.shared_; }
  static uint32_t RefillBatch(const BufferPool& p) {
    return static_cast<uint32_t>(std::max<size_t>(1, p.cache_capacity_ / 2));
  }
  static bool Waiting(const BufferPool& p,
                      std::memory_order order = std::memory_order_relaxed) {
    return p.release_limit_.load(order) < 0;
  }
  static int64_t ReleaseLimit(const BufferPool& p) {
    return p.release_limit_.load(std::memory_order_relaxed);
  }
  // BufferPool::release_limit_ as a count of waiters (drain.cc): exactly n
  // (Create(), the fork child), n more, or n fewer. The limit never rises above
  // the capacity, in case a removal ever came without its addition (the fork
  // child recounts them: ForkChild): a limit above it would let a push pass on
  // a stopped or full cache.
  static void SetWaiters(BufferPool& p, int64_t n, std::memory_order order) {
    p.release_limit_.store(static_cast<int64_t>(p.cache_capacity_) -
                               n * internal::rseq::kOneWaiter,
                           order);
  }
  static void AddWaiters(BufferPool& p, uint32_t n, std::memory_order order) {
    p.release_limit_.fetch_sub(n * internal::rseq::kOneWaiter, order);
  }
  static void RemoveWaiters(BufferPool& p, uint32_t n,
                            std::memory_order order) {
    const auto cap = static_cast<int64_t>(p.cache_capacity_);
    int64_t v = p.release_limit_.load(std::memory_order_relaxed);
    while (!p.release_limit_.compare_exchange_weak(
        v, std::min(cap, v + n * internal::rseq::kOneWaiter), order,
        std::memory_order_relaxed)) {
    }
  }

  // ---- cpu_cache.cc

  // The cache of the CPU (rseq mode: the index) this thread runs on, or ran
  // on a moment ago: a migration only costs locality, the lock makes any
  // cache safe.
  static CpuCache& ThisCpu(BufferPool& p);
  // Makes s's caches for Create(): the CpuCache array, and the rseq area
  // (mapped; its failure is the Status) or the locked caches' slots. Throws
  // std::bad_alloc where `new` does (Create() catches it).
  static absl::Status InitCaches(SharedState& s, uint32_t cache_capacity);
  static uint32_t CpuCount();
  // The rseq area field that indexes the rseq caches in this process
  // (internal::rseq::kMmCidField or kCpuIdField), or 0 where they are off;
  // fixed at first use.
  static uint64_t RseqIndexField();
  // The free slots CPU i's cache holds (relaxed; either mode).
  static uint32_t CachedCount(const SharedState& s, uint32_t i);
  // rseq mode: this CPU's slot, or a refill from the depot (one handed out,
  // the rest pushed into whichever cache the thread runs on).
  static uint32_t RseqTake(BufferPool& p, uint32_t* reshelved);
  // RseqTake after its pop missed (the caller's own pop of this CPU's cache
  // found nothing lent): the lend and pop, or the refill.
  static uint32_t RseqTakeMissed(BufferPool& p, uint32_t* reshelved);
  // rseq mode, for a bulk acquire: up to `max` slots into out[0, n) in the
  // order to hand them out: this CPU's cache in one section (its top
  // first), then RseqTakeBulk, then one slot from the drain. 0 only when
  // no slot was free anywhere.
  static uint32_t RseqTakeChunk(BufferPool& p, uint32_t* out, uint32_t max,
                                uint32_t* reshelved);
  // rseq mode, for a caller that found this CPU's cache short (a bulk
  // call, or RseqTake's refill of one): up to `max` more slots into
  // out[0, n): whole magazines straight from the depot, then what is left
  // of a refill of this CPU's cache (the rest of the refill stays cached).
  // Fewer than `max` only when the depot ran out.
  // *lent (when not null): set when the refill also let the cache lend its
  // allowance, with one rise for the slots handed out and the lend together.
  static uint32_t RseqTakeBulk(BufferPool& p, uint32_t* out, uint32_t max,
                               uint32_t* reshelved, bool* lent = nullptr);
  // rseq mode, with c.mu held (c: ThisCpu, for its spare): pushes slots[0,
  // n) into whichever cache this thread runs on now, in one section per
  // batch (a migration between batches only costs locality), slots[n - 1]
  // last so that it is on top. What does not fit (a full cache after a
  // migration, a waiter, a drainer) goes back to the depot, added to
  // *reshelved (the caller owes waiters a wake-up for it).
  static void ParkInCache(BufferPool& p, CpuCache& c, uint32_t* slots,
                          uint32_t n, uint32_t* reshelved);
  // rseq mode: releases `slot`; the slots it pushed to the depot.
  static uint32_t RseqGive(BufferPool& p, uint32_t slot);
  // rseq mode: lets the cache the thread runs on lend up to p.lend_ slots
  // (internal::rseq::Lend, accounted first); what it lent more.
  static uint32_t RseqLend(BufferPool& p);
  // rseq mode: RseqLend and a pop in one section (internal::rseq::LendPop);
  // the slot, or kNoSlot when that cache is empty or stopped.
  static uint32_t RseqLendPop(BufferPool& p);
  // rseq mode: takes back what that cache lends (internal::rseq::Reclaim,
  // accounted after); how much.
  static uint32_t RseqReclaim(BufferPool& p);
  // For the part of a bulk release that this CPU's cache did not take
  // (PushBatch), or a release whose cache a drainer holds (either mode):
  // slots[0, n) to the depot in one push; returns n, the slots pushed there.
  static uint32_t RseqGiveBulk(BufferPool& p, const uint32_t* slots,
                               uint32_t n);
  // rseq mode, with caches[i].mu held: stops CPU i's cache, takes one slot
  // if `take_one` (returned; kNoSlot otherwise or when empty), moves the
  // rest to the depot (added to *moved) and restarts it empty.
  static uint32_t RseqDrain(BufferPool& p, uint32_t i, bool take_one,
                            uint32_t* moved);
  // rseq mode, with caches[i].mu held and cache i stopped (its kStopped
  // bit survived a fence): as RseqDrain after its stop.
  static uint32_t TakeStopped(BufferPool& p, uint32_t i, bool take_one,
                              uint32_t* moved);
  // rseq mode, holding no cache's lock: RseqDrain of every cache that holds
  // slots and whose lock it gets (try-lock), all stopped before one fence of
  // every CPU (the caches that lost their stop to a late commit go round again
  // alone); takes one slot if `take_one` (returned; kNoSlot otherwise or
  // when all are empty). For mm_cid, where each cache's own fence would
  // reach every CPU anyway.
  // Busy caches are skipped and tried again kBusyRounds times; *busy_left
  // (when given) says whether some were still busy at the end.
  static uint32_t RseqDrainAll(BufferPool& p, bool take_one, uint32_t* moved,
                               bool* busy_left = nullptr);
  // How many times a drain comes back to caches whose lock was busy.
  static constexpr uint32_t kBusyRounds = 3;
  // Test seam (nullptr outside tests): called with the cache's index each
  // time a drainer has set kStopped on an rseq cache and not yet fenced, so
  // a test can commit there as a section that read the count before the
  // stop would; with the locked caches, each time a drainer has locked a
  // cache and not yet emptied it.
  static inline void (*after_stop_for_test)(uint32_t cache) = nullptr;
  // Test seams (nullptr outside tests): called by a sleeping Acquire() just
  // before and just after it adds itself to the waiter count (drain.cc,
  // CountedWait), where a signal handler that forks may run.
  static inline void (*before_count_for_test)(BufferPool& pool) = nullptr;
  static inline void (*after_count_for_test)(BufferPool& pool) = nullptr;
  // Test seam (nullptr outside tests): called by a trimmer or grower at
  // each point where it holds free slots or chunks in transit (growth.cc),
  // where a signal handler that sleeps may run.
  enum class ResizePoint {
    kTrimPopped,        // a batch popped from the depot, not yet published
    kTrimHolding,       // every free slot it took is published in `held`
    kTrimDecommitting,  // the rest back; the chosen chunks about to go
    kGrowClaimed,       // chunks claimed, about to be populated
  };
  static inline void (*resize_point_for_test)(ResizePoint point) = nullptr;
  // With c.mu held: pops one free slot, refilling from the depot when c is
  // empty; kNoSlot when both are empty. *reshelved: see Depot::Pop.
  // `lend_ahead` (this CPU's cache): when c lends nothing, it lends up to
  // p.lend_ at once, so that the next pops need no accounting; otherwise
  // (a drainer's take) the one slot alone is accounted.
  static uint32_t PopLocked(BufferPool& p, CpuCache& c, uint32_t* reshelved,
                            bool lend_ahead = true);
  // With c.mu held: puts a released slot into c, spilling to the depot when
  // full, or everything c holds while someone waits. The slots pushed.
  static uint32_t PushLocked(BufferPool& p, CpuCache& c, uint32_t slot);
  // With c.mu held: puts slots[0, n) released by a bulk call into c while
  // it has room, the rest into the depot (all of it, and c's, while someone
  // waits). The slots pushed.
  static uint32_t PushManyLocked(BufferPool& p, CpuCache& c,
                                 const uint32_t* slots, uint32_t n);
  // With c.mu held: refills c's empty stack with up to `max` slots.
  static uint32_t Refill(BufferPool& p, CpuCache& c, uint32_t max,
                         uint32_t* reshelved);
  // With c.mu held: moves every slot of c to the depot; the number moved.
  static uint32_t Evict(BufferPool& p, CpuCache& c);

  // ---- drain.cc

  // Takes one free slot from anywhere: this CPU's cache, the depot, other
  // CPUs' caches. `lock_all`: lock every cache, even those that look empty
  // (for a caller about to sleep; see drain.cc). kNoSlot when none. A
  // cache whose lock is busy is tried again kBusyRounds times, then
  // skipped; *busy_left (when given) says whether one was.
  static uint32_t TakeAnywhere(BufferPool& p, bool lock_all,
                               uint32_t* reshelved, bool* busy_left = nullptr);
  // Empties every CPU's cache into the depot; the slots moved. Wakes no one.
  static uint32_t DrainAll(BufferPool& p);
  // Called after `pushed` slots reached the depot: wakes sleepers and fires
  // eventfd requests.
  static void WakeWaiters(BufferPool& p, uint32_t pushed);
  static void Register(BufferPool& p);  // into the fork() list
  // Register() in parts, for a pool that must be on the fork() list before
  // a fork can copy what it opens (a shared pool's liveness lock): the
  // handlers installed, the list's mutex held (a fork() waits for it in
  // its prepare handler) across the opening and RegisterLocked().
  static void InstallForkHandlers();
  static std::unique_lock<std::mutex> LockPoolList();
  static void RegisterLocked(BufferPool& p);
  static void Unregister(BufferPool& p);  // out of it
  // The fork() handlers, also called by tests: Prepare takes every lock of
  // every pool; Parent releases them; Child releases them and forgets the
  // parent's sleepers.
  static void ForkPrepare();
  static void ForkParent();
  static void ForkChild();

  // ---- growth.cc

  // The elastic options' errors, before anything is mapped: InvalidArgument
  // naming the field, the value and the limit.
  static absl::Status CheckGrowthOptions(const PoolOptions& options);
  // Validates the elastic options and, for an elastic pool, makes s.growth
  // with the first `committed_slots` slots backed; their number, rounded up
  // to whole chunks, is returned (the capacity for a fixed pool).
  static absl::StatusOr<size_t> InitGrowth(BufferPool& p, SharedState& s,
                                           const PoolOptions& options);
  // For a caller that found no free slot anywhere (TakeAnywhere gave
  // kNoSlot): takes a slot a running Trim() holds, or grows an elastic pool
  // by one step and takes one of the new slots; waits for nobody. kNoSlot
  // at the ceiling, when growing failed (then *error, when given, is the
  // failure), or when the only free slots are a concurrent grower's or
  // trimmer's in transit. Fixed pools: kNoSlot at once. *reshelved: the
  // slots it put in the depot (the caller owes waiters a wake-up).
  static uint32_t GrowAndTake(BufferPool& p, uint32_t* reshelved,
                              absl::Status* error = nullptr);
  // Claims and backs `chunks` unbacked chunks (fewer at the ceiling), the
  // lowest first, and pushes their slots to the depot in one batch; with
  // `taken`, the lowest new slot goes to *taken instead, accounted as
  // handed out. The slots made free (pushed or taken); 0 at the ceiling,
  // when others hold the rest in transit, or when the system refused (then
  // *error, when given, says why). Holds no lock.
  static uint32_t GrowChunks(BufferPool& p, uint32_t chunks, uint32_t* taken,
                             absl::Status* error);
  // Takes one of the slots a running Trim() holds and has not claimed,
  // accounted as handed out; kNoSlot when none is left.
  static uint32_t TakeFromTrimmer(BufferPool& p);
  // With growth->mu held: Trim(keep_free) of the depot's free slots; the
  // bytes given back.
  static size_t TrimLocked(BufferPool& p, size_t keep_free);
  // trim_after_idle: samples the depot and trims what stayed free for the
  // whole window once it has passed. Cheap when not due; never blocks.
  static size_t IdleTick(BufferPool& p);

  // ---- shared_pool.cc

  // Create() of a shared pool (options.shared), and Join(fd).
  static absl::StatusOr<std::unique_ptr<BufferPool>> CreateShared(
      const PoolOptions& options, size_t cache_size, TrackHolders track);
  // Their common end: the pool over the memfd that x describes (its
  // metadata mapped): the region mapped, the private parts made as
  // Create() makes them, the process registered. The process's depot
  // starts empty: every slot is in the shared depot or another process's.
  static absl::StatusOr<std::unique_ptr<BufferPool>> FinishShared(
      std::unique_ptr<ProcessShare> x, const PoolOptions& options,
      size_t cache_size, TrackHolders track);
  // Whether the slow paths go past an empty process for more: an elastic
  // pool grows, a shared one takes from the shared depot (GrowAndTake).
  static bool Refills(const BufferPool& p) {
    return p.shared_->growth != nullptr || p.shared_->xproc != nullptr;
  }
  // The slow path of a shared pool that found no free slot in the process:
  // a batch from the shared depot (after reclaiming the dead, rate-limited,
  // when it is empty); one slot handed out, the rest in the process's
  // depot (added to *reshelved). kNoSlot when the shared depot is empty.
  static uint32_t SharedTake(BufferPool& p, uint32_t* reshelved);
  // After slots reached the process's depot: when it holds more than four
  // batches, gives batches back to the shared depot until two are left.
  static void SharedMaybeGive(BufferPool& p);
  // Aborts, naming the pool, in a fork() child that uses its parent's
  // BufferPool object of a shared pool.
  [[noreturn]] static void DieForked(const BufferPool& p);
  static void CheckNotForked(const BufferPool& p) {
    const ProcessShare* x = p.shared_->xproc.get();
    if (x != nullptr && x->forked) [[unlikely]]
      DieForked(p);
  }
  // The fork() child's handler for a shared pool: the parent owns what the
  // object caches, so its inline paths are turned off and its own lock
  // description closed.
  static void SharedForkChild(BufferPool& p);
  // The destructor's part for a shared pool: everything this process owns
  // back to the shared depot and the process out of the table (nothing in
  // a fork() child but the descriptors).
  static void SharedLeave(BufferPool& p);
  // The shared mutex, held across a caller's look at the shared state
  // (tests: the ledger's invariants); the lock repairs after a dead holder
  // as every locker does.
  static void LockSharedState(BufferPool& p);
  static void UnlockSharedState(BufferPool& p);
  // Live entries in the process table (dead ones not yet reclaimed
  // count), for Stats().
  static size_t SharedProcesses(const BufferPool& p);
  // " (owned by process pid P ...)" for a raw-pointer abort in a shared
  // pool; empty for a private one.
  static std::string OwnerNote(const BufferPool& p, uint32_t slot);

  // ---- accounting.cc

  // After popping n > 0 slots from the depot (which held `left` after the
  // pop when it keeps no magazines); `handed` of the n go straight to users
  // (accounted here, before they reach them).
  static void Popped(BufferPool& p, uint32_t n, uint32_t left, uint32_t handed);
  // After pushing n slots to the depot that have already left a cache's
  // count; `returned` of them came from users (or were lent by a cache).
  static void Pushed(BufferPool& p, uint32_t n, uint32_t returned);
  // Caches on: n more buffers held or lent, added (and high_water raised)
  // before they can be handed out; n fewer, subtracted after they left.
  // Inline (below): the slow paths of the caches call them once per lend,
  // reclaim, refill and spill.
  static void Lent(BufferPool& p, uint32_t n);
  static void Returned(BufferPool& p, uint32_t n);
  // The depot's free slots.
  static int64_t DepotSize(const BufferPool& p);
  // Free slots in all caches (relaxed reads; exact when no call runs).
  static int64_t Cached(const BufferPool& p);
  // Takes one slot from the depot straight to a user; kNoSlot when empty.
  static uint32_t TakeFromDepot(BufferPool& p, uint32_t* reshelved);

  // ---- pool_calls.cc: Create()'s steps, in the order it takes them

  // Sets p's fields that stay fixed after Create() (geometry, cache size,
  // lend_, no waiters) from the checked options and makes the state bytes,
  // all "not raw". Throws std::bad_alloc.
  static void InitFixedFields(BufferPool& p, const Arena& arena,
                              const PoolOptions& options, size_t cache_size,
                              size_t ceiling);
  // Makes p.shared_ over `arena`, with its caches and, for an elastic pool,
  // its growth state; the slots backed now (the capacity for a fixed pool).
  // A failure to map the caches' area or to back the first chunks is the
  // Status, with p.shared_ left for Create() to reset; throws
  // std::bad_alloc.
  static absl::StatusOr<size_t> InitShared(BufferPool& p, Arena&& arena,
                                           const PoolOptions& options);
  // Numbers ready[i] = i and pushes them all to the depot, slot 0 on top,
  // counted free and poisoned.
  static void FillDepot(BufferPool& p, std::vector<uint32_t>& ready);
  // The fields the inline paths read (the rseq caches, holder marks,
  // inline_index_), once p.shared_ and p.holders_ are made.
  static void InitInlinePaths(BufferPool& p, TrackHolders track);
};

namespace internal {

// Raises target to min(value, limit) unless it is already there (relaxed:
// a statistic; accounting.cc).
inline void UpdateMax(std::atomic<size_t>& target, int64_t value,
                      size_t limit) {
  if (value <= 0) return;
  value = std::min<int64_t>(value, static_cast<int64_t>(limit));
  size_t seen = target.load(std::memory_order_relaxed);
  while (static_cast<size_t>(value) > seen &&
         !target.compare_exchange_weak(seen, static_cast<size_t>(value),
                                       std::memory_order_relaxed)) {
  }
}

}  // namespace internal

// The bound's rises and falls (accounting.cc, "High water").
inline void PoolAccess::Lent(BufferPool& p, uint32_t n) {
  BufferPool::Shared& s = S(p);
  const int64_t before = s.held_or_lent.fetch_add(n, std::memory_order_relaxed);
  const size_t committed = s.committed.load(std::memory_order_relaxed);
  internal::UpdateMax(s.high_water, before + n, committed);
}

inline void PoolAccess::Returned(BufferPool& p, uint32_t n) {
  S(p).held_or_lent.fetch_sub(n, std::memory_order_relaxed);
}

}  // namespace bufpool

#endif  // BUFPOOL_SRC_POOL_POOL_INTERNAL_H_

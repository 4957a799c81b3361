// The rseq caches' slow paths: refilling and spilling this CPU's cache
// through the sequences, stopping and draining another CPU's, and the
// process-wide switch. The sequences and their correctness argument are in
// rseq.h; the locked caches, used where this is off, in cpu_cache.cc.
#include "bufpool/internal/rseq.h"

#include <sys/auxv.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <thread>

#include "os/thread.h"
#include "pool/pool_internal.h"

namespace bufpool {

namespace {

uint32_t* Header(const PoolAccess::SharedState& s, uint32_t i) {
  return reinterpret_cast<uint32_t*>(s.rseq_base +
                                     i * internal::rseq::kCacheStride);
}

uint32_t* Slots(const PoolAccess::SharedState& s, uint32_t i) {
  return Header(s, i) + internal::rseq::kSlotsOffset / sizeof(uint32_t);
}

uint32_t PopHere(const PoolAccess::SharedState& s) {
  return internal::rseq::Pop(s.rseq_base, s.ncaches, s.rseq_index);
}

// The count of the cache this thread's index names now (a hint: the index
// may change at the next preemption); 0 past the caches.
uint32_t CountHere(const PoolAccess::SharedState& s) {
  const uint32_t i = internal::rseq::CurrentIndex(s.rseq_index);
  return i < s.ncaches ? PoolAccess::CachedCount(s, i) : 0;
}

}  // namespace

#if BUFPOOL_HAVE_RSEQ
// Whether BUFPOOL_RSEQ_INDEX asks for cpu_id; an unknown value is named on
// stderr once and ignored.
static bool ForcedCpuId() {
  const char* v = ::secure_getenv("BUFPOOL_RSEQ_INDEX");
  if (v == nullptr || *v == '\0' || std::strcmp(v, "mm_cid") == 0) {
    return false;
  }
  if (std::strcmp(v, "cpu_id") == 0) return true;
  std::fprintf(stderr,
               "bufpool: BUFPOOL_RSEQ_INDEX=%s is neither cpu_id nor mm_cid; "
               "ignored\n",
               v);
  return false;
}
#endif

uint64_t PoolAccess::RseqIndexField() {
#if BUFPOOL_HAVE_RSEQ
  static const uint64_t field = []() -> uint64_t {
    // glibc registers an area of at least 20 bytes for every thread unless
    // told not to (GLIBC_TUNABLES=glibc.pthread.rseq=0: size 0).
    if (__rseq_size < 20) return 0;
    const auto* area = reinterpret_cast<const struct rseq*>(
        static_cast<char*>(__builtin_thread_pointer()) + __rseq_offset);
    if (static_cast<int32_t>(area->cpu_id) < 0) return 0;
    if (!os::RegisterRseqFence()) return 0;
    // The kernel writes mm_cid into every registered area once its feature
    // size covers the field: the registration is at least the original 32
    // bytes (glibc reserves them; __rseq_size may say 20, the fields glibc
    // itself uses), and the kernel rejects shorter ones.
    const bool cid = ::getauxval(internal::rseq::kAtRseqFeatureSize) >=
                     internal::rseq::kMmCidFeatureSize;
    return cid && !ForcedCpuId() ? internal::rseq::kMmCidField
                                 : internal::rseq::kCpuIdField;
  }();
  return field;
#else
  return 0;
#endif
}

uint32_t PoolAccess::CachedCount(const SharedState& s, uint32_t i) {
  if (!s.rseq) return s.caches[i].count.load(std::memory_order_relaxed);
  return std::atomic_ref<uint32_t>(*Header(s, i))
             .load(std::memory_order_relaxed) &
         ~internal::rseq::kStopped;
}

void PoolAccess::ParkInCache(BufferPool& p, CpuCache& c, uint32_t* slots,
                             uint32_t n, uint32_t* reshelved) {
  SharedState& s = S(p);
  uint32_t done = 0;
  while (done < n) {
    const uint32_t k =
        internal::rseq::PushBatch(s.rseq_base, s.ncaches, s.rseq_index,
                                  &p.release_limit_, slots + done, n - done);
    if (k == 0) break;
    done += k;
  }
  if (done < n) {
    const uint32_t back = n - done;
    s.depot.Push(slots + done, back, &c.spare);
    Pushed(p, back, 0);
    *reshelved += back;
  }
}

uint32_t PoolAccess::RseqLend(BufferPool& p) {
  SharedState& s = S(p);
  const uint32_t want = p.lend_;
  Lent(p, want);  // before the floor falls (accounting.cc, invariant 1)
  const uint32_t got =
      internal::rseq::Lend(s.rseq_base, s.ncaches, s.rseq_index, want);
  if (got < want) Returned(p, want - got);
  return got;
}

uint32_t PoolAccess::RseqLendPop(BufferPool& p) {
  SharedState& s = S(p);
  const uint32_t want = p.lend_;
  Lent(p, want);  // before the floor falls (accounting.cc, invariant 1)
  uint32_t fell;
  const uint32_t slot = internal::rseq::LendPop(s.rseq_base, s.ncaches,
                                                s.rseq_index, want, &fell);
  if (fell < want) Returned(p, want - fell);
  return slot;
}

uint32_t PoolAccess::RseqReclaim(BufferPool& p) {
  SharedState& s = S(p);
  const uint32_t got =
      internal::rseq::Reclaim(s.rseq_base, s.ncaches, s.rseq_index);
  if (got != 0) Returned(p, got);  // after the floor rose
  return got;
}

uint32_t PoolAccess::RseqTake(BufferPool& p, uint32_t* reshelved) {
  const uint32_t slot = PopHere(S(p));
  if (slot != internal::rseq::kNoSlot) return slot;
  return RseqTakeMissed(p, reshelved);
}

uint32_t PoolAccess::RseqTakeMissed(BufferPool& p, uint32_t* reshelved) {
  SharedState& s = S(p);
  uint32_t slot;
  // The cache lends nothing (or nothing is left): when it holds slots (a
  // hint read; an empty one would lend nothing), it lends its allowance and
  // hands out its top slot in one section.
  if (CountHere(s) != 0) {
    slot = RseqLendPop(p);
    if (slot != internal::rseq::kNoSlot) return slot;
  }
  // A refill of one: under this CPU's lock, the slot the caller gets and
  // the rest of the batch parked in the cache, under its floor; then it
  // lends, so that the next pops hit.
  uint32_t out;
  bool lent = false;
  if (RseqTakeBulk(p, &out, 1, reshelved, &lent) != 1) {
    return BufferPool::kNoSlot;
  }
  if (!lent && CountHere(s) != 0) RseqLend(p);
  return out;
}

uint32_t PoolAccess::RseqTakeChunk(BufferPool& p, uint32_t* out, uint32_t max,
                                   uint32_t* reshelved) {
  SharedState& s = S(p);
  const uint32_t here =
      internal::rseq::PopBatch(s.rseq_base, s.ncaches, s.rseq_index, out, max);
  if (here != 0) Lent(p, here);  // from under the floor: held now
  // PopBatch wrote the cache's top last; it goes out first, as the locked
  // caches hand theirs out, so a fresh pool hands out ascending slots,
  // which callers coalesce. The depot's follow in the depot's order.
  std::reverse(out, out + here);
  uint32_t n = here;
  if (n < max) n += RseqTakeBulk(p, out + n, max - n, reshelved);
  if (n < max) {
    // This CPU's cache and the depot ran dry: one slot from the drain,
    // which moves the rest of the cache it empties to the depot, where
    // the caller's next chunk finds it.
    const uint32_t slot = TakeAnywhere(p, /*lock_all=*/false, reshelved);
    if (slot != BufferPool::kNoSlot) out[n++] = slot;
  }
  return n;
}

uint32_t PoolAccess::RseqTakeBulk(BufferPool& p, uint32_t* out, uint32_t max,
                                  uint32_t* reshelved, bool* lent) {
  SharedState& s = S(p);
  uint32_t n = 0;
  // Whole magazines straight to the caller: no cache in between.
  const uint32_t batch = s.depot.batch();
  if (batch != 0 && max >= batch) {
    const uint32_t whole = max / batch * batch;
    n = s.depot.Pop(out, whole, nullptr, reshelved);
    if (n != 0) Popped(p, n, 0, /*handed=*/n);
    if (n < whole) return n;  // the depot is empty
    if (n == max) return n;
  }
  // Less than a magazine is left: refill this CPU's cache with one batch
  // and hand the caller its part of it (RseqTake's refill, max 1).
  CpuCache& c = ThisCpu(p);
  uint32_t rest = max - n;
  // A drainer holds this cache (or another thread that shares the index
  // refills or spills it): the depot alone, without waiting for the lock
  // (drain.cc, "No thread waits for a drainer").
  std::unique_lock<std::mutex> lock(c.mu, std::try_to_lock);
  if (!lock.owns_lock()) {
    if (const PassBy pass(s.passing, s.forking); pass.ok()) {
      const uint32_t k = s.depot.Pop(out + n, rest, nullptr, reshelved);
      if (k != 0) Popped(p, k, 0, /*handed=*/k);
      return n + k;
    }
    lock.lock();  // a fork() holds it
  }
  const uint32_t here =  // refilled while we waited for the lock?
      internal::rseq::PopBatch(s.rseq_base, s.ncaches, s.rseq_index, out + n,
                               rest);
  if (here != 0) Lent(p, here);  // from under the floor: held now
  n += here;
  rest -= here;
  if (rest == 0) return n;
  uint32_t got[internal::kMaxCacheSlots];
  // While someone waits, take no more than the call hands out, so that
  // nothing is parked here that a waiter needs.
  const uint32_t want = Waiting(p) ? rest : std::max(rest, RefillBatch(p));
  const uint32_t k = s.depot.Pop(got, want, &c.spare, reshelved);
  if (k == 0) return n;
  const uint32_t handed = std::min(k, rest);
  // RseqTake's refill: the cache lends its allowance of what is parked, and
  // that rise is added with the handed slots' (before either can reach a
  // user: accounting.cc, invariant 1); what the Lend did not grant is given
  // back after it.
  const uint32_t lend = lent != nullptr && k > handed ? p.lend_ : 0;
  Popped(p, k, 0, handed + lend);
  std::copy(got, got + handed, out + n);
  n += handed;
  if (k > handed) {
    std::reverse(got + handed, got + k);  // got[handed] on top
    ParkInCache(p, c, got + handed, k - handed, reshelved);
  }
  if (lend != 0) {
    const uint32_t fell =
        internal::rseq::Lend(s.rseq_base, s.ncaches, s.rseq_index, lend);
    if (fell < lend) Returned(p, lend - fell);
    *lent = true;
  }
  return n;
}

uint32_t PoolAccess::RseqGive(BufferPool& p, uint32_t slot) {
  SharedState& s = S(p);
  auto push = [&](uint32_t x) {
    return internal::rseq::Push(s.rseq_base, s.ncaches, s.rseq_index,
                                &p.release_limit_, p.lend_, x);
  };
  // The caller's push failed: the cache lends its allowance already (or is
  // full, stopped, or someone waits). With room, it lends nothing more until
  // a pop needs it, and the push goes on: one section for both, the fall
  // subtracted after it (accounting.cc).
  uint32_t rose;
  const bool pushed = internal::rseq::ReclaimPush(
      s.rseq_base, s.ncaches, s.rseq_index, &p.release_limit_, slot, &rose);
  if (rose != 0) Returned(p, rose);
  if (pushed) return 0;
  CpuCache& c = ThisCpu(p);
  // Busy (a drainer, or a slow path of another thread on this index): the
  // slot goes to the depot, and the caller wakes whoever waits.
  std::unique_lock<std::mutex> lock(c.mu, std::try_to_lock);
  if (!lock.owns_lock()) {
    if (const PassBy pass(s.passing, s.forking); pass.ok()) {
      return RseqGiveBulk(p, &slot, 1);
    }
    lock.lock();  // a fork() holds it
  }
  uint32_t out[internal::kMaxCacheSlots + 1];
  uint32_t k = 0;
  if (!Waiting(p)) {
    if (push(slot)) return 0;  // a drain made room meanwhile
    // Full: half of it goes to the depot as one batch, taken from under the
    // floor (all of it, once reclaimed) in one section (a second only when
    // a migration interrupts).
    RseqReclaim(p);
    const uint32_t batch = RefillBatch(p);
    while (k < batch) {
      const uint32_t m = internal::rseq::PopBatch(
          s.rseq_base, s.ncaches, s.rseq_index, out + k, batch - k);
      if (m == 0) break;
      k += m;
    }
    if (push(slot)) slot = internal::rseq::kNoSlot;
  }
  const uint32_t returned = slot != internal::rseq::kNoSlot ? 1 : 0;
  if (returned != 0) out[k++] = slot;
  if (k != 0) {
    s.depot.Push(out, k, &c.spare);
    Pushed(p, k, returned);
  }
  return k;
}

uint32_t PoolAccess::RseqGiveBulk(BufferPool& p, const uint32_t* slots,
                                  uint32_t n) {
  // The cache is full (or was, on the CPU the caller's section ran on),
  // stopped by a drainer, or someone waits: the depot, where a waiter or
  // any CPU finds them. No cache's spare is used, so no cache lock either.
  S(p).depot.Push(slots, n, nullptr);
  Pushed(p, n, /*returned=*/n);  // users' slots
  return n;
}

namespace {

// Sets kStopped on cache i's count (seq_cst OR: ordered before the fence's
// barrier that follows it).
void SetStopped(const PoolAccess::SharedState& s, uint32_t i) {
  std::atomic_ref<uint32_t>(*Header(s, i))
      .fetch_or(internal::rseq::kStopped, std::memory_order_seq_cst);
}

// After a fence that followed SetStopped(s, i): whether the stop survived
// it (no section committed after the OR; rseq.h). Acquire: sees every store
// of a section that committed before the fence.
bool StopHeld(const PoolAccess::SharedState& s, uint32_t i) {
  return (std::atomic_ref<uint32_t>(*Header(s, i))
              .load(std::memory_order_acquire) &
          internal::rseq::kStopped) != 0;
}

// Stop, fence, and repeat until the stop survives a fence (rseq.h). cpu_id:
// the one CPU whose sections can touch cache i; mm_cid: every CPU, since
// the thread with index i may run anywhere.
void StopCache(const PoolAccess::SharedState& s, uint32_t i) {
  const int cpu =
      s.rseq_index == internal::rseq::kMmCidField ? -1 : static_cast<int>(i);
  do {
    SetStopped(s, i);
    if (PoolAccess::after_stop_for_test != nullptr) [[unlikely]] {
      PoolAccess::after_stop_for_test(i);
    }
    os::RseqFence(cpu);
  } while (!StopHeld(s, i));
}

}  // namespace

uint32_t PoolAccess::TakeStopped(BufferPool& p, uint32_t i, bool take_one,
                                 uint32_t* moved) {
  SharedState& s = S(p);
  std::atomic_ref<uint32_t> count(*Header(s, i));
  const uint32_t n0 =
      count.load(std::memory_order_relaxed) & ~internal::rseq::kStopped;
  if (n0 > p.cache_capacity_) [[unlikely]] {
    DieCorrupt(p, "CPU cache over capacity", n0);
  }
  std::atomic_ref<uint32_t> floor(*(Header(s, i) + 1));
  const uint32_t f0 = floor.load(std::memory_order_relaxed);
  if (f0 > n0) [[unlikely]] {
    DieCorrupt(p, "CPU cache floor over its count", f0);
  }
  uint32_t n = n0;
  uint32_t taken[internal::kMaxCacheSlots];
  std::copy(Slots(s, i), Slots(s, i) + n, taken);
  // Restart empty (release: the copy above is done before any section may
  // write the slots again); the count falls before the depot's size rises.
  // The floor first: no section runs while the stop holds.
  floor.store(0, std::memory_order_relaxed);
  count.store(0, std::memory_order_release);
  uint32_t slot = BufferPool::kNoSlot;
  if (take_one && n != 0) {
    slot = taken[--n];
    Lent(p, 1);  // the caller's, before it has it
  }
  // What the cache lent is lent no more (accounting.cc).
  if (n0 != f0) Returned(p, n0 - f0);
  if (n != 0) {
    s.depot.Push(taken, n, &s.caches[i].spare);
    Pushed(p, n, 0);
    *moved += n;
  }
  return slot;
}

uint32_t PoolAccess::RseqDrain(BufferPool& p, uint32_t i, bool take_one,
                               uint32_t* moved) {
  StopCache(S(p), i);
  return TakeStopped(p, i, take_one, moved);
}

uint32_t PoolAccess::RseqDrainAll(BufferPool& p, bool take_one, uint32_t* moved,
                                  bool* busy_left) {
  SharedState& s = S(p);
  // Try-lock and stop every cache that holds slots, then one fence of every CPU
  // for all of them: with mm_cid, each cache's own fence would reach every CPU
  // anyway. A cache whose lock is busy is skipped and tried again after a
  // yield, kBusyRounds times at most; its holder is another drainer (which
  // empties it into the depot and wakes) or a thread's own slow path (which
  // reads the waiter count under that lock; drain.cc, "No thread waits for a
  // drainer"). Only try-locks are taken while holding several, so no one waits
  // for them: threads whose caches are held here go to the depot.
  uint64_t pending[kMaxCaches / 64] = {};  // ncaches <= kMaxCaches (clamped)
  for (uint32_t i = 0; i < s.ncaches; ++i) {
    pending[i / 64] |= uint64_t{1} << (i % 64);
  }
  bool left = false;
  uint32_t slot = BufferPool::kNoSlot;
  for (uint32_t round = 0;; ++round) {
    uint64_t stopped[kMaxCaches / 64] = {};
    bool any = false;
    left = false;
    for (uint32_t i = 0; i < s.ncaches; ++i) {
      if ((pending[i / 64] >> (i % 64) & 1) == 0) continue;
      if (CachedCount(s, i) == 0) {
        pending[i / 64] &= ~(uint64_t{1} << (i % 64));
        continue;
      }
      if (!s.caches[i].mu.try_lock()) {
        left = true;
        continue;
      }
      pending[i / 64] &= ~(uint64_t{1} << (i % 64));
      SetStopped(s, i);
      if (after_stop_for_test != nullptr) [[unlikely]]
        after_stop_for_test(i);
      stopped[i / 64] |= uint64_t{1} << (i % 64);
      any = true;
    }
    if (any) {
      os::RseqFence(-1);
      for (uint32_t i = 0; i < s.ncaches; ++i) {
        if ((stopped[i / 64] >> (i % 64) & 1) == 0) continue;
        // A section that read the count before the OR and committed after
        // it cleared the bit: this cache alone goes round again.
        if (!StopHeld(s, i)) StopCache(s, i);
        const uint32_t got =
            TakeStopped(p, i, take_one && slot == BufferPool::kNoSlot, moved);
        if (got != BufferPool::kNoSlot) slot = got;
        s.caches[i].mu.unlock();
      }
    }
    if (!left || round == kBusyRounds) break;
    std::this_thread::yield();
  }
  if (busy_left != nullptr) *busy_left = left;
  return slot;
}

}  // namespace bufpool

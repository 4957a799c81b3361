// The per-CPU caches: which cache a call uses, and the moves between a cache
// and the depot. Draining other CPUs' caches is in drain.cc; the
// accounting that every move reports to is in accounting.cc.
//
// Each pool keeps one CpuCache per CPU the system may run
// (sysconf(_SC_NPROCESSORS_CONF)); a call uses the cache of the CPU that
// sched_getcpu() names (os::CurrentCpu(); glibc answers it from the rseq
// area, or the vDSO: no system call), or named a few calls ago (the locked
// caches: LockedCpu below). A cache holds at most cache_capacity()
// free slots, so what all caches park is at most cache_capacity() x CPUs,
// whatever the number of threads: a thread owns nothing, and its exit leaves
// nothing behind.
//
// Why the locks suffice (the locked caches, used where rseq is off; the
// rseq caches' argument, the sequences and the stop/fence drain, is in
// bufpool/internal/rseq.h, their slow paths in rseq.cc). Every read or write of
// a cache's slots, spare and counts (but the relaxed reads below) happens with
// its `mu` held: by the thread that runs on that CPU, by one that ran there a
// moment ago and migrated (sched_getcpu()'s answer may be stale by the time the
// lock is taken; that costs locality only), or by a drainer on another CPU. So
// a cache is a plain sequential stack guarded by a mutex, and:
//   * No slot is handed out twice: a slot leaves a cache only by a pop under
//     its lock, and leaves the depot only by a successful CAS (depot.h).
//     Whatever the holder of a lock does while it holds it (preempted,
//     interrupted by a signal whose handler sleeps, stopped, faulted), no
//     other thread acts on a stale picture: one that wants the cache finds
//     the lock busy and goes to the depot instead (drain.cc, "No thread
//     waits for a drainer").
//   * No free slot is stranded: a drainer try-locks each cache in turn
//     (O(CPUs)) and empties it; no cache belongs to a thread, so no thread's
//     state can keep its contents out of reach. A holder that never returns
//     (a thread stopped for good inside a call) keeps only the slots in the
//     caches it holds (one, but for the mm_cid drain of every cache), and
//     no other thread waits for it.
//   * The relaxed reads of `count` without the lock (Stats(), and the
//     exhausted-pool check in drain.cc) are statistics or hints: a drain
//     that matters to a sleeper locks every cache (drain.cc, "Sleeping").
// Memory ordering: the mutex orders everything inside the sections; a slot
// that moves to the depot is published by the depot's seq_cst CASes. The
// counts are atomics only so that the lock-free reads are not data races.
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "bufpool/internal/rseq.h"
#include "os/memory.h"
#include "os/thread.h"
#include "pool/pool_internal.h"

namespace bufpool {

uint32_t PoolAccess::CpuCount() {
  static const uint32_t count = [] {
    const long n = ::sysconf(_SC_NPROCESSORS_CONF);
    return static_cast<uint32_t>(std::clamp<long>(n, 1, kMaxCaches));
  }();
  return count;
}

void RseqAreaUnmap::operator()(char* p) const { os::Unmap(p, bytes); }

BufferPool::Shared::Shared(Arena a, uint32_t capacity, uint32_t batch,
                           uint32_t n, uint32_t cache_capacity)
    : arena(std::move(a)),
      depot(capacity, batch),
      ncaches(cache_capacity == 0 ? 0 : n) {}

absl::Status PoolAccess::InitCaches(SharedState& s, uint32_t cache_capacity) {
  const uint32_t ncaches = s.ncaches;
  if (ncaches == 0) return absl::OkStatus();
  s.caches.reset(new CpuCache[ncaches]);
  s.rseq_index = RseqIndexField();
  s.rseq = s.rseq_index != 0;
  if (s.rseq) {
    // The header's line, then the slots, per index (rseq.h); zero: empty.
    // A cache in use writes one page, or two where its slots cross a page
    // boundary. The caches start `skew` bytes into a page, and pools made one
    // after another at different skews: at a page's start every header would
    // share its L1 set with the first line of every buffer (page-aligned),
    // the line a user touches first, and at one skew the headers of pools
    // used in turn would alias in their low 12 address bits, which the
    // CPU's store-to-load forwarding checks first.
    static std::atomic<uint32_t> pools_made{0};
    const size_t skew =
        64 * (16 + pools_made.fetch_add(1, std::memory_order_relaxed) * 5 % 47);
    static_assert(internal::rseq::kSlotsOffset + internal::kMaxCacheSlots * 4 <=
                  internal::rseq::kCacheStride);
    // skew < kCacheStride: one page more holds the last cache.
    const size_t bytes = internal::rseq::kCacheStride * (ncaches + 1);
    absl::StatusOr<void*> area = os::MapAnonymous(bytes, /*hugetlb=*/false);
    if (!area.ok()) {
      return absl::Status(
          area.status().code(),
          absl::StrCat("the per-CPU caches' area: ", area.status().message()));
    }
    s.rseq_area = std::unique_ptr<char, RseqAreaUnmap>(
        static_cast<char*>(*area), RseqAreaUnmap{bytes});
    // Small pages: one write must not bring in 2 MiB (THP "always"). Advice
    // only: where it fails (THP compiled out) there are no huge pages.
    (void)os::AdviseNoHugePages(*area, bytes);
    s.rseq_base = s.rseq_area.get() + skew;
    return absl::OkStatus();
  }
  // One entry more than the capacity, for the slot being released when a
  // waiter makes the whole cache go (PushLocked); rounded to a cache line.
  const size_t stride = (size_t{cache_capacity} + 1 + 15) / 16 * 16;
  s.cache_slots.reset(new uint32_t[stride * ncaches]);
  for (uint32_t i = 0; i < ncaches; ++i) {
    s.caches[i].slots = &s.cache_slots[stride * i];
  }
  return absl::OkStatus();
}

namespace {

// The locked caches' index for this thread. sched_getcpu (the vDSO's
// getcpu) costs as much as the rest of an acquire and release together in
// a VM, so a thread reads it again only every kCpuRecheck calls. A stale
// index costs locality, never correctness: each cache has its own lock,
// and any thread may use any cache.
constexpr uint32_t kCpuRecheck = 32;
struct ThreadCpu {
  int cpu = -1;
  uint32_t left = 0;
};
thread_local ThreadCpu t_cpu;

int LockedCpu() {
  ThreadCpu& t = t_cpu;
  if (t.left == 0) {
    t.cpu = os::CurrentCpu();
    t.left = kCpuRecheck;
  }
  --t.left;
  return t.cpu;
}

}  // namespace

CpuCache& PoolAccess::ThisCpu(BufferPool& p) {
  BufferPool::Shared& s = S(p);
  // rseq mode: the index the sequences use (cpu_id or mm_cid), so that the
  // slow path locks the cache it works on; a plain read of the thread's own
  // area, no system call.
  const int cpu =
      s.rseq ? static_cast<int>(internal::rseq::CurrentIndex(s.rseq_index))
             : LockedCpu();
  auto i = static_cast<uint32_t>(cpu < 0 ? 0 : cpu);
  if (i >= s.ncaches) i %= s.ncaches;  // CPUs numbered past the count
  return s.caches[i];
}

uint32_t PoolAccess::Refill(BufferPool& p, CpuCache& c, uint32_t max,
                            uint32_t* reshelved) {
  const uint32_t n = S(p).depot.Pop(c.slots, max, &c.spare, reshelved);
  if (n == 0) return 0;
  Popped(p, n, 0, /*handed=*/0);
  // Pop wrote the shared top first; the cache's top is its last entry.
  std::reverse(c.slots, c.slots + n);
  // Under the floor: the refill lends nothing by itself (accounting.cc).
  c.floor = n;
  c.count.store(n, std::memory_order_relaxed);
  return n;
}

uint32_t PoolAccess::Evict(BufferPool& p, CpuCache& c) {
  const uint32_t n = c.count.load(std::memory_order_relaxed);
  if (n == 0) return 0;
  const uint32_t lent = n - c.floor;
  // The count falls before the depot's size rises (accounting.cc); what c
  // lent is taken back after.
  c.count.store(0, std::memory_order_relaxed);
  c.floor = 0;
  S(p).depot.Push(c.slots, n, &c.spare);
  Pushed(p, n, lent);
  return n;
}

uint32_t PoolAccess::PopLocked(BufferPool& p, CpuCache& c, uint32_t* reshelved,
                               bool lend_ahead) {
  uint32_t n = c.count.load(std::memory_order_relaxed);
  if (n == 0) {
    // While someone waits, take one at a time, so that a refill never parks
    // buffers here that a waiter needs.
    n = Refill(p, c, Waiting(p) ? 1 : RefillBatch(p), reshelved);
    if (n == 0) return BufferPool::kNoSlot;
  }
  if (n <= c.floor) {  // c lends nothing: account before the slot goes out
    const uint32_t floor = lend_ahead ? (n > p.lend_ ? n - p.lend_ : 0) : n - 1;
    Lent(p, c.floor - floor);
    c.floor = floor;
  }
  --n;
  const uint32_t slot = c.slots[n];
  c.count.store(n, std::memory_order_relaxed);
  return slot;
}

uint32_t PoolAccess::PushLocked(BufferPool& p, CpuCache& c, uint32_t slot) {
  const uint32_t n = c.count.load(std::memory_order_relaxed);
  const auto cap = static_cast<uint32_t>(p.cache_capacity_);
  if (n > cap || c.floor > n) [[unlikely]] {
    DieCorrupt(p, "CPU cache over capacity, or its floor over its count", n);
  }
  // Under c.mu, a relaxed load suffices: a waiter raises its count before it
  // takes this lock to drain (drain.cc, "Sleeping"), so a release whose
  // section follows the drainer's sees the raise, and one that precedes it
  // left its slot where the drainer looks.
  if (Waiting(p)) {
    c.slots[n] = slot;  // the spare entry (see Shared::Shared); lent now
    c.count.store(n + 1, std::memory_order_relaxed);
    return Evict(p, c);
  }
  // Lending its allowance already (or about to spill): c lends nothing more
  // until a pop needs it (accounting.cc).
  if (n - c.floor >= p.lend_ || n == cap) {
    const uint32_t lent = n - c.floor;
    c.floor = n;
    Returned(p, lent);
  }
  if (n < cap) {
    c.slots[n] = slot;
    c.count.store(n + 1, std::memory_order_relaxed);
    return 0;
  }
  // Full: the oldest half goes to the depot as one batch (a magazine, see
  // depot.h), from under the floor; the released slot stays, lent.
  const uint32_t batch = RefillBatch(p);
  c.count.store(n - batch, std::memory_order_relaxed);
  c.floor = n - batch;
  S(p).depot.Push(c.slots, batch, &c.spare);
  Pushed(p, batch, 0);
  std::memmove(c.slots, c.slots + batch, (n - batch) * sizeof(uint32_t));
  c.slots[n - batch] = slot;
  c.count.store(n - batch + 1, std::memory_order_relaxed);
  return batch;
}

uint32_t PoolAccess::PushManyLocked(BufferPool& p, CpuCache& c,
                                    const uint32_t* slots, uint32_t n) {
  if (Waiting(p)) {                     // as in PushLocked
    const uint32_t mine = Evict(p, c);  // takes back what c lent
    S(p).depot.Push(slots, n, nullptr);
    Pushed(p, n, n);
    return mine + n;
  }
  const uint32_t have = c.count.load(std::memory_order_relaxed);
  const auto cap = static_cast<uint32_t>(p.cache_capacity_);
  const uint32_t keep = std::min(n, have < cap ? cap - have : 0);
  std::memcpy(c.slots + have, slots, keep * sizeof(uint32_t));
  // Count and floor rise together: the kept slots are not lent.
  c.floor += keep;
  c.count.store(have + keep, std::memory_order_relaxed);
  if (keep != 0) Returned(p, keep);
  if (keep == n) return 0;
  S(p).depot.Push(slots + keep, n - keep, &c.spare);
  Pushed(p, n - keep, n - keep);
  return n - keep;
}

}  // namespace bufpool

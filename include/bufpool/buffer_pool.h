// libbufpool: a pool of fixed-size, page-aligned buffers.
//
// A BufferPool maps one page-aligned region (the arena) once, slices it into
// `buffer_count` buffers of `buffer_size` bytes, and hands them out from a
// lock-free depot of free buffers fronted by small per-CPU caches. Buffer `i`
// lives at
//
//   region().data() + i * buffer_size
//
//   region(): +----------+----------+----------+-- ... --+----------+
//             | slot 0   | slot 1   | slot 2   |         | slot n-1 |
//             +----------+----------+----------+-- ... --+----------+
//
// and what the pool keeps about a buffer lives outside it, so the whole
// region can be registered once with the kernel (io_uring fixed buffers,
// provided-buffer rings, RDMA) and a user may overwrite every byte.
//
// Ownership. The pool owns the memory. `Buffer` is a move-only handle that
// owns one buffer and returns it when destroyed (like std::unique_ptr).
// TryAcquireRaw()/ReleaseRaw() (and the *RawBulk() calls) are the same
// operations without the handle; a raw pointer must come back exactly once,
// through ReleaseRaw(), ReleaseRawBulk() or Adopt(). Every Buffer and raw
// pointer must be returned before the pool is destroyed.
//
// Thread safety. Every BufferPool method may be called from any number of
// threads at once. A buffer may be released on a different thread than the
// one that acquired it. A single Buffer handle is not shared between threads
// (like std::unique_ptr): hand it over with std::move through your own
// synchronisation. A thread may use any number of pools, in any order. Do
// not call into a pool from a signal handler that may interrupt a call into
// the same pool (the calls are not async-signal-safe). A handler that
// interrupts a pool call and then sleeps or blocks loses no buffer, hands
// none out twice and makes no other thread wait: the caches the call holds
// (its own in a refill or spill, those a drain took) are passed by, and
// the buffers in them stay out of reach until the handler returns
// (src/pool/drain.cc, "No thread waits for a drainer"); a trim or growth
// it interrupts keeps only what it has in transit out of reach, and other
// calls take the trim's free buffers or grow past it
// (src/pool/growth.cc, "Nobody waits").
//
// Per-CPU caches. Each pool keeps up to `cache_capacity()` free buffers per
// CPU in a small cache, so the common acquire/release touches memory of the
// CPU it runs on only. What a caller can observe:
//   * TryAcquire() returns an empty handle only when no buffer was free
//     anywhere when the call began: every release that happened before the
//     call is seen (one concurrent with it may be ordered after it; see
//     src/pool/drain.cc), but for buffers in a cache that another call
//     holds throughout (a drain moving them, or the cache's own thread),
//     and for those a trim or growth has in transit: chunks being given
//     back or populated, and up to 256 slots a trim has taken from the
//     depot and not yet made visible to other calls. Those it has made
//     visible, the others take while it works.
//     Before it gives up it takes buffers from every CPU's cache. An
//     exhausted pool answers without taking a lock.
//   * Acquire(timeout) sleeps only while every buffer is in use, and a
//     release on any thread wakes it. Nothing the threads that released
//     buffers do afterwards (run, block, sleep, stop, exit) can keep a free
//     buffer from it.
//   * Free buffers parked in caches are at most cache_capacity() x CPUs in
//     total (Stats().cached), whatever the number of threads.
//   * Plugins: a shared object that calls the inline API (TryAcquire(),
//     a handle's release) may be dlclose()d while threads that ran its code
//     live on; nothing to do before unloading. Its buffers and pools must be
//     gone first, as always (x86-64; on AArch64 a thread's rseq area may
//     still name the plugin's sequence until the thread's next pool call).
//   * fork(): the child can use every pool; each buffer that no thread held
//     at the fork is free in the child. A bulk call on another thread is
//     all before or all after the fork (fork() waits for it to finish).
//     Do not call fork() from a signal handler that may have interrupted a
//     call into any pool, in any mode, nor make pool calls from a
//     pthread_atfork handler: fork()'s prepare handler takes every pool's
//     locks (the bulk calls' gate, the wait lock, every cache's lock), and
//     the interrupted call may hold one of them (a bulk call, a sleeping
//     Acquire(), NotifyWhenFree(), FlushCaches(), and with the locked caches
//     any acquire or release that reaches its cache; with rseq a refill,
//     spill or drain), so fork() would wait for it for ever. (glibc's own
//     fork() resets malloc's locks in the child instead of waiting; a pool
//     cannot, because the interrupted call's cache would be half moved.) A
//     handler that forks is fine while no pool call is in flight on its
//     thread, e.g. when the signal is blocked around the pool calls.
//   * FlushCaches() moves every CPU's cached buffers to the depot.
//   cache_capacity() is min(cache_size, capacity() / 8); set cache_size = 0
//   to turn the caches off. per_cpu_mode() says how the caches are guarded:
//   restartable sequences on glibc's rseq area (x86-64; no lock on the
//   hit; a cache per rseq concurrency id, mm_cid, where the kernel has it,
//   6.3+, else per CPU number; BUFPOOL_RSEQ_INDEX=cpu_id in the
//   environment forces CPU numbers), or one lock per CPU where rseq is
//   unavailable (GLIBC_TUNABLES=glibc.pthread.rseq=0, sanitizer builds). Both
//   keep the promises above.
//
// Safety. A Buffer handle cannot be released twice: it is move-only, and a
// moved-from or Reset() handle is empty. Raw pointers have no such guard, so
// the raw calls check at run time, in release builds too (O(1)): ReleaseRaw(),
// ReleaseRawBulk() and Adopt() abort with "double release" unless the pointer
// is out as a raw pointer (which also catches releasing a buffer that a live
// handle owns, ReleaseRaw(b.data())); a pointer that is not the start of one
// of this pool's buffers aborts with "not from this pool"; destroying the
// pool while buffers are out aborts with "still in use". Under
// AddressSanitizer free buffers are poisoned. What the O(1) check cannot see:
// a pointer released, handed out again as a raw pointer, and then released by
// its old owner looks legitimate; and two threads releasing the same pointer
// at the same instant may race past it.
//
// Elastic pools. With PoolOptions::max_buffer_count, Create() reserves the
// whole ceiling as one region (address space only: MAP_NORESERVE) and backs
// buffer_count buffers; capacity() and region() are the ceiling's. When an
// acquire finds no buffer free anywhere (the depot and every cache empty),
// it backs the next step of buffers (pre-faulted, mlocked with lock_memory)
// before it reports empty (TryAcquire*()) or sleeps (Acquire()). Growing
// and trimming never make another call wait: no acquire or release takes
// a lock that a grower or trimmer holds, and no system call of theirs runs
// under one. Concurrent growers each back their own step (more than one
// burst needed, at most a step per thread; Trim() takes the excess back).
// A thread stopped while it grows or trims (a signal handler that sleeps)
// keeps only what it has in transit out of reach. The hit path, the caches
// and the drain are those of a fixed pool. A step the system refuses is not
// fatal: the pool serves what it has (Grow() returns the refusal; Acquire()
// names it in its error; Stats().grow_failures counts it). Trim() gives free
// buffers' memory back; their slots go back to the reserve and are backed again
// by a later growth, so a buffer handed out is always backed. Memory grows and
// is trimmed in chunks: whole pages (2 MiB with huge pages) and whole buffers,
// at least 1/16384 of the region (the io_uring fixed-buffer table's limit,
// so that each chunk can be one registered buffer).
//
// Shared pools. With PoolOptions::shared, the region and the pool's shared
// state live in one memfd (no name in /dev/shm; sealed against shrinking
// and growing; gone when the last process that maps it exits): a header,
// a table of the processes joined, a ledger with one owner word per slot,
// and the shared depot of free slots. Other processes Join(shared_fd())
// it and use the same buffers, each at its own address (slots are by
// number: SlotData(i) in every process), each process with its own per-CPU
// caches and a depot of its own share: a slot is free in the shared depot,
// owned by one process (cached there, free in its depot, or out as a
// handle, raw pointer, chain or ring), or exported by one process to be
// imported by another (Export/Import). Whole batches move between the
// shared depot and a process on its slow paths only; the inline hit path
// is a private pool's. What a process owns but does not use is not
// visible to the others: its caches (cache_capacity() per cache) and a
// depot share of at most max(one batch, buffer_count / (4 x processes
// joined)), and never more than four batches, given back down to half of
// that by its own releases. So a process idle after a burst keeps at most
// that much; a process that never releases again never gives it back
// before it leaves or dies. (A batch: a cache's capacity, 16 without
// caches; at most buffer_count / 8 and 256.)
//   * Trust: joining needs the fd, which only its holders can pass on.
//     The processes that join are parts of one service and are trusted
//     with the shared state: a process that writes into the header or the
//     ledger can corrupt the pool for all of them.
//   * Death: a process may be killed at any instruction; nothing it held
//     is lost or owned twice. Each process holds an open-file-description
//     lock on its own byte of the memfd, which the kernel drops when it
//     dies; ReclaimDead() (any process; also run when the shared depot is
//     found empty) gives back all that a dead process held and bumps the
//     generations of the tokens it exported. Processes are named by pid and
//     start time in messages, so a reused pid is never taken for the dead.
//   * Kernel I/O after death: the liveness lock drops when the kernel
//     releases the process's file table, and what it frees may be reused at
//     once by another process, so no kernel I/O on a slot may outlive that.
//     Zero-copy sends would (TCP keeps the pages queued for retransmission
//     until acknowledged): HeldSend sends a shared pool's buffers with a
//     copying send even when Options::zero_copy asks otherwise. io_uring
//     work that runs on io-wq worker threads is safe: the workers share the
//     process's file table, which, with the lock, goes only after they
//     exit. Still the process's after death, so avoid it on a shared
//     pool's buffers: a read the kernel completes without a worker or the
//     task (an O_DIRECT or block-device read into a registered buffer,
//     written by the device when it completes) may land after the lock
//     dropped and before the ring's teardown waits for it.
//   * The shared depot's batch moves run under one process-shared robust
//     mutex: a process stopped (SIGSTOP, a debugger) while it holds it
//     delays the other processes' refills, spills and joins until it runs
//     again (their cache hits are unaffected); a process killed while it
//     holds it is repaired by the next locker (src/pool/shared_pool.cc).
//   * A release in one process of a slot another process owns is caught in
//     O(1) by the state byte (raw pointers, as in a private pool) and the
//     message names both processes.
//   * Acquire(timeout) in a shared pool is woken by releases in its own
//     process; releases in others are seen by polling every millisecond.
//   * fork(): a child of a process with a shared pool must Join() the pool
//     (the parent's shared_fd() is inherited) and must not use the
//     parent's BufferPool object, whose caches and buffers the parent owns:
//     the fork turns the child's copy's inline paths off, so every call on
//     it there aborts with a message that says to Join, and destroying it
//     there only unmaps it.
//   * A process must not close the pool's descriptors behind its back (a
//     closefrom() or a loop over /proc/self/fd): its liveness lock would
//     go, it would look dead, and what it holds would be reclaimed.
//   * Huge pages: the memfd's pages are what shmem gives (transparent huge
//     pages where /sys/kernel/mm/transparent_hugepage/shmem_enabled allows
//     them; huge_pages() reports false); kRequire is refused.
//   * Elastic pools (max_buffer_count) cannot be shared in this version.
//
// Destruction. Destroy a pool only after every call into it on other threads
// has returned, as with any object.
#ifndef BUFPOOL_BUFFER_POOL_H_
#define BUFPOOL_BUFFER_POOL_H_

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/attributes.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "bufpool/export.h"
#include "bufpool/holders.h"
#include "bufpool/internal/cpu_cache.h"
#include "bufpool/internal/rseq.h"
#include "bufpool/options.h"

namespace bufpool {

inline constexpr size_t kDefaultBufferSize = 4096;
// The most free buffers one CPU may cache per pool.
inline constexpr size_t kMaxCacheSize = internal::kMaxCacheSlots;

// The pragmas keep the implicit copy and move of PoolOptions quiet about the
// deprecated thread_cache_size (clang warns there otherwise); a use of that
// field in the caller's code still warns.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
struct PoolOptions {
  size_t buffer_size = kDefaultBufferSize;  // power of two, >= 64
  size_t buffer_count = 1024;               // >= 1, < 2^32 - 1
  HugePages huge_pages = HugePages::kTry;
  bool populate = true;           // fault every page in at Create()
  bool lock_memory = false;       // mlock the region (needs RLIMIT_MEMLOCK)
  bool scrub_on_release = false;  // zero a buffer before anyone else gets it
  size_t cache_size = 64;         // per-CPU cache, <= kMaxCacheSize
  // Deprecated, removed in 0.4: the 0.2 name of cache_size, kept so that
  // code written for 0.2 builds: when set (not kUseCacheSize) it is used
  // instead of cache_size.
  static constexpr size_t kUseCacheSize = ~size_t{0};
  ABSL_DEPRECATED("use cache_size")
  size_t thread_cache_size = kUseCacheSize;

  // ---- An elastic pool (see "Elastic pools" on BufferPool) ----
  // The ceiling. 0 (the default) keeps a fixed pool of buffer_count.
  // Otherwise buffer_count buffers are ready at Create() and the pool grows,
  // in steps of grow_step buffers, up to max_buffer_count when it would
  // otherwise report exhaustion. The whole range is reserved at Create() as
  // one contiguous region, so addresses never move and region() spans it.
  // >= buffer_count, < 2^32 - 1.
  size_t max_buffer_count = 0;
  // Buffers per growth step, >= 1; rounded up to whole chunks (a chunk is
  // a whole number of pages, of huge pages when the pool uses them, and of
  // buffers; see BufferPool::Grow()). The first step; each growth on
  // demand doubles the next, up to an eighth of the ceiling (a burst is
  // met with large steps, so growing costs about what committing the
  // memory costs, and backs at most as much again ahead of need); a
  // Trim() or idle trim that gives memory back brings it back to
  // grow_step. Grow() backs what it is asked for, at least grow_step.
  size_t grow_step = 512;
  // Trim free buffers the pool has not handed out for this long, checked on
  // the slow paths and by TrimIdle(). 0: only Trim() trims. Needs
  // max_buffer_count.
  absl::Duration trim_after_idle = absl::ZeroDuration();
  // Holder tracking (bufpool/holders.h, which says what each level costs):
  // who acquired each buffer that is out, for Holders(), HoldersReport()
  // and the report a pool destroyed with buffers out prints.
  // BUFPOOL_TRACK_HOLDERS=off|sampled|all in the environment overrides it.
  TrackHolders track_holders = TrackHolders::kOff;
  uint32_t holder_sample_every = 128;  // kSampled: 1 in this many, >= 1

  // ---- A pool shared by processes (see "Shared pools" on BufferPool) ----
  // The region and the pool's shared state (its depot, the per-slot
  // ownership ledger, the table of processes) in one sealed memfd that
  // other processes join with BufferPool::Join(shared_fd()). Fixed pools
  // only in this version: with max_buffer_count Create() refuses it.
  bool shared = false;
};
#pragma GCC diagnostic pop

// How the per-CPU caches are guarded (BufferPool::per_cpu_mode()).
enum class PerCpuMode {
  kOff,        // cache_size 0 (or a pool too small for caches): none
  kLocked,     // one lock per CPU's cache, the CPU from sched_getcpu()
  kRseq,       // restartable sequences on glibc's rseq area: no lock; a
               // cache per CPU (indexed by cpu_id)
  kRseqMmCid,  // the same, a cache per rseq concurrency id (mm_cid, Linux
               // 6.3+): dense under cpusets and CPU affinity
};

struct PoolStats {
  size_t capacity;    // buffer_count
  size_t in_use;      // held by users (buffers idle in caches are free)
  size_t high_water;  // never below the largest in_use; see Stats()
  // TryAcquire*() calls and zero-timeout Acquire() calls that got nothing,
  // and bulk calls that got fewer than asked.
  uint64_t acquire_failures;
  // Acquire() calls with a positive timeout that timed out.
  uint64_t acquire_timeouts;
  // Free buffers parked in the per-CPU caches: at most cache_capacity() x
  // CPUs; counted as free, not in in_use.
  size_t cached;
  // ---- Elastic pools (max_buffer_count); a fixed pool reports committed =
  // capacity and zero counts.
  size_t committed;  // buffers backed by memory now (<= capacity)
  uint64_t grows;    // growth steps taken
  uint64_t trims;    // Trim() calls (and idle trims) that gave back memory
  uint64_t grow_failures;  // steps the system refused (see BufferPool::Grow)
  // ---- Shared pools (PoolOptions::shared); a private pool reports 1 and 0.
  // capacity is the whole pool's; in_use, cached, committed and high_water
  // are this process's: committed is what it owns now (its caches, its
  // depot's share and what it holds), in_use what of that it holds.
  size_t processes;    // processes joined now, dead ones not yet reclaimed
  uint64_t reclaimed;  // buffers ReclaimDead() gave back, by any process
};

// Names one buffer of a shared pool and its generation, for handing the
// buffer to another process (BufferPool::Export / Import). Trivially
// copyable, 8 bytes: send it through any channel. value 0 names nothing.
struct BufferToken {
  uint64_t value = 0;
};

class BufferPool;
struct BudgetOptions;  // bufpool/budget.h
class BufferBudget;

namespace internal {
struct SharedAccess;  // bufpool/internal/shared_access.h (SharedBuffer)
}  // namespace internal

// A move-only owner of one buffer; returns it to its pool when destroyed.
// Not thread-safe by itself (like std::unique_ptr); may be moved to and
// destroyed on another thread.
class Buffer {
 public:
  Buffer() noexcept = default;  // empty
  Buffer(Buffer&& other) noexcept
      : pool_(std::exchange(other.pool_, nullptr)), slot_(other.slot_) {}
  Buffer& operator=(Buffer&& other) noexcept;  // releases what it held before
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  ABSL_ATTRIBUTE_ALWAYS_INLINE ~Buffer() { Reset(); }

  std::byte* data() const;
  size_t size() const;  // the pool's buffer_size; 0 when empty
  absl::Span<std::byte> span() const { return {data(), size()}; }
  // Slot number: data() == pool.region().data() + slot() * buffer_size.
  uint32_t slot() const { return slot_; }
  // Deprecated, removed in 0.4: the same as slot(), its name before 0.3.
  ABSL_DEPRECATED("use slot()")
  uint32_t index() const { return slot_; }
  explicit operator bool() const { return pool_ != nullptr; }
  BufferPool* pool() const { return pool_; }

  void Reset();  // return the buffer now; the handle becomes empty
  // Adds `label` (its first 31 bytes) to the buffer's holder record, which
  // keeps the last 4, oldest first (Holder::touches): mark where a buffer
  // went ("parsed", "queued for send") so that a leak report says how far
  // it got. Nothing when the handle is empty or its pool does not track
  // this buffer (kOff, or kSampled and not sampled): a load and a branch.
  void Touch(absl::string_view label) const;
  // Give up ownership without returning the buffer: it is now out as a raw
  // pointer, and must come back through BufferPool::ReleaseRaw(),
  // ReleaseRawBulk() or Adopt(). nullptr when empty.
  std::byte* Detach();

 private:
  friend class BufferPool;
  friend struct internal::SharedAccess;
  Buffer(BufferPool* pool, uint32_t slot) : pool_(pool), slot_(slot) {}

  BufferPool* pool_ = nullptr;
  uint32_t slot_ = 0;
};

class BUFPOOL_EXPORT BufferPool {
 public:
  // Maps and prepares the region. Errors: InvalidArgument for a bad option
  // (the message names the field, the value and the limit),
  // ResourceExhausted when the region cannot be mapped or locked,
  // Unavailable when kRequire finds no reserved huge pages. The pool is not
  // movable; keep the unique_ptr.
  static absl::StatusOr<std::unique_ptr<BufferPool>> Create(
      const PoolOptions& options = {});

  // ---- Shared pools (see "Shared pools" above) ----

  // The memfd of a pool made with PoolOptions::shared (or joined), -1 for
  // a private pool. The pool owns it (closed with the pool): pass it to
  // another process over a Unix socket (SCM_RIGHTS) or let a forked child
  // inherit it, and Join() it there.
  int shared_fd() const;
  // Joins the shared pool behind `fd` (from SCM_RIGHTS, or inherited by a
  // forked child): the same slots and buffer_size, this process's own
  // per-CPU caches. Dups `fd`; the caller keeps its copy. Errors:
  // InvalidArgument for a descriptor that is not a pool's memfd (bad fd,
  // wrong size, no magic), FailedPrecondition for another layout version,
  // ResourceExhausted when the process table is full or mapping fails.
  static absl::StatusOr<std::unique_ptr<BufferPool>> Join(int fd);
  // Hands `buffer` (a handle of this pool, emptied) to whoever imports the
  // token, in any process of a shared pool, or in this process for a
  // private one. Until it is imported the buffer belongs to this process
  // (reclaimed if it dies) but is out of its hands; it is imported at most
  // once. An empty handle gives the token 0 (which every Import refuses),
  // as does a handle of another pool, which is released to its own pool.
  // O(1), no lock: one store to the slot's owner word. A private pool
  // allocates its ledger (8 bytes a buffer) at its first Export; if that
  // allocation fails, the buffer is released and the token is 0.
  BufferToken Export(Buffer&& buffer);
  // Takes ownership of an exported buffer. InvalidArgument for a token that
  // names no slot (forged); FailedPrecondition for one that is stale (its
  // buffer was imported already, reclaimed, or exported again since) or
  // names a buffer that is not exported. Nothing changes on a refusal.
  // O(1), no lock: one CAS of the slot's owner word.
  absl::StatusOr<Buffer> Import(BufferToken token);
  // Gives back to the shared depot everything processes that died held:
  // their caches, buffers they held (handles, raw pointers, chains, rings),
  // tokens they exported that nobody imported. Any live process may call it
  // at any time; it is idempotent, and a reclaimer that dies is taken over
  // by the next. Returns the buffers reclaimed by this call. A private pool:
  // 0. Also run on the slow path when the shared depot is found empty.
  // Cost: a liveness test (one fcntl) per process in the table; for each
  // dead one, a scan of the ledger (8 bytes a buffer) under the shared
  // mutex.
  size_t ReclaimDead();

  // Aborts with "still in use" if any buffer is out. Buffers idle in the
  // caches are free and do not count.
  ~BufferPool();

  BufferPool(const BufferPool&) = delete;
  BufferPool& operator=(const BufferPool&) = delete;

  // An empty Buffer only when no buffer was free anywhere in the pool
  // during the call (counted in acquire_failures): this CPU's cache, the
  // depot, then every other CPU's cache, which it empties into the
  // depot. An elastic pool below its ceiling then takes what a running
  // trim holds, or grows one step, before it reports empty. Never waits:
  // for a release, a trimmer or a grower.
  ABSL_ATTRIBUTE_ALWAYS_INLINE Buffer TryAcquire() {
    const uint32_t slot = TryAcquireSlot();
    return slot != kNoSlot ? Buffer(this, slot) : Buffer();
  }
  // Returns a buffer as soon as one is free anywhere in the pool (an
  // elastic pool grows first). Otherwise sleeps until one is released (on
  // any thread) or `timeout` passes: DeadlineExceeded, counted in
  // acquire_timeouts, naming a refused growth when there was one. A timeout of
  // zero or less does not sleep (a failure is counted in acquire_failures). A
  // timeout beyond a century waits forever. While it sleeps, releases skip the
  // caches and go to the depot, so the one it needs reaches it.
  absl::StatusOr<Buffer> Acquire(absl::Duration timeout);
  // Fills out[0, n) with buffers and returns n <= out.size(); n is smaller
  // only when the pool ran out (then counted as one failure). Any buffers
  // `out` held before are released first.
  size_t TryAcquireBulk(absl::Span<Buffer> out);
  // Releases every non-empty handle in `in` and leaves them empty; cheaper
  // than one by one when the cache overflows. `in` may live inside one of
  // the buffers it releases.
  void ReleaseBulk(absl::Span<Buffer> in);

  // Writes 1 to the eventfd `event_fd` (eventfd(2); any fd a write(2) of
  // eight bytes signals) once a buffer is free at or after this call: at
  // once when one is free now (or may be: a cache another call holds
  // counts as one), else at the next release. One-shot: call it
  // again for the next notice. The pool does not own the fd; keep it open
  // until the notice came (a pool destroyed first drops the request).
  // InvalidArgument for a negative fd; the write's error, if any, is
  // ignored (an eventfd at its maximum count is still readable). While a
  // request is pending, releases go to the depot as they do for a
  // sleeping Acquire().
  absl::Status NotifyWhenFree(int event_fd);

  // Moves every CPU's cached free buffers of this pool to the depot
  // (and wakes waiters): O(CPUs), one try-lock each; a cache another call
  // holds throughout is passed by. The caches refill on use.
  void FlushCaches();

  // ---- Elastic pools (PoolOptions::max_buffer_count) ----

  // Gives the memory of free buffers back to the kernel (MADV_DONTNEED),
  // whole chunks of them, the highest first, as long as at least
  // `keep_free` free buffers stay backed (so between keep_free and
  // keep_free + a chunk's buffers stay, plus free buffers that share a
  // chunk with one in use); returns the bytes given back. Free buffers
  // parked in per-CPU caches count: it flushes the caches first
  // (FlushCaches()), so Trim(0) leaves backed only the chunks that hold a
  // buffer in use. Never a buffer in use. Their slots return to the
  // reserve, and growth backs them again when they are needed. Returns 0 for
  // a fixed pool, while a thread sleeps in Acquire(), and while FixedBuffers
  // are registered for the pool (the kernel holds its pages). Trims run
  // one at a time (a second Trim() waits for the first); acquires never
  // wait for one: while it looks the free buffers over they take them from
  // it, and while it gives chunks back they grow, or find the pool at its
  // ceiling. Allocates (lists of the chunks and free slots); 0 if that
  // fails.
  size_t Trim(size_t keep_free = 0);
  // trim_after_idle's tick, for a caller whose process makes no pool calls
  // while idle (the slow paths tick too): once a trim_after_idle window has
  // passed, trims the free buffers the depot held throughout it (the
  // fewest it was seen holding), and those idle in the caches (it flushes
  // them first): so memory goes back within one to two windows of going
  // idle. Never blocks; cheap when nothing is due (a clock read). Returns
  // the bytes given back; 0 without trim_after_idle.
  size_t TrimIdle();
  // Backs at least `buffers` more buffers now (whole steps, at most up to
  // the ceiling), for a caller that expects a burst. ResourceExhausted when
  // the pool is at its ceiling or the system refused (mmap, madvise, mlock
  // under RLIMIT_MEMLOCK: the message names the call and the limit); what
  // was backed before a refusal stays usable. FailedPrecondition for a
  // fixed pool.
  absl::Status Grow(size_t buffers);
  // The granule in which an elastic pool backs and trims its region: a
  // power of two, a whole number of pages and of buffers, at least
  // region().size() / 16384. A fixed pool: 0.
  size_t chunk_bytes() const;
  // For a registration that makes the kernel hold the region's pages
  // (io_uring fixed buffers, RDMA): while any pin is held, Trim() gives
  // nothing back (a trimmed page would stay pinned, and the kernel would
  // keep using it after the pool backed the address with a new one).
  // Growth goes on. Counted; each PinRegion() needs one UnpinRegion().
  void PinRegion();
  void UnpinRegion();

  // Raw pointers, checked (see "Safety" above): each must come back exactly
  // once, through ReleaseRaw(), ReleaseRawBulk() or Adopt(). ReleaseRaw()
  // aborts on a pointer that is not out as a raw pointer of this pool.
  std::byte* TryAcquireRaw();  // nullptr when none is free
  void ReleaseRaw(std::byte* p);
  // The bulk calls without handles: fills out[0, n) with buffer pointers and
  // returns n, smaller only when the pool ran out (then out[n, size) is set
  // to nullptr and one failure is counted). ReleaseRawBulk() skips nullptr
  // entries, so a short fill can be passed back whole; it aborts, as
  // ReleaseRaw() does, on any other pointer that is not an in-use buffer of
  // this pool, and leaves `in` unchanged. `in` may live inside one of the
  // buffers it releases.
  size_t TryAcquireRawBulk(absl::Span<std::byte*> out);
  void ReleaseRawBulk(absl::Span<std::byte* const> in);
  // Wraps a pointer from TryAcquireRaw(), TryAcquireRawBulk() or
  // Buffer::Detach() into a handle, which then owns it.
  // Aborts if `p` is not out as a raw pointer of this pool.
  Buffer Adopt(std::byte* p);

  // A named share of this pool with a byte limit, watermarks and an
  // optional reservation, for chains to charge (bufpool/budget.h, which
  // says what each option does). InvalidArgument for bad options;
  // ResourceExhausted, naming the numbers, when the reservation plus the
  // pool's other reservations and ring lending exceed its capacity, or its
  // buffers are not free now. The budget must be destroyed before the pool.
  // Any thread.
  absl::StatusOr<std::unique_ptr<BufferBudget>> CreateBudget(
      const BudgetOptions& options);
  // Holder tracking (bufpool/holders.h). Holders(): every buffer out now
  // that the pool tracked (with kSampled, the sampled ones; empty with
  // kOff), oldest first; symbolizes their stacks. HoldersReport(): the same
  // grouped by acquire site, largest group first, at most `max_holders`
  // groups, after a line of counts per kind of holder; with kOff, the
  // counts and the line that turns tracking on. Either way, with an
  // io_uring ring (ProvidedBufferRing) on this pool, a count "L lent to
  // io_uring rings (ProvidedBufferRing group G: N lent, P pack)": buffers
  // each live ring holds for the kernel (available() + pack_buffers()),
  // out by design until the ring goes, not leaks; with kOff they are not
  // among the "held by Buffer handles or chains". Both allocate and may be
  // slow (symbolization: milliseconds); any thread, any time.
  std::vector<Holder> Holders() const;
  std::string HoldersReport(size_t max_holders = 20) const;
  // The level in force (the option or BUFPOOL_TRACK_HOLDERS).
  TrackHolders track_holders() const;

  size_t buffer_size() const { return buffer_size_; }
  // buffer_count; an elastic pool's ceiling, max_buffer_count.
  size_t capacity() const { return capacity_; }
  // Free buffers one CPU's cache may hold (see the file comment).
  size_t cache_capacity() const { return cache_capacity_; }
  // How the caches are guarded in this process; the same for every pool
  // with caches on.
  PerCpuMode per_cpu_mode() const;
  // True when the arena was mapped with (or advised to use) huge pages.
  bool huge_pages() const { return huge_pages_; }

  // in_use, cached and the counters are exact whenever no call into the
  // pool is in flight. high_water is never below the largest in_use there
  // has been. It is exact with caches off; with caches on it may exceed the
  // true peak by what the caches lent at that moment: a cache hands out at
  // most cache_capacity() / 2 buffers (one refill batch) on hits before
  // the pool accounts for them, so the overshoot is at most that much per
  // cache in use (two threads taking turns: cache_capacity();
  // src/pool/accounting.cc, "High water"). A Stats()
  // call that overlaps acquires or releases on other threads reads a moving
  // picture: its in_use may be off by the batch being moved (up to
  // cache_capacity()). Takes no lock: cheap while other threads wait.
  PoolStats Stats() const;

  // The whole arena, page-aligned (2 MiB-aligned with huge pages): for
  // io_uring / RDMA registration. Valid for the pool's lifetime. An elastic
  // pool's spans its ceiling, of which Stats().committed buffers are backed.
  absl::Span<std::byte> region() const { return {base_, region_bytes_}; }
  // True when `p` points anywhere inside region().
  bool Contains(const void* p) const {
    auto a = reinterpret_cast<uintptr_t>(p);
    auto b = reinterpret_cast<uintptr_t>(base_);
    return a >= b && a - b < region_bytes_;
  }
  // The slot of a buffer start; `p` must be one (checked in ReleaseRaw).
  uint32_t SlotOf(const void* p) const {
    return static_cast<uint32_t>(
        (reinterpret_cast<uintptr_t>(p) - reinterpret_cast<uintptr_t>(base_)) >>
        shift_);
  }
  std::byte* SlotData(uint32_t slot) const {
    return base_ + static_cast<size_t>(slot) * buffer_size_;
  }

 private:
  friend class Buffer;
  friend struct PoolAccess;  // src/pool: slow paths, tests
  struct Shared;             // slow-path state: depot, caches, waiters
  // SharedBuffer's reference counts (bufpool/internal/shared_access.h).
  friend struct internal::SharedAccess;
  class HolderTable;  // src/pool/holders.h

  // A slot's state byte: kSlotRaw while it is out as a raw pointer.
  enum : uint8_t { kSlotNotRaw = 0, kSlotRaw = 1 };
  static constexpr uint32_t kNoSlot = 0xffffffffu;
  // Scatters slot numbers over the state bytes (see State()).
  static constexpr uint32_t kStateMix = 0x9E3779B1u;

  BufferPool() = default;

  // Hot paths (internal/buffer_pool_inl.h).
  uint32_t TryAcquireSlot();
  void ReleaseSlot(uint32_t slot);
  // This CPU's cache's top slot in one sequence, kNoSlot on a miss; counts
  // a kSampled pool's sample.
  uint32_t PopInline();
  // PopInline() of a kSampled pool, or of one that runs no sequences.
  uint32_t PopInlineSampled(uint32_t index);
  // Pushes `slot` onto this CPU's cache in one sequence; false on a miss
  // and for a kSampled pool's recorded slot.
  bool PushInline(uint32_t slot);
  // Out of line (src/pool/pool_calls.cc): the caches, the depot and
  // draining. noexcept, so that a caller that is noexcept itself, such as
  // the C API, can still call them as tail calls; they allocate nothing,
  // and their only other failure, a std::mutex that cannot lock,
  // terminates.
  uint32_t AcquireSlow() noexcept;  // returns kNoSlot when empty
  void ReleaseSlow(uint32_t slot) noexcept;
  template <class Emit>
  size_t AcquireBulkImpl(size_t want, Emit emit);
  template <class TakeSlot, class Clear>
  void ReleaseBulkImpl(size_t count, const void* span_bytes, TakeSlot take_slot,
                       Clear clear);
  // The raw pair's misses, out of line. ReleaseRawSlow() is called only
  // for a pointer that failed a check and aborts with its message; it is
  // not [[noreturn]] so that the call can be a tail call.
  std::byte* TryAcquireRawSlow() noexcept;
  void ReleaseRawSlow(const std::byte* p) noexcept;
  [[noreturn]] void DieNotFromPool(const void* p) const;
  [[noreturn]] void DieNotRaw(const char* call, uint32_t slot) const;
  // Holder tracking, out of line (src/pool/holders.cc); called only where
  // holders_ is set. AcquireSlow()/ReleaseSlow() of a tracked pool.
  uint32_t AcquireTracked() noexcept;
  // kSampled: `slot` was handed out inline and this thread's countdown
  // reached 0: records it and restarts the countdown.
  void AcquireSampled(uint32_t slot) noexcept;
  void ReleaseTracked(uint32_t slot) noexcept;
  // The untracked single-buffer slow paths (the hit on this CPU's cache,
  // then the depot and the other caches).
  uint32_t AcquireUntracked() noexcept;
  void ReleaseUntracked(uint32_t slot) noexcept;
  void TouchSlot(uint32_t slot, absl::string_view label) const noexcept;
  // What holds `slot` now, for the reports (internal::SharedAccess notes).
  void NoteHolder(uint32_t slot, uint32_t note) const noexcept;
  std::string HeldBy(uint32_t slot, uint32_t note) const;
  // Holders(), and each one's acquire site (its first frame's address)
  // into *sites when given.
  std::vector<Holder> HoldersAndSites(std::vector<uintptr_t>* sites) const;
  // HoldersReport() with `out_now` buffers out (the destructor counts them).
  std::string Report(size_t max_holders, size_t out_now) const;

  uint64_t SlotOrHuge(const void* p) const {
    return internal::SlotOrHuge(p, base_, shift_);
  }
  std::atomic<uint8_t>& State(uint32_t slot) const {
    return state_[(slot * kStateMix) & state_mask_];
  }

  // Fixed after Create(); read by the inline fast paths.
  std::byte* base_ = nullptr;
  size_t buffer_size_ = 0;
  size_t capacity_ = 0;
  size_t region_bytes_ = 0;  // capacity_ * buffer_size_
  size_t cache_capacity_ = 0;
  // The rseq caches (internal/rseq.h), or nullptr where they are off.
  char* rseq_base_ = nullptr;
  // Caches the sequences may index: the cache count, 0 where they are off
  // (then every sequence fails at once; internal/buffer_pool_inl.h).
  uint32_t rseq_cpus_ = 0;
  uint32_t rseq_index_ = 0;  // the rseq area field that indexes them
  // rseq_cpus_ for release: 0 also when the pool scrubs (out of line).
  uint32_t rseq_release_cpus_ = 0;
  // The most slots a cache lends: a push hit needs count - floor below it
  // (internal/rseq.h; src/pool/accounting.cc, "High water").
  uint32_t lend_ = 0;
  // The inline paths' mode, fixed at Create(): rseq_index_ (the mm_cid or
  // cpu_id field), with internal::rseq::kSampledTag set in a kSampled
  // pool; 0 where the pool runs no sequences. Each mode has its own block
  // (internal/buffer_pool_inl.h): an untracked pool's pair reads nothing
  // for holder tracking, and neither index tests the other's field again.
  uint32_t inline_index_ = 0;
  // kSampled holder tracking (src/pool/holders.h): one byte per slot, 1
  // while the slot's acquire was recorded; nullptr in every other pool.
  // Where set, an inline acquire counts down this thread's
  // internal::t_holder_countdown and an inline release of a recorded slot
  // goes out of line (inline_index_ sends both down that path).
  std::atomic<uint8_t>* holder_marks_ = nullptr;
  unsigned shift_ = 0;
  bool scrub_ = false;
  bool huge_pages_ = false;
  std::unique_ptr<std::atomic<uint8_t>[]> state_;  // see src/pool
  uint32_t state_mask_ = 0;  // state_ has state_mask_ + 1 entries
  // cache_capacity_ minus internal::rseq::kOneWaiter for each thread
  // asleep in Acquire() and each pending NotifyWhenFree() request: negative
  // while anyone waits. Read on every release that reaches a cache, which
  // compares a cache's count with it (src/pool/drain.cc, rseq.h). On a line
  // of its own: written only on the wait paths.
  alignas(64) std::atomic<int64_t> release_limit_{0};
  std::unique_ptr<Shared> shared_;
  // SharedBuffer reference counts, one uint32_t per slot (used through
  // std::atomic_ref), calloc'd on the first SharedBuffer made from this pool
  // and published once; see bufpool/internal/shared_access.h.
  std::atomic<uint32_t*> shared_refs_{nullptr};
  // Holder records (src/pool/holders.h), or nullptr with tracking off.
  // Where it is set, rseq_cpus_ and rseq_release_cpus_ are 0, so every
  // single acquire and release goes out of line, where it is recorded.
  std::unique_ptr<HolderTable> holders_;
};

}  // namespace bufpool

#include "bufpool/internal/buffer_pool_inl.h"  // IWYU pragma: export

#endif  // BUFPOOL_BUFFER_POOL_H_

// libbufpool: a pool of fixed-size, page-aligned buffers.
//
// A BufferPool maps one page-aligned region (the arena) once, slices it into
// `buffer_count` buffers of `buffer_size` bytes, and hands them out from a
// lock-free free list fronted by small per-thread caches. Buffer `i` lives at
//
//   region().data() + i * buffer_size
//
//   region(): +----------+----------+----------+-- ... --+----------+
//             | slot 0   | slot 1   | slot 2   |         | slot n-1 |
//             +----------+----------+----------+-- ... --+----------+
//   out of band (never inside a buffer): per slot, a free-list link (with
//   the free count below it) and a state byte (raw pointers only)
//
// so the whole region can be registered once with the kernel (io_uring fixed
// buffers, provided-buffer rings with buffer id == slot index).
//
// Ownership. The pool owns the memory. `Buffer` is a move-only handle that
// owns one buffer and returns it when destroyed (like std::unique_ptr).
// TryAcquireRaw()/ReleaseRaw() (and the *RawBulk() calls) are the same
// operations without the handle; a raw pointer must come back exactly once,
// through ReleaseRaw(), ReleaseRawBulk() or Adopt().
// Every Buffer and raw pointer must be returned before the pool is destroyed.
//
// Thread safety. Every BufferPool method may be called from any number of
// threads at once. A buffer may be released on a different thread than the
// one that acquired it. A single Buffer handle is not shared between threads
// (like std::unique_ptr): hand it over with std::move through your own
// synchronisation. Many pools may be used from one thread.
//
// Per-thread caches. Each thread that uses a pool keeps up to
// `cache_capacity()` free buffers of that pool in a private cache, so the
// common acquire/release is a thread-local array operation with no atomic
// read-modify-write and no lock. Consequences a caller can observe:
//   * One thread alone can always acquire exactly capacity() buffers.
//   * With several live threads, up to (threads - 1) * cache_capacity()
//     free buffers may sit idle in other threads' caches, where TryAcquire()
//     on this thread cannot see them. A cache is emptied into the shared list
//     when its thread exits, and whenever its thread releases a buffer while
//     some thread is blocked in Acquire(). cache_capacity() is
//     min(thread_cache_size, capacity() / 8, kMaxThreadCacheSize), so
//     caches never hold more than
//     an eighth of the pool per thread; set thread_cache_size = 0 to turn
//     them off and make every free buffer visible to every thread.
//
// Safety. A Buffer handle cannot be released twice: it is move-only, and a
// moved-from or Reset() handle is empty, so every buffer acquired as a
// handle goes back exactly once, with no check needed. Raw pointers have no
// such guard, so the raw calls check at run time, in release builds too
// (O(1), one state byte per buffer): ReleaseRaw(), ReleaseRawBulk() and
// Adopt() abort with "double release" unless the pointer is out as a raw
// pointer, which catches releasing it twice and also releasing a buffer
// that a live handle owns (ReleaseRaw(b.data())); a pointer that is not the
// start of one of this pool's buffers aborts with "not from this pool";
// destroying the pool while buffers are out aborts with "still in use".
// Under AddressSanitizer free buffers are poisoned. What the O(1) check
// cannot see: a pointer released, handed out again as a raw pointer by a
// later acquire, and then released again by its old owner looks like a
// legitimate release (the slot is out again); and two threads releasing the
// same pointer at the same instant race past it (and may leave the pool's
// counts, which the destructor's "still in use" check relies on for
// handles, wrong from then on). Releasing a raw pointer that is free is
// always caught.
//
// Handles pay nothing for this, which matters when buffers cross threads:
// a state byte written by the acquiring core and checked by the releasing
// one moves a cache line between cores for every buffer (measured here, in
// interleaved runs: a hand-off between two threads took 6.2-6.8 ns per buffer
// with it and 2.7-5.5 without; the raw calls still pay it).
//
// Destruction. Destroy a pool only after every call into it on other threads
// has returned, as with any object: seeing a buffer come back through the
// pool does not prove that the call which released it has finished.
#ifndef BUFPOOL_BUFFER_POOL_H_
#define BUFPOOL_BUFFER_POOL_H_

#include <atomic>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <utility>

#include "absl/base/attributes.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "bufpool/export.h"

#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/asan_interface.h>
#define BUFPOOL_INTERNAL_POISON(p, n) ASAN_POISON_MEMORY_REGION((p), (n))
#define BUFPOOL_INTERNAL_UNPOISON(p, n) ASAN_UNPOISON_MEMORY_REGION((p), (n))
#else
#define BUFPOOL_INTERNAL_POISON(p, n) ((void)(p), (void)(n))
#define BUFPOOL_INTERNAL_UNPOISON(p, n) ((void)(p), (void)(n))
#endif

namespace bufpool {

inline constexpr size_t kDefaultBufferSize = 4096;
// The most free buffers one thread may cache per pool.
inline constexpr size_t kMaxThreadCacheSize = 512;

enum class HugePages {
  kNever,    // 4 KiB pages only
  kTry,      // advise transparent huge pages (2 MiB) where the kernel allows
  kRequire,  // MAP_HUGETLB from the reserved pool, or Create() fails
};

struct PoolOptions {
  size_t buffer_size = kDefaultBufferSize;  // power of two, >= 64
  size_t buffer_count = 1024;               // >= 1, < 2^32 - 1
  HugePages huge_pages = HugePages::kTry;
  bool populate = true;           // fault every page in at Create()
  bool lock_memory = false;       // mlock the region (needs RLIMIT_MEMLOCK)
  bool scrub_on_release = false;  // zero a buffer before anyone else gets it
  size_t thread_cache_size = 64;  // per-thread cache (<= 512); 0: none
};

struct PoolStats {
  size_t capacity;    // buffer_count
  size_t in_use;      // held by users (buffers idle in caches are free)
  size_t high_water;  // the largest in_use seen (see BufferPool::Stats)
  // TryAcquire*/Acquire calls that got nothing, and bulk calls that got
  // fewer than asked.
  uint64_t acquire_failures;
};

class BufferPool;

namespace internal {

struct SharedAccess;  // bufpool/internal/shared_access.h (SharedBuffer)

// One thread's cache of free slots for one pool. Created and owned by the
// thread (src/pool/buffer_pool.cc); the pool keeps a list of its caches so
// that Stats() can count them and its destructor can detach them.
//
// Memory ordering: `hot`, `count`, `reported` and `low_water` are written
// only by the owning thread and read by other threads only in Stats() and
// ~BufferPool, which are exact only when no acquire/release is in flight
// (the destructor counts handles from them); relaxed loads/stores
// suffice (they compile to plain moves). `pool` and `fast` are set to
// nullptr under the registry mutex when the pool dies; the owner reads
// `fast` relaxed on the hot path (a stale read could only happen while the
// pool is being destroyed, which callers may not race with using it). A
// detached cache never matches any pool, so a new pool at a dead pool's
// address cannot inherit its cache. A thread going to sleep in Acquire()
// clears every cache's `fast` under its pool's caches_mu; the owner may see
// that a little late, as it would a waiter count, and every release after it
// takes the slow path until the wait ends (see PoolAccess::RestoreFast).
//
// Layout: the most recently released slot sits in `hot` (a fixed address),
// the rest in the stack slots[0, count). A release-then-acquire on one
// thread, the commonest pattern, then touches only `hot`, which the CPU can
// forward from store to load without going through an indexed array. The
// cache's total is count + (hot != kNone).
//
// low_water is the lowest total since the last fold and never exceeds the
// stack's count (the total less `hot`): Fold() sets it to the stack's count,
// every stack pop lowers it with the count, and otherwise `hot` only goes
// from empty to full without the count falling. The one exception, a spill
// that drops the count and refills `hot` in one release, folds right after
// (see Fold()). So taking `hot` (total becomes count) never sets a new low,
// and the hit path skips that check.
struct alignas(64) ThreadCache {
  static constexpr uint32_t kNone = 0xffffffffu;
  // `pool` while the inline fast paths may serve it, else nullptr: while a
  // thread sleeps in Acquire() (so releases reach it), and always for a
  // pool that scrubs (its release must memset anyway). One compare then
  // covers the pool, the waiters and scrubbing on the hit path.
  std::atomic<BufferPool*> fast{nullptr};
  std::atomic<BufferPool*> pool{nullptr};  // the pool served, or nullptr
  std::atomic<uint32_t> hot{kNone};        // a free slot, or kNone
  std::atomic<uint32_t> count{0};          // slots[0, count) are free
  std::atomic<uint32_t> reported{0};       // total last folded into the pool
  std::atomic<uint32_t> low_water{0};      // see above
  uint32_t capacity = 0;                   // of the stack: cache_capacity - 1
  // An empty magazine kept for the next spill (src/pool/depot.h), or
  // kNone. Owner only.
  uint32_t spare = kNone;
  // Inline, so the hit path loads no pointer to reach it. Two spare entries
  // let the slow path fold `hot` in and hand over everything plus one slot.
  uint32_t slots[kMaxThreadCacheSize + 1];
};

// A cache that serves no pool, so the hot path needs no null check.
BUFPOOL_EXPORT extern ThreadCache g_no_cache;

// The cache of the pool this thread used last (&g_no_cache before first use,
// never null). constinit: no dynamic initialisation, so access needs no TLS
// wrapper call.
BUFPOOL_EXPORT extern constinit thread_local ThreadCache* tls_cache;

}  // namespace internal

// A move-only owner of one buffer; returns it to its pool when destroyed.
// Not thread-safe by itself (like std::unique_ptr); may be moved to and
// destroyed on another thread.
class Buffer {
 public:
  Buffer() noexcept = default;  // empty
  Buffer(Buffer&& other) noexcept
      : pool_(std::exchange(other.pool_, nullptr)), index_(other.index_) {}
  Buffer& operator=(Buffer&& other) noexcept;  // releases what it held before
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  ABSL_ATTRIBUTE_ALWAYS_INLINE ~Buffer() { Reset(); }

  std::byte* data() const;
  size_t size() const;  // the pool's buffer_size; 0 when empty
  absl::Span<std::byte> span() const { return {data(), size()}; }
  // Slot number: data() == pool.region().data() + index() * buffer_size.
  uint32_t index() const { return index_; }
  explicit operator bool() const { return pool_ != nullptr; }
  BufferPool* pool() const { return pool_; }

  void Reset();  // return the buffer now; the handle becomes empty
  // Give up ownership without returning the buffer: it is now out as a raw
  // pointer, and must come back through BufferPool::ReleaseRaw(),
  // ReleaseRawBulk() or Adopt(). nullptr when empty.
  std::byte* Detach();

 private:
  friend class BufferPool;
  friend struct internal::SharedAccess;
  Buffer(BufferPool* pool, uint32_t index) : pool_(pool), index_(index) {}

  BufferPool* pool_ = nullptr;
  uint32_t index_ = 0;
};

class BUFPOOL_EXPORT BufferPool {
 public:
  // Maps and prepares the region. Errors: InvalidArgument for a bad option
  // (the message names the field and value), ResourceExhausted when the
  // region cannot be mapped or locked, Unavailable when kRequire finds no
  // reserved huge pages. The pool is not movable; keep the unique_ptr.
  static absl::StatusOr<std::unique_ptr<BufferPool>> Create(
      const PoolOptions& options = {});

  // Aborts with "still in use" if any buffer is out. Buffers idle in thread
  // caches are free and do not count.
  ~BufferPool();

  BufferPool(const BufferPool&) = delete;
  BufferPool& operator=(const BufferPool&) = delete;

  // An empty Buffer when none is free (counted in acquire_failures).
  ABSL_ATTRIBUTE_ALWAYS_INLINE Buffer TryAcquire() {
    const uint32_t slot = TryAcquireSlot();
    return slot != kNoSlot ? Buffer(this, slot) : Buffer();
  }
  // Returns at once when a buffer is free; otherwise sleeps until one is
  // released or `timeout` passes (DeadlineExceeded, counted as a failure).
  // Buffers idle in other live threads' caches do not wake it (see
  // "Per-thread caches"), including ones released there in the moment
  // between finding none free and going to sleep (while it switches those
  // caches to the path that hands buffers over); any release while it sleeps
  // does, and hands over the releasing thread's idle buffers too. A timeout
  // of zero or less only tries once. A timeout beyond a century waits
  // forever.
  absl::StatusOr<Buffer> Acquire(absl::Duration timeout);
  // Fills out[0, n) with buffers and returns n <= out.size(); n is smaller
  // only when the pool ran out (then counted as one failure). Any buffers
  // `out` held before are released first.
  size_t TryAcquireBulk(absl::Span<Buffer> out);
  // Releases every non-empty handle in `in` (a batch; cheaper than one by one
  // when the cache overflows).
  void ReleaseBulk(absl::Span<Buffer> in);

  // Raw pointers, checked (see "Safety" above): each must come back exactly
  // once, through ReleaseRaw(), ReleaseRawBulk() or Adopt(). ReleaseRaw()
  // aborts on a pointer that is not out as a raw pointer of this pool.
  std::byte* TryAcquireRaw();  // nullptr when none is free
  void ReleaseRaw(std::byte* p);
  // The bulk calls without handles: fills out[0, n) with buffer pointers and
  // returns n, smaller only when the pool ran out (then out[n, size) is set
  // to nullptr and one failure is counted). Each pointer must come back
  // exactly once, through ReleaseRaw(), ReleaseRawBulk() or Adopt().
  // ReleaseRawBulk() skips nullptr entries, so a short fill can be passed
  // back whole; it aborts, as ReleaseRaw() does, on any other pointer that
  // is not an in-use buffer of this pool, and leaves `in` unchanged.
  size_t TryAcquireRawBulk(absl::Span<std::byte*> out);
  void ReleaseRawBulk(absl::Span<std::byte* const> in);
  // Wraps a pointer from TryAcquireRaw(), TryAcquireRawBulk() or
  // Buffer::Detach() into a handle, which then owns it.
  // Aborts if `p` is not out as a raw pointer of this pool.
  Buffer Adopt(std::byte* p);

  size_t buffer_size() const { return buffer_size_; }
  size_t capacity() const { return capacity_; }
  // Free buffers one thread may keep privately (see the file comment).
  size_t cache_capacity() const { return cache_capacity_; }
  // True when the arena was mapped with (or advised to use) huge pages.
  bool huge_pages() const { return huge_pages_; }

  // in_use and the failure count are exact whenever no acquire/release is in
  // flight. high_water is exact with caches off, and for one thread, also
  // when Stats() runs on another thread meanwhile (it waits for a moment
  // when no cache is moving slots to or from the shared depot); with
  // several threads caching it may be off by the buffers idle in other
  // threads' caches (at most (threads - 1) * cache_capacity()).
  PoolStats Stats() const;

  // The whole arena, page-aligned (2 MiB-aligned with huge pages): for
  // io_uring / RDMA registration. Valid for the pool's lifetime.
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
    // A multiply, not a shift by shift_: fewer instructions on x86 without
    // BMI2 (shl by %cl needs the count moved into %cl first).
    return base_ + static_cast<size_t>(slot) * buffer_size_;
  }

 private:
  friend class Buffer;
  friend struct PoolAccess;  // src/pool: thread caches, tests
  struct Shared;             // slow-path state: depot, waiters, registry
  // SharedBuffer's reference counts (bufpool/internal/shared_access.h).
  friend struct internal::SharedAccess;

  // A slot's state byte (see state_): kSlotRaw while it is out as a raw
  // pointer; kSlotNotRaw otherwise (free, or owned by a Buffer handle).
  enum : uint8_t { kSlotNotRaw = 0, kSlotRaw = 1 };

  BufferPool() = default;

  uint32_t TryAcquireSlot();        // hot path, inline below; or kNoSlot
  void ReleaseSlot(uint32_t slot);  // hot path, inline below
  // Out of line: cache miss/overflow, first use on this thread, cache off.
  uint32_t AcquireSlow();  // returns kNoSlot when empty
  void ReleaseSlow(uint32_t slot);
  template <class Emit>
  size_t AcquireBulkImpl(size_t want, Emit emit);  // src/pool/buffer_pool.cc
  template <class TakeSlot, class Taken>
  void ReleaseBulkImpl(size_t count, TakeSlot take_slot, Taken taken);
  [[noreturn]] void DieNotFromPool(const void* p) const;
  [[noreturn]] void DieNotRaw(const char* call, uint32_t slot) const;
  internal::ThreadCache* MyCache() const {
    internal::ThreadCache* c = internal::tls_cache;
    // relaxed: see ThreadCache.
    return c->pool.load(std::memory_order_relaxed) == this ? c : nullptr;
  }

  static constexpr uint32_t kNoSlot = 0xffffffffu;

  // The slot `p` starts, or a number >= capacity_ when `p` is not a slot
  // start of this pool: the offset from base_ rotated right by log2
  // (buffer_size), so bits below a buffer's start (a pointer into the middle
  // of one) land at the top, and a pointer below the region wraps to a huge
  // offset. capacity_ * buffer_size_ < 2^63 (Create) keeps any slot below
  // 2^(64 - shift_). One compare checks all three; the raw release path
  // needs no other test.
  uint64_t SlotOrHuge(const void* p) const {
    return SlotOrHuge(p, base_, shift_);
  }
  // The same from copies of base_ and shift_ (for loops; see ReleaseRawBulk).
  static uint64_t SlotOrHuge(const void* p, const std::byte* base,
                             unsigned shift) {
    const uint64_t off =
        reinterpret_cast<uintptr_t>(p) - reinterpret_cast<uintptr_t>(base);
    return std::rotr(off, static_cast<int>(shift));
  }

  // Hot-path fields, fixed after Create().
  std::byte* base_ = nullptr;
  size_t buffer_size_ = 0;
  size_t capacity_ = 0;
  size_t region_bytes_ = 0;  // capacity_ * buffer_size_
  size_t cache_capacity_ = 0;
  unsigned shift_ = 0;
  bool scrub_ = false;
  bool huge_pages_ = false;
  // One state byte per slot, out of band: kSlotRaw from a raw acquire (or
  // Detach) until the raw release (or Adopt); handles never touch it. Written
  // by whoever holds the slot; relaxed suffices because a slot changes hands
  // only through the depot (release/acquire CAS) or the caller's own
  // synchronisation, either of which orders these accesses.
  //
  // Placement: slot i's byte is at (i * kStateMix) & state_mask_, a
  // bijection on the power-of-two array, so slots near each other (or a
  // refill batch apart) land on different 64-byte lines. Two threads
  // cycling their own slots would otherwise write one line from two cores:
  // measured here, 2 threads took 2.7-4.4 ns per buffer instead of 1.1 in
  // about a third of runs, and hand-off 35-45 ns instead of 10.
  static constexpr uint32_t kStateMix = 0x9E3779B1u;  // odd
  std::unique_ptr<std::atomic<uint8_t>[]> state_;
  uint32_t state_mask_ = 0;  // state_ has state_mask_ + 1 entries
  std::atomic<uint8_t>& State(uint32_t slot) const {
    return state_[(slot * kStateMix) & state_mask_];
  }
  // Threads blocked in Acquire(). Read by the slow paths only: the hit paths
  // see waiting through ThreadCache::fast, which a sleeper clears. On a line
  // of its own: the slow paths write it, and that must not evict the fields
  // above.
  alignas(64) std::atomic<uint32_t> waiters_{0};
  std::unique_ptr<Shared> shared_;
  // SharedBuffer reference counts, one uint32_t per slot (used through
  // std::atomic_ref), calloc'd on the first SharedBuffer made from this pool
  // and published once; see bufpool/internal/shared_access.h.
  std::atomic<uint32_t*> shared_refs_{nullptr};
};

// ---- Inline fast paths ------------------------------------------------------
//
// Always inlined: GCC's heuristics otherwise drop ReleaseSlot() out of line
// in some callers (seen in the hot-pair benchmark: 2.75 ns instead of 2.1).

ABSL_ATTRIBUTE_ALWAYS_INLINE inline std::byte* BufferPool::TryAcquireRaw() {
  const uint32_t slot = TryAcquireSlot();
  if (slot == kNoSlot) return nullptr;
  State(slot).store(kSlotRaw, std::memory_order_relaxed);  // see state_
  return SlotData(slot);
}

ABSL_ATTRIBUTE_ALWAYS_INLINE inline uint32_t BufferPool::TryAcquireSlot() {
  // tls_cache is never null (&g_no_cache when unused), so no null test.
  internal::ThreadCache* const c = internal::tls_cache;
  // relaxed: see ThreadCache.
  if (c->fast.load(std::memory_order_relaxed) == this) [[likely]] {
    uint32_t slot = c->hot.load(std::memory_order_relaxed);
    if (slot != internal::ThreadCache::kNone) [[likely]] {
      // The total drops to `count`, which is never below low_water (see
      // ThreadCache), so the high-water bookkeeping has nothing to do.
      c->hot.store(internal::ThreadCache::kNone, std::memory_order_relaxed);
    } else {
      uint32_t n = c->count.load(std::memory_order_relaxed);
      if (n == 0) return AcquireSlow();
      --n;
      slot = c->slots[n];
      c->count.store(n, std::memory_order_relaxed);
      // The total is now n; track its minimum for Stats().high_water.
      if (n < c->low_water.load(std::memory_order_relaxed)) [[unlikely]] {
        c->low_water.store(n, std::memory_order_relaxed);
      }
    }
    BUFPOOL_INTERNAL_UNPOISON(SlotData(slot), buffer_size_);
    return slot;
  }
  return AcquireSlow();
}

ABSL_ATTRIBUTE_ALWAYS_INLINE inline void BufferPool::ReleaseSlot(
    uint32_t slot) {
  internal::ThreadCache* const c = internal::tls_cache;  // never null
  // relaxed: a thread about to sleep in Acquire() clears `fast` first; a
  // release that does not see that yet keeps its buffer in this cache, as
  // Acquire()'s comment allows, and the next release that sees it hands over.
  // Not `fast`: scrubbing, waiters (see ThreadCache::fast), no cache.
  if (c->fast.load(std::memory_order_relaxed) == this) [[likely]] {
    BUFPOOL_INTERNAL_POISON(SlotData(slot), buffer_size_);
    const uint32_t hot = c->hot.load(std::memory_order_relaxed);
    if (hot == internal::ThreadCache::kNone) [[likely]] {
      c->hot.store(slot, std::memory_order_relaxed);
      return;
    }
    const uint32_t n = c->count.load(std::memory_order_relaxed);
    if (n < c->capacity) {  // the older hot slot moves down to the stack
      c->slots[n] = hot;
      c->count.store(n + 1, std::memory_order_relaxed);
      c->hot.store(slot, std::memory_order_relaxed);
      return;
    }
  }
  ReleaseSlow(slot);
}

ABSL_ATTRIBUTE_ALWAYS_INLINE inline void BufferPool::ReleaseRaw(std::byte* p) {
  const uint64_t index = SlotOrHuge(p);
  if (index >= capacity_) [[unlikely]]
    DieNotFromPool(p);
  const auto slot = static_cast<uint32_t>(index);
  // The O(1) double-release check (relaxed: see state_).
  if (State(slot).load(std::memory_order_relaxed) != kSlotRaw) [[unlikely]] {
    DieNotRaw("ReleaseRaw", slot);
  }
  State(slot).store(kSlotNotRaw, std::memory_order_relaxed);
  ReleaseSlot(slot);
}

inline std::byte* Buffer::data() const {
  return pool_ ? pool_->SlotData(index_) : nullptr;
}

inline size_t Buffer::size() const { return pool_ ? pool_->buffer_size_ : 0; }

ABSL_ATTRIBUTE_ALWAYS_INLINE inline void Buffer::Reset() {
  if (pool_ != nullptr) {
    pool_->ReleaseSlot(index_);
    pool_ = nullptr;
  }
}

ABSL_ATTRIBUTE_ALWAYS_INLINE inline Buffer& Buffer::operator=(
    Buffer&& other) noexcept {
  if (this != &other) {
    Reset();
    pool_ = std::exchange(other.pool_, nullptr);
    index_ = other.index_;
  }
  return *this;
}

inline std::byte* Buffer::Detach() {
  if (pool_ == nullptr) return nullptr;
  pool_->State(index_).store(BufferPool::kSlotRaw, std::memory_order_relaxed);
  std::byte* p = data();
  pool_ = nullptr;
  return p;
}

}  // namespace bufpool

#endif  // BUFPOOL_BUFFER_POOL_H_

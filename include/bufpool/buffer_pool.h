// libbufpool: a pool of fixed-size, page-aligned buffers.
//
// A BufferPool maps one page-aligned region (the arena) once, slices it into
// `buffer_count` buffers of `buffer_size` bytes, and hands them out from a
// lock-free shared store fronted by small per-thread caches. Buffer `i` lives
// at
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
// synchronisation. A thread may use any number of pools, in any order.
//
// Per-thread caches. Each thread that uses a pool keeps up to
// `cache_capacity()` free buffers of that pool in a private cache, so the
// common acquire/release is a thread-local operation with no atomic
// read-modify-write and no lock. What a caller can observe:
//   * One thread alone can always acquire exactly capacity() buffers.
//   * TryAcquire() looks in this thread's cache and the shared store only:
//     it returns an empty handle when both are empty, even if other threads'
//     caches hold free buffers.
//   * Acquire() (with any timeout, zero included) also reclaims buffers
//     sitting idle in the caches of threads that are blocked (in a system
//     call: waiting on a lock, a condition variable, I/O, a sleep). It never
//     times out while such a buffer exists. A thread that is running keeps
//     its cached buffers until its next release, which, while a thread waits
//     in Acquire(), hands them all over; call FlushThreadCache() in a thread
//     that is about to compute for long without using the pool.
//   * A cache is emptied into the shared store when its thread exits, and by
//     FlushThreadCache(). In a child after fork(), the caches of the
//     parent's other threads are reclaimed like those of blocked threads.
//   * Reclaiming relies on a thread blocked in a system call being outside
//     every pool call. A signal handler that interrupts a pool call and then
//     blocks (sigsuspend, a blocking read) breaks that: do not call into a
//     pool, or block, in a handler that may interrupt one.
//   cache_capacity() is min(thread_cache_size, capacity() / 8), so caches
//   never hold more than an eighth of the pool per thread; set
//   thread_cache_size = 0 to turn them off.
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
// Destruction. Destroy a pool only after every call into it on other threads
// has returned, as with any object.
//
// Shared objects. The inline fast paths reach this thread's cache table with
// the initial-exec TLS model (bufpool/internal/thread_cache.h), so code built
// with -fPIC pays no __tls_get_addr. A shared object holding libbufpool
// (libbufpool.so, or a plugin that links it statically) that is loaded with
// dlopen() rather than at start-up takes that table (128 bytes) from glibc's
// static TLS reserve; in a process that has used the reserve up, dlopen()
// fails with "cannot allocate memory in static TLS block". Link the library
// at start-up, or raise the reserve with
// GLIBC_TUNABLES=glibc.rtld.optional_static_tls=2048.
#ifndef BUFPOOL_BUFFER_POOL_H_
#define BUFPOOL_BUFFER_POOL_H_

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <utility>

#include "absl/base/attributes.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "bufpool/export.h"
#include "bufpool/internal/thread_cache.h"
#include "bufpool/options.h"

namespace bufpool {

inline constexpr size_t kDefaultBufferSize = 4096;
// The most free buffers one thread may cache per pool.
inline constexpr size_t kMaxThreadCacheSize = internal::kMaxCacheSlots;

struct PoolOptions {
  size_t buffer_size = kDefaultBufferSize;  // power of two, >= 64
  size_t buffer_count = 1024;               // >= 1, < 2^32 - 1
  HugePages huge_pages = HugePages::kTry;
  bool populate = true;           // fault every page in at Create()
  bool lock_memory = false;       // mlock the region (needs RLIMIT_MEMLOCK)
  bool scrub_on_release = false;  // zero a buffer before anyone else gets it
  size_t thread_cache_size = 64;  // per-thread cache, <= kMaxThreadCacheSize
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
};

class BufferPool;

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
  // (the message names the field, the value and the limit),
  // ResourceExhausted when the region cannot be mapped or locked,
  // Unavailable when kRequire finds no reserved huge pages. The pool is not
  // movable; keep the unique_ptr.
  static absl::StatusOr<std::unique_ptr<BufferPool>> Create(
      const PoolOptions& options = {});

  // Aborts with "still in use" if any buffer is out. Buffers idle in thread
  // caches are free and do not count.
  ~BufferPool();

  BufferPool(const BufferPool&) = delete;
  BufferPool& operator=(const BufferPool&) = delete;

  // An empty Buffer when neither this thread's cache nor the shared store
  // has a free buffer (counted in acquire_failures); never waits and never
  // reclaims from other threads' caches (see "Per-thread caches").
  ABSL_ATTRIBUTE_ALWAYS_INLINE Buffer TryAcquire() {
    const uint32_t slot = TryAcquireSlot();
    return slot != kNoSlot ? Buffer(this, slot) : Buffer();
  }
  // Returns a buffer as soon as one is free anywhere in the pool: in this
  // thread's cache, the shared store, or the cache of a blocked thread
  // (reclaimed). Otherwise sleeps until one is released or `timeout` passes:
  // DeadlineExceeded, counted in acquire_timeouts. A timeout of zero or less
  // does not sleep (a failure is counted in acquire_failures). A timeout
  // beyond a century waits forever. While it sleeps, every other thread's
  // next release hands its cached buffers over.
  absl::StatusOr<Buffer> Acquire(absl::Duration timeout);
  // Fills out[0, n) with buffers and returns n <= out.size(); n is smaller
  // only when the pool ran out (then counted as one failure). Any buffers
  // `out` held before are released first.
  size_t TryAcquireBulk(absl::Span<Buffer> out);
  // Releases every non-empty handle in `in` and leaves them empty; cheaper
  // than one by one when the cache overflows. `in` may live inside one of
  // the buffers it releases.
  void ReleaseBulk(absl::Span<Buffer> in);

  // Moves this thread's cached free buffers of this pool to the shared
  // store, where every thread sees them (and wakes waiters). For a thread
  // about to go idle or to compute for long without the pool; cheap when the
  // cache is empty. The cache refills on this thread's next acquire.
  void FlushThreadCache();

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

  size_t buffer_size() const { return buffer_size_; }
  size_t capacity() const { return capacity_; }
  // Free buffers one thread may keep privately (see the file comment).
  size_t cache_capacity() const { return cache_capacity_; }
  // True when the arena was mapped with (or advised to use) huge pages.
  bool huge_pages() const { return huge_pages_; }

  // in_use and the counters are exact whenever no call into the pool is in
  // flight. high_water is never below the largest in_use there has been; it
  // is exact with caches off and with one thread, and otherwise may exceed
  // the true peak by the free buffers that sat in thread caches at that
  // moment (at most threads x cache_capacity(); FlushThreadCache() in
  // threads that go idle keeps it tight). A Stats() call that overlaps
  // acquires or releases on other threads reads a moving picture: its
  // in_use and high_water may be off by the batch being moved (up to
  // cache_capacity()) or not yet count a peak being made; a call made once
  // they have returned is exact as above.
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
    return base_ + static_cast<size_t>(slot) * buffer_size_;
  }

 private:
  friend class Buffer;
  friend struct PoolAccess;  // src/pool: slow paths, tests
  struct Shared;             // slow-path state: depot, waiters, caches
  // SharedBuffer's reference counts (bufpool/internal/shared_access.h).
  friend struct internal::SharedAccess;

  // A slot's state byte: kSlotRaw while it is out as a raw pointer.
  enum : uint8_t { kSlotNotRaw = 0, kSlotRaw = 1 };
  static constexpr uint32_t kNoSlot = 0xffffffffu;
  // Scatters slot numbers over the state bytes (see State()).
  static constexpr uint32_t kStateMix = 0x9E3779B1u;

  BufferPool() = default;

  // Hot paths (internal/buffer_pool_inl.h).
  uint32_t TryAcquireSlot();
  uint32_t PopCached(internal::ThreadCache* c);
  void ReleaseSlot(uint32_t slot);
  // Out of line: cache miss/overflow, first use on this thread, cache off.
  // noexcept, so that a caller that is noexcept itself, such as the C API,
  // can still call them as tail calls: a thread whose cache cannot be
  // allocated is served uncached (src/pool/buffer_pool.cc, Attach()), and
  // their only other failure, a std::mutex that cannot lock, terminates.
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
  uint32_t cache_index_ = 0;  // into internal::tls_caches
  unsigned shift_ = 0;
  bool scrub_ = false;
  bool huge_pages_ = false;
  std::unique_ptr<std::atomic<uint8_t>[]> state_;  // see src/pool
  uint32_t state_mask_ = 0;  // state_ has state_mask_ + 1 entries
  // Threads blocked in Acquire(); on a line of its own (slow paths write it).
  alignas(64) std::atomic<uint32_t> waiters_{0};
  std::unique_ptr<Shared> shared_;
  // SharedBuffer reference counts, one uint32_t per slot (used through
  // std::atomic_ref), calloc'd on the first SharedBuffer made from this pool
  // and published once; see bufpool/internal/shared_access.h.
  std::atomic<uint32_t*> shared_refs_{nullptr};
};

}  // namespace bufpool

#include "bufpool/internal/buffer_pool_inl.h"  // IWYU pragma: export

#endif  // BUFPOOL_BUFFER_POOL_H_

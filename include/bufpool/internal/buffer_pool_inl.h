// Internal: the inline fast paths of bufpool/buffer_pool.h (included at its
// end; do not include directly). Always inlined: GCC's heuristics otherwise
// move ReleaseSlot() out of line in some callers.
#ifndef BUFPOOL_INTERNAL_BUFFER_POOL_INL_H_
#define BUFPOOL_INTERNAL_BUFFER_POOL_INL_H_

#include "bufpool/buffer_pool.h"

namespace bufpool {

// The top of the cache's stack, or kNoSlot when it is empty; for the owner
// inside a section with `fast` == this.
ABSL_ATTRIBUTE_ALWAYS_INLINE inline uint32_t BufferPool::PopCached(
    internal::ThreadCache* c) {
  uint32_t n = c->count.load(std::memory_order_relaxed);
  if (n == 0) return kNoSlot;
  --n;
  const uint32_t slot = c->slots[n];
  c->count.store(n, std::memory_order_relaxed);
  // The total drops below low_water only here.
  if (n < c->low_water.load(std::memory_order_relaxed)) [[unlikely]] {
    c->low_water.store(n, std::memory_order_relaxed);
  }
  return slot;
}

// The raw pair: the cache hits of TryAcquireSlot() inline, and every miss
// or failed check left to one out-of-line call in tail position, so that a
// hit sets up no stack frame (which the C API's calls would otherwise pay).
ABSL_ATTRIBUTE_ALWAYS_INLINE inline std::byte* BufferPool::TryAcquireRaw() {
  internal::ThreadCache* const c = internal::tls_caches[cache_index_];
  {  // the section ends before the slow path, which may free `c`
    const internal::OwnerSection section(c);
    if (c->fast.load(internal::kFastOrder) == this) [[likely]] {
      const uint32_t slot = c->hot.load(std::memory_order_relaxed);
      if (slot != internal::ThreadCache::kNone) [[likely]] {
        c->hot.store(internal::ThreadCache::kNone, std::memory_order_relaxed);
        std::byte* const data = SlotData(slot);
        BUFPOOL_INTERNAL_UNPOISON(data, buffer_size_);
        // relaxed: a slot changes hands only through the depot's
        // release/acquire CASes or the caller's own synchronisation, which
        // order this store.
        State(slot).store(kSlotRaw, std::memory_order_relaxed);
        return data;
      }
      const uint32_t popped = PopCached(c);
      if (popped != kNoSlot) {
        std::byte* const data = SlotData(popped);
        BUFPOOL_INTERNAL_UNPOISON(data, buffer_size_);
        State(popped).store(kSlotRaw, std::memory_order_relaxed);
        return data;
      }
    }
  }
  return TryAcquireRawSlow();
}

// The cache hit: `fast` equal to this pool means the owner may use the cache
// without its lock (see internal::ThreadCache); relaxed loads and stores,
// plain moves on x86.
ABSL_ATTRIBUTE_ALWAYS_INLINE inline uint32_t BufferPool::TryAcquireSlot() {
  internal::ThreadCache* const c = internal::tls_caches[cache_index_];
  {  // the section ends before any slow path, which may free `c`
    const internal::OwnerSection section(c);
    if (c->fast.load(internal::kFastOrder) == this) [[likely]] {
      uint32_t slot = c->hot.load(std::memory_order_relaxed);
      if (slot != internal::ThreadCache::kNone) [[likely]] {
        // The total drops to `count`, never below low_water: nothing to
        // track.
        c->hot.store(internal::ThreadCache::kNone, std::memory_order_relaxed);
        BUFPOOL_INTERNAL_UNPOISON(SlotData(slot), buffer_size_);
        return slot;
      }
      slot = PopCached(c);
      if (slot != kNoSlot) {
        BUFPOOL_INTERNAL_UNPOISON(SlotData(slot), buffer_size_);
        return slot;
      }
    }
  }
  return AcquireSlow();
}

ABSL_ATTRIBUTE_ALWAYS_INLINE inline void BufferPool::ReleaseSlot(
    uint32_t slot) {
  internal::ThreadCache* const c = internal::tls_caches[cache_index_];
  {  // the section ends before the slow path, which may free `c`
    const internal::OwnerSection section(c);
    if (c->fast.load(internal::kFastOrder) == this) [[likely]] {
      const uint32_t hot = c->hot.load(std::memory_order_relaxed);
      if (hot == internal::ThreadCache::kNone) [[likely]] {
        BUFPOOL_INTERNAL_POISON(SlotData(slot), buffer_size_);
        c->hot.store(slot, std::memory_order_relaxed);
        return;
      }
      const uint32_t n = c->count.load(std::memory_order_relaxed);
      if (n < c->capacity) {  // the older hot slot moves down to the stack
        BUFPOOL_INTERNAL_POISON(SlotData(slot), buffer_size_);
        c->slots[n] = hot;
        c->count.store(n + 1, std::memory_order_relaxed);
        c->hot.store(slot, std::memory_order_relaxed);
        return;
      }
    }
  }
  ReleaseSlow(slot);
}

ABSL_ATTRIBUTE_ALWAYS_INLINE inline void BufferPool::ReleaseRaw(std::byte* p) {
  const uint64_t index = SlotOrHuge(p);
  // The O(1) double-release check (relaxed: see TryAcquireRaw); a pointer
  // that fails either check goes to ReleaseRawSlow(), which aborts.
  if (index >= capacity_ ||
      State(static_cast<uint32_t>(index)).load(std::memory_order_relaxed) !=
          kSlotRaw) [[unlikely]] {
    return ReleaseRawSlow(p);
  }
  const auto slot = static_cast<uint32_t>(index);
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

#endif  // BUFPOOL_INTERNAL_BUFFER_POOL_INL_H_

// Internal: the inline fast paths of bufpool/buffer_pool.h (included at its
// end; do not include directly). Always inlined, so that a handle's
// release is one call.
#ifndef BUFPOOL_INTERNAL_BUFFER_POOL_INL_H_
#define BUFPOOL_INTERNAL_BUFFER_POOL_INL_H_

#include "bufpool/buffer_pool.h"

namespace bufpool {

// The single-buffer paths. The per-CPU caches are guarded by a lock or a
// restartable sequence (src/pool/cpu_cache.h), both out of line: each call
// is one call in tail position, which the C API's entry points inherit.
ABSL_ATTRIBUTE_ALWAYS_INLINE inline std::byte* BufferPool::TryAcquireRaw() {
  return TryAcquireRawSlow();
}

ABSL_ATTRIBUTE_ALWAYS_INLINE inline uint32_t BufferPool::TryAcquireSlot() {
  return AcquireSlow();
}

ABSL_ATTRIBUTE_ALWAYS_INLINE inline void BufferPool::ReleaseSlot(
    uint32_t slot) {
  ReleaseSlow(slot);
}

ABSL_ATTRIBUTE_ALWAYS_INLINE inline void BufferPool::ReleaseRaw(std::byte* p) {
  const uint64_t index = SlotOrHuge(p);
  // The O(1) double-release check. Relaxed: a slot changes hands only
  // through the caches' locks or sequences, the depot's CASes, or the
  // caller's own synchronisation, each of which orders the state byte's
  // stores with its loads. A pointer that fails either check goes to
  // ReleaseRawSlow(), which aborts.
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

// Internal: the inline fast paths of bufpool/buffer_pool.h (included at its
// end; do not include directly). Always inlined, so that a handle's
// release is one call.
#ifndef BUFPOOL_INTERNAL_BUFFER_POOL_INL_H_
#define BUFPOOL_INTERNAL_BUFFER_POOL_INL_H_

#include "bufpool/buffer_pool.h"

namespace bufpool {

namespace internal {
// kSampled holder tracking: acquires of sampled pools left on this thread
// before the next one is recorded (src/pool/holders.cc). initial-exec: two
// loads from any module, no __tls_get_addr.
BUFPOOL_EXPORT extern __thread uint32_t t_holder_countdown
    __attribute__((tls_model("initial-exec")));
}  // namespace internal

// A kSampled pool's inline acquire counts this thread's acquires down and
// records the one that reaches 0 (out of line); nothing in other pools.
ABSL_ATTRIBUTE_ALWAYS_INLINE inline void BufferPool::CountSample(
    uint32_t slot) {
  if (holder_marks_ != nullptr) [[unlikely]] {
    if (--internal::t_holder_countdown == 0) AcquireSampled(slot);
  }
}

// The single-buffer paths. The cache hit is one restartable sequence
// (bufpool/internal/rseq.h) where the pool runs them (x86-64, glibc's rseq
// area, not a sanitizer build); every miss, and the locked caches of other
// setups, are one out-of-line call in tail position. There is no test of
// whether the pool runs sequences: where it does not, rseq_cpus_ (and
// rseq_release_cpus_) is 0, so the sequence fails at its index check, before
// it touches the cache, and the call goes out of line (glibc reserves the
// rseq area in every thread, registered or not, so the sequence's store of
// rseq_cs and its loads are harmless there).
ABSL_ATTRIBUTE_ALWAYS_INLINE inline std::byte* BufferPool::TryAcquireRaw() {
#if BUFPOOL_HAVE_RSEQ
  uint32_t slot;
  if (internal::rseq::TryPop(rseq_base_, rseq_cpus_, rseq_index_, &slot))
      [[likely]] {
    std::byte* const data = SlotData(slot);
    BUFPOOL_INTERNAL_UNPOISON(data, buffer_size_);
    CountSample(slot);
    // relaxed: see ReleaseRaw.
    State(slot).store(kSlotRaw, std::memory_order_relaxed);
    return data;
  }
#endif
  return TryAcquireRawSlow();
}

ABSL_ATTRIBUTE_ALWAYS_INLINE inline uint32_t BufferPool::TryAcquireSlot() {
#if BUFPOOL_HAVE_RSEQ
  uint32_t slot;
  if (internal::rseq::TryPop(rseq_base_, rseq_cpus_, rseq_index_, &slot))
      [[likely]] {
    BUFPOOL_INTERNAL_UNPOISON(SlotData(slot), buffer_size_);
    CountSample(slot);
    return slot;
  }
#endif
  return AcquireSlow();
}

ABSL_ATTRIBUTE_ALWAYS_INLINE inline void BufferPool::ReleaseSlot(
    uint32_t slot) {
#if BUFPOOL_HAVE_RSEQ
  BUFPOOL_INTERNAL_POISON(SlotData(slot), buffer_size_);
  // A kSampled pool's recorded slot: out of line, where the record is
  // cleared. relaxed: the mark is written only by the slot's holders, and
  // this thread holds it (src/pool/holders.h).
  if (holder_marks_ != nullptr) [[unlikely]] {
    if (holder_marks_[slot].load(std::memory_order_relaxed) != 0) {
      return ReleaseSlow(slot);
    }
  }
  // rseq_release_cpus_ is 0 for a scrubbing pool, which zeroes the buffer
  // out of line before it is published.
  if (internal::rseq::Push(rseq_base_, rseq_release_cpus_, rseq_index_,
                           &release_limit_, slot)) [[likely]] {
    return;
  }
#endif
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

inline void Buffer::Touch(absl::string_view label) const {
  if (pool_ != nullptr && pool_->holders_ != nullptr) [[unlikely]] {
    pool_->TouchSlot(index_, label);
  }
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

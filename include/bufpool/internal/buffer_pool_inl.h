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

// The single-buffer paths. The cache hit is one restartable sequence
// (bufpool/internal/rseq.h) where the pool runs them (x86-64, glibc's rseq
// area, not a sanitizer build); every miss, and the locked caches of other
// setups, are one out-of-line call in tail position.
//
// One straight path per mode. The pool's inline_index_, fixed at Create(),
// names the mode: the rseq field that indexes the caches (mm_cid or
// cpu_id), with kSampledTag in a kSampled pool, or 0 where the pool runs
// no sequences (the locked caches, caches off, sanitizer builds). Each
// mode's block runs its own sequence with its field as a constant and
// nothing of the others: mm_cid (what every kernel since 6.3 gives) is
// tested first, cpu_id (kernels before 6.3) second, so each of the two
// untracked modes costs one compare-and-branch or two before its section;
// the sampled modes follow, and 0 goes out of line without a section. A
// kAll-tracked pool keeps its field but has rseq_cpus_ 0, so its sections
// fail at their index check (glibc reserves the rseq area in every thread,
// registered or not, so a section's store of rseq_cs and its loads are
// harmless there). A kSampled pool's acquire counts this thread's acquires
// down and records the one that reaches 0 (out of line); its release of a
// recorded slot goes out of line, where the record is cleared. The mark is
// read relaxed: it is written only by the slot's holders, and this thread
// holds it (src/pool/holders.h).
ABSL_ATTRIBUTE_ALWAYS_INLINE inline uint32_t BufferPool::PopInline() {
#if BUFPOOL_HAVE_RSEQ
  using internal::rseq::kCpuIdField;
  using internal::rseq::kMmCidField;
  const uint32_t index = inline_index_;
  if (index == kMmCidField) [[likely]] {
    return internal::rseq::PopAt<kMmCidField>(rseq_base_, rseq_cpus_);
  }
  if (index == kCpuIdField) [[likely]] {
    return internal::rseq::PopAt<kCpuIdField>(rseq_base_, rseq_cpus_);
  }
  return PopInlineSampled(index);
#else
  return kNoSlot;
#endif
}

// The sampled modes, and 0 (no sequences): kept out of the untracked
// modes' blocks.
ABSL_ATTRIBUTE_ALWAYS_INLINE inline uint32_t BufferPool::PopInlineSampled(
    uint32_t index) {
#if BUFPOOL_HAVE_RSEQ
  using internal::rseq::kCpuIdField;
  using internal::rseq::kMmCidField;
  using internal::rseq::kSampledTag;
  uint32_t slot;
  if (index == (kMmCidField | kSampledTag)) {
    slot = internal::rseq::PopAt<kMmCidField>(rseq_base_, rseq_cpus_);
  } else if (index == (kCpuIdField | kSampledTag)) {
    slot = internal::rseq::PopAt<kCpuIdField>(rseq_base_, rseq_cpus_);
  } else {
    return kNoSlot;  // no sequences: out of line
  }
  if (slot != internal::rseq::kNoSlot) [[likely]] {
    if (--internal::t_holder_countdown == 0) [[unlikely]] {
      AcquireSampled(slot);
    }
  }
  return slot;
#else
  (void)index;
  return kNoSlot;
#endif
}

ABSL_ATTRIBUTE_ALWAYS_INLINE inline bool BufferPool::PushInline(uint32_t slot) {
#if BUFPOOL_HAVE_RSEQ
  using internal::rseq::kCpuIdField;
  using internal::rseq::kMmCidField;
  using internal::rseq::kSampledTag;
  // rseq_release_cpus_ is 0 for a scrubbing pool, which zeroes the buffer
  // out of line before it is published.
  const uint32_t index = inline_index_;
  if (index == kMmCidField) [[likely]] {
    return internal::rseq::PushAt<kMmCidField>(rseq_base_, rseq_release_cpus_,
                                               &release_limit_, lend_, slot);
  }
  if (index == kCpuIdField) [[likely]] {
    return internal::rseq::PushAt<kCpuIdField>(rseq_base_, rseq_release_cpus_,
                                               &release_limit_, lend_, slot);
  }
  // The sampled modes: the mark's test, then the same sequences.
  if (index == (kMmCidField | kSampledTag)) {
    if (holder_marks_[slot].load(std::memory_order_relaxed) != 0) {
      return false;
    }
    return internal::rseq::PushAt<kMmCidField>(rseq_base_, rseq_release_cpus_,
                                               &release_limit_, lend_, slot);
  }
  if (index == (kCpuIdField | kSampledTag)) {
    if (holder_marks_[slot].load(std::memory_order_relaxed) != 0) {
      return false;
    }
    return internal::rseq::PushAt<kCpuIdField>(rseq_base_, rseq_release_cpus_,
                                               &release_limit_, lend_, slot);
  }
  return false;  // no sequences: out of line
#else
  (void)slot;
  return false;
#endif
}

ABSL_ATTRIBUTE_ALWAYS_INLINE inline std::byte* BufferPool::TryAcquireRaw() {
  const uint32_t slot = PopInline();
  if (slot != kNoSlot) [[likely]] {
    std::byte* const data = SlotData(slot);
    BUFPOOL_INTERNAL_UNPOISON(data, buffer_size_);
    // relaxed: see ReleaseRaw.
    State(slot).store(kSlotRaw, std::memory_order_relaxed);
    return data;
  }
  return TryAcquireRawSlow();
}

ABSL_ATTRIBUTE_ALWAYS_INLINE inline uint32_t BufferPool::TryAcquireSlot() {
  const uint32_t slot = PopInline();
  if (slot != kNoSlot) [[likely]] {
    BUFPOOL_INTERNAL_UNPOISON(SlotData(slot), buffer_size_);
    return slot;
  }
  return AcquireSlow();
}

ABSL_ATTRIBUTE_ALWAYS_INLINE inline void BufferPool::ReleaseSlot(
    uint32_t slot) {
#if BUFPOOL_HAVE_RSEQ
  // Poisoned before the push publishes it. Without sequences (sanitizer
  // builds among them) ReleaseSlow() poisons, after a scrubbing pool's zeroing.
  BUFPOOL_INTERNAL_POISON(SlotData(slot), buffer_size_);
#endif
  if (PushInline(slot)) [[likely]]
    return;
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
  return pool_ ? pool_->SlotData(slot_) : nullptr;
}

inline size_t Buffer::size() const { return pool_ ? pool_->buffer_size_ : 0; }

ABSL_ATTRIBUTE_ALWAYS_INLINE inline void Buffer::Reset() {
  if (pool_ != nullptr) {
    pool_->ReleaseSlot(slot_);
    pool_ = nullptr;
  }
}

ABSL_ATTRIBUTE_ALWAYS_INLINE inline Buffer& Buffer::operator=(
    Buffer&& other) noexcept {
  if (this != &other) {
    Reset();
    pool_ = std::exchange(other.pool_, nullptr);
    slot_ = other.slot_;
  }
  return *this;
}

inline void Buffer::Touch(absl::string_view label) const {
  if (pool_ != nullptr && pool_->holders_ != nullptr) [[unlikely]] {
    pool_->TouchSlot(slot_, label);
  }
}

inline std::byte* Buffer::Detach() {
  if (pool_ == nullptr) return nullptr;
  pool_->State(slot_).store(BufferPool::kSlotRaw, std::memory_order_relaxed);
  std::byte* p = data();
  pool_ = nullptr;
  return p;
}

}  // namespace bufpool

#endif  // BUFPOOL_INTERNAL_BUFFER_POOL_INL_H_

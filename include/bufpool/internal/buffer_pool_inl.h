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
// setups, are one out-of-line call in tail position. There is no test of
// whether the pool runs sequences: where it does not, rseq_cpus_ (and
// rseq_release_cpus_) is 0, so the sequence fails at its index check, before
// it touches the cache, and the call goes out of line (glibc reserves the
// rseq area in every thread, registered or not, so the sequence's store of
// rseq_cs and its loads are harmless there).
//
// Which sequence: the pool's inline_index_ is compared with the mm_cid
// field first (what every kernel since 6.3 gives); anything else (cpu_id, a
// kSampled pool's tagged index, 0 where the pool runs no sequences) takes
// the second branch. A kSampled pool's acquire counts this thread's
// acquires down and records the one that reaches 0 (out of line); its
// release of a recorded slot goes out of line, where the record is cleared.
// The mark is read relaxed: it is written only by the slot's holders, and
// this thread holds it (src/pool/holders.h).
ABSL_ATTRIBUTE_ALWAYS_INLINE inline uint32_t BufferPool::PopInline() {
#if BUFPOOL_HAVE_RSEQ
  const uint32_t index = inline_index_;
  if (index == internal::rseq::kMmCidField) [[likely]] {
    // A constant field: Pop's own test folds away.
    return internal::rseq::Pop(rseq_base_, rseq_cpus_,
                               internal::rseq::kMmCidField);
  }
  // A sampled pool on mm_cid: a constant field again, so one sequence, and
  // its own straight block (likely among what is left), so that its hit
  // adds only the countdown to the untracked one, not the tests of the
  // other setups.
  if (index == (internal::rseq::kMmCidField | internal::rseq::kSampledTag))
      [[likely]] {
    const uint32_t slot = internal::rseq::Pop(rseq_base_, rseq_cpus_,
                                              internal::rseq::kMmCidField);
    if (slot != internal::rseq::kNoSlot) [[likely]] {
      if (--internal::t_holder_countdown == 0) [[unlikely]] {
        AcquireSampled(slot);
      }
    }
    return slot;
  }
  const uint32_t slot = internal::rseq::Pop(
      rseq_base_, rseq_cpus_, index & ~internal::rseq::kSampledTag);
  if ((index & internal::rseq::kSampledTag) != 0 &&
      slot != internal::rseq::kNoSlot) {
    if (--internal::t_holder_countdown == 0) AcquireSampled(slot);
  }
  return slot;
#else
  return kNoSlot;
#endif
}

ABSL_ATTRIBUTE_ALWAYS_INLINE inline bool BufferPool::PushInline(uint32_t slot) {
#if BUFPOOL_HAVE_RSEQ
  // rseq_release_cpus_ is 0 for a scrubbing pool, which zeroes the buffer
  // out of line before it is published.
  const uint32_t index = inline_index_;
  if (index == internal::rseq::kMmCidField) [[likely]] {
    return internal::rseq::Push(rseq_base_, rseq_release_cpus_,
                                internal::rseq::kMmCidField, &release_limit_,
                                lend_, slot);
  }
  // A sampled pool on mm_cid, as in PopInline: the mark's test, then the
  // same sequence as the untracked pool's (the compiler may share it).
  if (index == (internal::rseq::kMmCidField | internal::rseq::kSampledTag))
      [[likely]] {
    if (holder_marks_[slot].load(std::memory_order_relaxed) != 0) [[unlikely]] {
      return false;
    }
    return internal::rseq::Push(rseq_base_, rseq_release_cpus_,
                                internal::rseq::kMmCidField, &release_limit_,
                                lend_, slot);
  }
  if ((index & internal::rseq::kSampledTag) != 0 &&
      holder_marks_[slot].load(std::memory_order_relaxed) != 0) {
    return false;
  }
  return internal::rseq::Push(rseq_base_, rseq_release_cpus_,
                              index & ~internal::rseq::kSampledTag,
                              &release_limit_, lend_, slot);
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

// Holder tracking's per-slot records (bufpool/holders.h is the API).
//
// One Entry per slot, out of band like the pool's other per-slot state,
// allocated at Create() only when tracking is on. A tracked acquire fills
// the slot's entry (stack, thread, time) and sets `live`; the release clears
// it. Touch() and the toolkit's notes (lent to a ring, a send in flight)
// update it while the slot is out.
//
// Concurrency. Every write to an entry is made by a thread that holds the
// slot (its acquirer, its releaser, the handle's or ring's owner); the pool
// hands a slot from one holder to the next with happens-before (its caches'
// sequences and locks, the depot's CASes), so a holder sees its
// predecessors' writes. Two threads may still hold one slot at once (copies
// of a SharedBuffer on two threads; a HeldSend noting a shared slice), so
// those writers (Touch, Note) take the entry's sequence count as a lock: a
// CAS from even to odd (acquire), the fields, then a store of the next even
// value (release). The record and its clearing need no CAS: the acquirer
// and the last releaser hold the slot alone (every other holder's release
// happened before the last one), so no writer can overlap them; they store
// the odd count, fence (release), write the fields and store the even one.
// Readers (Holders(), the reports) never write: they load the count
// (acquire), copy the fields with relaxed loads, fence (acquire) and load
// the count again; an odd or changed count means a writer overlapped, and
// the copy is retried a few times, then skipped (the slot was changing
// hands: it was being acquired or released during the call). Every field is
// an atomic, so an overlapping read is a stale value, never a data race.
#ifndef BUFPOOL_SRC_POOL_HOLDERS_H_
#define BUFPOOL_SRC_POOL_HOLDERS_H_

#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "bufpool/buffer_pool.h"
#include "bufpool/internal/shared_access.h"

namespace bufpool {

class BufferPool::HolderTable {
 public:
  static constexpr int kMaxFrames = 24;
  static constexpr uint32_t kMaxTouches = 4;
  static constexpr size_t kLabelWords = 4;  // 31 bytes and a NUL
  // Entry::note: what holds the slot, when the pool alone cannot tell
  // (internal::HolderNote).
  static constexpr uint32_t kNoNote = internal::kHeldAsAcquired;
  static_assert(kNoNote == 0, "entries start as zero bytes (Zeroed)");
  static constexpr uint32_t kLent = internal::kHeldLent;
  static constexpr uint32_t kSending = internal::kHeldSending;
  static constexpr uint32_t kReserved = internal::kHeldReserved;

  struct Entry {
    std::atomic<uint32_t> seq{0};   // even: stable; odd: a writer is in
    std::atomic<uint32_t> live{0};  // 1 while out and recorded
    std::atomic<uint32_t> note{kNoNote};
    std::atomic<uint32_t> touch_count{0};  // touches made, all time
    std::atomic<int64_t> acquired_ns{0};   // CLOCK_MONOTONIC_COARSE
    std::atomic<int32_t> tid{0};
    std::atomic<uint32_t> depth{0};
    std::atomic<uintptr_t> pcs[kMaxFrames];
    std::atomic<uint64_t> touches[kMaxTouches][kLabelWords];
  };

  // A consistent copy of a live entry.
  struct Snapshot {
    uint32_t slot = 0;
    uint32_t note = kNoNote;
    int64_t acquired_ns = 0;
    int32_t tid = 0;
    uint32_t depth = 0;
    uintptr_t pcs[kMaxFrames] = {};
    std::vector<std::string> touches;
  };

  HolderTable(TrackHolders mode, uint32_t sample_every, size_t capacity);

  TrackHolders mode() const { return mode_; }
  uint32_t sample_every() const { return sample_every_; }

  // After `slot` was handed out by a tracked pool's slow path: records it
  // (kAll, or when this thread's countdown reaches 0 with kSampled). Not
  // inlined, so that the stack's first frames are the pool's, which the
  // report leaves out.
  void Acquired(const BufferPool& pool, uint32_t slot) noexcept;
  // kSampled, when this thread's countdown reached 0: restarts it and
  // records `slot`.
  void Sampled(const BufferPool& pool, uint32_t slot) noexcept;
  // Before `slot` goes back: clears its record, if any.
  void Released(uint32_t slot) noexcept {
    // relaxed: the mark is written only by holders of the slot, and this
    // thread holds it (see the file comment).
    if (marks_[slot].load(std::memory_order_relaxed) != 0) {
      Clear(entries_[slot], slot);
    }
  }
  // One byte per slot, 1 while its entry is live: what a kSampled pool's
  // inline release reads (BufferPool::holder_marks_).
  std::atomic<uint8_t>* marks() const { return marks_.get(); }
  void Touch(uint32_t slot, absl::string_view label) noexcept;
  void Note(uint32_t slot, uint32_t note) noexcept;

  // Consistent copies of every live entry (see the file comment).
  std::vector<Snapshot> Live() const;

 private:
  void Record(const BufferPool& pool, uint32_t slot) noexcept;
  void Clear(Entry& e, uint32_t slot) noexcept;
  // Takes the entry's count odd: Lock() for Touch() and Note(), whose
  // writers may overlap (two holders of one slot); LockAlone() for Record()
  // and Clear(), whose writer holds the slot alone (its acquirer, or its
  // last releaser, after every other holder's release), so that no other
  // writer can be in and a plain store does it, without the CAS.
  static uint32_t Lock(Entry& e) noexcept;
  static uint32_t LockAlone(Entry& e) noexcept;
  static void Unlock(Entry& e, uint32_t locked) noexcept {
    // release: the fields' stores happen-before a reader's acquire load
    // of the new even count.
    e.seq.store(locked + 1, std::memory_order_release);
  }

  const TrackHolders mode_;
  const uint32_t sample_every_;
  // Both from calloc: zero bytes are every field's initial value, and an
  // elastic pool's table (one entry per slot up to the ceiling) is backed
  // only where slots have been recorded.
  struct FreeDeleter {
    void operator()(void* p) const noexcept { std::free(p); }
  };
  const std::unique_ptr<Entry[], FreeDeleter> entries_;
  const std::unique_ptr<std::atomic<uint8_t>[], FreeDeleter> marks_;
  const size_t capacity_;
};

// The level a pool made with `options` tracks at: BUFPOOL_TRACK_HOLDERS
// when set to off, sampled or all (another value is named on stderr and
// ignored), else options.track_holders. InvalidArgument for a
// holder_sample_every of 0.
absl::StatusOr<TrackHolders> ResolveTrackHolders(const PoolOptions& options);

}  // namespace bufpool

#endif  // BUFPOOL_SRC_POOL_HOLDERS_H_

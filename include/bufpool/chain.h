// libbufpool: messages larger than a buffer.
//
// SharedBuffer is a counted reference to a byte range (a slice) of one pool
// buffer; BufferChain is a byte sequence made of such slices, possibly of
// many buffers; ReadFrom()/WriteTo() (bufpool/chain_io.h, included here)
// move a chain through a socket, pipe or file with readv/writev.
//
// docs/architecture.md ("A chain in memory") draws the layout.
//
// A slot goes back to its pool when the last slice of it is destroyed,
// reset, or consumed past, on whichever thread that happens.
//
// Ownership. A SharedBuffer keeps its slot out of the pool (counted in
// PoolStats::in_use) until its last copy dies, so every SharedBuffer and
// BufferChain must be gone before its pool is destroyed; ~BufferPool aborts
// with "still in use" otherwise. A chain may hold slices of several pools.
//
// Writing. Bytes a slice covers are shared and never written through it:
// Append() and ReadFrom() write only the room past the tail, and only while
// the tail is the only reference to its buffer (use_count() == 1).
//
// Thread safety. SharedBuffer copies of one buffer may be made, used and
// destroyed on any threads at once (like std::shared_ptr copies); a single
// SharedBuffer or BufferChain object is not thread-safe (like any value):
// one thread at a time, handed over through the caller's synchronisation.
//
// Costs. Copying a SharedBuffer or taking a Slice() is one atomic
// increment, dropping one a decrement (none for the last reference); neither
// allocates. Split() (and the splitters, bufpool/cursor.h) cutting one
// buffer's bytes into many chains counts their references in one increment
// per buffer when the cuts are of like size. A BufferChain holds a few slices
// inline and grows a heap ring beyond that, kept until destroyed: a reused
// chain allocates only growing.
#ifndef BUFPOOL_CHAIN_H_
#define BUFPOOL_CHAIN_H_

#include <sys/uio.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <iterator>
#include <utility>

#include "absl/base/attributes.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "bufpool/budget.h"
#include "bufpool/buffer_pool.h"
#include "bufpool/export.h"
#include "bufpool/internal/shared_access.h"

namespace bufpool {

class BufferChain;
class ReceivePack;

namespace internal {
struct ChainAccess;  // chain_inl.h: what the splitters call
}  // namespace internal

// A counted reference to bytes [data(), data() + size()) of one pool buffer.
// Copyable (each copy is one more reference) and movable (no atomic); the
// last reference destroyed returns the buffer to its pool. A default,
// moved-from or Reset() SharedBuffer holds nothing: operator bool is false,
// data() is null and size() is 0.
class BUFPOOL_EXPORT SharedBuffer {
 public:
  SharedBuffer() noexcept = default;
  // Takes `buffer` (left empty) as a slice of all of it.
  explicit SharedBuffer(Buffer&& buffer) noexcept;
  SharedBuffer(const SharedBuffer& other) noexcept;
  SharedBuffer(SharedBuffer&& other) noexcept;
  SharedBuffer& operator=(const SharedBuffer& other) noexcept;
  SharedBuffer& operator=(SharedBuffer&& other) noexcept;
  ~SharedBuffer() { Reset(); }

  // A new reference to bytes [offset, offset + length) of this slice, no
  // copy. Aborts, naming the numbers, when the range is not inside it.
  SharedBuffer Slice(size_t offset, size_t length) const;

  // The bytes; mutable_data() only for the holder of the only reference.
  const std::byte* data() const { return data_; }
  std::byte* mutable_data() const { return data_; }
  size_t size() const { return size_; }
  absl::Span<const std::byte> span() const { return {data_, size_}; }
  absl::string_view view() const;
  explicit operator bool() const { return pool_ != nullptr; }

  BufferPool* pool() const { return pool_; }
  uint32_t slot() const { return slot_; }  // the pool's slot number
  // Offset of data() from the start of its buffer.
  size_t offset() const;
  // Bytes of the buffer past the end of this slice.
  size_t room() const;
  // References to this buffer now (0: holds nothing); 1 is stable (this
  // handle is the only one), other values may change as other threads copy
  // or drop theirs, and may include references that a chain cutting this
  // buffer (Split(), the splitters) counted ahead for its next cuts.
  uint32_t use_count() const;

  // Drops this reference now (returning the buffer if it was the last).
  void Reset();

 private:
  friend class BufferChain;
  friend class ReceivePack;
  friend struct internal::ChainAccess;

  SharedBuffer(BufferPool* pool, std::byte* data, size_t size, uint32_t slot,
               uint32_t reserve) noexcept;

  // chain_inl.h says what each does ("Reserves").
  void ResetSeldomLast();
  static void ReleaseLast(BufferPool& pool, uint32_t slot);
  template <bool kReleaseInline>
  void Drop();

  [[noreturn]] void DieBadSlice(size_t offset, size_t length) const;

  BufferPool* pool_ = nullptr;
  std::byte* data_ = nullptr;
  size_t size_ = 0;
  uint32_t slot_ = 0;
  uint32_t reserve_ = 0;  // references counted ahead (chain_inl.h)
};

// A byte sequence made of SharedBuffer slices. Move-only (Clone() shares
// it). New buffers for Append(bytes) and ReadFrom() come from its pool. It
// drops each slice as soon as it is consumed past.
//
// Thread safety: one thread at a time (see the file comment); the slices it
// shares with other chains may be used and dropped on other threads.
class BUFPOOL_EXPORT BufferChain {
 public:
  // Slices held without a heap allocation.
  static constexpr uint32_t kInlineSlices = 4;
  // A run of slices of a ReceivePack's buffer charges a bound chain's
  // budget its bytes rounded up to this (bufpool/budget.h).
  static constexpr size_t kPackGranule = 64;
  // Removed in 0.4.
  ABSL_DEPRECATED("use kInlineSlices")
  static constexpr uint32_t kInlineSegments = kInlineSlices;

  // Without a pool, Append(bytes) past the room and ReadFrom() fail.
  BufferChain() noexcept : slices_(inline_) {}
  explicit BufferChain(BufferPool& pool) noexcept
      : pool_(&pool), slices_(inline_) {}
  // Bound to `budget` (bufpool/budget.h, "Accounting"), which is charged
  // for the buffers its chains keep out (each once) and packed partials by
  // their bytes: Append(bytes), AppendPacked() and ReadFrom() refuse past
  // its limit; linking slices never fails and counts a new buffer only with
  // room. The budget must outlive the chain's bytes; use it on the
  // budget's thread.
  explicit BufferChain(BufferBudget& budget) noexcept
      : pool_(&budget.pool()), budget_(&budget), slices_(inline_) {}
  // A moved-from chain is empty, with its pool and budget; the target takes
  // `other`'s. Moves keep grown slice rings (swapped, not freed), so a chain
  // moved between two owners allocates only while growing.
  BufferChain(BufferChain&& other) noexcept;
  BufferChain& operator=(BufferChain&& other) noexcept;
  BufferChain(const BufferChain&) = delete;
  BufferChain& operator=(const BufferChain&) = delete;
  ~BufferChain();

  BufferPool* pool() const { return pool_; }
  // The budget this chain charges, or nullptr.
  BufferBudget* budget() const { return budget_; }
  size_t size() const { return size_; }
  bool empty() const { return size_ == 0; }
  size_t slice_count() const { return count_; }
  // Slice i < slice_count() (checked unless NDEBUG).
  const SharedBuffer& slice(size_t i) const;
  // Removed in 0.4.
  ABSL_DEPRECATED("use slice_count()")
  size_t segment_count() const { return count_; }
  ABSL_DEPRECATED("use slice(i)")
  const SharedBuffer& segment(size_t i) const { return slice(i); }

  // Copies `bytes` to the end (the tail's room, then fresh buffers). All or
  // nothing: ResourceExhausted, the chain unchanged, when the pool or the
  // budget (named, with its limit) cannot supply every buffer needed.
  absl::Status Append(absl::Span<const std::byte> bytes);
  absl::Status Append(absl::string_view bytes) {
    return Append(absl::MakeConstSpan(
        reinterpret_cast<const std::byte*>(bytes.data()), bytes.size()));
  }
  // Links a slice to the end, no copy (an empty slice is dropped).
  void Append(SharedBuffer&& slice);
  void Append(const SharedBuffer& slice) { Append(SharedBuffer(slice)); }
  // Moves `other`'s slices to the end. If std::bad_alloc, both unchanged.
  void Append(BufferChain&& other);
  // Links the first `length` bytes of a filled buffer, no copy; the chain
  // takes the buffer. Aborts when length > buffer.size().
  void Append(Buffer&& buffer, size_t length);

  // The slices' bytes in order, as spans: for (auto part : chain.spans()).
  class SpanRange;
  SpanRange spans() const;

  // Points out[0, k) at the first k slices, for writev; returns k.
  size_t FillIovecs(absl::Span<iovec> out) const;

  // Drops the first min(n, size()) bytes and the slices consumed past.
  void Consume(size_t n);
  // Removes the first min(n, size()) bytes and returns them, no copy, as a
  // chain with the same pool and budget (append it to an unbound chain to
  // leave the budget).
  BufferChain Split(size_t n);
  // Copies the first bytes into `out`; returns how many.
  size_t CopyTo(absl::Span<std::byte> out) const;
  // A second chain over the same bytes, no copy; charged to the same budget.
  BufferChain Clone() const;
  // Drops every slice (keeps the slice ring's capacity).
  void Clear();
  // Makes space for `slices` slices, so linking up to that many cannot
  // throw. Throws std::bad_alloc, the chain unchanged.
  void Reserve(size_t slices);

  // ---- Receiving: the one primitive for I/O sources ----
  // Every source of bytes (ReadFrom(), ProvidedBufferRing::Take(), Asio, a
  // user's loop) goes through these, which own the copy-or-link policy:
  //   auto room = chain.Preallocate();           // the tail's room, or empty
  //   n = read(fd, room.data(), room.size());
  //   chain.Postallocate(n);                     // n <= room.size(), or abort
  //   chain.Receive(filled, n, {.copy_below = bs / 8, .pack = &pack});
  absl::Span<std::byte> Preallocate() const;
  void Postallocate(size_t n);

  struct ReceiveOptions {
    size_t copy_below = 0;        // fewer bytes are copied (0: never)
    ReceivePack* pack = nullptr;  // where chains under copy_below live
  };
  // Takes the first `n` bytes of a filled `buffer` by the policy: copied
  // (into the tail's room, the pack, or fresh buffers) or linked. True when
  // the chain took `buffer` (now empty); false when copied (reuse `buffer`)
  // or n is 0. Aborts when n > buffer.size(). Throws std::bad_alloc, nothing
  // changed, when the slice ring cannot grow; never after
  // Reserve(slice_count() + 2).
  bool Receive(Buffer& buffer, size_t n, const ReceiveOptions& options);
  // Grows the tail slice over n bytes at `at` when it ends there in the same
  // buffer (false, nothing changed, otherwise). The caller vouches that no
  // other slice covers them: for a source that shares one buffer.
  bool GrowTail(const std::byte* at, size_t n);

  // ---- Memory that follows bytes ----
  // A chain filled by the receive paths holds buffers for at most B + 2 *
  // buffer_size bytes for its B bytes (docs/uring.md, installed in
  // share/doc/bufpool); chains built by linking slices (Split, Clone) can
  // pin more, and Compact() packs them.

  // Buffer bytes this chain keeps out of its pools: a buffer's size per run
  // of adjacent slices of it, so a 100-byte slice of a pack buffer that 40
  // chains share counts 4 KiB: the most it could keep out alone (the pool's
  // in_use says what they keep together, a budget what its chains keep
  // together, budget.h). O(slice_count()).
  size_t pinned_bytes() const;
  // Room after the tail that Append(bytes) fills first: 0 unless the chain
  // holds the only reference to the tail's buffer.
  size_t tail_room() const { return TailRoom(); }
  ABSL_DEPRECATED("an emptied chain keeps no buffer: always false, gone in 0.4")
  bool keeps_room() const { return false; }
  // Copies the bytes of buffers the chain holds less than half of into as
  // few fresh buffers as they need. All or nothing: ResourceExhausted when
  // the pool cannot supply them, FailedPrecondition without a pool.
  absl::Status Compact();

  // Copies `bytes` into `pack`'s shared buffer after the chain's tail when
  // that is the pack's, with room; else (or at 4 slices) moves the chain's
  // bytes there too, one slice, and lets go of what they pinned. False,
  // nothing changed, when that would copy over buffer_size / 8 of the
  // chain's bytes, with no buffer free, or when the chain's budget has no
  // room for the bytes (rounded up to kPackGranule). May throw bad_alloc.
  bool AppendPacked(absl::Span<const std::byte> bytes, ReceivePack& pack);

 private:
  friend struct internal::ChainAccess;

  static constexpr uint32_t kMaxReserve = 64;  // per handle (chain_inl.h)
  static uint32_t PackCharge(size_t bytes);

  SharedBuffer& At(size_t i) const;
  size_t TailRoom() const;
  static void Place(SharedBuffer& at, SharedBuffer&& s);
  SharedBuffer ShareFront(size_t n, size_t cut);
  void SplitInto(BufferChain& first, size_t n);
  void SplitSlow(BufferChain& first, size_t n);
  void PushBack(SharedBuffer&& s);
  void PopFront();
  void PopBack();
  static bool SameBuffer(const SharedBuffer& a, const SharedBuffer& b);
  void PushBackBudgeted(SharedBuffer&& s);
  void PushFresh(SharedBuffer&& s);
  size_t LinkRun(const SharedBuffer& s, uint32_t owner, size_t room);
  size_t UnlinkRun(BufferPool* pool, uint32_t slot, bool ends, bool* pack);
  void PopFrontBudgeted();
  void PopBackBudgeted();
  size_t ReleaseRuns();
  size_t ChargeRuns(size_t credit);
  size_t ReleasableBytes() const;
  size_t PackedTarget() const;
  void RecountPacked();
  void Settle(size_t charge, size_t release);
  void ReleaseAll();
  size_t CompactNeed(size_t bs, bool* any) const;
  BufferChain CompactInto(absl::Span<Buffer> fresh);
  Buffer AcquireFresh();
  void Grow() { GrowTo(cap_ * 2); }
  void GrowTo(uint32_t cap);  // cap: a power of two > cap_
  void ReserveSlow(size_t slices);
  void AppendFilled(Buffer&& buffer, size_t n);
  void ConsumeSlow(size_t n);
  bool ReceiveSlow(Buffer& buffer, size_t n, const ReceiveOptions& options);
  absl::Status AppendSlow(absl::Span<const std::byte> bytes);
  template <typename Fn>
  void ForEachRun(Fn&& fn) const;
  bool AppendPackedInline(const std::byte* src, size_t len, ReceivePack& pack);
  bool AppendPackedSlow(const std::byte* src, size_t len, ReceivePack& pack,
                        bool arrived);
  [[noreturn]] static void DieTooLong(size_t length, size_t size);
  [[noreturn]] void DieBadPostallocate(size_t n) const;
  [[noreturn]] void DieBadIndex(size_t i) const;
  void StealFrom(BufferChain& other) noexcept;
  BufferChain& MoveAssignSlow(BufferChain& other) noexcept;
  void DestroySlow() noexcept;
  void FreeHeap() noexcept;

  BufferPool* pool_ = nullptr;
  BufferBudget* budget_ = nullptr;  // charged for the buffers pinned
  size_t size_ = 0;
  SharedBuffer* slices_;  // inline_ or a heap ring of cap_; slice i is At(i)
  uint32_t cap_ = kInlineSlices;  // a power of two
  uint32_t head_ = 0;
  uint32_t count_ = 0;
  // Bytes charged to budget_ for slices of pack buffers (RecountPacked()).
  uint32_t packed_ = 0;
  union {
    SharedBuffer inline_[kInlineSlices];
  };
};

// One buffer that the short partial messages of many chains share (as Redis
// shares its query buffer): a connection holding 100 bytes of a half-read
// command pins 100 bytes of it, not a buffer. Worst case, one stalled
// partial per pack buffer: a buffer per connection, as without packing.
//
// Thread safety: the receiving loop's thread; its slices may travel.
class BUFPOOL_EXPORT ReceivePack {
 public:
  explicit ReceivePack(BufferPool& pool) noexcept : pool_(&pool) {}
  ~ReceivePack() { Drop(); }
  ReceivePack(const ReceivePack&) = delete;
  ReceivePack& operator=(const ReceivePack&) = delete;

  BufferPool& pool() const { return *pool_; }
  // Any thread (a relaxed snapshot, for reports; see MakeRoom()).
  bool holds_buffer() const { return held_.load(std::memory_order_relaxed); }

 private:
  friend class BufferChain;

  // References added at once, handed to slices without an atomic.
  static constexpr uint32_t kRefBatch = 256;

  bool MakeRoom(size_t len);  // false when the pool has no buffer
  void Drop() noexcept;

  BufferPool* pool_;
  SharedBuffer buf_;    // the pack's own reference
  uint32_t spare_ = 0;  // more references counted, held by no slice yet
  uint32_t used_ = 0;   // bytes slices cover: written only past them
  std::atomic<bool> held_{false};  // bool(buf_), for holds_buffer()
};

}  // namespace bufpool

#include "bufpool/chain_io.h"            // IWYU pragma: export
#include "bufpool/internal/chain_inl.h"  // IWYU pragma: export

#endif  // BUFPOOL_CHAIN_H_

// libbufpool: messages larger than a buffer.
//
// SharedBuffer is a counted reference to a byte range (a slice) of one pool
// buffer; BufferChain is a byte sequence made of such slices, possibly of
// many buffers; ReadFrom()/WriteTo() move a chain through a socket, pipe or
// file with readv/writev (sendmsg with MSG_NOSIGNAL on sockets).
//
// Data layout. Three slices of two pool buffers, making one chain of 5000
// bytes (buffer_size 4096); the slot counts live out of band, in the pool:
//
//   BufferChain msg:  [ seg 0 ]---------[ seg 1 ]-------------[ seg 2 ]
//                        |                 |                     |
//                   data,size=4080     data,size=16          data,size=904
//                        v                 v                     v
//   slot 7:  | 16 consumed | 4080 bytes of seg 0           |
//   slot 9:  | seg 1 (16) | seg 2 (904)    | room (3176)   |
//
//   pool refs[7] == 1, refs[9] == 2 (seg 1 and seg 2 share slot 9)
//
// A slot goes back to its pool when the last slice of it is destroyed,
// reset, or consumed past, on whichever thread that happens.
//
// Ownership. A SharedBuffer keeps its slot out of the pool (counted in
// PoolStats::in_use) until its last copy dies, so every SharedBuffer and
// BufferChain must be gone before its pool is destroyed; ~BufferPool aborts
// with "still in use" otherwise. A chain may hold slices of several pools.
//
// Writing. Bytes a slice covers are shared with every other slice of that
// buffer and are not written through it by this library: an Append() of
// bytes copies into the tail buffer's room only while the chain's tail is
// the only reference to that buffer (use_count() == 1), so no other slice,
// chain or thread can see the bytes it writes; otherwise it starts a fresh
// buffer. ReadFrom() follows the same rule.
//
// Thread safety. SharedBuffer copies of one buffer may be made, used and
// destroyed on any threads at once (like std::shared_ptr copies); a single
// SharedBuffer or BufferChain object is not thread-safe (like any value):
// one thread at a time, handed over through the caller's synchronisation.
//
// Costs. Copying a SharedBuffer or taking a Slice() is one uncontended
// atomic increment; destroying one is one atomic decrement, or none when it
// is the last reference. Neither allocates. A BufferChain keeps up to
// kInlineSegments slices inline and grows a heap ring beyond that, which it
// keeps until destroyed, so a chain reused for many messages allocates only
// while growing.
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

// A counted reference to bytes [data(), data() + size()) of one pool buffer.
// Copyable (each copy is one more reference) and movable (no atomic); the
// last reference destroyed returns the buffer to its pool. A default,
// moved-from or Reset() SharedBuffer holds nothing: operator bool is false,
// data() is null and size() is 0.
class BUFPOOL_EXPORT SharedBuffer {
 public:
  SharedBuffer() noexcept = default;
  // Takes the buffer out of `buffer` (which becomes empty): a slice of the
  // whole buffer, [0, buffer_size). An empty handle gives an empty slice.
  explicit SharedBuffer(Buffer&& buffer) noexcept;
  SharedBuffer(const SharedBuffer& other) noexcept;
  SharedBuffer(SharedBuffer&& other) noexcept
      : pool_(std::exchange(other.pool_, nullptr)),
        data_(std::exchange(other.data_, nullptr)),
        size_(std::exchange(other.size_, 0)),
        slot_(other.slot_) {}
  SharedBuffer& operator=(const SharedBuffer& other) noexcept;
  SharedBuffer& operator=(SharedBuffer&& other) noexcept;
  ~SharedBuffer() { Reset(); }

  // A new reference to bytes [offset, offset + length) of this slice: the
  // same buffer, no copy. Aborts, naming the numbers, when the range does
  // not lie inside this slice (or this holds nothing).
  SharedBuffer Slice(size_t offset, size_t length) const;

  // The bytes. Not to be written through: other slices may share them (see
  // "Writing" in the file comment). mutable_data() is for the holder of the
  // only reference (use_count() == 1), who may fill the buffer.
  const std::byte* data() const { return data_; }
  std::byte* mutable_data() const { return data_; }
  size_t size() const { return size_; }
  absl::Span<const std::byte> span() const { return {data_, size_}; }
  absl::string_view view() const {
    return {reinterpret_cast<const char*>(data_), size_};
  }
  explicit operator bool() const { return pool_ != nullptr; }

  BufferPool* pool() const { return pool_; }
  uint32_t slot() const { return slot_; }  // the pool's slot number
  // Offset of data() from the start of its buffer.
  size_t offset() const {
    return pool_ ? static_cast<size_t>(data_ - pool_->SlotData(slot_)) : 0;
  }
  // Bytes of the buffer past the end of this slice.
  size_t room() const {
    return pool_ ? pool_->buffer_size() - offset() - size_ : 0;
  }
  // References to this buffer right now (0 when this holds nothing). Exact
  // only when no other thread copies or drops one meanwhile; 1 is stable
  // (no one else holds a reference to copy).
  uint32_t use_count() const;

  // Drops this reference now (returning the buffer if it was the last).
  void Reset();

 private:
  friend class BufferChain;
  friend class ReceivePack;

  [[noreturn]] void DieBadSlice(size_t offset, size_t length) const;

  BufferPool* pool_ = nullptr;
  std::byte* data_ = nullptr;
  size_t size_ = 0;
  uint32_t slot_ = 0;
};

// A byte sequence made of SharedBuffer slices. Move-only (Clone() shares
// it). New buffers for Append(bytes) and ReadFrom() come from the pool given
// at construction. The chain never holds an empty slice, never copies bytes
// it can link, and drops each slice as soon as it is consumed past, so a
// buffer goes back to its pool when no slice of it is left.
//
// Thread safety: one thread at a time (see the file comment); the slices it
// shares with other chains may be used and dropped on other threads.
class BUFPOOL_EXPORT BufferChain {
 public:
  // Slices held without a heap allocation.
  static constexpr uint32_t kInlineSegments = 4;

  // A chain with no pool: it can link slices, but Append(bytes) beyond the
  // tail's room and ReadFrom() fail with FailedPrecondition.
  BufferChain() noexcept : segs_(inline_) {}
  explicit BufferChain(BufferPool& pool) noexcept
      : pool_(&pool), segs_(inline_) {}
  // A chain bound to `budget` (bufpool/budget.h): it draws fresh buffers
  // from the budget's pool (its reserve first) and charges the budget for
  // every buffer it pins, by the rule of pinned_bytes(), until it drops
  // them. Append(bytes) and ReadFrom() refuse, with ResourceExhausted
  // naming the budget, what would pin a buffer past its max_bytes; linking
  // slices (Append of a SharedBuffer, Buffer or chain) never refuses and is
  // charged past the limit. The budget must outlive the chain while it
  // holds bytes, and the chain is used on the budget's thread.
  explicit BufferChain(BufferBudget& budget) noexcept
      : pool_(&budget.pool()), budget_(&budget), segs_(inline_) {}
  // A moved-from chain is empty (and keeps its pool and budget: the slices
  // move with the charge they made, so the binding moves with them; a move
  // assignment takes `other`'s pool and budget). Move assignment drops
  // the target's slices first and frees no grown slice ring: when both
  // chains have one they swap them (`other` keeps the target's, empty);
  // when only the target has one it keeps it and takes `other`'s slices
  // into it. So a chain moved back and forth between two owners (a queue
  // and a send) allocates only while growing.
  // An empty chain is constructed, moved and destroyed without a call.
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
  // Slice i, 0 <= i < slice_count(). In builds without NDEBUG an i outside
  // that range aborts, naming the numbers; with NDEBUG (the hot path has no
  // check) it is undefined.
  const SharedBuffer& slice(size_t i) const;
  // Deprecated, removed in 0.4: slice_count() and slice(i), by their names
  // before 0.3.
  ABSL_DEPRECATED("use slice_count()")
  size_t segment_count() const { return count_; }
  ABSL_DEPRECATED("use slice(i)")
  const SharedBuffer& segment(size_t i) const { return slice(i); }

  // Copies `bytes` to the end: into the tail buffer's room while the chain
  // holds the only reference to it, then into fresh buffers from pool(). All
  // or nothing: when the pool cannot supply every buffer needed, or the
  // chain's budget would pass its max_bytes (the message names the budget
  // and its limit), returns ResourceExhausted and the chain is unchanged
  // (buffers taken meanwhile go back).
  absl::Status Append(absl::Span<const std::byte> bytes);
  absl::Status Append(absl::string_view bytes) {
    return Append(absl::MakeConstSpan(
        reinterpret_cast<const std::byte*>(bytes.data()), bytes.size()));
  }
  // Links a slice to the end, no copy (an empty slice is dropped).
  void Append(SharedBuffer&& slice);
  void Append(const SharedBuffer& slice) { Append(SharedBuffer(slice)); }
  // Moves every slice of `other` to the end; `other` becomes empty. All or
  // nothing: when growing this chain's slice ring throws std::bad_alloc,
  // both chains are unchanged.
  void Append(BufferChain&& other);
  // Links the first `length` bytes of a buffer the caller filled (say, by a
  // read into it), no copy; the chain takes the buffer (length 0: it goes
  // back to its pool). Aborts when length > buffer.size().
  void Append(Buffer&& buffer, size_t length);

  // The slices' bytes in order, as spans: for (auto part : chain.spans()).
  class SpanRange;
  SpanRange spans() const;

  // Points out[0, k) at the first k = min(slice_count(), out.size())
  // slices, for writev/sendmsg; returns k. The chain is not changed.
  size_t FillIovecs(absl::Span<iovec> out) const;

  // Drops the first min(n, size()) bytes; slices consumed past are dropped
  // at once (a buffer with no slice left goes back to its pool), so an
  // emptied chain pins no buffer. Consuming a one-slice chain whole is
  // inline.
  void Consume(size_t n);
  // Removes the first min(n, size()) bytes and returns them as a chain with
  // the same pool and budget (charged for the buffers it pins), without
  // copying: whole slices move, and a slice cut in two becomes two
  // references to its buffer. Bytes kept beyond the budget's owner (a value
  // a server stores) leave the budget when appended to an unbound chain:
  // BufferChain kept(pool); kept.Append(chain.Split(n));
  BufferChain Split(size_t n);
  // Copies the first min(size(), out.size()) bytes into `out`; returns how
  // many. The chain is not changed.
  size_t CopyTo(absl::Span<std::byte> out) const;
  // A second chain over the same bytes: one more reference per slice, no
  // copy; bound to the same budget, which it charges again for the
  // buffers it pins (never refused).
  BufferChain Clone() const;
  // Drops every slice (keeps the slice ring's capacity).
  void Clear();
  // Makes room for `slices` slices in all, so that linking slices up to
  // that count allocates nothing (and cannot throw). Throws std::bad_alloc,
  // the chain unchanged, when the grown ring cannot be allocated.
  void Reserve(size_t slices);

  // ---- Receiving: the one primitive for I/O sources ----
  //
  // Every way bytes arrive (ReadFrom(), ProvidedBufferRing::Take(), the
  // Asio read path, a user's own loop) goes through these, which own the
  // copy-or-link policy that keeps memory following bytes:
  //
  //   auto room = chain.Preallocate();           // where bytes may go now
  //   n = read(fd, room.data(), room.size());    // (or readv with fresh
  //   chain.Postallocate(n);                     //  buffers after it)
  //
  //   chain.Receive(filled, n, {.copy_below = bs / 8, .pack = &pack});
  //
  // Preallocate() is the tail's room (tail_room() bytes after the tail
  // slice, which only this chain can see), empty when there is none: no
  // buffer is taken. Postallocate(n) makes the first n bytes written there
  // part of the chain (n <= Preallocate().size(); aborts otherwise).
  absl::Span<std::byte> Preallocate() const;
  void Postallocate(size_t n);

  struct ReceiveOptions {
    // Bytes fewer than this are copied rather than linked (0: never copy;
    // every Receive() links).
    size_t copy_below = 0;
    // Where short partials of an empty chain (under copy_below in all) are
    // packed; nullptr: not packed.
    ReceivePack* pack = nullptr;
  };
  // Takes the first `n` bytes of `buffer`, which a source filled (a read
  // into a fresh buffer, the kernel into a ring's), by the policy. With
  // copying on (copy_below != 0): into the tail's room if they fit; else,
  // for an empty chain (or one whose tail is the pack's) that stays under
  // copy_below, packed into `pack`; else, when the tail has some room,
  // into that room and a fresh buffer of pool(), so no room is left empty
  // inside the chain. Otherwise (copying off, a dry pool, no pool) `buffer`
  // is linked, no copy, and its room after the n bytes takes the next
  // small receives. Returns true when the chain took `buffer` (it is empty
  // now), false when the bytes were copied (`buffer` unchanged: the caller
  // may reuse it at once) or n is 0; aborts when n > buffer.size(). Throws
  // std::bad_alloc, nothing changed, when the slice ring must grow and
  // cannot; never after Reserve(slice_count() + 2).
  bool Receive(Buffer& buffer, size_t n, const ReceiveOptions& options);
  // For a source that lends one buffer to many chains (an incremental
  // ring): when the tail slice ends at `at`, in the same buffer with at
  // least n bytes of it after, the tail grows over them (no new
  // reference) and this returns true; false, nothing changed, otherwise.
  // The caller vouches that those bytes are this chain's next ones and
  // that no other slice covers them.
  bool GrowTail(const std::byte* at, size_t n);

  // ---- Memory that follows bytes ----
  //
  // The bound. A chain that holds B bytes received through the library's
  // receive paths (ProvidedBufferRing::Take with copy_below on, ReadFrom,
  // the Asio read path in bufpool/asio.h) holds buffers of its own for at
  // most B + 2 * buffer_size bytes (a partly consumed head buffer, a partly
  // filled tail), however the bytes arrived: small receives are copied
  // into the tail's room instead of linking a buffer each, and an empty
  // chain holds no buffer at all. A ProvidedBufferRing packs small
  // receives that find no room of the chain's own into one buffer it
  // shares among its connections (as Redis shares its query buffer), so a
  // connection holding a short partial message usually pins about its
  // bytes, not a buffer (see ProvidedBufferRing's "Memory" for the worst
  // case). Chains built by linking slices (Split, Clone, Append of slices)
  // can pin much more; Compact() packs them.

  // Buffer bytes this chain keeps out of its pools: the buffer size of each
  // buffer it holds a slice of, a buffer counted once per run of adjacent
  // slices of it (slices of one buffer are adjacent unless the caller
  // linked them apart, when this overcounts; a buffer shared with other
  // chains counts whole). O(slice_count()).
  size_t pinned_bytes() const;
  // Room after the tail slice that Append(bytes) would fill before taking a
  // fresh buffer: 0 unless the chain holds the only reference to the tail's
  // buffer (so no other slice, chain, thread or the kernel can see it); 0
  // for an empty chain.
  size_t tail_room() const { return TailRoom(); }
  // Deprecated, removed in 0.4: always false, since an emptied chain keeps
  // no buffer (0.3).
  ABSL_DEPRECATED("an emptied chain keeps no buffer; this is always false")
  bool keeps_room() const { return false; }
  // Copies the bytes of every buffer the chain holds less than half of (a
  // run of adjacent slices of one buffer) into as few fresh buffers of
  // pool() as those bytes need, and links the rest as they are; the bytes
  // are unchanged, the copied-from buffers are dropped. All or nothing:
  // ResourceExhausted (the chain unchanged) when the pool cannot supply the
  // buffers, FailedPrecondition when there is something to copy and the
  // chain has no pool. Throws std::bad_alloc, the chain unchanged, when the
  // new slice ring cannot be allocated.
  absl::Status Compact();

  // Copies `bytes` (at most the pack's buffer_size) into `pack`'s shared
  // buffer and links them as a slice of it, or grows the tail slice when
  // it already ends where they land: for a short partial message that
  // should pin about its bytes, not a buffer (see ReceivePack). Only into
  // an empty chain, or one whose tail is a slice of the pack's current
  // buffer; false, nothing changed, otherwise, and when the pack's buffer
  // is full for a non-empty chain or its pool has no buffer for a new one.
  // Throws std::bad_alloc, nothing changed, when the slice ring cannot
  // grow. Inline for an empty chain while the pack's buffer has room.
  bool AppendPacked(absl::Span<const std::byte> bytes, ReceivePack& pack);

 private:
  SharedBuffer& At(size_t i) const;
  size_t TailRoom() const;
  void PushBack(SharedBuffer&& s);
  void PopFront();
  void PopBack();
  static bool SameBuffer(const SharedBuffer& a, const SharedBuffer& b);
  // Inline (below): a bound chain's receive and consume paths call them
  // once per buffer.
  void ChargeLink(const SharedBuffer& s);
  void PopFrontBudgeted();
  void PopBackBudgeted();
  // Releases budget_'s charge for every run of this chain's slices: for
  // slices that leave in bulk.
  void ReleaseAll();
  Buffer TakeFresh();
  void Grow() { GrowTo(cap_ * 2); }
  void GrowTo(uint32_t cap);  // cap: a power of two > cap_
  void ReserveSlow(size_t slices);
  void AppendFilled(Buffer&& buffer, size_t n);
  void ConsumeSlow(size_t n);
  template <typename Fn>
  void ForEachRun(Fn&& fn) const;
  bool AppendPackedInline(const std::byte* src, size_t len, ReceivePack& pack);
  bool AppendPackedSlow(const std::byte* src, size_t len, ReceivePack& pack);
  [[noreturn]] static void DieTooLong(size_t length, size_t size);
  [[noreturn]] void DieBadPostallocate(size_t n) const;
  [[noreturn]] void DieBadIndex(size_t i) const;
  // Takes other's slices and storage; *this must be empty, with inline
  // storage.
  void StealFrom(BufferChain& other) noexcept;
  BufferChain& MoveAssignSlow(BufferChain& other) noexcept;
  void DestroySlow() noexcept;
  void FreeHeap() noexcept;

  BufferPool* pool_ = nullptr;
  BufferBudget* budget_ = nullptr;  // charged for the buffers pinned
  size_t size_ = 0;
  // The slices are At(0) .. At(count_ - 1); every other entry holds
  // nothing.
  SharedBuffer* segs_;              // inline_ or a heap ring of cap_ entries
  uint32_t cap_ = kInlineSegments;  // a power of two
  uint32_t head_ = 0;
  uint32_t count_ = 0;
  SharedBuffer inline_[kInlineSegments];
};

// One buffer that the short partial messages of many chains share, as
// Redis shares its query buffer among clients: BufferChain::AppendPacked()
// copies a few bytes into it and links them as a slice, so a connection
// holding 100 bytes of a half-read command pins 100 bytes of it, not a
// buffer of its own. A ProvidedBufferRing keeps one for its connections.
//
// The pack writes only past the bytes its slices cover, so chains reading
// their slices on other threads never see a write; once every slice of its
// buffer is gone it fills it again from the start, and when the buffer is
// full while slices remain it takes a fresh one from the pool (the old one
// goes back with its last slice). A buffer is pinned by its longest-lived
// slice: in the worst case (one stalled partial per pack buffer) that is a
// buffer per connection, as without packing.
//
// Thread safety: one thread at a time (the receiving loop's); the slices it
// hands out may be used and dropped on any thread.
class BUFPOOL_EXPORT ReceivePack {
 public:
  explicit ReceivePack(BufferPool& pool) noexcept : pool_(&pool) {}
  ~ReceivePack() { Drop(); }
  ReceivePack(const ReceivePack&) = delete;
  ReceivePack& operator=(const ReceivePack&) = delete;

  BufferPool& pool() const { return *pool_; }
  // Whether the pack holds a buffer now (for tests and statistics).
  bool holds_buffer() const { return static_cast<bool>(buf_); }

 private:
  friend class BufferChain;

  // References added to the buffer's count at once and handed to slices
  // one at a time without an atomic (see AppendPackedInline()).
  static constexpr uint32_t kRefBatch = 256;

  // Makes the pack's buffer one with room for `len` bytes; false when the
  // pool has none free.
  bool MakeRoom(size_t len);
  // Gives back the buffer's spare references and the pack's own.
  void Drop() noexcept;

  BufferPool* pool_;
  // The pack's own reference to the whole buffer, and `spare_` more that
  // its count already includes and no slice holds yet.
  SharedBuffer buf_;
  uint32_t spare_ = 0;
  // Bytes of the buffer that slices cover (or covered): the pack writes
  // only past them.
  uint32_t used_ = 0;
};

// ---- I/O
// ---------------------------------------------------------------------
//
// Status codes, to branch on:
//   kUnavailable         `fd` is non-blocking and has nothing to read / no
//                        room to write now (EAGAIN): retry when it is ready;
//                        the chain is unchanged.
//   kFailedPrecondition  the connection is gone: the peer closed it or reset
//                        it (EPIPE, ECONNRESET). SIGPIPE is never raised.
//   kResourceExhausted   (ReadFrom) the pool has no free buffer, or the
//                        chain's budget allows none more and the tail has
//                        no room (the message names the budget and its
//                        limit; nothing was read).
//   kInvalidArgument     a bad descriptor (EBADF), or max_bytes == 0.
//   others               the system's error (EIO, ...); the message names
//                        the call and the system's words.
// EINTR is retried.

// Reads up to `max_bytes` (> 0) from `fd` with one readv, into the tail's
// room (when the chain holds the only reference to the tail buffer) and
// then into fresh buffers from chain.pool() (at most 64 per call), appended
// to `chain`. Returns the bytes read, 0 at end of file. Buffers the read did
// not fill go straight back. When the pool (or the chain's budget) has
// fewer buffers than max_bytes needs, it reads into those it has;
// ResourceExhausted only when it has none (and there is no room).
// InvalidArgument for max_bytes == 0, FailedPrecondition for a chain without a
// pool.
BUFPOOL_EXPORT absl::StatusOr<size_t> ReadFrom(int fd, BufferChain& chain,
                                               size_t max_bytes);
// The same, each fresh buffer the read filled taken by
// BufferChain::Receive() with `options`: with a ReceivePack and copy_below,
// a short read into an empty chain (a half-sent command) pins about its
// bytes, not a buffer; the buffer goes straight back.
BUFPOOL_EXPORT absl::StatusOr<size_t> ReadFrom(
    int fd, BufferChain& chain, size_t max_bytes,
    const BufferChain::ReceiveOptions& options);

// Writes `chain` to `fd` (sendmsg with MSG_NOSIGNAL on a socket, writev
// with SIGPIPE blocked on anything else), at most 256 slices per call,
// looping until the chain is empty or `fd` would block, and consumes what
// was written. Returns the bytes written: all of them on a blocking fd, a
// part on a non-blocking one whose buffer filled; kUnavailable when not one
// byte fit. On an error the bytes written before it are consumed too and the
// rest stay in the chain. An empty chain writes nothing and returns 0.
BUFPOOL_EXPORT absl::StatusOr<size_t> WriteTo(int fd, BufferChain& chain);

}  // namespace bufpool

#include "bufpool/internal/chain_inl.h"  // IWYU pragma: export

#endif  // BUFPOOL_CHAIN_H_

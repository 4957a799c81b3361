// TokenRing: the shared-memory half of a BufferChannel (bufpool/channel.h).
// A single-producer single-consumer ring of 8-byte tokens in a small sealed
// memfd that several processes map, with a futex for a receiver that sleeps
// and an eventfd for one that waits in an event loop. It knows nothing of
// pools: BufferChannel exports a buffer to a token before Push() and imports
// it after Front().
//
// Layout of the memfd (each part on its own 128-byte block, so that the
// adjacent-line prefetcher does not pull one side's line with the other's):
//
//   0     Header   magic, version, capacity, the pool's identity (fixed)
//   128   tail     tokens ever pushed; written by the sender only
//   256   head     tokens ever taken; written by the receiver only
//   384   waiting  kNone / kSleeping / kArmed: how the receiver waits;
//                  also its futex word
//   512   slots    capacity tokens; slot i holds token number i % capacity
//
// Invariants (the sender writes tail and the slots, the receiver head):
//   head <= tail <= head + capacity;
//   slots [head, tail) (mod capacity) hold tokens pushed and not taken;
//   tail and head only grow (64-bit: they never wrap in practice), so a
//   stale copy of either is a conservative one: a sender that read an old
//   head sees less room, a receiver that read an old tail sees fewer
//   tokens. Each object keeps such copies (cached_head_, cached_tail_) and
//   reloads the shared index only when its copy says full or empty. The
//   roles may move between objects and processes (one at a time), so a
//   receiver's copy of tail may even lag head, which other receivers
//   advanced: "empty" is head >= the copy, never head == the copy.
//
// Memory ordering:
//   Push: slot store (relaxed), tail.store(release): the receiver's
//     tail.load(acquire) that sees the new tail sees the slot.
//   Pop: head.store(release) after the slot was read: the sender's
//     head.load(acquire) that sees it overwrites the slot only after that
//     read.
//   Waking (Dekker): the receiver stores `waiting`, a seq_cst fence, then
//     reloads tail; the sender stores tail, a seq_cst fence, then loads
//     `waiting`. The two fences are ordered in the single total order, so
//     either the receiver's reload sees the new tail (and it does not
//     sleep) or the sender's load sees the receiver waiting (and wakes it):
//     no lost wake-up. A sender that sees kNone pays one fence and a load
//     of a line nobody writes while the receiver polls. ThreadSanitizer
//     does not model fences (-Wtsan says so): it checks the slots'
//     publication, which the acquire/release pairs order, not the
//     wake-ups, which only the fences order.
//
// Thread and process safety: one thread (in any process) may be the sender
// at a time and one the receiver at a time; Push()/HasRoom() by the sender,
// Front()/Pop()/Wait()/Arm() by the receiver. The shared state is trusted:
// a process that writes nonsense into it (cooperating processes are trusted
// with the pool's state anyway) can make tokens repeat or vanish, never
// make this code read or write outside the mapping (indices are masked).
#ifndef BUFPOOL_SRC_POOL_TOKEN_RING_H_
#define BUFPOOL_SRC_POOL_TOKEN_RING_H_

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace bufpool::internal {

// What a ring is tied to, checked by Join(): the pool's memfd (device and
// inode, the same in every process) and its buffer size.
struct RingIdentity {
  uint64_t dev = 0;
  uint64_t ino = 0;
  uint64_t buffer_size = 0;
};

class TokenRing {
 public:
  // The largest capacity Create() accepts.
  static constexpr size_t kMaxCapacity = size_t{1} << 24;

  // A new ring of `capacity` tokens (rounded up to a power of two, >= 1,
  // <= kMaxCapacity) in a new sealed memfd, with a new eventfd.
  static absl::StatusOr<std::unique_ptr<TokenRing>> Create(
      size_t capacity, const RingIdentity& identity);
  // Maps the ring behind `memory_fd` (from Create() in this or another
  // process) and uses `event_fd` as its eventfd; both are duplicated (the
  // caller keeps its own). InvalidArgument when the memfd is not a ring, is
  // not sealed against shrinking, or belongs to another pool.
  static absl::StatusOr<std::unique_ptr<TokenRing>> Join(
      int memory_fd, int event_fd, const RingIdentity& identity);
  ~TokenRing();
  TokenRing(const TokenRing&) = delete;
  TokenRing& operator=(const TokenRing&) = delete;

  // ---- Sender ----
  // True when Push() has room for one more token. Once true it stays true
  // until this sender pushes (the receiver only makes room).
  bool HasRoom();
  // Publishes `token`; HasRoom() must have returned true. Wakes a receiver
  // that sleeps in Wait() or armed the eventfd.
  void Push(uint64_t token);

  // ---- Receiver ----
  // The oldest token not taken, without taking it; false when empty.
  bool Front(uint64_t* token);
  // Takes the token Front() returned.
  void Pop();
  // Sleeps until a token is there (true) or `deadline` passes (false).
  // Spins briefly first.
  bool Wait(absl::Time deadline);
  // For an event loop: makes the next Push() write the eventfd, unless a
  // token is already there (then returns true and arms nothing). Clears
  // the eventfd's count first, so that a level-triggered poll does not
  // report an old notice.
  bool Arm();

  int memory_fd() const { return memory_fd_; }
  int event_fd() const { return event_fd_; }
  size_t capacity() const { return mask_ + 1; }
  // Tokens in the ring now (a moving picture while the other side works).
  size_t size() const;

  struct Layout;  // the memfd's contents (token_ring.cc)

 private:
  TokenRing() = default;
  static absl::StatusOr<std::unique_ptr<TokenRing>> Map(int memory_fd,
                                                        int event_fd,
                                                        size_t bytes);
  void Wake();

  Layout* layout_ = nullptr;
  size_t map_bytes_ = 0;
  uint64_t mask_ = 0;
  int memory_fd_ = -1;
  int event_fd_ = -1;
  // This process's last view of the other side's index (see the file
  // comment: stale copies are conservative).
  uint64_t cached_head_ = 0;  // the sender's
  uint64_t cached_tail_ = 0;  // the receiver's
};

}  // namespace bufpool::internal

#endif  // BUFPOOL_SRC_POOL_TOKEN_RING_H_

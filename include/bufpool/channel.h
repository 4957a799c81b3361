// BufferChannel: hands buffers of one pool from a sender to a receiver, in
// the same process or, with a shared pool (PoolOptions::shared), in another
// one, without copying a byte: what travels is an 8-byte BufferToken
// (BufferPool::Export / Import) through a ring in memory both processes map.
//
//   sender process                           receiver process
//   Send(std::move(buf))                     Receive(timeout) / TryReceive()
//     pool.Export(buf) -> token                token = ring[head]
//     ring[tail] = token; tail++  ==memfd==>   pool.Import(token) -> Buffer
//     wake the receiver if it waits            head++
//
// The ring lives in a small sealed memfd of its own (memory_fd()); a
// receiver that waits in an event loop is woken through an eventfd
// (event_fd()), which the creator makes. An eventfd cannot be shared
// through memory, so another process joins with both descriptors: pass them
// over a Unix socket (SCM_RIGHTS; one message can carry both, with the
// pool's shared_fd()), or let a forked child inherit them, and call
// Join(pool, memory_fd, event_fd) there with the pool joined there (a
// child, like its pool, never uses the parent's channel object).
//
// Receiving, three ways:
//   * TryReceive(): busy polling; an empty handle when nothing is there.
//     Costs a load of the sender's index when empty; no system call.
//   * Receive(timeout > 0): spins about a microsecond, then sleeps on a
//     futex in the shared memory until a Send() or the timeout
//     (DeadlineExceeded). The channel does not know who sends: if the
//     sending process dies, nothing wakes a receiver, and one waiting with
//     an infinite timeout waits forever. Across processes, wait in finite
//     slices and between them check what tells you the peer is gone (the
//     pool's ReclaimDead() / Stats().processes, a socket to it, waitpid).
//   * Event loops: call Receive(absl::ZeroDuration()) until it answers
//     DeadlineExceeded; that answer arms event_fd(), which the next Send()
//     makes readable (EPOLLIN). Read nothing from it yourself: the next
//     arming clears it. A Send() that finds the receiver busy polling or
//     armed already pays no system call.
//
// Ownership. Send() moves a buffer into the channel; from then until a
// receiver imports it the buffer belongs to the sending process, out of
// its hands (a token in flight): if that process dies, its pool's
// ReclaimDead() takes the buffer back, and the token left in the ring goes
// stale. A receiver skips a token the pool refuses (stale, or not a token
// of this pool) and counts it (Stats().refused, last_refusal()): it never
// hands out a buffer twice. Tokens still in the ring when the last
// process closes the channel stay exported until their sender's process
// exits (then reclaimed); call Drain() on the receiving side to give them
// back at once. The channel object owns its descriptors and mapping and
// refers to `pool`, which must outlive it.
//
// Thread and process safety. One thread, in any process, may send at a
// time, and one may receive at a time (a single-producer single-consumer
// ring): Send() calls must not overlap one another, nor receiving calls
// (TryReceive, Receive, Drain) one another, across every process that
// joined. The sender and the receiver run at the same time on any threads.
// Stats(), size() and the accessors may be called from any thread. For
// traffic both ways, make two channels. The processes of one shared pool
// are trusted with its state (bufpool/buffer_pool.h, "Shared pools"), and
// so with the channel's: a process that writes nonsense into the ring can
// make tokens repeat or vanish (a repeated token is refused on import),
// never make a receiver touch memory outside the ring.
#ifndef BUFPOOL_CHANNEL_H_
#define BUFPOOL_CHANNEL_H_

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "bufpool/buffer_pool.h"
#include "bufpool/export.h"

namespace bufpool {

namespace internal {
class TokenRing;  // src/pool/token_ring.h
}  // namespace internal

// What one channel object (one process's view) did.
struct ChannelStats {
  uint64_t sent;      // buffers Send() handed over through this object
  uint64_t received;  // buffers this object's receives returned
  // Tokens the pool refused on import (stale: their sender died and was
  // reclaimed, or forged), skipped by this object's receives.
  uint64_t refused;
};

class BUFPOOL_EXPORT BufferChannel {
 public:
  // The most tokens a channel holds.
  static constexpr size_t kMaxCapacity = size_t{1} << 24;

  // A new channel for buffers of `pool`, holding up to `capacity` tokens
  // (rounded up to a power of two; 1 to kMaxCapacity, else
  // InvalidArgument). A private pool's channel serves threads of this
  // process only; a shared pool's may be joined by its other processes.
  // Errors of memfd_create, mmap and eventfd name the call.
  static absl::StatusOr<std::unique_ptr<BufferChannel>> Create(BufferPool& pool,
                                                               size_t capacity);
  // Joins the channel behind `memory_fd` and `event_fd` (another channel's
  // memory_fd() and event_fd(), received over a Unix socket or inherited)
  // for buffers of `pool`, which must be the same shared pool (joined in
  // this process). Dups both descriptors; the caller keeps its own.
  // FailedPrecondition for a private pool; InvalidArgument for descriptors
  // that are not a channel's, or a channel of another pool.
  static absl::StatusOr<std::unique_ptr<BufferChannel>> Join(BufferPool& pool,
                                                             int memory_fd,
                                                             int event_fd);
  ~BufferChannel();
  BufferChannel(const BufferChannel&) = delete;
  BufferChannel& operator=(const BufferChannel&) = delete;

  // Hands `buffer` to the receiver: the handle is emptied. Never blocks.
  // ResourceExhausted when the channel is full, InvalidArgument for an
  // empty handle or one of another pool: on an error the handle keeps its
  // buffer, untouched.
  absl::Status Send(Buffer&& buffer);

  // The oldest buffer sent and not yet received, or an empty handle when
  // there is none. For busy polling: no system call, no allocation.
  Buffer TryReceive();
  // The oldest buffer sent and not yet received, waiting up to `timeout`
  // for one (see "Receiving" above). DeadlineExceeded when none came; with
  // a zero timeout that answer also arms event_fd(). The default infinite
  // timeout never returns if the sender's process dies before it sends:
  // across processes, pass a finite one and check the peer between calls.
  absl::StatusOr<Buffer> Receive(
      absl::Duration timeout = absl::InfiniteDuration());
  // Receives and releases every buffer in the channel now (shutting down a
  // receiver); returns how many. A receiving call.
  size_t Drain();

  // Readable after a Send() that followed an arming Receive() (above).
  // Owned by the channel; do not read or close it.
  int event_fd() const;
  // The ring's memfd, for Join() in another process. Owned by the channel.
  int memory_fd() const;
  size_t capacity() const;
  // Tokens in the channel now (a moving picture while the other side works).
  size_t size() const;
  BufferPool& pool() const { return *pool_; }
  ChannelStats Stats() const;
  // Why the last refused token was refused (the pool's Import() error), OK
  // while none was.
  absl::Status last_refusal() const;

 private:
  BufferChannel(BufferPool& pool, std::unique_ptr<internal::TokenRing> ring);
  void Refused(absl::Status why);

  BufferPool* pool_;
  std::unique_ptr<internal::TokenRing> ring_;
  // Each written by its side's one thread (load + store, no RMW), read by
  // Stats() on any thread.
  std::atomic<uint64_t> sent_{0};
  std::atomic<uint64_t> received_{0};
  std::atomic<uint64_t> refused_{0};
  mutable std::mutex refusal_mu_;
  absl::Status last_refusal_;  // guarded by refusal_mu_
};

}  // namespace bufpool

#endif  // BUFPOOL_CHANNEL_H_

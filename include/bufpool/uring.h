// libbufpool: pool buffers in your own io_uring loop.
//
// A BufferPool's one region can be handed to the kernel whole. This header
// gives a server written on raw liburing the three pieces every io_uring
// server builds around it:
//
//   ProvidedBufferRing  pool slots lent to a provided-buffer ring (a buffer
//                       group) for IOSQE_BUFFER_SELECT receives; each
//                       receive completion becomes a BufferChain that owns
//                       the bytes the kernel wrote (Linux 5.19+; bundles,
//                       several buffers per completion, Linux 6.10+).
//   FixedBuffers        the whole region registered as fixed buffers, for
//                       READ_FIXED / WRITE_FIXED / SEND_ZC with a buffer
//                       index.
//   HeldSend            a send of a chain that keeps its bytes alive until
//                       the kernel is done with them (for SEND_ZC, the
//                       notification completion).
//
//      pool ──Refill──> provided-buffer ring ──kernel fills──> recv CQE
//       ^                                                         │ Take
//       │                                                         v
//       └──── last slice dropped (any thread) <──── BufferChain ──┴─> HeldSend
//
// A loop (see examples/uring_echo.cc for a complete server):
//
//   io_uring ring;  io_uring_queue_init(256, &ring, 0);
//   auto bufs = bufpool::ProvidedBufferRing::Create(&ring, *pool,
//       {.group_id = 1, .max_buffers = 512});
//   (*bufs)->PrepareRecv(io_uring_get_sqe(&ring), fd);   // multishot recv
//   ... on each completion of that receive:
//   absl::StatusOr<bufpool::BufferChain> got = (*bufs)->Take(*cqe);
//   ... every loop turn:
//   (*bufs)->Refill();
//
// Running out. When the ring is empty the kernel ends a multishot receive
// with -ENOBUFS; Take() reports it as ResourceExhausted and counts it
// (enobufs()). The connection is healthy: park it, and re-arm its receive
// once ShouldRearm() (available() >= rearm_threshold(), by default a quarter
// of the buffers the ring has been lent) after a Refill(). Re-arming at once
// would fail the same way.
//
// Thread safety. A ProvidedBufferRing, FixedBuffers or HeldSend is used by
// the one thread that drives its io_uring (liburing rings are not
// thread-safe either). The chains Take() returns are independent values:
// they may be moved to and dropped on any thread; their buffers go back to
// the pool, and the ring's thread lends them again on a later Refill().
//
// Ownership and lifetimes. The caller owns the io_uring and the pool; both
// must outlive every object here, and these objects must be destroyed before
// io_uring_queue_exit(ring) (they unregister what they registered).
// Destroying the pool while chains or rings still hold its buffers aborts
// with "still in use".
#ifndef BUFPOOL_URING_H_
#define BUFPOOL_URING_H_

#include <liburing.h>
#include <sys/socket.h>
#include <sys/uio.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "bufpool/buffer_pool.h"
#include "bufpool/export.h"

namespace bufpool {

// ---- Fixed buffers ----------------------------------------------------------

// The whole region of a pool registered with one io_uring as fixed buffers
// (io_uring_register_buffers), split into iovecs of at most 1 GiB each (the
// kernel's limit per registered buffer): registered buffer i covers
// [region + i GiB, region + (i + 1) GiB). Pool buffers never straddle two
// of them (buffer sizes are powers of two up to 1 GiB).
//
// Registration pins the region's pages, which counts against
// RLIMIT_MEMLOCK (unless the process has CAP_IPC_LOCK): Register() checks
// the limit first and fails with ResourceExhausted naming the limit, the
// bytes needed and `ulimit -l`.
//
// A ring has one table of fixed buffers: Register() fails (EBUSY) when the
// ring already has one. Movable; destroying it unregisters the table.
class BUFPOOL_EXPORT FixedBuffers {
 public:
  // Bytes one registered buffer covers at most.
  static constexpr size_t kMaxRegisteredBytes = size_t{1} << 30;

  static absl::StatusOr<FixedBuffers> Register(io_uring* ring,
                                               const BufferPool& pool);

  FixedBuffers(FixedBuffers&& other) noexcept;
  FixedBuffers& operator=(FixedBuffers&& other) noexcept;
  FixedBuffers(const FixedBuffers&) = delete;
  FixedBuffers& operator=(const FixedBuffers&) = delete;
  ~FixedBuffers();

  // The buf_index for io_uring_prep_read_fixed / write_fixed /
  // send_zc_fixed of bytes starting at `p`, or -1 when `p` is outside the
  // region. [p, p + len) must not cross a 1 GiB boundary of the region (no
  // pool buffer does).
  int IndexOf(const void* p) const {
    const uintptr_t off =
        reinterpret_cast<uintptr_t>(p) - reinterpret_cast<uintptr_t>(base_);
    return off < bytes_ ? static_cast<int>(off >> 30) : -1;
  }
  // Registered buffers (iovecs) in the table.
  unsigned count() const { return count_; }
  // Bytes registered: the pool's whole region.
  size_t size() const { return bytes_; }

  // Unregisters now; the object becomes empty (IndexOf() is -1 for all).
  void Unregister();

 private:
  FixedBuffers(io_uring* ring, std::byte* base, size_t bytes, unsigned count)
      : ring_(ring), base_(base), bytes_(bytes), count_(count) {}

  io_uring* ring_ = nullptr;  // nullptr: nothing to unregister
  std::byte* base_ = nullptr;
  size_t bytes_ = 0;
  unsigned count_ = 0;
};

}  // namespace bufpool

#endif  // BUFPOOL_URING_H_

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
//   io_uring ring;
//   // Not io_uring_queue_init(n, &ring, 0): see InitServerRing().
//   absl::StatusOr<bufpool::ServerRingSetup> setup =
//       bufpool::InitServerRing(&ring);
//   auto bufs = bufpool::ProvidedBufferRing::Create(&ring, *pool,
//       {.group_id = 1, .max_buffers = 512});
//   (*bufs)->PrepareRecv(io_uring_get_sqe(&ring), fd);   // multishot recv
//   ... on each completion of that receive:
//   absl::StatusOr<bufpool::BufferChain> got = (*bufs)->Take(*cqe);
//   ... or, where the handler is done with the bytes when it returns:
//   if (!(*bufs)->Visit(*cqe, handle)) got = (*bufs)->Take(*cqe);
//   ... or, to own a message one buffer carries, as that buffer:
//   if (!(*bufs)->TakeBuffer(*cqe, msg)) got = (*bufs)->Take(*cqe);
//   ... every loop turn:
//   (*bufs)->Refill();
//
// Running out. When the ring is empty the kernel ends a multishot receive
// with -ENOBUFS; Take() reports it as ResourceExhausted and counts it
// (enobufs()). The connection is healthy: park it, and re-arm its receive
// once ShouldRearm() (available() >= rearm_threshold(), by default a quarter
// of the buffers the ring has been lent) after a Refill(). Re-arming at once
// would fail the same way. ParkedReceives does both, and reads the pool's
// notice in the ring while the pool is too dry for the ring to refill.
//
// Backpressure: bound what one connection holds (received, not yet sent or
// consumed) to about `limit` bytes, as the bundled echo server does. Cap
// each receive at the room left, stop arming past the limit, resume at
// half; count a send in flight by held_bytes(), which covers its whole
// chain:
//
//   size_t held = conn.queue.size() + conn.send.held_bytes();
//   // arming (when not paused):
//   ProvidedBufferRing::RecvOptions ro;
//   ro.max_bytes = round_up(limit - held, pool.buffer_size());
//   bufs->PrepareRecv(sqe, conn.fd, ro);   // ends by itself at the cap
//   // on a completion: paused = held >= limit (do not re-arm);
//   // on a send's completion: if paused && held <= limit / 2, re-arm.
//
// Where the kernel lacks the multishot cap (multishot_cap() false),
// PrepareRecv() turns a capped receive single-shot; a loop that wants
// multishot receives there arms them uncapped below half the limit and
// cancels them (io_uring_prep_cancel64 on their user_data) past it.
//
// Thread safety. A ProvidedBufferRing, FixedBuffers or HeldSend is used by
// the one thread that drives its io_uring (liburing rings are not
// thread-safe either). The chains Take() returns are independent values:
// they may be moved to and dropped on any thread; their buffers go back to
// the pool, and the ring's thread lends them again on a later Refill().
// Dropping a chain posts no completion: a loop that parks receives after
// -ENOBUFS while the pool is dry (other threads hold its chains) asks the
// pool for a notice, BufferPool::NotifyWhenFree(efd), and keeps a read of
// that eventfd in its ring; the read completes when a buffer is free, and
// the next Refill() lends it (examples/uring_echo.cc does this).
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
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/attributes.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "bufpool/buffer_pool.h"
#include "bufpool/chain.h"
#include "bufpool/export.h"
#include "bufpool/internal/shared_access.h"

namespace bufpool {

// ---- Setting up the ring ----------------------------------------------------

// How InitServerRing() creates a ring.
struct ServerRingOptions {
  unsigned entries = 256;   // submission queue slots (> 0)
  unsigned cq_entries = 0;  // completion queue slots; 0: 8 x entries (<= 65536)
  // IORING_SETUP_R_DISABLED: the ring starts disabled, and the thread that
  // will drive it calls EnableServerRing() first (so a ring created on one
  // thread can be single-issuer on another).
  bool start_disabled = false;
};

// What InitServerRing() chose.
struct BUFPOOL_EXPORT ServerRingSetup {
  unsigned flags = 0;    // the IORING_SETUP_* flags the ring has
  unsigned refused = 0;  // those asked for that this kernel refused
  // "DEFER_TASKRUN|SINGLE_ISSUER|COOP_TASKRUN|SUBMIT_ALL|CQSIZE", and
  // " (refused: ...)" when the kernel refused some.
  std::string Describe() const;
};

// Creates `ring` the way a server that drives it from one thread should:
// with SINGLE_ISSUER | DEFER_TASKRUN | COOP_TASKRUN | SUBMIT_ALL | CQSIZE.
// Without them the kernel delivers receive completions by inter-processor
// interrupt, often while the sender's CPU still holds the socket lock, which
// the receiving CPU then spins on: ~40% of a small-request server's CPU.
// Flags the kernel does not know (-EINVAL) are dropped one at a time,
// newest first (DEFER_TASKRUN 6.1, SINGLE_ISSUER 6.0, COOP_TASKRUN 5.19,
// SUBMIT_ALL 5.18, R_DISABLED 5.10, CQSIZE 5.5); the result says which.
//
// With these flags only the creating thread (or, with start_disabled, the
// thread that enables the ring) may submit or register (so create and
// destroy ProvidedBufferRing and FixedBuffers on it), and completions are
// posted
// only while that thread waits in the kernel (io_uring_submit_and_wait*(),
// io_uring_wait_cqe*()): a loop that only peeks sees none. A ring shared by
// several submitting threads wants io_uring_queue_init_params() instead.
// Release the ring with io_uring_queue_exit() as usual.
//
// InvalidArgument for entries outside [1, 32768] or cq_entries outside
// [entries, 65536] (the kernel's limits); the kernel's
// error otherwise (ENOMEM, EPERM when io_uring is disabled, ENOSYS), the
// ring then untouched.
BUFPOOL_EXPORT absl::StatusOr<ServerRingSetup> InitServerRing(
    io_uring* ring, const ServerRingOptions& options = {});

// Enables a ring created with start_disabled, making the calling thread its
// only submitter (io_uring_enable_rings(), which Debian's liburing 2.3
// declares but does not export). OK and nothing done when the ring was not
// disabled (a kernel before 5.10 refuses R_DISABLED); the kernel's error
// otherwise.
BUFPOOL_EXPORT absl::Status EnableServerRing(io_uring* ring);

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
//
// An elastic pool (PoolOptions::max_buffer_count) is registered as a sparse
// table (io_uring_register_buffers_sparse, Linux 5.19) with one entry per
// chunk of the region (BufferPool::chunk_bytes(), at most 16384 entries):
// registered buffer i covers [region + i x chunk, region + (i + 1) x
// chunk). Only what is used is pinned: IndexOf() of a buffer in a chunk not
// yet registered (one the pool grew into since) registers that chunk first
// (io_uring_register_buffers_update_tag, one system call on this ring's
// thread, pinning chunk_bytes()). While registered the pool is pinned
// (BufferPool::PinRegion()): Trim() gives nothing back, since the kernel
// would keep the trimmed pages; growth goes on.
class BUFPOOL_EXPORT FixedBuffers {
 public:
  // Bytes one registered buffer covers at most: the kernel's limit (1 GiB),
  // defined here once; the copy engine uses it too.
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
  // pool buffer does; with an elastic pool, a chunk boundary: no buffer
  // does). An elastic pool's chunk not registered yet is registered here
  // (pass buffers you hold); -1 if the kernel refuses (RLIMIT_MEMLOCK).
  int IndexOf(const void* p) const;
  // Registered buffers (iovecs) in the table; an elastic pool's table
  // entries, registered or still empty.
  unsigned count() const { return count_; }
  // Bytes the table covers: the pool's whole region.
  size_t size() const { return bytes_; }

  // Unregisters now; the object becomes empty (IndexOf() is -1 for all).
  void Unregister();

 private:
  FixedBuffers(io_uring* ring, std::byte* base, size_t bytes, unsigned count)
      : ring_(ring), base_(base), bytes_(bytes), count_(count) {}
  // An elastic pool's chunk: registers it (out of line); its index or -1.
  int RegisterChunk(unsigned index) const;

  io_uring* ring_ = nullptr;  // nullptr: nothing to unregister
  std::byte* base_ = nullptr;
  size_t bytes_ = 0;
  unsigned count_ = 0;
  unsigned shift_ = 30;  // log2 of the bytes one entry covers
  // Elastic pools: bit i set once entry i is registered (empty: a fixed
  // pool's table, all registered). Mutable: IndexOf() fills entries in.
  mutable std::vector<uint64_t> registered_;
  BufferPool* pinned_ = nullptr;  // the pool pinned while registered
};

// ---- Provided-buffer ring ---------------------------------------------------

// ProvidedBufferRingOptions::copy_below's default: buffer_size / 8, resolved
// at ProvidedBufferRing::Create().
inline constexpr size_t kDefaultCopyBelow = ~size_t{0};

struct ProvidedBufferRingOptions {
  // The buffer group receives name in sqe->buf_group.
  uint16_t group_id = 0;
  // The most pool buffers lent to the ring at once (<= 32768, the kernel's
  // limit on ring entries). Rounded up to a power of two for the ring's
  // entries; the ring lends at most this many. Create() refuses a value
  // that, with what the pool's other rings may lend and its budgets
  // reserve, exceeds the pool's capacity. kAutoMaxBuffers (the default):
  // 512, or what the pool has not promised elsewhere if that is fewer.
  static constexpr size_t kAutoMaxBuffers = 0;
  size_t max_buffers = kAutoMaxBuffers;
  // Buffers lent at Create(). The ring starts small and doubles what it
  // keeps lent, up to max_buffers, whenever a Refill() finds it had fallen
  // below a quarter of that (or a receive ran out): the ring is a FIFO, so
  // lending only what the load needs keeps the buffers the kernel writes
  // warm in the cache.
  size_t initial_buffers = 64;
  // ShouldRearm() is true once available() reaches this; 0 means a quarter
  // of the most buffers the ring has held at once (at least 1).
  size_t rearm_threshold = 0;
  // Bundles (IORING_RECVSEND_BUNDLE, Linux 6.10+): one receive completion
  // may fill several buffers. kProbe uses them when the kernel says it has
  // them (IORING_FEAT_RECVSEND_BUNDLE, read once at Create()); kOff and kOn
  // force the choice (kOn on a kernel without bundles makes receives fail
  // with -EINVAL).
  enum class Bundles { kProbe, kOff, kOn };
  Bundles bundles = Bundles::kProbe;
  // A one-buffer completion arriving while the chain it is taken into has
  // tail_room() is copied into that room (and a fresh buffer of the chain's
  // pool for what does not fit); one carrying fewer bytes than this, into a
  // chain without room, is copied into the ring's pack buffer (a buffer the
  // ring shares among the chains it serves) and becomes a slice of it. Its
  // ring buffer is lent again with no pool round trip (written to the ring
  // at once, published by the next Refill()). So memory follows bytes (see
  // "Memory" in the class comment). 0 turns copying off (every completion
  // links its buffers); at most the pool's buffer_size. The default,
  // kDefaultCopyBelow: buffer_size / 8.
  size_t copy_below = kDefaultCopyBelow;
  // Incremental consumption (IOU_PBUF_RING_INC, Linux 6.12+): the kernel
  // fills one lent buffer across many completions (IORING_CQE_F_BUF_MORE
  // on all but the last that uses it), so a pool of large buffers (64 KiB,
  // say) serves small and large messages alike. Take() then returns a
  // counted slice of the buffer per completion; the ring keeps its own
  // reference while the kernel still fills the buffer (so no chain's
  // tail_room() reaches into it) and drops it with the completion without
  // BUF_MORE. kProbe uses it where the kernel has it (tried once at
  // Create()); kOff and kOn force the choice (kOn on a kernel without it
  // fails Create() with the kernel's words). Bundles combine with it.
  // Stream sockets only: the kernel puts each receive into what is left of
  // the current buffer, so a datagram (SOCK_DGRAM, SOCK_SEQPACKET) longer
  // than that would be cut short, and a plain receive's completion would
  // not say so. So on an incremental ring PrepareRecv() asks the socket its
  // type (one getsockopt() per call, unless RecvOptions::socket_checked)
  // and, for any socket but SOCK_STREAM,
  // makes no receive: its completion carries -EPROTOTYPE, which Take()
  // reports as FailedPrecondition naming the cause, and the bytes stay in
  // the socket. CheckSocket() asks the same once, say when a connection is
  // accepted. A ring that serves message sockets needs kOff.
  enum class Incremental { kProbe, kOff, kOn };
  Incremental incremental = Incremental::kProbe;
};

// Pool buffers lent to an io_uring provided-buffer ring (buffer group
// `group_id`). Buffer ids are the ring's own: a table maps each id to the
// pool slot lent under it, so pools of any size work (the kernel's ids are
// 16 bits) and any slot can be lent.
//
// Invariants: every buffer lent is in exactly one place: in the ring (the
// kernel may select it), consumed by the kernel but not yet Take()n, or in
// a chain Take() returned (then no longer the ring's). available() counts
// the first two; the kernel consumes ring entries in order, which is what
// lets Take() find the later buffers of a bundle.
//
// Memory. With copying on (copy_below > 0, the default) a connection whose
// chain has received B bytes through Take() and not consumed them holds
// buffers of its own for at most B + 2 * buffer_size bytes (see
// BufferChain's "Memory that follows bytes"), however the bytes
// arrived (one byte per completion, bundles), and a connection that holds
// no bytes holds no buffer: completions that find room at the chain's tail
// are copied there; small ones that find none are packed into the ring's
// pack buffer (a ReceivePack, see bufpool/chain.h), which the small
// partial messages of many connections share (bytes that continue the
// chain's own slice of it join that slice), so a connection holding a
// 100-byte partial pins about 100 bytes; only completions that bring
// copy_below bytes or more into a chain without room link their buffers.
// A partial that stays while the others around it are consumed pins its
// whole pack buffer: in the worst case (one stalled partial per pack
// buffer) a buffer per such connection, as without packing.
// Chains that the caller splits and clones may pin more;
// BufferChain::Compact() packs them. With copy_below = 0 every completion
// pins a whole buffer (up to buffer_size per byte received).
// On an incremental ring a buffer holds the bytes of many completions, of
// many connections: bytes that continue the chain's tail slice in the same
// buffer join it, spans under max(copy_below, buffer_size / 2) are copied,
// and only larger ones are linked as slices, so a chain pins at most twice
// its bytes plus two buffers even when other connections' bytes of the
// same buffers are long gone (and B + 2 * buffer_size for a trickle, which
// the tests check).
//
// Thread safety: the ring's thread only (see the file comment); chains it
// returns are free to travel.
class BUFPOOL_EXPORT ProvidedBufferRing {
 public:
  using Options = ProvidedBufferRingOptions;
  static constexpr size_t kMaxBuffers = 32768;

  // Maps the ring, registers it as group options.group_id with `ring` and
  // lends options.initial_buffers free buffers of `pool`. Errors:
  // InvalidArgument for bad options; the kernel's words when registration
  // fails (EEXIST: the group is taken; EINVAL: a kernel before 5.19);
  // ResourceExhausted when the pool has no free buffer at all, or when
  // max_buffers plus what the pool's other rings may lend plus its budgets'
  // reservations (bufpool/budget.h) exceed its capacity (the message names
  // the numbers): a ring may not promise buffers the pool cannot have.
  static absl::StatusOr<std::unique_ptr<ProvidedBufferRing>> Create(
      io_uring* ring, BufferPool& pool, const Options& options);

  // Unregisters the group and returns every buffer still lent (in the ring
  // or consumed but not taken) to the pool. Chains already taken stay
  // valid. Completions still in the CQ that name this group's buffers must
  // not be passed to Take() afterwards (it is gone). Destroy it on the
  // ring's thread, before io_uring_queue_exit() where you can: when the
  // kernel refuses to unregister (a SINGLE_ISSUER ring, another thread) the
  // lent buffers stay out of the pool for good, and it says so on stderr.
  ~ProvidedBufferRing();
  ProvidedBufferRing(const ProvidedBufferRing&) = delete;
  ProvidedBufferRing& operator=(const ProvidedBufferRing&) = delete;

  struct RecvOptions {
    // io_uring_prep_recv_multishot (one completion per arrival until it
    // ends without IORING_CQE_F_MORE), or a single-shot io_uring_prep_recv.
    bool multishot = true;
    // Ask for a bundle when bundles() is on. For peers that send less than
    // a buffer at a time a bundle only costs the kernel a look at more ring
    // entries per receive.
    bool bundle = true;
    int msg_flags = 0;
    // The most bytes this receive may deliver in all, over all its
    // completions; 0: no cap. A multishot receive ends (a completion
    // without IORING_CQE_F_MORE) once its total reaches the cap, where the
    // kernel has one (Linux 6.17+, see multishot_cap()); the kernel fills
    // whole buffers then, so a multishot receive that is not a bundle may
    // deliver up to max_bytes rounded up to whole buffers (a bundle stops at
    // max_bytes). On older kernels PrepareRecv() makes the receive
    // single-shot with this length, which caps it exactly. At most
    // kMaxRecvBytes (larger is clamped).
    size_t max_bytes = 0;
    // The caller vouches for `fd`'s type, so PrepareRecv() does not ask it
    // (no getsockopt() per receive on an incremental ring): CheckSocket()
    // said OK, or the socket is known to be a stream (an accepted TCP
    // connection). Also for an index into the ring's registered files
    // (IOSQE_FIXED_FILE, which the caller adds), which is no process
    // descriptor to ask: check the socket itself before registering it.
    bool socket_checked = false;
  };
  // The largest RecvOptions::max_bytes the kernel is given (it reads an int).
  static constexpr size_t kMaxRecvBytes = size_t{1} << 30;
  // Fills `sqe` with a receive on `fd` that selects its buffers from this
  // ring (IOSQE_BUFFER_SELECT, this group, IORING_RECVSEND_BUNDLE when
  // asked and bundles() is on). The caller sets user_data and may add
  // flags (IORING_RECVSEND_POLL_FIRST, ...). On an incremental ring a
  // socket of any type but SOCK_STREAM gets no receive but a NOP whose one
  // completion (no IORING_CQE_F_MORE) Take() reports as FailedPrecondition
  // (see ProvidedBufferRingOptions::incremental); receive flags added to
  // that NOP make the kernel reject it with EINVAL instead, which Take()
  // reports with a pointer to CheckSocket().
  void PrepareRecv(io_uring_sqe* sqe, int fd) const {
    PrepareRecv(sqe, fd, RecvOptions());
  }
  void PrepareRecv(io_uring_sqe* sqe, int fd, const RecvOptions& options) const;
  // Whether this ring can receive from socket `fd`: OK, except on an
  // incremental ring for a socket of any type but SOCK_STREAM
  // (FailedPrecondition, naming the cause; see
  // ProvidedBufferRingOptions::incremental). One getsockopt() on an
  // incremental ring, none otherwise.
  absl::Status CheckSocket(int fd) const;

  // The bytes a completion of such a receive carries, as a chain that owns
  // them (one buffer; several for a bundle), sliced to exactly cqe.res
  // bytes; new buffers for Append() on it come from the pool.
  //   res > 0:   the bytes;
  //   res == 0:  an empty chain (end of stream; a buffer the kernel used
  //              goes back to the pool);
  //   -ENOBUFS:  ResourceExhausted, counted in enobufs(): the ring was
  //              empty; re-arm once ShouldRearm();
  //   -EPROTOTYPE on an incremental ring: FailedPrecondition, the receive
  //              PrepareRecv() refused for a message socket (see there);
  //   other < 0: the errno's Status (ECANCELED: Cancelled, ...), with the
  //              kernel's words.
  // FailedPrecondition for a completion with bytes but no buffer of this
  // ring (not a buffer-select receive, or a buffer id it did not lend).
  absl::StatusOr<BufferChain> Take(const io_uring_cqe& cqe);
  // The same, appending the bytes to `out` (say, a connection's input
  // queue) instead of returning a new chain: no chain is made, moved or
  // destroyed per completion. `out` is unchanged unless the status is OK
  // (with res == 0 it is unchanged too), with one exception: when `out` is
  // bound to a budget (bufpool/budget.h) and taking the bytes pinned a
  // buffer past its max_bytes, the bytes are in `out` all the same (the
  // kernel has already written them; nothing is lost) and the status is
  // ResourceExhausted naming the budget and its limit, counted in its
  // refusals: stop receiving (do not re-arm, cancel a multishot receive)
  // until the chain drains. A ResourceExhausted with cqe.res > 0 is always
  // this one; -ENOBUFS (below) carries no bytes. `out` may belong to
  // another pool.
  // When `out` must grow its slice ring and that allocation throws
  // std::bad_alloc, nothing has changed (`out`, the ring): the same
  // completion may be taken again.
  // The one-buffer completions of a ring without incremental mode that are
  // copied into `out`'s tail room are handled inline (no call, no Status made);
  // the rest out of line.
  absl::Status Take(const io_uring_cqe& cqe, BufferChain& out);

  // Handles a completion's bytes where the kernel wrote them, for a handler
  // that is done with them when it returns (a datagram, on a ring with
  // Incremental::kOff; a request that one receive carries whole): calls
  // fn(absl::Span<const std::byte>) with the completion's bytes in the ring's
  // buffer, then lends that buffer again under the same id (no chain, no pool
  // round trip, no reference count; the kernel sees it after the next
  // Refill()). Returns true when it did. Returns false, having changed nothing,
  // for every completion it cannot handle so, which then goes to Take(): no
  // buffer (-ENOBUFS, errors, end of stream), more bytes than one buffer (a
  // bundle), an incremental ring, an id the ring did not lend. fn must not keep
  // the span, call this ring's Refill() or destroy the ring. If fn throws, the
  // buffer has been lent again all the same and the completion is used up: mark
  // it seen before the exception leaves your loop, or the next pass would lend
  // the buffer a second time.
  //
  //   if (!ring.Visit(*cqe, [&](absl::Span<const std::byte> b) { Parse(b); }))
  //     status = ring.Take(*cqe, conn.input);
  template <typename Fn>
  bool Visit(const io_uring_cqe& cqe, Fn&& fn);

  // Takes a completion that one buffer carries as that whole buffer, for a
  // loop that owns one message at a time without a chain (a request it
  // answers from the same buffer, a datagram it hands to another thread):
  // on true, `buffer` holds the completion's buffer, its bytes
  // buffer.data()[0, cqe.res). What `buffer` held before, a buffer of the
  // ring's pool, takes its place in the ring under the same id (the kernel
  // sees it after the next Refill(); no pool round trip, inline); an empty
  // `buffer` takes the ring's buffer, and the next Refill() lends a fresh
  // pool buffer in its place. Returns false, having changed nothing, for
  // every completion it cannot take so, which then goes to Take(): no
  // buffer (-ENOBUFS, errors, end of stream), more bytes than one buffer (a
  // bundle), an incremental ring, an id the ring did not lend; and for a
  // `buffer` of another pool. Never allocates or throws.
  //
  // The buffer passed in is given to the kernel, which may write it once
  // the next Refill() publishes it: it must be idle, with no send still
  // reading it and no pointer into it kept. A message answered by an
  // asynchronous send is moved out (and, once sent, Reset()) instead, and
  // an empty handle passed next. Call it on the ring's thread, as every
  // ring call; the Buffer it leaves may move to any thread.
  //
  //   bufpool::Buffer msg;  // kept across completions: the ring swaps it
  //   if (ring.TakeBuffer(*cqe, msg)) Answer(msg.data(), cqe->res);  // sync
  //   else status = ring.Take(*cqe, conn.input);
  //
  // Memory: each message held so pins one whole buffer, however few its
  // bytes; a stream's receives belong in a chain (Take(cqe, out), which
  // copies small ones: "Memory that follows bytes" above).
  bool TakeBuffer(const io_uring_cqe& cqe, Buffer& buffer) noexcept;

  // Lends free pool buffers to the ring until it holds its current target
  // (growing the target first if the ring ran low since the last call), in
  // one batch with one tail update. Returns the buffers in the ring
  // (available()). Costs a few compares when nothing is needed: call it
  // every loop turn, before waiting.
  size_t Refill();

  // Buffers in the ring (lent and not yet taken), as this thread knows:
  // the kernel may have consumed some whose completions are still queued.
  size_t available() const { return in_ring_; }
  // The most buffers the ring keeps lent now (grows up to max_buffers).
  size_t target() const { return target_; }
  size_t max_buffers() const { return max_buffers_; }
  // See Options::rearm_threshold.
  size_t rearm_threshold() const;
  bool ShouldRearm() const { return available() >= rearm_threshold(); }
  // Receives that ended with -ENOBUFS (seen by Take()).
  uint64_t enobufs() const { return enobufs_; }
  // Whether PrepareRecv() asks for bundles.
  bool bundles() const { return bundles_; }
  // Whether the kernel caps a multishot receive's total bytes (Linux
  // 6.17+; probed once per process with a throwaway ring and socket pair).
  bool multishot_cap() const { return multishot_cap_; }
  // Whether the ring consumes buffers incrementally (Options::incremental).
  bool incremental() const { return incremental_; }
  // Options::copy_below as resolved at Create() (0: copying off).
  size_t copy_below() const { return copy_below_; }
  // Completions Take() copied (their buffers lent again at Refill()).
  uint64_t copied() const { return copied_; }
  uint16_t group_id() const { return group_id_; }
  BufferPool& pool() const { return *pool_; }

 private:
  ProvidedBufferRing() = default;
  absl::Status Init(io_uring* ring, BufferPool& pool, const Options& options);
  // Init()'s steps: check and keep the options; map the ring's entries and
  // register them with the kernel (incremental where asked and allowed).
  absl::Status TakeOptions(io_uring* ring, BufferPool& pool,
                           const Options& options);
  absl::Status MapAndRegister(Options::Incremental incremental);
  absl::Status Register(uint16_t flags);
  void AddAt(uint16_t id, std::byte* data, uint32_t at);
  void Relend(uint16_t id, std::byte* data);
  // Take()'s inline cases (see there): true when the completion was taken;
  // false, nothing changed, for TakeSlow() to handle.
  bool TakeInline(const io_uring_cqe& cqe, BufferChain& out);
  absl::Status TakeSlow(const io_uring_cqe& cqe, BufferChain& out);
  // TakeSlow() without a look at out's budget.
  absl::Status TakeAny(const io_uring_cqe& cqe, BufferChain& out);
  // Take() of a one-buffer completion of `len` bytes: BufferChain::Receive()
  // copies it (the buffer is lent again at once) or links it.
  absl::Status TakeOne(uint16_t id, size_t len, BufferChain& out);
  // TakeBuffer() into an empty handle: the ring's buffer under `id` leaves
  // the ring.
  void TakeOut(uint16_t id, Buffer& buffer) noexcept;
  // Take() of a completion that carries no buffer (-ENOBUFS, an error, EOF).
  absl::Status TakeWithoutBuffer(int res);
  // Take() of `n` buffers from `id` on, linked into `out` (all or nothing).
  absl::Status TakeLinked(uint32_t id, size_t n, int res, BufferChain& out);
  // Take() of a bundle (`n` > 1 buffers from `id` on, `total` bytes) into
  // a chain whose tail has room: copied (the room filled, then fresh
  // buffers) and its buffers lent again, so that the room is not left
  // empty inside the chain; from the first buffer the pool cannot supply
  // on, the rest are linked.
  absl::Status TakeBundleByCopy(uint32_t id, size_t n, size_t total,
                                BufferChain& out);
  // The error of a failed receive (res < 0), or of a receive PrepareRecv()
  // refused (MessageSocketError(), after `what`).
  absl::Status ReceiveError(int res) const;
  absl::Status MessageSocketError(absl::string_view what) const;
  // Take() of a completion with bytes on an incremental ring.
  absl::Status TakeIncremental(const io_uring_cqe& cqe, uint32_t id,
                               BufferChain& out);
  // The ring's reference to buffer `id` as a counted slice of all of it
  // (made from lent_[id]'s slot on first use).
  SharedBuffer& Shared(uint16_t id);

  io_uring* ring_ = nullptr;
  BufferPool* pool_ = nullptr;
  std::byte* base_ = nullptr;  // the pool's region: slot i at base_ + i * size
  io_uring_buf_ring* br_ = nullptr;
  size_t br_bytes_ = 0;
  bool registered_ = false;
  uint16_t group_id_ = 0;
  bool bundles_ = false;
  bool multishot_cap_ = false;
  bool incremental_ = false;
  uint32_t entries_ = 0;  // ring entries, a power of two
  // Ids below this may take Take()'s inline path: entries_, or 0 on an
  // incremental ring (whose completions all go out of line).
  uint32_t inline_ids_ = 0;
  uint32_t mask_ = 0;
  uint32_t buffer_size_ = 0;
  size_t max_buffers_ = 0;
  size_t target_ = 0;
  size_t rearm_option_ = 0;
  size_t in_ring_ = 0;
  size_t peak_ = 0;       // most buffers in the ring at once
  bool ran_low_ = false;  // below target_ / 4, or -ENOBUFS, since Refill()
  uint32_t tail_ = 0;     // entries published since the ring was created
  // Where the next entry goes: tail_ plus the entries re-lent after it and
  // not yet published.
  uint32_t next_ = 0;
  uint64_t enobufs_ = 0;
  // Receives PrepareRecv() refused (a message socket on an incremental
  // ring); mutable: PrepareRecv() is const, and the ring one thread's.
  mutable uint64_t refused_ = 0;
  size_t copy_below_ = 0;
  uint64_t copied_ = 0;
  // Buffers committed as this ring's lending (internal::CommitLending).
  size_t committed_ = 0;
  struct Lent;  // internal/uring_inl.h
  // The handle of the buffer lent under `id` (lent_[id].data != nullptr),
  // which the id no longer holds.
  Buffer TakeLent(uint16_t id);
  // The inline paths' (TakeInline, Visit) common checks: the lent_ entry of
  // the completion's one buffer (data != nullptr), or nullptr unless the
  // completion carries one (IORING_CQE_F_BUFFER, 1 <= res <= buffer_size)
  // under an id the ring lent, on a ring without incremental mode. *id and
  // *len: the completion's buffer id and res.
  Lent* InlineLent(const io_uring_cqe& cqe, uint32_t* id, uint32_t* len);
  std::vector<Lent> lent_;
  // Incremental rings: per id, the ring's counted reference once a slice of
  // the buffer has been taken (lent_[id].data is then nullptr), and the bytes
  // of it the kernel has filled so far.
  std::vector<SharedBuffer> shared_;
  std::vector<uint32_t> filled_;
  std::vector<uint16_t> free_ids_;  // a stack
  std::vector<Buffer> scratch_;     // Refill()'s batch
  // The pack buffer (see "Memory"): the ring's reference, and how many of
  // its bytes slices cover so far; the ring writes only past pack_used_,
  // where no slice reaches, so chains on other threads reading their
  // slices never see a write.
  std::optional<ReceivePack> pack_;  // made by TakeOptions()
};

// ---- Parked receives -------------------------------------------------------

// Receives that ended because the ring had no buffer (Take() said
// ResourceExhausted on a completion without IORING_CQE_F_MORE), waiting to
// be made again once the ring can lend enough (ShouldRearm()); and, while
// the pool is too dry for the ring to refill, the pool's notice
// (BufferPool::NotifyWhenFree() on an eventfd of its own, read through the
// caller's ring) that wakes the loop when a buffer is free, so no timer
// polls. The sequence every loop turn:
//
//   auto parked = bufpool::ParkedReceives::Create(**bufs);
//   ...
//   if (IsResourceExhausted(s) && !more) (*parked)->Park(conn);
//   ...
//   (*bufs)->Refill();
//   (*parked)->Rearm(&ring, kNoticeTag, [&](void* c) { Receive(c); });
//   ...
//   case kNoticeTag: (*parked)->OnNotice(); break;  // its completion
//
// Parked receives are re-armed in the order they were parked. Remove() a
// connection that closes while parked.
//
// Thread safety and lifetime: one thread, the ring's. The eventfd read in
// flight writes into this object: destroy it after that read completed
// (notice_pending() false) or after the ring is gone (io_uring_queue_exit).
// The pool may still write to the eventfd of a pending notice, so a
// destructor that finds one pending leaves the eventfd open (one descriptor)
// rather than let the pool's write land on a reused descriptor number.
class BUFPOOL_EXPORT ParkedReceives {
 public:
  // The eventfd's error (EMFILE, ...) when it cannot be created.
  static absl::StatusOr<std::unique_ptr<ParkedReceives>> Create(
      ProvidedBufferRing& ring);
  ~ParkedReceives();
  ParkedReceives(const ParkedReceives&) = delete;
  ParkedReceives& operator=(const ParkedReceives&) = delete;

  // Parks a receive of `who` (the caller's connection). Allocates while the
  // list grows; throws std::bad_alloc, nothing changed, when it cannot.
  void Park(void* who) { parked_.push_back(who); }
  // Takes `who` off the list (a connection that closes); false when it was
  // not parked. O(parked).
  bool Remove(void* who);
  bool empty() const { return parked_.empty(); }
  size_t size() const { return parked_.size(); }
  // Whether the pool's notice is asked for and its read not yet complete.
  bool notice_pending() const { return notice_pending_; }

  // Call every loop turn after ProvidedBufferRing::Refill(). When the ring
  // should re-arm (ShouldRearm()), calls rearm(who) for every parked
  // receive, oldest first, and empties the list; while receives stay
  // parked, asks the pool for a notice and prepares its read on `uring`
  // (an sqe with user_data `notice_user_data`; submitted by the caller's
  // next submit). Returns the receives re-armed. `rearm` may Park() again.
  template <typename Fn>
  size_t Rearm(io_uring* uring, uint64_t notice_user_data, Fn&& rearm);
  // Re-arms (or, say, closes) every parked receive now, whatever the ring
  // holds: for a loop that is stopping.
  template <typename Fn>
  size_t RearmAll(Fn&& rearm);
  // The notice read's completion (any result): a buffer was free; the next
  // Refill() lends it, and the next Rearm() re-arms.
  void OnNotice();
  // Notices that completed so far.
  uint64_t notices() const { return notices_; }

 private:
  ParkedReceives(ProvidedBufferRing& ring, int efd) : ring_(&ring), efd_(efd) {}
  void AskForNotice(io_uring* uring, uint64_t notice_user_data);

  ProvidedBufferRing* ring_;
  int efd_;
  bool notice_pending_ = false;
  uint64_t notices_ = 0;
  uint64_t value_ = 0;  // where the eventfd read writes
  std::vector<void*> parked_;
  std::vector<void*> batch_;  // RearmAll()'s list while it calls out
};

// ---- Held sends -------------------------------------------------------------

// One send of a chain's bytes through io_uring that keeps them alive until
// the kernel no longer reads them:
//   plain (SEND for one slice, SENDMSG for several): until its completion;
//   zero-copy (SEND_ZC / SENDMSG_ZC, Linux 6.0+/6.1+): until the
//   notification completion (IORING_CQE_F_NOTIF), which comes after the
//   first one whenever that has IORING_CQE_F_MORE; the pages may be read
//   by the network stack until then.
// With `fixed` and a one-slice send inside its region, the zero-copy send
// uses the registered buffer (IORING_RECVSEND_FIXED_BUF and its index).
//
// Keep the HeldSend at a stable address (inside a connection, say) from
// Prepare() until done(): the kernel reads its msghdr. Not movable.
//
//   conn->send.Prepare(sqe, fd, std::move(chain), {.zero_copy = true});
//   io_uring_sqe_set_data(sqe, conn);  // tagged as a send (see below)
//   ... for every completion with that user_data:
//   conn->send.OnCompletion(*cqe);
//   if (conn->send.has_result()) ... result(): bytes sent or -errno;
//       ReturnUnsentTo(queue) puts what was not sent back in front
//   if (conn->send.done()) ... the held bytes are released; Prepare again
//
// A connection's receive and send complete on the same ring, so give them
// different user_data: examples/uring_echo.cc tags the connection pointer's
// low bits with the operation (receive, send, accept, ...).
//
// Thread safety: the ring's thread.
class BUFPOOL_EXPORT HeldSend {
 public:
  // Slices one send covers at most (the kernel's UIO_MAXIOV); the rest stay
  // for TakeUnsent(). The iovec array grows to the longest chain sent and
  // is kept: a connection's sends allocate only while growing.
  static constexpr size_t kMaxIovecs = 1024;

  struct Options {
    bool zero_copy = false;
    const FixedBuffers* fixed = nullptr;  // zero-copy only
    int msg_flags = MSG_NOSIGNAL;
  };

  HeldSend() = default;
  HeldSend(const HeldSend&) = delete;
  HeldSend& operator=(const HeldSend&) = delete;
  // Aborts, naming the fault, while busy(): the kernel may still read the
  // bytes.
  ~HeldSend();

  // Takes `chain` (which must not be empty; it is left empty, and moves
  // storage as BufferChain's move assignment does, so a connection's queue
  // handed to its send again and again allocates nothing in steady state)
  // and fills `sqe` with a send of its first kMaxIovecs slices to `fd`. The
  // HeldSend must be idle (never prepared, or done()). Throws
  // std::bad_alloc, nothing changed (the chain still the caller's), when
  // growing the iovec array fails.
  void Prepare(io_uring_sqe* sqe, int fd, BufferChain&& chain,
               const Options& options);
  void Prepare(io_uring_sqe* sqe, int fd, BufferChain&& chain) {
    Prepare(sqe, fd, std::move(chain), Options());
  }

  // Feeds one completion of the prepared send. Returns done().
  bool OnCompletion(const io_uring_cqe& cqe);

  // True when prepared and the kernel is done with the bytes: the held
  // chain has been dropped (its buffers went back unless shared).
  bool done() const { return state_ == State::kDone; }
  // A send was prepared and not yet done.
  bool busy() const {
    return state_ == State::kSent || state_ == State::kResult;
  }
  // The first completion arrived: result() is the bytes sent or -errno.
  bool has_result() const {
    return state_ == State::kResult || state_ == State::kDone;
  }
  int result() const { return result_; }
  // After the result: the bytes that were not sent (possibly empty), for
  // the next send, as a chain of the sent chain's pool; the sent ones stay
  // held until done().
  BufferChain TakeUnsent();
  // Puts the bytes the finished send did not take (see TakeUnsent()) back
  // in front of `queue`, before what the caller queued meanwhile: a short
  // send resumed in one call; `queue` then has the sent chain's pool. No
  // call at all when everything was sent. Throws std::bad_alloc, nothing
  // changed, when the slice ring must grow and cannot.
  void ReturnUnsentTo(BufferChain& queue);
  // Bytes the prepared send asked for: every slice it covers (all of the
  // chain's, up to kMaxIovecs slices).
  size_t requested() const { return requested_; }
  // Bytes this send keeps alive now, so out of the pool: the whole chain
  // from Prepare() until the result, then the sent bytes until done(), then
  // 0. What backpressure should count while a send is in flight.
  size_t held_bytes() const { return chain_.size(); }
  bool zero_copy() const { return zero_copy_; }

 private:
  void PrependUnsent(BufferChain& queue);
  [[noreturn]] static void DieBusy();

  enum class State { kIdle, kSent, kResult, kDone };
  State state_ = State::kIdle;
  bool zero_copy_ = false;
  bool await_notif_ = false;
  int result_ = 0;
  size_t requested_ = 0;
  BufferChain chain_;
  BufferChain unsent_;
  msghdr msg_{};
  std::unique_ptr<iovec[]> iov_;  // iov_cap_ entries
  size_t iov_cap_ = 0;
};

}  // namespace bufpool

#include "bufpool/internal/uring_inl.h"  // IWYU pragma: export

#endif  // BUFPOOL_URING_H_

// libbufpool: pool buffers in your own io_uring loop.
//
// The pieces an io_uring server builds around a BufferPool (docs/uring.md
// says how they fit, examples/uring_echo.cc is a complete server; both are
// installed in share/doc/bufpool):
// ProvidedBufferRing lends pool buffers to the kernel for IOSQE_BUFFER_SELECT
// receives and turns each completion into bytes a BufferChain owns;
// ParkedReceives re-arms receives that ran out of buffers; FixedBuffers
// registers the pool's region; HeldSend keeps a sent chain alive until the
// kernel is done with it.
//
//   auto pool = bufpool::BufferPool::Create({});  // checks omitted
//   io_uring ring;
//   auto setup = bufpool::InitServerRing(&ring);  // not io_uring_queue_init
//   auto bufs = bufpool::ProvidedBufferRing::Create(&ring, **pool, {});
//   (*bufs)->PrepareRecv(io_uring_get_sqe(&ring), fd);   // multishot recv
//   ... on each of its completions:  s = (*bufs)->Take(*cqe, conn.input);
//   ... every loop turn:             (*bufs)->Refill();
//
// Thread safety. Every object here is used by the one thread that drives its
// io_uring (liburing rings are not thread-safe either). The chains Take()
// fills are values: they may be moved to and dropped on any thread; their
// buffers go back to the pool, and the ring lends them again on a Refill().
//
// Ownership. The caller owns the io_uring and the pool; both must outlive
// every object here, which must be destroyed before io_uring_queue_exit()
// (they unregister what they registered; ParkedReceives: see there).
#ifndef BUFPOOL_URING_H_
#define BUFPOOL_URING_H_

#include <liburing.h>
#include <sys/socket.h>
#include <sys/uio.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "bufpool/buffer_pool.h"
#include "bufpool/chain.h"
#include "bufpool/export.h"

namespace bufpool {

// How InitServerRing() creates a ring.
struct ServerRingOptions {
  unsigned entries = 256;   // submission queue slots (> 0)
  unsigned cq_entries = 0;  // completion queue slots; 0: 8 x entries (<= 65536)
  // Starts disabled: the thread that will drive it calls EnableServerRing().
  bool start_disabled = false;
};

// What InitServerRing() chose.
struct BUFPOOL_EXPORT ServerRingSetup {
  unsigned flags = 0;    // the IORING_SETUP_* flags the ring has
  unsigned refused = 0;  // those asked for that this kernel refused
  // "DEFER_TASKRUN|SINGLE_ISSUER|...", and " (refused: ...)".
  std::string Describe() const;
};

// Creates `ring` for a server that drives it from one thread (SINGLE_ISSUER,
// DEFER_TASKRUN, ...; each dropped where the kernel lacks it; docs/uring.md).
// Only that thread may then submit or register, and completions arrive only
// while it waits in the kernel. InvalidArgument for sizes outside the
// kernel's limits; the kernel's error otherwise, the ring untouched.
BUFPOOL_EXPORT absl::StatusOr<ServerRingSetup> InitServerRing(
    io_uring* ring, const ServerRingOptions& options = {});

// Enables a ring created with start_disabled, making the calling thread its
// only submitter. OK when the ring was not disabled; the kernel's error.
BUFPOOL_EXPORT absl::Status EnableServerRing(io_uring* ring);

// A pool's whole region registered with one io_uring as fixed buffers (an
// elastic pool's chunk by chunk; docs/uring.md). The pages count against
// RLIMIT_MEMLOCK, and the pool's Trim() gives nothing back while registered.
// Movable; destroying it unregisters the table.
class BUFPOOL_EXPORT FixedBuffers {
 public:
  // Bytes one registered buffer covers at most: the kernel's limit (1 GiB).
  static constexpr size_t kMaxRegisteredBytes = size_t{1} << 30;

  // ResourceExhausted naming RLIMIT_MEMLOCK when it is too low; the kernel's
  // error otherwise (EBUSY: the ring already has a table).
  static absl::StatusOr<FixedBuffers> Register(io_uring* ring,
                                               const BufferPool& pool);

  FixedBuffers(FixedBuffers&& other) noexcept;
  FixedBuffers& operator=(FixedBuffers&& other) noexcept;
  FixedBuffers(const FixedBuffers&) = delete;
  FixedBuffers& operator=(const FixedBuffers&) = delete;
  ~FixedBuffers();

  // The buf_index for *_fixed operations on a pool buffer's bytes at `p`; -1
  // outside the region, or when registering an elastic pool's chunk fails.
  int IndexOf(const void* p) const;
  unsigned count() const { return count_; }  // table entries
  size_t size() const { return bytes_; }

  void Unregister();  // now; IndexOf() is -1 for all after

 private:
  FixedBuffers(io_uring* ring, std::byte* base, size_t bytes, unsigned count)
      : ring_(ring), base_(base), bytes_(bytes), count_(count) {}
  int RegisterChunk(unsigned index) const;

  io_uring* ring_ = nullptr;  // nullptr: nothing to unregister
  std::byte* base_ = nullptr;
  size_t bytes_ = 0;
  unsigned count_ = 0;
  unsigned shift_ = 30;  // log2 of the bytes one entry covers
  mutable std::vector<uint64_t> registered_;  // elastic: bit i: registered
  BufferPool* pinned_ = nullptr;  // the pool pinned while registered
};

inline constexpr size_t kDefaultCopyBelow = ~size_t{0};  // buffer_size / 8

struct ProvidedBufferRingOptions {
  uint16_t group_id = 0;  // the buffer group receives name
  // The most pool buffers lent at once (<= 32768, and what the pool has not
  // promised elsewhere). kAutoMaxBuffers: 512, or what is left if fewer.
  static constexpr size_t kAutoMaxBuffers = 0;
  size_t max_buffers = kAutoMaxBuffers;
  size_t initial_buffers = 64;  // lent at Create(); grows with the load
  // ShouldRearm() once available() reaches this; 0: a quarter of the peak.
  size_t rearm_threshold = 0;
  // Bundles (Linux 6.10+): one completion may fill several buffers.
  enum class Bundles { kProbe, kOff, kOn };
  Bundles bundles = Bundles::kProbe;
  // Completions are copied into the chain's tail_room(), and those under
  // this many bytes into a pack buffer the ring's chains share, rather than
  // linked (see "Memory" below). 0: copying off. Default: buffer_size / 8.
  size_t copy_below = kDefaultCopyBelow;
  // Incremental consumption (Linux 6.12+): the kernel fills one buffer
  // across many completions. Stream sockets only (see PrepareRecv()).
  enum class Incremental { kProbe, kOff, kOn };
  Incremental incremental = Incremental::kProbe;
};

// Pool buffers lent to an io_uring provided-buffer ring (buffer group
// `group_id`), for pools of any size.
//
// Memory. With copying on (the default) a chain that received B bytes
// holds buffers of its own for at most B + 2 * buffer_size bytes, and an
// empty one none (worst cases: docs/uring.md); the ring keeps a pack buffer
// for short receives (pack_buffers()), which holders report as "chain".
//
// A receive completion without IORING_CQE_F_MORE is its last: re-arm
// (PrepareRecv) unless res is 0 (end of stream) or an error; -ENOBUFS: park
// (ParkedReceives). To pause, do not re-arm; to end an armed receive
// (pausing, closing), io_uring_prep_cancel64() its user_data, or
// shutdown(fd, SHUT_RDWR); close(fd) alone leaves it armed. Each completion
// with IORING_CQE_F_BUFFER must reach Take(), Visit() or TakeBuffer(), a
// closed connection's too: only they give its buffer back (docs/uring.md).
class BUFPOOL_EXPORT ProvidedBufferRing {
 public:
  using Options = ProvidedBufferRingOptions;
  static constexpr size_t kMaxBuffers = 32768;

  // Registers the group with `ring` and lends it initial_buffers. Errors:
  // InvalidArgument for bad options; the kernel's (EEXIST: the group is
  // taken); ResourceExhausted, naming the numbers, when the pool cannot.
  static absl::StatusOr<std::unique_ptr<ProvidedBufferRing>> Create(
      io_uring* ring, BufferPool& pool, const Options& options);

  // Unregisters the group and gives every buffer still lent back to the
  // pool (filled chains stay valid); on the ring's thread, before
  // io_uring_queue_exit(). Completions still queued must not reach Take().
  ~ProvidedBufferRing();
  ProvidedBufferRing(const ProvidedBufferRing&) = delete;
  ProvidedBufferRing& operator=(const ProvidedBufferRing&) = delete;

  struct RecvOptions {
    bool multishot = true;  // else single-shot
    bool bundle = true;     // ask for a bundle where bundles() is on
    int msg_flags = 0;
    // The most bytes over all its completions (0: no cap). Without
    // multishot_cap() the receive is made single-shot with this length.
    size_t max_bytes = 0;
    // `fd` is a stream socket: PrepareRecv() need not ask (an incremental
    // ring otherwise asks, one getsockopt() per call).
    bool socket_checked = false;
  };
  // The largest RecvOptions::max_bytes the kernel is given (it reads an int).
  static constexpr size_t kMaxRecvBytes = size_t{1} << 30;
  // Fills `sqe` with a receive on `fd` from this ring's buffers; the caller
  // sets user_data. On an incremental ring a non-stream socket gets a NOP
  // whose completion Take() reports as FailedPrecondition.
  void PrepareRecv(io_uring_sqe* sqe, int fd) const {
    PrepareRecv(sqe, fd, RecvOptions());
  }
  void PrepareRecv(io_uring_sqe* sqe, int fd, const RecvOptions& options) const;
  // FailedPrecondition for a non-stream socket on an incremental ring.
  absl::Status CheckSocket(int fd) const;

  // The cqe.res bytes of a receive completion, as a chain that owns them
  // (empty at end of stream). Errors: cqe.res == -ENOBUFS (the ring was
  // empty): ResourceExhausted, park the receive until ShouldRearm(); other
  // -errno: the errno's Status (-ECANCELED: Cancelled); FailedPrecondition
  // for bytes in no buffer of this ring. Without incremental mode, the
  // buffer of a one-buffer completion that the chain links (not copies) is
  // replaced in the ring at once by a free buffer of the pool, one inline
  // acquire, so available() stays; with the pool dry, Refill() lends one.
  absl::StatusOr<BufferChain> Take(const io_uring_cqe& cqe);
  // The same, appended to `out`; errors and end of stream leave it
  // unchanged. But when `out`'s budget refuses, the bytes are in `out` and
  // the status is ResourceExhausted naming the budget (cqe.res > 0, unlike
  // -ENOBUFS): pause receiving until it drains. Throws std::bad_alloc,
  // nothing changed, when `out` cannot grow.
  absl::Status Take(const io_uring_cqe& cqe, BufferChain& out);

  // Calls fn(absl::Span<const std::byte>) with a one-buffer completion's
  // bytes where the kernel wrote them, then lends the buffer again; false,
  // nothing changed, for any other completion (give it to Take()). fn must
  // not keep the span or touch the ring; if it throws, the completion is
  // used up. Always false on an incremental ring (docs/uring.md: example).
  template <typename Fn>
  bool Visit(const io_uring_cqe& cqe, Fn&& fn);

  // Swaps a one-buffer completion's buffer (bytes [0, cqe.res)) with
  // `buffer`, an idle buffer of the ring's pool or empty, which the ring
  // lends in its place; false, nothing changed, where Visit() is, or for a
  // `buffer` of another pool. Never allocates or throws.
  bool TakeBuffer(const io_uring_cqe& cqe, Buffer& buffer) noexcept;

  // Lends free pool buffers up to target(); returns available(). Cheap when
  // nothing is needed: call it every loop turn, before waiting.
  size_t Refill();

  // Buffers lent and not yet taken (some may be in queued completions).
  size_t available() const { return in_ring_; }
  // Pool buffers kept beyond available(): the pack buffer (0 or 1). With
  // no other holder the pool's in_use is available() + pack_buffers().
  size_t pack_buffers() const { return pack_ && pack_->holds_buffer(); }
  size_t target() const { return target_; }  // grows to max_buffers
  size_t max_buffers() const { return max_buffers_; }
  size_t rearm_threshold() const;  // see Options
  bool ShouldRearm() const { return available() >= rearm_threshold(); }
  uint64_t enobufs() const { return enobufs_; }  // receives that ran out
  bool bundles() const { return bundles_; }
  // Whether the kernel caps a multishot receive's bytes (Linux 6.17+).
  bool multishot_cap() const { return multishot_cap_; }
  bool incremental() const { return incremental_; }
  size_t copy_below() const { return copy_below_; }  // as resolved
  // Completions copied, not linked; on an incremental ring, pieces: one
  // that spans two buffers counts twice.
  uint64_t copied() const { return copied_; }
  uint16_t group_id() const { return group_id_; }
  BufferPool& pool() const { return *pool_; }

 private:
  ProvidedBufferRing() = default;
  absl::Status Init(io_uring* ring, BufferPool& pool, const Options& options);
  absl::Status ApplyOptions(io_uring* ring, BufferPool& pool,
                            const Options& options);
  absl::Status MapAndRegister(Options::Incremental incremental);
  absl::Status Register(uint16_t flags);
  void AddAt(uint16_t id, std::byte* data, uint32_t at);
  void Relend(uint16_t id, std::byte* data);
  bool TakeInline(const io_uring_cqe& cqe, BufferChain& out);
  absl::Status TakeSlow(const io_uring_cqe& cqe, BufferChain& out);
  absl::Status TakeAny(const io_uring_cqe& cqe, BufferChain& out);
  void TakeOne(uint16_t id, size_t len, BufferChain& out);
  void TakeOut(uint16_t id, Buffer& buffer) noexcept;
  absl::Status TakeWithoutBuffer(int res);
  absl::Status TakeLinked(uint32_t id, size_t n, int res, BufferChain& out);
  absl::Status TakeBundleByCopy(uint32_t id, size_t n, size_t total,
                                BufferChain& out);
  absl::Status ReceiveError(int res) const;
  absl::Status MessageSocketError(absl::string_view what) const;
  absl::Status TakeIncremental(const io_uring_cqe& cqe, uint32_t id,
                               BufferChain& out);
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
  uint32_t entries_ = 0;     // ring entries, a power of two
  uint32_t inline_ids_ = 0;  // ids Take() may inline: entries_, or 0
  uint32_t mask_ = 0;
  uint32_t buffer_size_ = 0;
  size_t max_buffers_ = 0;
  size_t target_ = 0;
  size_t rearm_option_ = 0;
  internal::RelaxedCount in_ring_;  // read by pool reports (AddLender)
  size_t peak_ = 0;                 // most buffers in the ring at once
  bool ran_low_ = false;  // below target_ / 4, or -ENOBUFS, since Refill()
  // Since Refill(): ids whose linked buffer TakeOne() replaced at once (in
  // in_ring_ still, the old count being in_ring_ - replaced_), and whether
  // a replacement found the pool dry (then no more tries until Refill()).
  size_t replaced_ = 0;
  bool replace_failed_ = false;
  uint32_t tail_ = 0;  // entries published since the ring was created
  uint32_t next_ = 0;  // tail_ plus entries re-lent, not yet published
  uint64_t enobufs_ = 0;
  mutable uint64_t refused_ = 0;  // receives PrepareRecv() refused
  size_t copy_below_ = 0;
  uint64_t copied_ = 0;
  size_t committed_ = 0;  // buffers promised (internal::CommitLending)
  struct Lent;            // per buffer id: internal/uring_inl.h
  Buffer TakeLent(uint16_t id);
  Lent* InlineLent(const io_uring_cqe& cqe, uint32_t* id, uint32_t* len);
  std::vector<Lent> lent_;
  std::vector<SharedBuffer> shared_;  // incremental, per id: the ring's own
  std::vector<uint32_t> filled_;      // reference, and bytes filled so far
  std::vector<uint16_t> free_ids_;    // a stack
  std::vector<Buffer> scratch_;       // Refill()'s batch
  std::optional<ReceivePack> pack_;   // the pack buffer, made at Create()
};

// Receives that ended for want of a buffer (cqe.res == -ENOBUFS, without
// IORING_CQE_F_MORE), re-armed, oldest first, once ShouldRearm(); while the
// pool is dry, a read of the pool's notice (NotifyWhenFree() on an eventfd)
// in the caller's ring wakes the loop when a buffer is free. The loop that
// uses it: docs/uring.md, "Parking and sending".
//
// Thread safety and lifetime: the ring's thread; it may be destroyed after
// its ProvidedBufferRing. The eventfd read in flight writes into it:
// destroy it once !notice_pending(), or else after io_uring_queue_exit()
// (~ProvidedBufferRing, io_uring_queue_exit(), ~ParkedReceives).
class BUFPOOL_EXPORT ParkedReceives {
 public:
  // The eventfd's error (EMFILE, ...) when it cannot be created.
  static absl::StatusOr<std::unique_ptr<ParkedReceives>> Create(
      ProvidedBufferRing& ring);
  ~ParkedReceives();
  ParkedReceives(const ParkedReceives&) = delete;
  ParkedReceives& operator=(const ParkedReceives&) = delete;

  // Parks a receive of `who` (a connection); may throw std::bad_alloc.
  void Park(void* who) { parked_.push_back(who); }
  // Takes `who` (closing) off the list; false when not parked. O(parked).
  bool Remove(void* who);
  bool empty() const { return parked_.empty(); }
  size_t size() const { return parked_.size(); }
  bool notice_pending() const { return notice_pending_; }

  // Every loop turn after Refill(): calls rearm(who) for each parked receive
  // when the ring should re-arm; while any stay parked, prepares the
  // notice's read (user_data `notice_user_data`). Returns the count re-armed.
  template <typename Fn>
  size_t Rearm(io_uring* uring, uint64_t notice_user_data, Fn&& rearm);
  // Calls rearm(who) for every parked receive now (a loop that stops).
  template <typename Fn>
  size_t RearmAll(Fn&& rearm);
  void OnNotice();  // on the notice read's completion, whatever its result
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

// One send of a chain's bytes that keeps them alive until the kernel no
// longer reads them: its completion, or for zero-copy (Linux 6.0+) the
// notification (IORING_CQE_F_NOTIF). Not movable: the kernel reads its
// msghdr from Prepare() until done(). Its loop: docs/uring.md, "Parking and
// sending".
class BUFPOOL_EXPORT HeldSend {
 public:
  // Slices one send covers at most (UIO_MAXIOV); the rest stay unsent.
  static constexpr size_t kMaxIovecs = 1024;

  struct Options {
    // Zero-copy send (SEND_ZC / SENDMSG_ZC). Falls back to a copying send,
    // and zero_copy() reports false, when any slice is a shared pool's
    // (PoolOptions::shared): the kernel may hold a zero-copy send's pages
    // in the socket's retransmit queue after this process dies, when its
    // slots are already reclaimed and reused by another process.
    bool zero_copy = false;
    const FixedBuffers* fixed = nullptr;  // zero-copy only
    int msg_flags = MSG_NOSIGNAL;
  };

  HeldSend() = default;
  HeldSend(const HeldSend&) = delete;
  HeldSend& operator=(const HeldSend&) = delete;
  // Aborts while busy(): the kernel may still read the bytes.
  ~HeldSend();

  // Takes `chain` (not empty) and fills `sqe` with a send of it to `fd`;
  // only while idle or done(), dropping bytes left unsent and not taken.
  // Allocates only while the longest chain sent grows; throws
  // std::bad_alloc then, nothing changed.
  void Prepare(io_uring_sqe* sqe, int fd, BufferChain&& chain,
               const Options& options);
  void Prepare(io_uring_sqe* sqe, int fd, BufferChain&& chain) {
    Prepare(sqe, fd, std::move(chain), Options());
  }

  // Feeds one completion of the prepared send. Returns done().
  bool OnCompletion(const io_uring_cqe& cqe);

  // The kernel is done with the bytes, which are dropped.
  bool done() const { return state_ == State::kDone; }
  bool busy() const {
    return state_ == State::kSent || state_ == State::kResult;
  }
  // The first completion arrived: result() is the bytes sent or -errno.
  bool has_result() const {
    return state_ == State::kResult || state_ == State::kDone;
  }
  int result() const { return result_; }
  // After the result: the bytes not sent (possibly none).
  BufferChain TakeUnsent();
  // Puts the bytes not sent back in front of `queue`. Throws std::bad_alloc,
  // nothing changed, when `queue` cannot grow.
  void ReturnUnsentTo(BufferChain& queue);
  size_t requested() const { return requested_; }
  // Bytes this send keeps out of the pool now (what backpressure counts).
  size_t held_bytes() const { return chain_.size(); }
  // Whether the prepared send is zero-copy (Options::zero_copy and no
  // shared pool's slice).
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

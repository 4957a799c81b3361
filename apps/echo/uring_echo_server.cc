// The io_uring engine, written on the public toolkit (bufpool/uring.h):
// pool slots lent to a ProvidedBufferRing, received bytes taken as
// BufferChains, echoed with HeldSend.
//
// Per connection, at most one of each is in flight:
//   recv   multishot, buffers selected from the ring; each completion's
//          chain (one slot, or several for a bundle when the peer sends more
//          than a slot at a time) is appended to the connection's queue;
//   send   the queued chain (SEND for one slice, SENDMSG for several),
//          held until its completion; what it did not send goes back to the
//          front of the queue, and sent slots go back to the pool, from
//          which the ring's next Refill() lends them again;
// plus cancels of the recv (backpressure, close), which may overlap.
// A connection is freed once none of its operations is in flight.
//
// Backpressure, on the toolkit's public calls (the pattern in uring.h):
// each connection's queue and send charge a budget (bufpool/budget.h) of
// max_unsent_bytes rounded up to whole slots, whose watermarks (the limit,
// and half of it) stop and resume its receives; a recv's
// RecvOptions::max_bytes is the budget's room; where the kernel caps
// multishot receives
// (ProvidedBufferRing::multishot_cap(), Linux 6.17+) the recv ends by
// itself there, elsewhere it is an uncapped multishot recv cancelled past
// half the limit and then single-shot capped ones. Past max_unsent_bytes
// none is armed until the queue drains to half. DEFER_TASKRUN bounds how
// many slots the kernel fills between two turns of the loop.
//
// Running out. When the ring is empty a multishot recv ends with -ENOBUFS
// (ResourceExhausted from Take()); the connection waits in a FIFO and is
// re-armed once the ring's ShouldRearm() policy says enough buffers are
// back, at most as many per loop turn as the ring holds, so an empty ring
// never makes the loop spin.
#include <liburing.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <memory>

#include "absl/strings/str_cat.h"
#include "bufpool/chain.h"
#include "bufpool/uring.h"
#include "echo/echo_engines.h"
#include "os/error.h"
#include "os/socket.h"

namespace bufpool::net {
namespace {

constexpr uint16_t kGroup = 0;  // buffer group id of the ring

// user_data: a Conn pointer (8-aligned) with the operation in the low bits.
enum Op : uint64_t {
  kAccept = 1,
  kStop = 2,
  kRecv = 3,
  kSend = 4,
  kCancel = 5
};
constexpr uint64_t kOpMask = 7;

struct Conn {
  int fd = -1;
  // What the queue and the send in flight pin (the send's chain keeps the
  // queue's binding); declared first so that it outlives both.
  std::unique_ptr<BufferBudget> budget;
  BufferChain queue;  // received, not yet handed to a send
  HeldSend send;
  size_t holding = 0;  // buffers counted in buffers_holding_data
  // The send in flight: the distinct buffers it holds bytes of, and its
  // last slice's buffer (which the queue's first slice may share).
  size_t sending_buffers = 0;
  const BufferPool* sending_tail_pool = nullptr;
  uint32_t sending_tail_slot = 0;
  int ops = 0;  // operations in flight that name this connection
  bool recv_armed = false;
  bool recv_cancelled = false;  // a cancel of the armed recv is in flight
  bool recv_bundle = false;     // the armed recv is a bundle
  // This peer sends more than a slot at a time, so its recv should be a
  // bundle (see NoteRecvSize).
  bool wants_bundle = false;
  uint8_t small_recvs = 0;  // bundle receives in a row of one slot or less
  bool read_eof = false;
  // Set by the budget's on_high (the limit reached), cleared by its on_low
  // (drained to half): no recv is armed meanwhile.
  bool over_limit = false;
  bool parked = false;  // waiting in the FIFO for ring buffers
  bool closing = false;
  Conn* parked_next = nullptr;
  Conn* prev = nullptr;  // list of all connections
  Conn* next = nullptr;
};

class UringEchoServer final : public EchoServer {
 public:
  explicit UringEchoServer(const EchoServerOptions& options)
      : options_(options), pool_(options.pool) {
    engine_ = EchoEngine::kUring;
  }

  ~UringEchoServer() override {
    bufs_.reset();  // before the ring it is registered with
    if (ring_ready_) io_uring_queue_exit(&ring_);
  }

  absl::Status Init();
  absl::Status Run() override;

 private:
  io_uring_sqe* Sqe();
  ProvidedBufferRingOptions RingOptions(size_t initial) const;
  void ArmAccept();
  void ArmRecv(Conn* conn);
  void CancelRecv(Conn* conn);
  void MaybeArmRecv(Conn* conn);
  void StartSend(Conn* conn);
  void BeginClose(Conn* conn);
  void MaybeFinish(Conn* conn);
  void SyncHolding(Conn* conn);
  void OnAccept(const io_uring_cqe& cqe);
  void OnRecv(Conn* conn, const io_uring_cqe& cqe);
  void OnSend(Conn* conn, const io_uring_cqe& cqe);
  void NoteRecvSize(Conn* conn, const io_uring_cqe& cqe, bool more);
  void Park(Conn* conn);
  void RearmParked();
  void OnStop();

  EchoServerOptions options_;
  BufferPool* pool_;
  io_uring ring_{};
  bool ring_ready_ = false;
  std::unique_ptr<ProvidedBufferRing> bufs_;  // during Run()
  Conn* conns_ = nullptr;
  Conn* parked_head_ = nullptr;
  Conn* parked_tail_ = nullptr;
  bool accept_armed_ = false;
  bool accept_paused_ = false;  // out of descriptors: re-armed on a close
  bool stop_armed_ = false;
  bool stopping_ = false;
};

ProvidedBufferRingOptions UringEchoServer::RingOptions(size_t initial) const {
  size_t max =
      options_.ring_buffers != 0 ? options_.ring_buffers : pool_->capacity();
  max = std::min<size_t>(
      {max, pool_->capacity(), ProvidedBufferRing::kMaxBuffers});
  // Incremental consumption pays for large slots, which it shares between
  // messages; a 4 KiB slot is about one message already, and slicing it
  // costs a counted reference per receive.
  constexpr size_t kIncrementalFrom = 16 * 1024;
  return {.group_id = kGroup,
          .max_buffers = std::max<size_t>(max, 1),
          .initial_buffers = initial,
          .incremental = pool_->buffer_size() >= kIncrementalFrom
                             ? ProvidedBufferRingOptions::Incremental::kProbe
                             : ProvidedBufferRingOptions::Incremental::kOff};
}

absl::Status UringEchoServer::Init() {
  if (pool_->capacity() == 0) {
    return absl::InvalidArgumentError("pool is empty");
  }
  // Task work (which is where the kernel fills ring buffers for a
  // multishot recv) runs only when Run() waits, a bounded batch at a time
  // (DEFER_TASKRUN); that needs a single submitting thread, which is the one
  // that enables the ring: Run()'s (start_disabled).
  absl::StatusOr<ServerRingSetup> setup = InitServerRing(
      &ring_, {.entries = 1024, .cq_entries = 16384, .start_disabled = true});
  if (!setup.ok()) return setup.status();
  ring_ready_ = true;
  // Provided-buffer rings (Linux 5.19+): registering one proves it. A pool
  // with nothing free is Run()'s error, not a missing kernel feature.
  absl::StatusOr<std::unique_ptr<ProvidedBufferRing>> probe =
      ProvidedBufferRing::Create(&ring_, *pool_, RingOptions(1));
  if (!probe.ok() &&
      probe.status().code() != absl::StatusCode::kResourceExhausted) {
    return probe.status();
  }
  return absl::OkStatus();
}

io_uring_sqe* UringEchoServer::Sqe() {
  io_uring_sqe* sqe = io_uring_get_sqe(&ring_);
  while (sqe == nullptr) {  // the submission queue is full: flush it
    io_uring_submit(&ring_);
    sqe = io_uring_get_sqe(&ring_);
  }
  return sqe;
}

void UringEchoServer::ArmAccept() {
  io_uring_sqe* sqe = Sqe();
  io_uring_prep_multishot_accept(sqe, listen_fd_, nullptr, nullptr,
                                 SOCK_CLOEXEC);
  io_uring_sqe_set_data64(sqe, kAccept);
  accept_armed_ = true;
}

void UringEchoServer::ArmRecv(Conn* conn) {
  io_uring_sqe* sqe = Sqe();
  const bool below_half =
      conn->budget->pinned_bytes() < conn->budget->max_bytes() / 2;
  const bool cap = bufs_->multishot_cap();
  ProvidedBufferRing::RecvOptions ro;
  // The receive may deliver the budget's room (whole slots: a slot holds
  // as much memory for one byte as for its size), so a connection never
  // pins more than its limit plus one slot however fast the kernel fills
  // them, and a limit below a slot still moves a slot per recv. Where the
  // kernel caps multishot receives that cap ends the receive by itself;
  // elsewhere PrepareRecv() makes a capped receive single-shot, so below
  // half the limit the recv is an uncapped multishot one, cancelled at half
  // (OnRecv).
  const size_t slot = pool_->buffer_size();
  const size_t room = std::max(conn->budget->room_bytes(), slot);
  ro.multishot = cap || below_half;
  if (cap || !below_half) ro.max_bytes = room;
  // A bundle only for a peer that sends more than a slot at a time: for
  // one-slot messages the kernel's peek at several ring entries per receive
  // is pure cost (io_ring_buffers_peek in profiles of 4 KiB messages).
  ro.bundle = conn->wants_bundle && ro.multishot;
  ro.socket_checked = true;  // an accepted TCP connection: a stream
  bufs_->PrepareRecv(sqe, conn->fd, ro);
  conn->recv_bundle = ro.bundle && bufs_->bundles();
  // Poll first: an idle connection takes no slot and gets no -ENOBUFS.
  sqe->ioprio |= IORING_RECVSEND_POLL_FIRST;
  io_uring_sqe_set_data64(sqe, reinterpret_cast<uint64_t>(conn) | kRecv);
  conn->recv_armed = true;
  conn->recv_cancelled = false;
  ++conn->ops;
}

void UringEchoServer::CancelRecv(Conn* conn) {
  if (!conn->recv_armed || conn->recv_cancelled) return;
  io_uring_sqe* sqe = Sqe();
  io_uring_prep_cancel64(sqe, reinterpret_cast<uint64_t>(conn) | kRecv, 0);
  io_uring_sqe_set_data64(sqe, reinterpret_cast<uint64_t>(conn) | kCancel);
  conn->recv_cancelled = true;
  ++conn->ops;
}

void UringEchoServer::MaybeArmRecv(Conn* conn) {
  if (!conn->recv_armed && !conn->read_eof && !conn->closing &&
      !conn->over_limit && !conn->parked) {
    ArmRecv(conn);
  }
}

// buffers_holding_data counts the distinct buffers of queued and in-flight
// bytes: a buffer the send's last slice and the queue's first share counts
// once.
void UringEchoServer::SyncHolding(Conn* conn) {
  size_t now = BuffersHoldingData(conn->queue) + conn->sending_buffers;
  if (conn->sending_buffers != 0 && !conn->queue.empty() &&
      conn->queue.slice(0).pool() == conn->sending_tail_pool &&
      conn->queue.slice(0).slot() == conn->sending_tail_slot) {
    --now;
  }
  if (now > conn->holding) {
    counters_->AddHolding(now - conn->holding);
  } else if (now < conn->holding) {
    Counters::Sub(counters_->buffers_holding_data, conn->holding - now);
  }
  conn->holding = now;
}

void UringEchoServer::StartSend(Conn* conn) {
  if (conn->send.busy() || conn->closing || conn->queue.empty()) return;
  conn->sending_buffers = BuffersHoldingData(conn->queue);
  const SharedBuffer& tail = conn->queue.slice(conn->queue.slice_count() - 1);
  conn->sending_tail_pool = tail.pool();
  conn->sending_tail_slot = tail.slot();
  io_uring_sqe* sqe = Sqe();
  conn->send.Prepare(sqe, conn->fd, std::move(conn->queue));
  io_uring_sqe_set_data64(sqe, reinterpret_cast<uint64_t>(conn) | kSend);
  ++conn->ops;
}

// Callers call MaybeFinish() once they no longer touch `conn`.
void UringEchoServer::BeginClose(Conn* conn) {
  if (conn->closing) return;
  conn->closing = true;
  CancelRecv(conn);
  // A send to a peer that stopped reading could wait forever: fail it.
  if (conn->send.busy()) os::Shutdown(conn->fd, SHUT_RDWR).IgnoreError();
}

// Frees a closing connection once the kernel holds no reference to it.
void UringEchoServer::MaybeFinish(Conn* conn) {
  if (!conn->closing || conn->ops != 0) return;
  conn->queue.Clear();  // its slots go back to the pool
  SyncHolding(conn);
  if (conn->parked) {  // unlink from the FIFO
    Conn** p = &parked_head_;
    Conn* prev = nullptr;
    while (*p != conn) {
      prev = *p;
      p = &(*p)->parked_next;
    }
    *p = conn->parked_next;
    if (parked_tail_ == conn) parked_tail_ = prev;
  }
  if (conn->prev != nullptr) {
    conn->prev->next = conn->next;
  } else {
    conns_ = conn->next;
  }
  if (conn->next != nullptr) conn->next->prev = conn->prev;
  os::CloseSocket(conn->fd).IgnoreError();  // EINTR/EIO: closed anyway
  delete conn;
  Counters::Sub(counters_->connections_open, 1);
  if (accept_paused_ && !stopping_) {
    accept_paused_ = false;
    ArmAccept();
  }
}

void UringEchoServer::OnAccept(const io_uring_cqe& cqe) {
  const bool more = (cqe.flags & IORING_CQE_F_MORE) != 0;
  if (!more) accept_armed_ = false;
  if (cqe.res >= 0) {
    if (stopping_) {
      os::CloseSocket(cqe.res).IgnoreError();
    } else {
      // Best effort, as in the epoll engine: without it echoes are slower,
      // not wrong.
      os::SetSockOptInt(cqe.res, IPPROTO_TCP, TCP_NODELAY, 1, "TCP_NODELAY")
          .IgnoreError();
      auto* conn = new Conn;
      conn->fd = cqe.res;
      // The callbacks run inside the queue's and the send's chain calls:
      // they only set the flag (and count), OnRecv/OnSend act on it.
      absl::StatusOr<std::unique_ptr<BufferBudget>> budget =
          net::MakeConnectionBudget(
              *pool_, options_.max_unsent_bytes, cqe.res,
              [this, conn] {
                conn->over_limit = true;
                Counters::Add(counters_->unsent_limit_stalls, 1);
              },
              [conn] { conn->over_limit = false; });
      if (!budget.ok()) {  // no reservation asked, so never
        os::CloseSocket(cqe.res).IgnoreError();
        delete conn;
        return;
      }
      conn->budget = *std::move(budget);
      conn->queue = BufferChain(*conn->budget);
      conn->next = conns_;
      if (conns_ != nullptr) conns_->prev = conn;
      conns_ = conn;
      Counters::Add(counters_->connections_accepted, 1);
      Counters::Add(counters_->connections_open, 1);
      ArmRecv(conn);
    }
  }
  if (!more && !stopping_) {
    if (cqe.res == -EMFILE || cqe.res == -ENFILE || cqe.res == -ENOMEM ||
        cqe.res == -ENOBUFS) {
      // Re-arming now would fail the same way at once: wait for a close.
      if (conns_ != nullptr) {
        accept_paused_ = true;
        return;
      }
    }
    ArmAccept();
  }
}

void UringEchoServer::Park(Conn* conn) {
  conn->parked = true;
  conn->parked_next = nullptr;
  if (parked_tail_ != nullptr) {
    parked_tail_->parked_next = conn;
  } else {
    parked_head_ = conn;
  }
  parked_tail_ = conn;
  Counters::Add(counters_->pool_dry_stalls, 1);
}

void UringEchoServer::OnRecv(Conn* conn, const io_uring_cqe& cqe) {
  const bool more = (cqe.flags & IORING_CQE_F_MORE) != 0;
  if (!more) {  // the multishot recv has ended
    conn->recv_armed = false;
    --conn->ops;
  }
  // The bytes go straight onto the connection's queue; a closing
  // connection's are dropped.
  absl::Status got;
  size_t n = 0;
  if (conn->closing) {
    BufferChain dropped;
    got = bufs_->Take(cqe, dropped);
  } else {
    const size_t queued = conn->queue.size();
    got = bufs_->Take(cqe, conn->queue);
    n = conn->queue.size() - queued;
  }
  // ResourceExhausted with bytes is the budget's: they are queued all the
  // same (see ProvidedBufferRing::Take), and on_high has stopped reading.
  const bool kept =
      got.ok() ||
      (got.code() == absl::StatusCode::kResourceExhausted && cqe.res > 0);
  if (kept && n > 0) {
    Counters::Add(counters_->bytes_received, n);
    SyncHolding(conn);
    if (bufs_->bundles()) NoteRecvSize(conn, cqe, more);
    if (conn->over_limit) {
      if (more) CancelRecv(conn);
    } else if (!bufs_->multishot_cap() && more &&
               conn->budget->pinned_bytes() >= conn->budget->max_bytes() / 2) {
      CancelRecv(conn);  // re-armed single-shot when this recv ends
    }
  } else if (kept) {
    if (cqe.res == 0) conn->read_eof = true;  // echo what is queued, close
  } else if (cqe.res == -ENOBUFS) {  // the ring was empty, not the budget
    if (!conn->closing && !more) Park(conn);
  } else if (cqe.res != -ECANCELED) {
    BeginClose(conn);  // reset or other error
  }
  StartSend(conn);
  if (conn->read_eof && conn->queue.empty() && !conn->send.busy()) {
    BeginClose(conn);
  }
  if (!more) MaybeArmRecv(conn);
  MaybeFinish(conn);
}

// Chooses between a plain and a bundle recv for a connection from what its
// receives bring. A plain recv that filled a slot and left data in the
// socket (IORING_CQE_F_SOCK_NONEMPTY) means a message spans several slots:
// switch to a bundle. Back to plain after kSmallRecvs bundle receives in a
// row that brought at most one slot and emptied the socket (the end of a
// large message can look like that once, not eight times running). A switch
// cancels the multishot recv; it is re-armed in the new mode when it ends.
void UringEchoServer::NoteRecvSize(Conn* conn, const io_uring_cqe& cqe,
                                   bool more) {
  constexpr uint8_t kSmallRecvs = 8;
  const bool big = static_cast<size_t>(cqe.res) > pool_->buffer_size() ||
                   (cqe.flags & IORING_CQE_F_SOCK_NONEMPTY) != 0;
  if (big) {
    conn->small_recvs = 0;
    conn->wants_bundle = true;
  } else if (conn->recv_bundle && ++conn->small_recvs >= kSmallRecvs) {
    conn->small_recvs = 0;
    conn->wants_bundle = false;
  }
  if (more && conn->wants_bundle != conn->recv_bundle) CancelRecv(conn);
}

void UringEchoServer::OnSend(Conn* conn, const io_uring_cqe& cqe) {
  if (!conn->send.OnCompletion(cqe)) return;  // a notification is to come
  --conn->ops;
  const int res = conn->send.result();
  conn->sending_buffers = 0;
  if (res < 0) {
    conn->send.TakeUnsent().Clear();
    SyncHolding(conn);
    BeginClose(conn);  // EPIPE/ECONNRESET: the peer is gone
    MaybeFinish(conn);
    return;
  }
  Counters::Add(counters_->bytes_sent, static_cast<uint64_t>(res));
  // What was not sent goes first, then what arrived meanwhile. The sent
  // bytes' buffers left the budget as the send consumed them (on_low, at
  // half, cleared over_limit).
  conn->send.ReturnUnsentTo(conn->queue);
  SyncHolding(conn);
  MaybeArmRecv(conn);
  StartSend(conn);
  if (conn->read_eof && conn->queue.empty() && !conn->send.busy()) {
    BeginClose(conn);
  }
  MaybeFinish(conn);
}

// The ring's policy for running out: re-arm parked connections once
// ShouldRearm(), at most as many per turn as the ring holds.
void UringEchoServer::RearmParked() {
  size_t budget = bufs_->available();
  while (budget > 0 && parked_head_ != nullptr && bufs_->ShouldRearm()) {
    Conn* conn = parked_head_;
    parked_head_ = conn->parked_next;
    if (parked_head_ == nullptr) parked_tail_ = nullptr;
    conn->parked = false;
    MaybeArmRecv(conn);
    --budget;
  }
}

void UringEchoServer::OnStop() {
  stop_armed_ = false;
  if (stopping_) return;
  // No new connections; every open one is shut down and closed.
  stopping_ = true;
  if (accept_armed_) {
    io_uring_sqe* s = Sqe();
    io_uring_prep_cancel64(s, kAccept, 0);
    io_uring_sqe_set_data64(s, 0);  // ignored
  }
  accept_paused_ = false;
  for (Conn* c = conns_; c != nullptr;) {
    Conn* next = c->next;  // MaybeFinish may free c
    os::Shutdown(c->fd, SHUT_RDWR).IgnoreError();
    BeginClose(c);
    MaybeFinish(c);
    c = next;
  }
}

absl::Status UringEchoServer::Run() {
  if (absl::Status s = EnableServerRing(&ring_); !s.ok()) return s;
  // Lent as the load needs them: 64 at first (the ring is a FIFO, so a
  // small ring keeps the slots the kernel copies into warm in the cache).
  absl::StatusOr<std::unique_ptr<ProvidedBufferRing>> bufs =
      ProvidedBufferRing::Create(&ring_, *pool_, RingOptions(64));
  if (!bufs.ok()) {
    if (bufs.status().code() == absl::StatusCode::kResourceExhausted) {
      return absl::ResourceExhaustedError(
          "echo server (uring): the pool has no free slot for the buffer "
          "ring");
    }
    return bufs.status();
  }
  bufs_ = *std::move(bufs);

  io_uring_sqe* sqe = Sqe();
  io_uring_prep_poll_add(sqe, stop_fd_, POLLIN);
  io_uring_sqe_set_data64(sqe, kStop);
  stop_armed_ = true;
  ArmAccept();

  absl::Status status;
  while (!stopping_ || conns_ != nullptr || accept_armed_ || stop_armed_) {
    int ret = io_uring_submit_and_wait(&ring_, 1);
    if (ret < 0 && ret != -EINTR && ret != -EAGAIN && ret != -EBUSY) {
      status = os::PosixError("io_uring_submit_and_wait", -ret);
      break;
    }
    io_uring_cqe* cqe_ptr;
    while (io_uring_peek_cqe(&ring_, &cqe_ptr) == 0) {
      const io_uring_cqe cqe = *cqe_ptr;
      io_uring_cqe_seen(&ring_, cqe_ptr);
      const uint64_t op = cqe.user_data & kOpMask;
      auto* conn = reinterpret_cast<Conn*>(cqe.user_data & ~kOpMask);
      switch (op) {
        case kAccept:
          OnAccept(cqe);
          break;
        case kStop:
          OnStop();
          break;
        case kRecv:
          OnRecv(conn, cqe);
          break;
        case kSend:
          OnSend(conn, cqe);
          break;
        case kCancel:
          --conn->ops;
          MaybeFinish(conn);
          break;
        default:
          break;  // the accept cancel
      }
    }
    if (!stopping_) {
      bufs_->Refill();
      RearmParked();
    }
  }
  // Every operation is complete, so the kernel holds no slot: the ring
  // gives every lent one back to the pool.
  bufs_.reset();
  return status;
}

}  // namespace

absl::StatusOr<std::unique_ptr<EchoServer>> MakeUringEchoServer(
    const EchoServerOptions& options) {
  // Lets tests and users exercise the fallback on a machine that has
  // io_uring (like a kernel with kernel.io_uring_disabled set).
  if (const char* off = std::getenv("BUFPOOL_DISABLE_IO_URING");
      off != nullptr && *off != '\0' && *off != '0') {
    return absl::UnavailableError(
        "io_uring is unavailable: disabled by BUFPOOL_DISABLE_IO_URING");
  }
  auto server = std::make_unique<UringEchoServer>(options);
  if (absl::Status s = server->Init(); !s.ok()) {
    return absl::UnavailableError(
        absl::StrCat("io_uring is unavailable: ", s.message()));
  }
  return server;
}

}  // namespace bufpool::net

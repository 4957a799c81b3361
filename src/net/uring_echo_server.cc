// The io_uring engine: pool slots as a provided-buffer ring.
//
// Setup (Run): free slots are taken from the pool and added to a buffer ring
// (group kGroup) with buffer id == slot index, so a receive completion names
// its slot directly and data is never copied. Slots are lent as the load
// needs them (kInitialRingSlots, then doubling up to `ring_buffers`): the
// ring hands them out in FIFO order, so the fewer it holds, the warmer in
// the cache the slot the kernel copies into.
//
// Per connection, at most one of each is in flight:
//   recv   multishot, IOSQE_BUFFER_SELECT from the ring; each completion
//          carries one filled slot (or, as a bundle for a peer that sends
//          more than a slot at a time, several), appended to the
//          connection's queue;
//   send   of the one queued slot, or sendmsg of up to kEchoReadBuffers
//          queued slots, in order; fully sent slots go straight back to the
//          ring;
// plus cancels of the recv (backpressure, close), which may overlap.
// A connection is freed once none of its operations is in flight.
//
// Backpressure. A connection with less than max_unsent_bytes / 2 unsent has
// a multishot recv; past that it is cancelled and replaced by single-shot
// recvs (one slot each), and past max_unsent_bytes none is armed until the
// queue drains to half. A multishot recv may overshoot by the slots the
// kernel fills before the cancel lands; DEFER_TASKRUN keeps that to one
// bounded batch of task work. When the ring is empty a multishot recv ends with
// -ENOBUFS; the connection waits in a FIFO and is re-armed when slots are back
// in the ring (at most as many re-arms per event-loop turn as the ring holds
// free slots, so an empty ring never makes the loop spin).
#include <liburing.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <vector>

#include "absl/strings/str_cat.h"
#include "net/echo_engines.h"
#include "os/error.h"

namespace bufpool::net {
namespace {

constexpr uint16_t kGroup = 0;  // buffer group id of the ring
constexpr uint32_t kMaxRingEntries = 32768;
constexpr uint32_t kNone = 0xffffffffu;  // end of a slot queue
// Slots lent to the ring when Run() starts; it grows (doubling) while less
// than a quarter of the lent slots are free in the ring. The ring is a FIFO,
// so every lent slot is written in turn: lending only what the load needs
// keeps the slots the kernel copies into warm in the cache (all 8192 slots
// of a 32 MiB pool would not be).
constexpr size_t kInitialRingSlots = 64;
// Newer than liburing 2.3's header: a recv that fills several ring buffers
// per completion ("bundle", Linux 6.10), and its feature bit.
constexpr uint16_t kRecvSendBundle = 1u << 4;
constexpr uint32_t kFeatRecvSendBundle = 1u << 14;

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
  uint32_t head = kNone;  // queue of slots holding unsent data (next_[slot])
  uint32_t tail = kNone;
  size_t unsent = 0;
  int ops = 0;  // operations in flight that name this connection
  bool recv_armed = false;
  bool recv_cancelled = false;  // a cancel of the armed recv is in flight
  bool recv_bundle = false;     // the armed recv is a bundle
  // This peer sends more than a slot at a time, so its recv should be a
  // bundle (see NoteRecvSize).
  bool wants_bundle = false;
  uint8_t small_recvs = 0;  // bundle receives in a row of one slot or less
  bool send_inflight = false;
  bool read_eof = false;
  bool over_limit = false;
  bool starved = false;  // waiting in the FIFO for ring slots
  bool closing = false;
  uint32_t iov_slots = 0;  // slots covered by the send in flight
  Conn* starved_next = nullptr;
  Conn* prev = nullptr;  // list of all connections
  Conn* next = nullptr;
  msghdr msg{};
  iovec iov[kEchoReadBuffers];
};

class UringEchoServer final : public EchoServer {
 public:
  explicit UringEchoServer(const EchoServerOptions& options)
      : options_(options), pool_(options.pool) {
    engine_ = EchoEngine::kUring;
  }

  ~UringEchoServer() override {
    if (ring_ready_) {
      if (buf_ring_ != nullptr) {
        io_uring_unregister_buf_ring(&ring_, kGroup);
        ::munmap(buf_ring_, buf_ring_bytes_);
      }
      io_uring_queue_exit(&ring_);
    }
  }

  absl::Status Init();
  absl::Status Run() override;

 private:
  io_uring_sqe* Sqe();
  void ArmAccept();
  void ArmRecv(Conn* conn);
  void CancelRecv(Conn* conn);
  void MaybeArmRecv(Conn* conn);
  void StartSend(Conn* conn);
  void BeginClose(Conn* conn);
  void MaybeFinish(Conn* conn);
  void OnAccept(const io_uring_cqe& cqe);
  void OnRecv(Conn* conn, const io_uring_cqe& cqe);
  void OnSend(Conn* conn, int res);
  void NoteRecvSize(Conn* conn, const io_uring_cqe& cqe, bool more);
  void ReturnToRing(uint32_t slot, int offset);
  size_t LendSlots(size_t n);
  void MaybeGrowRing();
  void RearmStarved();

  EchoServerOptions options_;
  BufferPool* pool_;
  io_uring ring_{};
  bool ring_ready_ = false;
  bool disabled_ = false;  // enabled by Run() (single issuer)
  bool mshot_cap_ = true;  // the kernel caps a multishot recv's total bytes
  bool bundle_ = false;    // one recv completion may fill several slots
  io_uring_buf_ring* buf_ring_ = nullptr;
  size_t buf_ring_bytes_ = 0;
  uint32_t ring_entries_ = 0;
  std::vector<uint32_t> lent_;  // slots lent to the ring during Run()
  size_t ring_want_ = 0;        // how many to lend at most
  uint32_t holding_ = 0;        // lent slots carrying data (not in the ring)
  // Per slot, out of band: queue link and the unsent part [off, len).
  std::vector<uint32_t> next_;
  // The ring's contents as we added them: entry -> slot, slot -> entry.
  std::vector<uint32_t> ring_slot_;
  std::vector<uint32_t> ring_pos_;
  std::vector<uint32_t> off_;
  std::vector<uint32_t> len_;
  Conn* conns_ = nullptr;
  Conn* starved_head_ = nullptr;
  Conn* starved_tail_ = nullptr;
  bool accept_armed_ = false;
  bool accept_paused_ = false;  // out of descriptors: re-armed on a close
  bool stop_armed_ = false;
  bool stopping_ = false;
};

absl::Status UringEchoServer::Init() {
  if (pool_->capacity() == 0) {
    return absl::InvalidArgumentError("pool is empty");
  }
  // Task work (which is where the kernel fills ring buffers for a
  // multishot recv) runs only when Run() waits, a bounded batch at a time
  // (DEFER_TASKRUN); that needs a single submitting thread, which is the one
  // that enables the ring: Run()'s (R_DISABLED).
  io_uring_params params{};
  params.flags = IORING_SETUP_SUBMIT_ALL | IORING_SETUP_CQSIZE |
                 IORING_SETUP_SINGLE_ISSUER | IORING_SETUP_DEFER_TASKRUN |
                 IORING_SETUP_R_DISABLED;
  params.cq_entries = 16384;
  int ret = io_uring_queue_init_params(1024, &ring_, &params);
  if (ret == -EINVAL) {  // an older kernel without some flag
    params = {};
    params.flags = IORING_SETUP_CQSIZE;
    params.cq_entries = 16384;
    ret = io_uring_queue_init_params(1024, &ring_, &params);
  }
  disabled_ = (params.flags & IORING_SETUP_R_DISABLED) != 0;
  if (ret < 0) return os::PosixError("io_uring_queue_init", -ret);
  ring_ready_ = true;

  // The ring's entries: a power of two covering the slots we may lend.
  size_t want =
      options_.ring_buffers != 0 ? options_.ring_buffers : pool_->capacity();
  want = std::min<size_t>({want, pool_->capacity(), kMaxRingEntries});
  ring_entries_ = 1;
  while (ring_entries_ < want) ring_entries_ <<= 1;
  buf_ring_bytes_ = ring_entries_ * sizeof(io_uring_buf);
  void* mem = ::mmap(nullptr, buf_ring_bytes_, PROT_READ | PROT_WRITE,
                     MAP_ANONYMOUS | MAP_PRIVATE, -1, 0);
  if (mem == MAP_FAILED) return os::PosixError("mmap(buffer ring)", errno);
  buf_ring_ = static_cast<io_uring_buf_ring*>(mem);
  io_uring_buf_ring_init(buf_ring_);
  io_uring_buf_reg reg{};
  reg.ring_addr = reinterpret_cast<uintptr_t>(mem);
  reg.ring_entries = ring_entries_;
  reg.bgid = kGroup;
  ret = io_uring_register_buf_ring(&ring_, &reg, 0);
  if (ret < 0) {
    ::munmap(buf_ring_, buf_ring_bytes_);
    buf_ring_ = nullptr;
    return os::PosixError("io_uring_register_buf_ring", -ret);
  }
  const size_t slots = std::min<size_t>(pool_->capacity(), 65536);
  next_.assign(slots, kNone);
  ring_pos_.assign(slots, 0);
  ring_slot_.assign(ring_entries_, kNone);
  bundle_ = (params.features & kFeatRecvSendBundle) != 0;
  off_.assign(slots, 0);
  len_.assign(slots, 0);
  ring_want_ = want;
  lent_.reserve(want);
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

void UringEchoServer::ReturnToRing(uint32_t slot, int offset) {
  const uint32_t pos = (buf_ring_->tail + offset) & (ring_entries_ - 1);
  ring_slot_[pos] = slot;
  ring_pos_[slot] = pos;
  io_uring_buf_ring_add(buf_ring_, pool_->SlotData(slot),
                        static_cast<unsigned>(pool_->buffer_size()),
                        static_cast<uint16_t>(slot),
                        io_uring_buf_ring_mask(ring_entries_), offset);
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
  if (mshot_cap_) {
    // A multishot recv that ends by itself once it has received the room
    // left under the limit (the kernel's total cap, sqe->optlen, which
    // shares its word with file_index in liburing 2.3's header). So a
    // connection never holds more than max_unsent_bytes, however fast the
    // kernel fills slots.
    io_uring_prep_recv_multishot(sqe, conn->fd, nullptr, 0, 0);
    const size_t room = options_.max_unsent_bytes - conn->unsent;
    sqe->file_index = static_cast<uint32_t>(std::min<size_t>(room, 1u << 30));
  } else if (conn->unsent < options_.max_unsent_bytes / 2) {
    io_uring_prep_recv_multishot(sqe, conn->fd, nullptr, 0, 0);
  } else {
    // Near the limit: one buffer per recv, so the connection cannot take
    // more than the limit plus one buffer from the shared ring.
    io_uring_prep_recv(sqe, conn->fd, nullptr, 0, 0);
  }
  // A bundle only for a peer that sends more than a slot at a time: for
  // one-slot messages the kernel's peek at several ring entries per receive
  // is pure cost (io_ring_buffers_peek, 3.5% of the CPU with 4 KiB messages).
  conn->recv_bundle =
      bundle_ && conn->wants_bundle &&
      (mshot_cap_ || conn->unsent < options_.max_unsent_bytes / 2);
  if (conn->recv_bundle) sqe->ioprio |= kRecvSendBundle;
  // Poll first: an idle connection takes no slot and gets no -ENOBUFS.
  sqe->ioprio |= IORING_RECVSEND_POLL_FIRST;
  sqe->flags |= IOSQE_BUFFER_SELECT;
  sqe->buf_group = kGroup;
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
      !conn->over_limit && !conn->starved) {
    ArmRecv(conn);
  }
}

void UringEchoServer::StartSend(Conn* conn) {
  if (conn->send_inflight || conn->closing || conn->head == kNone) return;
  uint32_t n = 0;
  for (uint32_t s = conn->head; s != kNone && n < kEchoReadBuffers;
       s = next_[s]) {
    conn->iov[n++] = {pool_->SlotData(s) + off_[s], len_[s] - off_[s]};
  }
  conn->iov_slots = n;
  io_uring_sqe* sqe = Sqe();
  if (n == 1) {
    // One slot (a message that fits one): a plain send, which spares the
    // kernel importing a msghdr and an iovec array.
    io_uring_prep_send(sqe, conn->fd, conn->iov[0].iov_base,
                       conn->iov[0].iov_len, MSG_NOSIGNAL);
  } else {
    conn->msg = {};
    conn->msg.msg_iov = conn->iov;
    conn->msg.msg_iovlen = n;
    io_uring_prep_sendmsg(sqe, conn->fd, &conn->msg, MSG_NOSIGNAL);
  }
  io_uring_sqe_set_data64(sqe, reinterpret_cast<uint64_t>(conn) | kSend);
  conn->send_inflight = true;
  ++conn->ops;
}

// Callers call MaybeFinish() once they no longer touch `conn`.
void UringEchoServer::BeginClose(Conn* conn) {
  if (conn->closing) return;
  conn->closing = true;
  CancelRecv(conn);
  // A send to a peer that stopped reading could wait forever: fail it.
  if (conn->send_inflight) ::shutdown(conn->fd, SHUT_RDWR);
}

// Frees a closing connection once the kernel holds no reference to it.
void UringEchoServer::MaybeFinish(Conn* conn) {
  if (!conn->closing || conn->ops != 0) return;
  int returned = 0;
  for (uint32_t s = conn->head; s != kNone; s = next_[s]) {
    ReturnToRing(s, returned++);
  }
  if (returned > 0) {
    io_uring_buf_ring_advance(buf_ring_, returned);
    holding_ -= returned;
    Counters::Sub(counters_->buffers_holding_data, returned);
  }
  if (conn->starved) {  // unlink from the FIFO
    Conn** p = &starved_head_;
    Conn* prev = nullptr;
    while (*p != conn) {
      prev = *p;
      p = &(*p)->starved_next;
    }
    *p = conn->starved_next;
    if (starved_tail_ == conn) starved_tail_ = prev;
  }
  if (conn->prev != nullptr) {
    conn->prev->next = conn->next;
  } else {
    conns_ = conn->next;
  }
  if (conn->next != nullptr) conn->next->prev = conn->prev;
  ::close(conn->fd);
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
      ::close(cqe.res);
    } else {
      const int one = 1;
      ::setsockopt(cqe.res, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
      auto* conn = new Conn;
      conn->fd = cqe.res;
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

void UringEchoServer::OnRecv(Conn* conn, const io_uring_cqe& cqe) {
  const bool more = (cqe.flags & IORING_CQE_F_MORE) != 0;
  if (!more) {  // the multishot recv has ended
    conn->recv_armed = false;
    --conn->ops;
  }
  if (cqe.flags & IORING_CQE_F_BUFFER) {
    // The first slot filled. A bundle fills whole slots in ring order, so
    // the rest are the ring entries after it (ring_slot_ mirrors the ring).
    const uint32_t first = cqe.flags >> IORING_CQE_BUFFER_SHIFT;
    const uint32_t bs = static_cast<uint32_t>(pool_->buffer_size());
    const uint32_t total = cqe.res > 0 ? static_cast<uint32_t>(cqe.res) : 0;
    const uint32_t n = total > 0 ? (total + bs - 1) / bs : 1;
    const uint32_t mask = ring_entries_ - 1;
    const uint32_t pos = ring_pos_[first];
    holding_ += n;
    counters_->AddHolding(n);
    int returned = 0;
    for (uint32_t i = 0; i < n; ++i) {
      const uint32_t slot = i == 0 ? first : ring_slot_[(pos + i) & mask];
      if (total > 0 && !conn->closing) {
        next_[slot] = kNone;
        off_[slot] = 0;
        len_[slot] = std::min(bs, total - i * bs);
        if (conn->tail != kNone) {
          next_[conn->tail] = slot;
        } else {
          conn->head = slot;
        }
        conn->tail = slot;
      } else {  // nothing to keep: straight back to the ring
        ReturnToRing(slot, returned++);
      }
    }
    if (returned > 0) {
      io_uring_buf_ring_advance(buf_ring_, returned);
      holding_ -= returned;
      Counters::Sub(counters_->buffers_holding_data, returned);
    } else {
      conn->unsent += total;
      Counters::Add(counters_->bytes_received, total);
    }
  }
  if (cqe.res > 0 && bundle_) NoteRecvSize(conn, cqe, more);
  if (cqe.res > 0 && !conn->over_limit &&
      conn->unsent >= options_.max_unsent_bytes) {
    conn->over_limit = true;
    Counters::Add(counters_->unsent_limit_stalls, 1);
    if (more) CancelRecv(conn);
  } else if (!mshot_cap_ && more &&
             conn->unsent >= options_.max_unsent_bytes / 2) {
    CancelRecv(conn);  // re-armed single-shot when this recv ends
  }
  if (cqe.res == -EINVAL && bundle_) {
    bundle_ = false;  // not accepted with these flags: re-armed without
  } else if (cqe.res == -EINVAL && mshot_cap_) {
    // A kernel without the multishot total cap: fall back to cancelling
    // near the limit (re-armed below).
    mshot_cap_ = false;
  } else if (cqe.res == 0) {
    conn->read_eof = true;  // half-close: echo what is queued, then close
  } else if (cqe.res == -ENOBUFS && !conn->closing) {
    conn->starved = true;
    conn->starved_next = nullptr;
    if (starved_tail_ != nullptr) {
      starved_tail_->starved_next = conn;
    } else {
      starved_head_ = conn;
    }
    starved_tail_ = conn;
    Counters::Add(counters_->pool_dry_stalls, 1);
  } else if (cqe.res < 0 && cqe.res != -ECANCELED && cqe.res != -ENOBUFS) {
    BeginClose(conn);  // reset or other error
  }
  StartSend(conn);
  if (conn->read_eof && conn->head == kNone && !conn->send_inflight) {
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

void UringEchoServer::OnSend(Conn* conn, int res) {
  conn->send_inflight = false;
  --conn->ops;
  if (res < 0) {
    BeginClose(conn);  // EPIPE/ECONNRESET: the peer is gone
    MaybeFinish(conn);
    return;
  }
  size_t sent = static_cast<size_t>(res);
  conn->unsent -= sent;
  Counters::Add(counters_->bytes_sent, sent);
  int returned = 0;
  while (sent > 0) {
    const uint32_t s = conn->head;
    const size_t in_slot = len_[s] - off_[s];
    if (sent < in_slot) {
      off_[s] += static_cast<uint32_t>(sent);
      break;
    }
    sent -= in_slot;
    conn->head = next_[s];
    if (conn->head == kNone) conn->tail = kNone;
    ReturnToRing(s, returned++);
  }
  if (returned > 0) {
    io_uring_buf_ring_advance(buf_ring_, returned);
    holding_ -= returned;
    Counters::Sub(counters_->buffers_holding_data, returned);
  }
  if (conn->over_limit && conn->unsent <= options_.max_unsent_bytes / 2) {
    conn->over_limit = false;
    MaybeArmRecv(conn);
  }
  StartSend(conn);
  if (conn->read_eof && conn->head == kNone && !conn->send_inflight) {
    BeginClose(conn);
  }
  MaybeFinish(conn);
}

// Lends up to `n` more free pool slots to the ring; returns how many.
// Slots >= 65536 cannot be buffer ids: they are given back afterwards
// (giving them back at once would hand them out again).
size_t UringEchoServer::LendSlots(size_t n) {
  const size_t before = lent_.size();
  const size_t goal = std::min(ring_want_, before + n);
  std::vector<std::byte*> unusable;
  int added = 0;
  while (lent_.size() < goal) {
    std::byte* p = pool_->TryAcquireRaw();
    if (p == nullptr) break;
    const uint32_t slot = pool_->SlotOf(p);
    if (slot >= next_.size()) {
      unusable.push_back(p);
      if (unusable.size() > kMaxRingEntries) break;
      continue;
    }
    ReturnToRing(slot, added++);
    lent_.push_back(slot);
  }
  for (std::byte* p : unusable) pool_->ReleaseRaw(p);
  if (added > 0) io_uring_buf_ring_advance(buf_ring_, added);
  // The pool gave what it could: stop asking every turn.
  if (lent_.size() < goal) ring_want_ = lent_.size();
  return lent_.size() - before;
}

void UringEchoServer::MaybeGrowRing() {
  const size_t lent = lent_.size();
  if (lent >= ring_want_) return;
  const size_t free_in_ring = lent - holding_;
  if (free_in_ring < lent / 4 || starved_head_ != nullptr) LendSlots(lent);
}

void UringEchoServer::RearmStarved() {
  uint32_t budget = static_cast<uint32_t>(lent_.size()) - holding_;
  while (budget > 0 && starved_head_ != nullptr) {
    Conn* conn = starved_head_;
    starved_head_ = conn->starved_next;
    if (starved_head_ == nullptr) starved_tail_ = nullptr;
    conn->starved = false;
    MaybeArmRecv(conn);
    --budget;
  }
}

absl::Status UringEchoServer::Run() {
  if (disabled_) {
    // liburing 2.3 declares io_uring_enable_rings() but does not export it.
    if (::syscall(__NR_io_uring_register, ring_.ring_fd,
                  IORING_REGISTER_ENABLE_RINGS, nullptr, 0) < 0) {
      return os::PosixError("io_uring_register(ENABLE_RINGS)", errno);
    }
    disabled_ = false;
  }
  if (LendSlots(std::min(ring_want_, kInitialRingSlots)) == 0) {
    return absl::ResourceExhaustedError(
        "echo server (uring): the pool has no free slot for the buffer ring");
  }

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
          stop_armed_ = false;
          if (!stopping_) {
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
              ::shutdown(c->fd, SHUT_RDWR);
              BeginClose(c);
              MaybeFinish(c);
              c = next;
            }
          }
          break;
        case kRecv:
          OnRecv(conn, cqe);
          break;
        case kSend:
          OnSend(conn, cqe.res);
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
      MaybeGrowRing();
      RearmStarved();
    }
  }

  // Every operation is complete, so the kernel holds no slot: give them all
  // back to the pool.
  io_uring_unregister_buf_ring(&ring_, kGroup);
  for (uint32_t slot : lent_) pool_->ReleaseRaw(pool_->SlotData(slot));
  lent_.clear();
  holding_ = 0;
  // The ring is unregistered; register it again (empty) so the destructor's
  // unregister stays balanced.
  io_uring_buf_reg reg{};
  reg.ring_addr = reinterpret_cast<uintptr_t>(buf_ring_);
  reg.ring_entries = ring_entries_;
  reg.bgid = kGroup;
  io_uring_buf_ring_init(buf_ring_);
  if (io_uring_register_buf_ring(&ring_, &reg, 0) < 0) {
    ::munmap(buf_ring_, buf_ring_bytes_);
    buf_ring_ = nullptr;
  }
  return status;
}

}  // namespace

absl::StatusOr<std::unique_ptr<EchoServer>> NewUringEchoServer(
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

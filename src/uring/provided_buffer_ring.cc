// ProvidedBufferRing: pool buffers lent to an io_uring provided-buffer ring.
//
// Bookkeeping, all on the ring's thread:
//   lent_[id].data   the bytes of the pool buffer lent under ring-local
//   lent_[id].slot   buffer id `id`, and its slot, which the ring owns as a
//                    handle would (data nullptr when the id is free, i.e. on
//                    free_ids_, or when shared_[id] holds the buffer);
//   lent_[id].pos    the ring position (mod entries_) id was added at;
//   br_->bufs[pos].bid  the id added at position pos last (the kernel
//                    reads ring entries and may rewrite their addr and len,
//                    as an incremental ring does, but never writes a bid).
// Refill() adds at next_ (tail_, after the entries re-lent since the last
// publish), the kernel consumes from its head in order, and
// Take() frees the ids of the buffers a completion names (a one-buffer
// completion linked into a chain: its id is lent again at once with a
// fresh pool buffer, TakeOne(), while the pool has one). A bundle
// completion names only its first id; the rest are the entries after it in
// ring order, whose entries' bids give them back. An entry is overwritten
// only after `entries_` more adds, and adds stop while in_ring_ (added and
// not taken) is at target_ <= entries_, so an entry is never overwritten
// before the completion that consumed it has been taken (the kernel posts
// receive completions in the order it consumes buffers). A completion
// copied into the caller's chain writes its id back at the tail at once
// (Relend), which keeps in_ring_ as it was; the kernel sees it when the
// next Refill() publishes the tail. On an incremental ring an id
// stays at the head while the kernel fills it (filled_[id] bytes so far);
// slices taken from it share shared_[id], the ring's own reference.
#include <liburing.h>
#include <sys/socket.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "bufpool/uring.h"
#include "os/error.h"
#include "os/memory.h"
#include "os/socket.h"
#include "os/syscalls.h"

namespace bufpool {

namespace {

// Links `len` (> 0) received bytes of `buffer` to `out`. An arrival, not a
// link of bytes the caller already held: a bound chain's budget is charged
// the buffer even past its limit (Receive() with copying off), so that
// what the ring takes from the pool to replace it is counted; TakeSlow()
// then reports the limit (bufpool/budget.h, "The cap").
void LinkArrived(BufferChain& out, Buffer&& buffer, size_t len) {
  Buffer b = std::move(buffer);
  out.Receive(b, len, {});
}

}  // namespace

namespace {

// Newer than liburing 2.3's header (Linux 6.10): a receive that fills
// several ring buffers per completion, and its feature bit.
constexpr uint16_t kRecvSendBundle = 1u << 4;
constexpr uint32_t kFeatRecvSendBundle = 1u << 14;
// Newer than liburing 2.3's header (Linux 6.12): incremental consumption,
// a flag of io_uring_buf_reg, and the completion flag saying the buffer
// stays in the ring for more.
constexpr uint16_t kPbufRingInc = 2;        // IOU_PBUF_RING_INC
constexpr uint32_t kCqeFBufMore = 1u << 4;  // IORING_CQE_F_BUF_MORE
// Newer than liburing 2.3's header (Linux 6.10): a NOP that completes with
// the result in sqe->len (the flag goes in sqe->nop_flags, which shares its
// word with rw_flags).
constexpr uint32_t kNopInjectResult = 1u << 0;  // IORING_NOP_INJECT_RESULT

// Whether `fd` is a socket of any type but SOCK_STREAM (not a socket at all
// is not: its receive fails with the kernel's ENOTSOCK).
bool IsMessageSocket(int fd) {
  int type = 0;
  socklen_t len = sizeof(type);
  if (os::Sys().getsockopt(fd, SOL_SOCKET, SO_TYPE, &type, &len) != 0) {
    return false;
  }
  return type != SOCK_STREAM;
}

// Whether a multishot IORING_OP_RECV takes a total byte cap in
// sqe->optlen (liburing 2.3 names that word file_index): kernels before
// 6.17 fail such a receive with -EINVAL at prep. The probe: a throwaway
// ring and socket pair, one byte waiting, a capped multishot receive from a
// buffer group the ring does not have. A kernel that accepts the cap fails
// it with -ENOBUFS (no buffer to select) instead.
bool ProbeMultishotCap() {
  io_uring ring;
  if (io_uring_queue_init(2, &ring, 0) != 0) return false;
  bool cap = false;
  int sv[2];
  if (os::SocketPair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, sv).ok()) {
    const char byte = 'p';
    if (absl::StatusOr<size_t> w = os::Send(sv[1], &byte, 1, "probe");
        w.ok() && *w == 1) {
      io_uring_sqe* sqe = io_uring_get_sqe(&ring);
      io_uring_prep_recv_multishot(sqe, sv[0], nullptr, 0, 0);
      sqe->flags |= IOSQE_BUFFER_SELECT;
      sqe->buf_group = 0xffff;
      sqe->file_index = 1;
      io_uring_cqe* cqe;
      if (io_uring_submit_and_wait(&ring, 1) >= 0 &&
          io_uring_peek_cqe(&ring, &cqe) == 0) {
        cap = cqe->res != -EINVAL;
        io_uring_cqe_seen(&ring, cqe);
      }
    }
    os::CloseSocket(sv[0]).IgnoreError();
    os::CloseSocket(sv[1]).IgnoreError();
  }
  io_uring_queue_exit(&ring);
  return cap;
}

// Probed once per process. Racing first calls each probe and store the same
// answer; relaxed order suffices (the value is the only data).
bool KernelCapsMultishotRecv() {
  static std::atomic<int> known{0};  // 0: not probed, 1: no, 2: yes
  int v = known.load(std::memory_order_relaxed);
  if (v == 0) {
    v = ProbeMultishotCap() ? 2 : 1;
    known.store(v, std::memory_order_relaxed);
  }
  return v == 2;
}

}  // namespace

absl::StatusOr<std::unique_ptr<ProvidedBufferRing>> ProvidedBufferRing::Create(
    io_uring* ring, BufferPool& pool, const Options& options) {
  std::unique_ptr<ProvidedBufferRing> r(new ProvidedBufferRing());
  if (absl::Status s = r->Init(ring, pool, options); !s.ok()) return s;
  return r;
}

absl::Status ProvidedBufferRing::Init(io_uring* ring, BufferPool& pool,
                                      const Options& options) {
  if (absl::Status s = ApplyOptions(ring, pool, options); !s.ok()) return s;
  if (absl::Status s = MapAndRegister(options.incremental); !s.ok()) return s;
  if (incremental_) {
    shared_.resize(entries_);
    filled_.assign(entries_, 0);
  }
  inline_ids_ = incremental_ ? 0 : entries_;
  lent_.resize(entries_);
  free_ids_.reserve(entries_);
  for (uint32_t id = entries_; id-- > 0;) {
    free_ids_.push_back(static_cast<uint16_t>(id));
  }
  scratch_.resize(entries_);
  target_ = std::clamp<size_t>(options.initial_buffers, 1, max_buffers_);
  if (Refill() == 0) {
    return absl::ResourceExhaustedError(
        "ProvidedBufferRing: the pool has no free buffer to lend");
  }
  // The pool's reports count what the ring holds for the kernel apart from
  // other holders. They run on any thread while this ring's thread runs:
  // in_ring_ is a RelaxedCount and the pack's holds_buffer() a relaxed
  // atomic, both written by this thread only, so each read is race-free and
  // gives a value written at some point (a snapshot, as the report's other
  // counts); group_id_ and pack_ are set before AddLender(), whose lock the
  // report takes too, so it sees them. The destructor removes the entry
  // first, which waits out a report in progress.
  internal::AddLender(*pool_, this, [this](std::string* detail) {
    const size_t lent = available();
    const size_t pack = pack_buffers();
    absl::StrAppend(detail, "ProvidedBufferRing group ", group_id_, ": ", lent,
                    " lent, ", pack, " pack");
    return lent + pack;
  });
  return absl::OkStatus();
}

// Init()'s steps: check and keep the options; map the ring's entries and
// register them with the kernel (incremental where asked and allowed).
absl::Status ProvidedBufferRing::ApplyOptions(io_uring* ring, BufferPool& pool,
                                              const Options& options) {
  if (options.max_buffers > kMaxBuffers) {
    return absl::InvalidArgumentError(
        absl::StrCat("ProvidedBufferRing: max_buffers ", options.max_buffers,
                     " is not in [1, ", kMaxBuffers, "] (or kAutoMaxBuffers)"));
  }
  if (pool.buffer_size() > 0xffffffffu) {
    return absl::InvalidArgumentError(
        absl::StrCat("ProvidedBufferRing: buffer_size ", pool.buffer_size(),
                     " does not fit a ring entry's 32-bit length"));
  }
  copy_below_ = options.copy_below == kDefaultCopyBelow ? pool.buffer_size() / 8
                                                        : options.copy_below;
  if (copy_below_ > pool.buffer_size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("ProvidedBufferRing: copy_below ", options.copy_below,
                     " exceeds the pool's buffer_size ", pool.buffer_size()));
  }
  ring_ = ring;
  pool_ = &pool;
  pack_.emplace(pool);
  base_ = pool.region().data();
  group_id_ = options.group_id;
  buffer_size_ = static_cast<uint32_t>(pool.buffer_size());
  max_buffers_ = options.max_buffers;
  if (max_buffers_ == Options::kAutoMaxBuffers) {
    max_buffers_ = std::max<size_t>(
        1, std::min<size_t>(512, internal::UncommittedBuffers(pool)));
  }
  rearm_option_ = options.rearm_threshold;
  switch (options.bundles) {
    case Options::Bundles::kProbe:
      bundles_ = (ring->features & kFeatRecvSendBundle) != 0;
      break;
    case Options::Bundles::kOff:
      bundles_ = false;
      break;
    case Options::Bundles::kOn:
      bundles_ = true;
      break;
  }
  multishot_cap_ = KernelCapsMultishotRecv();
  entries_ = 1;
  while (entries_ < max_buffers_) entries_ <<= 1;
  mask_ = entries_ - 1;
  // The pool's lending and reservations may not exceed it (released by the
  // destructor, which runs when a later step fails too).
  if (absl::Status s = internal::CommitLending(
          pool, max_buffers_,
          absl::StrCat("ProvidedBufferRing (buffer group ", group_id_, ")"));
      !s.ok()) {
    return s;
  }
  committed_ = max_buffers_;
  return absl::OkStatus();
}

absl::Status ProvidedBufferRing::MapAndRegister(
    Options::Incremental incremental) {
  br_bytes_ = std::max<size_t>(entries_ * sizeof(io_uring_buf), os::kPageSize);
  br_bytes_ = (br_bytes_ + os::kPageSize - 1) & ~(os::kPageSize - 1);
  absl::StatusOr<void*> mem = os::MapAnonymous(br_bytes_, false);
  if (!mem.ok()) return mem.status();
  br_ = static_cast<io_uring_buf_ring*>(*mem);
  io_uring_buf_ring_init(br_);
  absl::Status reg = absl::OkStatus();
  if (incremental != Options::Incremental::kOff) {
    reg = Register(kPbufRingInc);
    incremental_ = reg.ok();
    // A kernel before 6.12 refuses the flag (EINVAL): without it, if asked.
    if (!reg.ok() && incremental == Options::Incremental::kProbe &&
        reg.code() == absl::StatusCode::kInvalidArgument) {
      reg = Register(0);
    }
  } else {
    reg = Register(0);
  }
  if (!reg.ok()) return reg;
  registered_ = true;
  return absl::OkStatus();
}

absl::Status ProvidedBufferRing::Register(uint16_t flags) {
  io_uring_buf_reg reg{};
  reg.ring_addr = reinterpret_cast<uintptr_t>(br_);
  reg.ring_entries = entries_;
  reg.bgid = group_id_;
  reg.pad = flags;  // the kernel's `flags` (liburing 2.3 names it pad)
  const int rc = io_uring_register_buf_ring(ring_, &reg, 0);
  if (rc < 0) {
    return os::PosixError(
        absl::StrCat("io_uring_register_buf_ring (buffer group ", group_id_,
                     rc == -EEXIST ? ", already registered" : "",
                     flags & kPbufRingInc ? ", incremental" : "", ")"),
        -rc);
  }
  return absl::OkStatus();
}

ProvidedBufferRing::~ProvidedBufferRing() {
  if (pool_ != nullptr) internal::RemoveLender(*pool_, this);
  if (committed_ != 0) internal::UncommitLending(*pool_, committed_);
  // After this the kernel selects no buffer of the group, so every lent
  // buffer (lent_, and shared_ as it is destroyed) is ours to return.
  const int rc =
      registered_ ? io_uring_unregister_buf_ring(ring_, group_id_) : 0;
  // EBADF: the ring was exited first (io_uring_queue_exit), which cancelled
  // its receives; the kernel holds the group no more.
  if (rc < 0 && rc != -EBADF) [[unlikely]] {
    // The kernel still holds the group (on a SINGLE_ISSUER ring, this is
    // not the ring's thread: EEXIST) and may write any lent buffer: they
    // stay out of the pool, with the ring's entries, rather than be handed
    // out again under the kernel's writes.
    size_t kept = 0;
    for (const Lent& l : lent_) kept += l.data != nullptr;
    for (const SharedBuffer& b : shared_) kept += static_cast<bool>(b);
    std::fprintf(stderr,
                 "bufpool: ~ProvidedBufferRing (buffer group %u): "
                 "io_uring_unregister_buf_ring failed (%s%s); its %zu lent "
                 "buffers stay out of the pool, as the kernel may still "
                 "write them\n",
                 static_cast<unsigned>(group_id_), std::strerror(-rc),
                 rc == -EEXIST ? ": on a SINGLE_ISSUER ring, destroy the "
                                 "ring's objects on its thread"
                               : "",
                 kept);
    // Kept for good (never destroyed, so never returned), reachable.
    static auto* const mu = new std::mutex;
    static auto* const kept_from_the_kernel = new std::vector<SharedBuffer>;
    std::lock_guard<std::mutex> lock(*mu);
    for (SharedBuffer& b : shared_) {
      if (b) kept_from_the_kernel->push_back(std::move(b));
    }
    return;  // br_ stays mapped: the kernel reads its entries
  }
  for (uint32_t id = 0; id < lent_.size(); ++id) {
    if (lent_[id].data != nullptr) TakeLent(static_cast<uint16_t>(id));
  }
  if (br_ != nullptr) os::Unmap(br_, br_bytes_);
}

absl::Status ProvidedBufferRing::CheckSocket(int fd) const {
  if (incremental_ && IsMessageSocket(fd)) {
    return MessageSocketError(absl::StrCat("ProvidedBufferRing (buffer group ",
                                           group_id_, "): fd ", fd));
  }
  return absl::OkStatus();
}

absl::Status ProvidedBufferRing::MessageSocketError(
    absl::string_view what) const {
  return absl::FailedPreconditionError(absl::StrCat(
      what,
      ": not a stream socket (SOCK_DGRAM, SOCK_SEQPACKET, ...), whose "
      "messages an incremental ring would cut short; use a ring with "
      "ProvidedBufferRingOptions::incremental = kOff for it"));
}

void ProvidedBufferRing::PrepareRecv(io_uring_sqe* sqe, int fd,
                                     const RecvOptions& options) const {
  if (incremental_ && !options.socket_checked && IsMessageSocket(fd)) {
    // The kernel would put each datagram into what is left of the current
    // buffer and cut it short there, saying nothing: the receive is not
    // made, and its completion carries -EPROTOTYPE (the bytes stay in the
    // socket), which Take() explains.
    io_uring_prep_nop(sqe);
    sqe->rw_flags = static_cast<int>(kNopInjectResult);
    sqe->len = static_cast<uint32_t>(-EPROTOTYPE);
    ++refused_;
    return;
  }
  const uint32_t cap =
      static_cast<uint32_t>(std::min(options.max_bytes, kMaxRecvBytes));
  if (options.multishot && (cap == 0 || multishot_cap_)) {
    io_uring_prep_recv_multishot(sqe, fd, nullptr, 0, options.msg_flags);
    sqe->file_index = cap;  // sqe->optlen: the total cap, 0 for none
  } else {
    // Single-shot: the length caps the bytes (the selected buffer's size,
    // or the bundle's total, when larger).
    io_uring_prep_recv(sqe, fd, nullptr, cap, options.msg_flags);
  }
  sqe->flags |= IOSQE_BUFFER_SELECT;
  sqe->buf_group = group_id_;
  // On an incremental ring a single-shot bundle ignores its length (Linux
  // 6.18 reads all the socket holds), so a capped one is no bundle.
  const bool capped_single = cap != 0 && !(options.multishot && multishot_cap_);
  if (bundles_ && options.bundle && !(incremental_ && capped_single)) {
    sqe->ioprio |= kRecvSendBundle;
  }
}

size_t ProvidedBufferRing::rearm_threshold() const {
  if (rearm_option_ != 0) return rearm_option_;
  return std::max<size_t>(1, peak_ / 4);
}

size_t ProvidedBufferRing::Refill() {
  if (ran_low_) {
    ran_low_ = false;
    target_ = std::min(max_buffers_, target_ * 2);
  }
  replaced_ = 0;
  replace_failed_ = false;
  size_t got = 0;
  if (in_ring_ < target_) {
    got = pool_->TryAcquireBulk(
        absl::MakeSpan(scratch_.data(), target_ - in_ring_));
  }
  // New entries go after the re-lent ones that wait to be published.
  for (size_t i = 0; i < got; ++i) {
    const uint16_t id = free_ids_.back();
    free_ids_.pop_back();
    Lent& lent = lent_[id];
    lent.data = scratch_[i].data();
    lent.slot = internal::SharedAccess::TakeSlot(scratch_[i]);
    internal::SharedAccess::NoteLent(*pool_, lent.slot, group_id_);
    if (incremental_) filled_[id] = 0;
    AddAt(id, lent.data, next_ + static_cast<uint32_t>(i));
  }
  const uint32_t added = next_ - tail_ + static_cast<uint32_t>(got);
  if (added > 0) {
    // One tail update (a release store) publishes the whole batch: the
    // entries are written before the kernel can see the tail that covers
    // them.
    io_uring_buf_ring_advance(br_, static_cast<int>(added));
    tail_ += added;
    next_ = tail_;
    in_ring_ += got;
    peak_ = std::max<size_t>(peak_, in_ring_);
  }
  return in_ring_;
}

// The handle of the buffer lent under `id` (lent_[id].data != nullptr),
// which the id no longer holds.
Buffer ProvidedBufferRing::TakeLent(uint16_t id) {
  // A bundle's later ids come from the ring entries' bids, which TakeSlow()
  // cannot check before it starts: one that holds no buffer means the ring
  // and the kernel disagree, and its stale slot must not go back twice.
  if (lent_[id].data == nullptr) [[unlikely]] {
    std::fprintf(stderr,
                 "bufpool: ProvidedBufferRing (group %u): a completion names "
                 "buffer id %u, which holds no buffer\n",
                 static_cast<unsigned>(group_id_), static_cast<unsigned>(id));
    std::abort();
  }
  lent_[id].data = nullptr;
  internal::SharedAccess::NoteHeld(*pool_, lent_[id].slot,
                                   internal::kHeldAsAcquired);
  return internal::SharedAccess::GiveSlot(*pool_, lent_[id].slot);
}

// TakeBuffer() into an empty handle: the ring's buffer under `id` leaves
// the ring.
void ProvidedBufferRing::TakeOut(uint16_t id, Buffer& buffer) noexcept {
  buffer = TakeLent(id);
  free_ids_.push_back(id);  // reserved for every id: never reallocates
  --in_ring_;
  if (in_ring_ - replaced_ < target_ / 4) ran_low_ = true;
}

// The ring's reference to buffer `id` as a counted slice of all of it
// (made from lent_[id]'s slot on first use).
SharedBuffer& ProvidedBufferRing::Shared(uint16_t id) {
  if (lent_[id].data != nullptr) shared_[id] = SharedBuffer(TakeLent(id));
  return shared_[id];
}

absl::StatusOr<BufferChain> ProvidedBufferRing::Take(const io_uring_cqe& cqe) {
  // Built in place and returned by name (no chain moved per completion).
  absl::StatusOr<BufferChain> result(absl::in_place, *pool_);
  if (absl::Status s = Take(cqe, *result); !s.ok()) result = std::move(s);
  return result;
}

// The error of a failed receive (res < 0), or of a receive PrepareRecv()
// refused (MessageSocketError(), after `what`).
absl::Status ProvidedBufferRing::ReceiveError(int res) const {
  if (res == -EPROTOTYPE && incremental_) {
    return MessageSocketError(
        absl::StrCat("receive (buffer group ", group_id_, "): not made"));
  }
  absl::Status status = os::PosixError(
      absl::StrCat("receive (buffer group ", group_id_, ")"), -res);
  if (refused_ != 0 && (res == -EINVAL || res == -EOPNOTSUPP)) {
    // The kernel rejects a NOP that carries receive flags (ioprio such as
    // IORING_RECVSEND_POLL_FIRST, IOSQE_BUFFER_SELECT) before it runs.
    return absl::Status(
        status.code(),
        absl::StrCat(status.message(),
                     "; if this is a receive PrepareRecv() refused (a "
                     "message socket on an incremental ring: ",
                     refused_,
                     " so far), flags added to its sqe made the kernel "
                     "reject it: see CheckSocket()"));
  }
  return status;
}

// Take() of a completion that carries no buffer (-ENOBUFS, an error, EOF).
absl::Status ProvidedBufferRing::TakeWithoutBuffer(int res) {
  if (res == -ENOBUFS) {
    ++enobufs_;
    ran_low_ = true;
    return absl::ResourceExhaustedError(
        absl::StrCat("receive: provided-buffer ring (group ", group_id_,
                     ") ran out of buffers; re-arm once ShouldRearm()"));
  }
  if (res < 0) return ReceiveError(res);
  if (res == 0) return absl::OkStatus();
  return absl::FailedPreconditionError(
      absl::StrCat("ProvidedBufferRing::Take: a completion of ", res,
                   " bytes carries no buffer (not a buffer-select receive)"));
}

// A chain bound to a budget: the bytes are kept whatever the budget says
// (the kernel has written them; the ring buffer is used), and a completion
// that pinned a buffer past the budget's limit is reported all the same,
// so that the caller stops receiving until the chain drains. (TakeInline()
// never passes the limit: it copies into the tail's room, which pins
// nothing more, and links or packs into an empty bound chain only while
// its budget has room for the buffer that pins, leaving the rest to this
// path.)
absl::Status ProvidedBufferRing::TakeSlow(const io_uring_cqe& cqe,
                                          BufferChain& out) {
  BufferBudget* const budget = out.budget();
  if (budget == nullptr) return TakeAny(cqe, out);
  const size_t before = budget->pinned_bytes();
  absl::Status s = TakeAny(cqe, out);
  const size_t after = budget->pinned_bytes();
  if (s.ok() && after > before && after > budget->max_bytes()) {
    return internal::BudgetAccess::Refuse(
        *budget,
        absl::StrCat("ProvidedBufferRing::Take (buffer group ", group_id_, ")"),
        0,
        absl::StrCat("the completion's ", cqe.res,
                     " bytes were kept in the chain: stop receiving until "
                     "it drains"));
  }
  return s;
}

// TakeSlow() without a look at out's budget.
absl::Status ProvidedBufferRing::TakeAny(const io_uring_cqe& cqe,
                                         BufferChain& out) {
  const int res = cqe.res;
  if ((cqe.flags & IORING_CQE_F_BUFFER) == 0) [[unlikely]] {
    return TakeWithoutBuffer(res);
  }
  const uint32_t id = cqe.flags >> IORING_CQE_BUFFER_SHIFT;
  const size_t total = res > 0 ? static_cast<size_t>(res) : 0;
  // A bundle fills whole buffers in ring order, the last one partly. (No
  // division for the usual one-buffer completion.)
  const size_t n =
      total <= buffer_size_ ? 1 : (total + buffer_size_ - 1) / buffer_size_;
  const bool known = id < entries_ && (lent_[id].data != nullptr ||
                                       (incremental_ && shared_[id]));
  if (!known || n > in_ring_) [[unlikely]] {
    return absl::FailedPreconditionError(absl::StrCat(
        "ProvidedBufferRing::Take: buffer id ", id, " (", n,
        " buffers) was not lent by the ring of group ", group_id_));
  }
  if (incremental_) {
    // A completion without bytes consumed nothing: its buffer stays.
    if (res <= 0) return res < 0 ? ReceiveError(res) : absl::OkStatus();
    return TakeIncremental(cqe, id, out);
  }
  if (n == 1 && total != 0) {
    TakeOne(static_cast<uint16_t>(id), total, out);
    return absl::OkStatus();
  }
  // A bundle linked after a tail with room would leave that room empty
  // inside the chain, one partly filled buffer per bundle: what the chain
  // pins would then grow past its bytes plus two buffers.
  if (n > 1 && copy_below_ != 0 && out.tail_room() != 0) {
    return TakeBundleByCopy(id, n, total, out);
  }
  return TakeLinked(id, n, res, out);
}

// Take() of a bundle (`n` > 1 buffers from `id` on, `total` bytes) into
// a chain whose tail has room: copied (the room filled, then fresh
// buffers) and its buffers lent again, so that the room is not left
// empty inside the chain; from the first buffer the pool cannot supply
// on, the rest are linked.
absl::Status ProvidedBufferRing::TakeBundleByCopy(uint32_t id, size_t n,
                                                  size_t total,
                                                  BufferChain& out) {
  // Room for every slice first: each buffer's bytes fill the tail's room
  // and at most one fresh buffer, or are linked as one slice. So nothing
  // below allocates or throws, and a buffer is copied only once its fresh
  // buffer is in hand.
  out.Reserve(out.slice_count() + n);
  const uint32_t pos = lent_[id].pos;
  size_t left = total;
  bool copying = true;
  bool copied_first = false;
  for (size_t i = 0; i < n; ++i) {
    // The bundle's later ids from its entries' bids: the re-lends so far
    // wrote only entries this loop has read (in_ring_ <= entries_ keeps
    // next_ short of the bundle's unread ones).
    const uint16_t b =
        i == 0 ? static_cast<uint16_t>(id) : br_->bufs[(pos + i) & mask_].bid;
    const size_t len = std::min<size_t>(left, buffer_size_);
    left -= len;
    std::byte* const data = lent_[b].data;
    if (copying && data != nullptr) {
      const absl::Span<std::byte> room = out.Preallocate();
      const size_t in_room = std::min(len, room.size());
      Buffer fresh;
      if (in_room < len) {
        if (out.pool() != nullptr) fresh = out.pool()->TryAcquire();
        // A dry pool (or none, or smaller buffers): this buffer and the
        // rest are linked, in order.
        copying = fresh && fresh.size() >= len - in_room;
      }
      if (copying) {
        if (in_room != 0) {
          std::memcpy(room.data(), data, in_room);
          out.Postallocate(in_room);
        }
        if (in_room < len) {
          std::memcpy(fresh.data(), data + in_room, len - in_room);
          LinkArrived(out, std::move(fresh), len - in_room);
        }
        Relend(b, data);  // lent again at once, in_ring_ unchanged
        copied_first = copied_first || i == 0;
        continue;
      }
    }
    free_ids_.push_back(b);
    LinkArrived(out, TakeLent(b), len);  // TakeLent() aborts on an id not lent
    --in_ring_;
  }
  if (copied_first) ++copied_;
  if (in_ring_ - replaced_ < target_ / 4) ran_low_ = true;
  return absl::OkStatus();
}

// Take() of `n` buffers from `id` on, linked into `out` (all or nothing).
absl::Status ProvidedBufferRing::TakeLinked(uint32_t id, size_t n, int res,
                                            BufferChain& out) {
  // All or nothing: what may allocate (out's room for the slices, the
  // error of a failed receive) is made before anything changes, so that a
  // std::bad_alloc leaves `out` and the ring as they were and the
  // completion can be taken again. free_ids_ never reallocates: it was
  // reserved for every id.
  absl::Status status;
  if (res > 0) {
    out.Reserve(out.slice_count() + n);
  } else if (res < 0) [[unlikely]] {
    status = ReceiveError(res);
  }
  const uint32_t pos = lent_[id].pos;
  size_t left = res > 0 ? static_cast<size_t>(res) : 0;
  for (size_t i = 0; i < n; ++i) {
    const uint16_t b =
        i == 0 ? static_cast<uint16_t>(id) : br_->bufs[(pos + i) & mask_].bid;
    free_ids_.push_back(b);
    // The buffer's first `len` bytes become one slice (one count store, no
    // atomic read-modify-write); a buffer the kernel used for no bytes goes
    // back to the pool. A failed receive's buffers all go back.
    const size_t len = std::min<size_t>(left, buffer_size_);
    left -= len;
    if (len == 0) {
      TakeLent(b);  // dropped: back to the pool
    } else {
      LinkArrived(out, TakeLent(b), len);
    }
  }
  in_ring_ -= n;
  if (in_ring_ - replaced_ < target_ / 4) ran_low_ = true;
  return status;
}

// Incremental ring. The kernel fills buffer `id` from filled_[id] on; a
// bundle goes on into the buffers after it in ring order, from their start.
// The last buffer the completion used stays in the ring, partly filled,
// when the completion has IORING_CQE_F_BUF_MORE; every other one is done.
// Each span becomes a slice (or a copy, when small) in `out`; the ring's
// own reference (shared_) keeps a staying buffer out of every chain's
// tail_room(), and goes with the buffer's last completion.
absl::Status ProvidedBufferRing::TakeIncremental(const io_uring_cqe& cqe,
                                                 uint32_t first,
                                                 BufferChain& out) {
  const bool more = (cqe.flags & kCqeFBufMore) != 0;
  size_t left = static_cast<size_t>(cqe.res);
  const uint32_t pos = lent_[first].pos;
  // The spans, before anything changes (and the room for their slices).
  size_t n = 0;
  for (size_t l = left, start = filled_[first]; l != 0; start = 0, ++n) {
    l -= std::min<size_t>(l, buffer_size_ - start);
  }
  if (n > in_ring_) [[unlikely]] {
    return absl::FailedPreconditionError(
        absl::StrCat("ProvidedBufferRing::Take: a completion of ", cqe.res,
                     " bytes spans more buffers than the ring of group ",
                     group_id_, " holds"));
  }
  out.Reserve(out.slice_count() + n);
  // A slice pins its whole buffer, which other connections' bytes share and
  // may free long before: only a span of at least half a buffer is linked,
  // so what a chain pins stays within twice its bytes (plus two buffers).
  const size_t inc_copy_below = std::max<size_t>(copy_below_, buffer_size_ / 2);
  for (size_t i = 0; i < n; ++i) {
    const uint16_t id = i == 0 ? static_cast<uint16_t>(first)
                               : br_->bufs[(pos + i) & mask_].bid;
    const size_t start = i == 0 ? filled_[id] : 0;
    const size_t len = std::min<size_t>(left, buffer_size_ - start);
    left -= len;
    const bool stays = more && i + 1 == n && start + len < buffer_size_;
    std::byte* data = (lent_[id].data != nullptr ? lent_[id].data
                                                 : shared_[id].mutable_data()) +
                      start;
    // The bytes right after the chain's tail slice join it; else small
    // ones are copied (as a ring without incremental mode does); else
    // linked as a slice of the buffer.
    if (start != 0 && out.GrowTail(data, len)) {
      // joined
    } else if (out.size() + len < copy_below_ &&
               out.AppendPacked(absl::MakeConstSpan(data, len), *pack_)) {
      ++copied_;
    } else if (copy_below_ != 0 &&
               (len < inc_copy_below || out.tail_room() != 0) &&
               out.Append(absl::MakeConstSpan(data, len)).ok()) {
      ++copied_;
    } else if (!stays && start == 0 && lent_[id].data != nullptr) {
      LinkArrived(out, TakeLent(id), len);  // all of it, in one go
    } else {
      out.Append(Shared(id).Slice(start, len));
    }
    if (stays) {
      filled_[id] = static_cast<uint32_t>(start + len);
      continue;
    }
    // Done in the kernel. Not one slice taken (all copied): lend it again
    // at once, from its start.
    if (lent_[id].data != nullptr ||
        (shared_[id] && shared_[id].use_count() == 1)) {
      filled_[id] = 0;
      Relend(id, lent_[id].data != nullptr ? lent_[id].data
                                           : shared_[id].mutable_data());
      continue;
    }
    shared_[id].Reset();
    free_ids_.push_back(id);
    --in_ring_;
  }
  if (in_ring_ - replaced_ < target_ / 4) ran_low_ = true;
  return absl::OkStatus();
}

}  // namespace bufpool

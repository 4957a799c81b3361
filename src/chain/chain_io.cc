// ReadFrom() / WriteTo(): chains through the OS layer (src/os/socket.h).
#include <sys/uio.h>

#include <algorithm>
#include <new>

#include "absl/strings/str_cat.h"
#include "bufpool/chain.h"
#include "os/socket.h"

namespace bufpool {
namespace {

// Fresh buffers per readv: 256 KiB of 4 KiB buffers, so one call moves what
// a socket buffer holds, with the iovecs and handles on the stack.
constexpr size_t kMaxIov = 64;
// Slices per sendmsg/writev: a message is often header + payload pairs, so
// twice as many as one read fills, and more (4 KiB of stack).
constexpr size_t kMaxWriteIov = 256;

// The fresh buffers one ReadFrom() reads into. Handles are constructed only
// for the buffers acquired (most reads need a few of the 64), and destroyed
// on every return: the ones linked into the chain are empty by then, the
// rest go back to the pool (or to the budget, which takes back what it gave
// from its reserve).
class FreshBuffers {
 public:
  explicit FreshBuffers(BufferBudget* budget) : budget_(budget) {}
  FreshBuffers(const FreshBuffers&) = delete;
  FreshBuffers& operator=(const FreshBuffers&) = delete;
  ~FreshBuffers() {
    for (size_t i = 0; i < got_; ++i) {
      if (budget_ != nullptr) {
        internal::BudgetAccess::GiveBack(*budget_, std::move(slot_[i].b));
      }
      slot_[i].b.~Buffer();
    }
  }

  // Acquires up to `want` (<= kMaxIov) buffers of `pool` (through the budget
  // when there is one), fewer when it runs dry, and points iov[0, k) at them,
  // `bytes` in all; returns k.
  size_t Acquire(BufferPool& pool, size_t want, size_t bytes, iovec* iov) {
    const size_t bs = pool.buffer_size();
    for (; got_ < want; ++got_) {
      Buffer b = budget_ != nullptr
                     ? internal::BudgetAccess::TakeFresh(*budget_)
                     : pool.TryAcquire();
      if (!b) break;
      iov[got_] = {b.data(), std::min(bs, bytes - got_ * bs)};
      new (&slot_[got_].b) Buffer(std::move(b));
    }
    return got_;
  }
  Buffer& operator[](size_t i) { return slot_[i].b; }

 private:
  union Slot {
    Slot() {}
    ~Slot() {}
    Buffer b;
  } slot_[kMaxIov];
  size_t got_ = 0;
  BufferBudget* budget_;
};

// Fresh buffers a read of `bytes` past the tail's room needs: at most kMaxIov,
// and at most what the chain's budget allows (each pins one more buffer).
size_t FreshWanted(size_t bytes, size_t bs, const BufferBudget* budget) {
  size_t want = std::min<size_t>((bytes + bs - 1) / bs, kMaxIov);
  if (budget != nullptr) want = std::min(want, budget->room_bytes() / bs);
  return want;
}

// Makes the `n` bytes a read left in the tail's room (the first `room` of
// them) and then in `fresh` part of the chain, each fresh buffer by the
// receive policy (a copied one goes back with `fresh`).
void LinkRead(BufferChain& chain, size_t n, size_t room, FreshBuffers& fresh,
              size_t bs, const BufferChain::ReceiveOptions& options) {
  size_t left = n;
  const size_t in_room = std::min(left, room);
  if (in_room != 0) {
    chain.Postallocate(in_room);
    left -= in_room;
  }
  // Room for every slice first, so nothing below throws.
  chain.Reserve(chain.slice_count() + (left + bs - 1) / bs + 1);
  for (size_t i = 0; left != 0; ++i) {
    const size_t len = std::min(left, bs);
    chain.Receive(fresh[i], len, options);
    left -= len;
  }
}

}  // namespace

absl::StatusOr<size_t> ReadFrom(int fd, BufferChain& chain, size_t max_bytes) {
  return ReadFrom(fd, chain, max_bytes, BufferChain::ReceiveOptions());
}

absl::StatusOr<size_t> ReadFrom(int fd, BufferChain& chain, size_t max_bytes,
                                const BufferChain::ReceiveOptions& options) {
  if (max_bytes == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("ReadFrom(fd ", fd, "): max_bytes must be > 0"));
  }
  BufferPool* const pool = chain.pool();
  if (pool == nullptr) {
    return absl::FailedPreconditionError(absl::StrCat(
        "ReadFrom(fd ", fd, "): the chain has no pool to take buffers from"));
  }
  iovec iov[kMaxIov + 1];
  int cnt = 0;
  const absl::Span<std::byte> tail = chain.Preallocate();
  const size_t bs = pool->buffer_size();
  BufferBudget* const budget = chain.budget();
  FreshBuffers fresh(budget);
  size_t room = 0;
  // A short chain with a pack belongs in the pack (Receive() moves it
  // there): its own tail's room, a buffer kept for a few bytes, is read
  // into only when no fresh buffer can be had.
  if (!tail.empty() && options.pack != nullptr &&
      chain.size() < options.copy_below) {
    cnt = static_cast<int>(fresh.Acquire(
        *pool, FreshWanted(max_bytes, bs, budget), max_bytes, iov));
  }
  if (cnt == 0) {
    room = std::min(tail.size(), max_bytes);
    if (room != 0) iov[cnt++] = {tail.data(), room};
    const size_t want = FreshWanted(max_bytes - room, bs, budget);
    if (budget != nullptr && want == 0 && room == 0) {
      // Refused before reading: the bytes stay in the socket.
      return internal::BudgetAccess::Refuse(
          *budget, absl::StrCat("ReadFrom(fd ", fd, ")"), bs);
    }
    cnt += static_cast<int>(
        fresh.Acquire(*pool, want, max_bytes - room, &iov[cnt]));
  }
  if (cnt == 0) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "ReadFrom(fd ", fd, "): the pool has no free buffer (",
        pool->capacity(), " buffers of ", bs, " bytes, all in use)"));
  }
  absl::StatusOr<size_t> n = os::ReadV(fd, iov, cnt, "");
  if (!n.ok() || *n == 0) return n;  // `fresh` goes back to the pool
  LinkRead(chain, *n, room, fresh, bs, options);
  return *n;
}

absl::StatusOr<size_t> WriteTo(int fd, BufferChain& chain) {
  size_t total = 0;
  iovec iov[kMaxWriteIov];
  while (!chain.empty()) {
    const size_t cnt = chain.FillIovecs(iov);
    absl::StatusOr<size_t> n = os::WriteV(fd, iov, static_cast<int>(cnt), "");
    if (!n.ok()) {
      if (n.status().code() == absl::StatusCode::kUnavailable && total != 0) {
        break;  // would block after some progress: a partial write
      }
      return n.status();
    }
    if (*n == 0) {  // no progress and no error: do not spin
      return absl::InternalError(absl::StrCat("WriteTo(fd ", fd,
                                              "): the kernel took 0 of ",
                                              chain.size(), " bytes"));
    }
    chain.Consume(*n);
    total += *n;
  }
  return total;
}

}  // namespace bufpool

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
  const size_t room = std::min(tail.size(), max_bytes);
  if (room != 0) iov[cnt++] = {tail.data(), room};
  const size_t bs = pool->buffer_size();
  size_t want = std::min<size_t>((max_bytes - room + bs - 1) / bs, kMaxIov);
  BufferBudget* const budget = chain.budget();
  if (budget != nullptr) {
    // Each fresh buffer pins one more: read only into those the budget
    // allows, and refuse before reading when it allows none (the bytes stay
    // in the socket).
    want = std::min(want, budget->room_bytes() / bs);
    if (want == 0 && room == 0) {
      return internal::BudgetAccess::Refuse(
          *budget, absl::StrCat("ReadFrom(fd ", fd, ")"), bs);
    }
  }
  // Handles constructed only for the buffers taken (most reads need a few
  // of the 64), and destroyed by `fresh` on every return: the ones linked
  // into the chain are empty by then, the rest go back to the pool.
  struct Fresh {
    union Slot {
      Slot() {}
      ~Slot() {}
      Buffer b;
    } slot[kMaxIov];
    size_t got = 0;
    BufferBudget* budget = nullptr;  // takes back what it gave (its reserve)
    ~Fresh() {
      for (size_t i = 0; i < got; ++i) {
        if (budget != nullptr) {
          internal::BudgetAccess::GiveBack(*budget, std::move(slot[i].b));
        }
        slot[i].b.~Buffer();
      }
    }
    Buffer& operator[](size_t i) { return slot[i].b; }
  } fresh;
  fresh.budget = budget;
  for (; fresh.got < want; ++fresh.got) {
    Buffer b = budget != nullptr ? internal::BudgetAccess::TakeFresh(*budget)
                                 : pool->TryAcquire();
    if (!b) break;
    const size_t len = std::min(bs, max_bytes - room - fresh.got * bs);
    iov[cnt++] = {b.data(), len};
    new (&fresh.slot[fresh.got].b) Buffer(std::move(b));
  }
  if (cnt == 0) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "ReadFrom(fd ", fd, "): the pool has no free buffer (",
        pool->capacity(), " buffers of ", bs, " bytes, all in use)"));
  }
  absl::StatusOr<size_t> n = os::ReadV(fd, iov, cnt, "");
  if (!n.ok() || *n == 0) return n;  // `fresh` goes back to the pool
  size_t left = *n;
  const size_t in_room = std::min(left, room);
  if (in_room != 0) {
    chain.Postallocate(in_room);
    left -= in_room;
  }
  // Room for every slice first, so nothing below throws.
  chain.Reserve(chain.slice_count() + (left + bs - 1) / bs + 1);
  for (size_t i = 0; left != 0; ++i) {
    const size_t len = std::min(left, bs);
    chain.Receive(fresh[i], len, options);  // a copied one goes back
    left -= len;
  }
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

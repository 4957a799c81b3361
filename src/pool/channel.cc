#include "bufpool/channel.h"

#include <sys/stat.h>

#include <cerrno>
#include <utility>

#include "absl/strings/str_cat.h"
#include "os/error.h"
#include "os/syscalls.h"
#include "pool/token_ring.h"

namespace bufpool {
namespace {

static_assert(BufferChannel::kMaxCapacity == internal::TokenRing::kMaxCapacity);

// The pool a ring belongs to: a shared pool's memfd, the same file in
// every process; a private pool by its address (its channel cannot be
// joined).
absl::StatusOr<internal::RingIdentity> IdentityOf(const BufferPool& pool) {
  internal::RingIdentity id;
  id.buffer_size = pool.buffer_size();
  const int fd = pool.shared_fd();
  if (fd < 0) {
    id.ino = reinterpret_cast<uintptr_t>(&pool);
    return id;
  }
  struct stat st;
  if (os::Sys().fstat(fd, &st) != 0) {
    return os::PosixError("BufferChannel: fstat of the pool's shared_fd()",
                          errno);
  }
  id.dev = static_cast<uint64_t>(st.st_dev) | (uint64_t{1} << 63);
  id.ino = static_cast<uint64_t>(st.st_ino);
  return id;
}

}  // namespace

BufferChannel::BufferChannel(BufferPool& pool,
                             std::unique_ptr<internal::TokenRing> ring)
    : pool_(&pool), ring_(std::move(ring)) {}

BufferChannel::~BufferChannel() = default;

absl::StatusOr<std::unique_ptr<BufferChannel>> BufferChannel::Create(
    BufferPool& pool, size_t capacity) {
  auto id = IdentityOf(pool);
  if (!id.ok()) return id.status();
  auto ring = internal::TokenRing::Create(capacity, *id);
  if (!ring.ok()) return ring.status();
  return std::unique_ptr<BufferChannel>(
      new BufferChannel(pool, *std::move(ring)));
}

absl::StatusOr<std::unique_ptr<BufferChannel>> BufferChannel::Join(
    BufferPool& pool, int memory_fd, int event_fd) {
  if (pool.shared_fd() < 0) {
    return absl::FailedPreconditionError(
        "BufferChannel::Join: the pool is private (PoolOptions::shared is "
        "off); only a shared pool's channel can be joined");
  }
  auto id = IdentityOf(pool);
  if (!id.ok()) return id.status();
  auto ring = internal::TokenRing::Join(memory_fd, event_fd, *id);
  if (!ring.ok()) return ring.status();
  return std::unique_ptr<BufferChannel>(
      new BufferChannel(pool, *std::move(ring)));
}

absl::Status BufferChannel::Send(Buffer&& buffer) {
  if (!buffer) {
    return absl::InvalidArgumentError("BufferChannel::Send: empty handle");
  }
  if (buffer.pool() != pool_) {
    return absl::InvalidArgumentError(
        "BufferChannel::Send: the buffer is from another pool than the "
        "channel's");
  }
  // Room first: only this sender fills the ring, so the room found here is
  // still there at Push(); a full channel leaves the handle as it was.
  if (!ring_->HasRoom()) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "BufferChannel::Send: the channel is full (", ring_->capacity(),
        " buffers in flight); the buffer stays with the caller"));
  }
  ring_->Push(pool_->Export(std::move(buffer)).value);
  sent_.store(sent_.load(std::memory_order_relaxed) + 1,
              std::memory_order_relaxed);
  return absl::OkStatus();
}

Buffer BufferChannel::TryReceive() {
  uint64_t token;
  while (ring_->Front(&token)) {
    // Import before Pop(): a receiver killed between the two leaves the
    // token in the ring, and the buffer in the ledger as its own, which
    // ReclaimDead() gives back; the next receiver's import of the same
    // token is then refused (stale) and skipped. Popping first would leave
    // the buffer exported by a sender that may live on: lost until it
    // exits.
    absl::StatusOr<Buffer> buffer = pool_->Import(BufferToken{token});
    ring_->Pop();
    if (buffer.ok()) {
      received_.store(received_.load(std::memory_order_relaxed) + 1,
                      std::memory_order_relaxed);
      return *std::move(buffer);
    }
    Refused(buffer.status());
  }
  return Buffer();
}

absl::StatusOr<Buffer> BufferChannel::Receive(absl::Duration timeout) {
  const absl::Time deadline = timeout == absl::InfiniteDuration()
                                  ? absl::InfiniteFuture()
                                  : absl::Now() + timeout;
  for (;;) {
    if (Buffer b = TryReceive()) return b;
    if (timeout <= absl::ZeroDuration()) {
      // Arm() is true when a token came in between: take it.
      if (ring_->Arm()) continue;
      return absl::DeadlineExceededError(
          "BufferChannel::Receive: nothing to receive (event_fd() armed)");
    }
    if (!ring_->Wait(deadline)) {
      if (Buffer b = TryReceive()) return b;
      return absl::DeadlineExceededError(
          absl::StrCat("BufferChannel::Receive: nothing received within ",
                       absl::FormatDuration(timeout)));
    }
  }
}

size_t BufferChannel::Drain() {
  size_t n = 0;
  while (Buffer b = TryReceive()) ++n;
  return n;
}

void BufferChannel::Refused(absl::Status why) {
  refused_.store(refused_.load(std::memory_order_relaxed) + 1,
                 std::memory_order_relaxed);
  std::lock_guard<std::mutex> lock(refusal_mu_);
  last_refusal_ = std::move(why);
}

int BufferChannel::event_fd() const { return ring_->event_fd(); }
int BufferChannel::memory_fd() const { return ring_->memory_fd(); }
size_t BufferChannel::capacity() const { return ring_->capacity(); }
size_t BufferChannel::size() const { return ring_->size(); }

ChannelStats BufferChannel::Stats() const {
  return ChannelStats{.sent = sent_.load(std::memory_order_relaxed),
                      .received = received_.load(std::memory_order_relaxed),
                      .refused = refused_.load(std::memory_order_relaxed)};
}

absl::Status BufferChannel::last_refusal() const {
  std::lock_guard<std::mutex> lock(refusal_mu_);
  return last_refusal_;
}

}  // namespace bufpool

#include "pool/token_ring.h"

#include <fcntl.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/stat.h>

#include <bit>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <new>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "os/error.h"
#include "os/syscalls.h"

namespace bufpool::internal {
namespace {

constexpr uint64_t kMagic = 0x676e6952706c6642;  // "BflpRing"
constexpr uint32_t kVersion = 1;
constexpr size_t kBlock = 128;  // two cache lines: see the layout comment
constexpr size_t kSlotsOffset = 4 * kBlock;
constexpr unsigned kSeals = F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL;

// `waiting`: how the receiver waits for the next token.
constexpr uint32_t kNone = 0;      // polling, or not waiting
constexpr uint32_t kSleeping = 1;  // in futex_wait on `waiting`
constexpr uint32_t kArmed = 2;     // in an event loop: write the eventfd

// Spins of a blocking Wait() before it sleeps: about a microsecond, enough
// for a sender that is about to push, short on a machine with few CPUs.
constexpr int kSpins = 256;

size_t MapBytes(size_t capacity) {
  const size_t bytes = kSlotsOffset + capacity * sizeof(uint64_t);
  return (bytes + 4095) & ~size_t{4095};
}

void CpuRelax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

void CloseFd(int fd) {
  if (fd >= 0) os::Sys().close(fd);
}

}  // namespace

struct TokenRing::Layout {
  // Fixed at Create(), read by Join().
  alignas(kBlock) uint64_t magic;
  uint32_t version;
  uint32_t capacity;
  uint64_t pool_dev;
  uint64_t pool_ino;
  uint64_t buffer_size;
  alignas(kBlock) std::atomic<uint64_t> tail;
  alignas(kBlock) std::atomic<uint64_t> head;
  alignas(kBlock) std::atomic<uint32_t> waiting;
  alignas(kBlock) std::atomic<uint64_t> slots[1];  // capacity of them
};
static_assert(offsetof(TokenRing::Layout, slots) == kSlotsOffset);
// The ring lives in memory other processes map: its atomics must be
// address-free, which lock-free ones are.
static_assert(std::atomic<uint64_t>::is_always_lock_free);
static_assert(std::atomic<uint32_t>::is_always_lock_free);
static_assert(sizeof(std::atomic<uint32_t>) == sizeof(uint32_t));

absl::StatusOr<std::unique_ptr<TokenRing>> TokenRing::Create(
    size_t capacity, const RingIdentity& identity) {
  if (capacity == 0 || capacity > kMaxCapacity) {
    return absl::InvalidArgumentError(absl::StrCat("BufferChannel capacity ",
                                                   capacity, " is not in [1, ",
                                                   kMaxCapacity, "]"));
  }
  capacity = std::bit_ceil(capacity);
  const size_t bytes = MapBytes(capacity);
  const os::SyscallTable& sys = os::Sys();
  const int memory_fd = sys.memfd_create("bufpool-channel", MFD_ALLOW_SEALING);
  if (memory_fd < 0)
    return os::PosixError("memfd_create (BufferChannel)", errno);
  if (sys.ftruncate(memory_fd, static_cast<off_t>(bytes)) != 0 ||
      sys.fcntl(memory_fd, F_ADD_SEALS, kSeals) != 0) {
    const int err = errno;
    CloseFd(memory_fd);
    return os::PosixError("sizing and sealing the BufferChannel memfd", err);
  }
  const int event_fd = sys.eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (event_fd < 0) {
    const int err = errno;
    CloseFd(memory_fd);
    return os::PosixError("eventfd (BufferChannel)", err);
  }
  auto ring = Map(memory_fd, event_fd, bytes);
  if (!ring.ok()) {
    CloseFd(memory_fd);
    CloseFd(event_fd);
    return ring.status();
  }
  // The memfd is new and zero-filled (every index and `waiting` 0); only
  // the header needs writing, before any other process can see the fd.
  Layout* l = (*ring)->layout_;
  l->magic = kMagic;
  l->version = kVersion;
  l->capacity = static_cast<uint32_t>(capacity);
  l->pool_dev = identity.dev;
  l->pool_ino = identity.ino;
  l->buffer_size = identity.buffer_size;
  (*ring)->mask_ = capacity - 1;
  return ring;
}

// Whether `fd` is an eventfd: its /proc/self/fd link names the eventfd
// anonymous inode (an eventfd has no other mark fstat() shows). Empty when
// it is; else why not.
static std::string NotAnEventFd(const os::SyscallTable& sys, int fd) {
  char path[64];
  std::snprintf(path, sizeof(path), "/proc/self/fd/%d", fd);
  char link[64];
  const ssize_t n = sys.readlink(path, link, sizeof(link) - 1);
  if (n < 0) {
    return absl::StrCat("cannot tell whether it is an eventfd (readlink ", path,
                        ": ", std::strerror(errno), ")");
  }
  const absl::string_view target(link, static_cast<size_t>(n));
  if (target == "anon_inode:[eventfd]") return "";
  return absl::StrCat("is not an eventfd (it is ", target,
                      "; pass BufferChannel::event_fd())");
}

absl::StatusOr<std::unique_ptr<TokenRing>> TokenRing::Join(
    int memory_fd, int event_fd, const RingIdentity& identity) {
  const os::SyscallTable& sys = os::Sys();
  if (event_fd >= 0) {
    if (const std::string why = NotAnEventFd(sys, event_fd); !why.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("BufferChannel::Join: event fd ", event_fd, " ", why));
    }
  }
  struct stat st;
  if (memory_fd < 0 || sys.fstat(memory_fd, &st) != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "BufferChannel::Join: fd ", memory_fd, " is not an open descriptor"));
  }
  const int seals = sys.fcntl(memory_fd, F_GET_SEALS, 0);
  if (seals < 0 || (seals & (F_SEAL_SHRINK | F_SEAL_GROW)) !=
                       (F_SEAL_SHRINK | F_SEAL_GROW)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "BufferChannel::Join: fd ", memory_fd,
        " is not a sealed channel memfd (from BufferChannel::memory_fd())"));
  }
  if (static_cast<size_t>(st.st_size) < MapBytes(1) ||
      static_cast<size_t>(st.st_size) > MapBytes(kMaxCapacity)) {
    return absl::InvalidArgumentError(
        absl::StrCat("BufferChannel::Join: fd ", memory_fd, " has ", st.st_size,
                     " bytes, not a channel's"));
  }
  // Our own copies of both descriptors, so that the caller's may close.
  const int own_memory = sys.fcntl(memory_fd, F_DUPFD_CLOEXEC, 0);
  if (own_memory < 0) return os::PosixError("dup (BufferChannel::Join)", errno);
  const int own_event =
      event_fd < 0 ? -1 : sys.fcntl(event_fd, F_DUPFD_CLOEXEC, 0);
  if (own_event < 0) {
    const int err = event_fd < 0 ? EBADF : errno;
    CloseFd(own_memory);
    return os::PosixError(
        absl::StrCat("BufferChannel::Join: event fd ", event_fd), err);
  }
  auto ring = Map(own_memory, own_event, static_cast<size_t>(st.st_size));
  if (!ring.ok()) {
    CloseFd(own_memory);
    CloseFd(own_event);
    return ring.status();
  }
  const Layout* l = (*ring)->layout_;
  if (l->magic != kMagic || l->version != kVersion) {
    return absl::InvalidArgumentError(absl::StrCat(
        "BufferChannel::Join: fd ", memory_fd, " holds no channel"));
  }
  if (l->capacity == 0 || !std::has_single_bit(l->capacity) ||
      MapBytes(l->capacity) != static_cast<size_t>(st.st_size)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "BufferChannel::Join: fd ", memory_fd, " has a corrupt header"));
  }
  if (l->pool_dev != identity.dev || l->pool_ino != identity.ino ||
      l->buffer_size != identity.buffer_size) {
    return absl::InvalidArgumentError(
        "BufferChannel::Join: the channel belongs to another pool");
  }
  (*ring)->mask_ = l->capacity - 1;
  // Acquire: pairs with the other side's release stores, so the copies
  // start at indices whose slots are already written or already read.
  (*ring)->cached_head_ = l->head.load(std::memory_order_acquire);
  (*ring)->cached_tail_ = l->tail.load(std::memory_order_acquire);
  return ring;
}

absl::StatusOr<std::unique_ptr<TokenRing>> TokenRing::Map(int memory_fd,
                                                          int event_fd,
                                                          size_t bytes) {
  void* p = os::Sys().mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED,
                           memory_fd, 0);
  if (p == MAP_FAILED) return os::PosixError("mmap (BufferChannel)", errno);
  std::unique_ptr<TokenRing> ring(new TokenRing());
  ring->layout_ = static_cast<Layout*>(p);
  ring->map_bytes_ = bytes;
  ring->memory_fd_ = memory_fd;
  ring->event_fd_ = event_fd;
  return ring;
}

TokenRing::~TokenRing() {
  if (layout_ != nullptr) os::Sys().munmap(layout_, map_bytes_);
  CloseFd(memory_fd_);
  CloseFd(event_fd_);
}

bool TokenRing::HasRoom() {
  // Relaxed: only this sender writes tail.
  const uint64_t tail = layout_->tail.load(std::memory_order_relaxed);
  if (tail - cached_head_ <= mask_) return true;
  // Acquire: the receiver's release store of head came after its read of
  // the slots it frees, so overwriting them now is safe.
  cached_head_ = layout_->head.load(std::memory_order_acquire);
  return tail - cached_head_ <= mask_;
}

void TokenRing::Push(uint64_t token) {
  const uint64_t tail = layout_->tail.load(std::memory_order_relaxed);
  layout_->slots[tail & mask_].store(token, std::memory_order_relaxed);
  // Release: publishes the slot with the index.
  layout_->tail.store(tail + 1, std::memory_order_release);
  // Dekker with Wait()/Arm() (file comment): after the tail store, before
  // reading whether the receiver waits.
  std::atomic_thread_fence(std::memory_order_seq_cst);
  if (layout_->waiting.load(std::memory_order_relaxed) != kNone) Wake();
}

void TokenRing::Wake() {
  // Exchange: of a sender that saw the flag and a receiver that resets it,
  // exactly one acts on it.
  const uint32_t was =
      layout_->waiting.exchange(kNone, std::memory_order_acq_rel);
  if (was == kSleeping) {
    os::Sys().futex_wake(reinterpret_cast<uint32_t*>(&layout_->waiting), 1);
  } else if (was == kArmed) {
    const uint64_t one = 1;
    // EAGAIN (the count at its maximum) still leaves the fd readable.
    (void)os::Sys().write(event_fd_, &one, sizeof(one));
  }
}

bool TokenRing::Front(uint64_t* token) {
  // Relaxed: only this receiver writes head.
  const uint64_t head = layout_->head.load(std::memory_order_relaxed);
  // >=, not ==: the copy may be older than head itself when another
  // receiver (another process, or another object on this ring) took tokens
  // since this one last looked.
  if (head >= cached_tail_) {
    // The slot's line is fetched while tail's is: a token that has just
    // arrived costs one transfer between CPUs, not two in a row. (A
    // prefetch reads nothing the program sees: the load below still
    // comes after the acquire load of tail.)
    __builtin_prefetch(&layout_->slots[head & mask_]);
    // Acquire: pairs with Push()'s release, so the slot is written.
    cached_tail_ = layout_->tail.load(std::memory_order_acquire);
    // A head past tail is only possible in a ring written with nonsense:
    // empty.
    if (head >= cached_tail_) return false;
  }
  *token = layout_->slots[head & mask_].load(std::memory_order_relaxed);
  return true;
}

void TokenRing::Pop() {
  const uint64_t head = layout_->head.load(std::memory_order_relaxed);
  // Release: the slot was read (Front()) before the sender may reuse it.
  layout_->head.store(head + 1, std::memory_order_release);
}

bool TokenRing::Wait(absl::Time deadline) {
  uint64_t token;
  for (int i = 0; i < kSpins; ++i) {
    if (Front(&token)) return true;
    CpuRelax();
  }
  auto* word = reinterpret_cast<uint32_t*>(&layout_->waiting);
  for (;;) {
    layout_->waiting.store(kSleeping, std::memory_order_relaxed);
    // Dekker with Push(): the store above, a fence, then the reload of
    // tail in Front().
    std::atomic_thread_fence(std::memory_order_seq_cst);
    if (Front(&token)) break;
    const absl::Duration left = deadline - absl::Now();
    if (left <= absl::ZeroDuration()) {
      // Withdraw, unless a sender already took the flag (then a futex
      // wake may come for nobody: harmless).
      uint32_t expected = kSleeping;
      layout_->waiting.compare_exchange_strong(expected, kNone,
                                               std::memory_order_relaxed);
      return Front(&token);
    }
    timespec ts = absl::ToTimespec(left);
    if (deadline == absl::InfiniteFuture()) {
      os::Sys().futex_wait(word, kSleeping, nullptr);
    } else {
      os::Sys().futex_wait(word, kSleeping, &ts);
    }
    // Woken, timed out, interrupted or the flag already cleared: look again.
  }
  uint32_t expected = kSleeping;
  layout_->waiting.compare_exchange_strong(expected, kNone,
                                           std::memory_order_relaxed);
  return true;
}

bool TokenRing::Arm() {
  uint64_t count;
  // Clears an old notice; EAGAIN when there was none.
  (void)os::Sys().read(event_fd_, &count, sizeof(count));
  layout_->waiting.store(kArmed, std::memory_order_relaxed);
  // Dekker with Push(), as in Wait().
  std::atomic_thread_fence(std::memory_order_seq_cst);
  uint64_t token;
  if (!Front(&token)) return false;
  uint32_t expected = kArmed;
  layout_->waiting.compare_exchange_strong(expected, kNone,
                                           std::memory_order_relaxed);
  return true;
}

size_t TokenRing::size() const {
  const uint64_t head = layout_->head.load(std::memory_order_acquire);
  const uint64_t tail = layout_->tail.load(std::memory_order_acquire);
  return tail >= head ? static_cast<size_t>(tail - head) : 0;
}

}  // namespace bufpool::internal

// FixedBuffers: the pool's region as io_uring fixed buffers: a fixed pool's
// whole region in 1 GiB iovecs, an elastic pool's as a sparse table filled
// in chunk by chunk (see bufpool/uring.h).
#include <liburing.h>

#include <algorithm>
#include <cerrno>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "bufpool/uring.h"
#include "os/error.h"
#include "os/memory.h"
#include "os/uring.h"

namespace bufpool {

absl::StatusOr<FixedBuffers> FixedBuffers::Register(io_uring* ring,
                                                    const BufferPool& pool) {
  if (pool.buffer_size() > kMaxRegisteredBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("FixedBuffers: buffer_size ", pool.buffer_size(),
                     " is larger than a registered buffer may be (1 GiB)"));
  }
  const absl::Span<std::byte> region = pool.region();
  if (const size_t chunk = pool.chunk_bytes(); chunk != 0) {
    // Elastic: one sparse entry per chunk (at most 16384, the kernel's
    // table limit; growth.cc sizes chunks so).
    const auto entries = static_cast<unsigned>(region.size() / chunk +
                                               (region.size() % chunk != 0));
    const int rc = io_uring_register_buffers_sparse(ring, entries);
    if (rc == -EBUSY) {
      return os::PosixError(
          "io_uring_register_buffers_sparse (the ring already has fixed "
          "buffers)",
          -rc);
    }
    if (rc < 0) {
      return os::PosixError(
          absl::StrCat("io_uring_register_buffers_sparse of ", entries,
                       " entries for an elastic pool (needs Linux 5.19)"),
          -rc);
    }
    FixedBuffers fixed(ring, region.data(), region.size(), entries);
    fixed.shift_ = static_cast<unsigned>(__builtin_ctzll(chunk));
    fixed.registered_.assign((entries + 63) / 64, 0);
    fixed.pinned_ = const_cast<BufferPool*>(&pool);
    fixed.pinned_->PinRegion();
    return fixed;
  }
  std::vector<iovec> iov;
  for (size_t off = 0; off < region.size(); off += kMaxRegisteredBytes) {
    iov.push_back({region.data() + off,
                   std::min(kMaxRegisteredBytes, region.size() - off)});
  }
  // Registration pins every page: say so before the kernel's bare ENOMEM.
  constexpr const char* kWhat =
      "io_uring fixed-buffer registration of the pool's region";
  if (absl::Status s = os::CheckMemlock(region.size(), kWhat); !s.ok()) {
    return s;
  }
  const int rc = io_uring_register_buffers(ring, iov.data(),
                                           static_cast<unsigned>(iov.size()));
  if (rc == -ENOMEM) return os::MemlockError(region.size(), kWhat, -rc);
  if (rc == -EBUSY) {
    return os::PosixError(
        "io_uring_register_buffers (the ring already has fixed buffers)", -rc);
  }
  if (rc < 0) return os::PosixError("io_uring_register_buffers", -rc);
  return FixedBuffers(ring, region.data(), region.size(),
                      static_cast<unsigned>(iov.size()));
}

int FixedBuffers::RegisterChunk(unsigned index) const {
  const size_t chunk = size_t{1} << shift_;
  const size_t off = size_t{index} * chunk;
  iovec iov{base_ + off, std::min(chunk, bytes_ - off)};
  const __u64 tag = 0;
  // Pins the chunk's pages (the caller holds a buffer of it, so they are
  // backed). The pool is pinned, so no Trim() takes them while registered.
  const int rc =
      io_uring_register_buffers_update_tag(ring_, index, &iov, &tag, 1);
  if (rc < 0) return -1;
  registered_[index >> 6] |= uint64_t{1} << (index & 63);
  return static_cast<int>(index);
}

FixedBuffers::FixedBuffers(FixedBuffers&& other) noexcept
    : ring_(std::exchange(other.ring_, nullptr)),
      base_(std::exchange(other.base_, nullptr)),
      bytes_(std::exchange(other.bytes_, 0)),
      count_(std::exchange(other.count_, 0)),
      shift_(std::exchange(other.shift_, 30)),
      registered_(std::move(other.registered_)),
      pinned_(std::exchange(other.pinned_, nullptr)) {
  other.registered_.clear();
}

FixedBuffers& FixedBuffers::operator=(FixedBuffers&& other) noexcept {
  if (this != &other) {
    Unregister();
    ring_ = std::exchange(other.ring_, nullptr);
    base_ = std::exchange(other.base_, nullptr);
    bytes_ = std::exchange(other.bytes_, 0);
    count_ = std::exchange(other.count_, 0);
    shift_ = std::exchange(other.shift_, 30);
    registered_ = std::move(other.registered_);
    other.registered_.clear();
    pinned_ = std::exchange(other.pinned_, nullptr);
  }
  return *this;
}

FixedBuffers::~FixedBuffers() { Unregister(); }

void FixedBuffers::Unregister() {
  if (ring_ != nullptr) io_uring_unregister_buffers(ring_);
  // The kernel let go of the pages: the pool may trim again.
  if (pinned_ != nullptr) pinned_->UnpinRegion();
  ring_ = nullptr;
  base_ = nullptr;
  bytes_ = 0;
  count_ = 0;
  shift_ = 30;
  registered_.clear();
  pinned_ = nullptr;
}

}  // namespace bufpool

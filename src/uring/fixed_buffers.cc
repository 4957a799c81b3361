// FixedBuffers: the pool's region as io_uring fixed buffers.
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

static_assert(FixedBuffers::kMaxRegisteredBytes ==
                  os::Uring::kMaxRegisteredBytes,
              "one limit per registered buffer");

absl::StatusOr<FixedBuffers> FixedBuffers::Register(io_uring* ring,
                                                    const BufferPool& pool) {
  if (pool.buffer_size() > kMaxRegisteredBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("FixedBuffers: buffer_size ", pool.buffer_size(),
                     " is larger than a registered buffer may be (1 GiB)"));
  }
  const absl::Span<std::byte> region = pool.region();
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

FixedBuffers::FixedBuffers(FixedBuffers&& other) noexcept
    : ring_(std::exchange(other.ring_, nullptr)),
      base_(std::exchange(other.base_, nullptr)),
      bytes_(std::exchange(other.bytes_, 0)),
      count_(std::exchange(other.count_, 0)) {}

FixedBuffers& FixedBuffers::operator=(FixedBuffers&& other) noexcept {
  if (this != &other) {
    Unregister();
    ring_ = std::exchange(other.ring_, nullptr);
    base_ = std::exchange(other.base_, nullptr);
    bytes_ = std::exchange(other.bytes_, 0);
    count_ = std::exchange(other.count_, 0);
  }
  return *this;
}

FixedBuffers::~FixedBuffers() { Unregister(); }

void FixedBuffers::Unregister() {
  if (ring_ != nullptr) io_uring_unregister_buffers(ring_);
  ring_ = nullptr;
  base_ = nullptr;
  bytes_ = 0;
  count_ = 0;
}

}  // namespace bufpool

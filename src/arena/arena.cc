#include "arena/arena.h"

#include <algorithm>
#include <cstdint>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "os/memory.h"

namespace bufpool {
namespace {

size_t RoundUp(size_t n, size_t to) { return (n + to - 1) / to * to; }

// Maps `len` bytes (a multiple of 2 MiB) at a 2 MiB boundary, so that
// transparent huge pages can back all of it: over-map by one huge page, then
// trim the unaligned head and the tail.
absl::StatusOr<std::byte*> MapHugeAligned(size_t len, bool noreserve) {
  const size_t over = len + os::kHugePageSize;
  absl::StatusOr<void*> raw =
      noreserve ? os::ReserveAnonymous(over, /*hugetlb=*/false)
                : os::MapAnonymous(over, /*hugetlb=*/false);
  if (!raw.ok()) return raw.status();
  const auto start = reinterpret_cast<uintptr_t>(*raw);
  const uintptr_t aligned = RoundUp(start, os::kHugePageSize);
  const size_t head = aligned - start;
  const size_t tail = over - head - len;
  if (head != 0) os::Unmap(*raw, head);
  if (tail != 0) os::Unmap(reinterpret_cast<void*>(aligned + len), tail);
  return reinterpret_cast<std::byte*>(aligned);
}

}  // namespace

absl::StatusOr<Arena> Arena::Map(const ArenaOptions& options) {
  Arena arena;
  arena.size_ = options.size;
  // The whole mapping: the reserve when one is asked for (MAP_NORESERVE),
  // of which only `size` is backed below.
  const bool elastic = options.reserve > options.size;
  const size_t want = elastic ? options.reserve : options.size;
  auto map = [elastic](size_t len, bool hugetlb) {
    return elastic ? os::ReserveAnonymous(len, hugetlb)
                   : os::MapAnonymous(len, hugetlb);
  };
  switch (options.huge_pages) {
    case HugePages::kRequire: {
      arena.mapped_ = RoundUp(want, os::kHugePageSize);
      absl::StatusOr<void*> p = map(arena.mapped_, true);
      if (!p.ok()) {
        const long reserved = os::ReservedHugePages();
        return absl::UnavailableError(absl::StrCat(
            "huge_pages=kRequire: ", p.status().message(), " (",
            reserved == 0 ? "no huge pages are reserved"
                          : absl::StrCat(reserved, " huge pages reserved"),
            "; reserve 2 MiB pages with `sysctl vm.nr_hugepages=N` or use "
            "HugePages::kTry)"));
      }
      arena.base_ = static_cast<std::byte*>(*p);
      arena.huge_pages_ = true;
      break;
    }
    case HugePages::kTry:
      if (want >= os::kHugePageSize) {
        arena.mapped_ = RoundUp(want, os::kHugePageSize);
        absl::StatusOr<std::byte*> p = MapHugeAligned(arena.mapped_, elastic);
        if (!p.ok()) {
          return absl::ResourceExhaustedError(p.status().message());
        }
        arena.base_ = *p;
        // Advice refused (THP disabled): small pages still work.
        arena.huge_pages_ =
            os::AdviseHugePages(arena.base_, arena.mapped_).ok();
        break;
      }
      [[fallthrough]];  // too small for a huge page
    case HugePages::kNever: {
      arena.mapped_ = RoundUp(want, os::kPageSize);
      absl::StatusOr<void*> p = map(arena.mapped_, false);
      if (!p.ok()) return absl::ResourceExhaustedError(p.status().message());
      arena.base_ = static_cast<std::byte*>(*p);
      break;
    }
  }
  arena.lock_memory_ = options.lock_memory;
  // A fixed arena backs all it maps; an elastic one its first `size` bytes,
  // in whole commit units.
  const size_t backed =
      elastic
          ? std::min(arena.mapped_, RoundUp(options.size, arena.commit_unit()))
          : arena.mapped_;
  if (options.populate) {
    if (absl::Status s = os::Prefault(arena.base_, backed); !s.ok()) {
      return absl::ResourceExhaustedError(s.message());
    }
  }
  if (options.lock_memory) {
    if (absl::Status s = os::LockMemory(arena.base_, backed); !s.ok()) {
      return absl::ResourceExhaustedError(s.message());
    }
  }
  return arena;
}

absl::StatusOr<Arena> Arena::MapFile(int fd, size_t offset, size_t size,
                                     bool populate, bool lock_memory) {
  Arena arena;
  arena.size_ = size;
  arena.mapped_ = RoundUp(size, os::kPageSize);
  absl::StatusOr<void*> p = os::MapSharedFile(fd, offset, arena.mapped_);
  if (!p.ok()) return absl::ResourceExhaustedError(p.status().message());
  arena.base_ = static_cast<std::byte*>(*p);
  arena.lock_memory_ = lock_memory;
  if (populate) {
    if (absl::Status s = os::Prefault(arena.base_, arena.mapped_); !s.ok()) {
      return absl::ResourceExhaustedError(s.message());
    }
  }
  if (lock_memory) {
    if (absl::Status s = os::LockMemory(arena.base_, arena.mapped_); !s.ok()) {
      return absl::ResourceExhaustedError(s.message());
    }
  }
  return arena;
}

size_t Arena::commit_unit() const {
  return huge_pages_ ? os::kHugePageSize : os::kPageSize;
}

absl::Status Arena::Commit(size_t offset, size_t len) {
  // Always populated, whatever `populate` said at Map(): growth runs on the
  // slow path, and a step's page faults belong there rather than on the
  // first writes into the new buffers. Hugetlb pages come from the reserved
  // pool here (the mapping reserved none), so running out is this Status.
  if (absl::Status s = os::Prefault(base_ + offset, len); !s.ok()) {
    return absl::ResourceExhaustedError(s.message());
  }
  if (lock_memory_) {
    if (absl::Status s = os::LockMemory(base_ + offset, len); !s.ok()) {
      return absl::ResourceExhaustedError(s.message());
    }
  }
  return absl::OkStatus();
}

absl::Status Arena::Decommit(size_t offset, size_t len) {
  if (lock_memory_) {  // MADV_DONTNEED refuses locked pages (EINVAL)
    if (absl::Status s = os::UnlockMemory(base_ + offset, len); !s.ok()) {
      return s;
    }
  }
  return os::Decommit(base_ + offset, len);
}

Arena::Arena(Arena&& other) noexcept
    : base_(std::exchange(other.base_, nullptr)),
      size_(std::exchange(other.size_, 0)),
      mapped_(std::exchange(other.mapped_, 0)),
      huge_pages_(std::exchange(other.huge_pages_, false)),
      lock_memory_(other.lock_memory_) {}

Arena& Arena::operator=(Arena&& other) noexcept {
  if (this != &other) {
    this->~Arena();
    new (this) Arena(std::move(other));
  }
  return *this;
}

Arena::~Arena() {
  if (base_ != nullptr) os::Unmap(base_, mapped_);
}

}  // namespace bufpool

#include "arena/arena.h"

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
absl::StatusOr<std::byte*> MapHugeAligned(size_t len) {
  const size_t over = len + os::kHugePageSize;
  absl::StatusOr<void*> raw = os::MapAnonymous(over, /*hugetlb=*/false);
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
  switch (options.huge_pages) {
    case HugePages::kRequire: {
      arena.mapped_ = RoundUp(options.size, os::kHugePageSize);
      absl::StatusOr<void*> p = os::MapAnonymous(arena.mapped_, true);
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
      if (options.size >= os::kHugePageSize) {
        arena.mapped_ = RoundUp(options.size, os::kHugePageSize);
        absl::StatusOr<std::byte*> p = MapHugeAligned(arena.mapped_);
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
      arena.mapped_ = RoundUp(options.size, os::kPageSize);
      absl::StatusOr<void*> p = os::MapAnonymous(arena.mapped_, false);
      if (!p.ok()) return absl::ResourceExhaustedError(p.status().message());
      arena.base_ = static_cast<std::byte*>(*p);
      break;
    }
  }
  if (options.populate) {
    if (absl::Status s = os::Prefault(arena.base_, arena.mapped_); !s.ok()) {
      return absl::ResourceExhaustedError(s.message());
    }
  }
  if (options.lock_memory) {
    if (absl::Status s = os::LockMemory(arena.base_, arena.mapped_); !s.ok()) {
      return absl::ResourceExhaustedError(s.message());
    }
  }
  return arena;
}

Arena::Arena(Arena&& other) noexcept
    : base_(std::exchange(other.base_, nullptr)),
      size_(std::exchange(other.size_, 0)),
      mapped_(std::exchange(other.mapped_, 0)),
      huge_pages_(std::exchange(other.huge_pages_, false)) {}

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

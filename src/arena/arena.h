// Arena: one anonymous, page-aligned mapping that lives as long as its owner.
//
// The pool slices an Arena into buffers. The mapping is made once and never
// moved or shrunk, so any address inside it stays valid (and readable) for the
// Arena's lifetime. Not thread-safe to move or destroy; the memory itself is
// the caller's to share.
#ifndef BUFPOOL_SRC_ARENA_ARENA_H_
#define BUFPOOL_SRC_ARENA_ARENA_H_

#include <cstddef>

#include "absl/status/statusor.h"
#include "bufpool/options.h"

namespace bufpool {

struct ArenaOptions {
  size_t size = 0;  // bytes wanted; the mapping is rounded up
  HugePages huge_pages = HugePages::kTry;
  bool populate = true;
  bool lock_memory = false;
};

class Arena {
 public:
  // Errors: ResourceExhausted (mmap/mlock refused), Unavailable (kRequire
  // without reserved huge pages). Messages name the size and the remedy.
  static absl::StatusOr<Arena> Map(const ArenaOptions& options);

  Arena() = default;
  Arena(Arena&& other) noexcept;
  Arena& operator=(Arena&& other) noexcept;
  ~Arena();

  std::byte* data() const { return base_; }
  size_t size() const { return size_; }            // as requested
  size_t mapped_size() const { return mapped_; }   // rounded to the page size
  bool huge_pages() const { return huge_pages_; }  // hugetlb, or THP advised

 private:
  std::byte* base_ = nullptr;
  size_t size_ = 0;
  size_t mapped_ = 0;
  bool huge_pages_ = false;
};

}  // namespace bufpool

#endif  // BUFPOOL_SRC_ARENA_ARENA_H_

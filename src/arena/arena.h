// Arena: one anonymous, page-aligned mapping that lives as long as its owner.
//
// The pool slices an Arena into buffers. The mapping is made once and never
// moved or shrunk, so any address inside it stays valid (and readable) for the
// Arena's lifetime. Not thread-safe to move or destroy; the memory itself is
// the caller's to share.
//
// An elastic arena (ArenaOptions::reserve > size) maps the whole reserve at
// once with MAP_NORESERVE and backs only its first `size` bytes; Commit()
// backs more (populated, locked when asked) and Decommit() gives whole
// commit units back to the kernel (MADV_DONTNEED). Every byte of the reserve
// stays mapped read/write throughout: an unbacked page reads zero and is
// backed again by a write. Commit() and Decommit() of disjoint ranges may run
// concurrently; the caller keeps them disjoint.
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
  // Address space to map, >= size; 0: size. Beyond `size` it is reserved
  // (MAP_NORESERVE), not backed.
  size_t reserve = 0;
};

class Arena {
 public:
  // Errors: ResourceExhausted (mmap/mlock refused), Unavailable (kRequire
  // without reserved huge pages). Messages name the size and the remedy.
  static absl::StatusOr<Arena> Map(const ArenaOptions& options);
  // `size` bytes of the file `fd` from `offset` (a page multiple), mapped
  // shared (a shared pool's memfd), populated and locked as asked; small
  // pages as far as the arena knows (shmem may still use huge ones).
  static absl::StatusOr<Arena> MapFile(int fd, size_t offset, size_t size,
                                       bool populate, bool lock_memory);

  Arena() = default;
  Arena(Arena&& other) noexcept;
  Arena& operator=(Arena&& other) noexcept;
  ~Arena();

  std::byte* data() const { return base_; }
  size_t size() const { return size_; }            // as requested
  size_t mapped_size() const { return mapped_; }   // rounded to the page size
  bool huge_pages() const { return huge_pages_; }  // hugetlb, or THP advised

  // The granule of Commit()/Decommit(): 2 MiB with huge pages (a THP range
  // split by a partial DONTNEED would be collapsed again by khugepaged; a
  // hugetlb page cannot be split), else 4 KiB.
  size_t commit_unit() const;
  // Backs [offset, offset + len) (whole commit units inside the mapping):
  // populated with MADV_POPULATE_WRITE, and mlocked when the arena locks
  // memory. ResourceExhausted with the system's words on failure; the range
  // may then be partly backed (Decommit() it to give that back).
  absl::Status Commit(size_t offset, size_t len);
  // Gives [offset, offset + len) (whole commit units) back to the kernel:
  // munlock when locked, then MADV_DONTNEED. The bytes read zero afterwards.
  absl::Status Decommit(size_t offset, size_t len);

 private:
  std::byte* base_ = nullptr;
  size_t size_ = 0;
  size_t mapped_ = 0;
  bool huge_pages_ = false;
  bool lock_memory_ = false;
};

}  // namespace bufpool

#endif  // BUFPOOL_SRC_ARENA_ARENA_H_

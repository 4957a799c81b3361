#include "os/memory.h"

#include <sys/mman.h>
#include <sys/resource.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "os/error.h"

namespace bufpool::os {

absl::StatusOr<void*> MapAnonymous(size_t len, bool hugetlb) {
  int flags = MAP_PRIVATE | MAP_ANONYMOUS;
  if (hugetlb) flags |= MAP_HUGETLB;
  void* p = mmap(nullptr, len, PROT_READ | PROT_WRITE, flags, -1, 0);
  if (p == MAP_FAILED) {
    return PosixError(absl::StrCat("mmap of ", len, " bytes",
                                   hugetlb ? " with MAP_HUGETLB" : ""),
                      errno);
  }
  return p;
}

void Unmap(void* addr, size_t len) {
  if (munmap(addr, len) != 0) {
    std::fprintf(stderr, "bufpool: munmap(%p, %zu) failed: %s\n", addr, len,
                 std::strerror(errno));
    std::abort();
  }
}

absl::Status AdviseHugePages(void* addr, size_t len) {
  if (madvise(addr, len, MADV_HUGEPAGE) != 0) {
    return PosixError("madvise(MADV_HUGEPAGE)", errno);
  }
  return absl::OkStatus();
}

absl::Status Prefault(void* addr, size_t len) {
  if (madvise(addr, len, MADV_POPULATE_WRITE) == 0) return absl::OkStatus();
  if (errno != EINVAL) {  // EINVAL: kernel older than 5.14; touch by hand
    return PosixError(
        absl::StrCat("madvise(MADV_POPULATE_WRITE) of ", len, " bytes"), errno);
  }
  auto* bytes = static_cast<volatile unsigned char*>(addr);
  for (size_t off = 0; off < len; off += kPageSize) bytes[off] = 0;
  return absl::OkStatus();
}

absl::Status LockMemory(void* addr, size_t len) {
  if (mlock(addr, len) == 0) return absl::OkStatus();
  const int err = errno;
  rlimit lim{};
  std::string limit = "unknown";
  if (getrlimit(RLIMIT_MEMLOCK, &lim) == 0) {
    limit = lim.rlim_cur == RLIM_INFINITY
                ? std::string("unlimited")
                : absl::StrCat(lim.rlim_cur / 1024, " KiB");
  }
  return PosixError(
      absl::StrCat("mlock of ", len, " bytes failed (RLIMIT_MEMLOCK is ", limit,
                   "; raise it with `ulimit -l` or run without "
                   "lock_memory)"),
      err);
}

long ReservedHugePages() {
  std::FILE* f = std::fopen("/proc/sys/vm/nr_hugepages", "r");
  if (f == nullptr) return -1;
  long n = -1;
  if (std::fscanf(f, "%ld", &n) != 1) n = -1;
  std::fclose(f);
  return n;
}

}  // namespace bufpool::os

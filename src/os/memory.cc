#include "os/memory.h"

#include <linux/capability.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "absl/strings/str_cat.h"
#include "os/error.h"
#include "os/syscalls.h"

namespace bufpool::os {

namespace {

absl::StatusOr<void*> MapWithFlags(size_t len, bool hugetlb, int extra) {
  int flags = MAP_PRIVATE | MAP_ANONYMOUS | extra;
  if (hugetlb) flags |= MAP_HUGETLB;
  void* p = Sys().mmap(nullptr, len, PROT_READ | PROT_WRITE, flags, -1, 0);
  if (p == MAP_FAILED) {
    return PosixError(
        absl::StrCat("mmap of ", len, " bytes",
                     (extra & MAP_NORESERVE) != 0 ? " with MAP_NORESERVE" : "",
                     hugetlb ? " with MAP_HUGETLB" : ""),
        errno);
  }
  return p;
}

}  // namespace

absl::StatusOr<void*> MapAnonymous(size_t len, bool hugetlb) {
  return MapWithFlags(len, hugetlb, 0);
}

absl::StatusOr<void*> MapSharedFile(int fd, size_t offset, size_t len) {
  void* p = Sys().mmap(nullptr, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd,
                       static_cast<off_t>(offset));
  if (p == MAP_FAILED) {
    return PosixError(absl::StrCat("mmap of ", len, " bytes of fd ", fd,
                                   " at offset ", offset, " (MAP_SHARED)"),
                      errno);
  }
  return p;
}

absl::StatusOr<void*> ReserveAnonymous(size_t len, bool hugetlb) {
  return MapWithFlags(len, hugetlb, MAP_NORESERVE);
}

absl::Status Decommit(void* addr, size_t len) {
  if (Sys().madvise(addr, len, MADV_DONTNEED) != 0) {
    return PosixError(absl::StrCat("madvise(MADV_DONTNEED) of ", len, " bytes"),
                      errno);
  }
  return absl::OkStatus();
}

void Unmap(void* addr, size_t len) {
  if (Sys().munmap(addr, len) != 0) {
    std::fprintf(stderr, "bufpool: munmap(%p, %zu) failed: %s\n", addr, len,
                 std::strerror(errno));
    std::abort();
  }
}

absl::Status AdviseHugePages(void* addr, size_t len) {
  if (Sys().madvise(addr, len, MADV_HUGEPAGE) != 0) {
    return PosixError("madvise(MADV_HUGEPAGE)", errno);
  }
  return absl::OkStatus();
}

absl::Status AdviseNoHugePages(void* addr, size_t len) {
  if (Sys().madvise(addr, len, MADV_NOHUGEPAGE) != 0) {
    return PosixError("madvise(MADV_NOHUGEPAGE)", errno);
  }
  return absl::OkStatus();
}

absl::Status Prefault(void* addr, size_t len) {
  if (Sys().madvise(addr, len, MADV_POPULATE_WRITE) == 0) {
    return absl::OkStatus();
  }
  if (errno != EINVAL) {  // EINVAL: kernel older than 5.14; touch by hand
    return PosixError(
        absl::StrCat("madvise(MADV_POPULATE_WRITE) of ", len, " bytes"), errno);
  }
  auto* bytes = static_cast<volatile unsigned char*>(addr);
  for (size_t off = 0; off < len; off += kPageSize) bytes[off] = 0;
  return absl::OkStatus();
}

absl::Status LockMemory(void* addr, size_t len) {
  if (Sys().mlock(addr, len) == 0) return absl::OkStatus();
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

absl::Status UnlockMemory(void* addr, size_t len) {
  if (Sys().munlock(addr, len) != 0) {
    return PosixError(absl::StrCat("munlock of ", len, " bytes"), errno);
  }
  return absl::OkStatus();
}

namespace {

bool HasIpcLock() {
  __user_cap_header_struct hdr{_LINUX_CAPABILITY_VERSION_3, 0};
  __user_cap_data_struct data[2] = {};
  if (syscall(SYS_capget, &hdr, data) != 0) return false;
  return (data[0].effective & (1u << CAP_IPC_LOCK)) != 0;
}

std::string MemlockWords(size_t bytes, absl::string_view what,
                         const rlimit& lim) {
  return absl::StrCat(what, " needs ", bytes, " bytes (", bytes >> 10,
                      " KiB) of locked memory but RLIMIT_MEMLOCK is ",
                      lim.rlim_cur >> 10, " KiB; raise it with `ulimit -l ",
                      (bytes + 1023) >> 10,
                      "` (or more: memory already locked counts too)");
}

}  // namespace

absl::Status CheckMemlock(size_t bytes, absl::string_view what) {
  if (HasIpcLock()) return absl::OkStatus();
  rlimit lim{};
  if (getrlimit(RLIMIT_MEMLOCK, &lim) != 0) return absl::OkStatus();
  if (lim.rlim_cur == RLIM_INFINITY || lim.rlim_cur >= bytes) {
    return absl::OkStatus();
  }
  return absl::ResourceExhaustedError(MemlockWords(bytes, what, lim));
}

absl::Status MemlockError(size_t bytes, absl::string_view what, int err) {
  rlimit lim{};
  if (getrlimit(RLIMIT_MEMLOCK, &lim) != 0 || lim.rlim_cur == RLIM_INFINITY) {
    return PosixError(what, err);
  }
  return PosixError(MemlockWords(bytes, what, lim), err);
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

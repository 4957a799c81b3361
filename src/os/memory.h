// Thin OS layer for memory: the only code that calls mmap, munmap, madvise,
// mlock, each through the system-call table (os/syscalls.h), so tests can
// fail them. Every function returns a Status whose message names the call,
// the size and the system's words.
#ifndef BUFPOOL_SRC_OS_MEMORY_H_
#define BUFPOOL_SRC_OS_MEMORY_H_

#include <cstddef>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace bufpool::os {

inline constexpr size_t kPageSize = 4096;
inline constexpr size_t kHugePageSize = size_t{2} << 20;

// Anonymous private read/write mapping of `len` bytes (a page multiple).
// With `hugetlb`, MAP_HUGETLB from the reserved 2 MiB pool (`len` a multiple
// of kHugePageSize).
absl::StatusOr<void*> MapAnonymous(size_t len, bool hugetlb);
void Unmap(void* addr, size_t len);  // aborts on failure: a bug, not an error

// A shared read/write mapping of `len` bytes of `fd` from `offset` (both
// page multiples): a shared pool's memfd.
absl::StatusOr<void*> MapSharedFile(int fd, size_t offset, size_t len);

// MapAnonymous with MAP_NORESERVE: address space for a pool's ceiling that
// costs no memory (and, under the default overcommit policy, no commit
// charge) until a page is written or populated. With `hugetlb`, no huge
// pages are reserved either: they are taken when Prefault() populates them,
// which then fails (a Status) instead of a later write faulting.
absl::StatusOr<void*> ReserveAnonymous(size_t len, bool hugetlb);

// madvise(MADV_DONTNEED): gives [addr, addr+len) back to the kernel now; the
// range stays mapped, read and write, and reads zero until written again.
absl::Status Decommit(void* addr, size_t len);

// madvise(MADV_HUGEPAGE). Fails where THP is compiled out or disabled.
absl::Status AdviseHugePages(void* addr, size_t len);

// madvise(MADV_NOHUGEPAGE): small pages only (a first write must not bring
// in 2 MiB where THP is "always").
absl::Status AdviseNoHugePages(void* addr, size_t len);

// Faults every page of [addr, addr+len) in, writable, so that first use does
// not pay a page fault: MADV_POPULATE_WRITE, or one write per page on kernels
// without it.
absl::Status Prefault(void* addr, size_t len);

// mlock; the error names RLIMIT_MEMLOCK and its current value.
absl::Status LockMemory(void* addr, size_t len);
// munlock (before Decommit of a locked range: MADV_DONTNEED refuses locked
// pages).
absl::Status UnlockMemory(void* addr, size_t len);

// Whether the kernel lets this process pin `bytes` (io_uring buffer
// registration, mlock): always with CAP_IPC_LOCK, else when RLIMIT_MEMLOCK
// is unlimited or at least `bytes`. Otherwise ResourceExhausted: "<what>
// needs <bytes> bytes of locked memory but RLIMIT_MEMLOCK is <limit>; raise
// it with `ulimit -l` ...". Memory the process has pinned already also
// counts against the limit, so a pin can still fail after this passes.
absl::Status CheckMemlock(size_t bytes, absl::string_view what);
// The same message for a pin the kernel refused with `err` (ENOMEM).
absl::Status MemlockError(size_t bytes, absl::string_view what, int err);

// Huge pages currently reserved (/proc/sys/vm/nr_hugepages); -1 if unknown.
long ReservedHugePages();

}  // namespace bufpool::os

#endif  // BUFPOOL_SRC_OS_MEMORY_H_

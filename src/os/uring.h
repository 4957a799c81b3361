// A small io_uring interface for the copy engine, behind the OS seam.
//
// The copy engine talks to io_uring only through `Uring`, created by
// UringSys().uring_create, so tests can wrap the real ring and inject short
// completions, -EAGAIN results or a failing buffer registration. The real
// implementation (CreateUring) uses liburing.
//
// The io_uring calls have their own table (UringSyscallTable), apart from
// os/syscalls.h's, so the room that holds them (os_uring: this header and
// uring.cc) is the only part of src/os that links liburing, and the core
// (arena, pool, chain, io, the C API) links without it.
//
// Thread safety: a Uring is used by one thread at a time. UringSys() may be
// called from any thread; ScopedUringSyscalls is installed as ScopedSyscalls
// is (before the threads that use it start).
#ifndef BUFPOOL_SRC_OS_URING_H_
#define BUFPOOL_SRC_OS_URING_H_

#include <sys/stat.h>
#include <sys/types.h>
#include <sys/uio.h>

#include <cstddef>
#include <cstdint>
#include <memory>

struct io_uring;         // liburing.h
struct io_uring_params;  // liburing.h

namespace bufpool::os {

class Uring {
 public:
  struct Completion {
    uint64_t user_data;
    int res;  // bytes moved, or -errno
  };

  virtual ~Uring() = default;

  // Registers iov[0, n) as fixed buffers (index i is iov[i]). 0 or -errno;
  // -ENOMEM when RLIMIT_MEMLOCK is too small for the pinned pages.
  virtual int RegisterBuffers(const iovec* iov, unsigned n) = 0;
  // Drops the registered buffers (none in flight may use them). 0 or -errno.
  virtual int UnregisterBuffers() = 0;
  // Queues a read/write of `len` bytes at `offset`. With buf_index >= 0 the
  // operation is READ_FIXED/WRITE_FIXED and `buf` must lie inside registered
  // buffer `buf_index`. Returns false when the submission queue is full.
  virtual bool PrepareRead(int fd, void* buf, unsigned len, uint64_t offset,
                           int buf_index, uint64_t user_data) = 0;
  virtual bool PrepareWrite(int fd, const void* buf, unsigned len,
                            uint64_t offset, int buf_index,
                            uint64_t user_data) = 0;
  // Submits what is queued and waits until `wait_nr` completions are ready.
  // Returns the number submitted or -errno (-EINTR: call again).
  virtual int SubmitAndWait(unsigned wait_nr) = 0;

  // ---- File operations (the tree copy) ----
  // The operations a caller may ask the kernel whether it has.
  enum class Op {
    kRead,
    kWrite,
    kReadFixed,
    kWriteFixed,
    kOpenat,
    kStatx,
    kClose,
    kMkdirat,   // 5.15
    kSymlinkat  // 5.15
  };
  // Whether the kernel runs `op` (IORING_REGISTER_PROBE, asked once when the
  // ring is made; false when the probe itself is refused).
  virtual bool Supports(Op op) = 0;
  // Queue openat(dirfd, path, flags, mode), statx(dirfd, path, flags, mask,
  // out) and close(fd). `path` and `out` must stay valid until the
  // operation completes. The completion's res is the new descriptor, 0, or
  // -errno. Each returns false when the submission queue is full.
  virtual bool PrepareOpenat(int dirfd, const char* path, int flags,
                             mode_t mode, uint64_t user_data) = 0;
  virtual bool PrepareStatx(int dirfd, const char* path, int flags,
                            unsigned mask, struct statx* out,
                            uint64_t user_data) = 0;
  virtual bool PrepareClose(int fd, uint64_t user_data) = 0;
  // Queue mkdirat(dirfd, path, mode) and symlinkat(target, dirfd, path)
  // (kernel 5.15; ask Supports first). The strings must stay valid until
  // the operation completes; res is 0 or -errno. False when the submission
  // queue is full.
  virtual bool PrepareMkdirat(int dirfd, const char* path, mode_t mode,
                              uint64_t user_data) = 0;
  virtual bool PrepareSymlinkat(const char* target, int dirfd, const char* path,
                                uint64_t user_data) = 0;
  // Links the operation prepared last to the one prepared next, which then
  // starts only after it. kSoft: when the linked operation fails (a read or
  // write that moves fewer bytes than asked counts as failing), every later
  // operation of the chain completes with -ECANCELED. kHard: the next one
  // runs whatever the result. A chain must be submitted whole: check
  // SubmissionSpace() before preparing it.
  enum class Link { kSoft, kHard };
  virtual void LinkLast(Link link) = 0;
  // Free submission slots.
  virtual unsigned SubmissionSpace() = 0;
  // Takes one ready completion; false when none is ready.
  virtual bool PopCompletion(Completion* out) = 0;
};

// The real ring (liburing) with `entries` submission slots: 0 or -errno
// (-ENOSYS when the kernel has no io_uring, -EPERM when it is disabled).
int CreateUring(unsigned entries, std::unique_ptr<Uring>* out);

// The io_uring calls the library makes, replaceable by tests as
// SyscallTable's are.
struct UringSyscallTable {
  // Creates a ring (CreateUring); returns 0 or -errno, not -1.
  int (*uring_create)(unsigned entries, std::unique_ptr<Uring>* out);
  // io_uring_queue_init_params (liburing): a ring the caller drives with
  // liburing itself (bufpool::InitServerRing). 0 or -errno, not -1.
  int (*uring_queue_init_params)(unsigned entries, io_uring* ring,
                                 io_uring_params* params);
  // io_uring_register(ring_fd, IORING_REGISTER_ENABLE_RINGS): 0 or -errno.
  int (*uring_enable_rings)(int ring_fd);
};

// The real calls.
const UringSyscallTable& RealUringSyscalls();

// The table in use: RealUringSyscalls() unless a test installed another.
const UringSyscallTable& UringSys();

// Test seam: makes `table` the one UringSys() returns until destroyed.
// Nestable.
class ScopedUringSyscalls {
 public:
  explicit ScopedUringSyscalls(const UringSyscallTable* table);
  ~ScopedUringSyscalls();
  ScopedUringSyscalls(const ScopedUringSyscalls&) = delete;
  ScopedUringSyscalls& operator=(const ScopedUringSyscalls&) = delete;

 private:
  const UringSyscallTable* previous_;
};

}  // namespace bufpool::os

#endif  // BUFPOOL_SRC_OS_URING_H_

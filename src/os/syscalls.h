// The system-call seam: every system call the library's I/O makes (files,
// directories, sockets, epoll, eventfd, poll) goes through one table, so tests
// can inject faults (short transfers, EINTR, EAGAIN, ENOSPC, EIO, ECONNRESET, a
// refused ring) without touching the real system. os/file.h and os/socket.h
// build their loops and error mapping on it; code outside src/os that needs a
// raw call takes it from Sys() too.
//
// io_uring has a table of its own (os/uring.h, UringSys()), in the room
// os_uring: this table and the rooms that use only it (the core) do not link
// liburing.
//
// The core's calls are in the table too: memory mapping (os/memory.h
// builds on mmap, munmap, madvise, mlock), the CPU a thread runs on, and
// the membarrier fences (os/thread.h), so that a test can fail each of them.
//
// Thread safety: Sys() may be called from any thread. Installing a table with
// ScopedSyscalls is not synchronised: do it before starting the threads that
// use it, and remove it after they stop.
#ifndef BUFPOOL_SRC_OS_SYSCALLS_H_
#define BUFPOOL_SRC_OS_SYSCALLS_H_

#include <dirent.h>
#include <fcntl.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/uio.h>
#include <time.h>

#include <cstddef>
#include <cstdint>
#include <memory>

namespace bufpool::os {

// Every entry behaves like the libc call of the same name (returns -1 and
// sets errno on failure) unless its comment says otherwise. Add entries here
// rather than calling libc directly. Descriptors are opened close-on-exec.
struct SyscallTable {
  // ---- Descriptors (files, pipes and sockets alike) ----
  int (*open)(const char* path, int flags, mode_t mode);
  int (*close)(int fd);
  ssize_t (*read)(int fd, void* buf, size_t n);
  ssize_t (*write)(int fd, const void* buf, size_t n);
  ssize_t (*readv)(int fd, const iovec* iov, int iovcnt);
  ssize_t (*writev)(int fd, const iovec* iov, int iovcnt);
  ssize_t (*preadv)(int fd, const iovec* iov, int iovcnt, off_t offset);
  ssize_t (*pwritev)(int fd, const iovec* iov, int iovcnt, off_t offset);
  // fcntl with an int argument (F_GETFL, F_SETFL, ...).
  int (*fcntl)(int fd, int cmd, int arg);
  // poll(2) on one descriptor: `events` is POLLIN/POLLOUT; returns the
  // revents, 0 on timeout, -1 with errno on failure.
  int (*poll_one)(int fd, short events, int timeout_ms);

  // ---- Files ----
  int (*fsync)(int fd);
  int (*fstat)(int fd, struct stat* st);
  int (*ftruncate)(int fd, off_t length);
  off_t (*lseek)(int fd, off_t offset, int whence);
  // Reserves blocks before an O_DIRECT copy writes them.
  int (*fallocate)(int fd, int mode, off_t offset, off_t len);
  ssize_t (*copy_file_range)(int fd_in, off_t* off_in, int fd_out,
                             off_t* off_out, size_t len, unsigned flags);
  ssize_t (*sendfile)(int out_fd, int in_fd, off_t* offset, size_t count);
  int (*fchmod)(int fd, mode_t mode);
  int (*fchown)(int fd, uid_t owner, gid_t group);
  int (*futimens)(int fd, const struct timespec times[2]);

  // ---- Paths and directories ----
  int (*stat)(const char* path, struct stat* st);
  int (*lstat)(const char* path, struct stat* st);
  int (*rename)(const char* from, const char* to);
  int (*renameat2)(int olddirfd, const char* from, int newdirfd, const char* to,
                   unsigned flags);
  int (*link)(const char* from, const char* to);
  int (*unlink)(const char* path);
  // realpath(path, nullptr): the result is malloc'ed; the caller frees it.
  char* (*realpath)(const char* path, char* resolved);
  int (*mkdir)(const char* path, mode_t mode);
  int (*symlink)(const char* target, const char* path);
  ssize_t (*readlink)(const char* path, char* buf, size_t size);
  int (*mknod)(const char* path, mode_t mode, dev_t dev);
  int (*chmod)(const char* path, mode_t mode);
  int (*lchown)(const char* path, uid_t owner, gid_t group);
  int (*utimensat)(int dirfd, const char* path, const struct timespec times[2],
                   int flags);
  DIR* (*opendir)(const char* path);
  dirent* (*readdir)(DIR* dir);
  int (*closedir)(DIR* dir);

  // ---- Sockets ----
  int (*socket)(int domain, int type, int protocol);
  int (*socketpair)(int domain, int type, int protocol, int fds[2]);
  int (*bind)(int fd, const sockaddr* addr, socklen_t len);
  int (*listen)(int fd, int backlog);
  int (*accept4)(int fd, sockaddr* addr, socklen_t* len, int flags);
  int (*connect)(int fd, const sockaddr* addr, socklen_t len);
  int (*setsockopt)(int fd, int level, int name, const void* value,
                    socklen_t len);
  int (*getsockname)(int fd, sockaddr* addr, socklen_t* len);
  int (*getsockopt)(int fd, int level, int name, void* value, socklen_t* len);
  int (*shutdown)(int fd, int how);
  ssize_t (*recv)(int fd, void* buf, size_t n, int flags);
  ssize_t (*send)(int fd, const void* buf, size_t n, int flags);
  ssize_t (*sendmsg)(int fd, const msghdr* msg, int flags);

  // ---- Event descriptors ----
  int (*epoll_create1)(int flags);
  int (*epoll_ctl)(int epfd, int op, int fd, epoll_event* event);
  int (*epoll_wait)(int epfd, epoll_event* events, int max, int timeout_ms);
  int (*eventfd)(unsigned initval, int flags);

  // ---- Memory, CPUs and fences (the core: arena, pool) ----
  void* (*mmap)(void* addr, size_t len, int prot, int flags, int fd,
                off_t offset);
  int (*munmap)(void* addr, size_t len);
  int (*madvise)(void* addr, size_t len, int advice);
  int (*mlock)(const void* addr, size_t len);
  int (*munlock)(const void* addr, size_t len);
  int (*sched_getcpu)();
  // membarrier(2): returns what the system call returns (-1 and errno on
  // failure).
  long (*membarrier)(int cmd, unsigned flags, int cpu);

  // ---- Shared pools (the memfd, its locks, the process) ----
  // memfd_create(2), MFD_CLOEXEC added.
  int (*memfd_create)(const char* name, unsigned flags);
  // fcntl with a struct flock argument (F_OFD_SETLK, F_OFD_GETLK).
  int (*fcntl_lock)(int fd, int cmd, struct flock* lock);
  pid_t (*getpid)();

  // ---- Waking a process that waits on shared memory (channels) ----
  // futex(2) FUTEX_WAIT on a word that may be shared between processes
  // (not FUTEX_PRIVATE_FLAG): sleeps while *word == expected, at most
  // `timeout` (relative; nullptr: no limit). 0 when woken; -1 with errno
  // EAGAIN (the word differed), ETIMEDOUT or EINTR.
  int (*futex_wait)(uint32_t* word, uint32_t expected, const timespec* timeout);
  // futex(2) FUTEX_WAKE: wakes up to `count` sleepers on `word` in any
  // process; returns how many it woke.
  int (*futex_wake)(uint32_t* word, int count);
};

// The real system calls.
const SyscallTable& RealSyscalls();

// The table in use: RealSyscalls() unless a test installed another.
const SyscallTable& Sys();

// Test seam: makes `table` the one Sys() returns until destroyed. Nestable.
class ScopedSyscalls {
 public:
  explicit ScopedSyscalls(const SyscallTable* table);
  ~ScopedSyscalls();
  ScopedSyscalls(const ScopedSyscalls&) = delete;
  ScopedSyscalls& operator=(const ScopedSyscalls&) = delete;

 private:
  const SyscallTable* previous_;
};

}  // namespace bufpool::os

#endif  // BUFPOOL_SRC_OS_SYSCALLS_H_

#include "os/syscalls.h"

#include <fcntl.h>
#include <linux/futex.h>
#include <poll.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/sendfile.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>

namespace bufpool::os {
namespace {

// Wrappers where the libc call is overloaded, variadic, or where the seam
// adds close-on-exec to every descriptor it creates.
int RealOpen(const char* path, int flags, mode_t mode) {
  return ::open(path, flags | O_CLOEXEC, mode);
}
int RealFcntl(int fd, int cmd, int arg) { return ::fcntl(fd, cmd, arg); }
int RealPollOne(int fd, short events, int timeout_ms) {
  pollfd p{.fd = fd, .events = events, .revents = 0};
  const int n = ::poll(&p, 1, timeout_ms);
  return n <= 0 ? n : p.revents;
}
int RealFstat(int fd, struct stat* st) { return ::fstat(fd, st); }
ssize_t RealCopyFileRange(int fd_in, off_t* off_in, int fd_out, off_t* off_out,
                          size_t len, unsigned flags) {
  return ::copy_file_range(fd_in, off_in, fd_out, off_out, len, flags);
}
int RealLstat(const char* path, struct stat* st) { return ::lstat(path, st); }
int RealRenameat2(int olddirfd, const char* from, int newdirfd, const char* to,
                  unsigned flags) {
  return ::renameat2(olddirfd, from, newdirfd, to, flags);
}
int RealMkdir(const char* path, mode_t mode) { return ::mkdir(path, mode); }
int RealMknod(const char* path, mode_t mode, dev_t dev) {
  return ::mknod(path, mode, dev);
}
long RealMembarrier(int cmd, unsigned flags, int cpu) {
  return ::syscall(SYS_membarrier, cmd, flags, cpu);
}
int RealSocket(int domain, int type, int protocol) {
  return ::socket(domain, type | SOCK_CLOEXEC, protocol);
}
int RealSocketPair(int domain, int type, int protocol, int fds[2]) {
  return ::socketpair(domain, type | SOCK_CLOEXEC, protocol, fds);
}
int RealMemfdCreate(const char* name, unsigned flags) {
  return ::memfd_create(name, flags | MFD_CLOEXEC);
}
int RealFcntlLock(int fd, int cmd, struct flock* lock) {
  return ::fcntl(fd, cmd, lock);
}
int RealFutexWait(uint32_t* word, uint32_t expected, const timespec* timeout) {
  return static_cast<int>(
      ::syscall(SYS_futex, word, FUTEX_WAIT, expected, timeout, nullptr, 0));
}
int RealFutexWake(uint32_t* word, int count) {
  return static_cast<int>(
      ::syscall(SYS_futex, word, FUTEX_WAKE, count, nullptr, nullptr, 0));
}
constexpr SyscallTable kReal = {
    .open = RealOpen,
    .close = ::close,
    .read = ::read,
    .write = ::write,
    .readv = ::readv,
    .writev = ::writev,
    .preadv = ::preadv,
    .pwritev = ::pwritev,
    .fcntl = RealFcntl,
    .poll_one = RealPollOne,
    .fsync = ::fsync,
    .fstat = RealFstat,
    .ftruncate = ::ftruncate,
    .lseek = ::lseek,
    .fallocate = ::fallocate,
    .copy_file_range = RealCopyFileRange,
    .sendfile = ::sendfile,
    .fchmod = ::fchmod,
    .fchown = ::fchown,
    .futimens = ::futimens,
    .stat = ::stat,
    .lstat = RealLstat,
    .rename = ::rename,
    .renameat2 = RealRenameat2,
    .link = ::link,
    .unlink = ::unlink,
    .realpath = ::realpath,
    .mkdir = RealMkdir,
    .symlink = ::symlink,
    .readlink = ::readlink,
    .mknod = RealMknod,
    .chmod = ::chmod,
    .lchown = ::lchown,
    .utimensat = ::utimensat,
    .opendir = ::opendir,
    .readdir = ::readdir,
    .closedir = ::closedir,
    .socket = RealSocket,
    .socketpair = RealSocketPair,
    .bind = ::bind,
    .listen = ::listen,
    .accept4 = ::accept4,
    .connect = ::connect,
    .setsockopt = ::setsockopt,
    .getsockname = ::getsockname,
    .getsockopt = ::getsockopt,
    .shutdown = ::shutdown,
    .recv = ::recv,
    .send = ::send,
    .sendmsg = ::sendmsg,
    .epoll_create1 = ::epoll_create1,
    .epoll_ctl = ::epoll_ctl,
    .epoll_wait = ::epoll_wait,
    .eventfd = ::eventfd,
    .mmap = ::mmap,
    .munmap = ::munmap,
    .madvise = ::madvise,
    .mlock = ::mlock,
    .munlock = ::munlock,
    .sched_getcpu = ::sched_getcpu,
    .membarrier = RealMembarrier,
    .memfd_create = RealMemfdCreate,
    .fcntl_lock = RealFcntlLock,
    .getpid = ::getpid,
    .futex_wait = RealFutexWait,
    .futex_wake = RealFutexWake,
};

// Relaxed: tables are installed before the threads that use them start
// (see the header), so thread creation already orders the store.
std::atomic<const SyscallTable*> g_table{&kReal};

}  // namespace

const SyscallTable& RealSyscalls() { return kReal; }

const SyscallTable& Sys() { return *g_table.load(std::memory_order_relaxed); }

ScopedSyscalls::ScopedSyscalls(const SyscallTable* table)
    : previous_(g_table.exchange(table, std::memory_order_relaxed)) {}

ScopedSyscalls::~ScopedSyscalls() {
  g_table.store(previous_, std::memory_order_relaxed);
}

}  // namespace bufpool::os

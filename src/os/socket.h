// Thin OS layer for sockets, pipes-as-streams and epoll: every system call
// the network code makes (apps/echo, src/chain, the streams' socket paths)
// goes through one table, so tests can inject faults (short transfers,
// EINTR, EAGAIN, ECONNRESET, EPIPE) without touching the real system; plus
// the loops and errno mapping that turn those calls into clear statuses.
//
// Status codes of the I/O helpers, which callers branch on:
//   kUnavailable         the descriptor is non-blocking and would block
//                        (EAGAIN/EWOULDBLOCK): retry when it is ready;
//   kFailedPrecondition  the connection is gone: the peer closed or reset it
//                        (EPIPE, ECONNRESET, ECONNABORTED, ENOTCONN);
//   kInvalidArgument     a bad descriptor (EBADF);
//   anything else        what PosixError() maps the errno to.
// EINTR is retried everywhere except Close() (Linux closes regardless) and
// EpollWait() (returns 0 so the caller's loop rechecks its state).
//
// SIGPIPE is never raised: sockets are written with MSG_NOSIGNAL, and other
// descriptors (pipes) with SIGPIPE blocked on the calling thread for the
// call, any SIGPIPE the write raised consumed before it is unblocked.
//
// Thread safety: as os/file.h. SocketSys() may be called from any thread;
// install a table with ScopedSocketSyscalls before starting the threads that
// use it, and remove it after they stop.
#ifndef BUFPOOL_SRC_OS_SOCKET_H_
#define BUFPOOL_SRC_OS_SOCKET_H_

#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <sys/uio.h>

#include <cstddef>
#include <cstdint>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace bufpool::os {

// Every entry behaves like the libc call of the same name (returns -1 and
// sets errno on failure). Add entries here rather than calling libc directly.
struct SocketSyscalls {
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
  ssize_t (*readv)(int fd, const iovec* iov, int iovcnt);
  ssize_t (*writev)(int fd, const iovec* iov, int iovcnt);
  ssize_t (*sendmsg)(int fd, const msghdr* msg, int flags);
  // fcntl with an int argument (F_GETFL, F_SETFL, ...).
  int (*fcntl)(int fd, int cmd, int arg);
  int (*close)(int fd);
  int (*epoll_create1)(int flags);
  int (*epoll_ctl)(int epfd, int op, int fd, epoll_event* event);
  int (*epoll_wait)(int epfd, epoll_event* events, int max, int timeout_ms);
  int (*eventfd)(unsigned initval, int flags);
  // poll(2) on one descriptor: `events` is POLLIN/POLLOUT; returns the
  // revents, 0 on timeout, -1 with errno on failure.
  int (*poll_one)(int fd, short events, int timeout_ms);
};

// The real system calls.
const SocketSyscalls& RealSocketSyscalls();

// The table in use: RealSocketSyscalls() unless a test installed another.
const SocketSyscalls& SocketSys();

// Test seam: makes `table` the one SocketSys() returns until destroyed.
// Nestable.
class ScopedSocketSyscalls {
 public:
  explicit ScopedSocketSyscalls(const SocketSyscalls* table);
  ~ScopedSocketSyscalls();
  ScopedSocketSyscalls(const ScopedSocketSyscalls&) = delete;
  ScopedSocketSyscalls& operator=(const ScopedSocketSyscalls&) = delete;

 private:
  const SocketSyscalls* previous_;
};

// PosixError() with the codes in the file comment: "<context>: <words>".
absl::Status SocketError(absl::string_view context, int err);

// ---- Data transfer ------------------------------------------------------
//
// One transfer each (EINTR retried): a short count is success; the caller
// loops. `what` names the descriptor in messages ("recv: <what>: ..."); an
// empty one reads "recv: fd <n>: ...".

// readv: the bytes read, 0 at end of stream.
absl::StatusOr<size_t> ReadV(int fd, const iovec* iov, int iovcnt,
                             absl::string_view what);
// Writes iov[0, iovcnt) once, without SIGPIPE: sendmsg(MSG_NOSIGNAL) on a
// socket; on anything else (ENOTSOCK) writev with SIGPIPE blocked. At most
// IOV_MAX iovecs go to the call. Returns the bytes written (> 0 unless the
// iovecs are empty).
absl::StatusOr<size_t> WriteV(int fd, const iovec* iov, int iovcnt,
                              absl::string_view what);
// The two halves of WriteV, for a caller that knows what `fd` is: sendmsg
// with MSG_NOSIGNAL (sockets only), and writev with SIGPIPE blocked (any
// descriptor; two more system calls to mask and unmask the signal).
absl::StatusOr<size_t> SendV(int fd, const iovec* iov, int iovcnt,
                             absl::string_view what);
absl::StatusOr<size_t> WriteVNoSigpipe(int fd, const iovec* iov, int iovcnt,
                                       absl::string_view what);
// recv()/send() of one span (send with MSG_NOSIGNAL, sockets only).
absl::StatusOr<size_t> Recv(int fd, void* buf, size_t n,
                            absl::string_view what);
absl::StatusOr<size_t> Send(int fd, const void* buf, size_t n,
                            absl::string_view what);

// Waits until `fd` is ready for `events` (POLLIN or POLLOUT) or `timeout_ms`
// passes (negative: forever). True when ready (or in error/hang-up, which the
// next transfer reports), false on timeout. EINTR restarts the wait with the
// time left.
absl::StatusOr<bool> WaitReady(int fd, short events, int64_t timeout_ms,
                               absl::string_view what);

// ---- Setup --------------------------------------------------------------

absl::StatusOr<int> Socket(int domain, int type, int protocol);
absl::Status SocketPair(int domain, int type, int fds[2]);
absl::Status Bind(int fd, const sockaddr* addr, socklen_t len);
absl::Status Listen(int fd, int backlog);
// Connects a blocking socket (EINTR: waits for the connection to finish).
absl::Status Connect(int fd, const sockaddr* addr, socklen_t len);
// Accepts one connection. kUnavailable when none is pending; the errno is in
// the message for descriptor/memory exhaustion (kResourceExhausted).
absl::StatusOr<int> Accept(int listen_fd, int flags);
absl::Status SetSockOptInt(int fd, int level, int name, int value,
                           absl::string_view what);
absl::Status SetLinger(int fd, bool on, int seconds);
absl::Status GetSockName(int fd, sockaddr* addr, socklen_t* len);
absl::Status Shutdown(int fd, int how);
absl::Status SetNonBlocking(int fd, bool on);
// close() through the socket table; EINTR counts as closed.
absl::Status CloseSocket(int fd);
absl::StatusOr<int> EventFd(unsigned initval, int flags);

// ---- epoll --------------------------------------------------------------

absl::StatusOr<int> EpollCreate();
// EPOLL_CTL_ADD/MOD/DEL of `fd` with `events` and data.ptr = `ptr`.
absl::Status EpollCtl(int epfd, int op, int fd, uint32_t events, void* ptr);
// The events ready (0 on timeout or EINTR).
absl::StatusOr<int> EpollWait(int epfd, epoll_event* events, int max,
                              int timeout_ms);

}  // namespace bufpool::os

#endif  // BUFPOOL_SRC_OS_SOCKET_H_

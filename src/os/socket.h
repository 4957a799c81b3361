// Sockets, pipes-as-streams and epoll: the loops and errno mapping that turn
// the seam's calls (os/syscalls.h) into clear statuses, for the network code
// (apps/echo, src/chain, the streams' socket paths).
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
// Thread safety: every function may be called from any thread, on
// descriptors the caller does not use concurrently elsewhere.
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

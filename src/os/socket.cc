#include "os/socket.h"

#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <climits>

#include "absl/strings/str_cat.h"
#include "os/error.h"
#include "os/syscalls.h"

namespace bufpool::os {
namespace {

// writev on a descriptor that is not a socket, with SIGPIPE blocked on this
// thread: a pipe whose reader has gone then fails with EPIPE instead of
// killing the process. A SIGPIPE the write raised is thread-directed and
// stays pending while blocked, so it is consumed before the mask is put
// back; one that was already pending before the call is left alone.
// Returns as writev does (-1 and errno); WriteVNoSigpipe is its Status form.
ssize_t RawWriteVNoSigpipe(int fd, const iovec* iov, int iovcnt) {
  sigset_t pipe_set;
  sigemptyset(&pipe_set);
  sigaddset(&pipe_set, SIGPIPE);
  sigset_t old;
  pthread_sigmask(SIG_BLOCK, &pipe_set, &old);
  sigset_t pending;
  sigpending(&pending);
  const bool was_pending = sigismember(&pending, SIGPIPE) == 1;
  const ssize_t n = Sys().writev(fd, iov, iovcnt);
  const int err = errno;
  if (n < 0 && err == EPIPE && !was_pending) {
    const timespec zero{0, 0};
    while (sigtimedwait(&pipe_set, nullptr, &zero) < 0 && errno == EINTR) {
    }
  }
  if (sigismember(&old, SIGPIPE) == 0) {
    pthread_sigmask(SIG_SETMASK, &old, nullptr);
  }
  errno = err;
  return n;
}

// "<verb>: <what>", or "<verb>: fd <n>" when the caller named nothing (so
// hot callers need not format a name for the error they rarely get).
std::string Context(absl::string_view verb, absl::string_view what, int fd) {
  return what.empty() ? absl::StrCat(verb, ": fd ", fd)
                      : absl::StrCat(verb, ": ", what);
}

}  // namespace

absl::Status SocketError(absl::string_view context, int err) {
  absl::Status s = PosixError(context, err);
  switch (err) {
    case EAGAIN:
#if EWOULDBLOCK != EAGAIN
    case EWOULDBLOCK:
#endif
      return absl::UnavailableError(s.message());
    case EPIPE:
    case ECONNRESET:
    case ECONNABORTED:
    case ENOTCONN:
      return absl::FailedPreconditionError(s.message());
    case EBADF:  // absl says FailedPrecondition, which means "peer gone" here
      return absl::InvalidArgumentError(s.message());
    default:
      return s;
  }
}

absl::StatusOr<size_t> ReadV(int fd, const iovec* iov, int iovcnt,
                             absl::string_view what) {
  iovcnt = std::min(iovcnt, IOV_MAX);
  for (;;) {
    const ssize_t n = Sys().readv(fd, iov, iovcnt);
    if (n >= 0) return static_cast<size_t>(n);
    if (errno == EINTR) continue;
    return SocketError(Context("read", what, fd), errno);
  }
}

absl::StatusOr<size_t> WriteV(int fd, const iovec* iov, int iovcnt,
                              absl::string_view what) {
  iovcnt = std::min(iovcnt, IOV_MAX);
  msghdr msg{};
  msg.msg_iov = const_cast<iovec*>(iov);
  msg.msg_iovlen = static_cast<size_t>(iovcnt);
  bool socket = true;
  for (;;) {
    const ssize_t n = socket ? Sys().sendmsg(fd, &msg, MSG_NOSIGNAL)
                             : RawWriteVNoSigpipe(fd, iov, iovcnt);
    if (n >= 0) return static_cast<size_t>(n);
    if (errno == EINTR) continue;
    if (socket && errno == ENOTSOCK) {
      socket = false;
      continue;
    }
    return SocketError(Context("write", what, fd), errno);
  }
}

absl::StatusOr<size_t> SendV(int fd, const iovec* iov, int iovcnt,
                             absl::string_view what) {
  msghdr msg{};
  msg.msg_iov = const_cast<iovec*>(iov);
  msg.msg_iovlen = static_cast<size_t>(std::min(iovcnt, IOV_MAX));
  for (;;) {
    const ssize_t n = Sys().sendmsg(fd, &msg, MSG_NOSIGNAL);
    if (n >= 0) return static_cast<size_t>(n);
    if (errno == EINTR) continue;
    return SocketError(Context("write", what, fd), errno);
  }
}

absl::StatusOr<size_t> WriteVNoSigpipe(int fd, const iovec* iov, int iovcnt,
                                       absl::string_view what) {
  iovcnt = std::min(iovcnt, IOV_MAX);
  for (;;) {
    const ssize_t n = RawWriteVNoSigpipe(fd, iov, iovcnt);
    if (n >= 0) return static_cast<size_t>(n);
    if (errno == EINTR) continue;
    return SocketError(Context("write", what, fd), errno);
  }
}

absl::StatusOr<size_t> Recv(int fd, void* buf, size_t n,
                            absl::string_view what) {
  for (;;) {
    const ssize_t got = Sys().recv(fd, buf, n, 0);
    if (got >= 0) return static_cast<size_t>(got);
    if (errno == EINTR) continue;
    return SocketError(Context("recv", what, fd), errno);
  }
}

absl::StatusOr<size_t> Send(int fd, const void* buf, size_t n,
                            absl::string_view what) {
  for (;;) {
    const ssize_t put = Sys().send(fd, buf, n, MSG_NOSIGNAL);
    if (put >= 0) return static_cast<size_t>(put);
    if (errno == EINTR) continue;
    return SocketError(Context("send", what, fd), errno);
  }
}

absl::StatusOr<bool> WaitReady(int fd, short events, int64_t timeout_ms,
                               absl::string_view what) {
  using Clock = std::chrono::steady_clock;
  const Clock::time_point deadline =
      Clock::now() +
      std::chrono::milliseconds(std::max<int64_t>(timeout_ms, 0));
  for (;;) {
    int wait_ms = -1;
    if (timeout_ms >= 0) {
      const auto left =
          std::chrono::ceil<std::chrono::milliseconds>(deadline - Clock::now());
      wait_ms = static_cast<int>(std::clamp<int64_t>(left.count(), 0, INT_MAX));
    }
    const int r = Sys().poll_one(fd, events, wait_ms);
    if (r > 0) return true;
    if (r == 0) {
      if (timeout_ms >= 0) return false;
      continue;
    }
    if (errno == EINTR) continue;
    return SocketError(Context("poll", what, fd), errno);
  }
}

absl::StatusOr<int> Socket(int domain, int type, int protocol) {
  const int fd = Sys().socket(domain, type, protocol);
  if (fd < 0) return SocketError("socket", errno);
  return fd;
}

absl::Status SocketPair(int domain, int type, int fds[2]) {
  if (Sys().socketpair(domain, type, 0, fds) != 0) {
    return SocketError("socketpair", errno);
  }
  return absl::OkStatus();
}

absl::Status Bind(int fd, const sockaddr* addr, socklen_t len) {
  if (Sys().bind(fd, addr, len) != 0) return SocketError("bind", errno);
  return absl::OkStatus();
}

absl::Status Listen(int fd, int backlog) {
  if (Sys().listen(fd, backlog) != 0) {
    return SocketError("listen", errno);
  }
  return absl::OkStatus();
}

absl::Status Connect(int fd, const sockaddr* addr, socklen_t len) {
  if (Sys().connect(fd, addr, len) == 0) return absl::OkStatus();
  if (errno != EINTR) return SocketError("connect", errno);
  // Interrupted: the connection proceeds asynchronously; wait for it.
  absl::StatusOr<bool> ready = WaitReady(fd, POLLOUT, -1, "connect");
  if (!ready.ok()) return ready.status();
  int err = 0;
  socklen_t err_len = sizeof(err);
  if (Sys().getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &err_len) != 0) {
    return SocketError("getsockopt(SO_ERROR)", errno);
  }
  return err == 0 ? absl::OkStatus() : SocketError("connect", err);
}

absl::StatusOr<int> Accept(int listen_fd, int flags) {
  for (;;) {
    const int fd = Sys().accept4(listen_fd, nullptr, nullptr, flags);
    if (fd >= 0) return fd;
    if (errno == EINTR) continue;
    return SocketError("accept4", errno);
  }
}

absl::Status SetSockOptInt(int fd, int level, int name, int value,
                           absl::string_view what) {
  if (Sys().setsockopt(fd, level, name, &value, sizeof(value)) != 0) {
    return SocketError(absl::StrCat("setsockopt(", what, ")"), errno);
  }
  return absl::OkStatus();
}

absl::Status SetLinger(int fd, bool on, int seconds) {
  const linger l{.l_onoff = on ? 1 : 0, .l_linger = seconds};
  if (Sys().setsockopt(fd, SOL_SOCKET, SO_LINGER, &l, sizeof(l)) != 0) {
    return SocketError("setsockopt(SO_LINGER)", errno);
  }
  return absl::OkStatus();
}

absl::Status GetSockName(int fd, sockaddr* addr, socklen_t* len) {
  if (Sys().getsockname(fd, addr, len) != 0) {
    return SocketError("getsockname", errno);
  }
  return absl::OkStatus();
}

absl::Status Shutdown(int fd, int how) {
  if (Sys().shutdown(fd, how) != 0) {
    return SocketError("shutdown", errno);
  }
  return absl::OkStatus();
}

absl::Status SetNonBlocking(int fd, bool on) {
  const int flags = Sys().fcntl(fd, F_GETFL, 0);
  if (flags < 0) return SocketError("fcntl(F_GETFL)", errno);
  const int want = on ? flags | O_NONBLOCK : flags & ~O_NONBLOCK;
  if (want != flags && Sys().fcntl(fd, F_SETFL, want) != 0) {
    return SocketError("fcntl(F_SETFL)", errno);
  }
  return absl::OkStatus();
}

absl::Status CloseSocket(int fd) {
  if (Sys().close(fd) != 0 && errno != EINTR) {
    return SocketError("close", errno);
  }
  return absl::OkStatus();
}

absl::StatusOr<int> EventFd(unsigned initval, int flags) {
  const int fd = Sys().eventfd(initval, flags);
  if (fd < 0) return SocketError("eventfd", errno);
  return fd;
}

absl::StatusOr<int> EpollCreate() {
  const int fd = Sys().epoll_create1(EPOLL_CLOEXEC);
  if (fd < 0) return SocketError("epoll_create1", errno);
  return fd;
}

absl::Status EpollCtl(int epfd, int op, int fd, uint32_t events, void* ptr) {
  epoll_event ev{};
  ev.events = events;
  ev.data.ptr = ptr;
  if (Sys().epoll_ctl(epfd, op, fd, &ev) != 0) {
    return SocketError("epoll_ctl", errno);
  }
  return absl::OkStatus();
}

absl::StatusOr<int> EpollWait(int epfd, epoll_event* events, int max,
                              int timeout_ms) {
  const int n = Sys().epoll_wait(epfd, events, max, timeout_ms);
  if (n >= 0) return n;
  if (errno == EINTR) return 0;
  return SocketError("epoll_wait", errno);
}

}  // namespace bufpool::os

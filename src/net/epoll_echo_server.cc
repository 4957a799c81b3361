// The epoll engines: kEpoll reads into pool buffers with readv(), kMalloc
// into a freshly allocated buffer per read (the baseline). Both queue what
// they read per connection and echo it with writev() as the socket accepts.
//
// One thread, level-triggered epoll. A connection's interest set is
//   EPOLLIN   while it may read: not at end of stream, not over the unsent
//             limit (paused at max_unsent_bytes, resumed at half of it), and
//             not waiting for the pool to give a buffer;
//   EPOLLOUT  while its queue is not empty and the last write was short,
// so a stalled connection costs nothing until something changes: no spin.
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <memory>
#include <vector>

#include "net/echo_engines.h"
#include "os/error.h"
#include "os/file.h"

namespace bufpool::net {
namespace {

// A run of received bytes waiting to be echoed: data[off, len).
struct Chunk {
  Chunk* next = nullptr;
  std::byte* data = nullptr;
  uint32_t off = 0;
  uint32_t len = 0;
};

struct Conn {
  int fd = -1;
  Chunk* head = nullptr;  // FIFO of chunks to send
  Chunk* tail = nullptr;
  size_t unsent = 0;        // bytes in the queue
  bool read_eof = false;    // the peer finished sending
  bool over_limit = false;  // unsent reached max_unsent_bytes
  bool starved = false;     // the last read found no buffer
  bool write_blocked = false;
  uint32_t events = 0;  // the interest set registered with epoll
};

// Sentinels for epoll_event.data.ptr that are not connections.
char kListenTag;
char kStopTag;

class EpollEchoServer final : public EchoServer {
 public:
  explicit EpollEchoServer(const EchoServerOptions& options)
      : options_(options),
        pool_(options.pool),
        pooled_(options.engine != EchoEngine::kMalloc),
        malloc_size_(kEchoReadBuffers * options.pool->buffer_size()) {
    engine_ = options.engine;
    if (pooled_) chunks_.resize(pool_->capacity());
  }

  ~EpollEchoServer() override {
    if (epoll_fd_ >= 0) ::close(epoll_fd_);
  }

  absl::Status Run() override;

 private:
  // Buffers: pool slots (chunk metadata in chunks_[slot]) or one malloc
  // block per read (metadata at its start).
  void ReleaseChunk(Chunk* c);
  void Accept();
  void OnEvent(Conn* conn, uint32_t events);
  void Read(Conn* conn);
  void Flush(Conn* conn);  // may close conn
  void UpdateInterest(Conn* conn);
  void Close(Conn* conn);
  void WakeStarved();
  bool Readable(const Conn* conn) const {
    return !conn->read_eof && !conn->over_limit && !conn->starved;
  }

  EchoServerOptions options_;
  BufferPool* pool_;
  bool pooled_;
  size_t malloc_size_;
  int epoll_fd_ = -1;
  bool listen_paused_ = false;  // out of descriptors: accept when one closes
  std::vector<Chunk> chunks_;   // pooled: one per slot
  std::vector<Conn*> conns_;    // by descriptor
  std::vector<Conn*> starved_;  // waiting for a buffer
  size_t holding_ = 0;          // buffers/allocations carrying data
};

void EpollEchoServer::ReleaseChunk(Chunk* c) {
  --holding_;
  Counters::Sub(counters_->buffers_holding_data, 1);
  if (pooled_) {
    pool_->ReleaseRaw(c->data);
  } else {
    std::free(c);
  }
}

absl::Status EpollEchoServer::Run() {
  epoll_fd_ = ::epoll_create1(EPOLL_CLOEXEC);
  if (epoll_fd_ < 0) return os::PosixError("epoll_create1", errno);
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.ptr = &kListenTag;
  if (::epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, listen_fd_, &ev) != 0) {
    return os::PosixError("epoll_ctl(listen)", errno);
  }
  ev.data.ptr = &kStopTag;
  if (::epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, stop_fd_, &ev) != 0) {
    return os::PosixError("epoll_ctl(stop)", errno);
  }

  epoll_event events[128];
  bool stopping = false;
  while (!stopping) {
    // Starved connections wait for our own releases; only when we hold no
    // buffer at all (another user of the pool holds them) do we poll for
    // them every 10 ms.
    const int timeout = (!starved_.empty() && holding_ == 0) ? 10 : -1;
    const int n = ::epoll_wait(epoll_fd_, events, 128, timeout);
    if (n < 0) {
      if (errno == EINTR) continue;
      return os::PosixError("epoll_wait", errno);
    }
    if (n == 0) WakeStarved();
    for (int i = 0; i < n; ++i) {
      void* tag = events[i].data.ptr;
      if (tag == &kStopTag) {
        stopping = true;
      } else if (tag == &kListenTag) {
        Accept();
      } else {
        OnEvent(static_cast<Conn*>(tag), events[i].events);
      }
    }
  }
  // Graceful stop: no new connections, every open one closed.
  for (Conn* conn : conns_) {
    if (conn != nullptr) Close(conn);
  }
  ::close(epoll_fd_);
  epoll_fd_ = -1;
  return absl::OkStatus();
}

void EpollEchoServer::Accept() {
  for (;;) {
    const int fd =
        ::accept4(listen_fd_, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS ||
          errno == ENOMEM) {
        // Out of descriptors or memory: stop accepting until one closes
        // (level-triggered, so leaving it armed would spin).
        epoll_event ev{};
        ev.data.ptr = &kListenTag;
        ::epoll_ctl(epoll_fd_, EPOLL_CTL_MOD, listen_fd_, &ev);
        listen_paused_ = true;
      }
      return;  // EAGAIN, or an aborted connection: nothing to do
    }
    const int one = 1;
    ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    auto* conn = new Conn;
    conn->fd = fd;
    conn->events = EPOLLIN;
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.ptr = conn;
    if (::epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, fd, &ev) != 0) {
      ::close(fd);
      delete conn;
      continue;
    }
    if (static_cast<size_t>(fd) >= conns_.size()) conns_.resize(fd + 1);
    conns_[fd] = conn;
    Counters::Add(counters_->connections_accepted, 1);
    Counters::Add(counters_->connections_open, 1);
  }
}

void EpollEchoServer::OnEvent(Conn* conn, uint32_t events) {
  if (events & EPOLLOUT) {
    const int fd = conn->fd;  // Flush may free conn
    conn->write_blocked = false;
    Flush(conn);
    if (conns_[fd] != conn) return;  // closed (and freed)
  }
  if ((events & (EPOLLIN | EPOLLHUP | EPOLLERR)) && Readable(conn)) {
    Read(conn);  // may close conn
  } else if ((events & (EPOLLHUP | EPOLLERR)) && !Readable(conn)) {
    // Reset while we were not reading: the queued data can never be
    // delivered, so drop it now instead of waiting for the limit to drain.
    if (events & EPOLLERR) Close(conn);
  }
}

void EpollEchoServer::Read(Conn* conn) {
  iovec iov[kEchoReadBuffers];
  int iovcnt = 0;
  Chunk* fresh = nullptr;  // kMalloc: the one block of this read
  const size_t bs = pool_->buffer_size();
  if (pooled_) {
    // As many buffers as the unsent limit leaves room for (at least one).
    const size_t room = options_.max_unsent_bytes - conn->unsent;
    const size_t want =
        std::clamp<size_t>((room + bs - 1) / bs, 1, kEchoReadBuffers);
    for (; static_cast<size_t>(iovcnt) < want; ++iovcnt) {
      std::byte* p = pool_->TryAcquireRaw();
      if (p == nullptr) break;
      iov[iovcnt] = {p, bs};
    }
  } else {
    void* block = std::malloc(sizeof(Chunk) + malloc_size_);
    if (block != nullptr) {
      fresh = new (block) Chunk;
      fresh->data = reinterpret_cast<std::byte*>(fresh + 1);
      iov[iovcnt++] = {fresh->data, malloc_size_};
    }
  }
  if (iovcnt == 0) {
    conn->starved = true;
    starved_.push_back(conn);
    Counters::Add(counters_->pool_dry_stalls, 1);
    UpdateInterest(conn);
    return;
  }

  ssize_t n;
  do {
    n = os::Sys().readv(conn->fd, iov, iovcnt);
  } while (n < 0 && errno == EINTR);
  const int err = errno;

  // Queue the filled buffers in order; give back the rest.
  size_t left = n > 0 ? static_cast<size_t>(n) : 0;
  for (int i = 0; i < iovcnt; ++i) {
    auto* data = static_cast<std::byte*>(iov[i].iov_base);
    if (left == 0) {
      if (pooled_) {
        pool_->ReleaseRaw(data);
      } else {
        std::free(fresh);
      }
      continue;
    }
    Chunk* c = pooled_ ? &chunks_[pool_->SlotOf(data)] : fresh;
    c->next = nullptr;
    c->data = data;
    c->off = 0;
    c->len = static_cast<uint32_t>(std::min(left, iov[i].iov_len));
    left -= c->len;
    if (conn->tail != nullptr) {
      conn->tail->next = c;
    } else {
      conn->head = c;
    }
    conn->tail = c;
    ++holding_;
    counters_->AddHolding(1);
  }

  if (n > 0) {
    conn->unsent += n;
    Counters::Add(counters_->bytes_received, n);
    if (conn->unsent >= options_.max_unsent_bytes) {
      conn->over_limit = true;
      Counters::Add(counters_->unsent_limit_stalls, 1);
    }
    Flush(conn);  // may close conn
    return;
  }
  if (n == 0) {
    conn->read_eof = true;  // half-close: echo what is queued, then close
    Flush(conn);
    return;
  }
  if (err == EAGAIN || err == EWOULDBLOCK) {
    UpdateInterest(conn);
    return;
  }
  Close(conn);  // reset or other error: nothing more can be delivered
}

void EpollEchoServer::Flush(Conn* conn) {
  bool released = false;
  while (conn->head != nullptr && !conn->write_blocked) {
    iovec iov[kEchoReadBuffers];
    int iovcnt = 0;
    for (Chunk* c = conn->head;
         c != nullptr && iovcnt < static_cast<int>(kEchoReadBuffers);
         c = c->next) {
      iov[iovcnt++] = {c->data + c->off, c->len - c->off};
    }
    // sendmsg rather than writev: MSG_NOSIGNAL turns a write to a reset
    // connection into EPIPE instead of a process-killing SIGPIPE.
    msghdr msg{};
    msg.msg_iov = iov;
    msg.msg_iovlen = iovcnt;
    ssize_t n;
    do {
      n = ::sendmsg(conn->fd, &msg, MSG_NOSIGNAL);
    } while (n < 0 && errno == EINTR);
    if (n < 0) {
      if (errno == EAGAIN || errno == EWOULDBLOCK) {
        conn->write_blocked = true;
        break;
      }
      Close(conn);  // EPIPE/ECONNRESET: the peer is gone
      if (released) WakeStarved();
      return;
    }
    size_t sent = static_cast<size_t>(n);
    conn->unsent -= sent;
    Counters::Add(counters_->bytes_sent, sent);
    size_t total = 0;
    for (int i = 0; i < iovcnt; ++i) total += iov[i].iov_len;
    while (sent > 0) {
      Chunk* c = conn->head;
      const size_t in_chunk = c->len - c->off;
      if (sent < in_chunk) {
        c->off += static_cast<uint32_t>(sent);
        break;
      }
      sent -= in_chunk;
      conn->head = c->next;
      if (conn->head == nullptr) conn->tail = nullptr;
      ReleaseChunk(c);
      released = true;
    }
    if (static_cast<size_t>(n) < total) conn->write_blocked = true;
  }
  if (conn->over_limit && conn->unsent <= options_.max_unsent_bytes / 2) {
    conn->over_limit = false;
  }
  if (released) WakeStarved();
  if (conn->read_eof && conn->head == nullptr) {
    Close(conn);
    return;
  }
  UpdateInterest(conn);
}

void EpollEchoServer::UpdateInterest(Conn* conn) {
  uint32_t want = 0;
  if (Readable(conn)) want |= EPOLLIN;
  if (conn->head != nullptr && conn->write_blocked) want |= EPOLLOUT;
  if (want == conn->events) return;
  epoll_event ev{};
  ev.events = want;
  ev.data.ptr = conn;
  ::epoll_ctl(epoll_fd_, EPOLL_CTL_MOD, conn->fd, &ev);
  conn->events = want;
}

void EpollEchoServer::WakeStarved() {
  // Swap out first: a woken connection that finds the pool dry again
  // re-enters the list, and must wait for the next release.
  std::vector<Conn*> woken;
  woken.swap(starved_);
  for (Conn* conn : woken) {
    if (conn == nullptr) continue;  // closed while waiting
    conn->starved = false;
    UpdateInterest(conn);
  }
  woken.clear();
  if (starved_.empty()) starved_.swap(woken);  // keep the capacity
}

void EpollEchoServer::Close(Conn* conn) {
  while (Chunk* c = conn->head) {
    conn->head = c->next;
    ReleaseChunk(c);
  }
  if (conn->starved) {
    std::replace(starved_.begin(), starved_.end(), conn,
                 static_cast<Conn*>(nullptr));
  }
  ::epoll_ctl(epoll_fd_, EPOLL_CTL_DEL, conn->fd, nullptr);
  conns_[conn->fd] = nullptr;
  os::Sys().close(conn->fd);
  delete conn;
  Counters::Sub(counters_->connections_open, 1);
  if (listen_paused_) {
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.ptr = &kListenTag;
    ::epoll_ctl(epoll_fd_, EPOLL_CTL_MOD, listen_fd_, &ev);
    listen_paused_ = false;
  }
}

}  // namespace

std::unique_ptr<EchoServer> NewEpollEchoServer(
    const EchoServerOptions& options) {
  return std::make_unique<EpollEchoServer>(options);
}

}  // namespace bufpool::net

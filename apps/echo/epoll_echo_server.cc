// The epoll engines: kEpoll queues what it reads per connection in a
// BufferChain (ReadFrom into pool buffers, WriteTo as the socket accepts);
// kMalloc, the baseline, reads into a freshly allocated block per read and
// frees it once sent. Every system call goes through src/os.
//
// One thread, level-triggered epoll. A connection's interest set is
//   EPOLLIN   while it may read: not at end of stream, not over the unsent
//             limit (paused at max_unsent_bytes, resumed at half of it: for
//             kEpoll the watermarks of the connection's budget, which its
//             chain charges for the buffers it pins, see bufpool/budget.h;
//             for kMalloc a byte counter), and not waiting for the pool to
//             give a buffer;
//   EPOLLOUT  while its queue is not empty and the last write would block,
// so a stalled connection costs nothing until something changes: no spin.
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/epoll.h>
#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <memory>
#include <vector>

#include "bufpool/chain.h"
#include "echo/echo_engines.h"
#include "os/socket.h"

namespace bufpool::net {
namespace {

// kMalloc's queue: one malloc block per read, data[off, len) unsent.
class MallocQueue {
 public:
  MallocQueue() = default;
  MallocQueue(const MallocQueue&) = delete;
  MallocQueue& operator=(const MallocQueue&) = delete;
  ~MallocQueue() { Clear(); }

  size_t blocks() const { return blocks_; }
  bool empty() const { return head_ == nullptr; }

  // One read of up to `size` bytes into a new block; as ReadFrom().
  absl::StatusOr<size_t> Read(int fd, size_t size) {
    auto* b = static_cast<Block*>(std::malloc(sizeof(Block) + size));
    if (b == nullptr) return absl::ResourceExhaustedError("malloc");
    const iovec iov = {b->data, size};
    absl::StatusOr<size_t> n = os::ReadV(fd, &iov, 1, "echo connection");
    if (!n.ok() || *n == 0) {
      std::free(b);
      return n;
    }
    b->next = nullptr;
    b->off = 0;
    b->len = *n;
    (tail_ != nullptr ? tail_->next : head_) = b;
    tail_ = b;
    ++blocks_;
    return n;
  }

  // As WriteTo(): sends until empty or the socket would block.
  absl::StatusOr<size_t> Write(int fd) {
    size_t total = 0;
    while (head_ != nullptr) {
      iovec iov[kEchoReadBuffers];
      int cnt = 0;
      for (Block* b = head_; b != nullptr && cnt < int{kEchoReadBuffers};
           b = b->next) {
        iov[cnt++] = {b->data + b->off, b->len - b->off};
      }
      absl::StatusOr<size_t> n = os::SendV(fd, iov, cnt, "echo connection");
      if (!n.ok()) {
        if (n.status().code() == absl::StatusCode::kUnavailable && total != 0) {
          break;
        }
        return n;
      }
      total += *n;
      for (size_t sent = *n; sent != 0;) {
        Block* b = head_;
        const size_t in_block = b->len - b->off;
        if (sent < in_block) {
          b->off += sent;
          break;
        }
        sent -= in_block;
        head_ = b->next;
        if (head_ == nullptr) tail_ = nullptr;
        std::free(b);
        --blocks_;
      }
    }
    return total;
  }

  void Clear() {
    while (Block* b = head_) {
      head_ = b->next;
      std::free(b);
    }
    tail_ = nullptr;
    blocks_ = 0;
  }

 private:
  struct Block {
    Block* next;
    size_t off;
    size_t len;
    std::byte data[];
  };
  Block* head_ = nullptr;
  Block* tail_ = nullptr;
  size_t blocks_ = 0;
};

struct Conn {
  explicit Conn(BufferPool& pool) : chain(pool) {}
  int fd = -1;
  // kEpoll: the connection's budget (see Accept()), which `chain` charges;
  // declared first so that it outlives the chain.
  std::unique_ptr<BufferBudget> budget;
  BufferChain chain;      // kEpoll: received, not yet echoed
  MallocQueue blocks;     // kMalloc: the same
  size_t unsent = 0;      // kMalloc: bytes queued
  bool read_eof = false;  // the peer finished sending
  // Past max_unsent_bytes until drained to half (kEpoll: set and cleared
  // by the budget's watermark callbacks).
  bool over_limit = false;
  bool starved = false;  // the last read found no buffer
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
        read_size_(kEchoReadBuffers * options.pool->buffer_size()) {
    engine_ = options.engine;
  }

  ~EpollEchoServer() override {
    if (epoll_fd_ >= 0) (void)os::CloseSocket(epoll_fd_);
  }

  absl::Status Run() override;

 private:
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
  // Buffers (kMalloc: blocks) carrying conn's unsent bytes.
  size_t Holding(const Conn* conn) const {
    return pooled_ ? BuffersHoldingData(conn->chain) : conn->blocks.blocks();
  }
  bool QueueEmpty(const Conn* conn) const {
    return pooled_ ? conn->chain.empty() : conn->blocks.empty();
  }
  // Brings the holding counters up to date after conn's queue changed from
  // `before` buffers; returns true when buffers were released.
  bool Account(const Conn* conn, size_t before);

  EchoServerOptions options_;
  BufferPool* pool_;
  bool pooled_;
  size_t read_size_;  // the most one read takes: kEchoReadBuffers buffers
  int epoll_fd_ = -1;
  bool listen_paused_ = false;  // out of descriptors: accept when one closes
  std::vector<Conn*> conns_;    // by descriptor
  std::vector<Conn*> starved_;  // waiting for a buffer
  size_t holding_ = 0;          // buffers/allocations carrying data
};

bool EpollEchoServer::Account(const Conn* conn, size_t before) {
  const size_t now = Holding(conn);
  if (now > before) {
    holding_ += now - before;
    counters_->AddHolding(now - before);
    return false;
  }
  holding_ -= before - now;
  Counters::Sub(counters_->buffers_holding_data, before - now);
  return now < before;
}

absl::Status EpollEchoServer::Run() {
  absl::StatusOr<int> epoll_fd = os::EpollCreate();
  if (!epoll_fd.ok()) return epoll_fd.status();
  epoll_fd_ = *epoll_fd;
  if (absl::Status s = os::EpollCtl(epoll_fd_, EPOLL_CTL_ADD, listen_fd_,
                                    EPOLLIN, &kListenTag);
      !s.ok()) {
    return s;
  }
  if (absl::Status s =
          os::EpollCtl(epoll_fd_, EPOLL_CTL_ADD, stop_fd_, EPOLLIN, &kStopTag);
      !s.ok()) {
    return s;
  }

  epoll_event events[128];
  bool stopping = false;
  while (!stopping) {
    // Starved connections wait for our own releases; only when we hold no
    // buffer at all (another user of the pool holds them) do we poll for
    // them every 10 ms.
    const int timeout = (!starved_.empty() && holding_ == 0) ? 10 : -1;
    absl::StatusOr<int> n = os::EpollWait(epoll_fd_, events, 128, timeout);
    if (!n.ok()) return n.status();
    if (*n == 0) WakeStarved();
    for (int i = 0; i < *n; ++i) {
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
  (void)os::CloseSocket(epoll_fd_);
  epoll_fd_ = -1;
  return absl::OkStatus();
}

void EpollEchoServer::Accept() {
  for (;;) {
    absl::StatusOr<int> fd =
        os::Accept(listen_fd_, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (!fd.ok()) {
      if (fd.status().code() == absl::StatusCode::kResourceExhausted) {
        // Out of descriptors or memory (EMFILE, ENFILE, ENOBUFS, ENOMEM):
        // stop accepting until one closes (level-triggered, so leaving it
        // armed would spin).
        (void)os::EpollCtl(epoll_fd_, EPOLL_CTL_MOD, listen_fd_, 0,
                           &kListenTag);
        listen_paused_ = true;
      }
      return;  // EAGAIN, or an aborted connection: nothing to do
    }
    (void)os::SetSockOptInt(*fd, IPPROTO_TCP, TCP_NODELAY, 1, "TCP_NODELAY");
    auto* conn = new Conn(*pool_);
    conn->fd = *fd;
    if (pooled_) {
      // The chain charges the connection's budget (its watermarks are the
      // unsent limit).
      absl::StatusOr<std::unique_ptr<BufferBudget>> b = MakeConnectionBudget(
          *pool_, options_.max_unsent_bytes, *fd,
          [this, conn] {
            conn->over_limit = true;
            Counters::Add(counters_->unsent_limit_stalls, 1);
          },
          [conn] { conn->over_limit = false; });
      if (!b.ok()) {  // no reservation asked, so never: refuse the peer
        (void)os::CloseSocket(*fd);
        delete conn;
        continue;
      }
      conn->budget = *std::move(b);
      conn->chain = BufferChain(*conn->budget);
    }
    conn->events = EPOLLIN;
    if (!os::EpollCtl(epoll_fd_, EPOLL_CTL_ADD, *fd, EPOLLIN, conn).ok()) {
      (void)os::CloseSocket(*fd);
      delete conn;
      continue;
    }
    if (static_cast<size_t>(*fd) >= conns_.size()) conns_.resize(*fd + 1);
    conns_[*fd] = conn;
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
  // kEpoll: ReadFrom() takes only the buffers the connection's budget
  // allows (and the tail's room), so it never reads past the limit.
  const size_t before = Holding(conn);
  absl::StatusOr<size_t> n = pooled_
                                 ? ReadFrom(conn->fd, conn->chain, read_size_)
                                 : conn->blocks.Read(conn->fd, read_size_);
  Account(conn, before);
  if (!n.ok()) {
    switch (n.status().code()) {
      case absl::StatusCode::kResourceExhausted:  // no buffer: wait for one
        if (conn->over_limit) {  // the budget's, not the pool's: wait to send
          UpdateInterest(conn);
          return;
        }
        conn->starved = true;
        starved_.push_back(conn);
        Counters::Add(counters_->pool_dry_stalls, 1);
        UpdateInterest(conn);
        return;
      case absl::StatusCode::kUnavailable:  // nothing to read after all
        UpdateInterest(conn);
        return;
      default:  // reset or other error: nothing more can be delivered
        Close(conn);
        return;
    }
  }
  if (*n == 0) {
    conn->read_eof = true;  // half-close: echo what is queued, then close
    Flush(conn);
    return;
  }
  Counters::Add(counters_->bytes_received, *n);
  if (!pooled_) {
    conn->unsent += *n;
    if (conn->unsent >= options_.max_unsent_bytes) {
      conn->over_limit = true;
      Counters::Add(counters_->unsent_limit_stalls, 1);
    }
  }
  Flush(conn);  // may close conn
}

void EpollEchoServer::Flush(Conn* conn) {
  bool released = false;
  if (!QueueEmpty(conn) && !conn->write_blocked) {
    const size_t before = Holding(conn);
    absl::StatusOr<size_t> n =
        pooled_ ? WriteTo(conn->fd, conn->chain) : conn->blocks.Write(conn->fd);
    released = Account(conn, before);
    if (!n.ok() && n.status().code() != absl::StatusCode::kUnavailable) {
      Close(conn);  // the peer is gone (EPIPE/ECONNRESET)
      WakeStarved();
      return;
    }
    const size_t sent = n.ok() ? *n : 0;
    if (!pooled_) conn->unsent -= sent;
    Counters::Add(counters_->bytes_sent, sent);
    // WriteTo stops early only when the socket would block.
    if (!QueueEmpty(conn)) conn->write_blocked = true;
  }
  // kEpoll's budget cleared over_limit in WriteTo() when it drained to half.
  if (!pooled_ && conn->over_limit &&
      conn->unsent <= options_.max_unsent_bytes / 2) {
    conn->over_limit = false;
  }
  if (released) WakeStarved();
  if (conn->read_eof && QueueEmpty(conn)) {
    Close(conn);
    return;
  }
  UpdateInterest(conn);
}

void EpollEchoServer::UpdateInterest(Conn* conn) {
  uint32_t want = 0;
  if (Readable(conn)) want |= EPOLLIN;
  if (!QueueEmpty(conn) && conn->write_blocked) want |= EPOLLOUT;
  if (want == conn->events) return;
  (void)os::EpollCtl(epoll_fd_, EPOLL_CTL_MOD, conn->fd, want, conn);
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
  const size_t before = Holding(conn);
  conn->chain.Clear();
  conn->blocks.Clear();
  Account(conn, before);
  if (conn->starved) {
    std::replace(starved_.begin(), starved_.end(), conn,
                 static_cast<Conn*>(nullptr));
  }
  (void)os::EpollCtl(epoll_fd_, EPOLL_CTL_DEL, conn->fd, 0, nullptr);
  conns_[conn->fd] = nullptr;
  (void)os::CloseSocket(conn->fd);
  delete conn;
  Counters::Sub(counters_->connections_open, 1);
  if (listen_paused_) {
    (void)os::EpollCtl(epoll_fd_, EPOLL_CTL_MOD, listen_fd_, EPOLLIN,
                       &kListenTag);
    listen_paused_ = false;
  }
}

}  // namespace

std::unique_ptr<EchoServer> MakeEpollEchoServer(
    const EchoServerOptions& options) {
  return std::make_unique<EpollEchoServer>(options);
}

}  // namespace bufpool::net

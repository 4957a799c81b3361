// An io_uring echo server written with nothing but libbufpool's public
// headers and liburing: receives land in pool buffers lent to a provided-
// buffer ring, come back as BufferChains, and are echoed with HeldSend.
// Running out of buffers (-ENOBUFS) parks a connection (ParkedReceives)
// until the ring can lend enough again; while the pool itself is dry the
// loop sleeps on the pool's notice, which ParkedReceives reads through the
// same ring and which comes whichever thread frees a buffer. Short sends
// are resumed by ReturnUnsentTo(). Each connection's unsent bytes are
// capped by a budget (bufpool/budget.h): its receive is cancelled when they
// pin kMaxUnsent (the budget's high watermark) and armed again once sends
// have drained them to a quarter of it (the low one), so a client that
// sends without reading holds at most about kMaxUnsent of the pool.
//
//   uring_echo [PORT [SECONDS [BUFFERS [MAX_BUFFERS]]]]
//     PORT 0 picks one; SECONDS 0: forever; BUFFERS: the pool (4096 of 4 KiB);
//     MAX_BUFFERS: a ceiling the pool grows to under load (0: fixed), giving
//     memory back after a second idle (the loop's tick calls TrimIdle())
//
// SIGINT or SIGTERM stops it as the deadline does. At the end it prints how
// many buffers are still out (0), and how often a connection was parked and
// the pool's notice woke the loop. It says on stderr, once, when the loop
// has waited a whole tick for nothing but a free buffer.
#include <arpa/inet.h>
#include <liburing.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <unordered_set>
#include <vector>

#include "absl/strings/str_cat.h"
#include "bufpool/budget.h"
#include "bufpool/buffer_pool.h"
#include "bufpool/chain.h"
#include "bufpool/uring.h"

namespace {

volatile sig_atomic_t stop_requested = 0;
void RequestStop(int) { stop_requested = 1; }

// The low three bits of user_data; the rest is the Conn (8-byte aligned),
// or 0 for the server's own operations.
enum Op : uint64_t {
  kAccept = 1,
  kRecv = 2,
  kSend = 3,
  kCancel = 4,  // the accept's cancel
  kNotify = 5,  // the read of the pool's eventfd
};

// Per connection: the most unsent bytes it may pin before its receive stops.
constexpr size_t kMaxUnsent = 256 * 1024;

struct Conn {
  explicit Conn(int f) : fd(f) {}
  int fd;
  // The budget that `out` (and the send it moves into) charges; declared
  // first, so that it outlives them.
  std::unique_ptr<bufpool::BufferBudget> budget;
  bufpool::BufferChain out;  // received, not yet sent
  bufpool::HeldSend send;
  bool receiving = false, parked = false, done = false;
  bool paused = false;  // over the budget's high watermark, not yet low
};

class Server {
 public:
  Server(bufpool::BufferPool& pool, int listen_fd)
      : pool_(pool), lfd_(listen_fd) {}
  bool Start();
  // Runs until `seconds` have passed (0: forever) and every connection is
  // shut down and closed.
  void Run(int seconds);
  void Stop() {     // destroys the ring's objects, then the ring
    bufs_.reset();  // every lent buffer back, before the ring goes
    io_uring_queue_exit(&ring_);  // no read of the notice in flight after it
    wakes_ = parked_->notices();
    parked_.reset();
  }
  uint64_t parks() const { return parks_; }
  uint64_t wakes() const { return wakes_; }

 private:
  io_uring_sqe* Sqe() {
    io_uring_sqe* sqe;
    while ((sqe = io_uring_get_sqe(&ring_)) == nullptr) io_uring_submit(&ring_);
    return sqe;
  }
  static void Tag(io_uring_sqe* sqe, Conn* c, Op op) {
    io_uring_sqe_set_data64(sqe, reinterpret_cast<uint64_t>(c) | op);
  }
  void Accept() {
    io_uring_sqe* sqe = Sqe();
    io_uring_prep_multishot_accept(sqe, lfd_, nullptr, nullptr, SOCK_CLOEXEC);
    Tag(sqe, nullptr, kAccept);
  }
  // A connection with its budget; nullptr when the budget cannot be made.
  Conn* NewConn(int fd) {
    auto* c = new Conn(fd);
    auto budget = pool_.CreateBudget(
        {.name = absl::StrCat("conn ", fd),
         .max_bytes = kMaxUnsent + 16 * pool_.buffer_size(),  // + one recv
         .high_watermark = kMaxUnsent,
         .low_watermark = kMaxUnsent / 4,
         .on_high = [c] { c->paused = true; },    // acted on in OnRecv
         .on_low = [c] { c->paused = false; }});  // and in OnSend
    if (!budget.ok()) {
      std::fprintf(stderr, "uring_echo: %s\n",
                   budget.status().ToString().c_str());
      delete c;
      return nullptr;
    }
    c->budget = *std::move(budget);
    c->out = bufpool::BufferChain(*c->budget);
    return c;
  }
  void Receive(Conn* c) {
    io_uring_sqe* sqe = Sqe();
    bufs_->PrepareRecv(sqe, c->fd);  // multishot, buffers from the ring
    Tag(sqe, c, kRecv);
    c->receiving = true;
  }
  void Send(Conn* c) {
    if (c->send.busy() || c->out.empty()) return;
    io_uring_sqe* sqe = Sqe();
    c->send.Prepare(sqe, c->fd, std::move(c->out));
    Tag(sqe, c, kSend);
  }
  // True when the connection is finished and freed.
  bool MaybeClose(Conn* c) {
    if (!c->done || c->receiving || c->send.busy()) return false;
    close(c->fd);
    live_.erase(c);
    delete c;
    return true;
  }
  void BeginStopping();
  void RearmParked();
  void OnCompletion(const io_uring_cqe& cqe);
  void OnRecv(Conn* c, const io_uring_cqe& cqe, bool more);
  void OnSend(Conn* c, const io_uring_cqe& cqe);

  bufpool::BufferPool& pool_;
  const int lfd_;
  io_uring ring_;
  std::unique_ptr<bufpool::ProvidedBufferRing> bufs_;
  // Receives out of buffers, re-armed when the ring can lend again.
  std::unique_ptr<bufpool::ParkedReceives> parked_;
  std::unordered_set<Conn*> live_;
  bool stopping_ = false, accepting_ = true, said_waiting_ = false;
  uint64_t parks_ = 0, wakes_ = 0;
};

bool Server::Start() {
  // One thread drives the ring: task work runs when it waits, not by IPI.
  absl::StatusOr<bufpool::ServerRingSetup> setup =
      bufpool::InitServerRing(&ring_, {.entries = 256});
  if (!setup.ok()) {
    std::fprintf(stderr, "%s\n", setup.status().ToString().c_str());
    return false;
  }
  auto created = bufpool::ProvidedBufferRing::Create(
      &ring_, pool_, {.group_id = 1});  // up to 512 buffers
  if (!created.ok()) {
    std::fprintf(stderr, "%s\n", created.status().ToString().c_str());
    io_uring_queue_exit(&ring_);
    return false;
  }
  bufs_ = *std::move(created);
  auto parked = bufpool::ParkedReceives::Create(*bufs_);
  if (!parked.ok()) {
    std::fprintf(stderr, "%s\n", parked.status().ToString().c_str());
    return false;
  }
  parked_ = *std::move(parked);
  Accept();
  return true;
}

// Stops accepting and shuts every connection down.
void Server::BeginStopping() {
  stopping_ = true;
  io_uring_sqe* sqe = Sqe();
  io_uring_prep_cancel64(sqe, kAccept, 0);
  Tag(sqe, nullptr, kCancel);  // prep leaves user_data as it found it
  for (Conn* c : live_) shutdown(c->fd, SHUT_RDWR);
}

// Re-arms parked receives once the ring holds enough buffers again (all
// of them when stopping); while some stay parked, ParkedReceives has asked
// the pool for a notice, whose read completes when a buffer is free.
void Server::RearmParked() {
  auto rearm = [this](void* who) {
    Conn* c = static_cast<Conn*>(who);
    c->parked = false;
    if (!c->done && !stopping_) {
      Receive(c);
    } else {
      c->done = true;
      MaybeClose(c);
    }
  };
  if (stopping_) parked_->RearmAll(rearm);
  parked_->Rearm(&ring_, kNotify, rearm);
}

void Server::Run(int seconds) {
  const auto end =
      std::chrono::steady_clock::now() + std::chrono::seconds(seconds);
  while (!stopping_ || accepting_ || !live_.empty()) {
    if (!stopping_ &&
        (stop_requested != 0 ||
         (seconds != 0 && std::chrono::steady_clock::now() >= end)))
      BeginStopping();
    bufs_->Refill();  // cheap when nothing is needed
    RearmParked();
    // The tick is for the deadline and signals only; buffers come by notice.
    __kernel_timespec tick{0, 100 * 1000 * 1000};
    io_uring_cqe* cqe;
    const int rc =
        io_uring_submit_and_wait_timeout(&ring_, &cqe, 1, &tick, nullptr);
    // An elastic pool's idle trim: the tick is the caller's tick.
    if (rc == -ETIME) pool_.TrimIdle();
    if (rc == -ETIME && parked_->notice_pending() && !said_waiting_) {
      said_waiting_ = true;
      std::fprintf(stderr, "uring_echo: waiting for a free buffer\n");
    }
    unsigned head, n = 0;
    io_uring_for_each_cqe(&ring_, head, cqe) {
      ++n;
      OnCompletion(*cqe);
    }
    io_uring_cq_advance(&ring_, n);
  }
}

void Server::OnCompletion(const io_uring_cqe& cqe) {
  auto* c = reinterpret_cast<Conn*>(cqe.user_data & ~uint64_t{7});
  const bool more = cqe.flags & IORING_CQE_F_MORE;
  switch (cqe.user_data & 7) {
    case kAccept:
      if (cqe.res >= 0) {
        if (Conn* c = NewConn(cqe.res)) {
          Receive(*live_.insert(c).first);
        } else {
          close(cqe.res);
        }
      }
      if (!more && !stopping_) Accept();
      accepting_ = more || !stopping_;
      return;
    case kNotify:  // a buffer is free: Refill() lends it next turn
      parked_->OnNotice();
      return;
    case kRecv:
      OnRecv(c, cqe, more);
      break;
    case kSend:
      if (!c->send.OnCompletion(cqe)) return;  // more to come
      OnSend(c, cqe);
      break;
    default:
      return;  // kCancel
  }
  if (!c->parked) MaybeClose(c);
}

void Server::OnRecv(Conn* c, const io_uring_cqe& cqe, bool more) {
  if (!more) c->receiving = false;
  // Into the connection's chain, charged to its budget. A ResourceExhausted
  // that carries bytes (res > 0) is the budget's: they are in `out` all the
  // same.
  const absl::Status got = bufs_->Take(cqe, c->out);
  if (cqe.res > 0 && (got.ok() || absl::IsResourceExhausted(got))) {
    Send(c);
    if (c->paused && more) {  // stop the multishot receive
      io_uring_sqe* sqe = Sqe();
      io_uring_prep_cancel64(sqe, reinterpret_cast<uint64_t>(c) | kRecv, 0);
      Tag(sqe, nullptr, kCancel);
    }
  } else if (cqe.res == -ENOBUFS) {  // the ring was empty: wait for buffers
    if (!more) c->parked = true, parked_->Park(c), ++parks_;
  } else if (!got.ok() || cqe.res == 0) {
    c->done = true;  // end of stream or an error (a cancel: -ECANCELED)
    if (cqe.res == -ECANCELED && !stopping_) c->done = false;
  }
  if (!more && !c->done && !c->parked && !c->paused) Receive(c);
}

void Server::OnSend(Conn* c, const io_uring_cqe&) {
  if (c->send.result() < 0) {
    c->done = true;
    c->out.Clear();
    return;
  }
  // Resume a short send, then what arrived meanwhile.
  c->send.ReturnUnsentTo(c->out);
  Send(c);
  // Drained to the low watermark: receive again.
  if (!c->paused && !c->receiving && !c->parked && !c->done && !stopping_) {
    Receive(c);
  }
}

// A listening socket on 127.0.0.1:port (0 picks one), or -1.
int Listen(int port, int* bound) {
  const int lfd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  const int one = 1;
  setsockopt(lfd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_port = htons(static_cast<uint16_t>(port));
  sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(sa);
  if (lfd < 0 || bind(lfd, reinterpret_cast<sockaddr*>(&sa), len) != 0 ||
      listen(lfd, 128) != 0 ||
      getsockname(lfd, reinterpret_cast<sockaddr*>(&sa), &len) != 0) {
    std::perror("uring_echo: listen");
    if (lfd >= 0) close(lfd);
    return -1;
  }
  *bound = ntohs(sa.sin_port);
  return lfd;
}

}  // namespace

int main(int argc, char** argv) {
  const int port = argc > 1 ? std::atoi(argv[1]) : 0;
  const int seconds = argc > 2 ? std::atoi(argv[2]) : 0;
  size_t buffers = 4096;
  if (argc > 3) {
    char* end = nullptr;
    buffers = std::strtoul(argv[3], &end, 10);
    if (end == argv[3] || *end != '\0' || buffers == 0) {
      std::fprintf(stderr,
                   "uring_echo: BUFFERS must be a positive number, got '%s'\n",
                   argv[3]);
      return 2;
    }
  }
  size_t max_buffers = 0;  // a fixed pool
  if (argc > 4) {
    char* end = nullptr;
    max_buffers = std::strtoul(argv[4], &end, 10);
    if (end == argv[4] || *end != '\0' ||
        (max_buffers != 0 && max_buffers < buffers)) {
      std::fprintf(stderr,
                   "uring_echo: MAX_BUFFERS must be 0 or at least BUFFERS "
                   "(%zu), got '%s'\n",
                   buffers, argv[4]);
      return 2;
    }
  }
  auto pool = bufpool::BufferPool::Create(
      {.buffer_count = buffers,
       .max_buffer_count = max_buffers,
       .trim_after_idle =
           max_buffers != 0 ? absl::Seconds(1) : absl::ZeroDuration()});
  if (!pool.ok()) {
    std::fprintf(stderr, "uring_echo: %s\n", pool.status().ToString().c_str());
    return 1;
  }
  int bound = 0;
  const int lfd = Listen(port, &bound);
  if (lfd < 0) return 1;
  std::printf("listening on 127.0.0.1:%d\n", bound);
  std::fflush(stdout);
  signal(SIGINT, RequestStop);
  signal(SIGTERM, RequestStop);
  Server server(**pool, lfd);
  if (!server.Start()) return 1;
  server.Run(seconds);
  server.Stop();
  std::printf("done: %zu buffers in use\n", (*pool)->Stats().in_use);
  std::printf("parked %llu times, woken by the pool %llu times\n",
              static_cast<unsigned long long>(server.parks()),
              static_cast<unsigned long long>(server.wakes()));
  if (max_buffers != 0) {
    const bufpool::PoolStats st = (*pool)->Stats();
    std::printf(
        "pool grew %llu times, trimmed %llu times, %zu of %zu "
        "buffers backed\n",
        static_cast<unsigned long long>(st.grows),
        static_cast<unsigned long long>(st.trims), st.committed, st.capacity);
  }
  close(lfd);
  return 0;
}

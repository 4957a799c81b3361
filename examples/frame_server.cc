// A length-prefixed echo server (a 4-byte big-endian length, then up to
// 64 KiB of payload; each frame comes back as it came) on a small, fixed
// pool, written with nothing but libbufpool's public headers and liburing.
// It shows how a bounded server keeps serving every client while some
// clients misbehave (send half a frame and stop, never read their replies):
//
// * Admission (bufpool/admission.h). A connection first receives its
//   frame's 4-byte header, capped at those 4 bytes. Once the splitter knows
//   the frame's size, the connection asks the pool's AdmissionQueue for all
//   of it; while the queue cannot grant it, the connection waits, receiving
//   nothing and pinning nothing more, first come first served across all
//   connections. Granted, it receives exactly the rest of the frame (the
//   receive capped at what is missing), echoes it, and gives the grant back
//   as the reply leaves. So a frame that has started always finishes, and
//   the pool never fills with halves of frames that wait for each other.
// * Stalled frames. When the oldest connection waiting for memory has
//   waited --stall-ms (the queue's oldest_wait()), the connections whose
//   granted frame has not moved (no byte received or sent) for as long are
//   closed: a client that stops in the middle of a frame, or never reads,
//   cannot keep memory that the others wait for. While the queue moves,
//   a stalled connection keeps its grant (at most its budget).
// * The ring (ProvidedBufferRing) lends at most --ring buffers; the queue
//   gets what the ring and a few pack buffers leave (docs/uring.md, "Sizing
//   a bounded server"); running out of ring buffers parks the receive
//   (ParkedReceives) until the ring is refilled.
//
// With --admission off it is the server the docs used to describe: a
// budget of 24 buffers per connection with watermarks 20/16, receives
// paused at the high mark and resumed at the low one, a ring of 32, no
// queue. Under the load of test/frame_server_test.cc that server stops
// serving; it is kept to show the difference.
//
//   frame_server [--port N] [--buffers N] [--buffer-size N] [--ring N]
//                [--stall-ms N] [--admission on|off]
//     --port 0 picks a port; prints "listening on 127.0.0.1:PORT" when ready
//
// SIGUSR1 prints the pool's, the ring's, the queue's and every budget's
// counters to stderr; SIGINT or SIGTERM stops it, printing "done: N buffers
// in use" (0) on stdout.
#include <arpa/inet.h>
#include <liburing.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <unordered_set>
#include <vector>

#include "bufpool/admission.h"
#include "bufpool/budget.h"
#include "bufpool/buffer_pool.h"
#include "bufpool/chain.h"
#include "bufpool/cursor.h"
#include "bufpool/uring.h"

namespace {

volatile sig_atomic_t stop_requested = 0;
volatile sig_atomic_t stats_wanted = 0;

constexpr size_t kHeader = 4;
constexpr size_t kMaxPayload = 64 * 1024;
constexpr size_t kMaxFrame = kHeader + kMaxPayload;

// The low three bits of user_data; the rest is the Conn (8-byte aligned).
enum Op : uint64_t {
  kAccept = 1,
  kRecv = 2,
  kSend = 3,
  kCancel = 4,
  kNotify = 5,
};

using Clock = std::chrono::steady_clock;

struct Conn {
  explicit Conn(int f) : fd(f) {}
  int fd;
  // Declared first: it outlives the chains bound to it.
  std::unique_ptr<bufpool::BufferBudget> budget;
  bufpool::BufferChain in;   // received, not yet a whole frame
  bufpool::BufferChain out;  // whole frames, not yet sent
  bufpool::HeldSend send;
  bufpool::Admission admission;  // the current frame's memory
  size_t frame = 0;              // its size, header included; 0: unknown
  bool replying = false;         // the frame is whole: being echoed
  bool receiving = false, parked = false, done = false;
  bool paused = false;  // --admission off: over the high watermark
  Clock::time_point progress = Clock::now();  // last byte in or out
};

struct Config {
  int port = 0;
  size_t buffers = 160;
  size_t buffer_size = 4096;
  size_t ring = 0;  // 0: buffers / 10, at least 8 (admission); 32 (off)
  int stall_ms = 2000;
  bool admission = true;
};

class Server {
 public:
  Server(bufpool::BufferPool& pool, int listen_fd, const Config& config)
      : pool_(pool), lfd_(listen_fd), cfg_(config) {}
  bool Start();
  void Run();
  void Stop() {
    bufs_.reset();
    io_uring_queue_exit(&ring_);
    parked_.reset();
    queue_.reset();
  }

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
  Conn* NewConn(int fd);
  // Arms c's receive: capped at what its header or granted frame lacks,
  // or (admission off) uncapped.
  void Receive(Conn* c);
  void Send(Conn* c) {
    if (c->send.busy() || c->out.empty()) return;
    io_uring_sqe* sqe = Sqe();
    c->send.Prepare(sqe, c->fd, std::move(c->out));
    Tag(sqe, c, kSend);
  }
  void Cancel(Conn* c) {
    io_uring_sqe* sqe = Sqe();
    io_uring_prep_cancel64(sqe, reinterpret_cast<uint64_t>(c) | kRecv, 0);
    Tag(sqe, nullptr, kCancel);
  }
  bool MaybeClose(Conn* c);
  void Fail(Conn* c, const std::string& why);
  void BeginStopping();
  void RearmParked();
  void ResumeGranted();
  void CloseStalled();
  void OnCompletion(const io_uring_cqe& cqe);
  void OnRecv(Conn* c, const io_uring_cqe& cqe, bool more);
  void OnSend(Conn* c);
  // Cuts whole frames off c->in into c->out (admission: asks for the next
  // frame's memory once its header is in).
  void Frames(Conn* c);
  void PrintStats();

  bufpool::BufferPool& pool_;
  const int lfd_;
  const Config cfg_;
  io_uring ring_;
  std::unique_ptr<bufpool::ProvidedBufferRing> bufs_;
  std::unique_ptr<bufpool::ParkedReceives> parked_;
  std::unique_ptr<bufpool::AdmissionQueue> queue_;  // admission on
  const bufpool::LengthPrefixSplitter split_{.max_frame = kMaxFrame};
  std::unordered_set<Conn*> live_;
  std::vector<Conn*> granted_;  // granted while waiting: receive next turn
  bool stopping_ = false, accepting_ = true;
  uint64_t frames_ = 0, stalled_closed_ = 0, conns_ = 0;
};

bool Server::Start() {
  absl::StatusOr<bufpool::ServerRingSetup> setup =
      bufpool::InitServerRing(&ring_, {.entries = 256});
  if (!setup.ok()) {
    std::fprintf(stderr, "frame_server: %s\n",
                 setup.status().ToString().c_str());
    return false;
  }
  size_t ring = cfg_.ring;
  if (ring == 0)
    ring = cfg_.admission ? std::max<size_t>(8, cfg_.buffers / 10) : 32;
  auto created = bufpool::ProvidedBufferRing::Create(
      &ring_, pool_,
      {.group_id = 1,
       .max_buffers = ring,
       .initial_buffers = std::min<size_t>(ring, 8)});
  if (!created.ok()) {
    std::fprintf(stderr, "frame_server: %s\n",
                 created.status().ToString().c_str());
    io_uring_queue_exit(&ring_);
    return false;
  }
  bufs_ = *std::move(created);
  auto parked = bufpool::ParkedReceives::Create(*bufs_);
  if (!parked.ok()) {
    std::fprintf(stderr, "frame_server: %s\n",
                 parked.status().ToString().c_str());
    return false;
  }
  parked_ = *std::move(parked);
  if (cfg_.admission) {
    // What the ring leaves, less room for the ring's pack buffers, which
    // the headers of waiting connections share.
    constexpr size_t kPackRoom = 4;
    const size_t left = cfg_.buffers - std::min(cfg_.buffers, ring);
    auto queue = bufpool::AdmissionQueue::Create(
        pool_, {.name = "frames",
                .capacity_buffers = left > kPackRoom ? left - kPackRoom : 1});
    if (!queue.ok()) {
      std::fprintf(stderr, "frame_server: %s\n",
                   queue.status().ToString().c_str());
      return false;
    }
    queue_ = *std::move(queue);
  }
  Accept();
  return true;
}

Conn* Server::NewConn(int fd) {
  auto* c = new Conn(fd);
  const size_t bs = pool_.buffer_size();
  absl::StatusOr<std::unique_ptr<bufpool::BufferBudget>> budget;
  const std::string name = "conn " + std::to_string(++conns_);
  if (cfg_.admission) {
    // The largest frame's grant: nothing more is ever received.
    budget = pool_.CreateBudget(
        {.name = name, .max_bytes = queue_->BuffersFor(kMaxFrame) * bs});
  } else {
    budget = pool_.CreateBudget({.name = name,
                                 .max_bytes = 24 * bs,
                                 .high_watermark = 20 * bs,
                                 .low_watermark = 16 * bs,
                                 .on_high = [c] { c->paused = true; },
                                 .on_low = [c] { c->paused = false; }});
  }
  if (!budget.ok()) {
    std::fprintf(stderr, "frame_server: %s\n",
                 budget.status().ToString().c_str());
    delete c;
    return nullptr;
  }
  c->budget = *std::move(budget);
  c->in = bufpool::BufferChain(*c->budget);
  c->out = bufpool::BufferChain(*c->budget);
  return c;
}

void Server::Receive(Conn* c) {
  bufpool::ProvidedBufferRing::RecvOptions ro;
  ro.socket_checked = true;
  if (cfg_.admission) {
    const size_t want = c->frame != 0 ? c->frame : kHeader;
    if (c->in.size() >= want) return;  // nothing missing: Frames() acts
    ro.max_bytes = want - c->in.size();
  }
  io_uring_sqe* sqe = Sqe();
  bufs_->PrepareRecv(sqe, c->fd, ro);
  Tag(sqe, c, kRecv);
  c->receiving = true;
}

bool Server::MaybeClose(Conn* c) {
  if (!c->done || c->receiving || c->send.busy() || c->parked) return false;
  c->admission.Reset();  // its on_grant will not run after this
  std::erase(granted_, c);
  c->in.Clear();
  c->out.Clear();
  close(c->fd);
  live_.erase(c);
  delete c;
  return true;
}

void Server::Fail(Conn* c, const std::string& why) {
  std::fprintf(stderr, "frame_server: %s: %s; closing it\n",
               c->budget->name().c_str(), why.c_str());
  c->done = true;
  c->in.Clear();
  shutdown(c->fd, SHUT_RDWR);  // ends an armed receive
}

void Server::Frames(Conn* c) {
  if (!cfg_.admission) {
    for (;;) {
      absl::StatusOr<std::optional<bufpool::BufferChain>> f =
          split_.Next(c->in);
      if (!f.ok()) return Fail(c, std::string(f.status().message()));
      if (!f->has_value()) break;
      ++frames_;
      c->out.Append(**std::move(f));
    }
    Send(c);
    return;
  }
  if (c->frame == 0) {
    absl::StatusOr<std::optional<size_t>> size = split_.FrameSize(c->in);
    if (!size.ok()) return Fail(c, std::string(size.status().message()));
    if (!size->has_value()) return;  // the header is not all in
    c->frame = **size;
    absl::StatusOr<bool> now = queue_->Request(
        *c->budget, c->frame, c->admission,
        [this, c] { granted_.push_back(c); });  // runs on this thread
    if (!now.ok()) return Fail(c, std::string(now.status().message()));
    if (!*now) return;  // waits: ResumeGranted() arms its receive
  }
  if (c->in.size() < c->frame) return;
  absl::StatusOr<std::optional<bufpool::BufferChain>> f = split_.Next(c->in);
  if (!f.ok() || !f->has_value()) {
    return Fail(c,
                f.ok() ? "frame not cut" : std::string(f.status().message()));
  }
  ++frames_;
  c->replying = true;
  c->out.Append(**std::move(f));
  Send(c);
}

// Connections whose wait ended: receive the rest of their frames.
void Server::ResumeGranted() {
  std::vector<Conn*> now;
  now.swap(granted_);
  for (Conn* c : now) {
    if (c->done || stopping_) continue;
    c->progress = Clock::now();
    if (c->in.size() >= c->frame) {
      Frames(c);  // all of it was in already (an empty payload)
    } else if (!c->receiving && !c->parked) {
      Receive(c);
    }
  }
}

// When the queue's oldest waiter has waited stall_ms, closes the
// connections whose granted frame has not moved for as long: peers that
// stopped mid-frame or never read.
void Server::CloseStalled() {
  if (!queue_ || cfg_.stall_ms <= 0 || queue_->queue_length() == 0 ||
      queue_->oldest_wait() < absl::Milliseconds(cfg_.stall_ms)) {
    return;
  }
  const auto limit = Clock::now() - std::chrono::milliseconds(cfg_.stall_ms);
  std::vector<Conn*> all(live_.begin(), live_.end());
  for (Conn* c : all) {
    if (c->done || !c->admission.granted() || c->progress > limit) continue;
    ++stalled_closed_;
    Fail(c, "its frame stalled while others wait for memory");
    MaybeClose(c);  // now, unless a receive or send is still in flight
  }
}

void Server::BeginStopping() {
  stopping_ = true;
  io_uring_sqe* sqe = Sqe();
  io_uring_prep_cancel64(sqe, kAccept, 0);
  Tag(sqe, nullptr, kCancel);
  std::vector<Conn*> all(live_.begin(), live_.end());
  for (Conn* c : all) {
    shutdown(c->fd, SHUT_RDWR);
    c->done = true;
    MaybeClose(c);  // those with nothing in flight go now
  }
}

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

void Server::PrintStats() {
  const bufpool::PoolStats ps = pool_.Stats();
  std::fprintf(stderr,
               "pool: capacity=%zu in_use=%zu high_water=%zu buffer_size=%zu\n"
               "ring: available=%zu target=%zu max=%zu enobufs=%llu "
               "parked=%zu\n",
               ps.capacity, ps.in_use, ps.high_water, pool_.buffer_size(),
               bufs_->available(), bufs_->target(), bufs_->max_buffers(),
               static_cast<unsigned long long>(bufs_->enobufs()),
               parked_->size());
  if (queue_) {
    const bufpool::AdmissionStats qs = queue_->Stats();
    std::fprintf(stderr,
                 "queue: capacity=%zu granted=%zu length=%zu longest=%zu "
                 "grants=%llu waited=%llu refusals=%llu\n",
                 qs.capacity_buffers, qs.granted_buffers, qs.queue_length,
                 qs.longest_queue, static_cast<unsigned long long>(qs.grants),
                 static_cast<unsigned long long>(qs.waited),
                 static_cast<unsigned long long>(qs.refusals));
  }
  for (Conn* c : live_) {
    const bufpool::BudgetStats bs = c->budget->Stats();
    std::fprintf(stderr,
                 "budget \"%s\": pinned=%zu high_water=%zu max=%zu "
                 "refusals=%llu\n",
                 c->budget->name().c_str(), bs.pinned_bytes,
                 bs.high_water_bytes, c->budget->max_bytes(),
                 static_cast<unsigned long long>(bs.refusals));
  }
  std::fprintf(stderr, "server: conns=%zu frames=%llu stalled_closed=%llu\n",
               live_.size(), static_cast<unsigned long long>(frames_),
               static_cast<unsigned long long>(stalled_closed_));
}

void Server::Run() {
  while (!stopping_ || accepting_ || !live_.empty()) {
    if (!stopping_ && stop_requested != 0) BeginStopping();
    if (stats_wanted != 0) {
      stats_wanted = 0;
      PrintStats();
    }
    bufs_->Refill();
    RearmParked();
    ResumeGranted();
    CloseStalled();
    __kernel_timespec tick{0, 100 * 1000 * 1000};
    io_uring_cqe* cqe;
    io_uring_submit_and_wait_timeout(&ring_, &cqe, 1, &tick, nullptr);
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
        if (Conn* nc = stopping_ ? nullptr : NewConn(cqe.res)) {
          live_.insert(nc);
          Receive(nc);
        } else {
          close(cqe.res);
        }
      }
      if (!more && !stopping_) Accept();
      accepting_ = more || !stopping_;
      return;
    case kNotify:
      parked_->OnNotice();
      return;
    case kRecv:
      OnRecv(c, cqe, more);
      break;
    case kSend:
      if (!c->send.OnCompletion(cqe)) return;
      OnSend(c);
      break;
    default:
      return;  // kCancel
  }
  MaybeClose(c);
}

void Server::OnRecv(Conn* c, const io_uring_cqe& cqe, bool more) {
  if (!more) c->receiving = false;
  const absl::Status got = bufs_->Take(cqe, c->in);
  if (cqe.res > 0 && (got.ok() || absl::IsResourceExhausted(got))) {
    c->progress = Clock::now();
    if (c->done) {
      c->in.Clear();  // closing: drop what still comes
    } else {
      Frames(c);
      if (!cfg_.admission && c->paused && more) Cancel(c);
    }
  } else if (cqe.res == -ENOBUFS) {
    if (!more) c->parked = true, parked_->Park(c);
  } else if (!got.ok() || cqe.res == 0) {
    if (cqe.res != -ECANCELED || stopping_) c->done = true;
  }
  if (more || c->receiving || c->parked || c->done || stopping_) return;
  if (cfg_.admission) {
    // Re-arm for what is missing: the header, or a granted frame's rest;
    // nothing while waiting for a grant or sending the reply.
    const bool header = c->frame == 0;
    if (header || (c->admission.granted() && !c->replying)) {
      Receive(c);
    }
  } else if (!c->paused) {
    Receive(c);
  }
}

void Server::OnSend(Conn* c) {
  if (c->send.result() < 0) {
    c->done = true;
    c->out.Clear();
    return;
  }
  if (c->send.result() > 0) c->progress = Clock::now();
  c->send.ReturnUnsentTo(c->out);
  Send(c);
  if (cfg_.admission) {
    if (c->send.busy()) {
      c->admission.Shrink(c->out.size() + c->send.held_bytes());
      return;
    }
    // The whole frame is out: its memory goes to the next waiter.
    c->admission.Reset();
    c->frame = 0;
    c->replying = false;
    if (!c->done && !stopping_ && !c->receiving && !c->parked) Receive(c);
  } else if (!c->paused && !c->receiving && !c->parked && !c->done &&
             !stopping_) {
    Receive(c);
  }
}

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
    std::perror("frame_server: listen");
    if (lfd >= 0) close(lfd);
    return -1;
  }
  *bound = ntohs(sa.sin_port);
  return lfd;
}

// Parses "--flag N" pairs; false (and a message) on anything else.
bool ParseFlags(int argc, char** argv, Config* cfg) {
  for (int i = 1; i < argc; i += 2) {
    const std::string flag = argv[i];
    if (i + 1 >= argc) {
      std::fprintf(stderr, "frame_server: %s needs a value\n", flag.c_str());
      return false;
    }
    const char* v = argv[i + 1];
    if (flag == "--admission") {
      if (std::strcmp(v, "on") != 0 && std::strcmp(v, "off") != 0) {
        std::fprintf(stderr,
                     "frame_server: --admission must be on or off, got '%s'\n",
                     v);
        return false;
      }
      cfg->admission = std::strcmp(v, "on") == 0;
      continue;
    }
    char* end = nullptr;
    errno = 0;
    const unsigned long long n = std::strtoull(v, &end, 10);
    if (end == v || *end != '\0' || errno != 0 || v[0] == '-') {
      std::fprintf(stderr, "frame_server: %s wants a number, got '%s'\n",
                   flag.c_str(), v);
      return false;
    }
    if (flag == "--port" && n <= 65535) {
      cfg->port = static_cast<int>(n);
    } else if (flag == "--buffers" && n > 0) {
      cfg->buffers = n;
    } else if (flag == "--buffer-size" && n >= 512) {
      cfg->buffer_size = n;
    } else if (flag == "--ring" && n <= 32768) {
      cfg->ring = n;
    } else if (flag == "--stall-ms" && n <= 3600 * 1000) {
      cfg->stall_ms = static_cast<int>(n);
    } else {
      std::fprintf(stderr,
                   "frame_server: unknown flag or value out of range: %s %s "
                   "(--port 0-65535, --buffers >0, --buffer-size >=512, "
                   "--ring 0-32768, --stall-ms, --admission on|off)\n",
                   flag.c_str(), v);
      return false;
    }
  }
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  Config cfg;
  if (!ParseFlags(argc, argv, &cfg)) return 2;
  auto pool = bufpool::BufferPool::Create(
      {.buffer_size = cfg.buffer_size, .buffer_count = cfg.buffers});
  if (!pool.ok()) {
    std::fprintf(stderr, "frame_server: %s\n",
                 pool.status().ToString().c_str());
    return 1;
  }
  int bound = 0;
  const int lfd = Listen(cfg.port, &bound);
  if (lfd < 0) return 1;
  signal(SIGINT, [](int) { stop_requested = 1; });
  signal(SIGTERM, [](int) { stop_requested = 1; });
  signal(SIGUSR1, [](int) { stats_wanted = 1; });
  signal(SIGPIPE, SIG_IGN);
  {
    Server server(**pool, lfd, cfg);
    if (!server.Start()) return 1;
    std::printf("listening on 127.0.0.1:%d\n", bound);
    std::fflush(stdout);
    server.Run();
    server.Stop();
  }
  std::printf("done: %zu buffers in use\n", (*pool)->Stats().in_use);
  close(lfd);
  return 0;
}

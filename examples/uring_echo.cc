// An io_uring echo server written with nothing but libbufpool's public
// headers and liburing: receives land in pool buffers lent to a provided-
// buffer ring, come back as BufferChains, and are echoed with HeldSend.
// Running out of buffers (-ENOBUFS) parks a connection until the ring says
// re-arming makes sense; short sends are resumed from TakeUnsent().
//
//   uring_echo [PORT [SECONDS]]    # PORT 0 picks one; SECONDS 0: forever
#include <arpa/inet.h>
#include <liburing.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <unordered_set>
#include <vector>

#include "bufpool/buffer_pool.h"
#include "bufpool/chain.h"
#include "bufpool/uring.h"

namespace {

enum Op : uint64_t { kAccept = 1, kRecv = 2, kSend = 3 };

struct Conn {
  explicit Conn(int f) : fd(f) {}
  int fd;
  bufpool::BufferChain out;  // received, not yet sent
  bufpool::HeldSend send;
  bool receiving = false, parked = false, done = false;
};

io_uring ring;
std::unique_ptr<bufpool::ProvidedBufferRing> bufs;
std::unordered_set<Conn*> live;

io_uring_sqe* Sqe() {
  io_uring_sqe* sqe;
  while ((sqe = io_uring_get_sqe(&ring)) == nullptr) io_uring_submit(&ring);
  return sqe;
}
void Tag(io_uring_sqe* sqe, Conn* c, Op op) {
  io_uring_sqe_set_data64(sqe, reinterpret_cast<uint64_t>(c) | op);
}
void Receive(Conn* c) {
  io_uring_sqe* sqe = Sqe();
  bufs->PrepareRecv(sqe, c->fd);  // multishot, buffers from the ring
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
  live.erase(c);
  delete c;
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  const int port = argc > 1 ? std::atoi(argv[1]) : 0;
  const int seconds = argc > 2 ? std::atoi(argv[2]) : 0;
  auto pool = bufpool::BufferPool::Create({.buffer_count = 4096});
  if (!pool.ok())
    return std::fprintf(stderr, "%s\n", pool.status().ToString().c_str()), 1;
  const int lfd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  const int one = 1;
  setsockopt(lfd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_port = htons(static_cast<uint16_t>(port));
  sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(sa);
  if (bind(lfd, reinterpret_cast<sockaddr*>(&sa), len) != 0 ||
      listen(lfd, 128) != 0 ||
      getsockname(lfd, reinterpret_cast<sockaddr*>(&sa), &len) != 0) {
    return std::perror("listen"), 1;
  }
  std::printf("listening on 127.0.0.1:%d\n", ntohs(sa.sin_port));
  std::fflush(stdout);
  if (int rc = io_uring_queue_init(256, &ring, 0); rc < 0)
    return std::fprintf(stderr, "io_uring: %d\n", rc), 1;
  auto created = bufpool::ProvidedBufferRing::Create(
      &ring, **pool, {.group_id = 1, .max_buffers = 512});
  if (!created.ok())
    return std::fprintf(stderr, "%s\n", created.status().ToString().c_str()), 1;
  bufs = *std::move(created);
  auto accept = [&] {
    io_uring_sqe* sqe = Sqe();
    io_uring_prep_multishot_accept(sqe, lfd, nullptr, nullptr, SOCK_CLOEXEC);
    Tag(sqe, nullptr, kAccept);
  };
  accept();
  bool stopping = false, accepting = true;
  const auto end =
      std::chrono::steady_clock::now() + std::chrono::seconds(seconds);
  std::vector<Conn*> parked;  // out of buffers: re-armed when the ring refills
  while (!stopping || accepting || !live.empty()) {
    if (!stopping && seconds != 0 && std::chrono::steady_clock::now() >= end) {
      stopping = true;  // stop accepting; shut every connection down
      io_uring_prep_cancel64(Sqe(), kAccept, 0);
      for (Conn* c : live) shutdown(c->fd, SHUT_RDWR);
    }
    bufs->Refill();  // cheap when nothing is needed
    while (!parked.empty() && bufs->ShouldRearm()) {
      Conn* c = parked.back();
      parked.pop_back();
      c->parked = false;
      if (!c->done && !stopping)
        Receive(c);
      else
        c->done = true, MaybeClose(c);
    }
    __kernel_timespec tick{0, 100 * 1000 * 1000};
    io_uring_cqe* cqe;
    io_uring_submit_and_wait_timeout(&ring, &cqe, 1, &tick, nullptr);
    unsigned head, n = 0;
    io_uring_for_each_cqe(&ring, head, cqe) {
      ++n;
      auto* c = reinterpret_cast<Conn*>(cqe->user_data & ~uint64_t{7});
      const bool more = cqe->flags & IORING_CQE_F_MORE;
      switch (cqe->user_data & 7) {
        case 0:
          continue;  // the accept's cancel
        case kAccept:
          if (cqe->res >= 0) Receive(*live.insert(new Conn(cqe->res)).first);
          if (!more && !stopping) accept();
          accepting = more || !stopping;
          continue;
        case kRecv: {
          if (!more) c->receiving = false;
          absl::StatusOr<bufpool::BufferChain> got = bufs->Take(*cqe);
          if (got.ok() && !got->empty()) {
            c->out.Append(*std::move(got));  // links the buffers, no copy
            Send(c);
          } else if (!got.ok() && absl::IsResourceExhausted(got.status())) {
            if (!more) c->parked = true, parked.push_back(c);
          } else {
            c->done = true;  // end of stream or an error
          }
          if (!more && !c->done && !c->parked) Receive(c);
          break;
        }
        case kSend:
          if (!c->send.OnCompletion(*cqe)) continue;  // more to come
          if (c->send.result() < 0) {
            c->done = true;
            c->out.Clear();
          } else {  // resume a short send, then what arrived meanwhile
            bufpool::BufferChain rest = c->send.TakeUnsent();
            rest.Append(std::move(c->out));
            c->out = std::move(rest);
            Send(c);
          }
          break;
      }
      if (!c->parked) MaybeClose(c);
    }
    io_uring_cq_advance(&ring, n);
  }
  bufs.reset();  // gives every lent buffer back, before the ring goes
  io_uring_queue_exit(&ring);
  std::printf("done: %zu buffers in use\n", (*pool)->Stats().in_use);
  return 0;
}

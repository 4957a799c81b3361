// Fuzz target 5: each echo engine (apps/echo/echo_server.h: kEpoll,
// kUring) against a peer driven by the input, in-process on loopback.
//
// The input picks the engine, a small pool (64-byte to 16 KiB buffers, 4 to
// 256 of them, so it runs dry; incremental rings and copied receives in the
// uring engine), max_unsent_bytes, and then up to six client
// connections (some with a tiny receive buffer, so the server's writes come
// out partial) and what they do: send a message of any size (each byte a
// function of the connection and its offset), read some of the echo, pause,
// wait for the whole echo, flood (send until the socket takes no more),
// half-close, reset (SO_LINGER 0), close. Checked:
//   * every byte read back is the byte sent at that offset, in order;
//   * a connection that did not ask to go is never closed or reset by the
//     server; a half-closed one gets every byte back and then end of file;
//   * every wait ends within a time bound (kStallLimit without progress);
//   * Run() returns OK after Stop(), and then the pool's in_use is 0.
#include <arpa/inet.h>
#include <fcntl.h>
#include <fuzzer/FuzzedDataProvider.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <memory>
#include <thread>
#include <vector>

#include "bufpool/buffer_pool.h"
#include "echo/echo_server.h"
#include "fuzz_check.h"

namespace {

using bufpool::BufferPool;
using bufpool::EchoServer;
using Clock = std::chrono::steady_clock;

// A wait that sees no byte move for this long is a stall (a lost byte or a
// server that stopped serving), not scheduling noise.
constexpr auto kStallLimit = std::chrono::seconds(5);
constexpr int kMaxConns = 6;
constexpr size_t kMaxMessage = 96 * 1024;

uint8_t Pattern(uint32_t conn, uint64_t offset) {
  return static_cast<uint8_t>(offset * 131 + conn * 17 + (offset >> 8));
}

struct Conn {
  int fd = -1;
  uint32_t id = 0;
  uint64_t sent = 0;
  uint64_t received = 0;
  bool half_closed = false;
  bool eof = false;
};

class Session {
 public:
  explicit Session(FuzzedDataProvider& in) : in_(in) {}

  ~Session() {
    for (Conn& c : conns_) {
      if (c.fd >= 0) close(c.fd);
    }
  }

  void Run() {
    bufpool::PoolOptions po;
    // Up to 16 KiB: from there the uring engine's ring is incremental (a
    // slot serves many receives, taken as counted slices); below, small
    // receives are copied into the connection's queue.
    po.buffer_size = size_t{64} << in_.ConsumeIntegralInRange<int>(0, 8);
    po.buffer_count = in_.ConsumeIntegralInRange<size_t>(4, 256);
    po.huge_pages = bufpool::HugePages::kNever;
    po.populate = false;
    auto pool = BufferPool::Create(po);
    FUZZ_CHECK(pool.ok(), "Create: %s", pool.status().ToString().c_str());
    bufpool::EchoServerOptions so;
    so.engine = in_.ConsumeBool() ? bufpool::EchoEngine::kUring
                                  : bufpool::EchoEngine::kEpoll;
    so.pool = pool->get();
    so.max_unsent_bytes =
        in_.ConsumeBool() ? in_.ConsumeIntegralInRange<size_t>(1, 4096)
                          : in_.ConsumeIntegralInRange<size_t>(1, 256 << 10);
    // Bytes this input may send: a tiny unsent limit makes each round trip
    // carry one buffer, so the budget follows the limit (an input stays
    // well under libFuzzer's timeout however the engine paces itself).
    budget_ = std::min<uint64_t>(4 << 20, 32 * so.max_unsent_bytes + 16384);
    auto server = EchoServer::Create(so);
    FUZZ_CHECK(server.ok(), "EchoServer::Create: %s",
               server.status().ToString().c_str());
    static bool said = false;  // once per process: which engine kUring is
    if (so.engine == bufpool::EchoEngine::kUring && !said) {
      said = true;
      std::fprintf(
          stderr, "echo_fuzz: kUring runs as %s%s%s\n",
          std::string(bufpool::EchoEngineName((*server)->engine())).c_str(),
          (*server)->fallback_reason().empty() ? "" : ": ",
          (*server)->fallback_reason().c_str());
    }
    port_ = (*server)->port();
    absl::Status run_status;
    std::thread loop([&] { run_status = (*server)->Run(); });

    int steps = 0;
    while (in_.remaining_bytes() > 0 && steps++ < 64) Step();
    for (Conn& c : conns_) {
      if (c.fd >= 0) Drain(c, /*want_eof=*/c.half_closed);
    }
    for (Conn& c : conns_) {
      if (c.fd >= 0) close(c.fd);
      c.fd = -1;
    }
    (*server)->Stop();
    loop.join();
    FUZZ_CHECK(run_status.ok(), "Run: %s", run_status.ToString().c_str());
    const bufpool::EchoServerStats st = (*server)->Stats();
    FUZZ_CHECK(st.bytes_sent <= st.bytes_received, "sent %llu > received %llu",
               (unsigned long long)st.bytes_sent,
               (unsigned long long)st.bytes_received);
    FUZZ_CHECK(st.connections_accepted <= next_id_, "accepted %llu of %u",
               (unsigned long long)st.connections_accepted, next_id_);
    server->reset();
    FUZZ_CHECK((*pool)->Stats().in_use == 0,
               "%s: pool in_use %zu after Run() returned",
               std::string(bufpool::EchoEngineName(so.engine)).c_str(),
               (*pool)->Stats().in_use);
  }

 private:
  Conn* Pick() {
    std::vector<Conn*> open;
    for (Conn& c : conns_) {
      if (c.fd >= 0) open.push_back(&c);
    }
    if (open.empty()) return nullptr;
    return open[in_.ConsumeIntegralInRange<size_t>(0, open.size() - 1)];
  }

  void Connect() {
    if (conns_.size() >= kMaxConns) return;
    const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    FUZZ_CHECK(fd >= 0, "socket: %s", strerror(errno));
    const int rcvbuf = in_.ConsumeIntegralInRange<int>(0, 3);
    if (rcvbuf != 0) {  // small: the server's writes come out partial
      const int bytes = 1024 << rcvbuf;
      setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &bytes, sizeof bytes);
    }
    const int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(port_);
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
      // Interrupted (libFuzzer's timer signal): the connect goes on; wait
      // for it and read its outcome.
      FUZZ_CHECK(errno == EINTR, "connect: %s", strerror(errno));
      pollfd p = {fd, POLLOUT, 0};
      while (poll(&p, 1, 5000) < 0 && errno == EINTR) {
      }
      int err = 0;
      socklen_t len = sizeof err;
      FUZZ_CHECK(getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) == 0 &&
                     err == 0 && (p.revents & POLLOUT),
                 "connect: %s", strerror(err));
    }
    FUZZ_CHECK(fcntl(fd, F_SETFL, O_NONBLOCK) == 0, "fcntl");
    Conn c;
    c.fd = fd;
    c.id = next_id_++;
    conns_.push_back(c);
  }

  // Reads what is there (up to `max`), checking every byte. False when the
  // connection has ended (end of file, checked to be allowed).
  bool ReadSome(Conn& c, size_t max) {
    uint8_t buf[16384];
    while (max > 0) {
      const ssize_t n = recv(c.fd, buf, std::min(max, sizeof buf), 0);
      if (n < 0) {
        if (errno == EINTR) continue;
        if (errno == EAGAIN || errno == EWOULDBLOCK) return true;
        FUZZ_CHECK(false,
                   "conn %u: %s after %llu of %llu bytes echoed; it did not "
                   "ask to go",
                   c.id, strerror(errno), (unsigned long long)c.received,
                   (unsigned long long)c.sent);
      }
      if (n == 0) {
        FUZZ_CHECK(c.half_closed && c.received == c.sent,
                   "conn %u: end of file after %llu of %llu bytes echoed "
                   "(half-closed: %d)",
                   c.id, (unsigned long long)c.received,
                   (unsigned long long)c.sent, c.half_closed);
        c.eof = true;
        return false;
      }
      for (ssize_t i = 0; i < n; ++i) {
        FUZZ_CHECK(c.received + i < c.sent,
                   "conn %u: %llu bytes echoed but only %llu sent", c.id,
                   (unsigned long long)(c.received + i + 1),
                   (unsigned long long)c.sent);
        FUZZ_CHECK(buf[i] == Pattern(c.id, c.received + i),
                   "conn %u: byte %llu of the echo is %u, sent %u", c.id,
                   (unsigned long long)(c.received + i), buf[i],
                   Pattern(c.id, c.received + i));
      }
      c.received += static_cast<uint64_t>(n);
      max -= static_cast<size_t>(n);
    }
    return true;
  }

  // Sends up to n more bytes of the pattern, as many as the socket takes.
  void Send(Conn& c, size_t n) {
    uint8_t buf[16384];
    n = std::min<uint64_t>(n, budget_);
    while (n > 0) {
      const size_t k = std::min(n, sizeof buf);
      for (size_t i = 0; i < k; ++i) buf[i] = Pattern(c.id, c.sent + i);
      const ssize_t w = send(c.fd, buf, k, MSG_NOSIGNAL);
      if (w < 0) {
        if (errno == EINTR) continue;
        FUZZ_CHECK(errno == EAGAIN || errno == EWOULDBLOCK, "conn %u: send: %s",
                   c.id, strerror(errno));
        return;  // the server is not reading now (backpressure)
      }
      c.sent += static_cast<uint64_t>(w);
      n -= static_cast<size_t>(w);
      budget_ -= static_cast<uint64_t>(w);
    }
  }

  // Reads until every byte sent on `c` has come back (and, if want_eof,
  // end of file). Every other open connection is read meanwhile too: a
  // client that does not read may hold pool buffers that c's echo needs
  // (each connection may keep max_unsent_bytes, which a small pool does not
  // have for all of them), so a peer waiting on one connection alone could
  // deadlock by its own doing. No byte on any connection for kStallLimit
  // fails.
  void Drain(Conn& c, bool want_eof) {
    auto last = Clock::now();
    while (!c.eof && (c.received < c.sent || want_eof)) {
      std::vector<pollfd> fds;
      std::vector<Conn*> who;
      for (Conn& o : conns_) {
        if (o.fd >= 0 && !o.eof) {
          fds.push_back({o.fd, POLLIN, 0});
          who.push_back(&o);
        }
      }
      poll(fds.data(), fds.size(), 50);
      for (size_t i = 0; i < fds.size(); ++i) {
        if (fds[i].revents == 0) continue;
        const uint64_t before = who[i]->received;
        ReadSome(*who[i], SIZE_MAX);
        if (who[i]->received != before || who[i]->eof) last = Clock::now();
      }
      FUZZ_CHECK(c.eof || Clock::now() - last < kStallLimit,
                 "conn %u: echo stalled at %llu of %llu bytes (half-closed "
                 "%d, waiting for end of file %d)",
                 c.id, (unsigned long long)c.received,
                 (unsigned long long)c.sent, c.half_closed, want_eof);
    }
  }

  void Gone(Conn& c) {
    close(c.fd);
    c.fd = -1;
  }

  void Step() {
    const int op = in_.ConsumeIntegralInRange<int>(0, 9);
    if (op == 0 || conns_.empty()) {
      Connect();
      return;
    }
    Conn* c = Pick();
    if (c == nullptr) {
      Connect();
      return;
    }
    switch (op) {
      case 1:
      case 2:  // send a message, small or large
        if (c->half_closed) break;
        Send(*c, op == 1 ? in_.ConsumeIntegralInRange<size_t>(1, 512)
                         : in_.ConsumeIntegralInRange<size_t>(1, kMaxMessage));
        break;
      case 3:  // read part of the echo
        ReadSome(*c, in_.ConsumeIntegralInRange<size_t>(1, 64 << 10));
        break;
      case 4: {  // pause: let the server run, reading nothing
        std::this_thread::sleep_for(std::chrono::microseconds(
            in_.ConsumeIntegralInRange<int>(0, 2000)));
        break;
      }
      case 5:  // wait for the whole echo so far
        Drain(*c, /*want_eof=*/false);
        break;
      case 6:  // half-close: the rest must still come back, then EOF
        if (!c->half_closed) {
          FUZZ_CHECK(shutdown(c->fd, SHUT_WR) == 0, "shutdown");
          c->half_closed = true;
        }
        break;
      case 7: {  // reset: the connection asks to go, abruptly
        const linger l = {1, 0};
        setsockopt(c->fd, SOL_SOCKET, SO_LINGER, &l, sizeof l);
        Gone(*c);
        break;
      }
      case 9:  // flood: send until the socket takes no more (up to 256
               // KiB), so the echo backs up into backpressure and a dry pool
        if (c->half_closed) break;
        for (int k = 0; k < 16 && budget_ > 0; ++k) {
          const uint64_t before = c->sent;
          Send(*c, 16384);
          if (c->sent - before < 16384) break;
        }
        break;
      default:  // 8: close, with or without reading the rest
        if (in_.ConsumeBool()) Drain(*c, c->half_closed);
        Gone(*c);
        break;
    }
  }

  FuzzedDataProvider& in_;
  uint16_t port_ = 0;
  uint32_t next_id_ = 0;
  uint64_t budget_ = 0;
  std::vector<Conn> conns_;
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  FuzzedDataProvider in(data, size);
  Session(in).Run();
  return 0;
}

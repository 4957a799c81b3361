#include "echo/echo_load.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "os/error.h"
#include "os/socket.h"

namespace bufpool::net {
namespace {

using Clock = std::chrono::steady_clock;

constexpr size_t kMaxShift = 4096;  // message start offsets in the pattern

uint64_t Mix(uint64_t x) {  // splitmix64 finaliser
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

struct Client {
  int fd = -1;
  size_t index = 0;
  size_t message = 0;  // the one in flight
  size_t len = 0;      // its length
  size_t shift = 0;    // its offset in the pattern
  size_t sent = 0;
  size_t received = 0;
  bool aborts = false;  // resets during its second message
  bool write_shut = false;
  bool done = false;
  Clock::time_point start;
};

class Load {
 public:
  explicit Load(const EchoLoadOptions& o) : o_(o) {}
  ~Load() {
    for (Client& c : clients_) {
      if (c.fd >= 0) ::close(c.fd);
    }
    if (epoll_fd_ >= 0) ::close(epoll_fd_);
  }
  absl::StatusOr<EchoLoadResult> Run();

 private:
  void StartMessage(Client& c);
  // Writes what the socket takes, and reads when `events` (from epoll, 0
  // for none) say so until the socket is drained. Edge-triggered epoll
  // reports every arrival of data, so a read that came back short (the
  // socket was empty) need not be retried to EAGAIN, and after sending a
  // message there is nothing to read until the next event: the generator
  // spends one recv per echo, not three. Only when the peer has closed
  // (EPOLLRDHUP) does it read on to the end of stream, which a short read
  // does not reveal.
  absl::Status Pump(Client& c, uint32_t events);
  // How much of its message `c` sends: half of it for an aborting client's
  // second message.
  size_t SendLimit(const Client& c) const {
    return (c.aborts && c.message == 1) ? c.len / 2 : c.len;
  }
  // Writes what the socket takes of the message in flight.
  absl::Status Send(Client& c, bool& progress);
  // Reads and checks what came back while `readable` (see Pump); true when
  // the client is finished.
  absl::StatusOr<bool> Receive(Client& c, bool& readable, bool until_eof,
                               bool& progress);
  // The `n` bytes just read into scratch_, against what `c` sent.
  absl::Status CheckEcho(const Client& c, size_t n) const;
  void Finish(Client& c);
  // Fills the pattern that messages are cut from, from the seed.
  void FillPattern();
  // Opens the connections to `server`, each non-blocking and on epoll.
  absl::Status ConnectAll(const sockaddr_in& server);
  // The epoll loop, until every client is finished or the load stalls.
  absl::Status WaitForEchoes();
  EchoLoadResult Summary(Clock::time_point start);

  const EchoLoadOptions& o_;
  std::vector<std::byte> pattern_;
  std::vector<std::byte> scratch_;
  std::vector<Client> clients_;
  std::vector<uint32_t> latencies_ns_;
  size_t remaining_ = 0;
  uint64_t bytes_ = 0;
  int epoll_fd_ = -1;
};

void Load::StartMessage(Client& c) {
  const uint64_t h = Mix(Mix(o_.seed ^ (c.index << 20)) ^ c.message);
  c.len = o_.min_size + h % (o_.max_size - o_.min_size + 1);
  c.shift = (h >> 32) % kMaxShift;
  c.sent = 0;
  c.received = 0;
  c.start = Clock::now();
}

void Load::Finish(Client& c) {
  c.done = true;
  ::epoll_ctl(epoll_fd_, EPOLL_CTL_DEL, c.fd, nullptr);
  ::close(c.fd);
  c.fd = -1;
  --remaining_;
}

absl::Status Load::Send(Client& c, bool& progress) {
  const size_t limit = SendLimit(c);
  while (c.sent < limit) {
    const ssize_t n =
        ::send(c.fd, pattern_.data() + c.shift + c.sent,
               std::min<size_t>(limit - c.sent, 1 << 20), MSG_NOSIGNAL);
    if (n < 0) {
      if (errno == EAGAIN || errno == EINTR) break;
      return os::PosixError(absl::StrCat("connection ", c.index, ": send"),
                            errno);
    }
    c.sent += n;
    progress = true;
  }
  return absl::OkStatus();
}

absl::Status Load::CheckEcho(const Client& c, size_t n) const {
  if (c.message == o_.messages || c.received + n > c.sent) {
    return absl::DataLossError(absl::StrCat(
        "connection ", c.index, ": ", n, " bytes came back at byte ",
        c.received, " of message ", c.message, " that were never sent"));
  }
  const std::byte* want = pattern_.data() + c.shift + c.received;
  if (std::memcmp(scratch_.data(), want, n) != 0) {
    size_t at = 0;
    while (scratch_[at] == want[at]) ++at;
    return absl::DataLossError(
        absl::StrCat("connection ", c.index, ": message ", c.message, " (",
                     c.len, " bytes) differs at byte ", c.received + at));
  }
  return absl::OkStatus();
}

absl::StatusOr<bool> Load::Receive(Client& c, bool& readable, bool until_eof,
                                   bool& progress) {
  while (readable) {
    const ssize_t n = ::recv(c.fd, scratch_.data(), scratch_.size(), 0);
    if (n < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN) break;
      return os::PosixError(absl::StrCat("connection ", c.index, ": recv"),
                            errno);
    }
    if (n == 0) {
      if (c.message == o_.messages && o_.half_close) {
        Finish(c);  // end of stream after the last echo, as expected
        return true;
      }
      return absl::UnavailableError(absl::StrCat(
          "connection ", c.index,
          ": server closed the connection during "
          "message ",
          c.message, " after ", c.received, " of ", c.len, " bytes"));
    }
    if (absl::Status s = CheckEcho(c, n); !s.ok()) return s;
    c.received += n;
    bytes_ += n;
    progress = true;
    if (c.received == c.len) {
      const auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(
                          Clock::now() - c.start)
                          .count();
      latencies_ns_.push_back(static_cast<uint32_t>(
          std::min<int64_t>(ns, std::numeric_limits<uint32_t>::max())));
      ++c.message;
      if (c.message == o_.messages) {
        if (!o_.half_close) {
          Finish(c);
          return true;
        }
        c.len = c.sent = c.received = 0;  // wait for end of stream
      } else {
        StartMessage(c);
        // Back to writing; its echo comes with a new event (unless the
        // peer has closed: then read on to see the end of stream).
        readable = until_eof;
        break;
      }
    }
    if (static_cast<size_t>(n) < scratch_.size() && !until_eof) {
      readable = false;  // drained: the next arrival is a new event
    }
  }
  return false;
}

absl::Status Load::Pump(Client& c, uint32_t events) {
  bool readable = (events & (EPOLLIN | EPOLLRDHUP | EPOLLERR | EPOLLHUP)) != 0;
  const bool until_eof = (events & (EPOLLRDHUP | EPOLLERR | EPOLLHUP)) != 0;
  for (;;) {
    bool progress = false;
    if (absl::Status s = Send(c, progress); !s.ok()) return s;
    if (c.aborts && c.message == 1 && c.sent == SendLimit(c)) {
      // Abrupt disconnect mid-message: RST instead of FIN.
      linger l{1, 0};
      ::setsockopt(c.fd, SOL_SOCKET, SO_LINGER, &l, sizeof(l));
      Finish(c);
      return absl::OkStatus();
    }
    if (o_.half_close && !c.write_shut && c.message + 1 == o_.messages &&
        c.sent == c.len) {
      ::shutdown(c.fd, SHUT_WR);
      c.write_shut = true;
    }
    absl::StatusOr<bool> finished = Receive(c, readable, until_eof, progress);
    if (!finished.ok()) return finished.status();
    if (*finished || !progress) return absl::OkStatus();
  }
}

// The IPv4 address of "HOST:PORT" ("localhost" is 127.0.0.1).
absl::StatusOr<sockaddr_in> ParseTarget(const std::string& target) {
  const size_t colon = target.rfind(':');
  uint32_t port = 0;
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  if (colon == std::string::npos ||
      !absl::SimpleAtoi(target.substr(colon + 1), &port) || port == 0 ||
      port > 65535 ||
      inet_pton(AF_INET,
                target.substr(0, colon) == "localhost"
                    ? "127.0.0.1"
                    : target.substr(0, colon).c_str(),
                &sa.sin_addr) != 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("target '", target, "' is not IPV4-HOST:PORT"));
  }
  sa.sin_port = htons(static_cast<uint16_t>(port));
  return sa;
}

void Load::FillPattern() {
  pattern_.resize(o_.max_size + kMaxShift);
  std::mt19937_64 rng(o_.seed);
  for (size_t i = 0; i < pattern_.size(); i += 8) {
    const uint64_t v = rng();
    std::memcpy(pattern_.data() + i, &v,
                std::min<size_t>(8, pattern_.size() - i));
  }
}

absl::Status Load::ConnectAll(const sockaddr_in& server) {
  clients_.resize(o_.connections);
  for (size_t i = 0; i < o_.connections; ++i) {
    Client& c = clients_[i];
    c.index = i;
    c.aborts = i < o_.abort_connections && o_.messages >= 2;
    c.fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (c.fd < 0) return os::PosixError("socket", errno);
    if (::connect(c.fd, reinterpret_cast<const sockaddr*>(&server),
                  sizeof(server)) != 0) {
      return os::PosixError(absl::StrCat("connect to ", o_.target), errno);
    }
    const int one = 1;
    ::setsockopt(c.fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    if (absl::Status st = os::SetNonBlocking(c.fd, true); !st.ok()) return st;
    epoll_event ev{};
    ev.events = EPOLLIN | EPOLLOUT | EPOLLRDHUP | EPOLLET;
    ev.data.ptr = &c;
    if (::epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, c.fd, &ev) != 0) {
      return os::PosixError("epoll_ctl", errno);
    }
    StartMessage(c);
  }
  return absl::OkStatus();
}

absl::Status Load::WaitForEchoes() {
  std::vector<epoll_event> events(256);
  auto last_progress = Clock::now();
  uint64_t last_bytes = bytes_;
  while (remaining_ > 0) {
    const int n = ::epoll_wait(epoll_fd_, events.data(),
                               static_cast<int>(events.size()), 200);
    if (n < 0) {
      if (errno == EINTR) continue;
      return os::PosixError("epoll_wait", errno);
    }
    for (int i = 0; i < n; ++i) {
      Client& c = *static_cast<Client*>(events[i].data.ptr);
      if (c.done) continue;
      if (absl::Status s = Pump(c, events[i].events); !s.ok()) return s;
    }
    const auto now = Clock::now();
    if (bytes_ != last_bytes || n > 0) {
      last_bytes = bytes_;
      last_progress = now;
    } else if (now - last_progress >
               absl::ToChronoNanoseconds(o_.stall_timeout)) {
      size_t waiting = 0;
      for (const Client& c : clients_) waiting += !c.done;
      return absl::DeadlineExceededError(absl::StrCat(
          "no progress for ", absl::FormatDuration(o_.stall_timeout), "; ",
          waiting, " connections unfinished"));
    }
  }
  return absl::OkStatus();
}

EchoLoadResult Load::Summary(Clock::time_point start) {
  EchoLoadResult r;
  r.seconds = std::chrono::duration<double>(Clock::now() - start).count();
  r.messages = latencies_ns_.size();
  r.bytes = bytes_;
  if (!latencies_ns_.empty()) {
    auto pct = [&](double q) {
      const size_t k = std::min(latencies_ns_.size() - 1,
                                static_cast<size_t>(q * latencies_ns_.size()));
      std::nth_element(latencies_ns_.begin(), latencies_ns_.begin() + k,
                       latencies_ns_.end());
      return latencies_ns_[k] / 1e3;
    };
    r.p50_us = pct(0.50);
    r.p99_us = pct(0.99);
    r.max_us =
        *std::max_element(latencies_ns_.begin(), latencies_ns_.end()) / 1e3;
  }
  return r;
}

absl::StatusOr<EchoLoadResult> Load::Run() {
  if (o_.connections == 0 || o_.messages == 0 || o_.min_size == 0 ||
      o_.min_size > o_.max_size) {
    return absl::InvalidArgumentError(
        "need connections >= 1, messages >= 1 and 1 <= min_size <= max_size");
  }
  absl::StatusOr<sockaddr_in> server = ParseTarget(o_.target);
  if (!server.ok()) return server.status();
  FillPattern();
  scratch_.resize(256 * 1024);
  latencies_ns_.reserve(o_.connections * o_.messages);

  epoll_fd_ = ::epoll_create1(EPOLL_CLOEXEC);
  if (epoll_fd_ < 0) return os::PosixError("epoll_create1", errno);
  const auto start = Clock::now();
  if (absl::Status s = ConnectAll(*server); !s.ok()) return s;
  remaining_ = o_.connections;
  for (Client& c : clients_) {
    if (absl::Status s = Pump(c, /*events=*/0); !s.ok()) return s;
  }
  if (absl::Status s = WaitForEchoes(); !s.ok()) return s;
  return Summary(start);
}

}  // namespace

absl::StatusOr<EchoLoadResult> RunEchoLoad(const EchoLoadOptions& options) {
  Load load(options);
  return load.Run();
}

}  // namespace bufpool::net

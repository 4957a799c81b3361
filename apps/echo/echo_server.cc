// EchoServer: options, the listening socket, Stop() and Stats(); the engines
// live in epoll_echo_server.cc and uring_echo_server.cc.
#include "echo/echo_server.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "echo/echo_engines.h"
#include "os/error.h"
#include "os/socket.h"

namespace bufpool {
namespace {

// A bound, listening, non-blocking socket for "HOST:PORT" (IPv4), with
// SO_REUSEPORT when `reuse_port`.
absl::StatusOr<int> Listen(absl::string_view address, bool reuse_port) {
  const size_t colon = address.rfind(':');
  if (colon == absl::string_view::npos) {
    return absl::InvalidArgumentError(
        absl::StrCat("listen address '", address, "' is not HOST:PORT"));
  }
  const std::string host(address.substr(0, colon));
  uint32_t port = 0;
  if (!absl::SimpleAtoi(address.substr(colon + 1), &port) || port > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("listen address '", address, "' has a bad port"));
  }
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_port = htons(static_cast<uint16_t>(port));
  const std::string h = host == "localhost" ? "127.0.0.1" : host;
  if (inet_pton(AF_INET, h.c_str(), &sa.sin_addr) != 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "listen address '", address, "': '", host, "' is not an IPv4 address"));
  }
  absl::StatusOr<int> fd = os::Socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
  if (!fd.ok()) return fd.status();
  (void)os::SetSockOptInt(*fd, SOL_SOCKET, SO_REUSEADDR, 1, "SO_REUSEADDR");
  absl::Status s = reuse_port ? os::SetSockOptInt(*fd, SOL_SOCKET, SO_REUSEPORT,
                                                  1, "SO_REUSEPORT")
                              : absl::OkStatus();
  if (s.ok()) s = os::Bind(*fd, reinterpret_cast<sockaddr*>(&sa), sizeof(sa));
  if (s.ok()) s = os::Listen(*fd, SOMAXCONN);
  if (!s.ok()) {
    (void)os::CloseSocket(*fd);
    return absl::Status(s.code(),
                        absl::StrCat("listen on ", address, ": ", s.message()));
  }
  return *fd;
}

}  // namespace

absl::string_view EchoEngineName(EchoEngine engine) {
  switch (engine) {
    case EchoEngine::kUring:
      return "uring";
    case EchoEngine::kEpoll:
      return "epoll";
    case EchoEngine::kMalloc:
      return "malloc";
  }
  return "?";
}

std::optional<EchoEngine> ParseEchoEngine(absl::string_view name) {
  for (EchoEngine e :
       {EchoEngine::kUring, EchoEngine::kEpoll, EchoEngine::kMalloc}) {
    if (name == EchoEngineName(e)) return e;
  }
  return std::nullopt;
}

EchoServer::EchoServer() : counters_(std::make_unique<Counters>()) {}

EchoServer::~EchoServer() {
  if (listen_fd_ >= 0) (void)os::CloseSocket(listen_fd_);
  if (stop_fd_ >= 0) (void)os::CloseSocket(stop_fd_);
}

absl::StatusOr<std::unique_ptr<EchoServer>> EchoServer::Create(
    const EchoServerOptions& options) {
  if (options.pool == nullptr) {
    return absl::InvalidArgumentError("EchoServerOptions.pool is required");
  }
  if (options.max_unsent_bytes == 0) {
    return absl::InvalidArgumentError(
        "EchoServerOptions.max_unsent_bytes must be > 0");
  }
  absl::StatusOr<int> listen_fd = Listen(options.listen, options.reuse_port);
  if (!listen_fd.ok()) return listen_fd.status();
  absl::StatusOr<int> stop = os::EventFd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (!stop.ok()) {
    (void)os::CloseSocket(*listen_fd);
    return stop.status();
  }
  const int stop_fd = *stop;

  std::unique_ptr<EchoServer> server;
  std::string fallback_reason;
  if (options.engine == EchoEngine::kUring) {
    absl::StatusOr<std::unique_ptr<EchoServer>> uring =
        net::MakeUringEchoServer(options);
    if (uring.ok()) {
      server = *std::move(uring);
    } else if (options.fallback_to_epoll) {
      fallback_reason = std::string(uring.status().message());
      EchoServerOptions epoll = options;
      epoll.engine = EchoEngine::kEpoll;
      server = net::MakeEpollEchoServer(epoll);
    } else {
      (void)os::CloseSocket(*listen_fd);
      (void)os::CloseSocket(stop_fd);
      return uring.status();
    }
  } else {
    server = net::MakeEpollEchoServer(options);
  }
  server->listen_fd_ = *listen_fd;
  server->stop_fd_ = stop_fd;
  server->fallback_reason_ = std::move(fallback_reason);

  sockaddr_in sa{};
  socklen_t len = sizeof(sa);
  if (absl::Status st =
          os::GetSockName(*listen_fd, reinterpret_cast<sockaddr*>(&sa), &len);
      !st.ok()) {
    return st;
  }
  char host[INET_ADDRSTRLEN] = {};
  ::inet_ntop(AF_INET, &sa.sin_addr, host, sizeof(host));
  server->port_ = ntohs(sa.sin_port);
  server->local_address_ = absl::StrCat(host, ":", server->port_);
  return server;
}

void EchoServer::Stop() {
  const uint64_t one = 1;
  // Async-signal-safe; a full counter (impossible in practice) still wakes.
  const iovec iov = {const_cast<uint64_t*>(&one), sizeof(one)};
  [[maybe_unused]] ssize_t n = ::writev(stop_fd_, &iov, 1);
}

EchoServerStats EchoServer::Stats() const {
  const Counters& c = *counters_;
  auto get = [](const std::atomic<uint64_t>& a) {
    return a.load(std::memory_order_relaxed);
  };
  EchoServerStats s;
  s.connections_accepted = get(c.connections_accepted);
  s.connections_open = get(c.connections_open);
  s.bytes_received = get(c.bytes_received);
  s.bytes_sent = get(c.bytes_sent);
  s.buffers_holding_data = get(c.buffers_holding_data);
  s.buffers_holding_data_high_water = get(c.buffers_holding_data_high_water);
  s.pool_dry_stalls = get(c.pool_dry_stalls);
  s.unsent_limit_stalls = get(c.unsent_limit_stalls);
  return s;
}

}  // namespace bufpool

// The echo server, in process on loopback, for each engine: many clients,
// random lengths, byte-exact echoes (checked by the load client), abrupt
// disconnects, a client that never reads, a pool far smaller than the load,
// every buffer back at the end; and the bufpool-echo tool's graceful stop.
#include "echo/echo_server.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "bufpool/chain.h"
#include "echo/echo_engines.h"
#include "echo/echo_load.h"
#include "gtest/gtest.h"
#include "test_util.h"

namespace bufpool {
namespace {

// Sanitizer builds run the same shapes with fewer messages.
constexpr size_t Scale(size_t n) {
  return testing_util::kSanitized ? (n + 3) / 4 : n;
}

constexpr size_t kMiB = 1 << 20;

using testing_util::Child;
using testing_util::Eventually;
using testing_util::RaiseFileLimit;
using testing_util::UniqueFd;

// A pool and a server running on its own thread.
class Running {
 public:
  Running(EchoEngine engine, PoolOptions pool_options,
          size_t max_unsent = 256 * 1024) {
    pool_options.populate = false;
    auto pool = BufferPool::Create(pool_options);
    EXPECT_TRUE(pool.ok()) << pool.status();
    pool_ = *std::move(pool);
    EchoServerOptions o;
    o.engine = engine;
    o.pool = pool_.get();
    o.max_unsent_bytes = max_unsent;
    o.fallback_to_epoll = false;  // the uring tests must test uring
    auto server = EchoServer::Create(o);
    EXPECT_TRUE(server.ok()) << server.status();
    server_ = *std::move(server);
    thread_ = std::thread([this] { run_status_ = server_->Run(); });
  }

  ~Running() {
    if (thread_.joinable()) Stop();
  }

  // Stops the server and checks that every buffer went back to the pool.
  void Stop() {
    server_->Stop();
    thread_.join();
    EXPECT_TRUE(run_status_.ok()) << run_status_;
    EXPECT_EQ(server_->Stats().connections_open, 0u);
    EXPECT_EQ(server_->Stats().buffers_holding_data, 0u);
    EXPECT_EQ(pool_->Stats().in_use, 0u);
  }

  // After clients leave: no connection open, no buffer holding data, and
  // (engines that hold buffers only for data) nothing taken from the pool.
  void ExpectIdle() {
    EXPECT_TRUE(Eventually([&] {
      const EchoServerStats s = server_->Stats();
      return s.connections_open == 0 && s.buffers_holding_data == 0;
    })) << "open="
        << server_->Stats().connections_open
        << " holding=" << server_->Stats().buffers_holding_data;
    if (server_->engine() != EchoEngine::kUring) {
      EXPECT_EQ(pool_->Stats().in_use, 0u);
    }
  }

  net::EchoLoadOptions Load(size_t connections, size_t messages,
                            size_t min_size, size_t max_size,
                            uint64_t seed) const {
    net::EchoLoadOptions o;
    o.target = server_->local_address();
    o.connections = connections;
    o.messages = messages;
    o.min_size = min_size;
    o.max_size = max_size;
    o.seed = seed;
    return o;
  }

  EchoServer& server() { return *server_; }
  BufferPool& pool() { return *pool_; }

 private:
  std::unique_ptr<BufferPool> pool_;
  std::unique_ptr<EchoServer> server_;
  std::thread thread_;
  absl::Status run_status_;
};

class EchoServerTest : public testing::TestWithParam<EchoEngine> {};

void ExpectEchoed(const net::EchoLoadOptions& o) {
  absl::StatusOr<net::EchoLoadResult> r = net::RunEchoLoad(o);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->messages, o.connections * o.messages);
}

TEST_P(EchoServerTest, EchoesOneClientByteExact) {
  Running s(GetParam(), {.buffer_count = 1024});
  ExpectEchoed(s.Load(1, Scale(40), 1, kMiB, 101));
  s.ExpectIdle();
  const EchoServerStats st = s.server().Stats();
  EXPECT_EQ(st.bytes_received, st.bytes_sent);
  EXPECT_EQ(st.connections_accepted, 1u);
  s.Stop();
}

TEST_P(EchoServerTest, Echoes64ConcurrentClientsByteExact) {
  Running s(GetParam(), {.buffer_count = 1024});
  ExpectEchoed(s.Load(64, Scale(8), 1, kMiB, 202));
  s.ExpectIdle();
  EXPECT_EQ(s.server().Stats().connections_accepted, 64u);
  s.Stop();
}

TEST_P(EchoServerTest, Echoes512ConcurrentClientsByteExact) {
  RaiseFileLimit(4096);
  Running s(GetParam(), {.buffer_count = 1024});
  // Up to 256 KiB each and few messages, so the total stays ~128 MiB.
  ExpectEchoed(s.Load(512, testing_util::kSanitized ? 1 : 2, 1, kMiB / 4, 303));
  s.ExpectIdle();
  EXPECT_EQ(s.server().Stats().connections_accepted, 512u);
  s.Stop();
}

// kUring arms a plain recv for peers whose messages fit a slot and a bundle
// for peers that send more, switching (cancel, re-arm) as the sizes change:
// small, then large, then small messages on the same server all come back.
TEST_P(EchoServerTest, MessageSizesThatChangeStayByteExact) {
  Running s(GetParam(), {.buffer_count = 1024});
  ExpectEchoed(s.Load(8, Scale(64), 1, 4096, 501));
  ExpectEchoed(s.Load(8, Scale(32), 64 * 1024, 256 * 1024, 502));
  ExpectEchoed(s.Load(8, Scale(64), 1, 4096, 503));
  ExpectEchoed(s.Load(8, Scale(32), 1, 256 * 1024, 504));
  s.ExpectIdle();
  s.Stop();
}

TEST_P(EchoServerTest, HalfCloseGetsEverythingBackThenEndOfStream) {
  Running s(GetParam(), {.buffer_count = 256});
  net::EchoLoadOptions o = s.Load(8, 3, 1, 256 * 1024, 404);
  o.half_close = true;
  ExpectEchoed(o);
  s.ExpectIdle();
  s.Stop();
}

TEST_P(EchoServerTest, AbruptDisconnectsMidMessageLeaveOthersServed) {
  Running s(GetParam(), {.buffer_count = 256});
  net::EchoLoadOptions o = s.Load(32, Scale(16), 1024, 512 * 1024, 505);
  o.abort_connections = 12;  // reset halfway through their second message
  absl::StatusOr<net::EchoLoadResult> r = net::RunEchoLoad(o);
  ASSERT_TRUE(r.ok()) << r.status();
  // The aborting ones finished one message each; the others all of theirs.
  EXPECT_EQ(r->messages, 12 + 20 * o.messages);
  s.ExpectIdle();
  // And the server still serves newcomers.
  ExpectEchoed(s.Load(4, 4, 1, 64 * 1024, 506));
  s.ExpectIdle();
  s.Stop();
}

TEST_P(EchoServerTest, ALimitBelowOneBufferStillMovesABufferPerRead) {
  // max_unsent_bytes 1 with 64-byte buffers: every read takes a connection
  // over its limit, but a read still fills at least one whole buffer (the
  // uring engine once capped its recvs at the 1 byte of room left, one
  // byte per round trip). On kernels before 6.17, without the multishot byte
  // cap, the uring engine's single-shot recvs near the limit are checked
  // instead.
  Running s(GetParam(), {.buffer_size = 64, .buffer_count = 256},
            /*max_unsent=*/1);
  ExpectEchoed(s.Load(2, 4, 16 * 1024, 16 * 1024, 707));
  s.ExpectIdle();
  const EchoServerStats st = s.server().Stats();
  EXPECT_EQ(st.bytes_received, 2 * 4 * 16 * 1024u);
  EXPECT_GT(st.unsent_limit_stalls, 0u);
  EXPECT_LE(st.unsent_limit_stalls, 2 * st.bytes_received / 64 + 64)
      << "reads of less than a buffer";
  s.Stop();
}

TEST_P(EchoServerTest, PoolFarSmallerThanTheLoad) {
  // 16 buffers of 4 KiB (64 KiB) against 64 clients with up to 1 MiB in
  // flight each: the server must stall reads, never drop or reorder bytes.
  Running s(GetParam(), {.buffer_count = 16, .cache_size = 0});
  ExpectEchoed(s.Load(64, Scale(4), 1, kMiB, 606));
  s.ExpectIdle();
  const EchoServerStats st = s.server().Stats();
  if (GetParam() != EchoEngine::kMalloc) {
    EXPECT_LE(st.buffers_holding_data_high_water, 16u);
  }
  if (GetParam() == EchoEngine::kUring) {
    // The ring (16 slots) empties at once under this load. (kEpoll holds a
    // buffer only until its writev, so it runs dry only when writes block.)
    EXPECT_GT(st.pool_dry_stalls, 0u);
  }
  s.Stop();
}

// A connected socket that sends `bytes` (as much as the kernel takes without
// blocking) and never reads.
UniqueFd ConnectNonReader(const std::string& address, size_t bytes) {
  const size_t colon = address.rfind(':');
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_port =
      htons(static_cast<uint16_t>(std::stoi(address.substr(colon + 1))));
  inet_pton(AF_INET, address.substr(0, colon).c_str(), &sa.sin_addr);
  UniqueFd conn(socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (!conn.valid()) return conn;
  const int fd = conn.get();
  if (connect(fd, reinterpret_cast<sockaddr*>(&sa), sizeof(sa)) != 0) {
    return UniqueFd();
  }
  fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
  std::vector<char> junk(64 * 1024, 'x');
  size_t sent = 0;
  int idle = 0;
  while (sent < bytes && idle < 50) {
    const ssize_t n = send(fd, junk.data(), std::min(junk.size(), bytes - sent),
                           MSG_NOSIGNAL);
    if (n > 0) {
      sent += n;
      idle = 0;
    } else {
      ++idle;  // the server stopped reading: give it a moment, then stop
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
  }
  return conn;
}

TEST_P(EchoServerTest, NonReadingClientIsCappedAndOthersFinish) {
  constexpr size_t kLimit = 64 * 1024;
  constexpr size_t kBufferSize = 4096;
  Running s(GetParam(), {.buffer_size = kBufferSize, .buffer_count = 512},
            kLimit);
  UniqueFd hog = ConnectNonReader(s.server().local_address(), 64 * kMiB);
  ASSERT_TRUE(hog.valid());
  ASSERT_TRUE(
      Eventually([&] { return s.server().Stats().unsent_limit_stalls > 0; }));
  ExpectEchoed(s.Load(16, Scale(20), 1, 256 * 1024, 707));
  // Only the hog is left: what the server holds for it is bounded by the
  // limit (plus the last read: one readv, or one recv's slot).
  ASSERT_TRUE(
      Eventually([&] { return s.server().Stats().connections_open == 1; }));
  const EchoServerStats st = s.server().Stats();
  const size_t bound_buffers = kLimit / kBufferSize + kEchoReadBuffers;
  EXPECT_LE(st.buffers_holding_data, bound_buffers);
  EXPECT_LE(st.bytes_received - st.bytes_sent,
            kLimit + kEchoReadBuffers * kBufferSize);
  hog.reset();
  s.ExpectIdle();
  s.Stop();
}

TEST_P(EchoServerTest, StopClosesOpenConnections) {
  Running s(GetParam(), {.buffer_count = 64});
  const UniqueFd idle_conn = ConnectNonReader(s.server().local_address(), 1000);
  ASSERT_TRUE(idle_conn.valid());
  const int idle = idle_conn.get();
  ASSERT_TRUE(
      Eventually([&] { return s.server().Stats().bytes_received == 1000; }));
  s.Stop();  // checks in_use == 0 and no connection open
  char c;
  // The server closed it: end of stream after the echo, or a reset.
  fcntl(idle, F_SETFL, fcntl(idle, F_GETFL) & ~O_NONBLOCK);
  ssize_t n;
  size_t echoed = 0;
  while ((n = recv(idle, &c, 1, 0)) > 0) echoed += n;
  EXPECT_LE(echoed, 1000u);
}

INSTANTIATE_TEST_SUITE_P(Engines, EchoServerTest,
                         testing::Values(EchoEngine::kUring, EchoEngine::kEpoll,
                                         EchoEngine::kMalloc),
                         [](const testing::TestParamInfo<EchoEngine>& info) {
                           return std::string(EchoEngineName(info.param));
                         });

// kUring lends pool slots to the kernel's buffer ring as the load needs
// them, not the whole pool at once: the ring is a FIFO, so every lent slot
// is written in turn, and a small ring keeps those slots warm in the cache.
TEST(UringEchoServerTest, LendsRingSlotsAsTheLoadNeedsThem) {
  Running s(EchoEngine::kUring, {.buffer_count = 8192});
  // One client, one small message at a time: a few slots carry data at once.
  ExpectEchoed(s.Load(1, Scale(200), 1, 4096, 404));
  s.ExpectIdle();
  const uint64_t small = s.pool().Stats().in_use;
  EXPECT_GT(small, 0u);
  EXPECT_LT(small, 8192u / 4);
  // 64 clients with up to 1 MiB each in flight: the ring grows to carry them
  // (up to 64 x 256 KiB unsent), and every byte still comes back.
  ExpectEchoed(s.Load(64, Scale(4), kMiB / 2, kMiB, 405));
  s.ExpectIdle();
  EXPECT_GT(s.pool().Stats().in_use, small);
  EXPECT_LE(s.pool().Stats().in_use, 8192u);
  s.Stop();
}

// The checker itself: a "server" that echoes everything but corrupts one
// byte must be caught, or the byte-exact tests above prove nothing.
TEST(EchoLoadTest, ReportsACorruptedEcho) {
  sockaddr_in sa;
  const UniqueFd listen_fd = testing_util::ListenOnLoopback(1, &sa);
  ASSERT_TRUE(listen_fd.valid());
  const int listener = listen_fd.get();
  std::thread bad([listener] {
    const UniqueFd conn(accept(listener, nullptr, nullptr));
    if (!conn.valid()) return;
    const int fd = conn.get();
    char buf[4096];
    size_t total = 0;
    ssize_t n;
    while ((n = recv(fd, buf, sizeof(buf), 0)) > 0) {
      // Flip byte 5000 of the stream.
      if (total <= 5000 && 5000 < total + n) buf[5000 - total] ^= 0x40;
      total += n;
      if (send(fd, buf, n, MSG_NOSIGNAL) != n) break;
    }
  });
  net::EchoLoadOptions o;
  o.target = "127.0.0.1:" + std::to_string(ntohs(sa.sin_port));
  o.connections = 1;
  o.messages = 4;
  o.min_size = 3000;
  o.max_size = 3000;
  absl::StatusOr<net::EchoLoadResult> r = net::RunEchoLoad(o);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kDataLoss) << r.status();
  // Stream byte 5000 is byte 2000 of the second message.
  EXPECT_NE(r.status().message().find("message 1 (3000 bytes) differs at "
                                      "byte 2000"),
            std::string::npos)
      << r.status();
  shutdown(listener, SHUT_RDWR);
  bad.join();
}

TEST(EchoServerOptionsTest, RejectsBadOptions) {
  auto pool = BufferPool::Create({.buffer_count = 8, .populate = false});
  ASSERT_TRUE(pool.ok());
  EchoServerOptions o;
  EXPECT_EQ(EchoServer::Create(o).status().code(),
            absl::StatusCode::kInvalidArgument);  // no pool
  o.pool = pool->get();
  o.listen = "127.0.0.1";
  EXPECT_EQ(EchoServer::Create(o).status().code(),
            absl::StatusCode::kInvalidArgument);
  o.listen = "not-an-ip:0";
  EXPECT_EQ(EchoServer::Create(o).status().code(),
            absl::StatusCode::kInvalidArgument);
  o.listen = "127.0.0.1:0";
  o.max_unsent_bytes = 0;
  EXPECT_EQ(EchoServer::Create(o).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ParseEchoEngine("uring").value(), EchoEngine::kUring);
  EXPECT_EQ(ParseEchoEngine("kqueue"), std::nullopt);
}

TEST(EchoServerOptionsTest, UringUnavailableFallsBackToEpollOrFails) {
  auto pool = BufferPool::Create({.buffer_count = 8, .populate = false});
  ASSERT_TRUE(pool.ok());
  ASSERT_EQ(setenv("BUFPOOL_DISABLE_IO_URING", "1", 1), 0);
  auto server =
      EchoServer::Create({.engine = EchoEngine::kUring, .pool = pool->get()});
  auto strict = EchoServer::Create({.engine = EchoEngine::kUring,
                                    .pool = pool->get(),
                                    .fallback_to_epoll = false});
  unsetenv("BUFPOOL_DISABLE_IO_URING");
  ASSERT_TRUE(server.ok()) << server.status();
  EXPECT_EQ((*server)->engine(), EchoEngine::kEpoll);
  EXPECT_NE((*server)->fallback_reason().find("io_uring is unavailable"),
            std::string::npos);
  EXPECT_EQ(strict.status().code(), absl::StatusCode::kUnavailable);
  // And it serves.
  std::thread t([&] { EXPECT_TRUE((*server)->Run().ok()); });
  net::EchoLoadOptions o;
  o.target = (*server)->local_address();
  o.messages = 3;
  EXPECT_TRUE(net::RunEchoLoad(o).ok());
  (*server)->Stop();
  t.join();
}

TEST(EchoServerOptionsTest, StopBeforeRunReturnsAtOnce) {
  auto pool = BufferPool::Create({.buffer_count = 8, .populate = false});
  ASSERT_TRUE(pool.ok());
  for (EchoEngine e : {EchoEngine::kUring, EchoEngine::kEpoll}) {
    auto server = EchoServer::Create({.engine = e, .pool = pool->get()});
    ASSERT_TRUE(server.ok()) << server.status();
    (*server)->Stop();
    EXPECT_TRUE((*server)->Run().ok());
    EXPECT_EQ((*pool)->Stats().in_use, 0u);
  }
}

#ifdef BUFPOOL_ECHO_BINARY
// Runs bufpool-echo with `args`, its stdout on a pipe.
Child Spawn(std::vector<std::string> args) {
  args.insert(args.begin(), BUFPOOL_ECHO_BINARY);
  return testing_util::StartChild(BUFPOOL_ECHO_BINARY, args);
}

std::string ReadLine(FILE* f) {
  char line[512];
  if (fgets(line, sizeof(line), f) == nullptr) return "";
  return line;
}

class EchoToolTest : public testing::TestWithParam<EchoEngine> {};

TEST_P(EchoToolTest, SigtermStopsGracefullyWithASummary) {
  Child child = Spawn({absl::StrCat("--engine=", EchoEngineName(GetParam())),
                       "--buffer-count=64"});
  ASSERT_GT(child.pid, 0);
  FILE* out = child.out.get();
  const std::string first = ReadLine(out);
  ASSERT_EQ(first.rfind("listening on 127.0.0.1:", 0), 0u) << first;
  std::string address = first.substr(strlen("listening on "));
  address.pop_back();  // '\n'
  net::EchoLoadOptions o;
  o.target = address;
  o.connections = 4;
  o.messages = 10;
  o.max_size = 100 * 1000;
  absl::StatusOr<net::EchoLoadResult> r = net::RunEchoLoad(o);
  EXPECT_TRUE(r.ok()) << r.status();
  // One client still connected when the signal comes: it is closed.
  const UniqueFd open = ConnectNonReader(address, 10);
  ASSERT_EQ(kill(child.pid, SIGTERM), 0);
  const int status = child.Wait();
  ASSERT_TRUE(WIFEXITED(status)) << status;
  EXPECT_EQ(WEXITSTATUS(status), 0);
  const std::string summary = ReadLine(out);
  EXPECT_EQ(summary.rfind("stopped: engine=", 0), 0u) << summary;
  EXPECT_NE(summary.find("connections=5 "), std::string::npos) << summary;
  EXPECT_NE(summary.find("open=0 "), std::string::npos) << summary;
  EXPECT_NE(summary.find("pool_high_water="), std::string::npos) << summary;
}

INSTANTIATE_TEST_SUITE_P(Engines, EchoToolTest,
                         testing::Values(EchoEngine::kUring, EchoEngine::kEpoll,
                                         EchoEngine::kMalloc),
                         [](const testing::TestParamInfo<EchoEngine>& info) {
                           return std::string(EchoEngineName(info.param));
                         });

TEST(EchoToolFlagsTest, UnknownFlagIsAUsageErrorExitTwo) {
  Child child = Spawn({"--frobnicate=1"});
  ASSERT_GT(child.pid, 0);
  const int status = child.Wait();
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 2);
  // Nothing on stdout; the error is on stderr.
  EXPECT_EQ(ReadLine(child.out.get()), "");
}
#endif  // BUFPOOL_ECHO_BINARY

// buffers_holding_data counts buffers, not slices: slices of one buffer
// (a cut, or a run taken from one incremental buffer) count once, a
// buffer kept empty as room not at all.
TEST(EchoHoldingTest, CountsDistinctBuffersNotSlices) {
  auto pool = BufferPool::Create({.buffer_count = 8, .cache_size = 0});
  ASSERT_TRUE(pool.ok());
  const size_t bs = (*pool)->buffer_size();
  BufferChain chain(**pool);
  ASSERT_TRUE(chain.Append(std::string(bs + 100, 'x')).ok());  // 2 buffers
  ASSERT_EQ(chain.slice_count(), 2u);
  // Cut the first buffer's bytes into three adjacent slices of it.
  BufferChain a = chain.Split(10);
  BufferChain b = chain.Split(20);
  b.Append(std::move(chain));
  a.Append(std::move(b));
  ASSERT_EQ(a.slice_count(), 4u);
  EXPECT_EQ(net::BuffersHoldingData(a), 2u);
  EXPECT_EQ((*pool)->Stats().in_use, 2u);
  a.Consume(a.size());
  EXPECT_EQ(net::BuffersHoldingData(a), 0u);
  EXPECT_EQ((*pool)->Stats().in_use, 0u);
}

}  // namespace
}  // namespace bufpool

// libbufpool: a TCP echo server whose receive buffers are pool slots.
//
// EchoServer is the pattern for embedding a BufferPool in network I/O, and a
// load target for measuring it. Every byte a client sends comes back to it, in
// order, whatever the engine and whatever the pool's state. Three engines
// behave identically on the wire:
//
//   kUring   io_uring, written on bufpool/uring.h: one multishot accept;
//            per connection one multishot recv that takes its buffers from
//            a ProvidedBufferRing of pool slots (for a peer whose messages
//            span several slots, one completion may fill several, "bundle",
//            where the kernel offers it); the received BufferChain is
//            echoed from the same slots (HeldSend: send or sendmsg), and
//            each slot goes back to the pool when its bytes are sent, to be
//            lent to the ring again. No copy, no allocation per message.
//
//              pool slots --lent--> buffer ring --kernel fills--> recv CQE
//                  ^                                                 |
//                  +---- pool <--- send CQE <--- sendmsg(chain) <----+
//
//   kEpoll   epoll, non-blocking sockets, readv() into pool buffers taken
//            per read, sendmsg() of the queued slots, released when sent.
//   kMalloc  the baseline people write: like kEpoll, but every read goes to
//            a freshly allocated buffer that is freed once it is sent.
//
// Backpressure. A connection whose unsent bytes (received, not yet echoed)
// reach `max_unsent_bytes` is not read from until they drain to half of it,
// so a client that sends but never reads cannot make the server buffer
// without bound. kUring and kEpoll count them as the buffers they pin, in a
// budget per connection (bufpool/budget.h: max_unsent_bytes rounded up to
// whole buffers, its watermarks the limit and half of it), so the pool's
// metrics (bufpool-echo --metrics-every) show each connection's share;
// kMalloc counts bytes. A read takes at most the room left rounded up to whole
// pool buffers, so a stalled connection holds at most about
// max_unsent_bytes / buffer_size + 1 buffers (kMalloc holds allocations
// instead, up to kEchoReadBuffers buffer sizes per read). Other clients keep
// being served as long as the pool holds more than the stalled connections
// may keep: size it for connections x that many buffers (plus, for kUring,
// the ring's slots). A smaller pool is safe but not fair: connections that
// stop reading can hold every buffer, and then no connection is read from
// until one of them reads. When the pool (or the ring) runs dry the server
// stops receiving and resumes as slots return; it never spins. Memory is the
// pool plus a small fixed state per connection.
// kUring arms each multishot recv with the kernel's total-bytes cap set to
// the room left under the limit rounded up to whole pool buffers (Linux
// 6.17+), so the kernel itself stops filling slots for a connection at the
// first buffer boundary at or past its limit; on older kernels it falls back
// to single-shot recvs above half the limit, and the multishot may overshoot
// by the slots filled before its cancel landed.
//
// Pool accounting. kEpoll holds pool buffers only while they carry unsent
// data, so pool in_use returns to 0 as soon as clients leave. kUring lends
// slots to the kernel's ring as the load needs them (64 at first, doubling
// while less than a quarter of them are free, up to `ring_buffers`) and keeps
// them for as long as Run() runs (they count as in use);
// Stats().buffers_holding_data is 0 when clients have left, and every slot
// returns to the pool before Run() returns.
//
// Thread safety. Run() serves every connection on the calling thread; call it
// once. Stop(), Stats(), local_address() and port() may be called from any
// thread while Run() runs; Stop() is also async-signal-safe (it writes to an
// eventfd). The pool may be shared with other users (all BufferPool methods
// are thread-safe), but kUring needs its slots: give it a pool of its own or
// set `ring_buffers`.
//
// Ownership. The caller owns the pool and must keep it alive until the
// EchoServer is destroyed. The server owns its sockets, ring and eventfd.
//
// Example (see apps/echo/bufpool_echo.cc for a full program):
//
//   auto pool = bufpool::BufferPool::Create({.buffer_count = 4096});
//   auto server = bufpool::EchoServer::Create(
//       {.listen = "127.0.0.1:0", .engine = bufpool::EchoEngine::kUring,
//        .pool = pool->get()});
//   std::thread t([&] { (void)(*server)->Run(); });
//   ...  // clients connect to (*server)->local_address()
//   (*server)->Stop();
//   t.join();
#ifndef BUFPOOL_APPS_ECHO_ECHO_SERVER_H_
#define BUFPOOL_APPS_ECHO_ECHO_SERVER_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "bufpool/buffer_pool.h"

namespace bufpool {

enum class EchoEngine { kUring, kEpoll, kMalloc };

// "uring", "epoll", "malloc" (a view of a string literal: it never
// dangles). Shaped as CopyMethodName()/ParseCopyMethod() are.
absl::string_view EchoEngineName(EchoEngine engine);
// The inverse of EchoEngineName(); nullopt for anything else.
std::optional<EchoEngine> ParseEchoEngine(absl::string_view name);

struct EchoServerOptions {
  // "HOST:PORT" with an IPv4 host; port 0 picks a free port.
  std::string listen = "127.0.0.1:0";
  EchoEngine engine = EchoEngine::kUring;
  // Required for every engine (kMalloc reads pool->buffer_size() *
  // kEchoReadBuffers bytes per read but takes no buffer from it). Not owned.
  BufferPool* pool = nullptr;
  // Per connection: stop reading past this many unsent bytes.
  size_t max_unsent_bytes = 256 * 1024;
  // kUring: the most slots lent to the kernel's buffer ring (lent as the
  // load needs them); 0 means as many as the pool gives, up to 32768 (the
  // ring's limit). Any slot can be lent (the ring's buffer ids are its own).
  size_t ring_buffers = 0;
  // kUring: when io_uring is unavailable, Create() falls back to kEpoll
  // (engine() and fallback_reason() say so) instead of failing. Setting the
  // environment variable BUFPOOL_DISABLE_IO_URING=1 makes io_uring count as
  // unavailable.
  bool fallback_to_epoll = true;
  // SO_REUSEPORT on the listener: several servers (in several processes)
  // listen on one port and the kernel spreads new connections among them;
  // when one closes, the others take its share (bufpool-echo --workers).
  bool reuse_port = false;
};

// Buffers one read fills at most (kEpoll: iovecs per readv; kMalloc: the
// allocation per read is this many pool-buffer sizes; kUring: recv CQEs per
// connection between backpressure checks is not bounded by it).
inline constexpr size_t kEchoReadBuffers = 16;

struct EchoServerStats {
  uint64_t connections_accepted = 0;
  uint64_t connections_open = 0;
  uint64_t bytes_received = 0;
  uint64_t bytes_sent = 0;
  // Pool buffers (or, for kMalloc, allocations) that carry unsent data now,
  // and the most seen at once.
  uint64_t buffers_holding_data = 0;
  uint64_t buffers_holding_data_high_water = 0;
  // Times a read was postponed because the pool/ring was dry, or because a
  // connection was over max_unsent_bytes.
  uint64_t pool_dry_stalls = 0;
  uint64_t unsent_limit_stalls = 0;
};

class EchoServer {
 public:
  // Validates the options, binds and listens (so local_address() is known
  // before Run()), and sets up the engine. Errors: InvalidArgument for bad
  // options, the OS's words for socket/io_uring failures.
  static absl::StatusOr<std::unique_ptr<EchoServer>> Create(
      const EchoServerOptions& options);

  virtual ~EchoServer();
  EchoServer(const EchoServer&) = delete;
  EchoServer& operator=(const EchoServer&) = delete;

  // Serves until Stop(): accepts, echoes. On Stop() it stops accepting,
  // closes every open connection, returns every buffer and returns OK.
  // An error only for a failure of the event loop itself.
  virtual absl::Status Run() = 0;
  // Asks Run() to finish; returns at once. Thread- and async-signal-safe.
  // Calling it before Run() makes Run() return at once.
  void Stop();

  EchoServerStats Stats() const;
  // "HOST:PORT" actually bound (the real port when 0 was asked for).
  const std::string& local_address() const { return local_address_; }
  uint16_t port() const { return port_; }
  // The engine that runs (kEpoll after a fallback from kUring).
  EchoEngine engine() const { return engine_; }
  // Why kUring fell back to kEpoll; empty when it did not.
  const std::string& fallback_reason() const { return fallback_reason_; }

 protected:
  struct Counters;
  EchoServer();

  int listen_fd_ = -1;
  int stop_fd_ = -1;  // eventfd written by Stop()
  std::string local_address_;
  uint16_t port_ = 0;
  EchoEngine engine_ = EchoEngine::kEpoll;
  std::string fallback_reason_;
  std::unique_ptr<Counters> counters_;
};

}  // namespace bufpool

#endif  // BUFPOOL_APPS_ECHO_ECHO_SERVER_H_

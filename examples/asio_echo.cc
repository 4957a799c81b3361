// An Asio echo server whose bytes live in libbufpool buffers: a session
// waits for its socket to be readable, then reads what is there into pool
// buffers (bufpool::AsioReadSome: large reads linked, small ones copied
// into the chain's tail, so memory follows bytes), and writes the chain
// back with asio::async_write (bufpool::AsioBuffers). One read in flight
// per session. When the pool is dry a session waits for the next free
// buffer (bufpool::AsioFreeBufferWaiter: BufferPool::NotifyWhenFree() on
// an eventfd, no timer) instead of failing. Each session's chains are bound
// to a budget (bufpool/budget.h): at kMaxUnsent bytes held (its high
// watermark) the session stops reading, and reads again once its writes
// have drained it to a quarter of that (the low one).
//
//   asio_echo [PORT [BUFFERS]]  # default 7007 and 4096 buffers of 4 KiB,
//                               # on 127.0.0.1; Ctrl-C to stop
//   printf 'hello' | nc -q1 127.0.0.1 7007
//
// It says once when the pool first runs dry, and on SIGINT/SIGTERM how
// often sessions waited for a buffer and how many buffers are still out.
#include <asio.hpp>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <optional>
#include <string>

#include "bufpool/asio.h"
#include "bufpool/budget.h"
#include "bufpool/buffer_pool.h"
#include "bufpool/chain.h"

namespace {

constexpr size_t kReadBytes = 64 * 1024;
constexpr size_t kMaxUnsent = 256 * 1024;

size_t buffer_waits = 0;  // sessions that found the pool dry (one thread)

class Session : public std::enable_shared_from_this<Session> {
 public:
  // A session with its budget; nullptr (and the socket closed) when the
  // budget cannot be made.
  static std::shared_ptr<Session> Make(asio::ip::tcp::socket socket,
                                       bufpool::BufferPool& pool) {
    auto session =
        std::shared_ptr<Session>(new Session(std::move(socket), pool));
    Session* s = session.get();
    auto budget = pool.CreateBudget(
        {.name = "session " + std::to_string(s->socket_.native_handle()),
         .max_bytes = kMaxUnsent + kReadBytes,  // a read past the mark
         .high_watermark = kMaxUnsent,
         .low_watermark = kMaxUnsent / 4,
         .on_high = [s] { s->paused_ = true; },    // Read() checks it
         .on_low = [s] { s->paused_ = false; }});  // Write() reads again
    if (!budget.ok()) {
      std::fprintf(stderr, "asio_echo: %s\n",
                   budget.status().ToString().c_str());
      return nullptr;
    }
    s->budget_ = *std::move(budget);
    s->sending_ = bufpool::BufferChain(*s->budget_);
    s->received_ = bufpool::BufferChain(*s->budget_);
    return session;
  }

  void Start() {
    socket_.non_blocking(true, ignored_);  // AsioReadSome must not block
    Read();
  }

 private:
  Session(asio::ip::tcp::socket socket, bufpool::BufferPool& pool)
      : socket_(std::move(socket)), pool_(pool) {}

  // At most one read in flight per session (reading_): a wait for
  // readability (or for a free buffer), then one AsioReadSome() of what the
  // socket holds, so an idle session pins no buffer and a slow one never
  // piles up reads.
  void Read() {
    if (reading_ || eof_ || paused_) return;
    reading_ = true;
    socket_.async_wait(asio::socket_base::wait_read,
                       [self = shared_from_this()](asio::error_code ec) {
                         self->reading_ = false;
                         if (ec) return self->Finish();
                         self->ReadReady();
                       });
  }

  void ReadReady() {
    asio::error_code ec;
    bufpool::AsioReadSome(socket_, received_, kReadBytes, ec);
    if (ec == asio::error::would_block) return Read();
    if (ec == asio::error::no_buffer_space) return WaitForBuffer();
    if (ec) return Finish();  // end of stream or an error
    Write();
    Read();
  }

  // The pool is dry: read again once a buffer is free. Its eventfd is made
  // on the first need, so sessions that never wait hold none.
  void WaitForBuffer() {
    if (buffer_waits++ == 0) {
      std::printf("asio_echo: the pool ran dry; sessions wait for buffers\n");
      std::fflush(stdout);
    }
    if (!waiter_) waiter_.emplace(socket_.get_executor(), pool_);
    reading_ = true;
    waiter_->AsyncWait([self = shared_from_this()](asio::error_code ec) {
      self->reading_ = false;
      if (!ec) self->Read();
    });
  }

  // End of stream or an error: echo what is queued, then shut down.
  void Finish() {
    eof_ = true;
    Write();
  }

  void Write() {
    if (writing_) return;  // `sending_` stays unchanged while it is written
    sending_.Append(std::move(received_));
    if (sending_.empty()) {
      if (eof_) socket_.shutdown(asio::socket_base::shutdown_send, ignored_);
      return;
    }
    writing_ = true;
    asio::async_write(
        socket_, bufpool::AsioBuffers(sending_),
        [self = shared_from_this()](asio::error_code ec, size_t n) {
          self->writing_ = false;
          self->sending_.Consume(n);  // buffers go back
          if (ec) return;             // peer gone: drop the session
          self->Write();
          self->Read();  // may have been paused at the limit
        });
  }

  asio::ip::tcp::socket socket_;
  bufpool::BufferPool& pool_;
  // What both chains charge; declared before them, so that it outlives them.
  std::unique_ptr<bufpool::BufferBudget> budget_;
  bufpool::BufferChain sending_;   // being written by async_write
  bufpool::BufferChain received_;  // read since, waiting its turn
  std::optional<bufpool::AsioFreeBufferWaiter> waiter_;
  bool writing_ = false;
  bool reading_ = false;  // a wait for data or for a buffer is in flight
  bool eof_ = false;
  bool paused_ = false;  // over the budget's high watermark, not yet low
  asio::error_code ignored_;
};

void Accept(asio::ip::tcp::acceptor& acceptor, bufpool::BufferPool& pool) {
  acceptor.async_accept([&](asio::error_code ec, asio::ip::tcp::socket s) {
    if (!ec) {
      if (auto session = Session::Make(std::move(s), pool)) session->Start();
    }
    Accept(acceptor, pool);
  });
}

// Serves until SIGINT or SIGTERM. The sessions, and the buffers they hold,
// are gone when it returns.
void Serve(bufpool::BufferPool& pool, int port) {
  asio::io_context io;
  asio::ip::tcp::acceptor acceptor(
      io, asio::ip::tcp::endpoint(asio::ip::address_v4::loopback(),
                                  static_cast<unsigned short>(port)));
  asio::signal_set stop(io, SIGINT, SIGTERM);
  stop.async_wait([&](asio::error_code, int) { io.stop(); });
  Accept(acceptor, pool);
  std::printf("asio_echo: listening on 127.0.0.1:%d\n",
              acceptor.local_endpoint().port());
  std::fflush(stdout);
  io.run();
}

}  // namespace

int main(int argc, char** argv) {
  const int port = argc > 1 ? std::atoi(argv[1]) : 7007;
  size_t buffers = 4096;
  if (argc > 2) {
    char* end = nullptr;
    buffers = std::strtoul(argv[2], &end, 10);
    if (end == argv[2] || *end != '\0' || buffers == 0) {
      std::fprintf(stderr,
                   "asio_echo: BUFFERS must be a positive number, got '%s'\n",
                   argv[2]);
      return 2;
    }
  }
  auto pool = bufpool::BufferPool::Create({.buffer_count = buffers});
  if (!pool.ok()) {
    std::fprintf(stderr, "asio_echo: %s\n",
                 std::string(pool.status().message()).c_str());
    return 1;
  }
  Serve(**pool, port);
  std::printf("asio_echo: done: %zu waits for a buffer, %zu buffers in use\n",
              buffer_waits, (*pool)->Stats().in_use);
  return 0;
}

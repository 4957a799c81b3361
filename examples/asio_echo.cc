// An Asio echo server whose bytes live in libbufpool buffers: a session
// waits for its socket to be readable, then reads what is there into pool
// buffers (bufpool::AsioReadSome: large reads linked, small ones copied
// into the chain's tail, so memory follows bytes), and writes the chain
// back with asio::async_write (bufpool::AsioBuffers). One read in flight
// per session. When the pool is dry a session waits a moment and retries
// instead of failing; a session holding more than kMaxUnsent bytes stops
// reading until its writes drain.
//
//   asio_echo [PORT]        # default 7007, 127.0.0.1; Ctrl-C to stop
//   printf 'hello' | nc -q1 127.0.0.1 7007
#include <asio.hpp>
#include <cstdio>
#include <cstdlib>
#include <memory>

#include "bufpool/asio.h"
#include "bufpool/buffer_pool.h"
#include "bufpool/chain.h"

namespace {

constexpr size_t kReadBytes = 64 * 1024;
constexpr size_t kMaxUnsent = 256 * 1024;

class Session : public std::enable_shared_from_this<Session> {
 public:
  Session(asio::ip::tcp::socket socket, bufpool::BufferPool& pool)
      : socket_(std::move(socket)),
        pool_(pool),
        sending_(pool),
        received_(pool),
        retry_(socket_.get_executor()) {}

  void Start() {
    socket_.non_blocking(true, ignored_);  // AsioReadSome must not block
    Read();
  }

 private:
  // At most one read in flight per session (reading_): a wait for
  // readability, then one AsioReadSome() of what the socket holds, so an
  // idle session pins no buffer and a slow one never piles up reads.
  void Read() {
    if (reading_ || eof_ || sending_.size() + received_.size() >= kMaxUnsent) {
      return;
    }
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
    if (ec == asio::error::no_buffer_space) {  // pool dry: try again shortly
      // (A loop with BufferPool::NotifyWhenFree can wait on an eventfd.)
      reading_ = true;
      retry_.expires_after(std::chrono::milliseconds(5));
      retry_.async_wait([self = shared_from_this()](asio::error_code ec) {
        self->reading_ = false;
        if (!ec) self->Read();
      });
      return;
    }
    if (ec) return Finish();  // end of stream or an error
    Write();
    Read();
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
  bufpool::BufferChain sending_;   // being written by async_write
  bufpool::BufferChain received_;  // read since, waiting its turn
  asio::steady_timer retry_;
  bool writing_ = false;
  bool reading_ = false;  // a wait, read or retry is in flight
  bool eof_ = false;
  asio::error_code ignored_;
};

void Accept(asio::ip::tcp::acceptor& acceptor, bufpool::BufferPool& pool) {
  acceptor.async_accept([&](asio::error_code ec, asio::ip::tcp::socket s) {
    if (!ec) std::make_shared<Session>(std::move(s), pool)->Start();
    Accept(acceptor, pool);
  });
}

}  // namespace

int main(int argc, char** argv) {
  const int port = argc > 1 ? std::atoi(argv[1]) : 7007;
  auto pool = bufpool::BufferPool::Create({.buffer_count = 4096});
  if (!pool.ok()) {
    std::fprintf(stderr, "asio_echo: %s\n",
                 std::string(pool.status().message()).c_str());
    return 1;
  }
  asio::io_context io;
  asio::ip::tcp::acceptor acceptor(
      io, asio::ip::tcp::endpoint(asio::ip::address_v4::loopback(),
                                  static_cast<unsigned short>(port)));
  asio::signal_set stop(io, SIGINT, SIGTERM);
  stop.async_wait([&](asio::error_code, int) { io.stop(); });
  Accept(acceptor, **pool);
  std::printf("asio_echo: listening on 127.0.0.1:%d\n",
              acceptor.local_endpoint().port());
  std::fflush(stdout);
  io.run();
  return 0;
}

// An Asio echo server whose bytes live in libbufpool buffers: each read goes
// into fresh pool buffers (bufpool::AsioReadBuffers), the filled ones are
// linked into a BufferChain without copying, and the chain is written back
// with asio::async_write (bufpool::AsioBuffers). When the pool is dry a
// session waits a moment and retries instead of failing; a session holding
// more than kMaxUnsent bytes stops reading until its writes drain.
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

  void Start() { Read(); }

 private:
  void Read() {
    if (eof_ || sending_.size() + received_.size() >= kMaxUnsent) return;
    auto rb = std::make_shared<bufpool::AsioReadBuffers>(pool_, kReadBytes);
    if (rb->empty()) {  // pool dry: try again shortly
      retry_.expires_after(std::chrono::milliseconds(5));
      retry_.async_wait([self = shared_from_this()](asio::error_code ec) {
        if (!ec) self->Read();
      });
      return;
    }
    socket_.async_read_some(rb->buffers(), [self = shared_from_this(), rb](
                                               asio::error_code ec, size_t n) {
      if (ec) {  // end of stream or an error: finish what is queued
        self->eof_ = true;
        self->Write();
        return;
      }
      rb->CommitTo(self->received_, n);  // no copy
      self->Write();
      self->Read();
    });
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

// A line server on Asio whose bytes live in libbufpool buffers: reads go
// into fresh pool buffers (bufpool::AsioReadBuffers) linked into the
// connection's input chain; a LineSplitter cuts each line ("\n" or "\r\n")
// off it as slices of those buffers, and the reply "<length> <line>\n"
// links the same slices behind a small header: the line is never copied. A
// line longer than kMaxLine is answered with "ERR line too long" and the
// connection closed; a pool that runs dry makes a session wait a moment.
//
//   asio_line_server [PORT]    # default 7008, 127.0.0.1; 0 picks one
//   printf 'hello\nworld\r\n' | nc -q1 127.0.0.1 7008   # "5 hello" "5 world"
#include <asio.hpp>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>

#include "bufpool/asio.h"
#include "bufpool/buffer_pool.h"
#include "bufpool/chain.h"
#include "bufpool/cursor.h"

namespace {

constexpr size_t kReadBytes = 64 * 1024;
constexpr size_t kMaxLine = 16 * 1024;
constexpr size_t kMaxUnsent = 256 * 1024;

class Session : public std::enable_shared_from_this<Session> {
 public:
  Session(asio::ip::tcp::socket socket, bufpool::BufferPool& pool)
      : socket_(std::move(socket)),
        pool_(pool),
        in_(pool),
        out_(pool),
        sending_(pool),
        retry_(socket_.get_executor()) {}

  void Start() { Read(); }

 private:
  void Read() {
    if (closing_ || out_.size() + sending_.size() >= kMaxUnsent) return;
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
      if (ec) return self->Close();      // end of stream: answer what is queued
      (void)rb->CommitTo(self->in_, n);  // no copy; no budget to refuse
      self->Split();
      self->Write();
      self->Read();
    });
  }

  // Answers every complete line in in_.
  void Split() {
    for (;;) {
      absl::StatusOr<std::optional<bufpool::BufferChain>> line =
          lines_.Next(in_);
      if (!line.ok()) {  // too long: say so and close
        Reply("ERR line too long\n");
        return Close();
      }
      if (!line->has_value()) return;
      Reply(std::to_string((*line)->size()) + " ");
      out_.Append(std::move(**line));  // the line's own slices
      Reply("\n");
    }
  }

  void Reply(const std::string& s) {
    if (!out_.Append(s).ok()) closing_ = true;  // pool dry: give up
  }

  void Close() {
    closing_ = true;
    in_.Clear();
    Write();
  }

  void Write() {
    if (writing_) return;  // sending_ stays unchanged while it is written
    sending_.Append(std::move(out_));
    if (sending_.empty()) {
      if (closing_)
        socket_.shutdown(asio::socket_base::shutdown_send, ignored_);
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
  bufpool::BufferChain in_;       // received, not yet a whole line
  bufpool::BufferChain out_;      // replies waiting their turn
  bufpool::BufferChain sending_;  // being written by async_write
  bufpool::LineSplitter lines_{{.max_line = kMaxLine}};
  asio::steady_timer retry_;
  bool writing_ = false, closing_ = false;
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
  const int port = argc > 1 ? std::atoi(argv[1]) : 7008;
  auto pool = bufpool::BufferPool::Create({.buffer_count = 4096});
  if (!pool.ok()) {
    std::fprintf(stderr, "asio_line_server: %s\n",
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
  std::printf("listening on 127.0.0.1:%d\n", acceptor.local_endpoint().port());
  std::fflush(stdout);
  io.run();
  return 0;
}

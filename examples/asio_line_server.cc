// A line server on Asio whose bytes live in libbufpool buffers: reads go
// into fresh pool buffers (bufpool::AsioReadBuffers) linked into the
// connection's input chain; a LineSplitter cuts each line ("\n" or "\r\n")
// off it as slices of those buffers, and the reply "<length> <line>\n"
// links the same slices behind a small header (lines under kCopyBelow
// bytes are copied instead, so that short replies share buffers). A
// line longer than kMaxLine is answered with "ERR line too long" and the
// connection closed; a pool that runs dry makes a session wait a moment.
// A session's chains are bound to a budget (bufpool/budget.h), whose count
// of pinned bytes is the session's backpressure: at kMaxUnsent it stops
// reading until its writes drain, and its max_bytes caps the replies to
// the read already made.
//
//   asio_line_server [PORT]    # default 7008, 127.0.0.1; 0 picks one
//   printf 'hello\nworld\r\n' | nc -q1 127.0.0.1 7008   # "5 hello" "5 world"
#include <asio.hpp>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>

#include "absl/types/span.h"
#include "bufpool/asio.h"
#include "bufpool/budget.h"
#include "bufpool/buffer_pool.h"
#include "bufpool/chain.h"
#include "bufpool/cursor.h"

namespace {

constexpr size_t kReadBytes = 64 * 1024;
constexpr size_t kMaxLine = 16 * 1024;
constexpr size_t kCopyBelow = 1024;  // shorter lines are copied, not linked
constexpr size_t kMaxUnsent = 256 * 1024;

class Session : public std::enable_shared_from_this<Session> {
 public:
  // A session with its budget; nullptr (and the socket closed) when the
  // budget cannot be made.
  static std::shared_ptr<Session> Make(asio::ip::tcp::socket socket,
                                       bufpool::BufferPool& pool) {
    auto session = std::shared_ptr<Session>(new Session(std::move(socket)));
    Session* s = session.get();
    auto budget = pool.CreateBudget(
        {.name = "session " + std::to_string(s->socket_.native_handle()),
         // Room past kMaxUnsent for the read made below it and the replies
         // to its lines, whose linked slices count a whole buffer each.
         .max_bytes = 4 * kMaxUnsent});
    if (!budget.ok()) {
      std::fprintf(stderr, "asio_line_server: %s\n",
                   budget.status().ToString().c_str());
      return nullptr;
    }
    s->budget_ = *std::move(budget);
    s->in_ = bufpool::BufferChain(*s->budget_);
    s->out_ = bufpool::BufferChain(*s->budget_);
    s->sending_ = bufpool::BufferChain(*s->budget_);
    return session;
  }

  void Start() { Read(); }

 private:
  explicit Session(asio::ip::tcp::socket socket)
      : socket_(std::move(socket)), retry_(socket_.get_executor()) {}

  void Read() {
    // One read (or wait for the pool) at a time, and only below kMaxUnsent
    // pinned (replies not yet written, a partial line); a write that
    // drains the replies calls Read() again.
    if (reading_ || closing_ || budget_->pinned_bytes() >= kMaxUnsent) return;
    // Fresh buffers as in_ draws them: no more than the budget allows.
    auto rb = std::make_shared<bufpool::AsioReadBuffers>(in_, kReadBytes);
    reading_ = true;
    if (rb->empty()) {  // pool dry: try again shortly
      retry_.expires_after(std::chrono::milliseconds(5));
      retry_.async_wait([self = shared_from_this()](asio::error_code ec) {
        self->reading_ = false;
        if (!ec) self->Read();
      });
      return;
    }
    socket_.async_read_some(rb->buffers(), [self = shared_from_this(), rb](
                                               asio::error_code ec, size_t n) {
      self->reading_ = false;
      if (ec) return self->Close();  // end of stream: answer what is queued
      // No copy; within the budget (rb drew for in_), so never refused.
      (void)rb->CommitTo(self->in_, n);
      self->Split();
      self->Write();
      self->Read();
    });
  }

  // Answers every complete line in in_.
  void Split() {
    while (!closing_) {
      absl::StatusOr<std::optional<bufpool::BufferChain>> line =
          lines_.Next(in_);
      if (!line.ok()) {  // too long: say so and close
        Reply("ERR line too long\n");
        return Close();
      }
      if (!line->has_value()) return;
      bufpool::BufferChain& text = **line;
      if (text.size() < kCopyBelow) {
        // A short line is copied with its header into out_'s tail: linked,
        // it would end the tail, and the next reply would need a fresh
        // buffer (one per line).
        std::string reply = std::to_string(text.size()) + " ";
        const size_t at = reply.size();
        reply.resize(at + text.size() + 1, '\n');
        text.CopyTo(absl::MakeSpan(
            reinterpret_cast<std::byte*>(reply.data()) + at, text.size()));
        Reply(reply);
        continue;
      }
      Reply(std::to_string(text.size()) + " ");
      out_.Append(std::move(text));  // the line's own slices
      Reply("\n");
    }
  }

  void Reply(const std::string& s) {
    // The pool dry, or the budget at its limit: give up.
    if (!out_.Append(s).ok()) closing_ = true;
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
          self->Read();  // may have stopped at kMaxUnsent
        });
  }

  asio::ip::tcp::socket socket_;
  // What the chains charge; declared before them, so that it outlives them.
  std::unique_ptr<bufpool::BufferBudget> budget_;
  bufpool::BufferChain in_;       // received, not yet a whole line
  bufpool::BufferChain out_;      // replies waiting their turn
  bufpool::BufferChain sending_;  // being written by async_write
  bufpool::LineSplitter lines_{{.max_line = kMaxLine}};
  asio::steady_timer retry_;
  bool writing_ = false, closing_ = false;
  bool reading_ = false;  // a read or a wait for the pool is in flight
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

// bufpool/asio.h with standalone Asio: a BufferChain as the buffer sequence
// of asio::write/async_write, and reads into fresh pool buffers, sync and
// async, over a local socket pair and TCP loopback.
#include "bufpool/asio.h"

#include <asio.hpp>
#include <filesystem>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "test_util.h"

namespace bufpool {
namespace {

using testing_util::Contents;
using testing_util::RandomBytes;

class AsioTest : public testing::Test {
 protected:
  void SetUp() override {
    auto pool = BufferPool::Create({.buffer_count = 256,
                                    .huge_pages = HugePages::kNever,
                                    .populate = false});
    ASSERT_TRUE(pool.ok()) << pool.status();
    pool_ = *std::move(pool);
  }
  void TearDown() override { EXPECT_EQ(pool_->Stats().in_use, 0u); }

  // A message of several slices: copied bytes, then a linked slice.
  BufferChain Message(const std::string& data) {
    BufferChain msg(*pool_);
    EXPECT_TRUE(msg.Append(data.substr(0, data.size() / 2)).ok());
    BufferChain rest(*pool_);
    EXPECT_TRUE(rest.Append("xx" + data.substr(data.size() / 2)).ok());
    rest.Consume(2);  // a slice that starts inside its buffer
    msg.Append(std::move(rest));
    return msg;
  }

  std::unique_ptr<BufferPool> pool_;
};

TEST_F(AsioTest, ChainIsAConstBufferSequence) {
  static_assert(asio::is_const_buffer_sequence<AsioConstBuffers>::value);
  static_assert(asio::is_mutable_buffer_sequence<
                decltype(std::declval<AsioReadBuffers&>().buffers())>::value);
  const std::string data = RandomBytes(10000, 1);
  BufferChain msg = Message(data);
  EXPECT_GT(msg.slice_count(), 2u);
  EXPECT_EQ(asio::buffer_size(AsioBuffers(msg)), data.size());
  std::string flat(data.size(), '\0');
  EXPECT_EQ(asio::buffer_copy(asio::buffer(flat), AsioBuffers(msg)),
            data.size());
  EXPECT_EQ(flat, data);
}

TEST_F(AsioTest, SyncWriteAndReadOverALocalSocketPair) {
  asio::io_context io;
  asio::local::stream_protocol::socket a(io), b(io);
  asio::local::connect_pair(a, b);
  const std::string data = RandomBytes(100000, 2);
  BufferChain out = Message(data);
  std::thread writer([&] {
    asio::error_code ec;
    EXPECT_EQ(AsioWrite(a, out, ec), data.size());
    EXPECT_FALSE(ec) << ec.message();
    EXPECT_TRUE(out.empty());
    a.shutdown(asio::socket_base::shutdown_send);
  });
  BufferChain in(*pool_);
  for (;;) {
    asio::error_code ec;
    AsioReadSome(b, in, 16384, ec);
    if (ec == asio::error::eof) break;
    ASSERT_FALSE(ec) << ec.message();
  }
  writer.join();
  EXPECT_EQ(Contents(in), data);
}

TEST_F(AsioTest, ReadWithNoFreeBufferIsNoBufferSpace) {
  asio::io_context io;
  asio::local::stream_protocol::socket a(io), b(io);
  asio::local::connect_pair(a, b);
  std::vector<Buffer> held(pool_->capacity());
  ASSERT_EQ(pool_->TryAcquireBulk(absl::MakeSpan(held)), held.size());
  BufferChain in(*pool_);
  asio::error_code ec;
  EXPECT_EQ(AsioReadSome(b, in, 4096, ec), 0u);
  EXPECT_EQ(ec, asio::error::no_buffer_space);
  EXPECT_TRUE(in.empty());
}

// A chain bound to a budget: AsioReadSome() reads only into the buffers the
// budget allows and, at the limit, reads nothing (no_buffer_space; the
// bytes stay in the socket); CommitTo() of a read made without the budget
// keeps the bytes and reports the limit.
TEST_F(AsioTest, ReadsIntoABoundChainStopAtTheBudgetAndLoseNothing) {
  asio::io_context io;
  asio::local::stream_protocol::socket a(io), b(io);
  asio::local::connect_pair(a, b);
  const size_t bs = pool_->buffer_size();
  auto budget = pool_->CreateBudget({.name = "asio", .max_bytes = 2 * bs});
  ASSERT_TRUE(budget.ok()) << budget.status();
  const std::string data = RandomBytes(5 * bs, 3);
  asio::write(a, asio::buffer(data));
  std::string got;
  {
    BufferChain in(**budget);
    asio::error_code ec;
    EXPECT_EQ(AsioReadSome(b, in, 16 * bs, ec), 2 * bs);
    EXPECT_FALSE(ec) << ec.message();
    EXPECT_EQ((*budget)->pinned_bytes(), 2 * bs);
    EXPECT_EQ(AsioReadSome(b, in, 16 * bs, ec), 0u);  // at the limit
    EXPECT_EQ(ec, asio::error::no_buffer_space);
    got += Contents(in);
    in.Consume(in.size());
    // A read into buffers taken without the budget: kept, reported.
    AsioReadBuffers rb(*pool_, 3 * bs);
    const size_t n = b.read_some(rb.buffers(), ec);
    ASSERT_FALSE(ec) << ec.message();
    EXPECT_EQ(n, 3 * bs);
    const absl::Status s = rb.CommitTo(in, n);
    EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted) << s;
    EXPECT_NE(s.message().find("budget \"asio\""), std::string::npos) << s;
    got += Contents(in);
    EXPECT_EQ((*budget)->Stats().refusals, 1u);
  }
  EXPECT_EQ(got, data);  // every byte, in order
  EXPECT_EQ((*budget)->pinned_bytes(), 0u);
}

// An async echo over TCP loopback: the server reads into fresh pool buffers,
// links them into a chain and async_writes the chain back.
TEST_F(AsioTest, AsyncEchoOverTcp) {
  asio::io_context io;
  asio::ip::tcp::acceptor acceptor(
      io, asio::ip::tcp::endpoint(asio::ip::address_v4::loopback(), 0));
  asio::ip::tcp::socket server(io), client(io);
  acceptor.async_accept(
      server, [](asio::error_code ec) { ASSERT_FALSE(ec) << ec.message(); });
  client.connect(acceptor.local_endpoint());
  io.run();
  io.restart();

  BufferChain pending(*pool_);   // being written (or about to be)
  BufferChain incoming(*pool_);  // read while a write is in flight
  bool writing = false;
  bool eof = false;
  std::function<void()> read_more;
  std::function<void()> write_more = [&] {
    if (writing || pending.empty()) {
      if (eof && !writing && pending.empty()) {
        server.shutdown(asio::socket_base::shutdown_send);
      }
      return;
    }
    writing = true;
    asio::async_write(server, AsioBuffers(pending),
                      [&](asio::error_code ec, size_t n) {
                        ASSERT_FALSE(ec) << ec.message();
                        pending.Consume(n);
                        pending.Append(std::move(incoming));
                        writing = false;
                        write_more();
                      });
  };
  read_more = [&] {
    auto rb = std::make_shared<AsioReadBuffers>(*pool_, 16384);
    ASSERT_FALSE(rb->empty());
    server.async_read_some(
        rb->buffers(), [&, rb](asio::error_code ec, size_t n) {
          if (ec == asio::error::eof) {
            eof = true;
            write_more();
            return;
          }
          ASSERT_FALSE(ec) << ec.message();
          // The chain an async_write is sending stays
          // unchanged until it completes; what arrives
          // meanwhile waits in `incoming`.
          ASSERT_TRUE(rb->CommitTo(writing ? incoming : pending, n).ok());
          write_more();
          read_more();
        });
  };
  read_more();

  const std::string data = RandomBytes(300000, 3);
  std::string echoed;
  std::thread peer([&] {
    std::thread sender([&] {
      asio::write(client, asio::buffer(data));
      client.shutdown(asio::socket_base::shutdown_send);
    });
    std::string chunk(8192, '\0');
    for (;;) {
      asio::error_code ec;
      const size_t n = client.read_some(asio::buffer(chunk), ec);
      if (ec) break;
      echoed.append(chunk.data(), n);
    }
    sender.join();
  });
  io.run();
  peer.join();
  EXPECT_EQ(echoed, data);
  EXPECT_TRUE(pending.empty());
  EXPECT_TRUE(incoming.empty());
}

// ---- AsioFreeBufferWaiter ---------------------------------------------------

// Open file descriptors of this process.
size_t OpenFds() {
  size_t n = 0;
  for (const auto& e : std::filesystem::directory_iterator("/proc/self/fd")) {
    (void)e;
    ++n;
  }
  return n;
}

TEST_F(AsioTest, FreeBufferWaitCompletesAtOnceWhenOneIsFree) {
  asio::io_context io;
  AsioFreeBufferWaiter waiter(io, *pool_);
  int calls = 0;
  asio::error_code got = asio::error::fault;
  waiter.AsyncWait([&](asio::error_code ec) {
    ++calls;
    got = ec;
  });
  EXPECT_EQ(calls, 0);  // never inside AsyncWait()
  io.run();
  EXPECT_EQ(calls, 1);
  EXPECT_FALSE(got) << got.message();
  // Again: the notice is one-shot, the next wait asks for a new one.
  io.restart();
  waiter.AsyncWait([&](asio::error_code ec) {
    ++calls;
    got = ec;
  });
  io.run();
  EXPECT_EQ(calls, 2);
  EXPECT_FALSE(got) << got.message();
}

TEST_F(AsioTest, FreeBufferWaitIsWokenByAReleaseOnAnotherThread) {
  std::vector<Buffer> held(pool_->capacity());
  ASSERT_EQ(pool_->TryAcquireBulk(absl::MakeSpan(held)), held.size());
  asio::io_context io;
  AsioFreeBufferWaiter waiter(io, *pool_);
  bool done = false;
  asio::error_code got = asio::error::fault;
  waiter.AsyncWait([&](asio::error_code ec) {
    done = true;
    got = ec;
    EXPECT_TRUE(pool_->TryAcquire());  // the released buffer is there
  });
  for (int i = 0; i < 10; ++i) io.poll();  // nothing free: nothing fires
  EXPECT_FALSE(done);
  std::thread releaser([&] { held.back().Reset(); });
  io.run();  // returns once the wait completed
  releaser.join();
  EXPECT_TRUE(done);
  EXPECT_FALSE(got) << got.message();
}

TEST_F(AsioTest, FreeBufferWaitWorksWithUseAwaitable) {
  std::vector<Buffer> held(pool_->capacity());
  ASSERT_EQ(pool_->TryAcquireBulk(absl::MakeSpan(held)), held.size());
  asio::io_context io;
  AsioFreeBufferWaiter waiter(io, *pool_);
  bool got_buffer = false;
  asio::co_spawn(
      io,
      [&]() -> asio::awaitable<void> {
        for (;;) {  // the pattern: try, and wait when the pool is dry
          if (Buffer b = pool_->TryAcquire()) {
            got_buffer = true;
            co_return;
          }
          co_await waiter.AsyncWait(asio::use_awaitable);
        }
      },
      asio::detached);
  for (int i = 0; i < 10; ++i) io.poll();
  EXPECT_FALSE(got_buffer);
  std::thread releaser([&] { held.front().Reset(); });
  io.run();
  releaser.join();
  EXPECT_TRUE(got_buffer);
}

TEST_F(AsioTest, FreeBufferWaitCancelledThenReusesItsRequest) {
  std::vector<Buffer> held(pool_->capacity());
  ASSERT_EQ(pool_->TryAcquireBulk(absl::MakeSpan(held)), held.size());
  asio::io_context io;
  AsioFreeBufferWaiter waiter(io, *pool_);
  std::vector<asio::error_code> got;
  auto record = [&](asio::error_code ec) { got.push_back(ec); };

  waiter.AsyncWait(record);  // Cancel()
  io.poll();
  waiter.Cancel();
  io.run();
  io.restart();
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0], asio::error::operation_aborted);

  asio::cancellation_signal signal;  // a per-operation signal
  waiter.AsyncWait(asio::bind_cancellation_slot(signal.slot(), record));
  io.poll();
  signal.emit(asio::cancellation_type::terminal);
  io.run();
  io.restart();
  ASSERT_EQ(got.size(), 2u);
  EXPECT_EQ(got[1], asio::error::operation_aborted);

  waiter.AsyncWait(record);  // still woken by the next release
  for (int i = 0; i < 10; ++i) io.poll();
  EXPECT_EQ(got.size(), 2u);
  held.clear();
  io.run();
  ASSERT_EQ(got.size(), 3u);
  EXPECT_FALSE(got[2]) << got[2].message();
}

// A waiter destroyed while its request is pending keeps its eventfd open
// until the pool has written to it, then the next waiter closes it.
TEST_F(AsioTest, FreeBufferWaiterDestroyedWhileWaitingLeaksNoDescriptor) {
  std::vector<Buffer> held(pool_->capacity());
  ASSERT_EQ(pool_->TryAcquireBulk(absl::MakeSpan(held)), held.size());
  asio::io_context io;
  { AsioFreeBufferWaiter warm(io, *pool_); }  // Asio's own descriptors
  const size_t fds_before = OpenFds();
  asio::error_code got;
  {
    AsioFreeBufferWaiter waiter(io, *pool_);
    waiter.AsyncWait([&](asio::error_code ec) { got = ec; });
    io.poll();
  }
  io.run();
  EXPECT_EQ(got, asio::error::operation_aborted);
  EXPECT_EQ(OpenFds(), fds_before + 1);       // not closed: the pool may write
  held.clear();                               // ... which it does now
  { AsioFreeBufferWaiter next(io, *pool_); }  // reaps it
  EXPECT_EQ(OpenFds(), fds_before);
}

}  // namespace
}  // namespace bufpool

namespace bufpool {
namespace {

// Memory follows bytes through the Asio read path: a 20 KB line trickled a
// byte at a time on each of `connections` socket pairs, read with one
// async_read_some of one buffer at a time per connection and never
// consumed. Each chain pins at most B + 2 * buffer_size, the pool at most
// that plus the one buffer of each read in flight.
class AsioTrickleTest : public testing::TestWithParam<size_t> {};

TEST_P(AsioTrickleTest, ALineTrickledAByteAtATimePinsAboutItsBytes) {
  const size_t conns = GetParam();
  constexpr size_t kLine = 20 * 1024;
  // high_water is exact, so it measures the chains alone.
  auto pool = testing_util::MakeUncachedPool(4096);
  const size_t bs = pool->buffer_size();
  const size_t bound = conns * (testing_util::MostBuffersFor(kLine, bs) + 1);
  asio::io_context io;
  std::vector<std::unique_ptr<asio::local::stream_protocol::socket>> rd, wr;
  for (size_t i = 0; i < conns; ++i) {
    rd.push_back(std::make_unique<asio::local::stream_protocol::socket>(io));
    wr.push_back(std::make_unique<asio::local::stream_protocol::socket>(io));
    asio::local::connect_pair(*rd.back(), *wr.back());
  }
  const std::string line = testing_util::TrickleLine(kLine);
  std::thread trickler = testing_util::StartTrickler(
      conns, line, [&wr](size_t i, const char* byte) {
        asio::error_code ec;
        asio::write(*wr[i], asio::buffer(byte, 1), ec);
        return !ec;
      });
  std::vector<BufferChain> chain;
  for (size_t i = 0; i < conns; ++i) chain.emplace_back(*pool);
  std::function<void(size_t)> read_more = [&](size_t i) {
    auto rb = std::make_shared<AsioReadBuffers>(*pool, bs);
    ASSERT_FALSE(rb->empty());
    rd[i]->async_read_some(rb->buffers(),
                           [&, i, rb](asio::error_code ec, size_t n) {
                             ASSERT_FALSE(ec) << ec.message();
                             ASSERT_TRUE(rb->CommitTo(chain[i], n).ok());
                             if (chain[i].size() < kLine) read_more(i);
                           });
  };
  for (size_t i = 0; i < conns; ++i) read_more(i);
  io.run();
  trickler.join();
  EXPECT_LE(pool->Stats().high_water, bound) << conns << " connections";
  ASSERT_NO_FATAL_FAILURE(
      testing_util::ExpectEachHoldsTheLine(chain, line, bs));
  chain.clear();
  EXPECT_EQ(pool->Stats().in_use, 0u);
}

// 100 connections make 2 million one-byte sends: the plain build only.
INSTANTIATE_TEST_SUITE_P(Connections, AsioTrickleTest,
                         testing::ValuesIn(testing_util::kSanitized
                                               ? std::vector<size_t>{1, 5}
                                               : std::vector<size_t>{1, 5,
                                                                     100}));

}  // namespace
}  // namespace bufpool

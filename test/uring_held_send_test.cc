// HeldSend against the real io_uring over TCP loopback: the bytes arrive,
// plain sends release their chain at the completion, zero-copy sends only at
// the notification, fixed-buffer sends carry the buffer index, and a partial
// send gives back the rest.
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <random>
#include <string>
#include <thread>

#include "bufpool/uring.h"
#include "gtest/gtest.h"
#include "test_util.h"

namespace bufpool {
namespace {

using testing_util::RandomBytes;

struct Fixture {
  io_uring ring{};
  bool ring_ok = false;
  std::unique_ptr<BufferPool> pool;
  testing_util::LoopbackConnection conn = testing_util::ConnectOverLoopback();
  const int client = conn.client.get();
  const int server = conn.server.get();

  Fixture() {
    ring_ok = io_uring_queue_init(64, &ring, 0) == 0;
    auto p = BufferPool::Create({.buffer_count = 512});
    if (p.ok()) pool = *std::move(p);
  }
  ~Fixture() {
    conn = {};  // closed before the ring goes
    if (ring_ok) io_uring_queue_exit(&ring);
  }
  bool ok() const { return ring_ok && pool != nullptr && server >= 0; }

  // A chain of `bytes` spread over buffers, so it has several slices.
  BufferChain MakeChain(const std::string& bytes) {
    BufferChain c(*pool);
    EXPECT_TRUE(c.Append(bytes).ok());
    return c;
  }

  // Waits for one completion and copies it out.
  io_uring_cqe Next() {
    io_uring_cqe* cqe = nullptr;
    EXPECT_EQ(io_uring_wait_cqe(&ring, &cqe), 0);
    io_uring_cqe copy = *cqe;
    io_uring_cqe_seen(&ring, cqe);
    return copy;
  }

  std::string ReadExactly(size_t n) {
    std::string out(n, '\0');
    size_t got = 0;
    while (got < n) {
      const ssize_t r = recv(client, out.data() + got, n - got, 0);
      if (r <= 0) break;
      got += static_cast<size_t>(r);
    }
    out.resize(got);
    return out;
  }
};

TEST(HeldSendTest, PlainSendOfSeveralSlicesReleasesAtItsCompletion) {
  Fixture f;
  ASSERT_TRUE(f.ok());
  const std::string data = RandomBytes(5 * 4096 + 77, 1);
  HeldSend send;
  send.Prepare(io_uring_get_sqe(&f.ring), f.server, f.MakeChain(data));
  EXPECT_EQ(send.requested(), data.size());
  EXPECT_EQ(f.pool->Stats().in_use, 6u);
  ASSERT_EQ(io_uring_submit(&f.ring), 1);
  EXPECT_TRUE(send.busy());
  EXPECT_TRUE(send.OnCompletion(f.Next()));
  EXPECT_EQ(send.result(), static_cast<int>(data.size()));
  EXPECT_TRUE(send.TakeUnsent().empty());
  EXPECT_EQ(f.pool->Stats().in_use, 0u);
  EXPECT_EQ(f.ReadExactly(data.size()), data);
}

// TakeUnsent() gives back the rest as a chain of the pool of the chain
// that was sent, so the caller can append to it (as it could to the chain
// it handed over), also when everything was sent and after a send of
// another pool's chain.
TEST(HeldSendTest, UnsentChainIsOfTheSentChainsPool) {
  Fixture f;
  ASSERT_TRUE(f.ok());
  HeldSend send;
  send.Prepare(io_uring_get_sqe(&f.ring), f.server, f.MakeChain("hello"));
  ASSERT_EQ(io_uring_submit(&f.ring), 1);
  ASSERT_TRUE(send.OnCompletion(f.Next()));
  ASSERT_EQ(send.result(), 5);
  BufferChain rest = send.TakeUnsent();
  EXPECT_TRUE(rest.empty());
  EXPECT_EQ(rest.pool(), f.pool.get());
  EXPECT_TRUE(rest.Append("more").ok());
  rest.Clear();
  EXPECT_EQ(f.ReadExactly(5), "hello");

  // A failed send of another pool's chain, then a complete one of ours.
  auto other = BufferPool::Create({.buffer_count = 8});
  ASSERT_TRUE(other.ok());
  BufferChain theirs(**other);
  ASSERT_TRUE(theirs.Append("lost").ok());
  send.Prepare(io_uring_get_sqe(&f.ring), /*fd=*/-1, std::move(theirs));
  ASSERT_EQ(io_uring_submit(&f.ring), 1);
  ASSERT_TRUE(send.OnCompletion(f.Next()));
  ASSERT_EQ(send.result(), -EBADF);
  rest = send.TakeUnsent();
  EXPECT_EQ(rest.pool(), other->get());
  EXPECT_EQ(rest.size(), 4u);
  rest = f.MakeChain("again");
  send.Prepare(io_uring_get_sqe(&f.ring), f.server, std::move(rest));
  ASSERT_EQ(io_uring_submit(&f.ring), 1);
  ASSERT_TRUE(send.OnCompletion(f.Next()));
  ASSERT_EQ(send.result(), 5);
  rest = send.TakeUnsent();
  EXPECT_TRUE(rest.empty());
  EXPECT_EQ(rest.pool(), f.pool.get());  // not `other`'s
  rest = BufferChain();
  EXPECT_EQ((*other)->Stats().in_use, 0u);
  EXPECT_EQ(f.ReadExactly(5), "again");
  EXPECT_EQ(f.pool->Stats().in_use, 0u);
}

// ReturnUnsentTo() puts what a send did not take back in front of the
// queue, before what was queued meanwhile, and leaves the queue alone when
// everything was sent.
TEST(HeldSendTest, ReturnUnsentToPutsTheRestInFrontOfTheQueue) {
  Fixture f;
  ASSERT_TRUE(f.ok());
  HeldSend send;
  BufferChain queue = f.MakeChain("tail");
  send.Prepare(io_uring_get_sqe(&f.ring), /*fd=*/-1, f.MakeChain("head"));
  ASSERT_EQ(io_uring_submit(&f.ring), 1);
  ASSERT_TRUE(send.OnCompletion(f.Next()));
  ASSERT_EQ(send.result(), -EBADF);  // nothing sent: all of it comes back
  send.ReturnUnsentTo(queue);
  EXPECT_EQ(testing_util::Contents(queue), "headtail");
  EXPECT_TRUE(send.TakeUnsent().empty());
  send.Prepare(io_uring_get_sqe(&f.ring), f.server, std::move(queue));
  ASSERT_EQ(io_uring_submit(&f.ring), 1);
  ASSERT_TRUE(send.OnCompletion(f.Next()));
  ASSERT_EQ(send.result(), 8);
  BufferChain next = f.MakeChain("next");
  send.ReturnUnsentTo(next);  // all sent: unchanged
  EXPECT_EQ(testing_util::Contents(next), "next");
  EXPECT_EQ(f.ReadExactly(8), "headtail");
  next.Clear();
  EXPECT_EQ(f.pool->Stats().in_use, 0u);
}

TEST(HeldSendTest, ZeroCopySendHoldsItsBuffersUntilTheNotification) {
  Fixture f;
  ASSERT_TRUE(f.ok());
  for (size_t size :
       {size_t{3000}, size_t{3 * 4096 + 5}}) {  // SEND_ZC, SENDMSG_ZC
    SCOPED_TRACE(size);
    const std::string data = RandomBytes(size, static_cast<uint32_t>(size));
    HeldSend send;
    send.Prepare(io_uring_get_sqe(&f.ring), f.server, f.MakeChain(data),
                 {.zero_copy = true});
    const size_t held = f.pool->Stats().in_use;
    ASSERT_GT(held, 0u);
    ASSERT_EQ(io_uring_submit(&f.ring), 1);
    const io_uring_cqe first = f.Next();
    ASSERT_FALSE(first.flags & IORING_CQE_F_NOTIF);
    ASSERT_TRUE(first.flags & IORING_CQE_F_MORE) << "no notification follows";
    EXPECT_FALSE(send.OnCompletion(first));
    EXPECT_TRUE(send.has_result());
    EXPECT_EQ(send.result(), static_cast<int>(size));
    EXPECT_FALSE(send.done());
    EXPECT_EQ(f.pool->Stats().in_use, held);  // not returned yet
    const io_uring_cqe notif = f.Next();
    ASSERT_TRUE(notif.flags & IORING_CQE_F_NOTIF);
    EXPECT_TRUE(send.OnCompletion(notif));
    EXPECT_EQ(f.pool->Stats().in_use, 0u);
    EXPECT_EQ(f.ReadExactly(size), data);
  }
}

// A shared pool's slot is reclaimed by another process as soon as this one
// dies, while a zero-copy send's pages may still sit in TCP's retransmit
// queue: the send copies instead, done at its one completion.
TEST(HeldSendTest, SharedPoolsBuffersAreNeverSentZeroCopy) {
  Fixture f;
  ASSERT_TRUE(f.ok());
  auto shared = BufferPool::Create({.buffer_count = 64, .shared = true});
  ASSERT_TRUE(shared.ok()) << shared.status();
  for (size_t size : {size_t{3000}, size_t{3 * 4096 + 5}}) {
    SCOPED_TRACE(size);
    const std::string data = RandomBytes(size, static_cast<uint32_t>(size));
    BufferChain chain(**shared);
    ASSERT_TRUE(chain.Append(data).ok());
    io_uring_sqe* sqe = io_uring_get_sqe(&f.ring);
    HeldSend send;
    send.Prepare(sqe, f.server, std::move(chain), {.zero_copy = true});
    EXPECT_FALSE(send.zero_copy());
    EXPECT_TRUE(sqe->opcode == IORING_OP_SEND ||
                sqe->opcode == IORING_OP_SENDMSG)
        << int{sqe->opcode};
    ASSERT_EQ(io_uring_submit(&f.ring), 1);
    const io_uring_cqe cqe = f.Next();
    EXPECT_FALSE(cqe.flags & IORING_CQE_F_MORE) << "a notification follows";
    EXPECT_TRUE(send.OnCompletion(cqe));
    EXPECT_EQ(send.result(), static_cast<int>(size));
    EXPECT_EQ((*shared)->Stats().in_use, 0u);
    EXPECT_EQ(f.ReadExactly(size), data);
  }
  // A chain that mixes a private pool's slice with a shared one's copies
  // too; a private pool's alone still goes zero-copy.
  BufferChain mixed = f.MakeChain("private");
  BufferChain tail(**shared);
  ASSERT_TRUE(tail.Append("shared").ok());
  mixed.Append(std::move(tail));
  HeldSend send;
  send.Prepare(io_uring_get_sqe(&f.ring), f.server, std::move(mixed),
               {.zero_copy = true});
  EXPECT_FALSE(send.zero_copy());
  ASSERT_EQ(io_uring_submit(&f.ring), 1);
  while (!send.done()) send.OnCompletion(f.Next());
  EXPECT_EQ(f.ReadExactly(13), "privateshared");
  HeldSend own;
  own.Prepare(io_uring_get_sqe(&f.ring), f.server, f.MakeChain("own"),
              {.zero_copy = true});
  EXPECT_TRUE(own.zero_copy());
  ASSERT_EQ(io_uring_submit(&f.ring), 1);
  while (!own.done()) own.OnCompletion(f.Next());
  EXPECT_EQ(f.ReadExactly(3), "own");
}

TEST(HeldSendTest, FixedBufferZeroCopySendUsesTheRegisteredIndex) {
  Fixture f;
  ASSERT_TRUE(f.ok());
  auto fixed = FixedBuffers::Register(&f.ring, *f.pool);
  ASSERT_TRUE(fixed.ok()) << fixed.status();
  const std::string data = RandomBytes(4000, 3);
  BufferChain chain = f.MakeChain(data);
  const int index = fixed->IndexOf(chain.slice(0).data());
  ASSERT_EQ(index, 0);
  io_uring_sqe* sqe = io_uring_get_sqe(&f.ring);
  HeldSend send;
  send.Prepare(sqe, f.server, std::move(chain),
               {.zero_copy = true, .fixed = &*fixed});
  EXPECT_EQ(sqe->opcode, IORING_OP_SEND_ZC);
  EXPECT_TRUE(sqe->ioprio & IORING_RECVSEND_FIXED_BUF);
  EXPECT_EQ(sqe->buf_index, index);
  ASSERT_EQ(io_uring_submit(&f.ring), 1);
  while (!send.done()) send.OnCompletion(f.Next());
  EXPECT_EQ(send.result(), 4000);
  EXPECT_EQ(f.ReadExactly(data.size()), data);
  EXPECT_EQ(f.pool->Stats().in_use, 0u);
}

TEST(HeldSendTest, PartialSendGivesBackTheRest) {
  Fixture f;
  ASSERT_TRUE(f.ok());
  const int small = 4096;
  setsockopt(f.server, SOL_SOCKET, SO_SNDBUF, &small, sizeof(small));
  setsockopt(f.client, SOL_SOCKET, SO_RCVBUF, &small, sizeof(small));
  const std::string data = RandomBytes(128 << 10, 4);
  // A pool of its own for a chain of 32 buffers.
  auto big = BufferPool::Create({.buffer_count = 40});
  ASSERT_TRUE(big.ok());
  BufferChain chain(**big);
  ASSERT_TRUE(chain.Append(data).ok());
  std::string received;
  std::thread reader([&] { received = f.ReadExactly(data.size()); });
  size_t sent = 0;
  int rounds = 0;
  HeldSend send;
  while (!chain.empty()) {
    send.Prepare(io_uring_get_sqe(&f.ring), f.server, std::move(chain),
                 {.msg_flags = MSG_NOSIGNAL | MSG_DONTWAIT});
    ASSERT_EQ(io_uring_submit(&f.ring), 1);
    while (!send.done()) send.OnCompletion(f.Next());
    if (send.result() > 0) sent += static_cast<size_t>(send.result());
    ASSERT_TRUE(send.result() > 0 || send.result() == -EAGAIN) << send.result();
    chain = send.TakeUnsent();
    EXPECT_EQ(chain.size(), data.size() - sent);
    ++rounds;
    if (send.result() == -EAGAIN) usleep(100);
  }
  reader.join();
  EXPECT_GT(rounds, 1) << "the first send took everything";
  EXPECT_EQ(received, data);
  EXPECT_EQ((*big)->Stats().in_use, 0u);
}

TEST(HeldSendDeathTest, DestroyingABusySendAborts) {
  EXPECT_DEATH(
      {
        Fixture f;
        HeldSend send;
        send.Prepare(io_uring_get_sqe(&f.ring), f.server, f.MakeChain("x"));
        io_uring_submit(&f.ring);
        send.~HeldSend();  // before its completion was fed
      },
      "HeldSend destroyed while the kernel may still read");
}

}  // namespace
}  // namespace bufpool

namespace bufpool {
namespace {

// A chain of 200 slices (of 200 buffers): requested() and held_bytes()
// count all of it, the one send covers every slice, and held_bytes() falls
// to 0 once the kernel is done.
TEST(HeldSendTest, HeldBytesAndRequestedCountEveryOneOf200Slices) {
  Fixture f;
  ASSERT_TRUE(f.ok());
  const std::string data = RandomBytes(200 * 100, 5);
  BufferChain chain(*f.pool);
  for (size_t i = 0; i < 200; ++i) {
    BufferChain one(*f.pool);
    ASSERT_TRUE(one.Append(data.substr(i * 100, 100)).ok());
    chain.Append(std::move(one));
  }
  ASSERT_EQ(chain.slice_count(), 200u);
  HeldSend send;
  EXPECT_EQ(send.held_bytes(), 0u);
  std::string received;
  std::thread reader([&] { received = f.ReadExactly(data.size()); });
  send.Prepare(io_uring_get_sqe(&f.ring), f.server, std::move(chain));
  EXPECT_EQ(send.requested(), data.size());
  EXPECT_EQ(send.held_bytes(), data.size());
  EXPECT_EQ(f.pool->Stats().in_use, 200u);
  ASSERT_EQ(io_uring_submit(&f.ring), 1);
  while (!send.done()) send.OnCompletion(f.Next());
  EXPECT_EQ(send.result(), static_cast<int>(data.size()));
  EXPECT_EQ(send.held_bytes(), 0u);
  EXPECT_TRUE(send.TakeUnsent().empty());
  reader.join();
  EXPECT_EQ(received, data);
  EXPECT_EQ(f.pool->Stats().in_use, 0u);
}

// `data` (a multiple of 10 bytes) as a chain of 10-byte slices, each in a
// buffer of its own, so a send needs one iovec per 10 bytes.
BufferChain ChainOfTenByteSlices(BufferPool& pool, absl::string_view data) {
  BufferChain chain(pool);
  for (size_t i = 0; i < data.size(); i += 10) {
    BufferChain one(pool);
    EXPECT_TRUE(one.Append(data.substr(i, 10)).ok());
    chain.Append(std::move(one));
  }
  return chain;
}

// More slices than one send covers: the rest comes back unsent, whole.
TEST(HeldSendTest, SlicesPastKMaxIovecsStayForTheNextSend) {
  Fixture f;
  ASSERT_TRUE(f.ok());
  auto pool = BufferPool::Create({.buffer_size = 64, .buffer_count = 1100});
  ASSERT_TRUE(pool.ok());
  const size_t n = HeldSend::kMaxIovecs + 30;
  const std::string data = RandomBytes(n * 10, 6);
  BufferChain chain = ChainOfTenByteSlices(**pool, data);
  std::string received;
  std::thread reader([&] { received = f.ReadExactly(data.size()); });
  HeldSend send;
  send.Prepare(io_uring_get_sqe(&f.ring), f.server, std::move(chain));
  EXPECT_EQ(send.requested(), HeldSend::kMaxIovecs * 10);
  EXPECT_EQ(send.held_bytes(), data.size());
  ASSERT_EQ(io_uring_submit(&f.ring), 1);
  while (!send.done()) send.OnCompletion(f.Next());
  EXPECT_EQ(send.result(), static_cast<int>(HeldSend::kMaxIovecs * 10));
  BufferChain rest = send.TakeUnsent();
  EXPECT_EQ(rest.size(), 300u);
  send.Prepare(io_uring_get_sqe(&f.ring), f.server, std::move(rest));
  ASSERT_EQ(io_uring_submit(&f.ring), 1);
  while (!send.done()) send.OnCompletion(f.Next());
  reader.join();
  EXPECT_EQ(received, data);
  EXPECT_EQ((*pool)->Stats().in_use, 0u);
}

// Prepare() after done() starts afresh: bytes left unsent and not taken
// (TakeUnsent(), ReturnUnsentTo()) are dropped, back to the pool.
TEST(HeldSendTest, PreparingAgainDropsTheUnsentBytesNotTaken) {
  Fixture f;
  ASSERT_TRUE(f.ok());
  auto pool = BufferPool::Create({.buffer_size = 64, .buffer_count = 1100});
  ASSERT_TRUE(pool.ok());
  const size_t n = HeldSend::kMaxIovecs + 30;
  std::string data;
  for (size_t i = 0; i < n; ++i) data += "0123456789";
  BufferChain chain = ChainOfTenByteSlices(**pool, data);
  std::string received;
  const size_t expected = HeldSend::kMaxIovecs * 10 + 4;
  std::thread reader([&] { received = f.ReadExactly(expected); });
  HeldSend send;
  send.Prepare(io_uring_get_sqe(&f.ring), f.server, std::move(chain));
  ASSERT_EQ(io_uring_submit(&f.ring), 1);
  while (!send.done()) send.OnCompletion(f.Next());
  EXPECT_EQ((*pool)->Stats().in_use, 30u);  // the unsent slices' buffers
  BufferChain next(**pool);
  ASSERT_TRUE(next.Append("next").ok());
  send.Prepare(io_uring_get_sqe(&f.ring), f.server, std::move(next));
  EXPECT_EQ((*pool)->Stats().in_use, 1u);  // the 30 are gone
  ASSERT_EQ(io_uring_submit(&f.ring), 1);
  while (!send.done()) send.OnCompletion(f.Next());
  EXPECT_TRUE(send.TakeUnsent().empty());
  reader.join();
  EXPECT_EQ(received.size(), expected);
  EXPECT_EQ(received.substr(received.size() - 4), "next");
  EXPECT_EQ((*pool)->Stats().in_use, 0u);
}

}  // namespace
}  // namespace bufpool

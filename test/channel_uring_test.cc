// Two processes on one shared pool, each with its own io_uring ring: each
// receives into the pool through its ring's provided buffers, hands the
// buffers to the other through a BufferChannel, and writes out the buffers
// it was handed with a fixed-buffer write (the shared region registered
// with its own ring). Every byte arrives intact, and no byte is copied by
// user code: each buffer written out is the very slot the other process's
// kernel receive filled (counted, slot by slot).
#include <liburing.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <memory>
#include <vector>

#include "absl/time/time.h"
#include "bufpool/buffer_pool.h"
#include "bufpool/channel.h"
#include "bufpool/uring.h"
#include "gtest/gtest.h"
#include "test_util.h"
#include "uring_test_util.h"

namespace bufpool {
namespace {

using testing_util::Ring;

constexpr size_t kBufferSize = 4096;
constexpr int kMessages = 32;  // 128 KiB: fits a socket pair's buffer

// The byte at `offset` of message `i` that process `who` receives.
uint8_t Pattern(int who, int i, size_t offset) {
  return static_cast<uint8_t>((who * 131 + i * 31 + offset * 7 + offset / 251) &
                              0xff);
}

// What one process did, slot by slot, written where the other can read it
// (a shared anonymous mapping made before the fork).
struct Report {
  int ok;                       // 1 when the process finished its part
  uint32_t filled[kMessages];   // slots its ring's receives filled
  uint32_t written[kMessages];  // slots it wrote out with write_fixed
  int fixed_index_misses;       // buffers FixedBuffers::IndexOf() missed
};

// One process's part: receive kMessages on `in_fd` into pool buffers
// through its own ring, send each to the peer through `to_peer`; then
// write each buffer the peer sent (from `from_peer`) to `out_fd` from its
// registered region.
void Relay(BufferPool& pool, int in_fd, int out_fd, BufferChannel& to_peer,
           BufferChannel& from_peer, Report* report) {
  Ring ring(64, 0);
  ASSERT_TRUE(ring.ok());
  ProvidedBufferRingOptions options;
  options.initial_buffers = 16;
  options.max_buffers = 16;
  options.bundles = ProvidedBufferRingOptions::Bundles::kOff;
  options.incremental = ProvidedBufferRingOptions::Incremental::kOff;
  auto br = ProvidedBufferRing::Create(ring.get(), pool, options);
  ASSERT_TRUE(br.ok()) << br.status();
  auto fixed = FixedBuffers::Register(ring.get(), pool);
  ASSERT_TRUE(fixed.ok()) << fixed.status();

  for (int i = 0; i < kMessages; ++i) {
    ProvidedBufferRing::RecvOptions recv;
    recv.multishot = false;
    (*br)->PrepareRecv(ring.Sqe(), in_fd, recv);
    ASSERT_EQ(io_uring_submit_and_wait(ring.get(), 1), 1);
    io_uring_cqe* cqe;
    ASSERT_EQ(io_uring_peek_cqe(ring.get(), &cqe), 0);
    ASSERT_EQ(cqe->res, static_cast<int>(kBufferSize));
    Buffer received = pool.TryAcquire();  // swapped into the ring
    ASSERT_TRUE(received);
    ASSERT_TRUE((*br)->TakeBuffer(*cqe, received));
    io_uring_cqe_seen(ring.get(), cqe);
    report->filled[i] = received.slot();
    ASSERT_TRUE(to_peer.Send(std::move(received)).ok());
    (*br)->Refill();
  }
  for (int i = 0; i < kMessages; ++i) {
    absl::StatusOr<Buffer> b = from_peer.Receive(absl::Seconds(20));
    ASSERT_TRUE(b.ok()) << b.status();
    const int index = fixed->IndexOf(b->data());
    if (index < 0) {
      ++report->fixed_index_misses;
      continue;
    }
    io_uring_prep_write_fixed(ring.Sqe(), out_fd, b->data(), kBufferSize, 0,
                              index);
    ASSERT_EQ(io_uring_submit_and_wait(ring.get(), 1), 1);
    io_uring_cqe* cqe;
    ASSERT_EQ(io_uring_peek_cqe(ring.get(), &cqe), 0);
    ASSERT_EQ(cqe->res, static_cast<int>(kBufferSize));
    io_uring_cqe_seen(ring.get(), cqe);
    report->written[i] = b->slot();
  }
  report->ok = 1;
}

void Feed(int fd, int who) {
  std::vector<uint8_t> msg(kBufferSize);
  for (int i = 0; i < kMessages; ++i) {
    for (size_t o = 0; o < kBufferSize; ++o) msg[o] = Pattern(who, i, o);
    ASSERT_EQ(write(fd, msg.data(), msg.size()),
              static_cast<ssize_t>(msg.size()));
  }
}

// The messages on `fd` are those `who` received, in order, every byte.
void ExpectRelayed(int fd, int who) {
  std::vector<uint8_t> msg(kBufferSize);
  for (int i = 0; i < kMessages; ++i) {
    ASSERT_EQ(recv(fd, msg.data(), msg.size(), MSG_WAITALL),
              static_cast<ssize_t>(msg.size()))
        << "message " << i;
    size_t wrong = 0;
    for (size_t o = 0; o < kBufferSize; ++o)
      wrong += msg[o] != Pattern(who, i, o);
    ASSERT_EQ(wrong, 0u) << "message " << i << " of process " << who;
  }
}

TEST(ChannelUringTest, TwoProcessesRelayEachOthersReceivesWithoutACopy) {
  SKIP_FORKED_JOIN_UNDER_TSAN();
  PoolOptions po;
  po.buffer_size = kBufferSize;
  po.buffer_count = 256;
  po.shared = true;
  auto pool = BufferPool::Create(po);
  ASSERT_TRUE(pool.ok()) << pool.status();
  {
    Ring probe(4, 0);
    if (!probe.ok()) GTEST_SKIP() << "io_uring unavailable";
  }
  auto a_to_b = BufferChannel::Create(**pool, kMessages);
  auto b_to_a = BufferChannel::Create(**pool, kMessages);
  ASSERT_TRUE(a_to_b.ok() && b_to_a.ok());
  // Stream socket pairs, every input written before the relays start (it
  // fits the socket's buffer), so each receive of kBufferSize is whole.
  int in[2][2], out[2][2];
  for (int p = 0; p < 2; ++p) {
    ASSERT_EQ(socketpair(AF_UNIX, SOCK_STREAM, 0, in[p]), 0);
    ASSERT_EQ(socketpair(AF_UNIX, SOCK_STREAM, 0, out[p]), 0);
    Feed(in[p][0], p);
  }
  auto* reports = static_cast<Report*>(mmap(nullptr, 2 * sizeof(Report),
                                            PROT_READ | PROT_WRITE,
                                            MAP_SHARED | MAP_ANONYMOUS, -1, 0));
  ASSERT_NE(reports, MAP_FAILED);
  std::memset(reports, 0, 2 * sizeof(Report));

  const pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {  // process 1 (B)
    {
      auto joined = BufferPool::Join((*pool)->shared_fd());
      if (!joined.ok()) _exit(2);
      auto to_peer = BufferChannel::Join(**joined, (*b_to_a)->memory_fd(),
                                         (*b_to_a)->event_fd());
      auto from_peer = BufferChannel::Join(**joined, (*a_to_b)->memory_fd(),
                                           (*a_to_b)->event_fd());
      if (!to_peer.ok() || !from_peer.ok()) _exit(3);
      Relay(**joined, in[1][1], out[1][1], **to_peer, **from_peer, &reports[1]);
    }
    _exit(testing::Test::HasFailure() ? 4 : 0);
  }
  Relay(**pool, in[0][1], out[0][1], **a_to_b, **b_to_a, &reports[0]);
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status));
  ASSERT_EQ(WEXITSTATUS(status), 0);
  ASSERT_EQ(reports[0].ok, 1);
  ASSERT_EQ(reports[1].ok, 1);

  // What A wrote out is what B received, and the other way round.
  ExpectRelayed(out[0][0], 1);
  ExpectRelayed(out[1][0], 0);
  // Copies: a buffer written out from another slot than the one the
  // other's ring filled would be one.
  int copies = 0;
  for (int i = 0; i < kMessages; ++i) {
    copies += reports[0].written[i] != reports[1].filled[i];
    copies += reports[1].written[i] != reports[0].filled[i];
  }
  EXPECT_EQ(copies, 0);
  EXPECT_EQ(reports[0].fixed_index_misses + reports[1].fixed_index_misses, 0);
  EXPECT_EQ((*a_to_b)->Stats().refused + (*b_to_a)->Stats().refused, 0u);

  // Every buffer back: B exited cleanly (its ring gave its lent buffers
  // back first), A's ring is gone.
  (*pool)->ReclaimDead();
  std::vector<Buffer> all;
  while (Buffer b = (*pool)->TryAcquire()) all.push_back(std::move(b));
  EXPECT_EQ(all.size(), po.buffer_count);
  all.clear();
  for (int p = 0; p < 2; ++p) {
    for (int fd : {in[p][0], in[p][1], out[p][0], out[p][1]}) close(fd);
  }
  munmap(reports, 2 * sizeof(Report));
}

}  // namespace
}  // namespace bufpool

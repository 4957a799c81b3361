// All or nothing when memory runs out: the calls that promise to leave
// their state unchanged on std::bad_alloc, checked with allocations that
// fail on demand.
//
// This program replaces the global operator new (below), so it is its own
// test program: the sanitizers' checks of matching new/delete forms stay on
// in every other one.
#include <sys/socket.h>
#include <unistd.h>

#include <cstddef>
#include <cstdlib>
#include <new>
#include <string>
#include <utility>
#include <vector>

#include "bufpool/buffer_pool.h"
#include "bufpool/chain.h"
#include "bufpool/uring.h"
#include "gtest/gtest.h"
#include "test_util.h"

namespace {

// While g_fail_allocations is set on a thread, operator new on that thread
// throws std::bad_alloc; g_allocations counts the allocations made on it.
// Aligned new is left to the runtime (neither failed nor counted).
thread_local bool g_fail_allocations = false;
thread_local size_t g_allocations = 0;

// When >= 0: the allocations on this thread that succeed before exactly one
// fails (the next one), after which they succeed again.
thread_local long g_fail_one_after = -1;

void* AllocateOrThrow(size_t n) {
  if (g_fail_allocations) throw std::bad_alloc();
  if (g_fail_one_after >= 0 && g_fail_one_after-- == 0) {
    throw std::bad_alloc();
  }
  ++g_allocations;
  if (void* p = std::malloc(n == 0 ? 1 : n)) return p;
  throw std::bad_alloc();
}

// Runs fn() with allocations failing; true when it threw std::bad_alloc.
// (gtest's own assertions allocate, so none runs inside.)
template <typename Fn>
bool ThrowsBadAllocWhenAllocationsFail(Fn fn) {
  g_fail_allocations = true;
  bool threw = false;
  try {
    fn();
  } catch (const std::bad_alloc&) {
    threw = true;
  }
  g_fail_allocations = false;
  return threw;
}

}  // namespace

// Every unaligned form, so that no allocation made through one of them is
// freed through another.
void* operator new(size_t n) { return AllocateOrThrow(n); }
void* operator new[](size_t n) { return AllocateOrThrow(n); }
void* operator new(size_t n, const std::nothrow_t&) noexcept {
  try {
    return AllocateOrThrow(n);
  } catch (const std::bad_alloc&) {
    return nullptr;
  }
}
void* operator new[](size_t n, const std::nothrow_t& tag) noexcept {
  return operator new(n, tag);
}
void operator delete(void* p) noexcept { std::free(p); }
void operator delete[](void* p) noexcept { std::free(p); }
void operator delete(void* p, size_t) noexcept { std::free(p); }
void operator delete[](void* p, size_t) noexcept { std::free(p); }
void operator delete(void* p, const std::nothrow_t&) noexcept { std::free(p); }
void operator delete[](void* p, const std::nothrow_t&) noexcept {
  std::free(p);
}

namespace bufpool {
namespace {

using testing_util::Contents;
using testing_util::MakePool;
using testing_util::SocketPair;
using testing_util::UniqueFd;

// `n` one-byte slices "a", "b", ... of buffers of `pool`.
BufferChain Letters(BufferPool& pool, uint32_t n) {
  BufferChain c(pool);
  for (uint32_t i = 0; i < n; ++i) {
    Buffer b = pool.TryAcquire();
    if (!b) std::abort();
    b.data()[0] = static_cast<std::byte>('a' + i);
    c.Append(std::move(b), 1);
  }
  return c;
}

// Create() answers every failure with a Status: whichever one allocation
// fails (state bytes, the depot, the caches, the list of slots), it
// returns ResourceExhausted and throws nothing; once every allocation it
// makes succeeds, it makes a pool.
TEST(BufferPoolTest, CreateReturnsResourceExhaustedWhicheverAllocationFails) {
  bool made = false;
  for (long k = 0; k < 10000 && !made; ++k) {
    absl::StatusOr<std::unique_ptr<BufferPool>> pool =
        absl::InternalError("not called");
    bool threw = false;
    g_fail_one_after = k;
    try {
      pool = BufferPool::Create({.buffer_count = 256,
                                 .huge_pages = HugePages::kNever,
                                 .populate = false});
    } catch (const std::bad_alloc&) {
      threw = true;
    }
    const bool failed_one = g_fail_one_after < 0;
    g_fail_one_after = -1;
    ASSERT_FALSE(threw) << "allocation " << k;
    if (pool.ok()) {
      made = !failed_one;  // the allocation to fail came after Create()
      continue;
    }
    EXPECT_EQ(pool.status().code(), absl::StatusCode::kResourceExhausted)
        << "allocation " << k << ": " << pool.status();
  }
  EXPECT_TRUE(made);
}

TEST(BufferChainTest, ReserveMakesLinkingAllocationFree) {
  auto pool = MakePool(64, 64);
  BufferChain c(*pool);
  c.Reserve(2);  // within the inline room: nothing to do
  c.Reserve(20);
  std::vector<Buffer> bufs;
  for (int i = 0; i < 20; ++i) bufs.push_back(pool->TryAcquire());
  const size_t before = g_allocations;
  for (Buffer& b : bufs) c.Append(std::move(b), 1);
  EXPECT_EQ(g_allocations, before);
  EXPECT_EQ(c.slice_count(), 20u);
  c.Clear();
  EXPECT_EQ(pool->Stats().in_use, 0u);
}

TEST(BufferChainTest, AppendChainIsAllOrNothingWhenTheRingCannotGrow) {
  auto pool = MakePool(64, 64);
  // Room for one more slice inline: the ring must grow after the first
  // slice moves.
  BufferChain target = Letters(*pool, BufferChain::kInlineSlices - 1);
  BufferChain source = Letters(*pool, 3);
  EXPECT_TRUE(ThrowsBadAllocWhenAllocationsFail(
      [&] { target.Append(std::move(source)); }));
  EXPECT_TRUE(ThrowsBadAllocWhenAllocationsFail([&] { target.Reserve(100); }));
  EXPECT_EQ(Contents(target), "abc");
  EXPECT_EQ(target.slice_count(), BufferChain::kInlineSlices - 1);
  EXPECT_EQ(Contents(source), "abc");
  EXPECT_EQ(source.slice_count(), 3u);
  EXPECT_EQ(pool->Stats().in_use, BufferChain::kInlineSlices - 1 + 3);
  target.Append(std::move(source));
  EXPECT_EQ(Contents(target), "abcabc");
  EXPECT_TRUE(source.empty());
}

TEST(ProvidedBufferRingTest, TakeIntoIsAllOrNothingWhenTheChainCannotGrow) {
  io_uring ring;
  ASSERT_EQ(io_uring_queue_init(8, &ring, 0), 0);
  UniqueFd fds[2];
  ASSERT_EQ(SocketPair(SOCK_STREAM | SOCK_CLOEXEC, fds), 0);
  auto pool = MakePool(4096, 64);
  auto br = ProvidedBufferRing::Create(
      &ring, *pool,
      {.max_buffers = 16,
       .initial_buffers = 16,
       .bundles = ProvidedBufferRingOptions::Bundles::kOff,
       .copy_below = 0,  // link the ring's buffer: the path that allocates
       .incremental = ProvidedBufferRingOptions::Incremental::kOff});
  ASSERT_TRUE(br.ok()) << br.status();
  // A queue whose inline slice room is full: the next slice needs a heap
  // ring.
  BufferChain queue = Letters(*pool, BufferChain::kInlineSlices);
  (*br)->PrepareRecv(io_uring_get_sqe(&ring), fds[0].get(),
                     {.multishot = false});
  ASSERT_EQ(write(fds[1].get(), "xyz", 3), 3);
  ASSERT_GE(io_uring_submit_and_wait(&ring, 1), 0);
  io_uring_cqe* cqe;
  ASSERT_EQ(io_uring_peek_cqe(&ring, &cqe), 0);
  ASSERT_EQ(cqe->res, 3);
  const size_t in_use = pool->Stats().in_use;

  EXPECT_TRUE(ThrowsBadAllocWhenAllocationsFail(
      [&] { (void)(*br)->Take(*cqe, queue); }));
  EXPECT_EQ(Contents(queue), "abcd");
  EXPECT_EQ(queue.slice_count(), BufferChain::kInlineSlices);
  EXPECT_EQ((*br)->available(), 16u);
  EXPECT_EQ(pool->Stats().in_use, in_use);

  // The same completion, taken again once memory is back.
  absl::Status s = (*br)->Take(*cqe, queue);
  io_uring_cqe_seen(&ring, cqe);
  ASSERT_TRUE(s.ok()) << s;
  EXPECT_EQ((*br)->available(), 16u);  // the id lent again, a fresh buffer
  EXPECT_EQ(pool->Stats().in_use, in_use + 1);
  EXPECT_EQ(Contents(queue), "abcdxyz");
  queue.Clear();
  EXPECT_EQ((*br)->Refill(), 16u);
  br->reset();
  io_uring_queue_exit(&ring);
}

}  // namespace
}  // namespace bufpool

// Budgets (bufpool/budget.h): what chains charge, refusals that lose
// nothing (Append, ReadFrom on a socket pair, ring Take), watermarks with
// hysteresis, reservations that hold while another budget drains the pool
// (the 160-buffer length-prefixed server), and pools that refuse to be
// over-committed by reservations and ring lending.
#include "bufpool/budget.h"

#include <liburing.h>
#include <sys/socket.h>
#include <unistd.h>

#include <array>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "bufpool/chain.h"
#include "bufpool/metrics.h"
#include "bufpool/uring.h"
#include "gtest/gtest.h"
#include "test_util.h"
#include "uring_test_util.h"

namespace bufpool {
namespace {

using testing_util::Ring;
using testing_util::SocketPair;
using testing_util::SubmitAndTakeOne;
using testing_util::TakenCompletion;
using testing_util::UniqueFd;

constexpr size_t kBs = 4096;

std::unique_ptr<BufferPool> MakePool(size_t count) {
  auto pool = BufferPool::Create(
      {.buffer_size = kBs, .buffer_count = count, .cache_size = 0});
  EXPECT_TRUE(pool.ok()) << pool.status();
  return pool.ok() ? std::move(*pool) : nullptr;
}

std::unique_ptr<BufferBudget> MakeBudget(BufferPool& pool,
                                         const BudgetOptions& o) {
  auto b = pool.CreateBudget(o);
  EXPECT_TRUE(b.ok()) << b.status();
  return b.ok() ? std::move(*b) : nullptr;
}

// The ring tests' set-up: a ring, a 64-buffer pool, a budget over it, an
// 8-buffer provided ring without incremental consumption (copy_below as given,
// or the default), and a connected socket pair.
struct BudgetRingRig {
  Ring ring{64, 0};
  std::unique_ptr<BufferPool> pool;
  std::unique_ptr<BufferBudget> budget;
  absl::StatusOr<std::unique_ptr<ProvidedBufferRing>> br =
      absl::FailedPreconditionError("not opened");
  UniqueFd sv[2];

  void Open(const BudgetOptions& o,
            size_t copy_below = ProvidedBufferRingOptions{}.copy_below) {
    ASSERT_TRUE(ring.ok());
    pool = MakePool(64);
    ASSERT_NE(pool, nullptr);
    budget = MakeBudget(*pool, o);
    ASSERT_NE(budget, nullptr);
    br = ProvidedBufferRing::Create(
        ring.get(), *pool,
        {.max_buffers = 8,
         .initial_buffers = 8,
         .copy_below = copy_below,
         .incremental = ProvidedBufferRingOptions::Incremental::kOff});
    ASSERT_TRUE(br.ok()) << br.status();
    ASSERT_EQ(SocketPair(SOCK_STREAM, sv), 0);
  }
};

std::string Bytes(size_t n, char seed) {
  std::string s(n, '\0');
  for (size_t i = 0; i < n; ++i) s[i] = static_cast<char>(seed + i * 7);
  return s;
}

std::string Contents(const BufferChain& c) {
  std::string s(c.size(), '\0');
  c.CopyTo(absl::MakeSpan(reinterpret_cast<std::byte*>(s.data()), s.size()));
  return s;
}

TEST(BudgetTest, CreateRefusesBadOptions) {
  auto pool = MakePool(16);
  auto small = pool->CreateBudget({.name = "a", .max_bytes = 100});
  ASSERT_FALSE(small.ok());
  EXPECT_EQ(small.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(small.status().message().find("max_bytes 100"), std::string::npos)
      << small.status();
  auto marks = pool->CreateBudget({.name = "b",
                                   .max_bytes = 4 * kBs,
                                   .high_watermark = kBs,
                                   .low_watermark = 2 * kBs});
  ASSERT_FALSE(marks.ok());
  EXPECT_NE(marks.status().message().find("low 8192, high 4096"),
            std::string::npos)
      << marks.status();
  auto reserve = pool->CreateBudget(
      {.name = "c", .max_bytes = kBs, .reserved_bytes = 2 * kBs});
  ASSERT_FALSE(reserve.ok());
  EXPECT_EQ(reserve.status().code(), absl::StatusCode::kInvalidArgument);
}

// An elastic pool: a reservation counts against the ceiling and is backed
// by growing; a budget-bound chain takes grown buffers like any others.
TEST(BudgetTest, AnElasticPoolGrowsToBackAReservationUpToItsCeiling) {
  auto pool = BufferPool::Create({.buffer_count = 64,
                                  .cache_size = 0,
                                  .max_buffer_count = 1024,
                                  .grow_step = 64});
  ASSERT_TRUE(pool.ok()) << pool.status();
  auto big = (*pool)->CreateBudget(
      {.name = "big", .max_bytes = 600 * 4096, .reserved_bytes = 500 * 4096});
  ASSERT_TRUE(big.ok()) << big.status();
  EXPECT_GE((*pool)->Stats().committed, 500u);
  EXPECT_EQ((*big)->reserve_buffers(), 500u);
  {
    BufferChain chain(**big);
    for (int i = 0; i < 600; ++i) {
      ASSERT_TRUE(chain.Append(std::string(4096, 'g')).ok()) << i;
    }
    EXPECT_FALSE(chain.Append("x").ok());  // at max_bytes, not the ceiling
    EXPECT_EQ(chain.size(), 600u * 4096);
  }
  // Past the ceiling: 500 reserved + 600 more would need 1,100 of 1,024.
  auto more = (*pool)->CreateBudget(
      {.name = "more", .max_bytes = 600 * 4096, .reserved_bytes = 600 * 4096});
  ASSERT_FALSE(more.ok());
  EXPECT_EQ(more.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_TRUE(absl::StrContains(more.status().message(), "1024 buffers"))
      << more.status();
}

TEST(BudgetTest, ChargesWhatItsChainsPinAndReleasesOnConsume) {
  auto pool = MakePool(64);
  auto budget = MakeBudget(*pool, {.name = "conn", .max_bytes = 32 * kBs});
  {
    BufferChain in(*budget), out(*budget);
    ASSERT_TRUE(in.Append(Bytes(100, 'a')).ok());
    EXPECT_EQ(budget->pinned_bytes(), kBs);
    ASSERT_TRUE(in.Append(Bytes(kBs, 'b')).ok());  // fills the tail, then one
    EXPECT_EQ(budget->pinned_bytes(), 2 * kBs);
    EXPECT_EQ(in.pinned_bytes(), 2 * kBs);
    // Split and Clone: chains of the same budget over the same two
    // buffers, which it counts once each.
    BufferChain head = in.Split(50);
    EXPECT_EQ(head.budget(), budget.get());
    EXPECT_EQ(budget->pinned_bytes(), 2 * kBs);
    BufferChain copy = in.Clone();
    EXPECT_EQ(budget->pinned_bytes(), 2 * kBs);
    EXPECT_EQ(in.pinned_bytes() + head.pinned_bytes() + copy.pinned_bytes(),
              5 * kBs);  // each chain alone would keep these out
    out.Append(std::move(head));
    out.Append(std::move(copy));
    EXPECT_EQ(budget->pinned_bytes(), 2 * kBs);
    // A chain of no budget moved in is charged its buffer; moved out to an
    // unbound chain, what no other chain of the budget holds is released.
    BufferChain loose(*pool);
    ASSERT_TRUE(loose.Append(Bytes(10, 'c')).ok());
    out.Append(std::move(loose));
    EXPECT_EQ(budget->pinned_bytes(), 3 * kBs);
    BufferChain elsewhere(*pool);
    elsewhere.Append(std::move(out));
    EXPECT_EQ(budget->pinned_bytes(), in.pinned_bytes());
    EXPECT_EQ(budget->pinned_bytes(), 2 * kBs);
    in.Consume(in.size());  // `elsewhere`, of no budget, keeps them out
    EXPECT_EQ(budget->pinned_bytes(), 0u);
    EXPECT_EQ(pool->Stats().in_use, 3u);
    ASSERT_TRUE(in.Append(Bytes(3 * kBs, 'd')).ok());
    EXPECT_EQ(budget->pinned_bytes(), 3 * kBs);
    BufferChain moved = std::move(in);  // the charge moves with the slices
    EXPECT_EQ(moved.budget(), budget.get());
    EXPECT_EQ(budget->pinned_bytes(), 3 * kBs);
    ASSERT_TRUE(moved.Compact().ok());
    EXPECT_EQ(budget->pinned_bytes(), moved.pinned_bytes());
  }  // destroyed: everything released
  EXPECT_EQ(budget->pinned_bytes(), 0u);
  EXPECT_EQ(budget->Stats().high_water_bytes, 3 * kBs);
  EXPECT_EQ(pool->Stats().in_use, 0u);
}

// Compact() of a bound chain that keeps one run (at least half a buffer)
// and copies another: the kept run moves to the packed chain with its
// charge, the copied one is released, and nothing is read from the slices
// the move left empty.
TEST(BudgetTest, CompactKeepsOneRunAndCopiesAnother) {
  auto pool = MakePool(16);
  auto budget = MakeBudget(*pool, {.name = "compact", .max_bytes = 8 * kBs});
  BufferChain loose(*pool);
  ASSERT_TRUE(loose.Append(Bytes(kBs, 'k')).ok());  // kept: a whole buffer
  ASSERT_TRUE(loose.Append(Bytes(100, 'c')).ok());  // copied: 100 bytes
  const std::string want = Contents(loose);
  BufferChain chain(*budget);
  chain.Append(std::move(loose));
  ASSERT_EQ(chain.slice_count(), 2u);
  ASSERT_EQ(budget->pinned_bytes(), 2 * kBs);
  ASSERT_TRUE(chain.Compact().ok());
  EXPECT_EQ(Contents(chain), want);
  EXPECT_EQ(chain.budget(), budget.get());
  EXPECT_EQ(budget->pinned_bytes(), chain.pinned_bytes());
  EXPECT_EQ(budget->pinned_bytes(), 2 * kBs);
  EXPECT_EQ(pool->Stats().in_use, 2u);
  chain.Clear();
  EXPECT_EQ(budget->pinned_bytes(), 0u);
  EXPECT_EQ(pool->Stats().in_use, 0u);
}

// A Compact() the pool cannot supply gives what it took from the budget's
// reserve back to the reserve, not to the pool.
TEST(BudgetTest, ACompactThatFailsKeepsTheReserve) {
  auto pool = MakePool(16);
  auto budget = MakeBudget(
      *pool,
      {.name = "compact", .max_bytes = 16 * kBs, .reserved_bytes = 5 * kBs});
  BufferChain loose(*pool);
  for (int i = 0; i < 4; ++i) {  // four buffers under half full: two to copy
    Buffer b = pool->TryAcquire();
    ASSERT_TRUE(b);
    loose.Append(std::move(b), kBs / 2 - 1);
  }
  BufferChain chain(*budget);
  chain.Append(std::move(loose));
  ASSERT_EQ(budget->pinned_bytes(), 4 * kBs);
  ASSERT_EQ(budget->reserve_buffers(), 1u);  // max(5, 4 pinned) kept out
  std::vector<Buffer> others;                // another consumer drains it
  while (Buffer b = pool->TryAcquire()) others.push_back(std::move(b));
  const size_t in_use = pool->Stats().in_use;
  EXPECT_EQ(chain.Compact().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(budget->reserve_buffers(), 1u);
  EXPECT_EQ(pool->Stats().in_use, in_use);
  EXPECT_FALSE(pool->TryAcquire());  // the reserve's buffer stayed its own
  EXPECT_EQ(chain.slice_count(), 4u);
}

TEST(BudgetTest, AppendPastTheLimitIsRefusedAndChangesNothing) {
  auto pool = MakePool(16);
  auto budget = MakeBudget(*pool, {.name = "conn 7", .max_bytes = 2 * kBs});
  BufferChain chain(*budget);
  const std::string first = Bytes(kBs + 10, 'x');
  ASSERT_TRUE(chain.Append(first).ok());
  const absl::Status s = chain.Append(Bytes(kBs, 'y'));
  ASSERT_EQ(s.code(), absl::StatusCode::kResourceExhausted) << s;
  EXPECT_NE(s.message().find("budget \"conn 7\" is at its limit of 8192"),
            std::string::npos)
      << s;
  EXPECT_EQ(Contents(chain), first);  // unchanged
  EXPECT_EQ(budget->Stats().refusals, 1u);
  EXPECT_EQ(pool->Stats().in_use, 2u);
  // What fits the tail's room is taken without a new buffer.
  ASSERT_TRUE(chain.Append(Bytes(kBs - 10, 'z')).ok());
  EXPECT_EQ(budget->pinned_bytes(), 2 * kBs);
  EXPECT_NE(s.message().find("raise max_bytes"), std::string::npos) << s;
  // Linking a slice cannot fail, and takes nothing from the pool: a buffer
  // no budget counts stays uncounted when the budget has no room for it.
  BufferChain other(*pool);
  ASSERT_TRUE(other.Append(Bytes(5, 'q')).ok());
  chain.Append(std::move(other));
  EXPECT_EQ(budget->pinned_bytes(), 2 * kBs);
  EXPECT_EQ(budget->room_bytes(), 0u);
  EXPECT_EQ(budget->Stats().high_water_bytes, budget->max_bytes());
  EXPECT_EQ(pool->Stats().in_use, 3u);
  chain.Consume(kBs + 10);  // a buffer back: room for one
  EXPECT_EQ(budget->pinned_bytes(), kBs);
  // A clone links the counted buffer again (free) and the uncounted one,
  // which the budget now has room to count.
  chain.Append(chain.Clone());
  EXPECT_EQ(budget->pinned_bytes(), 2 * kBs);
  chain.Clear();
  EXPECT_EQ(budget->pinned_bytes(), 0u);
  EXPECT_EQ(pool->Stats().in_use, 0u);
}

TEST(BudgetTest, ReadFromPastTheLimitLeavesTheBytesInTheSocket) {
  auto pool = MakePool(32);
  auto budget = MakeBudget(*pool, {.name = "reader", .max_bytes = 2 * kBs});
  UniqueFd sv[2];
  ASSERT_EQ(SocketPair(SOCK_STREAM, sv), 0);
  const std::string sent = Bytes(5 * kBs + 123, 's');
  ASSERT_EQ(write(sv[0].get(), sent.data(), sent.size()),
            static_cast<ssize_t>(sent.size()));
  BufferChain chain(*budget);
  std::string got;
  int refusals = 0;
  while (got.size() + chain.size() < sent.size()) {
    absl::StatusOr<size_t> n = ReadFrom(sv[1].get(), chain, 64 * kBs);
    if (!n.ok()) {
      ASSERT_EQ(n.status().code(), absl::StatusCode::kResourceExhausted)
          << n.status();
      EXPECT_NE(n.status().message().find("budget \"reader\""),
                std::string::npos);
      EXPECT_NE(n.status().message().find("limit of 8192"), std::string::npos);
      ++refusals;
      // The application drains what it holds, then reads again.
      got += Contents(chain);
      chain.Consume(chain.size());
      continue;
    }
    ASSERT_GT(*n, 0u);
    EXPECT_LE(budget->pinned_bytes(), 2 * kBs);
  }
  got += Contents(chain);
  EXPECT_EQ(got, sent);  // every byte, in order: nothing lost
  EXPECT_GE(refusals, 2);
  EXPECT_EQ(budget->Stats().refusals, static_cast<uint64_t>(refusals));
  EXPECT_EQ(budget->Stats().high_water_bytes, 2 * kBs);
}

TEST(BudgetTest, WatermarksFireOnceEachWay) {
  auto pool = MakePool(32);
  int highs = 0, lows = 0;
  auto budget = MakeBudget(*pool, {.name = "w",
                                   .max_bytes = 8 * kBs,
                                   .high_watermark = 4 * kBs,
                                   .low_watermark = kBs,
                                   .on_high = [&] { ++highs; },
                                   .on_low = [&] { ++lows; }});
  BufferChain chain(*budget);
  ASSERT_TRUE(chain.Append(Bytes(3 * kBs, 'a')).ok());
  EXPECT_EQ(highs, 0);
  ASSERT_TRUE(chain.Append(Bytes(kBs, 'b')).ok());  // reaches 4 buffers
  EXPECT_EQ(highs, 1);
  // Up and down between the marks: neither fires again.
  for (int i = 0; i < 5; ++i) {
    ASSERT_TRUE(chain.Append(Bytes(kBs, 'c')).ok());
    chain.Consume(kBs);
    chain.Consume(kBs);
    ASSERT_TRUE(chain.Append(Bytes(kBs, 'd')).ok());
  }
  EXPECT_EQ(highs, 1);
  EXPECT_EQ(lows, 0);
  chain.Consume(2 * kBs);  // 2 buffers: above low
  EXPECT_EQ(lows, 0);
  chain.Consume(kBs);  // 1 buffer: at low
  EXPECT_EQ(lows, 1);
  chain.Consume(chain.size());
  ASSERT_TRUE(chain.Append(Bytes(3 * kBs, 'e')).ok());
  EXPECT_EQ(lows, 1);
  EXPECT_EQ(highs, 1);
  ASSERT_TRUE(chain.Append(Bytes(kBs, 'f')).ok());  // up again: fires again
  EXPECT_EQ(highs, 2);
  chain.Clear();
  EXPECT_EQ(lows, 2);
}

// One Consume() across many buffers releases them at once (one on_low),
// and the high water follows every new peak and only new peaks.
TEST(BudgetTest, ConsumeAcrossBuffersReleasesOnceAndHighWaterIsExact) {
  auto pool = MakePool(32);
  int lows = 0;
  auto budget = MakeBudget(*pool, {.name = "c",
                                   .max_bytes = 16 * kBs,
                                   .high_watermark = 4 * kBs,
                                   .low_watermark = 2 * kBs,
                                   .on_low = [&] { ++lows; }});
  BufferChain chain(*budget);
  for (int i = 1; i <= 6; ++i) {
    ASSERT_TRUE(chain.Append(Bytes(kBs, 'a')).ok());
    EXPECT_EQ(budget->Stats().high_water_bytes, i * kBs);
  }
  chain.Consume(5 * kBs + 1);  // five whole buffers and a byte of the sixth
  EXPECT_EQ(budget->pinned_bytes(), kBs);
  EXPECT_EQ(lows, 1);
  EXPECT_EQ(pool->Stats().in_use, 1u);
  for (int i = 2; i <= 6; ++i) {
    ASSERT_TRUE(chain.Append(Bytes(kBs, 'b')).ok());
    EXPECT_EQ(budget->Stats().high_water_bytes, 6 * kBs);
  }
  ASSERT_TRUE(chain.Append(Bytes(kBs, 'c')).ok());  // 7 buffers: a new peak
  EXPECT_EQ(budget->Stats().high_water_bytes, 7 * kBs);
  chain.Clear();
  EXPECT_EQ(budget->pinned_bytes(), 0u);
}

TEST(BudgetTest, ReservationHoldsWhileAnotherBudgetDrainsThePool) {
  auto pool = MakePool(160);
  auto hog = MakeBudget(*pool, {.name = "hog", .max_bytes = ~size_t{0}});
  auto replies = MakeBudget(
      *pool,
      {.name = "replies", .max_bytes = 4 * kBs, .reserved_bytes = 2 * kBs});
  EXPECT_EQ(replies->reserve_buffers(), 2u);
  BufferChain hoard(*hog);
  while (hoard.Append(Bytes(kBs, 'h')).ok()) {
  }
  EXPECT_EQ(hoard.size(), 158 * kBs);  // all but the reservation
  EXPECT_FALSE(pool->TryAcquire());
  for (int round = 0; round < 50; ++round) {
    BufferChain reply(*replies);
    const std::string msg = Bytes(2 * kBs, static_cast<char>('a' + round));
    ASSERT_TRUE(reply.Append(msg).ok()) << "round " << round;
    EXPECT_EQ(Contents(reply), msg);
    // Past the reservation the dry pool is what says no.
    const absl::Status s = reply.Append(Bytes(kBs, 'x'));
    EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted);
    EXPECT_NE(s.message().find("the pool has no free buffer"),
              std::string::npos)
        << s;
    // The hog tries to take what the reply gives back, and cannot.
    reply.Consume(reply.size());
    EXPECT_EQ(replies->reserve_buffers(), 2u);
    EXPECT_FALSE(hoard.Append(Bytes(kBs, 'h')).ok());
  }
  hoard.Clear();
  EXPECT_EQ(pool->Stats().in_use, 2u);  // the reserve
  replies.reset();
  EXPECT_EQ(pool->Stats().in_use, 0u);
}

// A server that deadlocked without reservations: length-prefixed frames (4-byte
// length, then the payload) on a pool of 160 buffers, every connection holding
// a partial frame when another consumer takes the rest of the pool. Each
// connection's budget reserves one frame plus its reply, so every frame
// completes and every reply is built; without reservations the same load is
// stuck. Returns how many of the connections got their reply.
size_t RunLengthPrefixedServer(bool reserve) {
  constexpr size_t kConns = 20;
  constexpr size_t kFrame = 6 * kBs;  // header included
  auto pool = MakePool(160);
  std::vector<std::unique_ptr<BufferBudget>> budgets;
  std::vector<BufferChain> in;
  std::vector<std::array<UniqueFd, 2>> fds(kConns);
  for (size_t i = 0; i < kConns; ++i) {
    budgets.push_back(
        MakeBudget(*pool, {.name = "conn " + std::to_string(i),
                           .max_bytes = kFrame + 2 * kBs,
                           .reserved_bytes = reserve ? kFrame + kBs : 0}));
    in.emplace_back(*budgets.back());
    EXPECT_EQ(SocketPair(SOCK_STREAM, fds[i]), 0);
  }
  // Every client sends all but the last buffer of its frame; the server
  // reads what there is.
  std::vector<std::string> frames;
  for (size_t i = 0; i < kConns; ++i) {
    std::string f = Bytes(kFrame, static_cast<char>(i));
    const uint32_t len = kFrame - 4;
    std::memcpy(f.data(), &len, 4);
    frames.push_back(f);
    EXPECT_EQ(write(fds[i][0].get(), f.data(), kFrame - kBs),
              static_cast<ssize_t>(kFrame - kBs));
    (void)ReadFrom(fds[i][1].get(), in[i], kFrame);
  }
  // Another consumer drains the pool.
  auto other = MakeBudget(*pool, {.name = "other", .max_bytes = ~size_t{0}});
  BufferChain hoard(*other);
  while (hoard.Append(Bytes(kBs, 'h')).ok()) {
  }
  EXPECT_FALSE(pool->TryAcquire());
  // The rest of every frame arrives; each connection reads, and when it
  // holds a whole frame, answers it with a reply of one buffer.
  size_t replied = 0;
  for (size_t i = 0; i < kConns; ++i) {
    EXPECT_EQ(write(fds[i][0].get(), frames[i].data() + kFrame - kBs, kBs),
              static_cast<ssize_t>(kBs));
    for (int tries = 0; tries < 4 && in[i].size() < kFrame; ++tries) {
      if (!ReadFrom(fds[i][1].get(), in[i], kFrame - in[i].size()).ok()) break;
    }
    if (in[i].size() < kFrame) continue;  // stuck: no buffer to read into
    EXPECT_EQ(Contents(in[i]), frames[i]);
    BufferChain reply(*budgets[i]);
    if (!reply.Append(Bytes(kBs, 'r')).ok()) continue;
    in[i].Consume(kFrame);
    EXPECT_TRUE(WriteTo(fds[i][1].get(), reply).ok());
    ++replied;
  }
  hoard.Clear();
  in.clear();
  return replied;
}

TEST(BudgetTest, LengthPrefixedServerOn160BuffersAlwaysReplies) {
  EXPECT_EQ(RunLengthPrefixedServer(/*reserve=*/true), 20u);
  // The control: the same load without reservations gets stuck.
  EXPECT_EQ(RunLengthPrefixedServer(/*reserve=*/false), 0u);
}

TEST(BudgetTest, ReservationsMayNotOverCommitThePool) {
  auto pool = MakePool(64);
  auto a = MakeBudget(
      *pool, {.name = "a", .max_bytes = 48 * kBs, .reserved_bytes = 40 * kBs});
  auto b = pool->CreateBudget(
      {.name = "b", .max_bytes = 48 * kBs, .reserved_bytes = 30 * kBs});
  ASSERT_FALSE(b.ok());
  EXPECT_EQ(b.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(b.status().message().find(
                "reserving 30 buffers would over-commit the pool (64 buffers, "
                "40 reserved by budgets and 0 lent to rings)"),
            std::string::npos)
      << b.status();
  // Free buffers are needed too: the reservation is taken at creation.
  std::vector<Buffer> held;
  for (int i = 0; i < 20; ++i) held.push_back(pool->TryAcquire());
  auto c = pool->CreateBudget(
      {.name = "c", .max_bytes = 8 * kBs, .reserved_bytes = 8 * kBs});
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find("has 4 free buffers of the 8"),
            std::string::npos)
      << c.status();
  held.clear();
  EXPECT_TRUE(
      pool->CreateBudget(
              {.name = "c", .max_bytes = 8 * kBs, .reserved_bytes = 8 * kBs})
          .ok());
  a.reset();
  EXPECT_TRUE(
      pool->CreateBudget(
              {.name = "b", .max_bytes = 48 * kBs, .reserved_bytes = 30 * kBs})
          .ok());
}

// Stats() and WriteMetrics() read a budget from any thread while its own
// thread charges it, and budgets come and go on several threads at once
// (run under TSan by the tsan preset).
TEST(BudgetTest, StatsReadWhileOtherThreadsChargeAndCreate) {
  auto pool = MakePool(256);
  std::atomic<bool> done{false};
  std::vector<std::thread> threads;
  for (int t = 0; t < 3; ++t) {
    threads.emplace_back([&, t] {
      for (int round = 0; round < 200; ++round) {
        auto b = MakeBudget(*pool, {.name = "t" + std::to_string(t) + "/" +
                                            std::to_string(round),
                                    .max_bytes = 8 * kBs,
                                    .reserved_bytes = kBs});
        if (b == nullptr) return;
        BufferChain c(*b);
        for (int i = 0; i < 8; ++i) {
          EXPECT_TRUE(c.Append(Bytes(kBs / 2, 'x')).ok());
        }
        EXPECT_EQ(b->pinned_bytes(), 4 * kBs);
        c.Consume(c.size());
      }
    });
  }
  std::thread reader([&] {
    std::string text;
    while (!done.load()) {
      text.clear();
      WriteMetrics(*pool, &text);
      EXPECT_NE(text.find("bufpool_budget_pinned_bytes"), std::string::npos);
    }
  });
  for (auto& t : threads) t.join();
  done = true;
  reader.join();
  EXPECT_EQ(pool->Stats().in_use, 0u);
}

TEST(BudgetDeathTest, DestroyedWhileItsChainsPinBuffers) {
  EXPECT_DEATH(
      {
        auto pool = MakePool(8);
        auto budget = MakeBudget(*pool, {.name = "early", .max_bytes = kBs});
        auto* chain = new BufferChain(*budget);
        (void)chain->Append(Bytes(10, 'a'));
        budget.reset();
      },
      "budget \"early\" destroyed while it pins 4096 bytes");
}

// ---- The ring ---------------------------------------------------------------

TEST(BudgetRingTest, OverCommittedRingIsRefused) {
  Ring ring(64, 0);
  ASSERT_TRUE(ring.ok());
  auto pool = MakePool(64);
  auto big =
      ProvidedBufferRing::Create(ring.get(), *pool, {.max_buffers = 128});
  ASSERT_FALSE(big.ok());
  EXPECT_EQ(big.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(big.status().message().find(
                "lending up to 128 buffers would over-commit the pool (64 "
                "buffers, 0 reserved by budgets and 0 lent to rings)"),
            std::string::npos)
      << big.status();
  auto budget = MakeBudget(
      *pool, {.name = "r", .max_bytes = 40 * kBs, .reserved_bytes = 40 * kBs});
  auto r = ProvidedBufferRing::Create(
      ring.get(), *pool, {.max_buffers = 32, .initial_buffers = 4});
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("40 reserved by budgets"),
            std::string::npos)
      << r.status();
  auto fits = ProvidedBufferRing::Create(
      ring.get(), *pool, {.max_buffers = 16, .initial_buffers = 4});
  ASSERT_TRUE(fits.ok()) << fits.status();
  auto more = pool->CreateBudget(
      {.name = "s", .max_bytes = 16 * kBs, .reserved_bytes = 16 * kBs});
  ASSERT_FALSE(more.ok());
  EXPECT_NE(more.status().message().find("16 lent to rings"), std::string::npos)
      << more.status();
  fits->reset();  // its lending is given back
  EXPECT_TRUE(
      pool->CreateBudget(
              {.name = "s", .max_bytes = 16 * kBs, .reserved_bytes = 16 * kBs})
          .ok());
}

// Writes `msg` into sv[0], receives it from sv[1] with one single-shot
// receive on `br` and takes that completion into `chain`.
void WriteAndReceiveOne(Ring& ring, ProvidedBufferRing& br,
                        const UniqueFd (&sv)[2], BufferChain& chain,
                        const std::string& msg, TakenCompletion* t) {
  ASSERT_EQ(write(sv[0].get(), msg.data(), msg.size()),
            static_cast<ssize_t>(msg.size()));
  io_uring_sqe* sqe = io_uring_get_sqe(ring.get());
  br.PrepareRecv(sqe, sv[1].get(), {.multishot = false, .bundle = false});
  ASSERT_NO_FATAL_FAILURE(SubmitAndTakeOne(ring, br, chain, t));
}

TEST(BudgetRingTest, TakePastTheLimitKeepsTheBytesAndSaysSo) {
  BudgetRingRig rig;
  // copy_below 0: every completion links its buffer, one buffer each.
  ASSERT_NO_FATAL_FAILURE(
      rig.Open({.name = "ring conn", .max_bytes = 2 * kBs}, 0));
  BufferChain chain(*rig.budget);
  std::string sent;
  std::vector<absl::Status> results;
  for (int i = 0; i < 4; ++i) {
    const std::string msg = Bytes(1000, static_cast<char>('a' + i));
    sent += msg;
    TakenCompletion t;
    ASSERT_NO_FATAL_FAILURE(
        WriteAndReceiveOne(rig.ring, **rig.br, rig.sv, chain, msg, &t));
    ASSERT_EQ(t.res, 1000);
    results.push_back(t.status);
    (*rig.br)->Refill();
  }
  EXPECT_TRUE(results[0].ok()) << results[0];
  EXPECT_TRUE(results[1].ok()) << results[1];
  for (int i = 2; i < 4; ++i) {
    EXPECT_EQ(results[i].code(), absl::StatusCode::kResourceExhausted)
        << results[i];
    EXPECT_NE(results[i].message().find(
                  "budget \"ring conn\" is at its limit of 8192"),
              std::string::npos)
        << results[i];
    EXPECT_NE(results[i].message().find("1000 bytes were kept in the chain"),
              std::string::npos)
        << results[i];
  }
  EXPECT_EQ(Contents(chain), sent);  // nothing lost
  EXPECT_EQ(rig.budget->pinned_bytes(), 4 * kBs);
  EXPECT_EQ(rig.budget->Stats().refusals, 2u);
  chain.Consume(chain.size());
  EXPECT_EQ(rig.budget->pinned_bytes(), 0u);
}

TEST(BudgetRingTest, CopiedAndPackedReceivesChargeTheirBuffers) {
  BudgetRingRig rig;
  ASSERT_NO_FATAL_FAILURE(rig.Open({.name = "small", .max_bytes = 4 * kBs}));
  BufferChain chain(*rig.budget);
  std::string sent;
  for (int i = 0; i < 6; ++i) {
    const std::string msg = Bytes(100, static_cast<char>('a' + i));
    sent += msg;
    TakenCompletion t;
    ASSERT_NO_FATAL_FAILURE(
        WriteAndReceiveOne(rig.ring, **rig.br, rig.sv, chain, msg, &t));
    ASSERT_TRUE(t.status.ok()) << t.status;
    (*rig.br)->Refill();
    // Small receives share one buffer (the ring's pack) and are charged
    // their bytes, rounded up to 64, until the chain holds copy_below (512)
    // bytes; then the ring's buffer is linked, a whole buffer.
    const size_t packed = i < 5 ? (i + 1) * 100 : 500;
    const size_t charged = (packed + 63) / 64 * 64 + (i < 5 ? 0 : kBs);
    EXPECT_EQ(rig.budget->pinned_bytes(), charged) << "receive " << i;
  }
  EXPECT_EQ(Contents(chain), sent);
  chain.Consume(chain.size());
  EXPECT_EQ(rig.budget->pinned_bytes(), 0u);
  // A budget at its limit (another of its chains pins it all): a small
  // receive into an empty chain is packed and kept, and counted only as far
  // as the budget has room (none): the limit is not passed.
  BufferChain other(*rig.budget);
  ASSERT_TRUE(other.Append(Bytes(4 * kBs, 'o')).ok());
  ASSERT_EQ(rig.budget->room_bytes(), 0u);
  ASSERT_EQ(write(rig.sv[0].get(), "tiny", 4), 4);
  io_uring_sqe* sqe = io_uring_get_sqe(rig.ring.get());
  (*rig.br)->PrepareRecv(sqe, rig.sv[1].get(),
                         {.multishot = false, .bundle = false});
  TakenCompletion t;
  ASSERT_NO_FATAL_FAILURE(SubmitAndTakeOne(rig.ring, **rig.br, chain, &t));
  EXPECT_TRUE(t.status.ok()) << t.status;
  EXPECT_EQ(Contents(chain), "tiny");
  EXPECT_EQ(rig.budget->pinned_bytes(), 4 * kBs);
  EXPECT_LE(rig.budget->Stats().high_water_bytes, rig.budget->max_bytes());
  chain.Clear();
  other.Clear();
}

// Take()'s inline link (a completion of at least copy_below bytes into an
// empty chain) charges the bound chain's budget the buffer it pins, and
// Consume() releases it; a budget without room for that buffer leaves the
// completion to the slow path, which keeps the bytes and says so.
TEST(BudgetRingTest, ALinkIntoAnEmptyChainChargesItsBuffer) {
  BudgetRingRig rig;
  ASSERT_NO_FATAL_FAILURE(rig.Open({.name = "linked", .max_bytes = 2 * kBs}));
  BufferChain chain(*rig.budget);
  auto receive = [&](const std::string& msg, TakenCompletion* t) {
    ASSERT_EQ(write(rig.sv[0].get(), msg.data(), msg.size()),
              static_cast<ssize_t>(msg.size()));
    io_uring_sqe* sqe = io_uring_get_sqe(rig.ring.get());
    (*rig.br)->PrepareRecv(sqe, rig.sv[1].get(),
                           {.multishot = false, .bundle = false});
    ASSERT_NO_FATAL_FAILURE(SubmitAndTakeOne(rig.ring, **rig.br, chain, t));
    ASSERT_EQ(t->res, static_cast<int>(msg.size()));
  };
  const std::string msg = Bytes(1000, 'm');  // above copy_below (512)
  for (int i = 0; i < 3; ++i) {
    TakenCompletion t;
    ASSERT_NO_FATAL_FAILURE(receive(msg, &t));
    EXPECT_TRUE(t.status.ok()) << t.status;
    EXPECT_EQ((*rig.br)->available(), 8u);  // linked; the id lent again
    EXPECT_EQ((*rig.br)->copied(), 0u);
    EXPECT_EQ(rig.budget->pinned_bytes(), kBs);
    EXPECT_EQ(chain.pinned_bytes(), kBs);
    EXPECT_EQ(Contents(chain), msg);
    chain.Consume(chain.size());
    EXPECT_EQ(rig.budget->pinned_bytes(), 0u);
    (*rig.br)->Refill();
  }
  // Another chain pins all but half a buffer: no room for the link, so
  // the completion goes to the slow path, which keeps it and reports it.
  BufferChain other(*rig.budget);
  ASSERT_TRUE(other.Append(Bytes(2 * kBs - 1, 'o')).ok());
  ASSERT_EQ(rig.budget->room_bytes(), 0u);
  TakenCompletion t;
  ASSERT_NO_FATAL_FAILURE(receive(msg, &t));
  EXPECT_EQ(t.status.code(), absl::StatusCode::kResourceExhausted) << t.status;
  EXPECT_NE(t.status.message().find("1000 bytes were kept in the chain"),
            std::string::npos)
      << t.status;
  EXPECT_EQ(Contents(chain), msg);
  EXPECT_EQ(rig.budget->pinned_bytes(), 3 * kBs);
  EXPECT_EQ(rig.budget->Stats().refusals, 1u);
  chain.Clear();
  other.Clear();
  EXPECT_EQ(rig.budget->pinned_bytes(), 0u);
}

}  // namespace
}  // namespace bufpool

namespace bufpool {
namespace {

// The accounting invariant (budget.h): the budgets' pinned bytes sum to at
// most the buffers their chains hold (each once), plus their packed runs
// rounded up to 64, plus a buffer per budget; and no budget's high water
// passes its max_bytes.
void ExpectInvariant(const std::vector<const BufferBudget*>& budgets,
                     const std::vector<const BufferChain*>& chains) {
  std::set<std::pair<const BufferPool*, uint32_t>> held;
  size_t out = 0;
  for (const BufferChain* c : chains) {
    for (size_t k = 0; k < c->slice_count(); ++k) {
      const SharedBuffer& s = c->slice(k);
      if (held.insert({s.pool(), s.slot()}).second) {
        out += s.pool()->buffer_size();
      }
    }
  }
  size_t pinned = 0;
  for (const BufferBudget* b : budgets) {
    pinned += b->pinned_bytes();
    EXPECT_LE(b->Stats().high_water_bytes, b->max_bytes()) << b->name();
  }
  EXPECT_LE(pinned, out + budgets.size() * kBs);
}

// 1,000 connections, each with its own budget, each holding a 100-byte
// partial received under copy_below through one ReceivePack: the pool has
// 25 buffers out for them; each budget counts about its bytes.
TEST(BudgetAccountingTest, AThousandPackedPartialsCountTheirBytes) {
  auto pool = MakePool(64);
  ReceivePack pack(*pool);
  std::vector<std::unique_ptr<BufferBudget>> budgets;
  std::vector<BufferChain> chains;
  budgets.reserve(1000);
  chains.reserve(1000);
  Buffer scratch = pool->TryAcquire();  // a receive's buffer, copied from
  ASSERT_TRUE(scratch);
  const std::string partial = Bytes(100, 'p');
  std::memcpy(scratch.data(), partial.data(), partial.size());
  for (int i = 0; i < 1000; ++i) {
    budgets.push_back(MakeBudget(
        *pool, {.name = "conn " + std::to_string(i), .max_bytes = 8 * kBs}));
    chains.emplace_back(*budgets.back());
    EXPECT_FALSE(chains.back().Receive(scratch, partial.size(),
                                       {.copy_below = kBs / 8, .pack = &pack}))
        << "a 100-byte partial is copied into the pack";
  }
  scratch.Reset();
  const size_t out = pool->Stats().in_use * kBs;
  EXPECT_EQ(pool->Stats().in_use, 25u);  // 40 partials a buffer
  size_t sum = 0;
  std::vector<const BufferBudget*> b;
  std::vector<const BufferChain*> c;
  for (int i = 0; i < 1000; ++i) {
    EXPECT_LE(budgets[i]->pinned_bytes(), 1024u) << budgets[i]->name();
    EXPECT_EQ(budgets[i]->pinned_bytes(), 128u) << budgets[i]->name();
    EXPECT_EQ(Contents(chains[i]), partial);
    sum += budgets[i]->pinned_bytes();
    b.push_back(budgets[i].get());
    c.push_back(&chains[i]);
  }
  EXPECT_LE(sum, 2 * out) << "the budgets' sum against the pool's bytes out";
  EXPECT_GE(sum, out / 2);
  ExpectInvariant(b, c);
  chains.clear();
  for (auto& budget : budgets) EXPECT_EQ(budget->pinned_bytes(), 0u);
}

// One buffer in a connection's input chain and in its reply (which links
// the received bytes) counts once; it goes when the last of them drops it.
TEST(BudgetAccountingTest, ABufferInInputAndReplyCountsOnce) {
  auto pool = MakePool(16);
  auto budget = MakeBudget(*pool, {.name = "conn", .max_bytes = 8 * kBs});
  BufferChain input(*budget), reply(*budget);
  ASSERT_TRUE(input.Append(Bytes(1000, 'i')).ok());
  EXPECT_EQ(budget->pinned_bytes(), kBs);
  reply.Append(input.slice(0));  // the reply links the request's bytes
  EXPECT_EQ(budget->pinned_bytes(), kBs);
  BufferChain echo = input.Clone();
  reply.Append(std::move(echo));
  EXPECT_EQ(budget->pinned_bytes(), kBs);
  ExpectInvariant({budget.get()}, {&input, &reply});
  input.Consume(input.size());  // the reply still holds it
  EXPECT_EQ(budget->pinned_bytes(), kBs);
  EXPECT_EQ(pool->Stats().in_use, 1u);
  reply.Clear();
  EXPECT_EQ(budget->pinned_bytes(), 0u);
  EXPECT_EQ(pool->Stats().in_use, 0u);
  // Two budgets sharing a buffer: it counts for the first to link it, and
  // for the other once the first lets go and the other links it again.
  auto other = MakeBudget(*pool, {.name = "peer", .max_bytes = 8 * kBs});
  BufferChain mine(*budget), theirs(*other);
  ASSERT_TRUE(mine.Append(Bytes(10, 'm')).ok());
  theirs.Append(mine.slice(0));
  EXPECT_EQ(budget->pinned_bytes(), kBs);
  EXPECT_EQ(other->pinned_bytes(), 0u);
  ExpectInvariant({budget.get(), other.get()}, {&mine, &theirs});
  mine.Clear();
  EXPECT_EQ(budget->pinned_bytes(), 0u);
  BufferChain again(*other);
  again.Append(theirs.slice(0));  // links it again: now it is counted
  EXPECT_EQ(other->pinned_bytes(), kBs);
  ExpectInvariant({budget.get(), other.get()}, {&theirs, &again});
  again.Clear();
  theirs.Clear();
  EXPECT_EQ(other->pinned_bytes(), 0u);
  EXPECT_EQ(pool->Stats().in_use, 0u);
}

// A slow reader: a client that sends requests and never reads the replies,
// which link the requests' bytes and add a header. The server receives on
// a provided-buffer ring, arming a receive only while the budget has room
// for what it may bring (budget.h, "The cap"), and stops when it has none:
// the budget's high water never passes max_bytes, and nothing is lost.
TEST(BudgetAccountingTest, ASlowReaderNeverPassesTheCap) {
  BudgetRingRig rig;
  ASSERT_NO_FATAL_FAILURE(rig.Open({.name = "slow", .max_bytes = 10 * kBs}));
  BufferChain input(*rig.budget), replies(*rig.budget);
  std::string want;
  int served = 0, refused = 0;
  for (int i = 0; i < 40; ++i) {
    if (rig.budget->room_bytes() < kBs) break;  // do not arm: paused
    const std::string msg = Bytes(i % 3 == 0 ? 300 : 2500, 'a' + i % 26);
    TakenCompletion t;
    ASSERT_NO_FATAL_FAILURE(
        WriteAndReceiveOne(rig.ring, **rig.br, rig.sv, input, msg, &t));
    (*rig.br)->Refill();
    ASSERT_EQ(t.res, static_cast<int>(msg.size()));
    const std::string header = "len " + std::to_string(msg.size()) + "\n";
    const absl::Status s = replies.Append(header);
    if (!s.ok()) {
      // Refused whole: the header is not in the replies; the request stays.
      EXPECT_NE(s.message().find("budget \"slow\""), std::string::npos) << s;
      ++refused;
      continue;
    }
    want += header + msg;
    replies.Append(input.Split(input.size()));  // links the request
    ++served;
    ExpectInvariant({rig.budget.get()}, {&input, &replies});
  }
  EXPECT_GT(served, 3);
  EXPECT_LE(rig.budget->Stats().high_water_bytes, rig.budget->max_bytes());
  EXPECT_EQ(Contents(replies), want);
  EXPECT_EQ(rig.budget->Stats().refusals, static_cast<uint64_t>(refused));
  input.Clear();
  replies.Clear();
  EXPECT_EQ(rig.budget->pinned_bytes(), 0u);
}

// Chains bound to four budgets, one a thread, on one pool with caches:
// each thread receives, splits, clones and compacts its own chains and
// passes copies of its slices to the next thread, whose chains link them
// (a buffer shared across budgets, its owner word raced for); unbound
// chains move between threads. At the end, with every thread stopped, the
// invariant holds; then every budget goes to 0 and the pool to empty.
TEST(BudgetAccountingTest, ThreadsShareSlicesAcrossBudgets) {
  constexpr int kThreads = 4;
  constexpr int kRounds = 2000;
  auto made = BufferPool::Create({.buffer_size = kBs, .buffer_count = 256});
  ASSERT_TRUE(made.ok()) << made.status();
  BufferPool& pool = **made;
  std::vector<std::unique_ptr<BufferBudget>> budgets;
  for (int t = 0; t < kThreads; ++t) {
    budgets.push_back(MakeBudget(
        pool, {.name = "t" + std::to_string(t), .max_bytes = 24 * kBs}));
  }
  struct Mailbox {
    std::mutex mu;
    std::vector<SharedBuffer> slices;
    std::vector<BufferChain> loose;  // unbound chains handed over
  };
  std::array<Mailbox, kThreads> boxes;
  std::array<std::vector<BufferChain>, kThreads> kept;
  std::atomic<int> failures{0};
  auto work = [&](int t) {
    BufferBudget& budget = *budgets[t];
    ReceivePack pack(pool);
    std::vector<BufferChain>& chains = kept[t];
    for (int k = 0; k < 4; ++k) chains.emplace_back(budget);
    uint32_t x = 12345u + t;
    for (int r = 0; r < kRounds; ++r) {
      x = x * 1103515245u + 12345u;
      BufferChain& c = chains[(x >> 8) % chains.size()];
      switch ((x >> 16) % 8) {
        case 0:
          c.Append(Bytes(1 + (x >> 4) % 5000, 'a')).IgnoreError();
          break;
        case 1: {  // a short partial through the pack
          const std::string b = Bytes(1 + (x >> 4) % 200, 'p');
          c.AppendPacked(
              absl::MakeConstSpan(reinterpret_cast<const std::byte*>(b.data()),
                                  b.size()),
              pack);
          break;
        }
        case 2:
          chains[(x >> 4) % chains.size()].Append(c.Split((x >> 3) % 3000));
          break;
        case 3:
          if (c.slice_count() < 16) {
            chains[(x >> 4) % chains.size()].Append(c.Clone());
          }
          break;
        case 4:
          c.Compact().IgnoreError();
          break;
        case 5: {  // slices and an unbound chain to the next thread
          Mailbox& to = boxes[(t + 1) % kThreads];
          BufferChain loose(pool);
          loose.Append(c.Split((x >> 4) % 2000));
          std::lock_guard<std::mutex> lock(to.mu);
          for (size_t k = 0; k < c.slice_count() && k < 3; ++k) {
            to.slices.push_back(c.slice(k));
          }
          to.loose.push_back(std::move(loose));
          break;
        }
        case 6: {  // what the previous thread sent, linked here
          std::vector<SharedBuffer> slices;
          std::vector<BufferChain> loose;
          {
            std::lock_guard<std::mutex> lock(boxes[t].mu);
            slices.swap(boxes[t].slices);
            loose.swap(boxes[t].loose);
          }
          for (SharedBuffer& s : slices) c.Append(std::move(s));
          for (BufferChain& l : loose) c.Append(std::move(l));
          break;
        }
        default:
          c.Consume((x >> 4) % 6000);
          break;
      }
      // Bounded: what a chain links from others is dropped past 64 slices.
      for (BufferChain& chain : chains) {
        if (chain.slice_count() > 64) chain.Clear();
      }
      if (budget.Stats().high_water_bytes > budget.max_bytes()) ++failures;
    }
  };
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) threads.emplace_back(work, t);
  for (std::thread& th : threads) th.join();
  EXPECT_EQ(failures.load(), 0) << "a budget's high water passed its cap";
  std::vector<const BufferBudget*> b;
  std::vector<const BufferChain*> c;
  for (int t = 0; t < kThreads; ++t) {
    b.push_back(budgets[t].get());
    for (const BufferChain& chain : kept[t]) c.push_back(&chain);
  }
  ExpectInvariant(b, c);
  for (auto& box : boxes) {
    box.slices.clear();
    box.loose.clear();
  }
  for (auto& chains : kept) chains.clear();
  for (auto& budget : budgets) EXPECT_EQ(budget->pinned_bytes(), 0u);
  EXPECT_EQ(pool.Stats().in_use, 0u);
}

}  // namespace
}  // namespace bufpool

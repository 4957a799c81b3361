// BufferChannel and the token ring beneath it (src/pool/token_ring.h):
// order, a full ring, timeouts, the eventfd, two threads, across fork.
#include "bufpool/channel.h"

#include <poll.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <random>
#include <thread>
#include <vector>

#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "bufpool/buffer_pool.h"
#include "gtest/gtest.h"
#include "pool/token_ring.h"
#include "test_util.h"

namespace bufpool {
namespace {

using internal::RingIdentity;
using internal::TokenRing;

constexpr RingIdentity kIdentity{.dev = 7, .ino = 11, .buffer_size = 4096};

bool Readable(int fd, int timeout_ms) {
  pollfd p{.fd = fd, .events = POLLIN, .revents = 0};
  return poll(&p, 1, timeout_ms) == 1 && (p.revents & POLLIN);
}

TEST(TokenRingTest, DeliversInOrderAndRefusesWhenFull) {
  auto ring = TokenRing::Create(5, kIdentity);  // rounded up to 8
  ASSERT_TRUE(ring.ok()) << ring.status();
  TokenRing& r = **ring;
  EXPECT_EQ(r.capacity(), 8u);
  for (int round = 0; round < 3; ++round) {  // wraps around the slots
    for (uint64_t i = 0; i < 8; ++i) {
      ASSERT_TRUE(r.HasRoom());
      r.Push(100 * round + i);
    }
    EXPECT_FALSE(r.HasRoom());
    EXPECT_EQ(r.size(), 8u);
    for (uint64_t i = 0; i < 8; ++i) {
      uint64_t token = 0;
      ASSERT_TRUE(r.Front(&token));
      EXPECT_EQ(token, 100 * round + i);
      r.Pop();
      EXPECT_TRUE(r.HasRoom());
    }
    uint64_t token;
    EXPECT_FALSE(r.Front(&token));
  }
}

// The receiving role moves from one object to another on the same ring
// (as it does from a dead process to a survivor): the second object's
// view of tail is older than the head the first advanced.
TEST(TokenRingTest, ReceiverRoleMovesBetweenObjects) {
  auto ring = TokenRing::Create(8, kIdentity);
  ASSERT_TRUE(ring.ok());
  TokenRing& first = **ring;
  auto second = TokenRing::Join(first.memory_fd(), first.event_fd(), kIdentity);
  ASSERT_TRUE(second.ok());
  for (uint64_t i = 1; i <= 5; ++i) first.Push(i);
  uint64_t token;
  for (uint64_t i = 1; i <= 3; ++i) {
    ASSERT_TRUE((*second)->Front(&token));
    EXPECT_EQ(token, i);
    (*second)->Pop();
  }
  for (uint64_t i = 4; i <= 5; ++i) {
    ASSERT_TRUE(first.Front(&token));
    EXPECT_EQ(token, i);
    first.Pop();
  }
  EXPECT_FALSE(first.Front(&token));
  EXPECT_FALSE((*second)->Front(&token));
  EXPECT_EQ(first.size(), 0u);
}

TEST(TokenRingTest, RejectsBadCapacity) {
  EXPECT_EQ(TokenRing::Create(0, kIdentity).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(
      TokenRing::Create(TokenRing::kMaxCapacity + 1, kIdentity).status().code(),
      absl::StatusCode::kInvalidArgument);
}

TEST(TokenRingTest, WaitTimesOutWhenEmpty) {
  auto ring = TokenRing::Create(4, kIdentity);
  ASSERT_TRUE(ring.ok());
  const absl::Time start = absl::Now();
  EXPECT_FALSE((*ring)->Wait(start + absl::Milliseconds(30)));
  EXPECT_GE(absl::Now() - start, absl::Milliseconds(30));
  EXPECT_FALSE((*ring)->Wait(absl::InfinitePast()));
}

TEST(TokenRingTest, WaitWakesOnPushFromAnotherThread) {
  auto ring = TokenRing::Create(4, kIdentity);
  ASSERT_TRUE(ring.ok());
  TokenRing& r = **ring;
  std::thread sender([&] {
    absl::SleepFor(absl::Milliseconds(20));
    ASSERT_TRUE(r.HasRoom());
    r.Push(42);
  });
  EXPECT_TRUE(r.Wait(absl::InfiniteFuture()));
  uint64_t token = 0;
  ASSERT_TRUE(r.Front(&token));
  EXPECT_EQ(token, 42u);
  r.Pop();
  sender.join();
}

TEST(TokenRingTest, ArmedEventFdFiresOnceOnPush) {
  auto ring = TokenRing::Create(4, kIdentity);
  ASSERT_TRUE(ring.ok());
  TokenRing& r = **ring;
  EXPECT_FALSE(Readable(r.event_fd(), 0));
  r.Push(1);  // not armed: no notice
  EXPECT_FALSE(Readable(r.event_fd(), 0));
  EXPECT_TRUE(r.Arm());  // a token is there: nothing armed
  uint64_t token;
  ASSERT_TRUE(r.Front(&token));
  r.Pop();
  EXPECT_FALSE(r.Arm());  // empty: armed
  EXPECT_FALSE(Readable(r.event_fd(), 0));
  r.Push(2);
  EXPECT_TRUE(Readable(r.event_fd(), 0));
  r.Push(3);             // the notice was used: no second write
  EXPECT_TRUE(r.Arm());  // clears the count, finds tokens
  EXPECT_FALSE(Readable(r.event_fd(), 0));
}

// Two threads, one sending and one receiving, many tokens through a small
// ring, the receiver mixing polling, sleeping and the eventfd: every token
// arrives once, in order (TSan checks the slots' publication).
TEST(TokenRingTest, TwoThreadsHandEveryTokenOverInOrder) {
  auto ring = TokenRing::Create(16, kIdentity);
  ASSERT_TRUE(ring.ok());
  TokenRing& r = **ring;
  constexpr uint64_t kTokens = 200000;
  std::thread sender([&] {
    for (uint64_t i = 0; i < kTokens; ++i) {
      while (!r.HasRoom()) std::this_thread::yield();
      r.Push(i * 3 + 1);
    }
  });
  uint64_t next = 0;
  while (next < kTokens) {
    uint64_t token;
    if (!r.Front(&token)) {
      switch (next % 3) {
        case 0:
          break;  // poll
        case 1:
          r.Wait(absl::Now() + absl::Seconds(10));
          break;
        case 2:
          if (!r.Arm()) Readable(r.event_fd(), 10000);
          break;
      }
      continue;
    }
    ASSERT_EQ(token, next * 3 + 1);
    r.Pop();
    ++next;
  }
  sender.join();
  uint64_t token;
  EXPECT_FALSE(r.Front(&token));
}

TEST(TokenRingTest, JoinChecksTheDescriptors) {
  auto ring = TokenRing::Create(4, kIdentity);
  ASSERT_TRUE(ring.ok());
  TokenRing& r = **ring;
  EXPECT_TRUE(TokenRing::Join(r.memory_fd(), r.event_fd(), kIdentity).ok());
  RingIdentity other = kIdentity;
  other.ino = 12;
  auto wrong_pool = TokenRing::Join(r.memory_fd(), r.event_fd(), other);
  EXPECT_EQ(wrong_pool.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(wrong_pool.status().message().find("another pool"),
            std::string::npos);
  EXPECT_EQ(TokenRing::Join(-1, r.event_fd(), kIdentity).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_FALSE(TokenRing::Join(r.memory_fd(), -1, kIdentity).ok());
  // Not a sealed memfd: a pipe.
  int p[2];
  ASSERT_EQ(pipe(p), 0);
  auto not_ring = TokenRing::Join(p[0], r.event_fd(), kIdentity);
  EXPECT_EQ(not_ring.status().code(), absl::StatusCode::kInvalidArgument);
  // Not an eventfd: the pipe, or the ring's own memfd, as the event fd.
  for (const int wrong : {p[1], r.memory_fd()}) {
    auto not_event = TokenRing::Join(r.memory_fd(), wrong, kIdentity);
    EXPECT_EQ(not_event.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(not_event.status().message().find("not an eventfd"),
              std::string::npos)
        << not_event.status();
  }
  close(p[0]);
  close(p[1]);
}

// A forked child joins by the descriptors and both directions work; the
// child's blocking wait is woken by the parent's push (a futex shared
// between processes) and the parent's eventfd by the child's.
TEST(TokenRingTest, HandsTokensBothWaysAcrossFork) {
  SKIP_FORKED_JOIN_UNDER_TSAN();
  auto to_child = TokenRing::Create(8, kIdentity);
  auto to_parent = TokenRing::Create(8, kIdentity);
  ASSERT_TRUE(to_child.ok() && to_parent.ok());
  constexpr uint64_t kRounds = 20000;
  const pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    auto in = TokenRing::Join((*to_child)->memory_fd(), (*to_child)->event_fd(),
                              kIdentity);
    auto out = TokenRing::Join((*to_parent)->memory_fd(),
                               (*to_parent)->event_fd(), kIdentity);
    if (!in.ok() || !out.ok()) _exit(2);
    for (uint64_t i = 0; i < kRounds; ++i) {
      uint64_t token;
      while (!(*in)->Front(&token)) {
        if (!(*in)->Wait(absl::Now() + absl::Seconds(10))) _exit(3);
      }
      (*in)->Pop();
      if (token != i) _exit(4);
      while (!(*out)->HasRoom()) sched_yield();
      (*out)->Push(token + 1000000);
    }
    _exit(0);
  }
  TokenRing& out = **to_child;
  TokenRing& in = **to_parent;
  for (uint64_t i = 0; i < kRounds; ++i) {
    ASSERT_TRUE(out.HasRoom());
    out.Push(i);
    uint64_t token;
    while (!in.Front(&token)) {
      if (!in.Arm()) {
        ASSERT_TRUE(Readable(in.event_fd(), 10000));
      }
    }
    in.Pop();
    ASSERT_EQ(token, i + 1000000);
  }
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0);
}

// ---- BufferChannel ----

std::unique_ptr<BufferPool> MakePool(bool shared, size_t count = 64) {
  PoolOptions options;
  options.buffer_count = count;
  options.shared = shared;
  auto pool = BufferPool::Create(options);
  if (!pool.ok()) {
    ADD_FAILURE() << pool.status();
    return nullptr;
  }
  return *std::move(pool);
}

// Writes `stamp` into every word of the buffer; Stamped() checks it.
void Stamp(const Buffer& b, uint64_t stamp) {
  auto* words = reinterpret_cast<uint64_t*>(b.data());
  for (size_t i = 0; i < b.size() / sizeof(uint64_t); ++i) words[i] = stamp + i;
}
bool Stamped(const Buffer& b, uint64_t stamp) {
  const auto* words = reinterpret_cast<const uint64_t*>(b.data());
  for (size_t i = 0; i < b.size() / sizeof(uint64_t); ++i) {
    if (words[i] != stamp + i) return false;
  }
  return true;
}

// How many buffers the pool hands this process now: takes them all and
// gives them back.
size_t CountFree(BufferPool& pool) {
  std::vector<Buffer> all;
  while (Buffer b = pool.TryAcquire()) all.push_back(std::move(b));
  return all.size();
}

class BufferChannelTest : public testing::TestWithParam<bool> {};
INSTANTIATE_TEST_SUITE_P(PrivateAndShared, BufferChannelTest, testing::Bool(),
                         [](const auto& info) {
                           return info.param ? "Shared" : "Private";
                         });

TEST_P(BufferChannelTest, DeliversInOrderWithContentsIntact) {
  auto pool = MakePool(GetParam());
  ASSERT_NE(pool, nullptr);
  auto ch = BufferChannel::Create(*pool, 16);
  ASSERT_TRUE(ch.ok()) << ch.status();
  std::vector<uint32_t> slots;
  for (uint64_t i = 0; i < 16; ++i) {
    Buffer b = pool->TryAcquire();
    ASSERT_TRUE(b);
    Stamp(b, i << 32);
    slots.push_back(b.slot());
    ASSERT_TRUE((*ch)->Send(std::move(b)).ok());
    EXPECT_FALSE(b);  // the handle was emptied
  }
  EXPECT_EQ((*ch)->size(), 16u);
  for (uint64_t i = 0; i < 16; ++i) {
    absl::StatusOr<Buffer> b = (*ch)->Receive(absl::ZeroDuration());
    ASSERT_TRUE(b.ok()) << b.status();
    EXPECT_EQ(b->slot(), slots[i]);  // the same buffer: no copy
    EXPECT_TRUE(Stamped(*b, i << 32));
  }
  EXPECT_FALSE((*ch)->TryReceive());
  EXPECT_EQ((*ch)->Stats().sent, 16u);
  EXPECT_EQ((*ch)->Stats().received, 16u);
  EXPECT_EQ((*ch)->Stats().refused, 0u);
  EXPECT_EQ(pool->Stats().in_use, 0u);
}

TEST_P(BufferChannelTest, FullChannelLeavesTheBufferWithTheCaller) {
  auto pool = MakePool(GetParam());
  ASSERT_NE(pool, nullptr);
  auto ch = BufferChannel::Create(*pool, 2);
  ASSERT_TRUE(ch.ok());
  for (int i = 0; i < 2; ++i) ASSERT_TRUE((*ch)->Send(pool->TryAcquire()).ok());
  Buffer extra = pool->TryAcquire();
  Stamp(extra, 99);
  const uint32_t slot = extra.slot();
  absl::Status full = (*ch)->Send(std::move(extra));
  EXPECT_EQ(full.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(full.message().find("full"), std::string::npos) << full;
  ASSERT_TRUE(extra);  // kept, untouched
  EXPECT_EQ(extra.slot(), slot);
  EXPECT_TRUE(Stamped(extra, 99));
  // In flight: a private pool counts the two sent as in use; a shared one
  // counts only what the process holds (its Stats() are the process's), so
  // the exported two are not among them.
  EXPECT_EQ(pool->Stats().in_use, GetParam() ? 1u : 3u);
  EXPECT_EQ((*ch)->Drain(), 2u);
  ASSERT_TRUE((*ch)->Send(std::move(extra)).ok());  // room again
  EXPECT_EQ((*ch)->Drain(), 1u);
  EXPECT_EQ(pool->Stats().in_use, 0u);
}

TEST_P(BufferChannelTest, SendRefusesEmptyAndForeignHandles) {
  auto pool = MakePool(GetParam());
  auto other = MakePool(false);
  ASSERT_TRUE(pool && other);
  auto ch = BufferChannel::Create(*pool, 4);
  ASSERT_TRUE(ch.ok());
  EXPECT_EQ((*ch)->Send(Buffer()).code(), absl::StatusCode::kInvalidArgument);
  Buffer foreign = other->TryAcquire();
  EXPECT_EQ((*ch)->Send(std::move(foreign)).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(foreign);
  EXPECT_EQ((*ch)->size(), 0u);
}

TEST_P(BufferChannelTest, ReceiveTimesOut) {
  auto pool = MakePool(GetParam());
  ASSERT_NE(pool, nullptr);
  auto ch = BufferChannel::Create(*pool, 4);
  ASSERT_TRUE(ch.ok());
  const absl::Time start = absl::Now();
  auto b = (*ch)->Receive(absl::Milliseconds(20));
  EXPECT_EQ(b.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_GE(absl::Now() - start, absl::Milliseconds(20));
  EXPECT_EQ((*ch)->Receive(absl::ZeroDuration()).status().code(),
            absl::StatusCode::kDeadlineExceeded);
}

TEST_P(BufferChannelTest, EventFdBecomesReadableAfterAnArmingReceive) {
  auto pool = MakePool(GetParam());
  ASSERT_NE(pool, nullptr);
  auto ch = BufferChannel::Create(*pool, 4);
  ASSERT_TRUE(ch.ok());
  BufferChannel& c = **ch;
  EXPECT_EQ(c.Receive(absl::ZeroDuration()).status().code(),
            absl::StatusCode::kDeadlineExceeded);  // arms
  EXPECT_FALSE(Readable(c.event_fd(), 0));
  ASSERT_TRUE(c.Send(pool->TryAcquire()).ok());
  EXPECT_TRUE(Readable(c.event_fd(), 0));
  ASSERT_TRUE(c.Receive(absl::ZeroDuration()).ok());
  EXPECT_EQ(c.Receive(absl::ZeroDuration()).status().code(),
            absl::StatusCode::kDeadlineExceeded);  // re-arms, clears
  EXPECT_FALSE(Readable(c.event_fd(), 0));
  std::thread sender([&] {
    absl::SleepFor(absl::Milliseconds(10));
    ASSERT_TRUE(c.Send(pool->TryAcquire()).ok());
  });
  EXPECT_TRUE(Readable(c.event_fd(), 10000));
  sender.join();
  EXPECT_TRUE(c.Receive(absl::ZeroDuration()).ok());
}

TEST_P(BufferChannelTest, BlockingReceiveIsWokenBySend) {
  auto pool = MakePool(GetParam());
  ASSERT_NE(pool, nullptr);
  auto ch = BufferChannel::Create(*pool, 4);
  ASSERT_TRUE(ch.ok());
  std::thread sender([&] {
    absl::SleepFor(absl::Milliseconds(20));
    Buffer b = pool->TryAcquire();
    Stamp(b, 5);
    ASSERT_TRUE((*ch)->Send(std::move(b)).ok());
  });
  auto b = (*ch)->Receive();
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_TRUE(Stamped(*b, 5));
  sender.join();
}

// A token the pool refuses (imported already: stale) is skipped and
// counted, and the buffers behind it still arrive.
TEST_P(BufferChannelTest, SkipsAndCountsARefusedToken) {
  auto pool = MakePool(GetParam());
  ASSERT_NE(pool, nullptr);
  auto ch = BufferChannel::Create(*pool, 4);
  ASSERT_TRUE(ch.ok());
  // A second view of the same ring, to push a raw token into it.
  internal::RingIdentity id{.ino = reinterpret_cast<uintptr_t>(pool.get()),
                            .buffer_size = pool->buffer_size()};
  if (pool->shared_fd() >= 0) {
    struct stat st;
    ASSERT_EQ(fstat(pool->shared_fd(), &st), 0);
    id = {.dev = static_cast<uint64_t>(st.st_dev) | (uint64_t{1} << 63),
          .ino = static_cast<uint64_t>(st.st_ino),
          .buffer_size = pool->buffer_size()};
  }
  auto raw = TokenRing::Join((*ch)->memory_fd(), (*ch)->event_fd(), id);
  ASSERT_TRUE(raw.ok()) << raw.status();
  const BufferToken token = pool->Export(pool->TryAcquire());
  absl::StatusOr<Buffer> first = pool->Import(token);
  ASSERT_TRUE(first.ok()) << first.status();
  (*raw)->Push(token.value);          // stale now
  (*raw)->Push(0x7fffffffffffffffu);  // forged
  Buffer good = pool->TryAcquire();
  Stamp(good, 17);
  ASSERT_TRUE((*ch)->Send(std::move(good)).ok());
  Buffer got = (*ch)->TryReceive();
  ASSERT_TRUE(got);
  EXPECT_TRUE(Stamped(got, 17));
  EXPECT_EQ((*ch)->Stats().refused, 2u);
  EXPECT_FALSE((*ch)->last_refusal().ok());
  EXPECT_EQ(pool->Stats().in_use, 2u);  // `first` and `got`: nothing else
}

// Two threads, many buffers through a small channel, each stamped with its
// sequence number; the receiver mixes polling, sleeping and the eventfd.
TEST_P(BufferChannelTest, TwoThreadsHandEveryBufferOverIntact) {
  auto pool = MakePool(GetParam(), 64);
  ASSERT_NE(pool, nullptr);
  auto ch = BufferChannel::Create(*pool, 8);
  ASSERT_TRUE(ch.ok());
  BufferChannel& c = **ch;
  constexpr uint64_t kBuffers = 20000;
  std::thread sender([&] {
    for (uint64_t i = 0; i < kBuffers; ++i) {
      Buffer b;
      while (!(b = pool->TryAcquire())) std::this_thread::yield();
      reinterpret_cast<uint64_t*>(b.data())[0] = i;
      reinterpret_cast<uint64_t*>(b.data())[b.size() / 8 - 1] = ~i;
      absl::Status s;
      while ((s = c.Send(std::move(b))).code() ==
             absl::StatusCode::kResourceExhausted) {
        std::this_thread::yield();
      }
      ASSERT_TRUE(s.ok()) << s;
    }
  });
  for (uint64_t next = 0; next < kBuffers;) {
    Buffer b;
    switch (next % 3) {
      case 0:
        b = c.TryReceive();
        break;
      case 1: {
        auto r = c.Receive(absl::Seconds(10));
        ASSERT_TRUE(r.ok()) << r.status();
        b = *std::move(r);
        break;
      }
      case 2: {
        auto r = c.Receive(absl::ZeroDuration());
        if (r.ok()) {
          b = *std::move(r);
        } else {
          Readable(c.event_fd(), 10000);
        }
        break;
      }
    }
    if (!b) continue;
    ASSERT_EQ(reinterpret_cast<uint64_t*>(b.data())[0], next);
    ASSERT_EQ(reinterpret_cast<uint64_t*>(b.data())[b.size() / 8 - 1], ~next);
    ++next;
  }
  sender.join();
  EXPECT_EQ(c.Stats().received, kBuffers);
  EXPECT_EQ(c.Stats().refused, 0u);
  EXPECT_EQ(pool->Stats().in_use, 0u);
}

TEST(BufferChannelJoinTest, RefusesAPrivatePoolAndAnotherPoolsChannel) {
  auto priv = MakePool(false);
  auto a = MakePool(true);
  auto b = MakePool(true);
  ASSERT_TRUE(priv && a && b);
  auto ch = BufferChannel::Create(*a, 4);
  ASSERT_TRUE(ch.ok());
  EXPECT_EQ(BufferChannel::Join(*priv, (*ch)->memory_fd(), (*ch)->event_fd())
                .status()
                .code(),
            absl::StatusCode::kFailedPrecondition);
  auto wrong = BufferChannel::Join(*b, (*ch)->memory_fd(), (*ch)->event_fd());
  EXPECT_EQ(wrong.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(
      BufferChannel::Join(*a, (*ch)->memory_fd(), (*ch)->event_fd()).ok());
}

// ---- Across processes (a shared pool) ----

// A forked child joins the pool and two channels; buffers go both ways,
// stamped by each side; at the end every buffer is back.
TEST(BufferChannelProcessTest, ForkedChildHandsBuffersBothWays) {
  SKIP_FORKED_JOIN_UNDER_TSAN();
  constexpr size_t kCount = 128;
  auto pool = MakePool(true, kCount);
  ASSERT_NE(pool, nullptr);
  auto to_child = BufferChannel::Create(*pool, 16);
  auto to_parent = BufferChannel::Create(*pool, 16);
  ASSERT_TRUE(to_child.ok() && to_parent.ok());
  constexpr uint64_t kRounds = 5000;
  const pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    int code = 0;
    {
      auto joined = BufferPool::Join(pool->shared_fd());
      if (!joined.ok()) _exit(2);
      auto in = BufferChannel::Join(**joined, (*to_child)->memory_fd(),
                                    (*to_child)->event_fd());
      auto out = BufferChannel::Join(**joined, (*to_parent)->memory_fd(),
                                     (*to_parent)->event_fd());
      if (!in.ok() || !out.ok()) _exit(3);
      for (uint64_t i = 0; i < kRounds && code == 0; ++i) {
        auto b = (*in)->Receive(absl::Seconds(20));
        if (!b.ok()) {
          code = 4;
          break;
        }
        if (!Stamped(*b, i << 20)) {
          code = 5;
          break;
        }
        Stamp(*b, (i << 20) + 7);               // answered in the same buffer
        Buffer mine = (*joined)->TryAcquire();  // and one of the child's
        if (!mine) {
          code = 6;
          break;
        }
        Stamp(mine, (i << 20) + 9);
        if (!(*out)->Send(*std::move(b)).ok()) {
          code = 7;
          break;
        }
        absl::Status s;
        while ((s = (*out)->Send(std::move(mine))).code() ==
               absl::StatusCode::kResourceExhausted) {
          sched_yield();
        }
        if (!s.ok()) code = 8;
      }
      if ((*joined)->Stats().in_use != 0) code = 9;
    }
    _exit(code);
  }
  BufferChannel& out = **to_child;
  BufferChannel& in = **to_parent;
  for (uint64_t i = 0; i < kRounds; ++i) {
    Buffer b = pool->TryAcquire();
    ASSERT_TRUE(b);
    Stamp(b, i << 20);
    ASSERT_TRUE(out.Send(std::move(b)).ok());
    for (uint64_t want : {uint64_t{7}, uint64_t{9}}) {
      auto back = in.Receive(absl::Seconds(20));
      ASSERT_TRUE(back.ok()) << back.status() << " at round " << i;
      ASSERT_TRUE(Stamped(*back, (i << 20) + want)) << "round " << i;
    }
  }
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0);
  pool->ReclaimDead();
  EXPECT_EQ(in.Stats().refused, 0u);
  EXPECT_EQ(CountFree(*pool), kCount);
}

// A child holding buffers, with tokens in flight both ways, is killed with
// SIGKILL: after ReclaimDead() every buffer is back, the tokens it sent are
// refused (stale) and skipped, and those sent to it are received again.
TEST(BufferChannelProcessTest, KilledPeerWithTokensInFlightLosesNothing) {
  SKIP_FORKED_JOIN_UNDER_TSAN();
  constexpr size_t kCount = 64;
  auto pool = MakePool(true, kCount);
  ASSERT_NE(pool, nullptr);
  auto to_child = BufferChannel::Create(*pool, 16);
  auto to_parent = BufferChannel::Create(*pool, 16);
  ASSERT_TRUE(to_child.ok() && to_parent.ok());
  // The parent sends 8; the child imports 3 of them and keeps them.
  for (int i = 0; i < 8; ++i) {
    Buffer b = pool->TryAcquire();
    Stamp(b, 1000 + i);
    ASSERT_TRUE((*to_child)->Send(std::move(b)).ok());
  }
  int ready[2];
  ASSERT_EQ(pipe(ready), 0);
  const pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    auto joined = BufferPool::Join(pool->shared_fd());
    if (!joined.ok()) _exit(2);
    auto in = BufferChannel::Join(**joined, (*to_child)->memory_fd(),
                                  (*to_child)->event_fd());
    auto out = BufferChannel::Join(**joined, (*to_parent)->memory_fd(),
                                   (*to_parent)->event_fd());
    if (!in.ok() || !out.ok()) _exit(3);
    std::vector<Buffer> held;
    for (int i = 0; i < 3; ++i) held.push_back((*in)->TryReceive());
    for (int i = 0; i < 5; ++i) held.push_back((*joined)->TryAcquire());
    for (int i = 0; i < 6; ++i) {  // 6 tokens in flight to the parent
      if (!(*out)->Send((*joined)->TryAcquire()).ok()) _exit(4);
    }
    for (const Buffer& b : held) {
      if (!b) _exit(5);
    }
    char c = 1;
    if (write(ready[1], &c, 1) != 1) _exit(6);
    pause();
    _exit(7);
  }
  close(ready[1]);
  char c;
  ASSERT_EQ(read(ready[0], &c, 1), 1);
  close(ready[0]);
  ASSERT_EQ(kill(pid, SIGKILL), 0);
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFSIGNALED(status));
  const size_t reclaimed = pool->ReclaimDead();
  // 3 imported + 5 acquired + 6 exported by the child, at least (its caches
  // and depot share may hold more).
  EXPECT_GE(reclaimed, 14u);
  EXPECT_EQ(pool->ReclaimDead(), 0u);  // twice is harmless
  // The 6 the child sent are stale now: skipped and counted.
  EXPECT_FALSE((*to_parent)->TryReceive());
  EXPECT_EQ((*to_parent)->Stats().refused, 6u);
  // Of the 8 sent to the child, the 5 it did not import come back here.
  size_t stamped = 0;
  for (Buffer b; (b = (*to_child)->TryReceive());) {
    EXPECT_TRUE(Stamped(b, 1003 + stamped));
    ++stamped;
  }
  EXPECT_EQ(stamped, 5u);
  EXPECT_EQ(pool->Stats().in_use, 0u);
  EXPECT_EQ(CountFree(*pool), kCount);
}

// A child that receives, checks and sends back buffers in a loop is killed
// at a random moment, again and again: between an import and its pop,
// between an export and its push, anywhere. After each death and
// ReclaimDead() the parent drains both channels (tokens the child sent are
// refused as stale; those it had not imported come back), every buffer of
// the pool is free again, and every buffer the parent ever received carried
// the stamps it should (none had two owners writing it).
TEST(BufferChannelProcessTest, KillLoopLosesNoBuffer) {
  SKIP_FORKED_JOIN_UNDER_TSAN();
  constexpr size_t kCount = 64;
  constexpr int kKills = 40;
  auto pool = MakePool(true, kCount);
  ASSERT_NE(pool, nullptr);
  auto to_child = BufferChannel::Create(*pool, 16);
  auto to_parent = BufferChannel::Create(*pool, 16);
  ASSERT_TRUE(to_child.ok() && to_parent.ok());
  std::mt19937 rng(59);
  uint64_t next_stamp = 1;
  uint64_t refused_total = 0;
  for (int kill_no = 0; kill_no < kKills; ++kill_no) {
    const pid_t pid = fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      auto joined = BufferPool::Join(pool->shared_fd());
      if (!joined.ok()) _exit(2);
      auto in = BufferChannel::Join(**joined, (*to_child)->memory_fd(),
                                    (*to_child)->event_fd());
      auto out = BufferChannel::Join(**joined, (*to_parent)->memory_fd(),
                                     (*to_parent)->event_fd());
      if (!in.ok() || !out.ok()) _exit(3);
      for (;;) {
        Buffer b = (*in)->TryReceive();
        if (!b) continue;
        // Each word holds the stamp + its index: the child answers with
        // the stamp's complement, written whole, then sends it back.
        const uint64_t stamp = reinterpret_cast<uint64_t*>(b.data())[0];
        if (!Stamped(b, stamp)) _exit(4);
        Stamp(b, ~stamp);
        while (!(*out)->Send(std::move(b)).ok()) {
        }
      }
    }
    // Traffic for a random while, then the kill.
    const auto until = absl::Now() + absl::Microseconds(200 + rng() % 3000);
    while (absl::Now() < until) {
      if (Buffer b = pool->TryAcquire()) {
        Stamp(b, next_stamp << 16);
        ++next_stamp;
        absl::Status s = (*to_child)->Send(std::move(b));
        ASSERT_TRUE(s.ok() || absl::IsResourceExhausted(s)) << s;
      }
      if (Buffer back = (*to_parent)->TryReceive()) {
        const uint64_t stamp = reinterpret_cast<uint64_t*>(back.data())[0];
        ASSERT_TRUE(Stamped(back, stamp)) << "kill " << kill_no;
        ASSERT_EQ(stamp & 0xffff, 0xffffu) << "not answered: kill " << kill_no;
      }
    }
    ASSERT_EQ(kill(pid, SIGKILL), 0);
    int status = 0;
    ASSERT_EQ(waitpid(pid, &status, 0), pid);
    ASSERT_TRUE(WIFSIGNALED(status)) << "the child failed: " << status;
    pool->ReclaimDead();
    // What the child sent and the parent did not receive: answered (the
    // child's exports were reclaimed: refused), or never imported by the
    // child: the parent's own, received here.
    const uint64_t refused_before = (*to_parent)->Stats().refused;
    while (Buffer b = (*to_parent)->TryReceive()) {
      ADD_FAILURE() << "a buffer the dead child exported was imported";
    }
    refused_total += (*to_parent)->Stats().refused - refused_before;
    while (Buffer b = (*to_child)->TryReceive()) {
      const uint64_t stamp = reinterpret_cast<uint64_t*>(b.data())[0];
      EXPECT_TRUE(Stamped(b, stamp));
      EXPECT_EQ(stamp & 0xffff, 0u);  // the parent's, never answered
    }
    ASSERT_EQ(pool->Stats().in_use, 0u) << "kill " << kill_no;
    ASSERT_EQ(CountFree(*pool), kCount) << "kill " << kill_no;
  }
  // The loop did hand buffers over and kill with tokens in flight.
  EXPECT_GT(next_stamp, static_cast<uint64_t>(kKills));
  RecordProperty("refused_after_kills", static_cast<int>(refused_total));
}

}  // namespace
}  // namespace bufpool

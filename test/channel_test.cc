// BufferChannel and the token ring beneath it (src/pool/token_ring.h):
// order, a full ring, timeouts, the eventfd, two threads, across fork.
#include <poll.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdint>
#include <thread>
#include <vector>

#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gtest/gtest.h"
#include "pool/token_ring.h"

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

TEST(TokenRingTest, RejectsBadCapacity) {
  EXPECT_EQ(TokenRing::Create(0, kIdentity).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(TokenRing::Create(TokenRing::kMaxCapacity + 1, kIdentity)
                .status()
                .code(),
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
  r.Push(3);  // the notice was used: no second write
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
  close(p[0]);
  close(p[1]);
}

// A forked child joins by the descriptors and both directions work; the
// child's blocking wait is woken by the parent's push (a futex shared
// between processes) and the parent's eventfd by the child's.
TEST(TokenRingTest, HandsTokensBothWaysAcrossFork) {
  auto to_child = TokenRing::Create(8, kIdentity);
  auto to_parent = TokenRing::Create(8, kIdentity);
  ASSERT_TRUE(to_child.ok() && to_parent.ok());
  constexpr uint64_t kRounds = 20000;
  const pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    auto in = TokenRing::Join((*to_child)->memory_fd(),
                              (*to_child)->event_fd(), kIdentity);
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

}  // namespace
}  // namespace bufpool

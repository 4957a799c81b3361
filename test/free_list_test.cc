#include "pool/free_list.h"

#include <algorithm>
#include <atomic>
#include <numeric>
#include <thread>
#include <vector>

#include "absl/base/config.h"
#include "gtest/gtest.h"

namespace bufpool {
namespace {

TEST(FreeListTest, StartsEmpty) {
  FreeList list(8);
  uint32_t out[8];
  EXPECT_TRUE(list.empty());
  EXPECT_EQ(list.Pop(out, 8), 0u);
}

TEST(FreeListTest, PushedChainPopsInOrderFirstOnTop) {
  FreeList list(8);
  const uint32_t chain[] = {5, 2, 7};
  list.Push(chain, 3);
  const uint32_t one[] = {1};
  list.Push(one, 1);
  uint32_t out[8];
  ASSERT_EQ(list.Pop(out, 2), 2u);
  EXPECT_EQ(out[0], 1u);
  EXPECT_EQ(out[1], 5u);
  ASSERT_EQ(list.Pop(out, 8), 2u);  // fewer than asked: the rest
  EXPECT_EQ(out[0], 2u);
  EXPECT_EQ(out[1], 7u);
  EXPECT_TRUE(list.empty());
}

// The depth kept in the links is the list's length: the pool's free count
// depends on it.
TEST(FreeListTest, DepthFollowsEveryPushAndPop) {
  FreeList list(16);
  EXPECT_EQ(list.Depth(), 0u);
  const uint32_t chain[] = {9, 3, 12, 0};
  list.Push(chain, 4);
  EXPECT_EQ(list.Depth(), 4u);
  list.PushOne(7);
  EXPECT_EQ(list.Depth(), 5u);
  uint32_t out[16];
  uint32_t left = 99;
  ASSERT_EQ(list.Pop(out, 2, &left), 2u);
  EXPECT_EQ(left, 3u);
  EXPECT_EQ(list.Depth(), 3u);
  const uint32_t back[] = {out[1], out[0]};
  list.Push(back, 2);  // onto a list that is not empty: depths stack up
  EXPECT_EQ(list.Depth(), 5u);
  ASSERT_EQ(list.Pop(out, 16, &left), 5u);
  EXPECT_EQ(left, 0u);
  EXPECT_EQ(list.Depth(), 0u);
}

// Threads pop batches and push them back in other shapes; at the end every
// slot is in the list exactly once (no loss, no duplicate: ABA would show as
// either), and the depth the links carry matches.
TEST(FreeListTest, ConcurrentBatchesNeverLoseOrDuplicateSlots) {
  constexpr uint32_t kSlots = 64;
  FreeList list(kSlots);
  std::vector<uint32_t> all(kSlots);
  std::iota(all.begin(), all.end(), 0u);
  list.Push(all.data(), kSlots);

#if defined(ABSL_HAVE_THREAD_SANITIZER)
  constexpr int kRounds = 5000;
#else
  constexpr int kRounds = 200000;
#endif
  std::vector<std::thread> threads;
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&list, t] {
      uint32_t held[16];
      for (int r = 0; r < kRounds; ++r) {
        const uint32_t want = 1 + static_cast<uint32_t>((r + t) % 16);
        const uint32_t n = list.Pop(held, want);
        if (n == 0) continue;
        std::reverse(held, held + n);  // change the links on the way back
        if (r % 2 == 0) {
          list.Push(held, n);
        } else {
          for (uint32_t i = 0; i < n; ++i) list.PushOne(held[i]);
        }
      }
    });
  }
  for (auto& th : threads) th.join();

  EXPECT_EQ(list.Depth(), kSlots);
  std::vector<uint32_t> out(kSlots + 1);
  ASSERT_EQ(list.Pop(out.data(), kSlots + 1), kSlots);
  out.resize(kSlots);
  std::sort(out.begin(), out.end());
  EXPECT_EQ(out, all);
}

}  // namespace
}  // namespace bufpool

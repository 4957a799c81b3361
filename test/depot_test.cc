#include "pool/depot.h"

#include <algorithm>
#include <numeric>
#include <thread>
#include <vector>

#include "absl/base/config.h"
#include "gtest/gtest.h"

namespace bufpool {
namespace {

constexpr uint32_t kNoSlot = Depot::kNoSlot;

std::vector<uint32_t> Iota(uint32_t n) {
  std::vector<uint32_t> v(n);
  std::iota(v.begin(), v.end(), 0u);
  return v;
}

// Pops everything (in chunks of `chunk`) and returns it sorted.
std::vector<uint32_t> DrainSorted(Depot& depot, uint32_t chunk) {
  std::vector<uint32_t> all;
  std::vector<uint32_t> out(chunk);
  uint32_t spare = kNoSlot;
  uint32_t reshelved = 0;
  while (uint32_t n = depot.Pop(out.data(), chunk, &spare, &reshelved)) {
    all.insert(all.end(), out.begin(), out.begin() + n);
  }
  depot.ReturnSpare(&spare);
  std::sort(all.begin(), all.end());
  return all;
}

TEST(DepotTest, SlotsPushedTogetherComeOutInTheirOrder) {
  // 70 slots, batches of 8: eight magazines and a tail of 6 on the list.
  Depot depot(70, 8);
  const std::vector<uint32_t> all = Iota(70);
  depot.Push(all.data(), 70, nullptr);
  std::vector<uint32_t> out(70);
  uint32_t reshelved = 0;
  uint32_t got = 0;
  while (got < 70) {
    const uint32_t n = depot.Pop(out.data() + got, 8, nullptr, &reshelved);
    ASSERT_GT(n, 0u);
    got += n;
  }
  EXPECT_EQ(out, all);  // a fresh pool hands out slots in address order
  EXPECT_EQ(reshelved, 0u);
  EXPECT_EQ(depot.Pop(out.data(), 8, nullptr, &reshelved), 0u);
}

TEST(DepotTest, ASmallPopOpensAMagazineAndReshelvesTheRest) {
  Depot depot(16, 8);
  const std::vector<uint32_t> all = Iota(16);
  depot.Push(all.data(), 16, nullptr);  // two magazines, empty list
  uint32_t one;
  uint32_t reshelved = 0;
  ASSERT_EQ(depot.Pop(&one, 1, nullptr, &reshelved), 1u);
  EXPECT_EQ(one, 0u);
  EXPECT_EQ(reshelved, 7u);  // 1..7 went onto the list for others to find
  std::vector<uint32_t> rest = DrainSorted(depot, 3);
  rest.insert(rest.begin(), one);
  EXPECT_EQ(rest, all);
}

TEST(DepotTest, KeepsOneEmptyMagazineAsTheThreadsSpare) {
  Depot depot(64, 8);
  const std::vector<uint32_t> all = Iota(64);
  depot.Push(all.data(), 64, nullptr);
  uint32_t spare = kNoSlot;
  uint32_t out[8];
  uint32_t reshelved = 0;
  ASSERT_EQ(depot.Pop(out, 8, &spare, &reshelved), 8u);
  ASSERT_NE(spare, kNoSlot);  // the emptied magazine stays with the thread
  const uint32_t kept = spare;
  depot.Push(out, 8, &spare);  // and carries the next spill
  EXPECT_EQ(spare, kNoSlot);
  ASSERT_EQ(depot.Pop(out, 8, &spare, &reshelved), 8u);
  EXPECT_EQ(spare, kept);
  depot.Push(out, 8, &spare);
  EXPECT_EQ(DrainSorted(depot, 8), all);
}

TEST(DepotTest, RunningOutOfMagazinesFallsBackToTheList) {
  // 8 slots in batches of 4: 2 + 64 magazines. Holding every one of them
  // as some thread's spare leaves none for a spill, which must still work.
  Depot depot(8, 4);
  const std::vector<uint32_t> all = Iota(8);
  depot.Push(all.data(), 8, nullptr);
  std::vector<uint32_t> spares;
  uint32_t out[4];
  uint32_t reshelved = 0;
  for (;;) {  // pop and push back full batches, each time with a new spare
    uint32_t spare = kNoSlot;
    ASSERT_EQ(depot.Pop(out, 4, &spare, &reshelved), 4u);
    if (spare == kNoSlot) {  // came from the list: magazines are all held
      depot.Push(out, 4, nullptr);
      break;
    }
    spares.push_back(spare);
    uint32_t none = kNoSlot;
    depot.Push(out, 4, &none);  // takes a magazine from the empty stack
    ASSERT_LE(spares.size(), 66u);
  }
  EXPECT_EQ(spares.size(), 66u);
  EXPECT_EQ(DrainSorted(depot, 4), all);
  for (uint32_t& s : spares) depot.ReturnSpare(&s);
}

// Threads pop and push in every shape (whole magazines, opened ones, single
// slots, with and without spares); at the end every slot is in the depot
// exactly once. Run under ThreadSanitizer in the tsan build.
TEST(DepotTest, ConcurrentMixedShapesNeverLoseOrDuplicateSlots) {
  constexpr uint32_t kSlots = 256;
  constexpr uint32_t kBatch = 8;
  Depot depot(kSlots, kBatch);
  const std::vector<uint32_t> all = Iota(kSlots);
  depot.Push(all.data(), kSlots, nullptr);
#if defined(ABSL_HAVE_THREAD_SANITIZER)
  constexpr int kRounds = 5000;
#else
  constexpr int kRounds = 100000;
#endif
  std::vector<std::thread> threads;
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&depot, t] {
      uint32_t spare = kNoSlot;
      uint32_t held[3 * kBatch];
      uint32_t reshelved = 0;
      for (int r = 0; r < kRounds; ++r) {
        const uint32_t want = 1 + static_cast<uint32_t>((r * 7 + t) % 24);
        uint32_t* const my_spare = (r + t) % 3 == 0 ? nullptr : &spare;
        const uint32_t n = depot.Pop(held, want, my_spare, &reshelved);
        if (n == 0) continue;
        std::reverse(held, held + n);
        if (r % 2 == 0) {
          depot.Push(held, n, my_spare);
        } else {
          for (uint32_t i = 0; i < n; ++i) depot.Push(&held[i], 1, nullptr);
        }
      }
      depot.ReturnSpare(&spare);
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(depot.Size(), kSlots);  // the list's and full magazines' slots
  EXPECT_EQ(DrainSorted(depot, 5), all);
  EXPECT_EQ(depot.Size(), 0u);
}

// Size() counts whole magazines and single slots alike; PopOne reports what
// it left.
TEST(DepotTest, SizeCountsMagazinesAndTheList) {
  Depot depot(64, 8);
  const std::vector<uint32_t> all = Iota(20);
  depot.Push(all.data(), 20, nullptr);  // two magazines, four on the list
  EXPECT_EQ(depot.Size(), 20u);
  uint32_t reshelved = 0, left = 99;
  ASSERT_NE(depot.PopOne(&reshelved, &left), Depot::kNoSlot);
  EXPECT_EQ(left, 19u);
  uint32_t out[8];
  ASSERT_EQ(depot.Pop(out, 8, nullptr, &reshelved), 8u);  // a magazine
  EXPECT_EQ(depot.Size(), 11u);
  Depot plain(8, 0);  // no magazines (caches off)
  plain.PushOne(5);
  EXPECT_EQ(plain.Size(), 1u);
  EXPECT_EQ(plain.PopOne(&reshelved, &left), 5u);
  EXPECT_EQ(left, 0u);
  EXPECT_EQ(plain.PopOne(&reshelved, &left), Depot::kNoSlot);
}

}  // namespace
}  // namespace bufpool

// A user's GoogleTest suite on the installed bufpool/testing.h: a test that
// leaks fails naming the acquire site, the scoped checker and the assertion
// alike, and a test that returns every buffer passes.
#include <cstdio>
#include <memory>
#include <vector>

#include "bufpool/buffer_pool.h"
#include "bufpool/testing.h"
#include "gtest/gtest-spi.h"
#include "gtest/gtest.h"

namespace {

// EXPECT_NONFATAL_FAILURE's statement may not name a test's locals.
bufpool::BufferPool* g_pool = nullptr;
std::vector<bufpool::Buffer>* g_kept = nullptr;

__attribute__((noinline)) void LeakOneHere() {
  g_kept->push_back(g_pool->TryAcquire());
}

TEST(ConsumerTest, ALeakFailsNamingItsSite) {
  auto pool = bufpool::BufferPool::Create(
      {.buffer_count = 16, .track_holders = bufpool::TrackHolders::kAll});
  ASSERT_TRUE(pool.ok()) << pool.status();
  std::vector<bufpool::Buffer> kept;
  g_pool = pool->get();
  g_kept = &kept;
  EXPECT_NONFATAL_FAILURE(
      {
        bufpool::testing::NoHoldersAtExit check(*g_pool);
        LeakOneHere();
      },
      "LeakOneHere");
  EXPECT_FALSE(bufpool::testing::NoHolders(**pool));
  EXPECT_NONFATAL_FAILURE(bufpool::testing::ExpectNoHolders(*g_pool),
                          "LeakOneHere");
  kept.clear();
  EXPECT_TRUE(bufpool::testing::NoHolders(**pool));
}

TEST(ConsumerTest, NoLeakPasses) {
  auto pool = bufpool::BufferPool::Create({.buffer_count = 16});
  ASSERT_TRUE(pool.ok()) << pool.status();
  bufpool::testing::NoHoldersAtExit check(**pool);
  bufpool::Buffer b = (*pool)->TryAcquire();
  ASSERT_TRUE(b);
}

}  // namespace

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  const int rc = RUN_ALL_TESTS();
  if (rc == 0) std::puts("testing consumer ok");
  return rc;
}

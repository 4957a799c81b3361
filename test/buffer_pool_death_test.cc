// 5. Safety checks that stay on in every build: each fault aborts with one
// line that names it.
#include <cstdlib>
#include <thread>
#include <vector>

#include "bufpool/buffer_pool.h"
#include "gtest/gtest.h"
#include "test_util.h"

namespace bufpool {
namespace {

// The pools these tests fault: 64 buffers, `cache` per CPU.
std::unique_ptr<BufferPool> MakeSafetyPool(size_t cache = 64) {
  return testing_util::MakePool({.buffer_count = 64, .cache_size = cache});
}

class SafetyDeathTest : public testing::TestWithParam<size_t> {
 protected:
  void SetUp() override { GTEST_FLAG_SET(death_test_style, "threadsafe"); }
};

TEST_P(SafetyDeathTest, DoubleReleaseAbortsNamingTheSlot) {
  auto pool = MakeSafetyPool(GetParam());
  std::byte* p = pool->TryAcquireRaw();
  const uint32_t slot = pool->SlotOf(p);
  pool->ReleaseRaw(p);
  EXPECT_DEATH(pool->ReleaseRaw(p),
               "double release of slot " + std::to_string(slot));
}

TEST_P(SafetyDeathTest, ReleaseAfterTheHandleReleasedAborts) {
  auto pool = MakeSafetyPool(GetParam());
  Buffer b = pool->TryAcquire();
  std::byte* p = b.data();
  b.Reset();
  EXPECT_DEATH(pool->ReleaseRaw(p), "double release");
}

TEST_P(SafetyDeathTest, AdoptOfAFreeBufferAborts) {
  auto pool = MakeSafetyPool(GetParam());
  std::byte* p = pool->TryAcquireRaw();
  pool->ReleaseRaw(p);
  EXPECT_DEATH(pool->Adopt(p), "double release");
}

// A handle owns its buffer; the raw calls refuse it, since the handle would
// release it again when it dies.
TEST_P(SafetyDeathTest, ReleaseRawOfABufferAHandleOwnsAborts) {
  auto pool = MakeSafetyPool(GetParam());
  Buffer b = pool->TryAcquire();
  const uint32_t slot = b.slot();
  EXPECT_DEATH(pool->ReleaseRaw(b.data()),
               "ReleaseRaw: double release of slot " + std::to_string(slot) +
                   " .*a Buffer handle owns it");
  std::byte* batch[] = {b.data()};
  EXPECT_DEATH(pool->ReleaseRawBulk(batch), "ReleaseRawBulk: double release");
  EXPECT_DEATH(pool->Adopt(b.data()), "Adopt: double release");
}

TEST_P(SafetyDeathTest, DetachedPointerIsReleasedOnceThenCaught) {
  auto pool = MakeSafetyPool(GetParam());
  Buffer b = pool->TryAcquire();
  std::byte* p = b.Detach();
  EXPECT_FALSE(b);
  pool->ReleaseRaw(p);  // Detach made it a raw pointer: accepted once
  EXPECT_DEATH(pool->ReleaseRaw(p), "double release");
  EXPECT_EQ(Buffer().Detach(), nullptr);
}

TEST_P(SafetyDeathTest, AdoptedPointerBelongsToItsHandle) {
  auto pool = MakeSafetyPool(GetParam());
  std::byte* p = pool->TryAcquireRaw();
  Buffer b = pool->Adopt(p);
  EXPECT_DEATH(pool->ReleaseRaw(p), "a Buffer handle owns it");
  EXPECT_DEATH(pool->Adopt(p), "Adopt: double release");
  b.Reset();
  EXPECT_DEATH(pool->ReleaseRaw(p), "double release");
  EXPECT_EQ(pool->Stats().in_use, 0u);
}

TEST_P(SafetyDeathTest, ForeignPointerAborts) {
  auto pool = MakeSafetyPool(GetParam());
  std::vector<std::byte> heap(4096);
  EXPECT_DEATH(pool->ReleaseRaw(heap.data()), "not from this pool");
}

TEST_P(SafetyDeathTest, RawBulkReleaseOfAFreedPointerAborts) {
  auto pool = MakeSafetyPool(GetParam());
  std::byte* batch[4];
  ASSERT_EQ(pool->TryAcquireRawBulk(batch), 4u);
  const uint32_t slot = pool->SlotOf(batch[2]);
  pool->ReleaseRaw(batch[2]);
  EXPECT_DEATH(pool->ReleaseRawBulk(batch),
               "double release of slot " + std::to_string(slot));
  for (int i : {0, 1, 3}) pool->ReleaseRaw(batch[i]);
}

TEST_P(SafetyDeathTest, RawBulkReleaseOfAForeignOrInteriorPointerAborts) {
  auto pool = MakeSafetyPool(GetParam());
  std::byte* batch[2];
  ASSERT_EQ(pool->TryAcquireRawBulk(batch), 2u);
  std::vector<std::byte> heap(4096);
  std::byte* foreign[] = {batch[0], heap.data()};
  EXPECT_DEATH(pool->ReleaseRawBulk(foreign), "not from this pool");
  std::byte* interior[] = {batch[1] + 64};
  EXPECT_DEATH(pool->ReleaseRawBulk(interior), "not from this pool");
  pool->ReleaseRawBulk(batch);
}

TEST_P(SafetyDeathTest, InteriorPointerAborts) {
  auto pool = MakeSafetyPool(GetParam());
  std::byte* p = pool->TryAcquireRaw();
  EXPECT_DEATH(pool->ReleaseRaw(p + 1), "not from this pool");
  EXPECT_DEATH(pool->ReleaseRaw(p + 2048), "not from this pool");
  pool->ReleaseRaw(p);
}

TEST_P(SafetyDeathTest, PointerJustPastTheRegionAborts) {
  auto pool = MakeSafetyPool(GetParam());
  std::byte* end = pool->region().data() + pool->region().size();
  EXPECT_DEATH(pool->ReleaseRaw(end), "not from this pool");
  EXPECT_DEATH(pool->ReleaseRaw(pool->region().data() - 4096),
               "not from this pool");
}

TEST_P(SafetyDeathTest, AnotherPoolsBufferAborts) {
  auto pool = MakeSafetyPool(GetParam());
  auto other = MakeSafetyPool(GetParam());
  std::byte* p = other->TryAcquireRaw();
  EXPECT_DEATH(pool->ReleaseRaw(p), "not from this pool");
  other->ReleaseRaw(p);
}

TEST_P(SafetyDeathTest, DestroyingAPoolWithBuffersOutAborts) {
  EXPECT_DEATH(
      {
        auto pool = MakeSafetyPool(GetParam());
        std::vector<std::byte*> held;
        for (int i = 0; i < 10; ++i) held.push_back(pool->TryAcquireRaw());
        for (int i = 1; i < 10; i += 2) pool->ReleaseRaw(held[i]);
        pool.reset();
      },
      "still in use \\(slots 0, 2, 4, 6, 8\\)");
}

TEST_P(SafetyDeathTest, DestroyingAPoolReportsTheCountAndFirstSlots) {
  EXPECT_DEATH(
      {
        auto pool = MakeSafetyPool(GetParam());
        for (int i = 0; i < 20; ++i) (void)pool->TryAcquireRaw();
        pool.reset();
      },
      "20 buffer\\(s\\) still in use \\(slots 0, 1, 2, 3, 4, 5, 6, 7, ...\\)");
}

// Handles are not marked per buffer (see "Safety" in the header); the
// pool's accounting still counts them.
TEST_P(SafetyDeathTest, DestroyingAPoolCountsHandlesToo) {
  EXPECT_DEATH(
      {
        auto pool = MakeSafetyPool(GetParam());
        Buffer b = pool->TryAcquire();
        pool.reset();
      },
      "1 buffer\\(s\\) still in use \\(1 held by Buffer handles, chains or "
      "rings\\)");
  EXPECT_DEATH(
      {
        auto pool = MakeSafetyPool(GetParam());
        Buffer b = pool->TryAcquire();
        std::byte* p = pool->TryAcquireRaw();
        std::byte* q = pool->TryAcquireRaw();
        pool.reset();
        (void)p;
        (void)q;
      },
      "3 buffer\\(s\\) still in use \\(slots 1, 2 as raw pointers; 1 held "
      "by Buffer handles, chains or rings\\)");
}

// A handle that outlived the thread which acquired it (its cache folded at
// thread exit) is still counted.
TEST_P(SafetyDeathTest, DestroyingAPoolCountsAHandleFromAnExitedThread) {
  EXPECT_DEATH(
      {
        auto pool = MakeSafetyPool(GetParam());
        Buffer kept;
        std::thread([&] {
          std::vector<Buffer> mine;
          for (int i = 0; i < 6; ++i) mine.push_back(pool->TryAcquire());
          kept = std::move(mine[2]);
        }).join();
        pool.reset();
      },
      "1 buffer\\(s\\) still in use \\(1 held by Buffer handles, chains or "
      "rings\\)");
}

INSTANTIATE_TEST_SUITE_P(CacheOnAndOff, SafetyDeathTest, testing::Values(0, 64),
                         [](const auto& info) {
                           return info.param ? "CacheOn" : "CacheOff";
                         });

}  // namespace
}  // namespace bufpool

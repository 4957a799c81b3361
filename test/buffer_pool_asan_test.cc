// 6. Under AddressSanitizer free buffers are poisoned: touching a released
// buffer is an ASan report. Runs in the asan build; skipped elsewhere.
#include <cstdlib>
#include <cstring>
#include <vector>

#include "absl/base/config.h"
#include "bufpool/buffer_pool.h"
#include "gtest/gtest.h"

namespace bufpool {
namespace {

#if defined(ABSL_HAVE_ADDRESS_SANITIZER)
constexpr bool kAsan = true;
#else
constexpr bool kAsan = false;
#endif

class PoisonDeathTest : public testing::TestWithParam<size_t> {
 protected:
  void SetUp() override {
    if (!kAsan) GTEST_SKIP() << "needs the asan build (cmake --preset asan)";
    pool_ = *BufferPool::Create({.buffer_count = 64, .cache_size = GetParam()});
  }
  std::unique_ptr<BufferPool> pool_;
};

TEST_P(PoisonDeathTest, WritingAReleasedBufferIsReported) {
  Buffer b = pool_->TryAcquire();
  volatile std::byte* p = b.data();
  b.Reset();
  EXPECT_DEATH(p[100] = std::byte{1}, "use-after-poison");
}

TEST_P(PoisonDeathTest, ReadingANeverAcquiredBufferIsReported) {
  volatile std::byte* p = pool_->region().data() + 10 * pool_->buffer_size();
  EXPECT_DEATH((void)p[0], "use-after-poison");
}

TEST_P(PoisonDeathTest, AcquiredBufferIsFullyUsable) {
  std::vector<Buffer> all(64);
  ASSERT_EQ(pool_->TryAcquireBulk(absl::MakeSpan(all)), 64u);
  for (Buffer& b : all) std::memset(b.data(), 0x11, b.size());  // no report
}

// The raw pair poisons and unpoisons on each of its paths: the inline hits
// (hot slot, then the cache's stack) and the out-of-line misses.
TEST_P(PoisonDeathTest, RawPairPoisonsOnReleaseAndUnpoisonsOnEveryHit) {
  constexpr int kRounds = 3;
  std::byte* raw[8];
  for (int round = 0; round < kRounds; ++round) {
    // Round 0 misses (the cache is empty); later rounds hit the hot slot
    // first, then the stack.
    for (std::byte*& p : raw) {
      p = pool_->TryAcquireRaw();
      ASSERT_NE(p, nullptr);
      std::memset(p, 0x22, pool_->buffer_size());  // no report
    }
    for (std::byte* p : raw) pool_->ReleaseRaw(p);
  }
  volatile std::byte* released = raw[0];
  EXPECT_DEATH(released[pool_->buffer_size() - 1] = std::byte{1},
               "use-after-poison");
}

// An elastic pool: a buffer of a grown part is poisoned until handed out,
// and a trimmed one stays poisoned (its slot is in the reserve, not free):
// touching either through a stale pointer is a report, not a silent read of
// zeroes.
TEST_P(PoisonDeathTest, GrownAndTrimmedBuffersArePoisoned) {
  auto pool = *BufferPool::Create({.buffer_count = 64,
                                   .huge_pages = HugePages::kNever,
                                   .cache_size = GetParam(),
                                   .max_buffer_count = 1024,
                                   .grow_step = 64});
  std::vector<Buffer> all(100);  // one growth step past the first 64
  ASSERT_EQ(pool->TryAcquireBulk(absl::MakeSpan(all)), 100u);
  for (Buffer& b : all) std::memset(b.data(), 0x33, b.size());  // no report
  volatile std::byte* grown_unused =
      pool->region().data() + 120 * pool->buffer_size();
  EXPECT_DEATH((void)grown_unused[0], "use-after-poison");
  volatile std::byte* stale = all[90].data();
  all.clear();
  pool->FlushCaches();
  ASSERT_GT(pool->Trim(0), 0u);
  ASSERT_EQ(pool->Stats().committed, 0u);
  EXPECT_DEATH((void)stale[0], "use-after-poison");
  EXPECT_DEATH(stale[10] = std::byte{1}, "use-after-poison");
  // Grown again and handed out: usable whole.
  Buffer again = pool->TryAcquire();
  ASSERT_TRUE(again);
  std::memset(again.data(), 0x44, again.size());
}

INSTANTIATE_TEST_SUITE_P(CacheOnAndOff, PoisonDeathTest, testing::Values(0, 64),
                         [](const auto& info) {
                           return info.param ? "CacheOn" : "CacheOff";
                         });

}  // namespace
}  // namespace bufpool

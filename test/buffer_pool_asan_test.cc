// 6. Under AddressSanitizer free buffers are poisoned: touching a released
// buffer is an ASan report. Runs in the asan build; skipped elsewhere.
#include <cstdlib>

#include "bufpool/buffer_pool.h"
#include "gtest/gtest.h"

namespace bufpool {
namespace {

#if defined(__SANITIZE_ADDRESS__)
constexpr bool kAsan = true;
#else
constexpr bool kAsan = false;
#endif

class PoisonDeathTest : public testing::TestWithParam<size_t> {
 protected:
  void SetUp() override {
    if (!kAsan) GTEST_SKIP() << "needs the asan build (cmake --preset asan)";
    pool_ = *BufferPool::Create(
        {.buffer_count = 64, .thread_cache_size = GetParam()});
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

INSTANTIATE_TEST_SUITE_P(CacheOnAndOff, PoisonDeathTest, testing::Values(0, 64),
                         [](const auto& info) {
                           return info.param ? "CacheOn" : "CacheOff";
                         });

}  // namespace
}  // namespace bufpool

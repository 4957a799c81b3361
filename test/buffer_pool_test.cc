// Behaviour of BufferPool that users rely on, numbered as in the design:
// 1 validation, 2 layout, 3 exact capacity, 4 waiting, 7 scrubbing,
// 8 threads and many pools, 9 statistics; plus the Buffer handle itself.
// (5 is in buffer_pool_death_test.cc, 6 in buffer_pool_asan_test.cc.)
#include "bufpool/buffer_pool.h"

#include <linux/capability.h>
#include <sched.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <mutex>
#include <random>
#include <set>
#include <thread>
#include <vector>

#include "absl/base/config.h"
#include "bufpool/testing.h"
#include "gtest/gtest.h"
#include "os/memory.h"
#include "test_util.h"

namespace bufpool {
namespace {

using testing_util::Event;
using testing_util::MakePool;
using testing_util::ScopedPin;

// high_water is exact with caches off; with caches on it may exceed the
// peak by what the caches in use lend (a refill batch each; see
// Stats()): these tests pin one thread, so one cache lends.
::testing::AssertionResult HighWaterIs(const BufferPool& pool,
                                       size_t high_water, size_t peak) {
  const size_t slack = pool.per_cpu_mode() == PerCpuMode::kOff
                           ? 0
                           : std::max<size_t>(1, pool.cache_capacity() / 2);
  if (high_water >= peak && high_water <= peak + slack) {
    return ::testing::AssertionSuccess();
  }
  return ::testing::AssertionFailure()
         << "high_water " << high_water << ", peak " << peak << ", slack "
         << slack;
}

// A thread that calls Acquire() on an empty pool and expects a buffer within
// a minute; returns once it has started and had 50 ms to fall asleep.
std::thread StartSleepingAcquire(BufferPool& pool) {
  Event started;
  std::thread waiter([&pool, &started] {
    started.Notify();
    auto b = pool.Acquire(absl::Seconds(60));
    ASSERT_TRUE(b.ok()) << b.status();
  });
  started.WaitForNotification();
  absl::SleepFor(absl::Milliseconds(50));
  return waiter;
}

bool Contains(absl::string_view haystack, absl::string_view needle) {
  return haystack.find(needle) != absl::string_view::npos;
}

// ---- 1. Create validates ----------------------------------------------------

TEST(BufferPoolTest, CreateRejectsBufferSizeNotPowerOfTwo) {
  auto pool = BufferPool::Create({.buffer_size = 100});
  ASSERT_EQ(pool.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(Contains(pool.status().message(), "buffer_size"))
      << pool.status();
  EXPECT_TRUE(Contains(pool.status().message(), "100")) << pool.status();
}

TEST(BufferPoolTest, CreateRejectsBufferSizeBelow64) {
  auto pool = BufferPool::Create({.buffer_size = 32});
  ASSERT_EQ(pool.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(Contains(pool.status().message(), "32")) << pool.status();
}

TEST(BufferPoolTest, CreateRejectsZeroBufferCount) {
  auto pool = BufferPool::Create({.buffer_count = 0});
  ASSERT_EQ(pool.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(Contains(pool.status().message(), "buffer_count"))
      << pool.status();
}

TEST(BufferPoolTest, CreateRejectsMoreSlotsThanIndexBits) {
  auto pool =
      BufferPool::Create({.buffer_size = 64, .buffer_count = 1ull << 32});
  ASSERT_EQ(pool.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(Contains(pool.status().message(), "buffer_count"))
      << pool.status();
}

TEST(BufferPoolTest, CreateRejectsSizeThatOverflows) {
  auto pool = BufferPool::Create(
      {.buffer_size = size_t{1} << 40, .buffer_count = 1u << 30});
  ASSERT_EQ(pool.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(Contains(pool.status().message(), "overflows")) << pool.status();
}

TEST(BufferPoolTest, CreateReportsRegionThatCannotBeMapped) {
  // 2^50 bytes: no machine maps that.
  auto pool = BufferPool::Create({.buffer_size = size_t{1} << 30,
                                  .buffer_count = 1u << 20,
                                  .huge_pages = HugePages::kNever,
                                  .populate = false});
  ASSERT_EQ(pool.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_TRUE(Contains(pool.status().message(), "mmap")) << pool.status();
}

TEST(BufferPoolTest, CreateWithRequiredHugePagesFailsWhenNoneAreReserved) {
  if (os::ReservedHugePages() != 0)
    GTEST_SKIP() << "huge pages are reserved here";
  auto pool = BufferPool::Create({.huge_pages = HugePages::kRequire});
  ASSERT_FALSE(pool.ok());
  EXPECT_TRUE(Contains(pool.status().message(), "no huge pages are reserved"))
      << pool.status();
}

// mlock succeeds for root regardless of the limit (CAP_IPC_LOCK), so this
// runs in a child that drops that capability and the limit before trying.
[[noreturn]] void LockWithoutPrivilegeAndReport() {
  __user_cap_header_struct hdr{_LINUX_CAPABILITY_VERSION_3, 0};
  __user_cap_data_struct data[2] = {};
  syscall(SYS_capget, &hdr, data);
  data[0].effective &= ~(1u << CAP_IPC_LOCK);
  syscall(SYS_capset, &hdr, data);
  rlimit lim{0, 0};
  setrlimit(RLIMIT_MEMLOCK, &lim);
  auto pool = BufferPool::Create({.buffer_count = 64, .lock_memory = true});
  if (pool.ok()) {
    std::fprintf(stderr, "unexpectedly locked\n");
    std::exit(1);
  }
  std::fprintf(stderr, "%s\n", pool.status().ToString().c_str());
  std::exit(0);
}

TEST(BufferPoolTest, CreateNamesMemlockLimitWhenLockingFails) {
#if defined(ABSL_HAVE_ADDRESS_SANITIZER) || defined(ABSL_HAVE_THREAD_SANITIZER)
  GTEST_SKIP() << "the sanitizer turns mlock into a no-op that succeeds";
#endif
  EXPECT_EXIT(LockWithoutPrivilegeAndReport(), ::testing::ExitedWithCode(0),
              "RLIMIT_MEMLOCK.*ulimit -l");
}

TEST(BufferPoolTest, CreateLocksMemoryWhenAllowed) {
  auto pool = BufferPool::Create({.buffer_count = 16, .lock_memory = true});
  if (!pool.ok()) GTEST_SKIP() << "mlock not allowed here: " << pool.status();
  EXPECT_EQ((*pool)->capacity(), 16u);
}

// ---- 2. Layout
// ---------------------------------------------------------------

TEST(BufferPoolTest, BufferIndexLivesAtRegionPlusIndexTimesSize) {
  auto pool = MakePool({.buffer_size = 4096, .buffer_count = 64});
  const auto base = reinterpret_cast<uintptr_t>(pool->region().data());
  EXPECT_EQ(base % 4096, 0u);
  EXPECT_EQ(pool->region().size(), 64u * 4096);
  std::vector<Buffer> all;
  for (int i = 0; i < 64; ++i) all.push_back(pool->TryAcquire());
  std::vector<bool> seen(64);
  for (const Buffer& b : all) {
    ASSERT_TRUE(b);
    EXPECT_EQ(b.data(), pool->region().data() + b.slot() * 4096);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(b.data()) % 4096, 0u);
    EXPECT_EQ(b.size(), 4096u);
    EXPECT_EQ(pool->SlotOf(b.data()), b.slot());
    EXPECT_FALSE(seen[b.slot()]) << "slot handed out twice";
    seen[b.slot()] = true;
  }
}

TEST(BufferPoolTest, RegionIsTwoMebibyteAlignedWithHugePages) {
  auto pool = MakePool({.buffer_size = 4096,
                        .buffer_count = 1024,
                        .huge_pages = HugePages::kTry});
  if (!pool->huge_pages())
    GTEST_SKIP() << "transparent huge pages are off here";
  EXPECT_EQ(reinterpret_cast<uintptr_t>(pool->region().data()) % (2u << 20),
            0u);
}

TEST(BufferPoolTest, SmallBuffersAreSlicedWithoutGaps) {
  auto pool = MakePool({.buffer_size = 64, .buffer_count = 100});
  Buffer a = pool->TryAcquire();
  Buffer b = pool->TryAcquire();
  EXPECT_EQ(std::abs(b.data() - a.data()), 64);
  EXPECT_TRUE(pool->Contains(a.data() + 63));
  EXPECT_FALSE(pool->Contains(pool->region().data() + 6400));
}

// ---- 3. Exact capacity -----------------------------------------------------

class CapacityTest : public ::testing::TestWithParam<size_t> {};

TEST_P(CapacityTest, ExhaustsAtExactCapacity) {
  auto pool = MakePool({.buffer_count = 200, .cache_size = GetParam()});
  std::vector<Buffer> held;
  for (int i = 0; i < 200; ++i) {
    held.push_back(pool->TryAcquire());
    ASSERT_TRUE(held.back()) << "buffer " << i;
  }
  EXPECT_FALSE(pool->TryAcquire());
  EXPECT_EQ(pool->TryAcquireRaw(), nullptr);
  EXPECT_EQ(pool->Stats().acquire_failures, 2u);
  held.pop_back();  // one back, one available
  EXPECT_TRUE(pool->TryAcquire());
}

TEST_P(CapacityTest, ExactCapacityAgainAfterEverythingCameBack) {
  auto pool = MakePool({.buffer_count = 100, .cache_size = GetParam()});
  for (int round = 0; round < 3; ++round) {
    std::vector<Buffer> held(100);
    ASSERT_EQ(pool->TryAcquireBulk(absl::MakeSpan(held)), 100u);
    EXPECT_FALSE(pool->TryAcquire());
  }
}

INSTANTIATE_TEST_SUITE_P(CacheOnAndOff, CapacityTest, ::testing::Values(0, 64),
                         [](const auto& info) {
                           return info.param ? "CacheOn" : "CacheOff";
                         });

TEST(BufferPoolTest, BuffersCachedByAThreadThatExitedAreAllReachable) {
  auto pool = MakePool({.buffer_count = 64, .cache_size = 8});
  ASSERT_EQ(pool->cache_capacity(), 8u);
  std::thread([&] {
    std::vector<Buffer> held;
    for (int i = 0; i < 8; ++i) held.push_back(pool->TryAcquire());
    // Released into this CPU's cache; the thread owns none of it.
  }).join();
  std::vector<Buffer> all(64);
  EXPECT_EQ(pool->TryAcquireBulk(absl::MakeSpan(all)), 64u);
}

TEST(BufferPoolTest, CacheHoldsAtMostAnEighthOfThePool) {
  EXPECT_EQ(MakePool({.buffer_count = 1024})->cache_capacity(), 64u);
  EXPECT_EQ(MakePool({.buffer_count = 80})->cache_capacity(), 10u);
  EXPECT_EQ(MakePool({.buffer_count = 7})->cache_capacity(), 0u);
  EXPECT_EQ(MakePool({.buffer_count = 1024, .cache_size = 0})->cache_capacity(),
            0u);
}

TEST(BufferPoolTest, BuffersCachedByABlockedThreadAreReachable) {
  auto pool = MakePool({.buffer_count = 64, .cache_size = 8});
  Event cached, done;
  std::thread other([&] {
    std::vector<Buffer> held;
    for (int i = 0; i < 20; ++i) held.push_back(pool->TryAcquire());
    held.clear();  // at most cache_capacity() stay behind in this cache
    cached.Notify();
    done.WaitForNotification();
  });
  cached.WaitForNotification();
  std::vector<Buffer> all(64);
  const size_t got = pool->TryAcquireBulk(absl::MakeSpan(all));
  EXPECT_EQ(got, 64u);  // drained from every CPU's cache
  done.Notify();
  other.join();
}

// ---- 4. Waiting ------------------------------------------------------------

TEST(BufferPoolTest, AcquireReturnsAtOnceWhenABufferIsFree) {
  auto pool = MakePool({.buffer_count = 4});
  auto b = pool->Acquire(absl::ZeroDuration());
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_TRUE(*b);
}

TEST(BufferPoolTest, AcquireTimesOutWithDeadlineExceeded) {
  auto pool = MakePool({.buffer_count = 1});
  Buffer only = pool->TryAcquire();
  auto b = pool->Acquire(absl::Milliseconds(20));
  ASSERT_EQ(b.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_TRUE(Contains(b.status().message(), "capacity 1")) << b.status();
  EXPECT_EQ(pool->Stats().acquire_timeouts, 1u);
  EXPECT_EQ(pool->Stats().acquire_failures, 0u);
}

class WaitTest : public ::testing::TestWithParam<size_t> {};

// The waiter is woken by the release itself: if it were not, it would sleep
// for the whole (long) timeout and fail.
TEST_P(WaitTest, AcquireWakesWhenAnotherThreadReleases) {
  auto pool = MakePool({.buffer_count = 16, .cache_size = GetParam()});
  std::vector<Buffer> all(16);
  ASSERT_EQ(pool->TryAcquireBulk(absl::MakeSpan(all)), 16u);
  const uint32_t released = all[5].slot();
  Event waiting;
  std::thread waiter([&] {
    waiting.Notify();
    auto b = pool->Acquire(absl::Seconds(60));
    ASSERT_TRUE(b.ok()) << b.status();
    EXPECT_EQ(b->slot(), released);
  });
  waiting.WaitForNotification();
  absl::SleepFor(absl::Milliseconds(50));  // let it go to sleep
  all[5].Reset();
  waiter.join();
}

TEST_P(WaitTest, ManyWaitersAllGetBuffers) {
  auto pool = MakePool({.buffer_count = 16, .cache_size = GetParam()});
  std::vector<Buffer> all(16);
  ASSERT_EQ(pool->TryAcquireBulk(absl::MakeSpan(all)), 16u);
  std::vector<std::thread> waiters;
  std::atomic<int> got{0};
  for (int i = 0; i < 6; ++i) {
    waiters.emplace_back([&] {
      auto b = pool->Acquire(absl::Seconds(60));
      if (b.ok()) got.fetch_add(1);
    });
  }
  absl::SleepFor(absl::Milliseconds(50));
  for (int i = 0; i < 6; ++i) all[i].Reset();
  for (auto& t : waiters) t.join();
  EXPECT_EQ(got.load(), 6);
}

INSTANTIATE_TEST_SUITE_P(CacheOnAndOff, WaitTest, ::testing::Values(0, 64),
                         [](const auto& info) {
                           return info.param ? "CacheOn" : "CacheOff";
                         });

// Acquire(0) on an empty pool is a poll: it fails at once, counted as a
// failure, not a timeout.
TEST(BufferPoolTest, APollOnAnEmptyPoolFailsAtOnce) {
  auto pool = MakePool({.buffer_count = 16, .cache_size = 16});
  std::vector<Buffer> all(16);
  ASSERT_EQ(pool->TryAcquireBulk(absl::MakeSpan(all)), 16u);
  std::thread poller([&] {
    auto b = pool->Acquire(absl::ZeroDuration());
    EXPECT_EQ(b.status().code(), absl::StatusCode::kDeadlineExceeded);
  });
  poller.join();
  EXPECT_EQ(pool->Stats().acquire_failures, 1u);
  EXPECT_EQ(pool->Stats().acquire_timeouts, 0u);
}

// ---- 7. Scrubbing ----------------------------------------------------------

class ScrubTest : public ::testing::TestWithParam<size_t> {};

TEST_P(ScrubTest, ScrubOnReleaseZeroesBeforeAnyoneElseGetsIt) {
  auto pool = MakePool({.buffer_size = 256,
                        .buffer_count = 16,
                        .scrub_on_release = true,
                        .cache_size = GetParam()});
  std::vector<Buffer> all(16);
  ASSERT_EQ(pool->TryAcquireBulk(absl::MakeSpan(all)), 16u);
  for (Buffer& b : all) std::memset(b.data(), 0xab, b.size());
  all.clear();  // released: every one must now be zero
  std::vector<Buffer> again(16);
  ASSERT_EQ(pool->TryAcquireBulk(absl::MakeSpan(again)), 16u);
  for (Buffer& b : again) {
    for (size_t i = 0; i < b.size(); ++i) {
      ASSERT_EQ(b.data()[i], std::byte{0})
          << "slot " << b.slot() << " byte " << i;
    }
  }
}

TEST(BufferPoolTest, WithoutScrubContentsSurviveReuse) {
  auto pool = MakePool({.buffer_size = 256, .buffer_count = 16});
  Buffer b = pool->TryAcquire();
  const uint32_t slot = b.slot();
  std::memset(b.data(), 0xab, b.size());
  b.Reset();
  Buffer again = pool->TryAcquire();
  ASSERT_EQ(again.slot(), slot);  // last released, first reused
  EXPECT_EQ(again.data()[0], std::byte{0xab});
}

INSTANTIATE_TEST_SUITE_P(CacheOnAndOff, ScrubTest, ::testing::Values(0, 64),
                         [](const auto& info) {
                           return info.param ? "CacheOn" : "CacheOff";
                         });

// ---- 8. Threads and many pools ---------------------------------------------

TEST(BufferPoolTest, BufferReleasedOnAnotherThreadComesBack) {
  auto pool = MakePool({.buffer_count = 64});
  std::vector<Buffer> held(64);
  ASSERT_EQ(pool->TryAcquireBulk(absl::MakeSpan(held)), 64u);
  std::thread([moved = std::move(held)]() mutable { moved.clear(); }).join();
  EXPECT_TRUE(testing::NoHolders(*pool));
  std::vector<Buffer> again(64);
  EXPECT_EQ(pool->TryAcquireBulk(absl::MakeSpan(again)), 64u);
}

TEST(BufferPoolTest, ManyPoolsFromOneThreadKeepTheirBuffersApart) {
  auto a = MakePool({.buffer_size = 64, .buffer_count = 64});
  auto b = MakePool({.buffer_size = 128, .buffer_count = 64});
  for (int i = 0; i < 1000; ++i) {
    Buffer x = a->TryAcquire();
    Buffer y = b->TryAcquire();
    ASSERT_TRUE(a->Contains(x.data()));
    ASSERT_TRUE(b->Contains(y.data()));
    ASSERT_EQ(y.size(), 128u);
  }
  // A pool destroyed and a new one made (perhaps at the same address) must
  // not inherit the old pool's cache on this thread.
  a.reset();
  auto c = MakePool({.buffer_size = 64, .buffer_count = 64});
  std::vector<Buffer> all(64);
  ASSERT_EQ(c->TryAcquireBulk(absl::MakeSpan(all)), 64u);
  for (const Buffer& x : all) EXPECT_TRUE(c->Contains(x.data()));
  EXPECT_FALSE(c->TryAcquire());
}

// A release whose thread last used another pool, and a bulk release while a
// thread waits, both take the slow path with the cache in states the common
// path never leaves it in; random interleavings must keep every slot.
TEST(BufferPoolTest, InterleavedUseOfTwoPoolsKeepsEverySlot) {
  auto a = MakePool({.buffer_count = 256});
  auto b = MakePool({.buffer_count = 256});
  std::mt19937 rng(7);
  std::vector<Buffer> held_a, held_b;
  for (int op = 0; op < 200000; ++op) {
    const bool use_a = rng() % 2;
    BufferPool& pool = use_a ? *a : *b;
    std::vector<Buffer>& held = use_a ? held_a : held_b;
    switch (rng() % 5) {
      case 0:
      case 1:
        if (Buffer x = pool.TryAcquire()) held.push_back(std::move(x));
        break;
      case 2:
        if (!held.empty()) {
          std::swap(held[rng() % held.size()], held.back());
          held.pop_back();
        }
        break;
      case 3: {
        Buffer batch[5];
        const size_t n = pool.TryAcquireBulk(batch);
        for (size_t i = 0; i < n; ++i) held.push_back(std::move(batch[i]));
        break;
      }
      default: {
        const size_t n = std::min<size_t>(held.size(), rng() % 40);
        pool.ReleaseBulk(absl::MakeSpan(held).last(n));
        held.resize(held.size() - n);
      }
    }
  }
  EXPECT_EQ(a->Stats().in_use, held_a.size());
  EXPECT_EQ(b->Stats().in_use, held_b.size());
  EXPECT_LE(a->Stats().high_water, a->capacity());
  held_a.clear();
  held_b.clear();
  for (BufferPool* pool : {a.get(), b.get()}) {
    std::vector<Buffer> all(256);
    EXPECT_EQ(pool->TryAcquireBulk(absl::MakeSpan(all)), 256u);
  }
}

TEST(BufferPoolTest, BulkReleaseWhileAThreadWaitsHandsOverAndKeepsTheRest) {
  auto pool = MakePool({.buffer_count = 64});
  std::vector<Buffer> all(64);
  ASSERT_EQ(pool->TryAcquireBulk(absl::MakeSpan(all)), 64u);
  std::thread waiter = StartSleepingAcquire(*pool);
  pool->ReleaseBulk(absl::MakeSpan(all));
  waiter.join();
  EXPECT_TRUE(testing::NoHolders(*pool));
  std::vector<Buffer> again(64);
  EXPECT_EQ(pool->TryAcquireBulk(absl::MakeSpan(again)), 64u);
}

// A bulk release that this CPU's cache could hold whole still reaches a
// thread that waits: while someone waits the cache takes nothing (the slot
// goes to the depot with a wake), in every mode.
TEST(BufferPoolTest, BulkReleaseSmallerThanTheCacheWakesAWaiter) {
  auto pool = MakePool({.buffer_count = 64, .cache_size = 8});
  std::vector<Buffer> all(64);
  ASSERT_EQ(pool->TryAcquireBulk(absl::MakeSpan(all)), 64u);
  Event started;
  absl::Status got;
  std::thread waiter([&] {
    started.Notify();
    got = pool->Acquire(absl::Seconds(20)).status();  // not woken: times out
  });
  started.WaitForNotification();
  absl::SleepFor(absl::Milliseconds(50));
  pool->ReleaseBulk(absl::MakeSpan(all).first(1));
  waiter.join();
  EXPECT_TRUE(got.ok()) << got;
}

// A fresh pool's bulk acquires hand out slots in address order, in every
// mode, so that callers can coalesce neighbours into one iovec.
TEST(BufferPoolTest, BulkAcquiresFromAFreshPoolHandOutAscendingSlots) {
  const ScopedPin pin;
  for (const size_t cache : {0, 16, 64}) {
    auto pool = MakePool({.buffer_count = 256, .cache_size = cache});
    std::vector<Buffer> first(100), second(10);
    ASSERT_EQ(pool->TryAcquireBulk(absl::MakeSpan(first)), 100u);
    ASSERT_EQ(pool->TryAcquireBulk(absl::MakeSpan(second)), 10u);
    for (uint32_t i = 0; i < 110; ++i) {
      const Buffer& b = i < 100 ? first[i] : second[i - 100];
      EXPECT_EQ(b.slot(), i) << "cache " << cache;
    }
  }
}

// Takes every buffer of `pool` through bulk calls of the given sizes (raw
// pointers on odd rounds), checking that no slot is handed out twice; the
// calls stop short only when the pool is empty.
void TakeAllInBulk(BufferPool& pool, const std::vector<size_t>& sizes, bool raw,
                   std::vector<Buffer>* held) {
  std::set<uint32_t> seen;
  for (size_t i = 0; held->size() < pool.capacity(); ++i) {
    const size_t want = sizes[i % sizes.size()];
    size_t got;
    if (raw) {
      std::vector<std::byte*> span(want);
      got = pool.TryAcquireRawBulk(absl::MakeSpan(span));
      for (size_t k = 0; k < got; ++k) held->push_back(pool.Adopt(span[k]));
    } else {
      std::vector<Buffer> span(want);
      got = pool.TryAcquireBulk(absl::MakeSpan(span));
      for (size_t k = 0; k < got; ++k) held->push_back(std::move(span[k]));
    }
    ASSERT_TRUE(got == want || held->size() == pool.capacity())
        << "got " << got << " of " << want << " with " << held->size()
        << " held";
    for (size_t k = held->size() - got; k < held->size(); ++k) {
      ASSERT_TRUE(seen.insert((*held)[k].slot()).second)
          << "slot " << (*held)[k].slot() << " twice";
    }
  }
}

// Bulk calls of every size against a cache that is empty, partly full and
// full: each buffer is handed out once, every buffer comes back, and what
// the caches park stays bounded. In rseq mode, pinned to one CPU, the
// counts show where each call took and put its slots: the cache's top
// first, then whole batches straight from the depot, then a refill whose
// remainder the cache keeps; a release fills the cache and sends the rest
// to the depot.
TEST(BufferPoolTest, BulkCallsTakeFromTheCacheThenTheDepotAndSpillTheRest) {
  const ScopedPin pin;
  auto pool = MakePool({.buffer_count = 2048, .cache_size = 64});
  const size_t bound = pool->cache_capacity() *
                       static_cast<size_t>(::sysconf(_SC_NPROCESSORS_CONF));
  const std::vector<size_t> sizes = {1, 7, 31, 32, 33, 64, 65, 100, 257, 3};
  std::mt19937 rng(11);
  for (int round = 0; round < 6; ++round) {
    std::vector<Buffer> held;
    TakeAllInBulk(*pool, sizes, round % 2 == 1, &held);
    ASSERT_EQ(held.size(), 2048u);
    EXPECT_FALSE(pool->TryAcquire());
    EXPECT_EQ(pool->Stats().in_use, 2048u);
    std::shuffle(held.begin(), held.end(), rng);
    for (size_t first = 0; first < held.size();) {
      const size_t n =
          std::min(sizes[(first + round) % sizes.size()], held.size() - first);
      pool->ReleaseBulk(absl::MakeSpan(held).subspan(first, n));
      first += n;
    }
    EXPECT_TRUE(testing::NoHolders(*pool));
    EXPECT_LE(pool->Stats().cached, bound);
  }
  const PerCpuMode mode = pool->per_cpu_mode();
  if (mode != PerCpuMode::kRseq && mode != PerCpuMode::kRseqMmCid) return;
  // Every buffer out, so every cache is empty; then 40 + 40 back.
  std::vector<Buffer> all(2048);
  ASSERT_EQ(pool->TryAcquireBulk(absl::MakeSpan(all)), 2048u);
  EXPECT_EQ(pool->Stats().cached, 0u);
  pool->ReleaseBulk(absl::MakeSpan(all).first(40));
  EXPECT_EQ(pool->Stats().cached, 40u);
  pool->ReleaseBulk(absl::MakeSpan(all).subspan(40, 40));
  EXPECT_EQ(pool->Stats().cached, 64u);  // full; 16 went to the depot
  EXPECT_EQ(pool->Stats().in_use, 2048u - 80u);
  // 100 wanted: the cache's 64 and the depot's 16, no more.
  const uint64_t failures = pool->Stats().acquire_failures;
  std::vector<Buffer> again(100);
  EXPECT_EQ(pool->TryAcquireBulk(absl::MakeSpan(again)), 80u);
  EXPECT_EQ(pool->Stats().cached, 0u);
  EXPECT_EQ(pool->Stats().acquire_failures, failures + 1);
  again.clear();
  all.clear();
  // Cache 64 full (the last 32 pushed by single releases, which the cache
  // lends: a bulk call takes only what is under the floor), depot 1984:
  // 100 = the 32 under the floor + two batches of 32 straight from the
  // depot + 4 of a refill, whose other 28 stay cached beside the 32 lent.
  EXPECT_EQ(pool->Stats().cached, 64u);
  again.resize(100);
  EXPECT_EQ(pool->TryAcquireBulk(absl::MakeSpan(again)), 100u);
  EXPECT_EQ(pool->Stats().cached, 60u);
  EXPECT_EQ(pool->Stats().in_use, 100u);
}

// With caches off a bulk release pushes each chunk onto the depot in
// one step; every buffer must come back, counted, and wake a sleeper.
TEST(BufferPoolTest, CacheOffBulkReleaseReturnsEveryBufferAndWakesAWaiter) {
  auto pool = MakePool({.buffer_count = 100, .cache_size = 0});
  std::vector<Buffer> all(100);
  ASSERT_EQ(pool->TryAcquireBulk(absl::MakeSpan(all)), 100u);
  Buffer kept = std::move(all[7]);  // a hole: ReleaseBulk skips empty handles
  std::thread waiter = StartSleepingAcquire(*pool);
  pool->ReleaseBulk(absl::MakeSpan(all));  // 99 handles: two chunks
  waiter.join();
  for (const Buffer& b : all) EXPECT_FALSE(b);
  EXPECT_EQ(pool->Stats().in_use, 1u);
  kept.Reset();
  EXPECT_TRUE(testing::NoHolders(*pool));
  std::vector<Buffer> again(100);
  EXPECT_EQ(pool->TryAcquireBulk(absl::MakeSpan(again)), 100u);
  std::set<uint32_t> slots;
  for (const Buffer& b : again) slots.insert(b.slot());
  EXPECT_EQ(slots.size(), 100u);
}

TEST(BufferPoolTest,
     AcquireWithAnAstronomicalTimeoutWaitsInsteadOfOverflowing) {
  auto pool = MakePool({.buffer_count = 8, .cache_size = 0});
  std::vector<Buffer> all(8);
  ASSERT_EQ(pool->TryAcquireBulk(absl::MakeSpan(all)), 8u);
  std::thread releaser([&] {
    absl::SleepFor(absl::Milliseconds(50));
    all[3].Reset();
  });
  auto b = pool->Acquire(absl::Hours(24 * 365 * 1000));
  releaser.join();
  EXPECT_TRUE(b.ok()) << b.status();
}

// ---- 9. Statistics ---------------------------------------------------------

// Four times the cache live, released in a shuffled order and taken again:
// every release past a full cache spills a batch and every acquire from an
// empty one refills a batch (in rseq mode, the batch sequences), with raw
// pointers so that ReleaseRaw's check also catches a buffer handed out
// twice.
TEST(BufferPoolTest, RefillsAndSpillsHandEachBufferOutOnce) {
  auto pool = BufferPool::Create(
      {.buffer_size = 4096, .buffer_count = 8192, .cache_size = 256});
  ASSERT_TRUE(pool.ok()) << pool.status();
  BufferPool& p = **pool;
  const size_t live = 4 * p.cache_capacity();
  std::vector<std::byte*> held;
  std::mt19937 rng(7);
  for (int round = 0; round < 20; ++round) {
    std::set<std::byte*> seen;
    while (held.size() < live) {
      std::byte* b = p.TryAcquireRaw();
      ASSERT_NE(b, nullptr);
      ASSERT_TRUE(seen.insert(b).second) << "slot " << p.SlotOf(b) << " twice";
      b[0] = std::byte{1};
      held.push_back(b);
    }
    EXPECT_EQ(p.Stats().in_use, live);
    std::shuffle(held.begin(), held.end(), rng);
    for (std::byte* b : held) p.ReleaseRaw(b);
    held.clear();
    EXPECT_EQ(p.Stats().in_use, 0u);
    EXPECT_LE(p.Stats().cached,
              p.cache_capacity() *
                  static_cast<size_t>(sysconf(_SC_NPROCESSORS_CONF)));
  }
}

TEST(BufferPoolTest, StatsAreExactWhenQuiescent) {
  const ScopedPin pin;
  auto pool = MakePool({.buffer_count = 256});
  std::vector<Buffer> held;
  for (int i = 0; i < 100; ++i) held.push_back(pool->TryAcquire());
  PoolStats s = pool->Stats();
  EXPECT_EQ(s.capacity, 256u);
  EXPECT_EQ(s.in_use, 100u);
  EXPECT_TRUE(HighWaterIs(*pool, s.high_water, 100));
  held.resize(30);
  s = pool->Stats();
  EXPECT_EQ(s.in_use, 30u);
  EXPECT_TRUE(HighWaterIs(*pool, s.high_water, 100));
  held.clear();
  s = pool->Stats();
  EXPECT_EQ(s.in_use, 0u);
  EXPECT_TRUE(HighWaterIs(*pool, s.high_water, 100));
  EXPECT_EQ(s.acquire_failures, 0u);
}

TEST(BufferPoolTest, HighWaterCatchesAPeakBetweenStatsCalls) {
  const ScopedPin pin;
  auto pool = MakePool({.buffer_count = 256});
  for (int round = 0; round < 3; ++round) {
    std::vector<Buffer> held;
    for (int i = 0; i < 10 + round * 5; ++i) held.push_back(pool->TryAcquire());
  }
  EXPECT_TRUE(HighWaterIs(*pool, pool->Stats().high_water, 20));
  EXPECT_TRUE(testing::NoHolders(*pool));
}

TEST(BufferPoolTest, StatsCountBuffersHeldAcrossThreads) {
  const ScopedPin pin;
  auto pool = MakePool({.buffer_count = 256});
  std::vector<Buffer> from_other(40);
  std::thread([&] {
    ASSERT_EQ(pool->TryAcquireBulk(absl::MakeSpan(from_other)), 40u);
  }).join();
  EXPECT_EQ(pool->Stats().in_use, 40u);
  from_other.resize(10);
  EXPECT_EQ(pool->Stats().in_use, 10u);
  EXPECT_GE(pool->Stats().high_water, 40u);
}

// One thread, every call shape, caches of several sizes (0: off), with and
// without scrubbing (every release then takes the slow path): Stats() must
// match a model exactly. The free count comes from the depot's list depths
// and the caches' reports (see "Accounting" in src/pool/accounting.cc); any
// drift between them shows here.
class StatsModelTest
    : public ::testing::TestWithParam<std::tuple<size_t, bool>> {};

TEST_P(StatsModelTest, InUseAndHighWaterMatchAModel) {
  const ScopedPin pin;
  const auto [cache, scrub] = GetParam();
  auto pool = MakePool(
      {.buffer_count = 300, .scrub_on_release = scrub, .cache_size = cache});
  std::mt19937 rng(11);
  std::vector<Buffer> held;
  std::vector<std::byte*> raw;
  size_t peak = 0;
  for (int op = 0; op < 20000; ++op) {
    switch (rng() % 9) {
      case 0:
        if (Buffer b = pool->TryAcquire()) held.push_back(std::move(b));
        break;
      case 1:
        if (std::byte* p = pool->TryAcquireRaw()) raw.push_back(p);
        break;
      case 2: {
        std::vector<Buffer> batch(rng() % 70);
        const size_t n = pool->TryAcquireBulk(absl::MakeSpan(batch));
        for (size_t i = 0; i < n; ++i) held.push_back(std::move(batch[i]));
        break;
      }
      case 3:
        if (!held.empty()) {
          std::swap(held[rng() % held.size()], held.back());
          held.pop_back();
        }
        if (!raw.empty()) {
          pool->ReleaseRaw(raw.back());
          raw.pop_back();
        }
        break;
      case 4: {
        const size_t n = std::min<size_t>(held.size(), rng() % 70);
        pool->ReleaseBulk(absl::MakeSpan(held).last(n));
        held.resize(held.size() - n);
        break;
      }
      case 5: {
        const size_t n = std::min<size_t>(raw.size(), rng() % 70);
        pool->ReleaseRawBulk(absl::MakeSpan(raw).last(n));
        raw.resize(raw.size() - n);
        break;
      }
      case 6: {
        auto b = pool->Acquire(absl::ZeroDuration());  // a poll
        if (b.ok()) held.push_back(*std::move(b));
        break;
      }
      case 7:
        if (!held.empty()) {
          raw.push_back(held.back().Detach());
          held.pop_back();
        }
        break;
      default:
        if (!raw.empty()) {
          held.push_back(pool->Adopt(raw.back()));
          raw.pop_back();
        }
    }
    peak = std::max(peak, held.size() + raw.size());
    if (op % 31 == 0) {
      const PoolStats s = pool->Stats();
      ASSERT_EQ(s.in_use, held.size() + raw.size()) << "op " << op;
      ASSERT_TRUE(HighWaterIs(*pool, s.high_water, peak)) << "op " << op;
    }
  }
  held.clear();
  pool->ReleaseRawBulk(absl::MakeSpan(raw));
  EXPECT_TRUE(testing::NoHolders(*pool));
  EXPECT_EQ(pool->Stats().high_water, peak);
}

INSTANTIATE_TEST_SUITE_P(CacheSizes, StatsModelTest,
                         ::testing::Combine(::testing::Values(0, 1, 4, 16, 64),
                                            ::testing::Bool()),
                         [](const auto& info) {
                           return "Cache" +
                                  std::to_string(std::get<0>(info.param)) +
                                  (std::get<1>(info.param) ? "Scrub" : "");
                         });

// A thread that exits leaves nothing to fold back (the caches are per CPU);
// buffers it handed over stay counted. One thread at a time, so exact.
TEST(BufferPoolTest, ThreadExitKeepsTheAccountingExact) {
  const ScopedPin pin;
  auto pool = MakePool({.buffer_count = 1024});
  std::vector<Buffer> given;
  std::thread([&] {
    std::vector<Buffer> mine;
    for (int i = 0; i < 50; ++i) mine.push_back(pool->TryAcquire());
    for (int i = 0; i < 10; ++i) given.push_back(std::move(mine[i]));
  }).join();
  PoolStats s = pool->Stats();
  EXPECT_EQ(s.in_use, 10u);
  EXPECT_TRUE(HighWaterIs(*pool, s.high_water, 50));
  std::thread([&] {
    std::vector<Buffer> mine(100);
    ASSERT_EQ(pool->TryAcquireBulk(absl::MakeSpan(mine)), 100u);
  }).join();
  s = pool->Stats();
  EXPECT_EQ(s.in_use, 10u);
  EXPECT_TRUE(HighWaterIs(*pool, s.high_water, 110));
  given.clear();
  EXPECT_TRUE(testing::NoHolders(*pool));
}

// Caches off: main releases 32 in one call while thread A takes 40 in one
// call. When A's first pop took all 32 free slots, the pool was empty with
// main's 32 still out: high_water must say 64. (Reading the depot's size
// after the pop, instead of the count the pop left, missed this in 181 of
// 18,377 runs; each round here hits it with high probability.)
// Waits until both racers have arrived: a bare spin first, so the two
// start within nanoseconds when both run, then yields, so that with another
// test on the other CPU the spinner does not hold it for a time slice.
void StartTogether(const std::atomic<int>& ready) {
  for (int spins = 0; ready.load() < 2; ++spins) {
    if (spins > 10000) std::this_thread::yield();
  }
}

TEST(BufferPoolTest, CachesOffBulkAcquireSeesTheTruePeakUnderRaces) {
#if defined(ABSL_HAVE_THREAD_SANITIZER)
  constexpr int kRounds = 200;
#else
  constexpr int kRounds = 2000;
#endif
  int emptied = 0;
  for (int round = 0; round < kRounds; ++round) {
    auto pool = MakePool({.buffer_count = 64,
                          .huge_pages = HugePages::kNever,
                          .populate = false,
                          .cache_size = 0});
    std::vector<std::byte*> mine(32);
    ASSERT_EQ(pool->TryAcquireRawBulk(absl::MakeSpan(mine)), 32u);
    std::atomic<int> ready{0};
    std::vector<std::byte*> theirs(40);
    std::thread a([&] {
      ready.fetch_add(1);
      StartTogether(ready);
      pool->TryAcquireRawBulk(absl::MakeSpan(theirs));
    });
    ready.fetch_add(1);
    StartTogether(ready);
    pool->ReleaseRawBulk(absl::MakeSpan(mine));
    a.join();
    std::set<uint32_t> got;
    for (std::byte* p : theirs) {
      if (p != nullptr) got.insert(pool->SlotOf(p));
    }
    bool took_all_free = true;
    for (uint32_t s = 32; s < 64; ++s) took_all_free &= got.count(s) == 1;
    if (took_all_free) {
      ++emptied;
      ASSERT_EQ(pool->Stats().high_water, 64u) << "round " << round;
    }
    pool->ReleaseRawBulk(absl::MakeSpan(theirs));
  }
  EXPECT_GT(emptied, 0);
}

// A metrics thread calling Stats() while one thread works must not raise the
// high-water mark above the worker's true peak. The interleavings this
// catches with caches on: a cache's total read twice with a ReleaseBulk
// landing in between (80 for a true 40), and a picture taken inside a
// refill, spill or fold.
class MonitorTest : public ::testing::TestWithParam<size_t> {};

TEST_P(MonitorTest, StatsFromAnotherThreadKeepsHighWaterAtTheTruePeak) {
  const ScopedPin pin;
  auto pool = MakePool({.buffer_count = 1024, .cache_size = GetParam()});
  std::atomic<bool> done{false};
  std::thread monitor([&] {
    while (!done.load()) (void)pool->Stats();
  });
#if defined(ABSL_HAVE_THREAD_SANITIZER)
  constexpr int kRounds = 5000;
#else
  constexpr int kRounds = 50000;
#endif
  std::mt19937 rng(3);
  std::vector<Buffer> held;
  for (int round = 0; round < kRounds; ++round) {
    const size_t n = 1 + rng() % 40;
    for (size_t i = 0; i < n; ++i) held.push_back(pool->TryAcquire());
    if (round % 2) pool->ReleaseBulk(absl::MakeSpan(held));
    held.clear();
  }
  done = true;
  monitor.join();
  EXPECT_TRUE(testing::NoHolders(*pool));
  EXPECT_TRUE(HighWaterIs(*pool, pool->Stats().high_water, 40));
}

INSTANTIATE_TEST_SUITE_P(CacheSizes, MonitorTest, ::testing::Values(0, 16, 64),
                         [](const auto& info) {
                           return "Cache" + std::to_string(info.param);
                         });

// ReleaseBulk of a span that mixes this pool's handles, another pool's and
// empty ones: every handle ends empty, each buffer back in its own pool.
TEST(BufferPoolTest, ReleaseBulkOfAMixedSpanEmptiesEveryHandle) {
  for (size_t cache : {size_t{0}, size_t{64}}) {
    auto a = MakePool({.buffer_count = 256, .cache_size = cache});
    auto b = MakePool({.buffer_count = 256, .cache_size = cache});
    std::vector<Buffer> mixed(150);
    for (size_t i = 0; i < mixed.size(); ++i) {
      if (i % 3 == 0) mixed[i] = a->TryAcquire();
      if (i % 3 == 1) mixed[i] = b->TryAcquire();
    }
    a->ReleaseBulk(absl::MakeSpan(mixed));
    for (const Buffer& h : mixed) EXPECT_FALSE(h);
    EXPECT_EQ(a->Stats().in_use, 0u);
    EXPECT_EQ(b->Stats().in_use, 0u);
  }
}

// With caches off the high-water mark is exact across threads too: each
// acquire reads the free count its own pop left.
TEST(BufferPoolTest, HighWaterIsExactAcrossThreadsWithCachesOff) {
  auto pool = MakePool({.buffer_count = 256, .cache_size = 0});
  std::vector<Buffer> mine;
  for (int i = 0; i < 25; ++i) mine.push_back(pool->TryAcquire());
  std::thread([&] {
    std::vector<Buffer> theirs(40);
    ASSERT_EQ(pool->TryAcquireBulk(absl::MakeSpan(theirs)), 40u);
    for (int i = 0; i < 5; ++i) theirs.push_back(pool->TryAcquire());
  }).join();
  mine.clear();
  const PoolStats s = pool->Stats();
  EXPECT_EQ(s.in_use, 0u);
  EXPECT_EQ(s.high_water, 70u);
}

// ---- The handle ------------------------------------------------------------

// index() is slot() by its name before 0.3, deprecated (removed in 0.4) and
// still working until then: the one place that calls it.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
TEST(BufferTest, DeprecatedIndexIsTheSlotNumber) {
  auto pool = MakePool({.buffer_count = 8, .cache_size = 0});
  std::vector<Buffer> held;
  std::vector<bool> seen(8, false);
  for (int i = 0; i < 8; ++i) {
    Buffer b = pool->TryAcquire();
    ASSERT_TRUE(b);
    ASSERT_LT(b.index(), 8u);
    EXPECT_FALSE(seen[b.index()]) << b.index();
    seen[b.index()] = true;
    EXPECT_EQ(b.data(), pool->region().data() + b.index() * b.size());
    held.push_back(std::move(b));
  }
}
#pragma GCC diagnostic pop

TEST(BufferTest, EmptyHandleHoldsNothing) {
  Buffer b;
  EXPECT_FALSE(b);
  EXPECT_EQ(b.data(), nullptr);
  EXPECT_EQ(b.size(), 0u);
  EXPECT_TRUE(b.span().empty());
  b.Reset();  // harmless
}

TEST(BufferTest, MoveTransfersOwnershipAndAssignmentReleasesTheOld) {
  auto pool = MakePool({.buffer_count = 16});
  Buffer a = pool->TryAcquire();
  Buffer b = pool->TryAcquire();
  const uint32_t ia = a.slot();
  Buffer c = std::move(a);
  EXPECT_FALSE(a);  // NOLINT(bugprone-use-after-move): documented
  EXPECT_EQ(c.slot(), ia);
  EXPECT_EQ(pool->Stats().in_use, 2u);
  c = std::move(b);  // c's old buffer goes back
  EXPECT_EQ(pool->Stats().in_use, 1u);
}

TEST(BufferTest, DetachedPointerComesBackThroughAdoptOrReleaseRaw) {
  auto pool = MakePool({.buffer_count = 16});
  Buffer a = pool->TryAcquire();
  const uint32_t slot = a.slot();
  std::byte* p = a.Detach();
  EXPECT_FALSE(a);
  EXPECT_EQ(pool->Stats().in_use, 1u);
  Buffer back = pool->Adopt(p);
  EXPECT_EQ(back.slot(), slot);
  std::byte* q = back.Detach();
  pool->ReleaseRaw(q);
  EXPECT_TRUE(testing::NoHolders(*pool));
}

TEST(BufferTest, EmptyBulkCallsDoNothing) {
  auto pool = MakePool({.buffer_count = 8});
  EXPECT_EQ(pool->TryAcquireBulk({}), 0u);
  pool->ReleaseBulk({});  // no data() behind the span (UBSan checks memset)
  EXPECT_EQ(pool->TryAcquireRawBulk({}), 0u);
  pool->ReleaseRawBulk({});
  EXPECT_TRUE(testing::NoHolders(*pool));
}

TEST(BufferTest, BulkAcquireStopsShortWhenThePoolRunsOut) {
  auto pool = MakePool({.buffer_count = 40});
  std::vector<Buffer> batch(32);
  EXPECT_EQ(pool->TryAcquireBulk(absl::MakeSpan(batch)), 32u);
  std::vector<Buffer> more(32);
  EXPECT_EQ(pool->TryAcquireBulk(absl::MakeSpan(more)), 8u);
  EXPECT_FALSE(more[8]);
  EXPECT_EQ(pool->Stats().acquire_failures, 1u);
  pool->ReleaseBulk(absl::MakeSpan(batch));
  for (const Buffer& b : batch) EXPECT_FALSE(b);
  EXPECT_EQ(pool->Stats().in_use, 8u);
}

TEST(BufferTest, RawBulkHandsOutDistinctAlignedBuffersAndTakesThemBack) {
  auto pool = MakePool({.buffer_count = 64});
  std::vector<std::byte*> batch(48);
  ASSERT_EQ(pool->TryAcquireRawBulk(absl::MakeSpan(batch)), 48u);
  EXPECT_EQ(pool->Stats().in_use, 48u);
  std::set<std::byte*> distinct(batch.begin(), batch.end());
  EXPECT_EQ(distinct.size(), 48u);
  const std::byte* begin = pool->region().data();
  for (std::byte* p : batch) {
    ASSERT_GE(p, begin);
    ASSERT_LT(p, begin + pool->region().size());
    ASSERT_EQ((p - begin) % pool->buffer_size(), 0);
    std::memset(p, 0xab, pool->buffer_size());  // writable, whole
  }
  pool->ReleaseRawBulk(absl::MakeSpan(batch));
  EXPECT_TRUE(testing::NoHolders(*pool));
  // Every buffer is free again, whichever path takes it.
  std::vector<Buffer> all(64);
  EXPECT_EQ(pool->TryAcquireBulk(absl::MakeSpan(all)), 64u);
}

TEST(BufferTest, RawBulkStopsShortAndClearsTheRest) {
  auto pool = MakePool({.buffer_count = 40});
  std::vector<std::byte*> batch(32);
  ASSERT_EQ(pool->TryAcquireRawBulk(absl::MakeSpan(batch)), 32u);
  std::vector<std::byte*> more(32, reinterpret_cast<std::byte*>(1));
  EXPECT_EQ(pool->TryAcquireRawBulk(absl::MakeSpan(more)), 8u);
  for (size_t i = 8; i < more.size(); ++i) EXPECT_EQ(more[i], nullptr) << i;
  EXPECT_EQ(pool->Stats().acquire_failures, 1u);
  // A short fill goes back whole: its nullptr tail is skipped. Pointers
  // from either API go back through either.
  pool->ReleaseRawBulk(absl::MakeSpan(more));
  for (std::byte* p : batch) pool->Adopt(p).Reset();
  EXPECT_TRUE(testing::NoHolders(*pool));
}

TEST(BufferTest, RawBulkReleaseLargerThanTheCacheSpillsToTheDepot) {
  // More than one internal chunk (64) and more than the cache holds (16).
  auto pool = MakePool({.buffer_count = 256, .cache_size = 16});
  std::vector<std::byte*> batch(200);
  ASSERT_EQ(pool->TryAcquireRawBulk(absl::MakeSpan(batch)), 200u);
  pool->ReleaseRawBulk(absl::MakeSpan(batch));
  EXPECT_TRUE(testing::NoHolders(*pool));
  std::thread([&] {  // another thread finds them in the depot
    std::vector<std::byte*> other(240);
    EXPECT_EQ(pool->TryAcquireRawBulk(absl::MakeSpan(other)), 240u);
    pool->ReleaseRawBulk(absl::MakeSpan(other));
  })
      .join();
  EXPECT_TRUE(testing::NoHolders(*pool));
}

}  // namespace
}  // namespace bufpool

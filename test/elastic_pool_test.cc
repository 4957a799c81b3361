// An elastic pool (PoolOptions::max_buffer_count): the ceiling reserved as
// one region at Create(), growth on the slow path only, Trim() of whole free
// chunks, and the system's refusals as Status values (src/pool/growth.cc).
#include <errno.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <set>
#include <thread>
#include <vector>

#include "bufpool/buffer_pool.h"
#include "gtest/gtest.h"
#include "os/syscalls.h"
#include "test_util.h"

namespace bufpool {
namespace {

constexpr size_t kPage = 4096;

// Small pages, so that chunks are one page (or one buffer) and every count
// below is exact whatever the machine's THP setting.
PoolOptions Elastic(size_t count, size_t ceiling, size_t step = 512,
                    size_t size = 4096) {
  return PoolOptions{.buffer_size = size,
                     .buffer_count = count,
                     .huge_pages = HugePages::kNever,
                     .max_buffer_count = ceiling,
                     .grow_step = step};
}

// Pages of [p, p + len) resident now (mincore).
size_t ResidentPages(const void* p, size_t len) {
  std::vector<unsigned char> v(len / kPage);
  EXPECT_EQ(::mincore(const_cast<void*>(p), len, v.data()), 0)
      << std::strerror(errno);
  size_t n = 0;
  for (unsigned char c : v) n += c & 1;
  return n;
}

TEST(ElasticPoolTest, CreateNamesTheBadFieldValueAndLimit) {
  struct Case {
    PoolOptions options;
    const char* words;
  };
  const Case cases[] = {
      {{.buffer_count = 64, .max_buffer_count = 32},
       "PoolOptions.max_buffer_count must be 0 (a fixed pool) or at least "
       "buffer_count (64), got 32"},
      {{.buffer_count = 64, .max_buffer_count = 128, .grow_step = 0},
       "PoolOptions.grow_step must be at least 1"},
      {{.buffer_count = 64, .max_buffer_count = 0xffffffffu},
       "PoolOptions.max_buffer_count must be below 4294967295"},
      {{.buffer_count = 64, .trim_after_idle = absl::Seconds(1)},
       "PoolOptions.trim_after_idle (1s) needs max_buffer_count"},
      {{.buffer_count = 64,
        .max_buffer_count = 128,
        .trim_after_idle = absl::Seconds(-1)},
       "PoolOptions.trim_after_idle must not be negative, got -1s"},
  };
  for (const Case& c : cases) {
    absl::StatusOr<std::unique_ptr<BufferPool>> pool =
        BufferPool::Create(c.options);
    ASSERT_FALSE(pool.ok()) << c.words;
    EXPECT_EQ(pool.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(pool.status().message().find(c.words), absl::string_view::npos)
        << pool.status();
  }
}

TEST(ElasticPoolTest, ReservesTheCeilingAsOneRegionAndBacksBufferCount) {
  auto pool = *BufferPool::Create(Elastic(512, 8192));
  EXPECT_EQ(pool->capacity(), 8192u);
  EXPECT_EQ(pool->region().size(), 8192u * 4096);
  const PoolStats st = pool->Stats();
  EXPECT_EQ(st.committed, 512u);
  EXPECT_EQ(st.in_use, 0u);
  EXPECT_EQ(st.grows, 0u);
  // Backed: the first 512 buffers; the rest of the reserve is address
  // space only.
  EXPECT_EQ(ResidentPages(pool->region().data(), 512 * 4096), 512u);
  EXPECT_EQ(
      ResidentPages(pool->region().data() + 512 * 4096, (8192 - 512) * 4096),
      0u);
}

TEST(ElasticPoolTest, AFixedPoolNeitherGrowsNorTrims) {
  auto pool = *BufferPool::Create({.buffer_count = 64});
  EXPECT_EQ(pool->Stats().committed, 64u);
  EXPECT_EQ(pool->Grow(1).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(pool->Trim(), 0u);
  EXPECT_EQ(pool->TrimIdle(), 0u);
}

// The doubling is capped at an eighth of the ceiling (256 here), below
// grow_step: every step is grow_step.
TEST(ElasticPoolTest, GrowsStepByStepUpToTheCeilingAndNoFurther) {
  auto pool = *BufferPool::Create(Elastic(512, 2048, 512));
  std::vector<Buffer> held;
  std::set<std::byte*> seen;
  for (;;) {
    Buffer b = pool->TryAcquire();
    if (!b) break;
    ASSERT_TRUE(seen.insert(b.data()).second) << "slot " << b.slot();
    ASSERT_TRUE(pool->Contains(b.data()));
    std::memset(b.data(), 0x5a, b.size());  // backed and writable
    held.push_back(std::move(b));
  }
  EXPECT_EQ(held.size(), 2048u);
  const PoolStats st = pool->Stats();
  EXPECT_EQ(st.committed, 2048u);
  EXPECT_EQ(st.in_use, 2048u);
  EXPECT_EQ(st.grows, 3u);  // 512 -> 1024 -> 1536 -> 2048
  EXPECT_EQ(st.acquire_failures, 1u);
  EXPECT_EQ(pool->Grow(1).code(), absl::StatusCode::kResourceExhausted);
  held.clear();
  EXPECT_EQ(pool->Stats().in_use, 0u);
}

// Each growth on demand doubles the next step, up to an eighth of the
// ceiling; a trim that gives memory back starts again from grow_step.
TEST(ElasticPoolTest, StepsDoubleThroughABurstUntilATrim) {
  auto pool = *BufferPool::Create(Elastic(256, 16384, 256));
  std::vector<Buffer> held;
  for (int i = 0; i < 4096; ++i) {
    held.push_back(pool->TryAcquire());
    ASSERT_TRUE(held.back());
  }
  PoolStats st = pool->Stats();
  EXPECT_EQ(st.committed, 4096u);  // 256 + 256 + 512 + 1024 + 2048
  EXPECT_EQ(st.grows, 4u);
  for (int i = 0; i < 4096; ++i) {  // capped: 2048 a step
    held.push_back(pool->TryAcquire());
    ASSERT_TRUE(held.back());
  }
  st = pool->Stats();
  EXPECT_EQ(st.committed, 8192u);
  EXPECT_EQ(st.grows, 6u);
  held.resize(1024);
  EXPECT_GT(pool->Trim(0), 0u);
  EXPECT_EQ(pool->Stats().committed, 1024u);
  for (int i = 0; i < 1; ++i) held.push_back(pool->TryAcquire());
  EXPECT_EQ(pool->Stats().committed, 1024u + 256u);  // grow_step again
}

TEST(ElasticPoolTest, BulkAndTimedAcquireGrowInsteadOfFailingOrWaiting) {
  auto pool = *BufferPool::Create(Elastic(64, 1024, 100));
  std::vector<Buffer> bulk(300);
  EXPECT_EQ(pool->TryAcquireBulk(absl::MakeSpan(bulk)), 300u);
  std::vector<std::byte*> raw(200);
  EXPECT_EQ(pool->TryAcquireRawBulk(absl::MakeSpan(raw)), 200u);
  // Everything backed is out: a timed Acquire grows rather than sleeps (a
  // sleep would be the full minute).
  absl::StatusOr<Buffer> one = pool->Acquire(absl::Minutes(1));
  ASSERT_TRUE(one.ok()) << one.status();
  const PoolStats st = pool->Stats();
  EXPECT_EQ(st.in_use, 501u);
  EXPECT_GE(st.committed, 501u);
  // 64 + 100 + 128 x 3: the steps double, capped at an eighth of the
  // ceiling.
  EXPECT_EQ(st.committed, 548u);
  EXPECT_EQ(st.acquire_failures, 0u);
  pool->ReleaseRawBulk(raw);
}

// Each grower backs chunks no other claimed: every slot once, the ceiling
// reached and no further.
TEST(ElasticPoolTest, EightThreadsRacingForTheLastBuffersGrowDisjointSteps) {
  constexpr size_t kCeiling = 4096;
  constexpr size_t kStep = 256;
  const int rounds = testing_util::kSanitized ? 3 : 20;
  for (int round = 0; round < rounds; ++round) {
    auto pool = *BufferPool::Create(Elastic(kStep, kCeiling, kStep));
    std::vector<std::vector<Buffer>> got(8);
    std::atomic<bool> go{false};
    std::vector<std::thread> threads;
    for (int t = 0; t < 8; ++t) {
      threads.emplace_back([&, t] {
        while (!go.load()) {
        }
        for (;;) {
          Buffer b = pool->TryAcquire();
          if (!b) break;
          // A pattern only this thread writes: a buffer handed out twice
          // would show another thread's mark.
          std::memset(b.data(), t + 1, 64);
          got[t].push_back(std::move(b));
        }
      });
    }
    go = true;
    for (std::thread& th : threads) th.join();
    std::set<uint32_t> slots;
    size_t total = 0;
    for (int t = 0; t < 8; ++t) {
      for (const Buffer& b : got[t]) {
        ASSERT_TRUE(slots.insert(b.slot()).second) << "slot twice";
        ASSERT_EQ(static_cast<int>(b.data()[0]), t + 1);
        ASSERT_EQ(static_cast<int>(b.data()[63]), t + 1);
        ++total;
      }
    }
    EXPECT_EQ(total, kCeiling);
    const PoolStats st = pool->Stats();
    EXPECT_EQ(st.committed, kCeiling);
    EXPECT_EQ(st.in_use, kCeiling);
    EXPECT_LE(st.grows, kCeiling / kStep - 1);  // a step each at least
  }
}

// The system's refusals, through the OS seam (os/syscalls.h).
std::atomic<int> g_refused{0};

TEST(ElasticPoolTest, ARefusedGrowIsAStatusAndThePoolServesWhatItHas) {
  auto pool = *BufferPool::Create(Elastic(64, 1024, 64));
  os::SyscallTable table = os::RealSyscalls();
  table.madvise = [](void* addr, size_t len, int advice) {
    if (advice == MADV_POPULATE_WRITE) {
      g_refused.fetch_add(1);
      errno = ENOMEM;
      return -1;
    }
    return ::madvise(addr, len, advice);
  };
  g_refused = 0;
  std::vector<Buffer> held(64);
  {
    const os::ScopedSyscalls seam(&table);
    ASSERT_EQ(pool->TryAcquireBulk(absl::MakeSpan(held)), 64u);
    EXPECT_FALSE(pool->TryAcquire());  // would grow: refused, not fatal
    EXPECT_EQ(pool->TryAcquireRaw(), nullptr);
    const absl::Status grow = pool->Grow(64);
    EXPECT_EQ(grow.code(), absl::StatusCode::kResourceExhausted);
    EXPECT_NE(grow.message().find("MADV_POPULATE_WRITE"),
              absl::string_view::npos)
        << grow;
    const absl::StatusOr<Buffer> timed = pool->Acquire(absl::ZeroDuration());
    ASSERT_FALSE(timed.ok());
    EXPECT_NE(timed.status().message().find("growing by"),
              absl::string_view::npos)
        << timed.status();
    // Still serving what it has.
    held.pop_back();
    EXPECT_TRUE(pool->TryAcquire());
  }
  EXPECT_GE(g_refused.load(), 3);
  PoolStats st = pool->Stats();
  EXPECT_EQ(st.committed, 64u);
  EXPECT_GE(st.grow_failures, 3u);
  EXPECT_EQ(st.grows, 0u);
  // The system relents: the next miss grows.
  Buffer more = pool->TryAcquire();
  Buffer again = pool->TryAcquire();
  EXPECT_TRUE(more && again);
  st = pool->Stats();
  EXPECT_EQ(st.grows, 1u);
  EXPECT_EQ(st.committed, 128u);
  // Grown to the ceiling since, a refusal there is the ceiling's, not the
  // old failure's.
  ASSERT_TRUE(pool->Grow(1024).ok());
  const absl::Status full = pool->Grow(1);
  EXPECT_EQ(full.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(full.message().find("at its ceiling of 1024"),
            absl::string_view::npos)
      << full;
}

TEST(ElasticPoolTest, ARefusedMlockOfAGrowthNamesTheLimit) {
  auto created = BufferPool::Create({.buffer_size = 4096,
                                     .buffer_count = 64,
                                     .huge_pages = HugePages::kNever,
                                     .lock_memory = true,
                                     .max_buffer_count = 1024,
                                     .grow_step = 64});
  if (!created.ok()) GTEST_SKIP() << "mlock not allowed: " << created.status();
  auto pool = *std::move(created);
  os::SyscallTable table = os::RealSyscalls();
  table.mlock = [](const void*, size_t) {
    errno = ENOMEM;
    return -1;
  };
  const os::ScopedSyscalls seam(&table);
  const absl::Status grow = pool->Grow(1);
  EXPECT_EQ(grow.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(grow.message().find("RLIMIT_MEMLOCK"), absl::string_view::npos)
      << grow;
  EXPECT_EQ(pool->Stats().committed, 64u);
}

// Trim() gives back whole chunks of free buffers, those idle in the
// caches too: held buffers keep their bytes.
TEST(ElasticPoolTest, TrimNeverTouchesABufferInUseAndTakesTheCachesIdleOnes) {
  // 1 KiB buffers: four share a page, so a page with one held buffer must
  // stay however many of its neighbours are free.
  auto pool = *BufferPool::Create(Elastic(256, 8192, 256, /*size=*/1024));
  std::vector<Buffer> all(8192);
  ASSERT_EQ(pool->TryAcquireBulk(absl::MakeSpan(all)), 8192u);
  std::vector<Buffer> held;
  std::vector<uint8_t> mark;
  std::set<size_t> held_pages;
  for (size_t i = 0; i < all.size(); ++i) {
    if (i % 7 == 3) {
      const auto m = static_cast<uint8_t>(1 + i % 253);
      std::memset(all[i].data(), m, 1024);
      mark.push_back(m);
      held_pages.insert(all[i].slot() / 4);
      held.push_back(std::move(all[i]));
    }
  }
  all.clear();  // the rest: free (in the caches and the depot)
  // Some free buffers idle in this CPU's cache (if caches are on).
  for (int i = 0; i < 8; ++i) all.push_back(pool->TryAcquire());
  all.clear();

  const size_t bytes = pool->Trim(0);
  EXPECT_GT(bytes, 0u);
  EXPECT_EQ(bytes % kPage, 0u);
  const PoolStats st = pool->Stats();
  EXPECT_EQ(st.trims, 1u);
  EXPECT_EQ(st.in_use, held.size());
  EXPECT_EQ(st.cached, 0u);  // flushed, and trimmed with the rest
  // Exactly the pages with a held buffer stay.
  EXPECT_EQ(st.committed, held_pages.size() * 4);
  for (size_t h = 0; h < held.size(); ++h) {
    for (size_t k = 0; k < 1024; k += 128) {
      ASSERT_EQ(static_cast<uint8_t>(held[h].data()[k]), mark[h]) << h;
    }
  }
  EXPECT_EQ(ResidentPages(pool->region().data(), pool->region().size()),
            held_pages.size());
}

// With the caches off, high_water is the exact peak, while other threads
// grow and trim (a grower's slots count before they reach the depot, a
// trimmer's while it holds them).
TEST(ElasticPoolTest, HighWaterIsExactWithCachesOffWhileOthersGrowAndTrim) {
  PoolOptions o = Elastic(64, 8192, 64);
  o.cache_size = 0;
  auto pool = *BufferPool::Create(o);
  std::atomic<bool> done{false};
  std::thread resizer([&] {
    while (!done.load()) {
      (void)pool->Grow(512);
      pool->Trim(0);
    }
  });
  std::thread taker([&] {
    // Until the resizer has grown and trimmed many times.
    for (int i = 0; i < 20'000'000 && pool->Stats().trims < 200; ++i) {
      Buffer a = pool->TryAcquire();
      ASSERT_TRUE(a);
      Buffer b = pool->TryAcquire();
      ASSERT_TRUE(b);
    }
  });
  taker.join();
  done = true;
  resizer.join();
  const PoolStats st = pool->Stats();
  EXPECT_EQ(st.high_water, 2u);
  EXPECT_EQ(st.in_use, 0u);
  EXPECT_GE(st.trims, 200u);
}

TEST(ElasticPoolTest, HeldPatternsSurviveTrimExactly) {
  auto pool = *BufferPool::Create(Elastic(128, 4096, 128));
  std::vector<Buffer> all(4096);
  ASSERT_EQ(pool->TryAcquireBulk(absl::MakeSpan(all)), 4096u);
  std::vector<Buffer> held;
  std::vector<uint8_t> mark;
  for (size_t i = 0; i < all.size(); i += 5) {
    const auto m = static_cast<uint8_t>(1 + i % 251);
    std::memset(all[i].data(), m, 4096);
    mark.push_back(m);
    held.push_back(std::move(all[i]));
  }
  all.clear();
  pool->FlushCaches();  // everything free is in the depot now
  const size_t bytes = pool->Trim(0);
  const PoolStats st = pool->Stats();
  EXPECT_EQ(st.cached, 0u);
  // 4 KiB chunks: every free buffer's page goes.
  EXPECT_EQ(bytes, (4096 - held.size()) * 4096);
  EXPECT_EQ(st.committed, held.size());
  for (size_t h = 0; h < held.size(); ++h) {
    for (size_t k = 0; k < 4096; k += 512) {
      ASSERT_EQ(static_cast<uint8_t>(held[h].data()[k]), mark[h]);
    }
  }
  // Trimmed pages are not resident; held ones are.
  size_t resident = 0;
  for (const Buffer& b : held) resident += ResidentPages(b.data(), 4096);
  EXPECT_EQ(resident, held.size());
  EXPECT_EQ(ResidentPages(pool->region().data(), pool->region().size()),
            held.size());
  // Trimmed slots come back through growth, backed and zeroed.
  std::vector<Buffer> back(4096 - held.size());
  ASSERT_EQ(pool->TryAcquireBulk(absl::MakeSpan(back)), back.size());
  for (const Buffer& b : back) {
    ASSERT_EQ(b.data()[0], std::byte{0});
    std::memset(b.data(), 0x77, 4096);
  }
  EXPECT_EQ(pool->Stats().committed, 4096u);
  EXPECT_FALSE(pool->TryAcquire());
}

TEST(ElasticPoolTest, TrimKeepsKeepFreeBuffersBacked) {
  auto pool = *BufferPool::Create(Elastic(1024, 1024 * 4, 1024));
  std::vector<Buffer> all(4096);
  ASSERT_EQ(pool->TryAcquireBulk(absl::MakeSpan(all)), 4096u);
  all.clear();
  pool->FlushCaches();
  EXPECT_EQ(pool->Trim(1000), (4096u - 1000u) * 4096);
  PoolStats st = pool->Stats();
  EXPECT_EQ(st.committed, 1000u);
  EXPECT_EQ(pool->Trim(1000), 0u);  // nothing more to give
  EXPECT_EQ(pool->Trim(0), 1000u * 4096);
  st = pool->Stats();
  EXPECT_EQ(st.committed, 0u);
  EXPECT_EQ(st.trims, 2u);
  // An empty pool still serves: the first acquire grows.
  Buffer b = pool->TryAcquire();
  ASSERT_TRUE(b);
  EXPECT_EQ(pool->Stats().committed, 1024u);
}

TEST(ElasticPoolTest, TrimWithHugePagesGivesBackWholeHugePages) {
  auto created = BufferPool::Create({.buffer_size = 4096,
                                     .buffer_count = 512,
                                     .huge_pages = HugePages::kTry,
                                     .max_buffer_count = 8192,
                                     .grow_step = 512});
  ASSERT_TRUE(created.ok()) << created.status();
  auto pool = *std::move(created);
  if (!pool->huge_pages()) GTEST_SKIP() << "THP is off here";
  std::vector<Buffer> all(4096);
  ASSERT_EQ(pool->TryAcquireBulk(absl::MakeSpan(all)), 4096u);
  // Hold one buffer in the middle of the third huge page.
  Buffer keep = std::move(all[2 * 512 + 100]);
  all.clear();
  pool->FlushCaches();
  const size_t bytes = pool->Trim(0);
  EXPECT_EQ(bytes % (size_t{2} << 20), 0u);
  EXPECT_EQ(bytes, 7 * (size_t{2} << 20));  // 8 grown, one held
  EXPECT_EQ(pool->Stats().committed, 512u);
}

TEST(ElasticPoolTest, AChildForkedAfterGrowthUsesTheGrownPool) {
  auto pool = *BufferPool::Create(Elastic(64, 1024, 64));
  std::vector<Buffer> held(300);
  ASSERT_EQ(pool->TryAcquireBulk(absl::MakeSpan(held)), 300u);
  std::memset(held[299].data(), 0x42, 4096);
  held.resize(200);  // 100 free again, in a grown part
  const pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    // Every buffer not held at the fork, and the growth to the ceiling.
    // One by one: a bulk call in a child of a single-threaded parent draws
    // a TSan report about the fork gate's fresh rwlock (as for any pool).
    std::vector<Buffer> rest;
    while (Buffer b = pool->TryAcquire()) rest.push_back(std::move(b));
    const size_t got = rest.size();
    const PoolStats st = pool->Stats();
    bool ok = got == 1024 - 200 && st.committed == 1024 && st.in_use == 1024;
    for (auto& b : rest) b.Reset();
    for (auto& b : held) b.Reset();
    const size_t trimmed = pool->Trim(0);
    ok = ok && trimmed > 0 && pool->Stats().committed < 1024;
    if (!ok) {
      std::fprintf(stderr,
                   "child: got %zu, committed %zu, in_use %zu, "
                   "trimmed %zu\n",
                   got, st.committed, st.in_use, trimmed);
    }
    ::_exit(ok ? 0 : 1);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  EXPECT_EQ(pool->Stats().in_use, 200u);
}

// Growth and trims racing everything else that moves slots: threads that
// acquire, check a pattern of their own and release (one by one and in
// bulk), a thread that drains the caches and pins and unpins the region,
// and fork()s from the main thread, whose children must find every buffer
// that no thread held at the fork free, once. At the end every buffer is
// reachable once and none is in use.
TEST(ElasticPoolTest, GrowthRacesAcquireReleaseDrainPinsAndFork) {
  auto pool = *BufferPool::Create(Elastic(64, 8192, 64));
  const int seconds_ms = testing_util::kSanitized ? 1500 : 3000;
  std::atomic<bool> done{false};
  std::atomic<bool> bad{false};
  std::vector<std::thread> threads;
  for (int t = 0; t < 2; ++t) {
    threads.emplace_back([&, t] {
      const auto mark = static_cast<std::byte>(0x10 + t);
      std::vector<Buffer> held;
      for (int i = 0; !done.load(); ++i) {
        const size_t want = 1 + (i * 37) % 700;
        if (i % 3 == 0) {
          std::vector<Buffer> bulk(want);
          bulk.resize(pool->TryAcquireBulk(absl::MakeSpan(bulk)));
          for (Buffer& b : bulk) held.push_back(std::move(b));
        } else {
          for (size_t k = 0; k < want; ++k) {
            Buffer b = pool->TryAcquire();
            if (!b) break;
            held.push_back(std::move(b));
          }
        }
        for (Buffer& b : held) {
          b.data()[0] = mark;
          b.data()[4095] = mark;
        }
        std::this_thread::yield();
        for (Buffer& b : held) {
          if (b.data()[0] != mark || b.data()[4095] != mark) bad.store(true);
        }
        if (i % 2 == 0) {
          pool->ReleaseBulk(absl::MakeSpan(held));
        }
        held.clear();
      }
    });
  }
  threads.emplace_back([&] {
    while (!done.load()) {
      (void)pool->Grow(512);
      pool->Trim(64);
      pool->TrimIdle();
    }
  });
  threads.emplace_back([&] {
    while (!done.load()) {
      pool->FlushCaches();
      pool->PinRegion();
      std::this_thread::yield();
      pool->UnpinRegion();
    }
  });
  const auto end =
      std::chrono::steady_clock::now() + std::chrono::milliseconds(seconds_ms);
  int forks = 0;
  while (std::chrono::steady_clock::now() < end) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    if (testing_util::kSanitized) continue;  // fork with threads: see above
    const pid_t pid = ::fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      // Every buffer the parent's threads did not hold: free here, once,
      // and the rest of the ceiling by growth.
      std::set<uint32_t> seen;
      bool ok = true;
      while (Buffer b = pool->TryAcquire()) {
        ok = ok && seen.insert(b.slot()).second;
        b.Detach();  // kept out: the child exits
      }
      ok = ok && pool->Stats().committed == pool->capacity();
      ::_exit(ok ? 0 : 1);
    }
    int status = 0;
    ASSERT_EQ(::waitpid(pid, &status, 0), pid);
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    ++forks;
  }
  done.store(true);
  for (std::thread& th : threads) th.join();
  EXPECT_FALSE(bad.load()) << "a buffer was handed out twice or trimmed";
  EXPECT_EQ(pool->Stats().in_use, 0u);
  std::vector<Buffer> all(8192);
  EXPECT_EQ(pool->TryAcquireBulk(absl::MakeSpan(all)), 8192u);
  std::set<uint32_t> slots;
  for (const Buffer& b : all) {
    if (b) {
      EXPECT_TRUE(slots.insert(b.slot()).second) << "slot twice";
    }
  }
  std::printf("%d forks, %llu grows, %llu trims\n", forks,
              static_cast<unsigned long long>(pool->Stats().grows),
              static_cast<unsigned long long>(pool->Stats().trims));
}

// Trim() racing with threads that acquire, write a pattern of their own,
// check it and release: a buffer trimmed while in use would read zeroes (or
// another thread's pattern), and growth must keep up with what Trim() takes.
TEST(ElasticPoolTest, TrimRacingAcquiresNeverTakesABufferInUse) {
  auto pool = *BufferPool::Create(Elastic(64, 4096, 64));
  const int ops = testing_util::kSanitized ? 3000 : 30000;
  std::atomic<bool> stop{false};
  std::atomic<uint64_t> bad{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      std::vector<Buffer> mine;
      for (int i = 0; i < ops; ++i) {
        if (mine.size() < 200 && (i % 3 != 2 || mine.empty())) {
          Buffer b = pool->TryAcquire();
          if (!b) continue;
          std::memset(b.data(), 0x10 + t, 64);
          std::memset(b.data() + 4032, 0x10 + t, 64);
          mine.push_back(std::move(b));
        } else {
          Buffer& b = mine.back();
          if (b.data()[0] != static_cast<std::byte>(0x10 + t) ||
              b.data()[4095] != static_cast<std::byte>(0x10 + t)) {
            bad.fetch_add(1);
          }
          mine.pop_back();
        }
      }
    });
  }
  // Until the workers are done and it has trimmed once: on a loaded
  // machine the workers can finish before a whole chunk was ever free.
  std::thread trimmer([&] {
    while (!stop.load() || pool->Stats().trims == 0) {
      pool->Trim(0);
      pool->FlushCaches();
      std::this_thread::yield();
    }
  });
  for (std::thread& th : threads) th.join();
  stop = true;
  trimmer.join();
  EXPECT_EQ(bad.load(), 0u);
  EXPECT_GE(pool->Stats().trims, 1u);
  EXPECT_EQ(pool->Stats().in_use, 0u);
  // Everything comes back: up to the ceiling, each slot once.
  std::vector<Buffer> all(4096);
  EXPECT_EQ(pool->TryAcquireBulk(absl::MakeSpan(all)), 4096u);
  EXPECT_EQ(pool->Stats().committed, 4096u);
}

// No tick at all: the acquire slow path (every acquire, with the caches
// off) closes the window and trims what stayed free in it.
TEST(ElasticPoolTest, TheSlowPathTicksTheIdleTrim) {
  PoolOptions o = Elastic(256, 4096, 256);
  o.cache_size = 0;
  o.trim_after_idle = absl::Milliseconds(20);
  auto pool = *BufferPool::Create(o);
  {
    std::vector<Buffer> burst(4096);
    ASSERT_EQ(pool->TryAcquireBulk(absl::MakeSpan(burst)), 4096u);
  }
  // A trickle of one buffer at a time: free throughout, the rest is idle.
  // A deadline for the loop, not a threshold: it ends on the first trim.
  for (int i = 0; i < 1000 && pool->Stats().trims == 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
    Buffer b = pool->TryAcquire();
    ASSERT_TRUE(b);
  }
  const PoolStats st = pool->Stats();
  EXPECT_GE(st.trims, 1u);
  EXPECT_LT(st.committed, 4096u);
  EXPECT_EQ(st.in_use, 0u);
}

TEST(ElasticPoolTest, IdleBuffersAreTrimmedAfterTrimAfterIdle) {
  PoolOptions o = Elastic(256, 4096, 256);
  o.trim_after_idle = absl::Milliseconds(20);
  auto pool = *BufferPool::Create(o);
  {
    std::vector<Buffer> burst(4096);
    ASSERT_EQ(pool->TryAcquireBulk(absl::MakeSpan(burst)), 4096u);
  }
  pool->FlushCaches();
  ASSERT_EQ(pool->Stats().committed, 4096u);
  // Nothing was handed out since: within two windows, the tick trims. A
  // deadline for the loop, not a threshold: it ends on the first trim.
  size_t bytes = 0;
  for (int i = 0; i < 500 && bytes == 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
    bytes = pool->TrimIdle();
  }
  EXPECT_GT(bytes, 0u);
  EXPECT_LT(pool->Stats().committed, 4096u);
  EXPECT_EQ(pool->Stats().trims, 1u);
}

}  // namespace
}  // namespace bufpool

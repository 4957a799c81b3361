// The core's behaviour across threads and pools that users of worker threads
// rely on: buffers idle in a blocked thread's cache reach a waiter,
// FlushThreadCache(), many pools on one thread, high_water that never reads
// below the true peak, ReleaseBulk of a span stored in the pool's buffers,
// and the cache-size limit.
#include <malloc.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <mutex>
#include <new>
#include <random>
#include <thread>
#include <vector>

#include "bufpool/buffer_pool.h"
#include "gtest/gtest.h"
#include "os/thread.h"

namespace bufpool {
namespace {

std::unique_ptr<BufferPool> MakePool(PoolOptions options) {
  auto pool = BufferPool::Create(options);
  EXPECT_TRUE(pool.ok()) << pool.status();
  return pool.ok() ? *std::move(pool) : nullptr;
}

// A gate threads block on (a condition variable: the thread sleeps in the
// kernel, as an idle worker does).
class Gate {
 public:
  void Open() {
    std::lock_guard<std::mutex> lock(mu_);
    open_ = true;
    cv_.notify_all();
  }
  void Wait() {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [this] { return open_; });
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool open_ = false;
};

// Counts arrivals; Wait() returns when `n` have arrived.
class Latch {
 public:
  explicit Latch(int n) : left_(n) {}
  void Arrive() {
    std::lock_guard<std::mutex> lock(mu_);
    if (--left_ == 0) cv_.notify_all();
  }
  void Wait() {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [this] { return left_ <= 0; });
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  int left_;
};

// Runs f on a thread and fails (aborting the test binary, which ctest
// reports) if it has not returned within a minute: for the calls that would
// otherwise hang forever when buffers stay stranded.
template <class F>
void WithinAMinute(const char* what, F f) {
  Gate done;
  std::thread watchdog_target([&] {
    f();
    done.Open();
  });
  std::atomic<bool> finished{false};
  std::thread watchdog([&] {
    for (int i = 0; i < 600 && !finished.load(); ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    if (!finished.load()) {
      std::fprintf(stderr, "%s did not return within a minute\n", what);
      std::abort();
    }
  });
  done.Wait();
  finished.store(true);
  watchdog_target.join();
  watchdog.join();
}

// ---- Reclaiming from idle threads ------------------------------------------

struct IdleParams {
  size_t cache;      // thread_cache_size
  int idle_threads;  // each caches buffers, then blocks
  int busy_threads;  // each keeps acquiring and releasing
  bool forever;      // Acquire(InfiniteDuration) instead of a finite timeout
};

class IdleThreadTest : public testing::TestWithParam<IdleParams> {};

// Every idle thread caches as many buffers as its cache holds and blocks;
// busy threads cycle one buffer at a time. Main then acquires every buffer
// that is not in a busy thread's hands, one Acquire() at a time: none may
// time out, because each time a free buffer exists somewhere.
TEST_P(IdleThreadTest, AcquireGetsBuffersIdleInBlockedThreadsCaches) {
  const IdleParams p = GetParam();
  const size_t count = std::max<size_t>(64, p.cache * 8);
  auto pool = MakePool({.buffer_count = count, .thread_cache_size = p.cache});
  ASSERT_EQ(pool->cache_capacity(), p.cache);

  Gate release_idle;
  Latch cached(p.idle_threads);
  std::vector<std::thread> idle;
  for (int t = 0; t < p.idle_threads; ++t) {
    idle.emplace_back([&] {
      {
        std::vector<Buffer> mine;
        for (size_t i = 0; i < p.cache; ++i) mine.push_back(pool->TryAcquire());
      }  // back into this thread's cache
      cached.Arrive();
      release_idle.Wait();  // blocked, alive, holding cached buffers
    });
  }
  cached.Wait();

  std::atomic<bool> stop{false};
  std::vector<std::thread> busy;
  for (int t = 0; t < p.busy_threads; ++t) {
    busy.emplace_back([&] {
      while (!stop.load(std::memory_order_relaxed)) {
        Buffer b = pool->TryAcquire();
        if (b) b.data()[0] = std::byte{1};
      }
    });
  }

  const size_t want = count - static_cast<size_t>(p.busy_threads);
  std::vector<Buffer> held;
  held.reserve(want);
  WithinAMinute("Acquire of a buffer idle in another thread's cache", [&] {
    while (held.size() < want) {
      auto b = pool->Acquire(p.forever ? absl::InfiniteDuration()
                                       : absl::Seconds(30));
      ASSERT_TRUE(b.ok()) << b.status() << " after " << held.size();
      held.push_back(*std::move(b));
    }
  });
  EXPECT_EQ(held.size(), want);
  EXPECT_EQ(pool->Stats().acquire_timeouts, 0u);

  stop.store(true);
  for (auto& t : busy) t.join();
  release_idle.Open();
  for (auto& t : idle) t.join();
  held.clear();
  EXPECT_EQ(pool->Stats().in_use, 0u);
}

INSTANTIATE_TEST_SUITE_P(
    CachesAndThreads, IdleThreadTest,
    testing::Values(IdleParams{8, 1, 0, false}, IdleParams{8, 1, 0, true},
                    IdleParams{64, 2, 0, false}, IdleParams{64, 7, 0, true},
                    IdleParams{512, 3, 0, false}, IdleParams{512, 2, 0, true},
                    IdleParams{64, 4, 2, false}, IdleParams{8, 6, 1, true}),
    [](const auto& info) {
      return "cache" + std::to_string(info.param.cache) + "_idle" +
             std::to_string(info.param.idle_threads) + "_busy" +
             std::to_string(info.param.busy_threads) +
             (info.param.forever ? "_forever" : "_finite");
    });

// The case: 56 of 64 held by main, 8 idle in a blocked thread.
TEST(IdleThreadTest, AZeroTimeoutAcquireAlsoReclaims) {
  auto pool = MakePool({.buffer_count = 64, .thread_cache_size = 8});
  Gate release_idle;
  Gate cached;
  std::atomic<int> tid{0};
  std::thread idle([&] {
    {
      std::vector<Buffer> mine;
      for (int i = 0; i < 8; ++i) mine.push_back(pool->TryAcquire());
    }
    tid.store(os::CurrentThreadId());
    cached.Open();
    release_idle.Wait();
  });
  cached.Wait();
  // A zero timeout does not retry: wait until the idle thread sleeps.
  while (os::GetThreadState(tid.load()) != os::ThreadState::kBlocked) {
    std::this_thread::yield();
  }
  std::vector<Buffer> held(56);
  ASSERT_EQ(pool->TryAcquireBulk(absl::MakeSpan(held)), 56u);
  EXPECT_FALSE(pool->TryAcquire());  // TryAcquire does not reclaim
  for (int i = 0; i < 8; ++i) {
    auto b = pool->Acquire(absl::ZeroDuration());
    if (!b.ok()) {
      ADD_FAILURE() << b.status() << " at " << i;
      break;
    }
    held.push_back(*std::move(b));
  }
  EXPECT_EQ(pool->Stats().in_use, 64u);
  release_idle.Open();
  idle.join();
}

TEST(FlushThreadCacheTest, MakesThisThreadsIdleBuffersVisibleToAll) {
  auto pool = MakePool({.buffer_count = 64, .thread_cache_size = 8});
  Gate flushed, done;
  std::thread worker([&] {
    {
      std::vector<Buffer> mine;
      for (int i = 0; i < 8; ++i) mine.push_back(pool->TryAcquire());
    }
    pool->FlushThreadCache();
    flushed.Open();
    done.Wait();
  });
  flushed.Wait();
  std::vector<Buffer> all(64);
  EXPECT_EQ(pool->TryAcquireBulk(absl::MakeSpan(all)), 64u);
  done.Open();
  worker.join();
}

TEST(FlushThreadCacheTest, IsHarmlessWithoutACache) {
  auto off = MakePool({.buffer_count = 16, .thread_cache_size = 0});
  off->FlushThreadCache();  // caches off
  auto pool = MakePool({.buffer_count = 64, .thread_cache_size = 8});
  pool->FlushThreadCache();  // never used on this thread
  std::vector<Buffer> all(64);
  EXPECT_EQ(pool->TryAcquireBulk(absl::MakeSpan(all)), 64u);
  pool->FlushThreadCache();  // used, cache empty
  all.clear();
  EXPECT_EQ(pool->Stats().in_use, 0u);
}

// In a child after fork() only the forking thread exists: buffers cached by
// the parent's other threads are reclaimed (their owners are gone), and the
// forking thread's own cache is still its own.
TEST(IdleThreadTest, AChildAfterForkReclaimsThePartnersCaches) {
#if defined(__SANITIZE_THREAD__)
  GTEST_SKIP() << "fork with live threads under ThreadSanitizer";
#endif
  auto pool = MakePool({.buffer_count = 64, .thread_cache_size = 8});
  {
    std::vector<Buffer> mine;
    for (int i = 0; i < 8; ++i) mine.push_back(pool->TryAcquire());
  }  // main's cache: 8
  Gate release_idle, cached;
  std::thread idle([&] {
    {
      std::vector<Buffer> mine;
      for (int i = 0; i < 8; ++i) mine.push_back(pool->TryAcquire());
    }
    cached.Open();
    release_idle.Wait();
  });
  cached.Wait();
  const pid_t child = fork();
  if (child == 0) {
    std::vector<Buffer> all;
    for (int i = 0; i < 64; ++i) {
      auto got = pool->Acquire(absl::Seconds(10));
      if (!got.ok()) _exit(10 + i % 50);
      all.push_back(*std::move(got));
    }
    all.clear();
    _exit(pool->Stats().in_use == 0 ? 0 : 3);
  }
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
  release_idle.Open();
  idle.join();
}

// ---- Many pools per thread -------------------------------------------------

TEST(ManyPoolsTest, CreatingAndDestroying10000PoolsOnOneThreadDoesNotLeak) {
  auto use_one = [] {
    auto pool = MakePool({.buffer_size = 64,
                          .buffer_count = 64,
                          .huge_pages = HugePages::kNever,
                          .thread_cache_size = 8});
    Buffer b = pool->TryAcquire();
    ASSERT_TRUE(b);
    b.Reset();  // this thread now has a cache for the pool
  };
#if defined(__SANITIZE_ADDRESS__)
  GTEST_SKIP() << "mallinfo2 does not see ASan's allocator";
#endif
  for (int i = 0; i < 100; ++i) use_one();  // warm up allocator state
  const size_t before = mallinfo2().uordblks;
  for (int i = 0; i < 10000; ++i) use_one();
  const size_t after = mallinfo2().uordblks;
  // A leaked cache is over 2 KiB: 10,000 of them would be over 20 MB.
  EXPECT_LT(after, before + (1u << 20)) << before << " -> " << after;
}

// Four threads use four pools in random order, each buffer stamped with its
// owner and checked before release; every pool gets all its buffers back.
TEST(ManyPoolsTest, FourThreadsInterleaveFourPools) {
  constexpr int kPools = 4;
  std::vector<std::unique_ptr<BufferPool>> pools;
  for (int i = 0; i < kPools; ++i) {
    pools.push_back(MakePool(
        {.buffer_size = 256, .buffer_count = 256, .thread_cache_size = 16}));
  }
#if defined(__SANITIZE_THREAD__)
  constexpr int kOps = 20000;
#else
  constexpr int kOps = 200000;
#endif
  std::atomic<uint64_t> bad{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      std::mt19937 rng(1234 + t);
      std::vector<Buffer> held;
      for (int op = 0; op < kOps; ++op) {
        const int which = static_cast<int>(rng() % kPools);
        if (held.size() < 24 && rng() % 2 == 0) {
          Buffer b = pools[which]->TryAcquire();
          if (!b) continue;
          std::memset(b.data(), t * 16 + which, b.size());
          held.push_back(std::move(b));
        } else if (!held.empty()) {
          const size_t i = rng() % held.size();
          Buffer b = std::move(held[i]);
          held[i] = std::move(held.back());
          held.pop_back();
          int owner = -1;
          for (int k = 0; k < kPools; ++k) {
            if (b.pool() == pools[k].get()) owner = k;
          }
          const auto want = static_cast<std::byte>(t * 16 + owner);
          for (size_t k = 0; k < b.size(); ++k) {
            if (b.data()[k] != want) {
              bad.fetch_add(1);
              break;
            }
          }
        }
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(bad.load(), 0u);
  for (auto& pool : pools) {
    EXPECT_EQ(pool->Stats().in_use, 0u);
    std::vector<Buffer> all(256);
    EXPECT_EQ(pool->TryAcquireBulk(absl::MakeSpan(all)), 256u);
  }
}

TEST(ManyPoolsTest, MorePoolsThanTableEntriesAllWork) {
  std::vector<std::unique_ptr<BufferPool>> pools;
  for (int i = 0; i < 40; ++i) {
    pools.push_back(MakePool({.buffer_size = 64,
                              .buffer_count = 64,
                              .huge_pages = HugePages::kNever,
                              .thread_cache_size = 8}));
  }
  std::vector<Buffer> held;
  for (int round = 0; round < 3; ++round) {
    for (auto& pool : pools) {
      for (int i = 0; i < 64; ++i) {
        Buffer b = pool->TryAcquire();
        ASSERT_TRUE(b) << "round " << round;
        held.push_back(std::move(b));
      }
    }
    for (auto& pool : pools) EXPECT_EQ(pool->Stats().in_use, 64u);
    held.clear();
    for (auto& pool : pools) EXPECT_EQ(pool->Stats().in_use, 0u);
  }
}

// ---- high_water ------------------------------------------------------------

// Thread B holds buffers taken from its own cache while main takes 40: the
// true peak is 40 + B's.
TEST(HighWaterTest, NeverBelowThePeakOfTwoThreadsHoldingAtOnce) {
  struct Case {
    size_t count, cache, b_holds;
  };
  for (const Case c : {Case{64, 8, 8}, Case{1024, 64, 33}}) {
    auto pool =
        MakePool({.buffer_count = c.count, .thread_cache_size = c.cache});
    Gate b_holding, main_done;
    std::thread b([&] {
      {  // fill B's cache, then hold buffers from it
        std::vector<Buffer> warm;
        for (size_t i = 0; i < c.cache; ++i) warm.push_back(pool->TryAcquire());
      }
      std::vector<Buffer> hold;
      for (size_t i = 0; i < c.b_holds; ++i) hold.push_back(pool->TryAcquire());
      b_holding.Open();
      main_done.Wait();
    });
    b_holding.Wait();
    {
      std::vector<Buffer> mine;
      for (int i = 0; i < 40; ++i) mine.push_back(pool->TryAcquire());
      const PoolStats s = pool->Stats();
      const size_t peak = 40 + c.b_holds;
      EXPECT_EQ(s.in_use, peak);
      EXPECT_GE(s.high_water, peak) << "count " << c.count;
      EXPECT_LE(s.high_water, peak + 2 * pool->cache_capacity());
    }
    main_done.Open();
    b.join();
    EXPECT_GE(pool->Stats().high_water, 40 + c.b_holds);
  }
}

// Threads take turns: each peaks at its own count and goes idle. The true
// peak is the largest single turn.
TEST(HighWaterTest, ThreadsTakingTurnsStayWithinTheBound) {
  for (const int threads : {2, 4}) {
    for (const bool flush : {false, true}) {
      auto pool = MakePool({.buffer_count = 1024, .thread_cache_size = 64});
      for (int t = 0; t < threads; ++t) {
        std::thread([&, t] {
          std::vector<Buffer> mine;
          for (int i = 0; i < 33 + t * 7 / threads; ++i) {
            mine.push_back(pool->TryAcquire());
          }
          mine.clear();
          if (flush) pool->FlushThreadCache();
        }).join();
      }
      std::vector<Buffer> mine;
      for (int i = 0; i < 40; ++i) mine.push_back(pool->TryAcquire());
      mine.clear();
      const PoolStats s = pool->Stats();
      EXPECT_EQ(s.in_use, 0u);
      EXPECT_GE(s.high_water, 40u);
      // The turns' threads have exited, so their caches are back: the
      // estimate is exact whether or not they flushed.
      EXPECT_EQ(s.high_water, 40u) << threads << " threads, flush " << flush;
    }
  }
}

// The same with the earlier threads alive and idle: their cached buffers may
// count as in use (the documented bound), never less than the peak; after
// FlushThreadCache() in each, exact.
TEST(HighWaterTest, IdleThreadsCachesAreTheOnlyOvershoot) {
  for (const bool flush : {false, true}) {
    auto pool = MakePool({.buffer_count = 1024, .thread_cache_size = 64});
    Gate stay, took;
    std::thread x([&] {
      {
        std::vector<Buffer> mine;
        for (int i = 0; i < 33; ++i) mine.push_back(pool->TryAcquire());
      }
      if (flush) pool->FlushThreadCache();
      took.Open();
      stay.Wait();
    });
    took.Wait();
    std::vector<Buffer> mine;
    for (int i = 0; i < 40; ++i) mine.push_back(pool->TryAcquire());
    const PoolStats s = pool->Stats();
    EXPECT_GE(s.high_water, 40u);
    if (flush) {
      EXPECT_EQ(s.high_water, 40u);
    } else {
      EXPECT_LE(s.high_water, 40u + pool->cache_capacity());
    }
    mine.clear();
    stay.Open();
    x.join();
  }
}

// Random operations on random threads (taking turns under a lock, so the
// true in_use is known at every step): high_water never reads below the
// largest in_use so far, and in_use is exact.
TEST(HighWaterTest, RandomTurnsNeverReadBelowThePeak) {
  auto pool = MakePool({.buffer_count = 512, .thread_cache_size = 32});
  std::mutex mu;
  size_t in_use = 0, peak = 0;
  std::atomic<uint64_t> low_reads{0}, wrong_in_use{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      std::mt19937 rng(77 + t);
      std::vector<Buffer> held;
      for (int op = 0; op < 3000; ++op) {
        std::lock_guard<std::mutex> lock(mu);
        const int action = static_cast<int>(rng() % 10);
        if (action < 5 && held.size() < 100) {
          const size_t n = 1 + rng() % 40;
          for (size_t i = 0; i < n; ++i) {
            Buffer b = pool->TryAcquire();
            if (!b) break;
            held.push_back(std::move(b));
            peak = std::max(peak, ++in_use);
          }
        } else if (action < 9) {
          const size_t n = std::min<size_t>(held.size(), 1 + rng() % 40);
          for (size_t i = 0; i < n; ++i) {
            held.pop_back();
            --in_use;
          }
        } else if (action == 9) {
          pool->FlushThreadCache();
        }
        const PoolStats s = pool->Stats();
        if (s.high_water < peak) low_reads.fetch_add(1);
        if (s.in_use != in_use) wrong_in_use.fetch_add(1);
      }
      std::lock_guard<std::mutex> lock(mu);
      in_use -= held.size();
      held.clear();
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(low_reads.load(), 0u);
  EXPECT_EQ(wrong_in_use.load(), 0u);
  const PoolStats s = pool->Stats();
  EXPECT_EQ(s.in_use, 0u);
  EXPECT_GE(s.high_water, peak);
  EXPECT_LE(s.high_water, peak + 4 * pool->cache_capacity());
}

// ---- ReleaseBulk of a span stored in the pool's buffers ---------------------

class SpanInsideTest : public testing::TestWithParam<bool> {};

TEST_P(SpanInsideTest, ReleaseBulkReadsEveryHandleBeforeAnyBufferGoesBack) {
  const bool scrub = GetParam();
  for (const size_t n : {size_t{8}, size_t{100}}) {
    auto pool = MakePool({.buffer_count = 256,
                          .scrub_on_release = scrub,
                          .thread_cache_size = 16});
    Buffer home = pool->TryAcquire();
    auto* span = new (home.data()) Buffer[n];
    span[0] = std::move(home);  // the span's own buffer is released too
    for (size_t i = 1; i < n; ++i) span[i] = pool->TryAcquire();
    ASSERT_EQ(pool->Stats().in_use, n);
    pool->ReleaseBulk(absl::MakeSpan(span, n));
    EXPECT_EQ(pool->Stats().in_use, 0u) << "n " << n << " scrub " << scrub;
  }
}

TEST_P(SpanInsideTest, ReleaseRawBulkReadsEveryPointerBeforeAnyBufferGoesBack) {
  const bool scrub = GetParam();
  for (const size_t n : {size_t{8}, size_t{100}}) {
    auto pool = MakePool({.buffer_count = 256,
                          .scrub_on_release = scrub,
                          .thread_cache_size = 16});
    std::byte* home = pool->TryAcquireRaw();
    auto** ptrs = reinterpret_cast<std::byte**>(home);
    ptrs[0] = home;
    for (size_t i = 1; i < n; ++i) ptrs[i] = pool->TryAcquireRaw();
    pool->ReleaseRawBulk(absl::MakeConstSpan(ptrs, n));
    EXPECT_EQ(pool->Stats().in_use, 0u) << "n " << n << " scrub " << scrub;
  }
}

// A span of 100 handles of pool B stored in a buffer of pool A, which the
// span also holds: B's handles are all read before A's buffer goes back.
TEST_P(SpanInsideTest, ReleaseBulkOfASpanInAnotherPoolsBuffer) {
  const bool scrub = GetParam();
  auto a = MakePool(
      {.buffer_count = 64, .scrub_on_release = scrub, .thread_cache_size = 8});
  auto b = MakePool({.buffer_count = 256,
                     .scrub_on_release = scrub,
                     .thread_cache_size = 16});
  Buffer home = a->TryAcquire();
  auto* span = new (home.data()) Buffer[100];
  span[0] = std::move(home);
  for (size_t i = 1; i < 100; ++i) span[i] = b->TryAcquire();
  b->ReleaseBulk(absl::MakeSpan(span, 100));
  EXPECT_EQ(b->Stats().in_use, 0u);
  EXPECT_EQ(a->Stats().in_use, 0u);
}

INSTANTIATE_TEST_SUITE_P(ScrubOnAndOff, SpanInsideTest, testing::Bool(),
                         [](const auto& info) {
                           return info.param ? "Scrub" : "NoScrub";
                         });

// ---- Options ---------------------------------------------------------------

TEST(OptionsTest, ThreadCacheSizeAboveTheLimitIsInvalidArgument) {
  auto pool = BufferPool::Create({.thread_cache_size = 1000});
  ASSERT_EQ(pool.status().code(), absl::StatusCode::kInvalidArgument);
  const std::string message(pool.status().message());
  EXPECT_NE(message.find("thread_cache_size"), std::string::npos) << message;
  EXPECT_NE(message.find("512"), std::string::npos) << message;
  EXPECT_NE(message.find("1000"), std::string::npos) << message;
  EXPECT_TRUE(BufferPool::Create({.buffer_count = 8192,
                                  .thread_cache_size = kMaxThreadCacheSize})
                  .ok());
}

}  // namespace
}  // namespace bufpool

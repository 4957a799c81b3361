// A trimmer or grower stopped inside its work stalls no other thread's
// acquire (src/pool/growth.cc, "Nobody waits"): a signal handler that
// sleeps is raised inside Trim(), the idle trim and a growth, at each point
// where they hold free slots or chunks in transit (the test seam
// PoolAccess::resize_point_for_test), and while it sleeps another thread's
// TryAcquire() and Acquire() must return: with a buffer where one is free
// or can be grown, empty at once (TryAcquire) where the pool is at its
// ceiling and every free slot is in the stopped thread's transit.
//
// The handler sleeps until the test releases it, so "returned while the
// trimmer was stopped" holds by construction; a call that waited for the
// trimmer would never return, which the hang guard (a minute) reports.
// No timing is asserted. The modes: ctest runs this binary with the
// default index (mm_cid where the kernel has it), with
// BUFPOOL_RSEQ_INDEX=cpu_id and with glibc's rseq off (the locked caches);
// each test runs with the caches on and off.
#include <pthread.h>
#include <signal.h>
#include <time.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <functional>
#include <set>
#include <thread>
#include <vector>

#include "bufpool/buffer_pool.h"
#include "gtest/gtest.h"
#include "pool/pool_internal.h"
#include "test_util.h"

namespace bufpool {
namespace {

using Point = PoolAccess::ResizePoint;

std::atomic<bool> g_parked{false};
std::atomic<bool> g_release{false};
std::atomic<int> g_point{-1};
thread_local bool t_armed = false;

// Sleeps until the test releases it (atomics only: async-signal-safe).
void SleepyHandler(int) {
  g_parked.store(true);
  while (!g_release.load()) {
    const timespec ts{0, 1'000'000};
    ::nanosleep(&ts, nullptr);
  }
  g_parked.store(false);
}

// The seam: on the armed thread, at the chosen point, once, a signal that
// is delivered before pthread_kill() returns (to the calling thread).
void AtPoint(Point point) {
  if (!t_armed || static_cast<int>(point) != g_point.load()) return;
  t_armed = false;
  ::pthread_kill(::pthread_self(), SIGUSR1);
}

constexpr auto kHangGuard = std::chrono::seconds(60);

// Runs `resize` on a thread that stops in SleepyHandler at `point`.
class StoppedResizer {
 public:
  StoppedResizer(Point point, std::function<void()> resize) {
    g_release.store(false);
    g_parked.store(false);
    g_point.store(static_cast<int>(point));
    thread_ = std::thread([this, resize = std::move(resize)] {
      t_armed = true;
      resize();
      t_armed = false;
      done_.store(true);
    });
  }
  ~StoppedResizer() { Release(); }

  // True once the thread sleeps in the handler; false if it finished
  // without reaching the point.
  bool WaitStopped() {
    const auto give_up = std::chrono::steady_clock::now() + kHangGuard;
    while (!g_parked.load() && !done_.load() &&
           std::chrono::steady_clock::now() < give_up) {
      std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
    return g_parked.load();
  }
  bool stopped() const { return g_parked.load(); }
  void Release() {
    g_release.store(true);
    if (thread_.joinable()) thread_.join();
  }

 private:
  std::atomic<bool> done_{false};
  std::thread thread_;
};

// Runs `call` on another thread; true when it returned within the hang
// guard. On a hang, releases the stopped thread so that the call can end.
bool ReturnsWhileStopped(const std::function<void()>& call) {
  std::atomic<bool> done{false};
  std::thread t([&] {
    call();
    done.store(true);
  });
  const auto give_up = std::chrono::steady_clock::now() + kHangGuard;
  while (!done.load() && std::chrono::steady_clock::now() < give_up) {
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
  const bool returned = done.load();
  const bool still_stopped = g_parked.load();
  if (!returned) g_release.store(true);
  t.join();
  return returned && still_stopped;
}

class ResizeStallTest : public testing::TestWithParam<bool> {
 protected:
  void SetUp() override {
    struct sigaction sa = {};
    sa.sa_handler = SleepyHandler;
    sigemptyset(&sa.sa_mask);
    ASSERT_EQ(::sigaction(SIGUSR1, &sa, nullptr), 0);
    PoolAccess::resize_point_for_test = &AtPoint;
  }
  void TearDown() override {
    PoolAccess::resize_point_for_test = nullptr;
    g_release.store(true);
    ::signal(SIGUSR1, SIG_DFL);
  }

  // 4 KiB buffers, small pages: a chunk is one buffer.
  std::unique_ptr<BufferPool> Make(size_t count, size_t ceiling,
                                   absl::Duration idle = absl::ZeroDuration()) {
    PoolOptions o{.buffer_size = 4096,
                  .buffer_count = count,
                  .huge_pages = HugePages::kNever,
                  .max_buffer_count = ceiling,
                  .grow_step = 512,
                  .trim_after_idle = idle};
    if (!GetParam()) o.cache_size = 0;
    auto pool = testing_util::MakePool(o);
    std::printf("mode %d, caches %s\n", static_cast<int>(pool->per_cpu_mode()),
                GetParam() ? "on" : "off");
    return pool;
  }

  // Grows to `n` buffers in use, then frees them all.
  static void Burst(BufferPool& pool, size_t n) {
    std::vector<Buffer> held;
    for (size_t i = 0; i < n; ++i) {
      held.push_back(pool.TryAcquire());
      ASSERT_TRUE(held.back());
    }
  }

  // Every buffer is reachable once, and none is in use.
  static void ExpectWhole(BufferPool& pool) {
    EXPECT_EQ(pool.Stats().in_use, 0u);
    std::vector<Buffer> all(pool.capacity());
    EXPECT_EQ(pool.TryAcquireBulk(absl::MakeSpan(all)), pool.capacity());
    std::set<uint32_t> slots;
    for (const Buffer& b : all) {
      if (b) {
        EXPECT_TRUE(slots.insert(b.slot()).second) << "slot twice";
      }
    }
  }
};

// Takes `n` buffers with TryAcquire() on another thread while the resizer
// is stopped: true when all came and the call returned meanwhile.
bool TakesWhileStopped(BufferPool& pool, size_t n, size_t* got = nullptr) {
  std::vector<Buffer> taken;
  const bool returned = ReturnsWhileStopped([&] {
    for (size_t i = 0; i < n; ++i) {
      Buffer b = pool.TryAcquire();
      if (!b) break;
      std::memset(b.data(), 0x5a, 64);
      taken.push_back(std::move(b));
    }
  });
  if (got != nullptr) *got = taken.size();
  return returned && taken.size() == n;
}

// Stops `resize` at `point`, takes `n` buffers while it is stopped, runs
// `also` (if any) while it is still stopped, and lets it go on.
void ExpectTakesWhileStoppedAt(BufferPool& pool, Point point,
                               std::function<void()> resize, size_t n,
                               const std::function<void()>& also = nullptr) {
  StoppedResizer resizer(point, std::move(resize));
  ASSERT_TRUE(resizer.WaitStopped());
  size_t got = 0;
  EXPECT_TRUE(TakesWhileStopped(pool, n, &got)) << got << " of " << n;
  if (also) also();
  resizer.Release();
}

// `n` buffers taken with TryAcquire() (the caller checks the last one came).
std::vector<Buffer> Hold(BufferPool& pool, size_t n) {
  std::vector<Buffer> held;
  for (size_t i = 0; i < n; ++i) held.push_back(pool.TryAcquire());
  return held;
}

// A sleeper in Acquire() gets the buffer that `held` gives back 20 ms later;
// true when that call returned while the resizer stays stopped.
bool SleeperGetsTheNextRelease(BufferPool& pool, std::vector<Buffer>& held) {
  return ReturnsWhileStopped([&] {
    std::thread releaser([&] {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
      held.pop_back();
    });
    absl::StatusOr<Buffer> b = pool.Acquire(absl::Minutes(1));
    EXPECT_TRUE(b.ok()) << b.status();
    releaser.join();
  });
}

TEST_P(ResizeStallTest, ATrimmerStoppedHoldingTheDepotsSlotsHandsThemOn) {
  auto pool = Make(512, 4096);
  Burst(*pool, 2048);
  ASSERT_NO_FATAL_FAILURE(ExpectTakesWhileStoppedAt(
      *pool, Point::kTrimHolding, [&] { pool->Trim(0); }, 1500,
      [&] {
        // Acquire() does not sleep for it either.
        EXPECT_TRUE(ReturnsWhileStopped([&] {
          absl::StatusOr<Buffer> b = pool->Acquire(absl::Minutes(1));
          EXPECT_TRUE(b.ok()) << b.status();
        }));
      }));
  ExpectWhole(*pool);
}

TEST_P(ResizeStallTest,
       ATrimmerStoppedBetweenAPopAndItsPublicationHidesOneBatch) {
  auto pool = Make(512, 4096);
  Burst(*pool, 2048);
  ASSERT_NO_FATAL_FAILURE(ExpectTakesWhileStoppedAt(
      *pool, Point::kTrimPopped, [&] { pool->Trim(0); }, 1500));
  ExpectWhole(*pool);
}

TEST_P(ResizeStallTest, ATrimmerStoppedGivingChunksBackLetsOthersGrow) {
  auto pool = Make(512, 4096);
  Burst(*pool, 2048);
  ASSERT_NO_FATAL_FAILURE(ExpectTakesWhileStoppedAt(
      *pool, Point::kTrimDecommitting, [&] { pool->Trim(0); }, 600));
  ExpectWhole(*pool);
}

TEST_P(ResizeStallTest,
       AtTheCeilingAStoppedTrimmerMakesTryAcquireAnswerAtOnce) {
  auto pool = Make(512, 2048);
  std::vector<Buffer> held = Hold(*pool, 2048);
  ASSERT_TRUE(held.back());
  held.resize(100);     // 1948 free, all in whole chunks
  pool->FlushCaches();  // all in the depot, for the trimmer to take
  StoppedResizer trimmer(Point::kTrimDecommitting, [&] { pool->Trim(0); });
  ASSERT_TRUE(trimmer.WaitStopped());
  // Every free slot is in the stopped trimmer's transit: empty, at once.
  EXPECT_TRUE(ReturnsWhileStopped([&] { EXPECT_FALSE(pool->TryAcquire()); }));
  EXPECT_TRUE(ReturnsWhileStopped(
      [&] { EXPECT_FALSE(pool->Acquire(absl::Milliseconds(1)).ok()); }));
  // A sleeper gets the next release, though the trimmer still sleeps.
  EXPECT_TRUE(SleeperGetsTheNextRelease(*pool, held));
  trimmer.Release();
  held.clear();
  ExpectWhole(*pool);
}

TEST_P(ResizeStallTest, AStoppedGrowerLetsOthersGrowPastIt) {
  auto pool = Make(512, 4096);
  std::vector<Buffer> held = Hold(*pool, 512);
  ASSERT_TRUE(held.back());
  Buffer grower_got;
  ASSERT_NO_FATAL_FAILURE(ExpectTakesWhileStoppedAt(
      *pool, Point::kGrowClaimed, [&] { grower_got = pool->TryAcquire(); },
      600));
  EXPECT_TRUE(grower_got);
  grower_got.Reset();
  held.clear();
  ExpectWhole(*pool);
}

TEST_P(ResizeStallTest,
       AGrowerStoppedWithTheLastChunksMakesTryAcquireAnswerAtOnce) {
  auto pool = Make(512, 1024);
  std::vector<Buffer> held = Hold(*pool, 512);
  ASSERT_TRUE(held.back());
  Buffer grower_got;
  StoppedResizer grower(Point::kGrowClaimed,
                        [&] { grower_got = pool->TryAcquire(); });
  ASSERT_TRUE(grower.WaitStopped());
  EXPECT_TRUE(ReturnsWhileStopped([&] { EXPECT_FALSE(pool->TryAcquire()); }));
  EXPECT_TRUE(SleeperGetsTheNextRelease(*pool, held));
  grower.Release();
  EXPECT_TRUE(grower_got);
  grower_got.Reset();
  held.clear();
  ExpectWhole(*pool);
}

// The idle trim, both from TrimIdle() and from an acquire's slow path.
TEST_P(ResizeStallTest, AnIdleTrimStoppedInTrimIdleStallsNoOne) {
  auto pool = Make(512, 4096, absl::Milliseconds(1));
  Burst(*pool, 2048);
  std::this_thread::sleep_for(std::chrono::milliseconds(5));
  ASSERT_NO_FATAL_FAILURE(ExpectTakesWhileStoppedAt(
      *pool, Point::kTrimHolding, [&] { pool->TrimIdle(); }, 1500));
  ExpectWhole(*pool);
}

TEST_P(ResizeStallTest, AnIdleTrimStoppedInAnAcquiresSlowPathStallsNoOne) {
  auto pool = Make(512, 4096, absl::Milliseconds(1));
  Burst(*pool, 2048);
  pool->FlushCaches();  // so that the next acquire takes the slow path
  std::this_thread::sleep_for(std::chrono::milliseconds(5));
  Buffer trimmer_got;
  ASSERT_NO_FATAL_FAILURE(ExpectTakesWhileStoppedAt(
      *pool, Point::kTrimHolding, [&] { trimmer_got = pool->TryAcquire(); },
      1500));
  EXPECT_TRUE(trimmer_got);
  trimmer_got.Reset();
  ExpectWhole(*pool);
}

INSTANTIATE_TEST_SUITE_P(Caches, ResizeStallTest, testing::Bool(),
                         [](const testing::TestParamInfo<bool>& info) {
                           return info.param ? "On" : "Off";
                         });

}  // namespace
}  // namespace bufpool

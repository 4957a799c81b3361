// Many threads hand buffers to each other. Every buffer is stamped over its
// whole length when acquired and checked, by another thread, just before it
// is released: a slot handed out twice, a lost publication, or a stale link
// shows up as a mismatch. Runs in the default build (>= 1M operations per
// thread) and under ThreadSanitizer (fewer operations; zero reports).
#include <atomic>
#include <barrier>
#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <mutex>
#include <random>
#include <thread>
#include <vector>

#include "absl/base/config.h"
#include "bufpool/buffer_pool.h"
#include "gtest/gtest.h"

namespace bufpool {
namespace {

#if defined(ABSL_HAVE_THREAD_SANITIZER) || defined(ABSL_HAVE_ADDRESS_SANITIZER)
constexpr int kOpsPerThread = 100000;
#else
constexpr int kOpsPerThread = 1000000;
#endif
constexpr int kThreads = 8;

struct Parcel {
  Buffer buffer;
  uint64_t stamp;
};

// One inbox per thread; any thread may post, only the owner takes.
struct Inbox {
  std::mutex mu;
  std::vector<Parcel> parcels;
};

void Stamp(const Buffer& b, uint64_t stamp) {
  auto* words = reinterpret_cast<uint64_t*>(b.data());
  for (size_t i = 0; i < b.size() / 8; ++i) words[i] = stamp + i;
}

// Number of words that do not carry the stamp.
size_t Check(const Buffer& b, uint64_t stamp) {
  const auto* words = reinterpret_cast<const uint64_t*>(b.data());
  size_t bad = 0;
  for (size_t i = 0; i < b.size() / 8; ++i) bad += words[i] != stamp + i;
  return bad;
}

struct StressParams {
  size_t cache;
  size_t buffer_size;
};

class StressTest : public testing::TestWithParam<StressParams> {};

TEST_P(StressTest, ThreadsHandBuffersToEachOtherWithoutCorruption) {
  const StressParams params = GetParam();
  auto created = BufferPool::Create({.buffer_size = params.buffer_size,
                                     .buffer_count = 512,
                                     .cache_size = params.cache});
  ASSERT_TRUE(created.ok()) << created.status();
  BufferPool& pool = **created;

  std::vector<Inbox> inboxes(kThreads);
  std::atomic<uint64_t> mismatches{0};
  std::atomic<uint64_t> sent{0};
  std::atomic<uint64_t> checked{0};

  auto worker = [&](int id) {
    std::mt19937_64 rng(1234 + id);  // fixed seed per thread
    std::vector<Parcel> mine;
    Buffer batch[8];
    uint64_t next_stamp = static_cast<uint64_t>(id) << 48;
    auto send = [&](Buffer b) {
      const uint64_t stamp = ++next_stamp * 1000003;
      Stamp(b, stamp);
      sent.fetch_add(1, std::memory_order_relaxed);
      Inbox& to = inboxes[rng() % kThreads];
      std::lock_guard<std::mutex> lock(to.mu);
      to.parcels.push_back({std::move(b), stamp});
    };
    auto receive = [&] {
      {
        std::lock_guard<std::mutex> lock(inboxes[id].mu);
        mine.swap(inboxes[id].parcels);
      }
      std::vector<Buffer> bulk;
      std::vector<std::byte*> raw_bulk;
      for (Parcel& p : mine) {
        mismatches.fetch_add(Check(p.buffer, p.stamp),
                             std::memory_order_relaxed);
        checked.fetch_add(1, std::memory_order_relaxed);
        switch (p.stamp % 4) {
          case 0:
            p.buffer.Reset();  // handle path
            break;
          case 1:
            pool.ReleaseRaw(p.buffer.Detach());  // raw path
            break;
          case 2:
            raw_bulk.push_back(p.buffer.Detach());  // raw bulk path, below
            break;
          default:
            bulk.push_back(std::move(p.buffer));  // bulk path, below
        }
      }
      pool.ReleaseBulk(absl::MakeSpan(bulk));
      pool.ReleaseRawBulk(raw_bulk);
      mine.clear();
    };
    for (int op = 0; op < kOpsPerThread; ++op) {
      switch (rng() % 8) {
        case 0:
        case 1:
        case 2:
          if (Buffer b = pool.TryAcquire()) send(std::move(b));
          break;
        case 3:
          if (std::byte* p = pool.TryAcquireRaw()) send(pool.Adopt(p));
          break;
        case 4: {
          if (op % 2 == 0) {
            const size_t n = pool.TryAcquireBulk(batch);
            for (size_t i = 0; i < n; ++i) send(std::move(batch[i]));
          } else {
            std::byte* raw[8];
            const size_t n = pool.TryAcquireRawBulk(raw);
            for (size_t i = 0; i < n; ++i) send(pool.Adopt(raw[i]));
          }
          break;
        }
        case 5:
          if (op % 64 == 0) {  // now and then, block briefly for a buffer
            auto b = pool.Acquire(absl::Microseconds(200));
            if (b.ok()) send(*std::move(b));
          }
          break;
        default:
          receive();
      }
    }
    receive();
  };

  std::vector<std::thread> threads;
  for (int i = 0; i < kThreads; ++i) threads.emplace_back(worker, i);
  for (auto& t : threads) t.join();
  // Parcels posted after their owner's last receive.
  for (Inbox& inbox : inboxes) {
    for (Parcel& p : inbox.parcels) {
      mismatches.fetch_add(Check(p.buffer, p.stamp));
      checked.fetch_add(1);
    }
    inbox.parcels.clear();
  }

  EXPECT_EQ(mismatches.load(), 0u);
  // Every parcel sent was checked exactly once, and the pool was cycled
  // through more than once (how often depends on scheduling, not asserted).
  EXPECT_EQ(checked.load(), sent.load());
  EXPECT_GT(sent.load(), 512u);
  EXPECT_EQ(pool.Stats().in_use, 0u);
  EXPECT_LE(pool.Stats().high_water, pool.capacity());
  // Nothing is lost in the per-CPU caches the threads released into: one
  // thread gets all 512 (an acquire takes from other CPUs' caches before it
  // reports the pool empty).
  std::vector<Buffer> all(512);
  EXPECT_EQ(pool.TryAcquireBulk(absl::MakeSpan(all)), 512u);
  std::vector<bool> seen(512);
  for (const Buffer& b : all) {
    ASSERT_FALSE(seen[b.slot()]) << "slot " << b.slot() << " handed out twice";
    seen[b.slot()] = true;
  }
}

INSTANTIATE_TEST_SUITE_P(Pools, StressTest,
                         testing::Values(StressParams{64, 256},
                                         StressParams{0, 256},
                                         StressParams{8, 4096}),
                         [](const testing::TestParamInfo<StressParams>& info) {
                           return "Cache" + std::to_string(info.param.cache) +
                                  "Size" +
                                  std::to_string(info.param.buffer_size);
                         });

// Threads that take and release buffers (into the cache of the CPU they run
// on) and then nap (blocked) for longer than the waiters' timeouts, beside
// waiters that keep acquiring with short timeouts. The waiters hold at most
// 162 of 256 buffers, and the buffers the nappers released may sit in the
// per-CPU caches, so the waiters need buffers from caches that a napper
// filled.
// The nappers hold buffers only for a moment, without blocking, far shorter
// than a timeout: no Acquire() may time out, and nothing may be lost.
TEST(StressTest, NappingThreadsAndShortTimeoutWaitersLoseNothing) {
  auto created = BufferPool::Create(
      {.buffer_size = 256, .buffer_count = 256, .cache_size = 16});
  ASSERT_TRUE(created.ok()) << created.status();
  BufferPool& pool = **created;
#if defined(ABSL_HAVE_THREAD_SANITIZER) || defined(ABSL_HAVE_ADDRESS_SANITIZER)
  const absl::Duration timeout = absl::Seconds(2);
  constexpr int kRounds = 40;
#else
  const absl::Duration timeout = absl::Milliseconds(500);
  constexpr int kRounds = 150;
#endif
  // Nappers sleep on this (blocked in a futex) and wake at once at the end.
  std::mutex nap_mu;
  std::condition_variable nap_cv;
  constexpr int kNappers = 6, kWaiters = 3, kHold = 54;
  std::atomic<bool> stop{false};
  std::atomic<uint64_t> timeouts{0}, mismatches{0}, acquired{0};
  std::atomic<int> cached{0};  // nappers that filled their cache once

  std::vector<std::thread> threads;
  for (int n = 0; n < kNappers; ++n) {
    threads.emplace_back([&, n] {
      std::mt19937 rng(99 + n);
      uint64_t stamp = uint64_t{1} << 40 | static_cast<uint64_t>(n) << 32;
      while (!stop.load()) {
        {
          std::vector<std::pair<Buffer, uint64_t>> mine;
          for (int i = 0; i < 16; ++i) {
            Buffer b = pool.TryAcquire();
            if (!b) break;
            Stamp(b, ++stamp);
            mine.emplace_back(std::move(b), stamp);
          }
          for (auto& [b, st] : mine) mismatches.fetch_add(Check(b, st));
        }  // released into the cache of the CPU it runs on
        cached.fetch_add(1);
        std::unique_lock<std::mutex> lock(nap_mu);  // blocked, 4 timeouts
        nap_cv.wait_for(lock,
                        std::chrono::milliseconds(
                            4 * (timeout / absl::Milliseconds(1)) + rng() % 40),
                        [&] { return stop.load(); });
      }
    });
  }
  while (cached.load() < kNappers) std::this_thread::yield();
  // Each round, every waiter holds its full share before any lets go.
  std::barrier all_holding(kWaiters);
  for (int w = 0; w < kWaiters; ++w) {
    threads.emplace_back([&, w] {
      uint64_t stamp = uint64_t{2} << 40 | static_cast<uint64_t>(w) << 32;
      for (int round = 0; round < kRounds; ++round) {
        std::vector<std::pair<Buffer, uint64_t>> held;
        while (held.size() < kHold) {
          auto b = pool.Acquire(timeout);
          if (!b.ok()) {
            timeouts.fetch_add(1);
            continue;
          }
          Stamp(*b, ++stamp);
          held.emplace_back(*std::move(b), stamp);
          acquired.fetch_add(1);
        }
        for (auto& [b, st] : held) mismatches.fetch_add(Check(b, st));
        all_holding.arrive_and_wait();
      }
    });
  }
  for (int w = 0; w < kWaiters; ++w) threads[kNappers + w].join();
  {
    std::lock_guard<std::mutex> lock(nap_mu);
    stop.store(true);
    nap_cv.notify_all();
  }
  for (int n = 0; n < kNappers; ++n) threads[n].join();

  EXPECT_EQ(timeouts.load(), 0u);
  EXPECT_EQ(pool.Stats().acquire_timeouts, 0u);
  EXPECT_EQ(mismatches.load(), 0u);
  EXPECT_EQ(acquired.load(), uint64_t{kWaiters} * kRounds * kHold);
  EXPECT_EQ(pool.Stats().in_use, 0u);
  std::vector<Buffer> all(256);
  EXPECT_EQ(pool.TryAcquireBulk(absl::MakeSpan(all)), 256u);
}

}  // namespace
}  // namespace bufpool

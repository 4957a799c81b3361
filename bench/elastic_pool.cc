// The elastic pool's goals, one fresh process per measurement so
// that resident memory starts from an empty process each time:
//
//   elastic_pool create   RSS after Create() with buffer_count 512 and a
//                         ceiling of 262,144 x 4 KiB (1 GiB), above the same
//                         process before it
//   elastic_pool burst    a burst to 200,000 buffers in use (TryAcquire one
//                         by one), their release, then FlushCaches() and
//                         Trim(): RSS above the
//                         empty process after the trim, and how long it took;
//                         the burst's time against the same acquisitions
//                         from a fixed pool of 262,144 (its Create(), which
//                         pre-faults the 1 GiB, timed apart), and the time
//                         of each acquire that grew the pool (one step is
//                         512 buffers)
//   elastic_pool growth   growth at the cost of the memory: a burst to
//                         200,000 buffers on a fresh elastic pool (512,
//                         ceiling 262,144) against its floor, the same
//                         bytes committed by hand (mmap, MADV_HUGEPAGE,
//                         MADV_POPULATE_WRITE in 2 MiB steps) plus the same
//                         burst from a fixed pool already committed; and
//                         one growth step of 2 MiB (Grow(512)) against a
//                         plain populate of 2 MiB in the same kind of
//                         mapping, interleaved, medians of 64 each. The
//                         burst's rounds alternate which runs first; wall
//                         and thread CPU time, medians of the ratios
//   elastic_pool stall    a stopped trimmer or grower: one thread grows and
//                         trims in a loop (Grow(4096), Trim(0)) while a
//                         SIGUSR1 every 250 ms puts it to sleep for 200 ms
//                         in its handler, wherever it is; another thread
//                         takes and releases 64 buffers at a time for 3 s.
//                         The worst TryAcquire() and how many took over
//                         10 ms, beside the same run without the sleeps
//                         (set BUFPOOL_RSEQ_INDEX / GLIBC_TUNABLES for the
//                         other per-CPU modes)
//   elastic_pool idle     the same burst with trim_after_idle 200 ms and a
//                         10 ms caller's tick (TrimIdle()): how long after the
//                         release until RSS is back
//
// Prints one JSON line. tools/bench runs each once per round and
// tools/bench_report.py turns them into goal rows.
#include <pthread.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "bufpool/buffer_pool.h"

namespace {

using Clock = std::chrono::steady_clock;

constexpr size_t kStart = 512;
constexpr size_t kCeiling = 262144;
constexpr size_t kBurst = 200000;
constexpr size_t kStep = 512;

[[noreturn]] void Die(const std::string& what) {
  std::fprintf(stderr, "elastic_pool: %s\n", what.c_str());
  std::exit(1);
}

// Resident bytes of this process (/proc/self/statm, field 2).
size_t Rss() {
  std::FILE* f = std::fopen("/proc/self/statm", "r");
  if (f == nullptr) Die("cannot open /proc/self/statm");
  unsigned long size = 0, resident = 0;
  if (std::fscanf(f, "%lu %lu", &size, &resident) != 2) Die("statm");
  std::fclose(f);
  return resident * static_cast<size_t>(::sysconf(_SC_PAGESIZE));
}

double Ms(Clock::duration d) {
  return std::chrono::duration<double, std::milli>(d).count();
}

double MiB(double bytes) { return bytes / (1024.0 * 1024.0); }

std::unique_ptr<bufpool::BufferPool> MakeElastic(absl::Duration idle) {
  auto pool = bufpool::BufferPool::Create({.buffer_size = 4096,
                                           .buffer_count = kStart,
                                           .max_buffer_count = kCeiling,
                                           .grow_step = kStep,
                                           .trim_after_idle = idle});
  if (!pool.ok()) Die(std::string(pool.status().message()));
  return *std::move(pool);
}

// Acquires kBurst buffers one by one, touching each (a write, as a user
// would); the time of each acquire that grew the pool goes to `steps`.
double Burst(bufpool::BufferPool& pool, std::vector<bufpool::Buffer>& held,
             std::vector<double>* steps) {
  held.clear();
  held.reserve(kBurst);
  uint64_t grows = pool.Stats().grows;
  const Clock::time_point t0 = Clock::now();
  for (size_t i = 0; i < kBurst; ++i) {
    const Clock::time_point a = Clock::now();
    bufpool::Buffer b = pool.TryAcquire();
    if (!b) Die("the burst ran dry");
    b.data()[0] = std::byte{1};
    held.push_back(std::move(b));
    if (steps != nullptr) {
      const uint64_t now = pool.Stats().grows;
      if (now != grows) {
        steps->push_back(Ms(Clock::now() - a));
        grows = now;
      }
    }
  }
  return Ms(Clock::now() - t0);
}

// The burst's acquisitions without the Stats() probe, for the time ratio.
double PlainBurst(bufpool::BufferPool& pool,
                  std::vector<bufpool::Buffer>& held) {
  held.clear();
  held.reserve(kBurst);
  const Clock::time_point t0 = Clock::now();
  for (size_t i = 0; i < kBurst; ++i) {
    bufpool::Buffer b = pool.TryAcquire();
    if (!b) Die("the burst ran dry");
    b.data()[0] = std::byte{1};
    held.push_back(std::move(b));
  }
  return Ms(Clock::now() - t0);
}

double Percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t i = std::min(v.size() - 1, static_cast<size_t>(p * v.size()));
  return v[i];
}

int Create() {
  const size_t before = Rss();
  auto pool = MakeElastic(absl::ZeroDuration());
  const size_t after = Rss();
  std::printf(
      "{\"contender\": \"elastic_create\", \"rss_above_empty_mib\": %.3f, "
      "\"committed\": %zu, \"region_mib\": %.1f}\n",
      MiB(static_cast<double>(after) - static_cast<double>(before)),
      pool->Stats().committed, MiB(pool->region().size()));
  return 0;
}

int BurstAndTrim() {
  std::vector<bufpool::Buffer> held;
  held.reserve(kBurst);  // the vector's own pages, before the baseline
  std::memset(static_cast<void*>(held.data()), 0,
              kBurst * sizeof(bufpool::Buffer));
  const size_t empty = Rss();
  auto pool = MakeElastic(absl::ZeroDuration());
  // The time of each acquire that grew the pool (one step each).
  std::vector<double> steps;
  const double burst_ms = Burst(*pool, held, &steps);
  const size_t peak = Rss();
  held.clear();
  // Trim() gives back what is free in the shared store; FlushCaches()
  // first puts the caches' buffers there too (at most 64 x CPUs here, but
  // each may hold a 2 MiB huge page).
  const Clock::time_point t0 = Clock::now();
  pool->FlushCaches();
  const size_t trimmed = pool->Trim(0);
  const double trim_ms = Ms(Clock::now() - t0);
  const size_t after = Rss();
  const bufpool::PoolStats st = pool->Stats();
  // The elastic burst again, without the per-acquire probe (from the
  // trimmed pool: it grows again), and the fixed pool of the ceiling.
  const double elastic_plain_ms = PlainBurst(*pool, held);
  held.clear();
  pool.reset();
  const Clock::time_point c0 = Clock::now();
  auto fixed = bufpool::BufferPool::Create(
      {.buffer_size = 4096, .buffer_count = kCeiling});
  if (!fixed.ok()) Die(std::string(fixed.status().message()));
  const double fixed_create_ms = Ms(Clock::now() - c0);  // pre-faults 1 GiB
  const double fixed_ms = PlainBurst(**fixed, held);
  held.clear();
  std::printf(
      "{\"contender\": \"elastic_burst\", \"burst_ms\": %.3f, "
      "\"peak_rss_above_empty_mib\": %.1f, \"trim_ms\": %.3f, "
      "\"trimmed_mib\": %.1f, \"rss_after_trim_above_empty_mib\": %.3f, "
      "\"in_use_after\": %zu, \"committed_after\": %zu, \"grows\": %llu, "
      "\"grow_step_p50_ms\": %.4f, \"grow_step_p99_ms\": %.4f, "
      "\"grow_step_max_ms\": %.4f, \"elastic_burst_ms\": %.3f, "
      "\"fixed_burst_ms\": %.3f, \"fixed_create_ms\": %.3f}\n",
      burst_ms, MiB(static_cast<double>(peak) - static_cast<double>(empty)),
      trim_ms, MiB(static_cast<double>(trimmed)),
      MiB(static_cast<double>(after) - static_cast<double>(empty)), st.in_use,
      st.committed, static_cast<unsigned long long>(st.grows),
      Percentile(steps, 0.5), Percentile(steps, 0.99), Percentile(steps, 1.0),
      elastic_plain_ms, fixed_ms, fixed_create_ms);
  return 0;
}

int Idle() {
  std::vector<bufpool::Buffer> held;
  held.reserve(kBurst);
  std::memset(static_cast<void*>(held.data()), 0,
              kBurst * sizeof(bufpool::Buffer));
  const size_t empty = Rss();
  constexpr auto kIdle = absl::Milliseconds(200);
  auto pool = MakeElastic(kIdle);
  PlainBurst(*pool, held);
  held.clear();
  // The caller's tick, every 10 ms, until RSS is back within 4 MiB of the
  // empty process (or 5 s).
  const Clock::time_point t0 = Clock::now();
  size_t rss = Rss();
  while (static_cast<double>(rss) - static_cast<double>(empty) >
             4.0 * 1024 * 1024 &&
         Clock::now() - t0 < std::chrono::seconds(5)) {
    ::usleep(10000);
    pool->TrimIdle();
    rss = Rss();
  }
  std::printf(
      "{\"contender\": \"elastic_idle\", \"trim_after_idle_ms\": 200, "
      "\"tick_ms\": 10, \"back_after_ms\": %.1f, "
      "\"rss_above_empty_mib\": %.3f, \"trims\": %llu}\n",
      Ms(Clock::now() - t0),
      MiB(static_cast<double>(rss) - static_cast<double>(empty)),
      static_cast<unsigned long long>(pool->Stats().trims));
  return 0;
}

// Grow(512) from the reserve 256 times, each timed alone: a growth step
// without the acquire around it. `hp`: the pool's huge-page mode.
int Steps(bufpool::HugePages hp, const char* name) {
  auto pool = bufpool::BufferPool::Create({.buffer_size = 4096,
                                           .buffer_count = kStart,
                                           .huge_pages = hp,
                                           .max_buffer_count = kCeiling,
                                           .grow_step = kStep});
  if (!pool.ok()) Die(std::string(pool.status().message()));
  std::vector<double> steps;
  for (int i = 0; i < 256; ++i) {
    const Clock::time_point t0 = Clock::now();
    if (absl::Status s = (*pool)->Grow(kStep); !s.ok()) {
      Die(std::string(s.message()));
    }
    steps.push_back(Ms(Clock::now() - t0));
  }
  std::printf(
      "{\"contender\": \"elastic_steps_%s\", \"step_p50_ms\": %.4f, "
      "\"step_p99_ms\": %.4f, \"step_max_ms\": %.4f}\n",
      name, Percentile(steps, 0.5), Percentile(steps, 0.99),
      Percentile(steps, 1.0));
  return 0;
}

// The floor of growing to `bytes`: an anonymous mapping reserved like the
// pool's (MAP_NORESERVE, 2 MiB aligned, MADV_HUGEPAGE) and populated by
// hand in 2 MiB steps. Unmapped before it returns; the time of the
// populates alone.
double CommitByHand(size_t bytes, std::vector<double>* steps = nullptr) {
  constexpr size_t kHuge = size_t{2} << 20;
  const size_t len = (bytes + kHuge - 1) / kHuge * kHuge;
  void* raw = ::mmap(nullptr, len + kHuge, PROT_READ | PROT_WRITE,
                     MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (raw == MAP_FAILED) Die("mmap");
  auto* base = reinterpret_cast<std::byte*>(
      (reinterpret_cast<uintptr_t>(raw) + kHuge - 1) / kHuge * kHuge);
  (void)::madvise(base, len, MADV_HUGEPAGE);
  const Clock::time_point t0 = Clock::now();
  for (size_t off = 0; off < len; off += kHuge) {
    const Clock::time_point a = Clock::now();
    if (::madvise(base + off, kHuge, MADV_POPULATE_WRITE) != 0) {
      Die("madvise(MADV_POPULATE_WRITE)");
    }
    if (steps != nullptr) steps->push_back(Ms(Clock::now() - a));
  }
  const double ms = Ms(Clock::now() - t0);
  ::munmap(raw, len + kHuge);
  return ms;
}

// CPU time of this thread, ms: the cost, whatever else the machine runs.
double ThreadCpuMs() {
  timespec ts{};
  ::clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) * 1e3 +
         static_cast<double>(ts.tv_nsec) / 1e6;
}

struct Cost {
  double wall_ms = 0;
  double cpu_ms = 0;
};

// The burst on a fresh elastic pool.
Cost ElasticBurst(std::vector<bufpool::Buffer>& held, uint64_t* grows) {
  auto pool = MakeElastic(absl::ZeroDuration());
  const double c0 = ThreadCpuMs();
  const double wall = PlainBurst(*pool, held);
  const Cost cost{wall, ThreadCpuMs() - c0};
  *grows = pool->Stats().grows;
  held.clear();
  return cost;
}

// Its floor: the bytes it grew, committed by hand, and the burst from a
// fixed pool whose memory is committed already.
Cost Floor(std::vector<bufpool::Buffer>& held) {
  const double c0 = ThreadCpuMs();
  const double hand_ms = CommitByHand((kBurst - kStart) * 4096);
  const double hand_cpu = ThreadCpuMs() - c0;
  auto fixed = bufpool::BufferPool::Create(
      {.buffer_size = 4096, .buffer_count = kCeiling});
  if (!fixed.ok()) Die(std::string(fixed.status().message()));
  const double c1 = ThreadCpuMs();
  const double fixed_ms = PlainBurst(**fixed, held);
  const Cost cost{hand_ms + fixed_ms, hand_cpu + ThreadCpuMs() - c1};
  held.clear();
  return cost;
}

double Median(std::vector<double> v) { return Percentile(std::move(v), 0.5); }

int Growth() {
  std::vector<bufpool::Buffer> held;
  held.reserve(kBurst);
  std::memset(static_cast<void*>(held.data()), 0,
              kBurst * sizeof(bufpool::Buffer));
  // Rounds that alternate which goes first: the second finds the huge
  // pages the first gave back.
  std::vector<double> e_wall, e_cpu, f_wall, f_cpu, ratio_wall, ratio_cpu;
  uint64_t grows = 0;
  for (int r = 0; r < 4; ++r) {
    Cost e, f;
    if (r % 2 == 0) {
      e = ElasticBurst(held, &grows);
      f = Floor(held);
    } else {
      f = Floor(held);
      e = ElasticBurst(held, &grows);
    }
    e_wall.push_back(e.wall_ms);
    e_cpu.push_back(e.cpu_ms);
    f_wall.push_back(f.wall_ms);
    f_cpu.push_back(f.cpu_ms);
    ratio_wall.push_back(e.wall_ms / f.wall_ms);
    ratio_cpu.push_back(e.cpu_ms / f.cpu_ms);
  }
  // One step against one populate, interleaved: Grow(512) of 4 KiB
  // buffers is one 2 MiB huge page.
  auto steps_pool = MakeElastic(absl::ZeroDuration());
  std::vector<double> grow, populate;
  for (int i = 0; i < 64; ++i) {
    const Clock::time_point t0 = Clock::now();
    if (absl::Status st = steps_pool->Grow(kStep); !st.ok()) {
      Die(std::string(st.message()));
    }
    grow.push_back(Ms(Clock::now() - t0));
    std::vector<double> one;
    CommitByHand(size_t{2} << 20, &one);
    populate.push_back(one[0]);
  }
  const double grow_p50 = Percentile(grow, 0.5);
  const double populate_p50 = Percentile(populate, 0.5);
  std::printf(
      "{\"contender\": \"elastic_growth\", \"rounds\": 4, "
      "\"elastic_burst_ms\": %.3f, \"elastic_burst_cpu_ms\": %.3f, "
      "\"grows\": %llu, \"floor_ms\": %.3f, \"floor_cpu_ms\": %.3f, "
      "\"burst_vs_floor\": %.3f, \"burst_vs_floor_cpu\": %.3f, "
      "\"grow_step_p50_ms\": %.4f, \"populate_2mib_p50_ms\": %.4f, "
      "\"step_vs_populate\": %.3f}\n",
      Median(e_wall), Median(e_cpu), static_cast<unsigned long long>(grows),
      Median(f_wall), Median(f_cpu), Median(ratio_wall), Median(ratio_cpu),
      grow_p50, populate_p50, grow_p50 / populate_p50);
  return 0;
}

std::atomic<bool> g_sleepy{false};

void SleepInHandler(int) {
  if (!g_sleepy.load(std::memory_order_relaxed)) return;
  const timespec ts{0, 200'000'000};
  ::nanosleep(&ts, nullptr);
}

struct StallResult {
  double worst_ms = 0;
  uint64_t over_10ms = 0;
  uint64_t acquires = 0;
  uint64_t trims = 0;
};

StallResult StallRun(bool sleepy) {
  auto created = bufpool::BufferPool::Create({.buffer_size = 4096,
                                              .buffer_count = kStart,
                                              .max_buffer_count = 65536,
                                              .grow_step = kStep});
  if (!created.ok()) Die(std::string(created.status().message()));
  bufpool::BufferPool& pool = **created;
  g_sleepy.store(sleepy);
  std::atomic<bool> done{false};
  std::thread resizer([&] {
    while (!done.load(std::memory_order_relaxed)) {
      (void)pool.Grow(4096);
      pool.Trim(0);
    }
  });
  const pthread_t target = resizer.native_handle();
  std::thread signaller([&] {
    while (!done.load(std::memory_order_relaxed)) {
      ::usleep(250000);
      ::pthread_kill(target, SIGUSR1);
    }
  });
  StallResult r;
  std::vector<bufpool::Buffer> held(64);
  const Clock::time_point end = Clock::now() + std::chrono::seconds(3);
  while (Clock::now() < end) {
    for (bufpool::Buffer& b : held) {
      const Clock::time_point a = Clock::now();
      b = pool.TryAcquire();
      const double ms = Ms(Clock::now() - a);
      if (!b) Die("the stall run ran dry");
      r.worst_ms = std::max(r.worst_ms, ms);
      r.over_10ms += ms > 10 ? 1 : 0;
      ++r.acquires;
    }
    for (bufpool::Buffer& b : held) b.Reset();
  }
  done.store(true);
  signaller.join();
  resizer.join();
  r.trims = pool.Stats().trims;
  return r;
}

int Stall() {
  struct sigaction sa = {};
  sa.sa_handler = SleepInHandler;
  sigemptyset(&sa.sa_mask);
  if (::sigaction(SIGUSR1, &sa, nullptr) != 0) Die("sigaction");
  const StallResult quiet = StallRun(false);
  const StallResult sleepy = StallRun(true);
  const char* index = std::getenv("BUFPOOL_RSEQ_INDEX");
  const char* tunables = std::getenv("GLIBC_TUNABLES");
  const char* mode =
      tunables != nullptr && std::strstr(tunables, "rseq=0") != nullptr
          ? "locked"
      : index != nullptr ? index
                         : "default";
  std::printf(
      "{\"contender\": \"elastic_stall_%s\", \"worst_ms\": %.3f, "
      "\"over_10ms\": %llu, \"acquires\": %llu, \"trims\": %llu, "
      "\"quiet_worst_ms\": %.3f, \"quiet_over_10ms\": %llu}\n",
      mode, sleepy.worst_ms, static_cast<unsigned long long>(sleepy.over_10ms),
      static_cast<unsigned long long>(sleepy.acquires),
      static_cast<unsigned long long>(sleepy.trims), quiet.worst_ms,
      static_cast<unsigned long long>(quiet.over_10ms));
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string what = argc > 1 ? argv[1] : "";
  if (what == "create") return Create();
  if (what == "burst") return BurstAndTrim();
  if (what == "idle") return Idle();
  if (what == "growth") return Growth();
  if (what == "stall") return Stall();
  if (what == "steps") return Steps(bufpool::HugePages::kTry, "thp");
  if (what == "steps_small") {
    return Steps(bufpool::HugePages::kNever, "small_pages");
  }
  std::fprintf(
      stderr,
      "usage: elastic_pool create|burst|growth|stall|idle|steps|steps_small\n");
  return 2;
}

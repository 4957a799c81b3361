// Holder tracking: who holds a pool's buffers (bufpool/holders.h).
#include <liburing.h>
#include <pthread.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <map>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "bufpool/budget.h"
#include "bufpool/buffer_pool.h"
#include "bufpool/chain.h"
#include "bufpool/testing.h"
#include "bufpool/uring.h"
#include "gtest/gtest-spi.h"
#include "gtest/gtest.h"
#include "pool/stack_symbolizer.h"
#include "run_tool.h"
#include "test_util.h"

namespace bufpool {

// holders_frameless.cc, compiled without frame pointers: a thread's start
// routine that acquires into a FramelessArgs's `kept`.
struct FramelessArgs {
  BufferPool* pool;
  std::vector<Buffer>* kept;
};
extern "C" void* BufpoolTestAcquireWithoutFramePointer(void* arg);

namespace {

std::unique_ptr<BufferPool> MakePool(TrackHolders track, size_t count = 64,
                                     uint32_t every = 128) {
  auto pool = BufferPool::Create({.buffer_size = 4096,
                                  .buffer_count = count,
                                  .track_holders = track,
                                  .holder_sample_every = every});
  EXPECT_TRUE(pool.ok()) << pool.status();
  return std::move(*pool);
}

// Keeps one buffer acquired here in `kept`: the "leak", acquired on the
// line kPlantLeakLine.
constexpr int kPlantLeakLine = __LINE__ + 3;
__attribute__((noinline)) void PlantLeak(BufferPool& pool,
                                         std::vector<Buffer>& kept) {
  kept.push_back(pool.TryAcquire());
  ASSERT_TRUE(kept.back());
}

// Another site, so that a report has two groups.
__attribute__((noinline)) void PlantOtherLeak(BufferPool& pool,
                                              std::vector<Buffer>& kept) {
  kept.push_back(pool.TryAcquire());
}

bool StackNames(const Holder& h, const std::string& function) {
  for (const std::string& frame : h.stack) {
    if (absl::StrContains(frame, function)) return true;
  }
  return false;
}

TEST(HoldersTest, LeakIsReportedWithThePlantingFunctionInItsStack) {
  auto pool = MakePool(TrackHolders::kAll);
  std::vector<Buffer> kept;
  PlantLeak(*pool, kept);
  PlantLeak(*pool, kept);
  PlantOtherLeak(*pool, kept);
  const std::vector<Holder> holders = pool->Holders();
  ASSERT_EQ(holders.size(), 3u);
  for (const Holder& h : holders) {
    EXPECT_EQ(h.held_by, "Buffer");
    EXPECT_GT(h.thread, 0);
    EXPECT_GE(h.age, absl::ZeroDuration());
    ASSERT_FALSE(h.stack.empty());
  }
  // The pool's own frames are left out: the first frame is the site.
  EXPECT_TRUE(absl::StrContains(holders[0].stack[0], "PlantLeak"))
      << absl::StrJoin(holders[0].stack, "\n");
  EXPECT_TRUE(StackNames(holders[2], "PlantOtherLeak"));
  const std::string report = pool->HoldersReport();
  // Largest group first: the two from PlantLeak, then PlantOtherLeak.
  const size_t first = report.find("PlantLeak");
  const size_t second = report.find("PlantOtherLeak");
  ASSERT_NE(first, std::string::npos) << report;
  ASSERT_NE(second, std::string::npos) << report;
  EXPECT_LT(first, second) << report;
  EXPECT_TRUE(absl::StrContains(report, "2 buffer(s) held by 2 Buffer"))
      << report;
  kept.clear();
  EXPECT_TRUE(pool->Holders().empty());
  EXPECT_TRUE(testing::NoHolders(*pool));
}

// The path of `tool` on PATH, or empty.
std::string OnPath(const std::string& tool) {
  const char* path = getenv("PATH");
  for (absl::string_view dir : absl::StrSplit(path ? path : "", ':')) {
    const std::string candidate = absl::StrCat(dir, "/", tool);
    if (access(candidate.c_str(), X_OK) == 0) return candidate;
  }
  return "";
}

// A frame's trailing "module+0xoffset": false if it has none.
bool ModuleAndOffset(const std::string& frame, std::string* module,
                     std::string* offset) {
  const size_t space = frame.rfind(' ');
  const size_t plus = frame.rfind("+0x");
  if (space == std::string::npos || plus == std::string::npos || plus < space) {
    return false;
  }
  *module = frame.substr(space + 1, plus - space - 1);
  *offset = frame.substr(plus + 1);
  uint64_t value;
  return absl::SimpleHexAtoi(*offset, &value);
}

TEST(HoldersTest, FramesGiveFileLineAndAModuleOffsetThatAddr2lineResolves) {
  auto pool = MakePool(TrackHolders::kAll);
  std::vector<Buffer> kept;
  PlantLeak(*pool, kept);
  const std::vector<Holder> holders = pool->Holders();
  ASSERT_EQ(holders.size(), 1u);
  ASSERT_FALSE(holders[0].stack.empty());
  const std::string& site = holders[0].stack[0];
  // Always: where the call is in which ELF file.
  std::string module, offset;
  ASSERT_TRUE(ModuleAndOffset(site, &module, &offset)) << site;
  EXPECT_TRUE(absl::EndsWith(module, "/holders_test")) << site;
  EXPECT_EQ(access(module.c_str(), R_OK), 0) << module;
  if (!StackSymbolizer::HaveLineInformation()) {
    GTEST_SKIP() << "no libdw.so.1 here: frames have no file:line";
  }
  // The caller's line, not the pool's inline code's.
  const std::string line = absl::StrCat("holders_test.cc:", kPlantLeakLine);
  EXPECT_TRUE(absl::StrContains(site, "PlantLeak")) << site;
  EXPECT_TRUE(absl::StrContains(site, absl::StrCat(line, ")"))) << site;
  const std::string report = pool->HoldersReport();
  EXPECT_TRUE(absl::StrContains(report, absl::StrCat("#0 ", site, "\n")))
      << report;
  // addr2line, given the module and offset alone, names the same line (it
  // lists the pool's inlined code first: -i gives every inlined frame).
  const std::string addr2line = OnPath("addr2line");
  if (addr2line.empty()) GTEST_SKIP() << "no addr2line on PATH";
  char dir[] = "/tmp/holders_addr2line_XXXXXX";
  ASSERT_NE(mkdtemp(dir), nullptr);
  const bufpool_test::Result r =
      bufpool_test::RunTool(addr2line, {"-i", "-e", module, offset}, dir);
  unlink(absl::StrCat(dir, "/.stdout").c_str());
  unlink(absl::StrCat(dir, "/.stderr").c_str());
  rmdir(dir);
  EXPECT_EQ(r.status, 0) << r.err;
  EXPECT_TRUE(absl::StrContains(r.out, line)) << r.out;
  kept.clear();
}

TEST(HoldersTest, AOneFrameStackSaysWhatTheFramePointersAreFor) {
#if !defined(__x86_64__)
  GTEST_SKIP() << "holders_frameless.cc clears the frame pointer on x86-64";
#endif
  auto pool = MakePool(TrackHolders::kAll);
  std::vector<Buffer> kept;
  FramelessArgs args{pool.get(), &kept};
  pthread_t thread;
  // The thread starts with no frame pointer (clone leaves it 0), so the
  // stack the pool records ends at the routine's frame.
  ASSERT_EQ(pthread_create(&thread, nullptr,
                           BufpoolTestAcquireWithoutFramePointer, &args),
            0);
  ASSERT_EQ(pthread_join(thread, nullptr), 0);
  const std::string report = pool->HoldersReport();
  EXPECT_TRUE(absl::StrContains(report, "#0 ")) << report;
  EXPECT_TRUE(absl::StrContains(report, "AcquireWithoutFramePointer"))
      << report;
  EXPECT_FALSE(absl::StrContains(report, "#1 ")) << report;
  EXPECT_TRUE(absl::StrContains(
      report, "compile it with -fno-omit-frame-pointer to see its callers"))
      << report;
  // With frame pointers, no such line.
  kept.clear();
  PlantLeak(*pool, kept);
  EXPECT_FALSE(absl::StrContains(pool->HoldersReport(), "frame pointer"))
      << pool->HoldersReport();
  kept.clear();
}

// A chain's fresh buffer is acquired inside BufferChain (AppendSlow,
// AcquireFresh): the report starts at the chain's caller.
__attribute__((noinline)) void AppendToChain(BufferChain& chain,
                                             const std::string& bytes) {
  ASSERT_TRUE(chain.Append(bytes).ok());
}

TEST(HoldersTest, AChainsFreshBuffersAreReportedFromTheChainsCaller) {
  auto pool = MakePool(TrackHolders::kAll, 16);
  {
    BufferChain chain(*pool);
    AppendToChain(chain, std::string(3 * pool->buffer_size(), 'x'));
    const std::vector<Holder> holders = pool->Holders();
    ASSERT_EQ(holders.size(), 3u);
    for (const Holder& h : holders) {
      EXPECT_EQ(h.held_by, "chain");
      ASSERT_FALSE(h.stack.empty());
      EXPECT_TRUE(absl::StrContains(h.stack[0], "AppendToChain"))
          << absl::StrJoin(h.stack, "\n");
    }
    const std::string report = pool->HoldersReport();
    EXPECT_FALSE(absl::StrContains(report, "BufferChain::")) << report;
    EXPECT_FALSE(absl::StrContains(report, "BufferPool::")) << report;
  }
  EXPECT_TRUE(testing::NoHolders(*pool));
}

// Sampled, buffers out that were not sampled are counted by kind, with the
// switch that records them all.
TEST(HoldersTest, SampledReportCountsTheUnsampledByKindAndGivesTheSwitch) {
  auto pool = MakePool(TrackHolders::kSampled, 64, /*every=*/128);
  std::vector<Buffer> kept;
  std::vector<std::byte*> raw;
  // A fresh thread's first acquire is the one sampled; the next 127 are not.
  std::thread([&] {
    pool->TryAcquire().Reset();
    for (int i = 0; i < 3; ++i) raw.push_back(pool->TryAcquireRaw());
    for (int i = 0; i < 2; ++i) kept.push_back(pool->TryAcquire());
  }).join();
  EXPECT_TRUE(pool->Holders().empty());
  EXPECT_EQ(pool->HoldersReport(),
            "bufpool: 5 of 64 buffer(s) out (tracking 1 in 128: 0 sampled; "
            "run with BUFPOOL_TRACK_HOLDERS=all to see where each was "
            "acquired):\n"
            "  not sampled: 5 (3 as raw pointers, 2 held by Buffer handles, "
            "chains or sends in flight); BUFPOOL_TRACK_HOLDERS=all records "
            "every acquire\n");
  for (std::byte* p : raw) pool->ReleaseRaw(p);
  kept.clear();
}

TEST(HoldersTest, SampledRecordsOneInNAndNamesThePlantingFunction) {
  auto pool = MakePool(TrackHolders::kSampled, 64, /*every=*/8);
  EXPECT_EQ(pool->track_holders(), TrackHolders::kSampled);
  std::vector<Buffer> kept;
  // 16 consecutive acquires on one thread: exactly 2 are the 1 in 8,
  // whatever the thread's countdown was.
  for (int i = 0; i < 16; ++i) PlantLeak(*pool, kept);
  const std::vector<Holder> holders = pool->Holders();
  ASSERT_EQ(holders.size(), 2u);
  for (const Holder& h : holders) {
    EXPECT_TRUE(StackNames(h, "PlantLeak")) << absl::StrJoin(h.stack, "\n");
  }
  const std::string report = pool->HoldersReport();
  EXPECT_TRUE(absl::StrContains(report, "16 of 64 buffer(s) out")) << report;
  EXPECT_TRUE(absl::StrContains(report, "tracking 1 in 8: 2 sampled"))
      << report;
  EXPECT_TRUE(absl::StrContains(report, "PlantLeak")) << report;
  kept.clear();
  EXPECT_TRUE(pool->Holders().empty());
}

TEST(HoldersTest, OffRecordsNothingAndTheReportSaysHowToTurnItOn) {
  auto pool = MakePool(TrackHolders::kOff);
  EXPECT_EQ(pool->track_holders(), TrackHolders::kOff);
  std::vector<Buffer> kept;
  PlantLeak(*pool, kept);
  kept.back().Touch("ignored");  // no record: nothing happens
  std::byte* raw = pool->TryAcquireRaw();
  EXPECT_TRUE(pool->Holders().empty());
  const std::string report = pool->HoldersReport();
  // One line: the counts, and the switch that names the sites.
  EXPECT_EQ(report,
            "bufpool: 2 of 64 buffer(s) out (tracking off: run with "
            "BUFPOOL_TRACK_HOLDERS=all, or PoolOptions::track_holders, to see "
            "where each was acquired): 1 as raw pointers, 1 held by Buffer "
            "handles or chains\n");
  pool->ReleaseRaw(raw);
}

TEST(HoldersTest, HeldByNamesEveryKindOfHolder) {
  auto pool = MakePool(TrackHolders::kAll);
  Buffer handle = pool->TryAcquire();
  std::byte* raw = pool->TryAcquireRaw();
  std::byte* detached = pool->TryAcquire().Detach();
  SharedBuffer shared(pool->TryAcquire());
  SharedBuffer slice = shared.Slice(0, 10);
  BufferChain chain(*pool);
  ASSERT_TRUE(chain.Append(std::string(100, 'x')).ok());
  std::set<std::string> kinds;
  size_t chains = 0;
  for (const Holder& h : pool->Holders()) {
    kinds.insert(h.held_by);
    chains += h.held_by == "chain";
  }
  EXPECT_EQ(kinds, (std::set<std::string>{"Buffer", "raw pointer", "chain"}));
  EXPECT_EQ(chains, 2u);  // the SharedBuffer's slot, the chain's
  const std::string report = pool->HoldersReport();
  EXPECT_TRUE(absl::StrContains(report,
                                "5 of 64 buffer(s) out (tracking "
                                "all): 1 Buffer; 2 chain; 2 raw "
                                "pointer"))
      << report;
  pool->ReleaseRaw(raw);
  pool->ReleaseRaw(detached);
  // A slot that was a chain's and is now a handle's is a Buffer again.
  shared.Reset();
  slice.Reset();
  chain.Clear();
  handle.Reset();
  EXPECT_TRUE(pool->Holders().empty());
  std::vector<Buffer> all(64);
  ASSERT_EQ(pool->TryAcquireBulk(absl::MakeSpan(all)), 64u);
  const std::vector<Holder> bulk = pool->Holders();
  ASSERT_EQ(bulk.size(), 64u);
  for (const Holder& h : bulk) EXPECT_EQ(h.held_by, "Buffer") << h.slot;
  pool->ReleaseBulk(absl::MakeSpan(all));
  EXPECT_TRUE(pool->Holders().empty());
}

// A budget's reservation is out of the pool but held by no chain: the
// report names the budget, and a reserved buffer a chain took is the
// chain's.
TEST(HoldersTest, ReservedBuffersAreLabelledWithTheirBudget) {
  auto pool = MakePool(TrackHolders::kAll);
  auto budget = pool->CreateBudget({.name = "conn 7",
                                    .max_bytes = 8 * pool->buffer_size(),
                                    .reserved_bytes = 3 * pool->buffer_size()});
  ASSERT_TRUE(budget.ok()) << budget.status();
  auto count = [&](const std::string& kind) {
    size_t n = 0;
    for (const Holder& h : pool->Holders()) n += h.held_by == kind;
    return n;
  };
  EXPECT_EQ(count("budget conn 7"), 3u);
  EXPECT_TRUE(absl::StrContains(pool->HoldersReport(),
                                "3 budget conn 7 (reserved, not leaked)"))
      << pool->HoldersReport();
  {
    BufferChain chain(**budget);
    ASSERT_TRUE(chain.Append(std::string(100, 'x')).ok());
    EXPECT_EQ(count("chain"), 1u);
    EXPECT_EQ(count("budget conn 7"), 2u);
    EXPECT_EQ(pool->Holders().size(), 3u);
  }
  EXPECT_EQ(count("budget conn 7"), 3u);
  EXPECT_EQ(count("chain"), 0u);
  budget->reset();
  EXPECT_TRUE(pool->Holders().empty());
}

size_t ResidentKiB() {
  std::FILE* f = std::fopen("/proc/self/status", "r");
  if (f == nullptr) return 0;
  char line[256];
  size_t kib = 0;
  while (std::fgets(line, sizeof(line), f) != nullptr) {
    if (std::sscanf(line, "VmRSS: %zu kB", &kib) == 1) break;
  }
  std::fclose(f);
  return kib;
}

// An elastic pool tracks every slot up to its ceiling, including those it
// grew into, and its table costs memory only for the slots recorded.
TEST(HoldersTest, AnElasticPoolTracksGrownSlotsWithoutBackingTheCeiling) {
  const size_t before = ResidentKiB();
  auto pool = BufferPool::Create({.buffer_count = 64,
                                  .max_buffer_count = 262144,
                                  .grow_step = 64,
                                  .track_holders = TrackHolders::kAll});
  ASSERT_TRUE(pool.ok()) << pool.status();
  // 262,144 records of ~350 bytes would be ~90 MiB if all were touched.
  // (A sanitizer's calloc may write what it hands out.)
  if (!testing_util::kSanitized) {
    EXPECT_LT(ResidentKiB() - before, 16u * 1024) << "KiB";
  }
  std::vector<Buffer> held;
  for (int i = 0; i < 200; ++i) held.push_back((*pool)->TryAcquire());
  ASSERT_TRUE(held.back());
  const std::vector<Holder> holders = (*pool)->Holders();
  ASSERT_EQ(holders.size(), 200u);
  EXPECT_GT(std::max_element(holders.begin(), holders.end(),
                             [](const Holder& a, const Holder& b) {
                               return a.slot < b.slot;
                             })
                ->slot,
            64u);  // a grown slot
  held.clear();
  EXPECT_TRUE((*pool)->Holders().empty());
}

TEST(HoldersTest, AcquireWithTimeoutAndRawBulkAreRecorded) {
  auto pool = MakePool(TrackHolders::kAll, 8);
  absl::StatusOr<Buffer> b = pool->Acquire(absl::Seconds(1));
  ASSERT_TRUE(b.ok());
  std::byte* raws[3];
  ASSERT_EQ(pool->TryAcquireRawBulk(absl::MakeSpan(raws)), 3u);
  EXPECT_EQ(pool->Holders().size(), 4u);
  pool->ReleaseRawBulk(absl::MakeConstSpan(raws));
  EXPECT_EQ(pool->Holders().size(), 1u);
  b->Reset();
  EXPECT_TRUE(pool->Holders().empty());
}

TEST(HoldersTest, TouchKeepsTheLastFourLabelsOldestFirst) {
  auto pool = MakePool(TrackHolders::kAll);
  Buffer b = pool->TryAcquire();
  b.Touch("read");
  b.Touch("parsed");
  b.Touch(std::string(100, 'L'));  // cut to 31 bytes
  b.Touch("queued");
  b.Touch("sent");
  std::vector<Holder> holders = pool->Holders();
  ASSERT_EQ(holders.size(), 1u);
  EXPECT_EQ(holders[0].touches,
            (std::vector<std::string>{"parsed", std::string(31, 'L'), "queued",
                                      "sent"}));
  EXPECT_TRUE(absl::StrContains(pool->HoldersReport(), "parsed -> "));
  // A new holder of the slot starts with no touches.
  const uint32_t slot = b.slot();
  b.Reset();
  b = pool->TryAcquire();
  ASSERT_EQ(b.slot(), slot);
  holders = pool->Holders();
  ASSERT_EQ(holders.size(), 1u);
  EXPECT_TRUE(holders[0].touches.empty());
}

// Holders() while 8 threads acquire and release (run under TSan by the
// tsan preset): every snapshot lists each slot once, and only slots a
// thread holds for the whole call are certain to be in it.
TEST(HoldersTest, HoldersIsSafeWhileEightThreadsAcquireAndRelease) {
  auto pool = MakePool(TrackHolders::kAll, 256);
  std::atomic<bool> stop{false};
  std::atomic<int> ready{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&, t] {
      // Each thread keeps one buffer for the whole run, touched with its
      // number, and cycles a few more.
      Buffer mine = pool->TryAcquire();
      mine.Touch(std::to_string(t));
      ready.fetch_add(1);
      std::vector<Buffer> held;
      std::byte* raw[4];
      while (!stop.load(std::memory_order_relaxed)) {
        for (int i = 0; i < 8; ++i) {
          held.push_back(pool->TryAcquire());
          held.back().Touch("cycling");
        }
        const size_t n = pool->TryAcquireRawBulk(absl::MakeSpan(raw));
        held.clear();
        pool->ReleaseRawBulk(absl::MakeConstSpan(raw, n));
      }
    });
  }
  while (ready.load() < 8) std::this_thread::yield();
  for (int round = 0; round < 20; ++round) {
    std::set<uint32_t> slots;
    int kept = 0;
    for (const Holder& h : pool->Holders()) {
      EXPECT_TRUE(slots.insert(h.slot).second) << h.slot;
      EXPECT_LE(h.touches.size(), 4u);
      if (!h.touches.empty() && h.touches[0].size() == 1) ++kept;
    }
    EXPECT_EQ(kept, 8);  // the buffers held throughout are all listed
    EXPECT_LE(slots.size(), 256u);
    (void)pool->HoldersReport(3);
  }
  stop.store(true);
  for (std::thread& t : threads) t.join();
  EXPECT_TRUE(pool->Holders().empty());
}

TEST(HoldersTest, EnvironmentOverridesTheOption) {
  ASSERT_EQ(setenv("BUFPOOL_TRACK_HOLDERS", "all", 1), 0);
  EXPECT_EQ(MakePool(TrackHolders::kOff)->track_holders(), TrackHolders::kAll);
  ASSERT_EQ(setenv("BUFPOOL_TRACK_HOLDERS", "sampled", 1), 0);
  EXPECT_EQ(MakePool(TrackHolders::kAll)->track_holders(),
            TrackHolders::kSampled);
  ASSERT_EQ(setenv("BUFPOOL_TRACK_HOLDERS", "off", 1), 0);
  EXPECT_EQ(MakePool(TrackHolders::kAll)->track_holders(), TrackHolders::kOff);
  // An unknown value is named on stderr and ignored.
  ASSERT_EQ(setenv("BUFPOOL_TRACK_HOLDERS", "everything", 1), 0);
  ::testing::internal::CaptureStderr();
  EXPECT_EQ(MakePool(TrackHolders::kSampled)->track_holders(),
            TrackHolders::kSampled);
  EXPECT_TRUE(absl::StrContains(::testing::internal::GetCapturedStderr(),
                                "BUFPOOL_TRACK_HOLDERS=everything is none of"));
  ASSERT_EQ(unsetenv("BUFPOOL_TRACK_HOLDERS"), 0);
  EXPECT_EQ(MakePool(TrackHolders::kOff)->track_holders(), TrackHolders::kOff);
}

TEST(HoldersTest, ZeroSampleEveryIsRefused) {
  auto pool = BufferPool::Create(
      {.track_holders = TrackHolders::kSampled, .holder_sample_every = 0});
  ASSERT_FALSE(pool.ok());
  EXPECT_EQ(pool.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(pool.status().message(),
                                "holder_sample_every must be at least 1"));
}

TEST(HoldersTest, NoHoldersFailsNamingTheSite) {
  auto pool = MakePool(TrackHolders::kAll);
  std::vector<Buffer> kept;
  PlantLeak(*pool, kept);
  const ::testing::AssertionResult result = testing::NoHolders(*pool);
  EXPECT_FALSE(result);
  EXPECT_TRUE(absl::StrContains(result.message(), "PlantLeak"))
      << result.message();
  kept.clear();
  EXPECT_TRUE(testing::NoHolders(*pool));
}

// For the EXPECT_NONFATAL_FAILURE statements below, which may not name a
// test's locals.
BufferPool* g_checked_pool = nullptr;
std::vector<Buffer>* g_checked_kept = nullptr;

// The scoped checker fails the test when it goes with a buffer out, naming
// the site; ExpectNoHolders() is the same as a statement.
TEST(HoldersTest, NoHoldersAtExitAndExpectNoHoldersFailNamingTheSite) {
  auto pool = MakePool(TrackHolders::kAll);
  std::vector<Buffer> kept;
  g_checked_pool = pool.get();
  g_checked_kept = &kept;
  EXPECT_NONFATAL_FAILURE(
      {
        testing::NoHoldersAtExit check(*g_checked_pool);
        PlantLeak(*g_checked_pool, *g_checked_kept);
      },
      "PlantLeak");
  EXPECT_NONFATAL_FAILURE(testing::ExpectNoHolders(*g_checked_pool),
                          "buffers are still out of the pool");
  kept.clear();
  {
    testing::NoHoldersAtExit check(*pool);  // passes: nothing out
    std::vector<Buffer> returned;
    PlantLeak(*pool, returned);
  }
  testing::ExpectNoHolders(*pool);
}

std::map<std::string, size_t> Kinds(const BufferPool& pool) {
  std::map<std::string, size_t> kinds;
  for (const Holder& h : pool.Holders()) ++kinds[h.held_by];
  return kinds;
}

// What the ring tests share: an io_uring, a datagram socket pair (the
// test sends on fds[0], the ring receives from fds[1]) and a four-buffer
// ring of `group` on the pool. Close() gives the ring's buffers back and
// exits the io_uring; the destructor does too, for a test that stops early.
struct RingRig {
  io_uring ring{};
  bool open = false;
  testing_util::UniqueFd fds[2];
  std::unique_ptr<ProvidedBufferRing> br;

  void Open(BufferPool& pool, uint16_t group) {
    ASSERT_EQ(io_uring_queue_init(8, &ring, 0), 0);
    open = true;
    ASSERT_EQ(testing_util::SocketPair(SOCK_DGRAM | SOCK_CLOEXEC, fds), 0);
    auto made = ProvidedBufferRing::Create(
        &ring, pool,
        {.group_id = group,
         .max_buffers = 4,
         .initial_buffers = 4,
         .incremental = ProvidedBufferRingOptions::Incremental::kOff});
    ASSERT_TRUE(made.ok()) << made.status();
    br = *std::move(made);
  }
  // Submits and waits for a completion (5 s at most): *cqe, to be seen.
  void Wait(io_uring_cqe** cqe) {
    *cqe = nullptr;
    __kernel_timespec ts{.tv_sec = 5, .tv_nsec = 0};
    ASSERT_GE(io_uring_submit_and_wait_timeout(&ring, cqe, 1, &ts, nullptr), 0);
    ASSERT_NE(*cqe, nullptr);
  }
  void Close() {
    br.reset();
    if (open) io_uring_queue_exit(&ring);
    open = false;
  }
  ~RingRig() { Close(); }
};

// Buffers lent to a provided-buffer ring are labelled with its group, as
// lent rather than leaked; one taken out of the ring is a handle's again,
// and the handle's buffer it traded places with is the ring's.
TEST(HoldersTest, RingLentBuffersAreLabelledLent) {
  auto pool = MakePool(TrackHolders::kAll, 16);
  RingRig rig;
  ASSERT_NO_FATAL_FAILURE(rig.Open(*pool, 7));
  {
    Buffer held = pool->TryAcquire();
    const uint32_t mine = held.slot();
    EXPECT_EQ(Kinds(*pool),
              (std::map<std::string, size_t>{{"ring 7", 4}, {"Buffer", 1}}));
    const std::string report = pool->HoldersReport();
    EXPECT_TRUE(absl::StrContains(report, "4 ring 7 (lent, not leaked)"))
        << report;

    rig.br->PrepareRecv(io_uring_get_sqe(&rig.ring), rig.fds[1].get());
    ASSERT_EQ(send(rig.fds[0].get(), "hello", 5, 0), 5);
    io_uring_cqe* cqe = nullptr;
    ASSERT_NO_FATAL_FAILURE(rig.Wait(&cqe));
    ASSERT_TRUE(rig.br->TakeBuffer(*cqe, held));
    io_uring_cqe_seen(&rig.ring, cqe);
    ASSERT_NE(held.slot(), mine);
    for (const Holder& h : pool->Holders()) {
      EXPECT_EQ(h.held_by, h.slot == held.slot() ? "Buffer" : "ring 7")
          << h.slot;
    }
    Buffer out;  // an empty handle: the filled buffer leaves the ring
    ASSERT_EQ(send(rig.fds[0].get(), "again", 5, 0), 5);
    ASSERT_NO_FATAL_FAILURE(rig.Wait(&cqe));
    ASSERT_TRUE(rig.br->TakeBuffer(*cqe, out));
    io_uring_cqe_seen(&rig.ring, cqe);
    EXPECT_EQ(Kinds(*pool),
              (std::map<std::string, size_t>{{"ring 7", 3}, {"Buffer", 2}}));
    held.Reset();
    out.Reset();
    rig.br.reset();
  }
  rig.Close();
  EXPECT_TRUE(testing::NoHolders(*pool));
}

// What a ring holds for the kernel (its lent buffers and its pack buffer)
// is counted apart from other holders, tracked or not, and the count goes
// with the ring.
void CheckRingsAreCountedApart(TrackHolders track) {
  auto pool = MakePool(track, 16);
  const std::string off_prefix =
      " buffer(s) out (tracking off: run with BUFPOOL_TRACK_HOLDERS=all, or "
      "PoolOptions::track_holders, to see where each was acquired): 0 as raw "
      "pointers, ";
  RingRig rig;
  ASSERT_NO_FATAL_FAILURE(rig.Open(*pool, 3));
  Buffer mine;
  {
    std::string report = pool->HoldersReport();
    EXPECT_TRUE(absl::StrContains(
        report,
        "4 lent to io_uring rings (ProvidedBufferRing group 3: 4 lent, 0 "
        "pack)"))
        << report;

    // A short receive is copied into the pack buffer, which the chain's
    // slice shares: one more buffer out, and it is the ring's.
    rig.br->PrepareRecv(io_uring_get_sqe(&rig.ring), rig.fds[1].get());
    ASSERT_EQ(send(rig.fds[0].get(), "hi", 2, 0), 2);
    io_uring_cqe* cqe = nullptr;
    ASSERT_NO_FATAL_FAILURE(rig.Wait(&cqe));
    BufferChain chain(*pool);
    ASSERT_TRUE(rig.br->Take(*cqe, chain).ok());
    io_uring_cqe_seen(&rig.ring, cqe);
    ASSERT_EQ(rig.br->available(), 4u);
    ASSERT_EQ(rig.br->pack_buffers(), 1u);
    const std::string lent =
        "5 lent to io_uring rings (ProvidedBufferRing group 3: 4 lent, 1 pack)";
    report = pool->HoldersReport();
    if (track == TrackHolders::kOff) {
      EXPECT_EQ(report, absl::StrCat("bufpool: 5 of 16", off_prefix, lent,
                                     ", 0 held by Buffer handles or chains\n"));
    } else {
      EXPECT_TRUE(absl::StartsWith(
          report,
          absl::StrCat(
              "bufpool: 5 of 16 buffer(s) out (tracking "
              "all): 1 chain; 4 ring 3 (lent, not leaked)\n  of these, ",
              lent, "\n")))
          << report;
    }

    // A buffer the test holds is another holder's.
    mine = pool->TryAcquire();
    ASSERT_TRUE(mine);
    report = pool->HoldersReport();
    if (track == TrackHolders::kOff) {
      EXPECT_EQ(report, absl::StrCat("bufpool: 6 of 16", off_prefix, lent,
                                     ", 1 held by Buffer handles or chains\n"));
    } else {
      EXPECT_TRUE(absl::StartsWith(
          report,
          absl::StrCat("bufpool: 6 of 16 buffer(s) out (tracking all): 1 "
                       "Buffer; 1 chain; 4 ring 3 (lent, not leaked)\n  of "
                       "these, ",
                       lent, "\n")))
          << report;
    }
    chain.Clear();
    rig.br.reset();
  }
  // The ring gone, its line goes with it.
  const std::string report = pool->HoldersReport();
  EXPECT_FALSE(absl::StrContains(report, "io_uring")) << report;
  if (track == TrackHolders::kOff) {
    EXPECT_EQ(report, absl::StrCat("bufpool: 1 of 16", off_prefix,
                                   "1 held by Buffer handles or chains\n"));
  } else {
    EXPECT_TRUE(absl::StartsWith(
        report, "bufpool: 1 of 16 buffer(s) out (tracking all): 1 Buffer\n"))
        << report;
  }
  mine.Reset();
  rig.Close();
  EXPECT_TRUE(testing::NoHolders(*pool));
}

TEST(HoldersTest, RingsAreCountedApartWithTrackingOff) {
  CheckRingsAreCountedApart(TrackHolders::kOff);
}

TEST(HoldersTest, RingsAreCountedApartWithTrackingAll) {
  CheckRingsAreCountedApart(TrackHolders::kAll);
}

// Reports on another thread read the ring's counts while its thread takes
// completions, refills and packs (for TSan: the reads are atomics).
TEST(HoldersTest, ReportsWhileTheRingRunsAreRaceFree) {
  auto pool = MakePool(TrackHolders::kOff, 16);
  RingRig rig;
  ASSERT_NO_FATAL_FAILURE(rig.Open(*pool, 5));
  {
    std::atomic<bool> stop{false};
    std::thread reporter([&] {
      while (!stop.load(std::memory_order_relaxed)) {
        const std::string report = pool->HoldersReport();
        EXPECT_TRUE(absl::StrContains(report, "ProvidedBufferRing group 5"))
            << report;
      }
    });
    const std::string big(pool->buffer_size() / 2, 'x');
    BufferChain chain(*pool);
    bool armed = false;  // a multishot receive, re-armed when it ends
    for (int i = 0; i < 200; ++i) {
      if (!armed)
        rig.br->PrepareRecv(io_uring_get_sqe(&rig.ring), rig.fds[1].get());
      const std::string& msg = i % 2 == 0 ? big : std::string("hi");
      ASSERT_EQ(send(rig.fds[0].get(), msg.data(), msg.size(), 0),
                static_cast<ssize_t>(msg.size()));
      io_uring_cqe* cqe = nullptr;
      ASSERT_NO_FATAL_FAILURE(rig.Wait(&cqe));
      armed = (cqe->flags & IORING_CQE_F_MORE) != 0;
      ASSERT_TRUE(rig.br->Take(*cqe, chain).ok());
      io_uring_cqe_seen(&rig.ring, cqe);
      if (i % 8 == 7) chain.Clear();
      rig.br->Refill();
    }
    stop.store(true, std::memory_order_relaxed);
    reporter.join();
    chain.Clear();
    rig.br.reset();
  }
  rig.Close();
  EXPECT_FALSE(absl::StrContains(pool->HoldersReport(), "io_uring"));
}

// A completion Take() links into an empty chain inline is the chain's,
// no longer the ring's, until the chain drops it; the fresh buffer lent in
// its place is the ring's at once. With the pool dry the id waits for
// Refill().
TEST(HoldersTest, ABufferLinkedIntoAnEmptyChainIsTheChains) {
  auto pool = MakePool(TrackHolders::kAll, 16);
  RingRig rig;
  ASSERT_NO_FATAL_FAILURE(rig.Open(*pool, 7));
  {
    rig.br->PrepareRecv(io_uring_get_sqe(&rig.ring), rig.fds[1].get());
    const std::string msg(pool->buffer_size() / 2, 'x');  // >= copy_below
    ASSERT_EQ(send(rig.fds[0].get(), msg.data(), msg.size(), 0),
              static_cast<ssize_t>(msg.size()));
    io_uring_cqe* cqe = nullptr;
    ASSERT_NO_FATAL_FAILURE(rig.Wait(&cqe));
    BufferChain chain(*pool);
    ASSERT_TRUE(rig.br->Take(*cqe, chain).ok());
    io_uring_cqe_seen(&rig.ring, cqe);
    ASSERT_EQ(chain.slice_count(), 1u);
    EXPECT_EQ(Kinds(*pool),
              (std::map<std::string, size_t>{{"ring 7", 4}, {"chain", 1}}));
    EXPECT_EQ(rig.br->available(), 4u);
    chain.Consume(chain.size());
    EXPECT_EQ(Kinds(*pool), (std::map<std::string, size_t>{{"ring 7", 4}}));
    // The pool dry (everything else held): the linked buffer's id leaves
    // the ring until Refill() finds a buffer.
    std::vector<Buffer> all;
    while (Buffer b = pool->TryAcquire()) all.push_back(std::move(b));
    ASSERT_EQ(send(rig.fds[0].get(), msg.data(), msg.size(), 0),
              static_cast<ssize_t>(msg.size()));
    cqe = nullptr;
    ASSERT_NO_FATAL_FAILURE(rig.Wait(&cqe));
    ASSERT_TRUE(rig.br->Take(*cqe, chain).ok());
    io_uring_cqe_seen(&rig.ring, cqe);
    EXPECT_EQ(rig.br->available(), 3u);
    EXPECT_EQ(Kinds(*pool), (std::map<std::string, size_t>{
                                {"ring 7", 3}, {"chain", 1}, {"Buffer", 12}}));
    all.pop_back();
    EXPECT_EQ(rig.br->Refill(), 4u);
    EXPECT_EQ(Kinds(*pool), (std::map<std::string, size_t>{
                                {"ring 7", 4}, {"chain", 1}, {"Buffer", 11}}));
    chain.Clear();
    all.clear();
    rig.br.reset();
  }
  rig.Close();
  EXPECT_TRUE(testing::NoHolders(*pool));
}

// A HeldSend's chain is "send in flight" from Prepare() until the kernel is
// done; then its buffers go back.
TEST(HoldersTest, HeldSendSlotsAreInFlightUntilDone) {
  io_uring ring;
  ASSERT_EQ(io_uring_queue_init(8, &ring, 0), 0);
  auto pool = MakePool(TrackHolders::kAll, 16);
  testing_util::UniqueFd fds[2];
  ASSERT_EQ(testing_util::SocketPair(SOCK_STREAM | SOCK_CLOEXEC, fds), 0);
  {
    BufferChain chain(*pool);
    ASSERT_TRUE(chain.Append(std::string(5000, 'x')).ok());  // two buffers
    HeldSend send;
    send.Prepare(io_uring_get_sqe(&ring), fds[0].get(), std::move(chain));
    EXPECT_EQ(Kinds(*pool),
              (std::map<std::string, size_t>{{"send in flight", 2}}));
    io_uring_cqe* cqe = nullptr;
    __kernel_timespec ts{.tv_sec = 5, .tv_nsec = 0};
    ASSERT_GE(io_uring_submit_and_wait_timeout(&ring, &cqe, 1, &ts, nullptr),
              0);
    ASSERT_NE(cqe, nullptr);
    EXPECT_TRUE(send.OnCompletion(*cqe));
    io_uring_cqe_seen(&ring, cqe);
    EXPECT_EQ(send.result(), 5000);
  }
  io_uring_queue_exit(&ring);
  EXPECT_TRUE(testing::NoHolders(*pool));
}

using HoldersDeathTest = ::testing::Test;

TEST(HoldersDeathTest, DestroyingAPoolWithALeakPrintsItsSite) {
  ::testing::FLAGS_gtest_death_test_style = "threadsafe";
  EXPECT_DEATH(
      {
        auto pool = MakePool(TrackHolders::kAll);
        std::vector<Buffer> kept;
        PlantLeak(*pool, kept);
        pool.reset();
      },
      absl::StrCat(
          "still in use \\(1 held by Buffer handles, chains or "
          "rings\\)(.|\n)*1 buffer\\(s\\) held by 1 Buffer(.|\n)*#0 [^\n]*",
          "PlantLeak[^\n]*",
          StackSymbolizer::HaveLineInformation()
              ? absl::StrCat("\\(/[^\n]*/holders_test\\.cc:", kPlantLeakLine,
                             "\\) ")
              : "",
          "/[^\n]*/holders_test\\+0x[0-9a-f]+\n(.|\n)*\n$"));
}

TEST(HoldersDeathTest, AnUnsampledLeakIsCountedWithTheSwitchOnALine) {
  ::testing::FLAGS_gtest_death_test_style = "threadsafe";
  EXPECT_DEATH(
      {
        auto pool = MakePool(TrackHolders::kSampled, 64, 1000);
        std::vector<Buffer> kept;
        std::thread([&] {
          pool->TryAcquire().Reset();  // the thread's one sample
          kept.push_back(pool->TryAcquire());
        }).join();
        pool.reset();
      },
      "1 of 64 buffer\\(s\\) out \\(tracking 1 in 1000: 0 sampled; run with "
      "BUFPOOL_TRACK_HOLDERS=all to see where each was acquired\\):\n"
      "  not sampled: 1 \\(1 held by Buffer handles, chains or sends in "
      "flight\\); BUFPOOL_TRACK_HOLDERS=all records every acquire\n$");
}

TEST(HoldersDeathTest, UntrackedPoolPrintsCountsAndTheSwitch) {
  ::testing::FLAGS_gtest_death_test_style = "threadsafe";
  EXPECT_DEATH(
      {
        auto pool = MakePool(TrackHolders::kOff);
        std::vector<Buffer> kept;
        PlantLeak(*pool, kept);
        (void)pool->TryAcquireRaw();
        pool.reset();
      },
      "2 of 64 buffer\\(s\\) out \\(tracking off: run with "
      "BUFPOOL_TRACK_HOLDERS=all, or PoolOptions::track_holders, to see "
      "where each was acquired\\): 1 as raw pointers, 1 held by Buffer "
      "handles or chains\n");
}

}  // namespace
}  // namespace bufpool

namespace bufpool {
namespace {
// Sampled, the per-kind line counts the sampled buffers only (here 1 of
// the ring's 4): the rings' line is not "of these".
TEST(HoldersTest, SampledRingsLineIsNotAPartOfTheSampledKinds) {
  auto pool = MakePool(TrackHolders::kSampled, 16, 128);
  RingRig rig;
  ASSERT_NO_FATAL_FAILURE(rig.Open(*pool, 3));
  Buffer mine = pool->TryAcquire();
  const std::string report = pool->HoldersReport();
  EXPECT_TRUE(absl::StrContains(report, "sampled")) << report;
  EXPECT_FALSE(absl::StrContains(report, "of these")) << report;
  EXPECT_TRUE(absl::StrContains(report, "\n  4 lent to io_uring rings"))
      << report;
  mine.Reset();
  rig.Close();
}
}  // namespace
}  // namespace bufpool

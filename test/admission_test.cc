// Admission (bufpool/admission.h): grants first come, first served across
// budgets, a large request that is not starved by small ones, waiting that
// pins nothing, refusals that name the budget, the numbers and what to
// change (and change nothing), capacity committed against the pool beside
// rings and reservations, and a threaded stress (TSan) in which grants
// never exceed the capacity and every request is granted once.
#include "bufpool/admission.h"

#include <poll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <atomic>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "bufpool/budget.h"
#include "bufpool/chain.h"
#include "bufpool/cursor.h"
#include "bufpool/uring.h"
#include "gtest/gtest.h"
#include "test_util.h"
#include "uring_test_util.h"

namespace bufpool {
namespace {

constexpr size_t kBs = 4096;

std::unique_ptr<BufferPool> MakePool(size_t count) {
  return testing_util::MakePool({.buffer_size = kBs,
                                 .buffer_count = count,
                                 .huge_pages = HugePages::kNever,
                                 .populate = false,
                                 .cache_size = 0});
}

std::unique_ptr<BufferBudget> MakeBudget(BufferPool& pool,
                                         const std::string& name,
                                         size_t max_buffers) {
  auto b = pool.CreateBudget({.name = name, .max_bytes = max_buffers * kBs});
  EXPECT_TRUE(b.ok()) << b.status();
  return b.ok() ? std::move(*b) : nullptr;
}

std::unique_ptr<AdmissionQueue> MakeQueue(BufferPool& pool,
                                          const AdmissionOptions& o) {
  auto q = AdmissionQueue::Create(pool, o);
  EXPECT_TRUE(q.ok()) << q.status();
  return q.ok() ? std::move(*q) : nullptr;
}

TEST(AdmissionTest, GrantsAtOnceWhileThereIsRoom) {
  auto pool = MakePool(64);
  auto q = MakeQueue(*pool, {.name = "q", .capacity_buffers = 20});
  auto budget = MakeBudget(*pool, "conn 1", 20);
  Admission a;
  bool called = false;
  absl::StatusOr<bool> now =
      q->Request(*budget, 10 * kBs, a, [&] { called = true; });
  ASSERT_TRUE(now.ok()) << now.status();
  EXPECT_TRUE(*now);
  EXPECT_TRUE(a.granted());
  EXPECT_FALSE(called);         // granted now: the caller knows
  EXPECT_EQ(a.buffers(), 12u);  // 10 + 2 of slack
  EXPECT_EQ(q->Stats().granted_buffers, 12u);
  a.Reset();
  EXPECT_FALSE(a.granted());
  EXPECT_EQ(q->Stats().granted_buffers, 0u);
  EXPECT_EQ(q->Stats().grants, 1u);
  EXPECT_EQ(q->Stats().waited, 0u);
}

TEST(AdmissionTest, WaitersAreGrantedInArrivalOrderAcrossBudgets) {
  auto pool = MakePool(64);
  auto q = MakeQueue(*pool,
                     {.name = "q", .capacity_buffers = 10, .slack_buffers = 0});
  std::vector<std::unique_ptr<BufferBudget>> budgets;
  for (int i = 0; i < 5; ++i) {
    budgets.push_back(MakeBudget(*pool, "conn " + std::to_string(i), 10));
  }
  Admission first;
  ASSERT_TRUE(*q->Request(*budgets[0], 10 * kBs, first, nullptr));
  // Four more wait behind it, each for a share that would fit alone.
  std::vector<int> order;
  Admission waiting[4];
  for (int i = 0; i < 4; ++i) {
    absl::StatusOr<bool> now =
        q->Request(*budgets[i + 1], (i + 2) * kBs, waiting[i],
                   [&order, i] { order.push_back(i); });
    ASSERT_TRUE(now.ok()) << now.status();
    EXPECT_FALSE(*now);
    EXPECT_TRUE(waiting[i].waiting());
  }
  EXPECT_EQ(q->queue_length(), 4u);
  // 10 free: 2 + 3 + 4 fit, 5 then waits for them.
  first.Reset();
  EXPECT_EQ(order, (std::vector<int>{0, 1, 2}));
  EXPECT_TRUE(waiting[3].waiting());
  EXPECT_EQ(q->queue_length(), 1u);
  waiting[0].Reset();  // 2 back: 2 + 1 free, still short of 5
  EXPECT_EQ(order.size(), 3u);
  waiting[1].Reset();
  EXPECT_EQ(order, (std::vector<int>{0, 1, 2, 3}));
  EXPECT_EQ(q->Stats().longest_queue, 4u);
  EXPECT_EQ(q->Stats().waited, 4u);
  EXPECT_EQ(q->Stats().grants, 5u);
  for (Admission& w : waiting) w.Reset();
  EXPECT_EQ(q->Stats().granted_buffers, 0u);
}

TEST(AdmissionTest, ALargeRequestIsNotOvertakenBySmallOnes) {
  auto pool = MakePool(64);
  auto q = MakeQueue(*pool,
                     {.name = "q", .capacity_buffers = 16, .slack_buffers = 0});
  auto small = MakeBudget(*pool, "small", 16);
  auto large = MakeBudget(*pool, "large", 16);
  Admission held, big, later;
  ASSERT_TRUE(*q->Request(*small, 4 * kBs, held, nullptr));
  bool big_granted = false;
  ASSERT_FALSE(*q->Request(*large, 16 * kBs, big, [&] { big_granted = true; }));
  // 12 free, but the large one came first: a small one waits behind it.
  bool later_granted = false;
  ASSERT_FALSE(*q->Request(*small, kBs, later, [&] { later_granted = true; }));
  EXPECT_TRUE(later.waiting());
  held.Reset();
  EXPECT_TRUE(big_granted);
  EXPECT_FALSE(later_granted);
  big.Shrink(8 * kBs);  // half of it sent: the rest lets the small one in
  EXPECT_TRUE(later_granted);
  EXPECT_EQ(q->Stats().granted_buffers, 9u);
  big.Reset();
  later.Reset();
}

TEST(AdmissionTest, AHeadThatLeavesLetsTheNextIn) {
  auto pool = MakePool(64);
  auto q = MakeQueue(*pool,
                     {.name = "q", .capacity_buffers = 8, .slack_buffers = 0});
  auto b = MakeBudget(*pool, "b", 8);
  Admission held, head, next;
  ASSERT_TRUE(*q->Request(*b, 4 * kBs, held, nullptr));
  bool head_called = false, next_called = false;
  ASSERT_FALSE(*q->Request(*b, 8 * kBs, head, [&] { head_called = true; }));
  ASSERT_FALSE(*q->Request(*b, 2 * kBs, next, [&] { next_called = true; }));
  head.Reset();  // a connection that closes while it waits
  EXPECT_TRUE(next_called);
  EXPECT_FALSE(head_called);
  held.Reset();
  EXPECT_FALSE(head_called);  // it left: its callback never runs
  next.Reset();
  EXPECT_EQ(q->Stats().queue_length, 0u);
  EXPECT_EQ(q->Stats().granted_buffers, 0u);
}

// ---- Refusals: one line, the budget, the numbers, what to change ----------

TEST(AdmissionTest, ARequestOverTheBudgetIsRefusedAndChangesNothing) {
  auto pool = MakePool(64);
  auto q = MakeQueue(*pool, {.name = "frames", .capacity_buffers = 40});
  auto budget = MakeBudget(*pool, "conn 7", 12);
  Admission a;
  absl::StatusOr<bool> r = q->Request(*budget, 50000, a, nullptr);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(r.status().message(),
            "AdmissionQueue(\"frames\"): budget \"conn 7\" can never be "
            "granted 50000 bytes: they count 15 buffers (61440 bytes with 2 "
            "of slack), over its max_bytes 49152; raise max_bytes to at "
            "least 61440 or lower the largest message");
  EXPECT_FALSE(a.waiting());
  EXPECT_FALSE(a.granted());
  EXPECT_EQ(q->Stats().granted_buffers, 0u);
  EXPECT_EQ(q->Stats().queue_length, 0u);
  EXPECT_EQ(q->Stats().refusals, 1u);
  // The same Admission may ask again for what fits.
  EXPECT_TRUE(*q->Request(*budget, 10 * kBs, a, nullptr));
  a.Reset();
}

TEST(AdmissionTest, ARequestOverTheCapacityIsRefused) {
  auto pool = MakePool(64);
  auto q = MakeQueue(*pool, {.name = "frames", .capacity_buffers = 10});
  auto budget = MakeBudget(*pool, "conn 3", 64);
  Admission a;
  absl::StatusOr<bool> r = q->Request(*budget, 50000, a, nullptr);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(r.status().message(),
            "AdmissionQueue(\"frames\"): budget \"conn 3\" can never be "
            "granted 50000 bytes: they count 15 buffers (with 2 of slack), "
            "over the queue's capacity of 10 (pool of 64 buffers); raise "
            "capacity_buffers or the pool's buffers, or lower the largest "
            "message");
  EXPECT_EQ(q->Stats().queue_length, 0u);
  EXPECT_FALSE(a.waiting());
}

TEST(AdmissionTest, ABusyAdmissionOrAForeignBudgetIsRefused) {
  auto pool = MakePool(64);
  auto other = MakePool(8);
  auto q = MakeQueue(*pool, {.name = "q", .capacity_buffers = 10});
  auto budget = MakeBudget(*pool, "mine", 10);
  auto foreign = MakeBudget(*other, "theirs", 8);
  Admission a;
  ASSERT_TRUE(*q->Request(*budget, kBs, a, nullptr));
  absl::StatusOr<bool> again = q->Request(*budget, kBs, a, nullptr);
  ASSERT_FALSE(again.ok());
  EXPECT_EQ(again.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(absl::StrContains(again.status().message(),
                                "budget \"mine\" asked for 4096 bytes with an "
                                "Admission that already holds a grant"))
      << again.status();
  EXPECT_EQ(a.buffers(), 3u);  // the grant it held is untouched
  Admission b;
  absl::StatusOr<bool> f = q->Request(*foreign, kBs, b, nullptr);
  ASSERT_FALSE(f.ok());
  EXPECT_EQ(f.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(f.status().message(),
                                "budget \"theirs\" belongs to another pool"));
  a.Reset();
}

TEST(AdmissionTest, CapacityIsCommittedAgainstThePool) {
  auto pool = MakePool(64);
  auto reserving = pool->CreateBudget(
      {.name = "r", .max_bytes = 8 * kBs, .reserved_bytes = 8 * kBs});
  ASSERT_TRUE(reserving.ok()) << reserving.status();
  auto big =
      AdmissionQueue::Create(*pool, {.name = "frames", .capacity_buffers = 60});
  ASSERT_FALSE(big.ok());
  EXPECT_EQ(big.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(big.status().message(),
            "AdmissionQueue(\"frames\"): capacity_buffers 60 does not fit "
            "the pool (64 buffers, 8 already promised to budgets' "
            "reservations, rings and admission queues, 56 left); lower "
            "capacity_buffers to at "
            "most 56, or the rings' max_buffers or reservations, or grow the "
            "pool");
  // Automatic: what is left.
  auto q = MakeQueue(*pool, {.name = "frames"});
  ASSERT_NE(q, nullptr);
  EXPECT_EQ(q->capacity_buffers(), 56u);
  // Nothing is left for a second queue or a reservation made after it.
  auto second = AdmissionQueue::Create(*pool, {.name = "second"});
  ASSERT_FALSE(second.ok());
  EXPECT_TRUE(absl::StrContains(second.status().message(),
                                "an automatic capacity does not fit the pool "
                                "(64 buffers, 64 already promised"))
      << second.status();
  auto late = pool->CreateBudget(
      {.name = "late", .max_bytes = kBs, .reserved_bytes = kBs});
  ASSERT_FALSE(late.ok());
  EXPECT_TRUE(absl::StrContains(late.status().message(), "over-commit"))
      << late.status();
  q.reset();  // gives its capacity back
  auto fits =
      AdmissionQueue::Create(*pool, {.name = "again", .capacity_buffers = 56});
  EXPECT_TRUE(fits.ok()) << fits.status();
  auto bad = AdmissionQueue::Create(
      *pool, {.name = "x", .capacity_buffers = 1, .slack_buffers = 65});
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
}

// A ring or a reservation made after the queue must fit beside it: refused
// with the numbers and what to lower, and nothing taken.
TEST(AdmissionTest, ARingOrReservationAfterTheQueueIsChecked) {
  testing_util::Ring ring(64, 0);
  ASSERT_TRUE(ring.ok());
  auto pool = MakePool(64);
  auto q = MakeQueue(*pool, {.name = "frames", .capacity_buffers = 52});
  auto big = ProvidedBufferRing::Create(
      ring.get(), *pool, {.max_buffers = 16, .initial_buffers = 4});
  ASSERT_FALSE(big.ok());
  EXPECT_EQ(big.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_TRUE(absl::StrContains(
      big.status().message(),
      "lending up to 16 buffers would over-commit the pool (64 buffers, 0 "
      "reserved by budgets and 0 lent to rings, 52 held by admission "
      "queues); lower max_buffers or the reservations"))
      << big.status();
  EXPECT_EQ(pool->Stats().in_use, 0u);
  auto reserve = pool->CreateBudget(
      {.name = "conn 9", .max_bytes = 16 * kBs, .reserved_bytes = 13 * kBs});
  ASSERT_FALSE(reserve.ok());
  EXPECT_EQ(reserve.status().message(),
            "CreateBudget(\"conn 9\"): reserving 13 buffers would "
            "over-commit the pool (64 buffers, 0 reserved by budgets and 0 "
            "lent to rings, 52 held by admission queues); lower "
            "reserved_bytes or what rings and "
            "admission queues hold, or grow the pool");
  EXPECT_EQ(pool->Stats().in_use, 0u);
  auto fits = ProvidedBufferRing::Create(
      ring.get(), *pool, {.max_buffers = 8, .initial_buffers = 4});
  ASSERT_TRUE(fits.ok()) << fits.status();
  auto reserve_fits = pool->CreateBudget(
      {.name = "conn 9", .max_bytes = 16 * kBs, .reserved_bytes = 4 * kBs});
  EXPECT_TRUE(reserve_fits.ok()) << reserve_fits.status();
}

TEST(AdmissionDeathTest, DestroyingAQueueWithAGrantOutAborts) {
  auto pool = MakePool(16);
  auto budget = MakeBudget(*pool, "b", 16);
  EXPECT_DEATH(
      {
        auto q = MakeQueue(*pool, {.name = "frames", .capacity_buffers = 8});
        auto* a = new Admission;  // outlives the queue on purpose
        (void)q->Request(*budget, kBs, *a, nullptr);
        q.reset();
      },
      "admission queue \"frames\" destroyed while 1 admissions wait or hold "
      "grants");
}

TEST(AdmissionTest, MetricsSayTheQueueLengthAndGrants) {
  auto pool = MakePool(64);
  auto q = MakeQueue(
      *pool,
      {.name = "frames \"a\"", .capacity_buffers = 8, .slack_buffers = 0});
  auto b = MakeBudget(*pool, "b", 8);
  Admission held, waiting;
  ASSERT_TRUE(*q->Request(*b, 8 * kBs, held, nullptr));
  ASSERT_FALSE(*q->Request(*b, kBs, waiting, nullptr));
  std::string text;
  WriteMetrics(*q, &text, {.name = "rx"});
  const std::string l = "{pool=\"rx\",queue=\"frames \\\"a\\\"\"}";
  EXPECT_TRUE(absl::StrContains(text,
                                "# TYPE bufpool_admission_queue_length gauge\n"
                                "bufpool_admission_queue_length" +
                                    l + " 1\n"))
      << text;
  EXPECT_TRUE(
      absl::StrContains(text, "bufpool_admission_granted_buffers" + l + " 8\n"))
      << text;
  EXPECT_TRUE(absl::StrContains(
      text, "bufpool_admission_capacity_buffers" + l + " 8\n"))
      << text;
  EXPECT_TRUE(
      absl::StrContains(text, "bufpool_admission_grants_total" + l + " 1\n"))
      << text;
  EXPECT_TRUE(absl::StrContains(
      text, "# TYPE bufpool_admission_refusals_total counter\n"))
      << text;
  EXPECT_TRUE(absl::StrContains(text, "bufpool_admission_oldest_wait_seconds"))
      << text;
  held.Reset();
  waiting.Reset();
}

// ---- The splitter's frame size --------------------------------------------

TEST(AdmissionTest, FrameSizeIsKnownOnceTheHeaderIsIn) {
  auto pool = MakePool(16);
  BufferChain in(*pool);
  LengthPrefixSplitter split{.max_frame = 70000};
  auto none = split.FrameSize(in);
  ASSERT_TRUE(none.ok());
  EXPECT_FALSE(none->has_value());
  const unsigned char header[] = {0x00, 0x00, 0xc3, 0x50};  // 50000
  ASSERT_TRUE(in.Append(absl::MakeConstSpan(
                            reinterpret_cast<const std::byte*>(header), 3))
                  .ok());
  EXPECT_FALSE(split.FrameSize(in)->has_value());
  ASSERT_TRUE(in.Append(absl::MakeConstSpan(
                            reinterpret_cast<const std::byte*>(header) + 3, 1))
                  .ok());
  auto size = split.FrameSize(in);
  ASSERT_TRUE(size.ok());
  ASSERT_TRUE(size->has_value());
  EXPECT_EQ(**size, 50004u);
  auto next = split.Next(in);  // the frame itself is not all in yet
  ASSERT_TRUE(next.ok());
  EXPECT_FALSE(next->has_value());
  LengthPrefixSplitter tight{.max_frame = 1000};
  auto too_long = tight.FrameSize(in);
  ASSERT_FALSE(too_long.ok());
  EXPECT_EQ(too_long.status().code(), absl::StatusCode::kOutOfRange);
  EXPECT_EQ(in.size(), 4u);  // unchanged
}

// ---- Threads ----------------------------------------------------------------

// The pattern for a loop on its own thread (epoll or io_uring): on_grant
// writes an eventfd the loop waits on; the loop then sees granted().
TEST(AdmissionTest, AGrantWakesALoopOnAnotherThreadThroughAnEventfd) {
  auto pool = MakePool(64);
  auto q = MakeQueue(*pool,
                     {.name = "q", .capacity_buffers = 8, .slack_buffers = 0});
  auto holder = MakeBudget(*pool, "holder", 8);
  auto waiter = MakeBudget(*pool, "waiter", 8);
  Admission held;
  ASSERT_TRUE(*q->Request(*holder, 8 * kBs, held, nullptr));
  const int efd = eventfd(0, EFD_CLOEXEC);
  ASSERT_GE(efd, 0);
  Admission a;
  std::atomic<bool> asked{false};
  bool woke_granted = false;
  std::thread loop([&] {
    absl::StatusOr<bool> now = q->Request(*waiter, 4 * kBs, a, [efd] {
      const uint64_t one = 1;
      (void)!write(efd, &one, sizeof(one));
    });
    ASSERT_TRUE(now.ok());
    ASSERT_FALSE(*now);
    asked = true;
    pollfd p{efd, POLLIN, 0};
    ASSERT_EQ(poll(&p, 1, 10000), 1);
    uint64_t v;
    ASSERT_EQ(read(efd, &v, sizeof(v)), 8);
    woke_granted = a.granted();
    a.Reset();
  });
  while (!asked.load()) std::this_thread::yield();
  EXPECT_GT(q->oldest_wait(), absl::ZeroDuration());
  held.Reset();  // on this thread: grants the loop's request
  loop.join();
  close(efd);
  EXPECT_TRUE(woke_granted);
  EXPECT_EQ(q->oldest_wait(), absl::ZeroDuration());
  EXPECT_EQ(q->Stats().granted_buffers, 0u);
}

// Many threads, each its own budget, ask for random sizes, hold the grant a
// moment and give it back (some shrink first, some give up while waiting).
// Checked throughout: the granted buffers never pass the capacity; at the
// end: every request was granted or withdrawn, nothing is left granted.
TEST(AdmissionStressTest, GrantsNeverPassTheCapacityUnderThreads) {
  auto pool = MakePool(256);
  constexpr size_t kCapacity = 40;
  auto q = MakeQueue(*pool, {.name = "stress", .capacity_buffers = kCapacity});
  constexpr int kThreads = 8;
  constexpr int kRounds = 3000;
  std::vector<std::unique_ptr<BufferBudget>> budgets;
  for (int t = 0; t < kThreads; ++t) {
    budgets.push_back(MakeBudget(*pool, "t" + std::to_string(t), 32));
  }
  std::atomic<bool> over{false}, done{false};
  std::atomic<uint64_t> granted_total{0}, withdrawn{0};
  std::vector<std::thread> threads;
  // A metrics reader on its own thread, as a scraper would be.
  std::thread reader([&] {
    while (!done.load()) {
      if (q->Stats().granted_buffers > kCapacity) over = true;
      (void)q->queue_length();
      (void)q->oldest_wait();
      std::this_thread::yield();
    }
  });
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      std::mt19937 rng(1000 + t);
      Admission a;
      std::atomic<int> notified{0};
      for (int r = 0; r < kRounds; ++r) {
        const size_t bytes = rng() % (20 * kBs);
        absl::StatusOr<bool> now = q->Request(
            *budgets[t], bytes, a,
            [&notified] { notified.fetch_add(1, std::memory_order_relaxed); });
        if (!now.ok()) {
          ADD_FAILURE() << now.status();
          return;
        }
        if (!*now) {
          if (rng() % 8 == 0) {  // gives up
            a.Reset();
            withdrawn.fetch_add(1);
            continue;
          }
          while (!a.granted()) std::this_thread::yield();
        }
        if (q->Stats().granted_buffers > kCapacity) over = true;
        granted_total.fetch_add(1);
        if (rng() % 4 == 0) a.Shrink(bytes / 2);
        if (rng() % 2 == 0) std::this_thread::yield();
        a.Reset();
      }
    });
  }
  for (std::thread& t : threads) t.join();
  done = true;
  reader.join();
  EXPECT_FALSE(over.load());
  const AdmissionStats s = q->Stats();
  EXPECT_EQ(s.granted_buffers, 0u);
  EXPECT_EQ(s.queue_length, 0u);
  EXPECT_EQ(granted_total.load() + withdrawn.load(),
            uint64_t{kThreads} * kRounds);
  EXPECT_LE(s.grants, granted_total.load() + withdrawn.load());
  EXPECT_GE(s.grants, granted_total.load());
}

}  // namespace
}  // namespace bufpool

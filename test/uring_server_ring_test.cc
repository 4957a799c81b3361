// InitServerRing: the ring a single-threaded server gets, on this kernel and
// on kernels that refuse each setup flag (injected through the OS seam).
#include <liburing.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <thread>

#include "bufpool/uring.h"
#include "gtest/gtest.h"
#include "os/uring.h"

namespace bufpool {
namespace {

constexpr unsigned kServerFlags =
    IORING_SETUP_SINGLE_ISSUER | IORING_SETUP_DEFER_TASKRUN |
    IORING_SETUP_COOP_TASKRUN | IORING_SETUP_SUBMIT_ALL | IORING_SETUP_CQSIZE;

// A kernel that refuses (EINVAL) every flag in g_refuse, and records the
// flags and completion-queue size of each call.
unsigned g_refuse = 0;
int g_calls = 0;
unsigned g_last_cq_entries = 0;
int RefusingInit(unsigned entries, io_uring* ring, io_uring_params* p) {
  ++g_calls;
  g_last_cq_entries = p->cq_entries;
  if ((p->flags & g_refuse) != 0) return -EINVAL;
  return os::RealUringSyscalls().uring_queue_init_params(entries, ring, p);
}

class InitServerRingTest : public ::testing::Test {
 protected:
  void SetUp() override {
    g_refuse = 0;
    g_calls = 0;
    table_.uring_queue_init_params = RefusingInit;
  }
  os::UringSyscallTable table_ = os::RealUringSyscalls();
};

// A nop submitted and reaped on the creating thread.
void ExpectNopRoundTrip(io_uring* ring) {
  io_uring_sqe* sqe = io_uring_get_sqe(ring);
  ASSERT_NE(sqe, nullptr);
  io_uring_prep_nop(sqe);
  io_uring_sqe_set_data64(sqe, 42);
  ASSERT_EQ(io_uring_submit_and_wait(ring, 1), 1);
  io_uring_cqe* cqe = nullptr;
  ASSERT_EQ(io_uring_peek_cqe(ring, &cqe), 0);
  EXPECT_EQ(cqe->user_data, 42u);
  EXPECT_EQ(cqe->res, 0);
  io_uring_cqe_seen(ring, cqe);
}

TEST_F(InitServerRingTest, ThisKernelGetsEveryFlag) {
  io_uring ring;
  absl::StatusOr<ServerRingSetup> setup = InitServerRing(&ring);
  ASSERT_TRUE(setup.ok()) << setup.status();
  // Kernel 6.1 and later have all five.
  EXPECT_EQ(setup->flags, kServerFlags) << setup->Describe();
  EXPECT_EQ(setup->refused, 0u);
  EXPECT_EQ(setup->Describe(),
            "DEFER_TASKRUN|SINGLE_ISSUER|COOP_TASKRUN|SUBMIT_ALL|CQSIZE");
  EXPECT_EQ(ring.flags & kServerFlags, kServerFlags);
  EXPECT_EQ(ring.cq.ring_entries, 8 * 256u);  // the default: 8 x entries
  EXPECT_TRUE(EnableServerRing(&ring).ok());  // not disabled: nothing to do
  ExpectNopRoundTrip(&ring);
  io_uring_queue_exit(&ring);
}

TEST_F(InitServerRingTest, OnlyTheCreatingThreadMaySubmit) {
  io_uring ring;
  absl::StatusOr<ServerRingSetup> setup = InitServerRing(&ring, {.entries = 8});
  ASSERT_TRUE(setup.ok()) << setup.status();
  int other = 0;
  std::thread([&] {
    io_uring_prep_nop(io_uring_get_sqe(&ring));
    other = io_uring_submit(&ring);
  }).join();
  EXPECT_EQ(other, -EEXIST);  // SINGLE_ISSUER: the kernel refuses the stranger
  io_uring_queue_exit(&ring);
}

TEST_F(InitServerRingTest, StartDisabledIsEnabledByTheLoopThread) {
  io_uring ring;
  absl::StatusOr<ServerRingSetup> setup =
      InitServerRing(&ring, {.entries = 8, .start_disabled = true});
  ASSERT_TRUE(setup.ok()) << setup.status();
  EXPECT_NE(setup->flags & IORING_SETUP_R_DISABLED, 0u);
  // Disabled: nothing may be submitted yet; the nop stays queued.
  io_uring_sqe* sqe = io_uring_get_sqe(&ring);
  io_uring_prep_nop(sqe);
  io_uring_sqe_set_data64(sqe, 7);
  EXPECT_LT(io_uring_submit(&ring), 0);
  std::thread([&] {
    ASSERT_TRUE(EnableServerRing(&ring).ok());
    ASSERT_EQ(io_uring_submit_and_wait(&ring, 1), 1);
    io_uring_cqe* cqe = nullptr;
    ASSERT_EQ(io_uring_peek_cqe(&ring, &cqe), 0);
    EXPECT_EQ(cqe->user_data, 7u);
    io_uring_cqe_seen(&ring, cqe);
    ExpectNopRoundTrip(&ring);
    // Enabled once: a second call is the kernel's error, named.
    absl::Status again = EnableServerRing(&ring);
    EXPECT_FALSE(again.ok());
    EXPECT_NE(again.message().find("ENABLE_RINGS"), absl::string_view::npos)
        << again;
  }).join();
  io_uring_queue_exit(&ring);
}

// Each flag refused in turn, as an older kernel would: the ring is still
// created, without that flag (and without DEFER_TASKRUN when SINGLE_ISSUER
// goes: it needs it), and the result names what was refused.
TEST_F(InitServerRingTest, FallsBackFlagByFlag) {
  struct Case {
    unsigned refuse;
    unsigned expect_flags;
    const char* describe;
  };
  const Case cases[] = {
      {IORING_SETUP_DEFER_TASKRUN, kServerFlags & ~IORING_SETUP_DEFER_TASKRUN,
       "SINGLE_ISSUER|COOP_TASKRUN|SUBMIT_ALL|CQSIZE (refused: DEFER_TASKRUN)"},
      {IORING_SETUP_SINGLE_ISSUER,
       IORING_SETUP_COOP_TASKRUN | IORING_SETUP_SUBMIT_ALL |
           IORING_SETUP_CQSIZE,
       "COOP_TASKRUN|SUBMIT_ALL|CQSIZE (refused: DEFER_TASKRUN|SINGLE_ISSUER)"},
      {IORING_SETUP_COOP_TASKRUN, IORING_SETUP_SUBMIT_ALL | IORING_SETUP_CQSIZE,
       "SUBMIT_ALL|CQSIZE (refused: "
       "DEFER_TASKRUN|SINGLE_ISSUER|COOP_TASKRUN)"},
      {IORING_SETUP_SUBMIT_ALL, IORING_SETUP_CQSIZE,
       "CQSIZE (refused: DEFER_TASKRUN|SINGLE_ISSUER|COOP_TASKRUN|SUBMIT_ALL)"},
      {IORING_SETUP_CQSIZE, 0,
       "none (refused: "
       "DEFER_TASKRUN|SINGLE_ISSUER|COOP_TASKRUN|SUBMIT_ALL|CQSIZE)"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.describe);
    g_refuse = c.refuse;
    g_calls = 0;
    os::ScopedUringSyscalls seam(&table_);
    io_uring ring;
    absl::StatusOr<ServerRingSetup> setup = InitServerRing(&ring);
    ASSERT_TRUE(setup.ok()) << setup.status();
    EXPECT_EQ(setup->flags, c.expect_flags);
    EXPECT_EQ(setup->refused, kServerFlags & ~c.expect_flags);
    EXPECT_EQ(setup->Describe(), c.describe);
    EXPECT_EQ(ring.flags & kServerFlags, c.expect_flags);
    // One try, then one more per flag dropped.
    EXPECT_EQ(g_calls, 1 + __builtin_popcount(setup->refused));
    ExpectNopRoundTrip(&ring);
    io_uring_queue_exit(&ring);
  }
}

TEST_F(InitServerRingTest, CompletionQueueSizeIsAsked) {
  os::ScopedUringSyscalls seam(&table_);
  io_uring ring;
  absl::StatusOr<ServerRingSetup> setup =
      InitServerRing(&ring, {.entries = 16, .cq_entries = 1024});
  ASSERT_TRUE(setup.ok()) << setup.status();
  EXPECT_EQ(g_last_cq_entries, 1024u);
  EXPECT_EQ(ring.cq.ring_entries, 1024u);
  io_uring_queue_exit(&ring);
}

TEST_F(InitServerRingTest, BadOptionsAreNamed) {
  io_uring ring;
  absl::StatusOr<ServerRingSetup> zero = InitServerRing(&ring, {.entries = 0});
  EXPECT_EQ(zero.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(zero.status().message().find("entries 0 must be 1 to 32768"),
            absl::string_view::npos)
      << zero.status();
  absl::StatusOr<ServerRingSetup> big =
      InitServerRing(&ring, {.entries = 65536});
  EXPECT_EQ(big.status().code(), absl::StatusCode::kInvalidArgument);
  absl::StatusOr<ServerRingSetup> small =
      InitServerRing(&ring, {.entries = 64, .cq_entries = 8});
  EXPECT_EQ(small.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(small.status().message().find("cq_entries 8 must be 64"),
            absl::string_view::npos)
      << small.status();
}

// An error other than EINVAL is the kernel's answer, not a missing flag: no
// fallback, the call and the system's words in the message.
int DisabledInit(unsigned, io_uring*, io_uring_params*) {
  ++g_calls;
  return -EPERM;
}

TEST_F(InitServerRingTest, OtherErrorsAreReturnedAtOnce) {
  table_.uring_queue_init_params = DisabledInit;
  os::ScopedUringSyscalls seam(&table_);
  io_uring ring;
  absl::StatusOr<ServerRingSetup> setup = InitServerRing(&ring);
  EXPECT_EQ(setup.status().code(), absl::StatusCode::kPermissionDenied)
      << setup.status();
  EXPECT_EQ(g_calls, 1);
  EXPECT_NE(setup.status().message().find("io_uring_queue_init_params"),
            absl::string_view::npos)
      << setup.status();
}

}  // namespace
}  // namespace bufpool

namespace bufpool {
namespace {

// A ring's objects destroyed on another thread than a SINGLE_ISSUER ring's
// own: the kernel refuses to unregister the buffer group, so the lent
// buffers stay out of the pool (the kernel may still write them), and the
// destructor says why in one line instead of handing them out again.
TEST(ServerRingTest, ARingDestroyedOffItsThreadKeepsItsLentBuffersOut) {
  io_uring ring;
  absl::StatusOr<ServerRingSetup> setup = InitServerRing(&ring);
  ASSERT_TRUE(setup.ok()) << setup.status();
  if (!(setup->flags & IORING_SETUP_SINGLE_ISSUER)) {
    io_uring_queue_exit(&ring);
    GTEST_SKIP() << "no SINGLE_ISSUER here: " << setup->Describe();
  }
  // Never destroyed: it keeps buffers the kernel could still write.
  static BufferPool* const pool = [] {
    auto p = BufferPool::Create({.buffer_count = 64});
    return p.ok() ? p->release() : nullptr;
  }();
  ASSERT_NE(pool, nullptr);
  auto br = ProvidedBufferRing::Create(
      &ring, *pool, {.max_buffers = 8, .initial_buffers = 8});
  ASSERT_TRUE(br.ok()) << br.status();
  EXPECT_EQ(pool->Stats().in_use, 8u);
  testing::internal::CaptureStderr();
  std::thread([&] { br->reset(); }).join();
  const std::string said = testing::internal::GetCapturedStderr();
  EXPECT_NE(said.find("io_uring_unregister_buf_ring failed"), std::string::npos)
      << said;
  EXPECT_NE(said.find("its 8 lent buffers stay out of the pool"),
            std::string::npos)
      << said;
  EXPECT_EQ(pool->Stats().in_use, 8u);  // none handed out under the kernel
  io_uring_queue_exit(&ring);
}

}  // namespace
}  // namespace bufpool

// FixedBuffers against the real io_uring: the region split at 1 GiB, reads
// into a buffer past the first GiB, and the RLIMIT_MEMLOCK error.
#include <fcntl.h>
#include <linux/capability.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "bufpool/uring.h"
#include "gtest/gtest.h"
#include "test_util.h"
#include "uring_test_util.h"

namespace bufpool {
namespace {

using testing_util::Ring;
using testing_util::UniqueFd;

// A temporary file holding `data`, opened for reading; none on failure.
UniqueFd TempFileWith(const std::string& data) {
  char path[] = "/tmp/uring_fixed_test.XXXXXX";
  UniqueFd fd(mkstemp(path));
  if (!fd.valid()) return fd;
  unlink(path);
  if (write(fd.get(), data.data(), data.size()) !=
      static_cast<ssize_t>(data.size())) {
    return UniqueFd();
  }
  return fd;
}

TEST(FixedBuffersTest, SmallPoolIsOneRegisteredBuffer) {
  Ring ring(8, 0);
  ASSERT_TRUE(ring.ok());
  auto pool = BufferPool::Create({.buffer_count = 64});
  ASSERT_TRUE(pool.ok()) << pool.status();
  auto fixed = FixedBuffers::Register(ring.get(), **pool);
  ASSERT_TRUE(fixed.ok()) << fixed.status();
  EXPECT_EQ(fixed->count(), 1u);
  EXPECT_EQ(fixed->size(), (*pool)->region().size());
  Buffer b = (*pool)->TryAcquire();
  EXPECT_EQ(fixed->IndexOf(b.data()), 0);
  int outside = 0;
  EXPECT_EQ(fixed->IndexOf(&outside), -1);
  EXPECT_EQ(fixed->IndexOf((*pool)->region().data() + (*pool)->region().size()),
            -1);
}

TEST(FixedBuffersTest, RegionAboveOneGibIsSplitAndReadFixedWorksPastIt) {
  Ring ring(8, 0);
  ASSERT_TRUE(ring.ok());
  constexpr size_t kGib = size_t{1} << 30;
  constexpr size_t kBufferSize = 64 * 1024;
  // 1 GiB + 4 MiB: two registered buffers.
  auto pool =
      BufferPool::Create({.buffer_size = kBufferSize,
                          .buffer_count = (kGib + (4 << 20)) / kBufferSize});
  ASSERT_TRUE(pool.ok()) << pool.status();
  auto fixed = FixedBuffers::Register(ring.get(), **pool);
  ASSERT_TRUE(fixed.ok()) << fixed.status();
  EXPECT_EQ(fixed->count(), 2u);

  // Hold every buffer, so the ones wanted are ours to write.
  std::vector<Buffer> all((*pool)->capacity());
  ASSERT_EQ((*pool)->TryAcquireBulk(absl::MakeSpan(all)), all.size());
  const uint32_t first_slot = 3;
  const uint32_t far_slot = kGib / kBufferSize + 17;  // past the first GiB
  std::byte* near = (*pool)->SlotData(first_slot);
  std::byte* far = (*pool)->SlotData(far_slot);
  EXPECT_EQ(fixed->IndexOf(near), 0);
  EXPECT_EQ(fixed->IndexOf(far), 1);
  EXPECT_EQ(fixed->IndexOf(far + kBufferSize - 1), 1);

  std::string data(kBufferSize, '\0');
  for (size_t i = 0; i < data.size(); ++i) data[i] = static_cast<char>(i * 7);
  const UniqueFd file = TempFileWith(data);
  const int fd = file.get();
  ASSERT_GE(fd, 0);
  std::memset(far, 0, kBufferSize);
  io_uring_sqe* sqe = io_uring_get_sqe(ring.get());
  io_uring_prep_read_fixed(sqe, fd, far, kBufferSize, 0, fixed->IndexOf(far));
  ASSERT_EQ(io_uring_submit_and_wait(ring.get(), 1), 1);
  io_uring_cqe* cqe = nullptr;
  ASSERT_EQ(io_uring_peek_cqe(ring.get(), &cqe), 0);
  EXPECT_EQ(cqe->res, static_cast<int>(kBufferSize));
  io_uring_cqe_seen(ring.get(), cqe);
  EXPECT_EQ(std::memcmp(far, data.data(), kBufferSize), 0);

  // The wrong index (the first GiB's buffer) is refused by the kernel: the
  // split is real.
  sqe = io_uring_get_sqe(ring.get());
  io_uring_prep_read_fixed(sqe, fd, far, kBufferSize, 0, 0);
  ASSERT_EQ(io_uring_submit_and_wait(ring.get(), 1), 1);
  ASSERT_EQ(io_uring_peek_cqe(ring.get(), &cqe), 0);
  EXPECT_EQ(cqe->res, -EFAULT);
  io_uring_cqe_seen(ring.get(), cqe);
}

TEST(FixedBuffersTest, SecondTableOnOneRingIsRefusedClearly) {
  Ring ring(8, 0);
  ASSERT_TRUE(ring.ok());
  auto pool = BufferPool::Create({.buffer_count = 16});
  ASSERT_TRUE(pool.ok());
  auto first = FixedBuffers::Register(ring.get(), **pool);
  ASSERT_TRUE(first.ok()) << first.status();
  auto second = FixedBuffers::Register(ring.get(), **pool);
  ASSERT_FALSE(second.ok());
  EXPECT_NE(second.status().message().find("already has fixed buffers"),
            std::string::npos)
      << second.status();
  // Moving keeps one registration; unregistering frees the ring's table.
  FixedBuffers moved = *std::move(first);
  moved.Unregister();
  EXPECT_EQ(moved.count(), 0u);
  auto again = FixedBuffers::Register(ring.get(), **pool);
  EXPECT_TRUE(again.ok()) << again.status();
}

// Root may pin any amount (CAP_IPC_LOCK), so this runs in a child that
// drops the capability and lowers RLIMIT_MEMLOCK before registering. The
// ring is created first: without the capability the kernel charges the
// ring's own pages to the user's locked memory, which other root processes
// (tests running beside this one) may already have filled past 64 KiB.
[[noreturn]] void RegisterWithoutPrivilegeAndReport() {
  Ring ring(8, 0);
  if (!ring.ok()) {
    std::fprintf(stderr, "no ring\n");
    std::exit(2);
  }
  __user_cap_header_struct hdr{_LINUX_CAPABILITY_VERSION_3, 0};
  __user_cap_data_struct data[2] = {};
  syscall(SYS_capget, &hdr, data);
  data[0].effective &= ~(1u << CAP_IPC_LOCK);
  syscall(SYS_capset, &hdr, data);
  rlimit lim{64 * 1024, 64 * 1024};
  setrlimit(RLIMIT_MEMLOCK, &lim);
  auto pool = BufferPool::Create({.buffer_count = 256});  // 1 MiB
  if (!pool.ok()) std::exit(3);
  auto fixed = FixedBuffers::Register(ring.get(), **pool);
  if (fixed.ok()) {
    std::fprintf(stderr, "unexpectedly registered\n");
    std::exit(1);
  }
  std::fprintf(stderr, "%s\n", fixed.status().ToString().c_str());
  std::exit(fixed.status().code() == absl::StatusCode::kResourceExhausted ? 0
                                                                          : 4);
}

TEST(FixedBuffersTest, MemlockLimitIsNamedBeforeRegistering) {
  EXPECT_EXIT(RegisterWithoutPrivilegeAndReport(), testing::ExitedWithCode(0),
              "needs 1048576 bytes .*RLIMIT_MEMLOCK is 64 KiB.*ulimit -l 1024");
}

// An elastic pool: a sparse table whose entries IndexOf() fills in, so a
// buffer the pool grew into after Register() is read into like any other,
// and no Trim() takes pages the kernel holds.
TEST(FixedBuffersTest, ReadFixedIntoABufferOfAGrownPartOfAnElasticPool) {
  Ring ring(8, 0);
  ASSERT_TRUE(ring.ok());
  auto pool = BufferPool::Create({.buffer_size = 4096,
                                  .buffer_count = 64,
                                  .huge_pages = HugePages::kNever,
                                  .max_buffer_count = 16384,
                                  .grow_step = 64});
  ASSERT_TRUE(pool.ok()) << pool.status();
  auto fixed = FixedBuffers::Register(ring.get(), **pool);
  ASSERT_TRUE(fixed.ok()) << fixed.status();
  EXPECT_EQ(fixed->count(), (*pool)->region().size() / (*pool)->chunk_bytes());
  std::vector<Buffer> held(1000);  // grows well past what was registered
  ASSERT_EQ((*pool)->TryAcquireBulk(absl::MakeSpan(held)), 1000u);
  ASSERT_GE((*pool)->Stats().grows, 1u);

  std::string data(4096, '\0');
  for (size_t i = 0; i < data.size(); ++i) data[i] = static_cast<char>(i * 13);
  UniqueFd file = TempFileWith(data);
  const int fd = file.get();
  ASSERT_GE(fd, 0);
  for (Buffer* b : {&held[10], &held[999]}) {  // the first part; a grown one
    std::memset(b->data(), 0, 4096);
    const int index = fixed->IndexOf(b->data());
    ASSERT_GE(index, 0);
    EXPECT_EQ(static_cast<size_t>(index),
              (b->data() - (*pool)->region().data()) / (*pool)->chunk_bytes());
    io_uring_sqe* sqe = io_uring_get_sqe(ring.get());
    io_uring_prep_read_fixed(sqe, fd, b->data(), 4096, 0, index);
    ASSERT_EQ(io_uring_submit_and_wait(ring.get(), 1), 1);
    io_uring_cqe* cqe = nullptr;
    ASSERT_EQ(io_uring_peek_cqe(ring.get(), &cqe), 0);
    EXPECT_EQ(cqe->res, 4096);
    io_uring_cqe_seen(ring.get(), cqe);
    EXPECT_EQ(std::memcmp(b->data(), data.data(), 4096), 0);
  }
  // An entry not filled in yet is empty: the kernel refuses it.
  io_uring_sqe* sqe = io_uring_get_sqe(ring.get());
  io_uring_prep_read_fixed(sqe, fd, held[500].data(), 4096, 0,
                           static_cast<int>(fixed->count() - 1));
  ASSERT_EQ(io_uring_submit_and_wait(ring.get(), 1), 1);
  io_uring_cqe* cqe = nullptr;
  ASSERT_EQ(io_uring_peek_cqe(ring.get(), &cqe), 0);
  EXPECT_LT(cqe->res, 0);
  io_uring_cqe_seen(ring.get(), cqe);
  file.reset();

  // Registered: nothing is trimmed; unregistered: the free part goes.
  held.resize(100);
  (*pool)->FlushCaches();
  EXPECT_EQ((*pool)->Trim(0), 0u);
  fixed->Unregister();
  EXPECT_GT((*pool)->Trim(0), 0u);
}

}  // namespace
}  // namespace bufpool

// The pool's system calls go through the OS seam (os/syscalls.h), so each
// can fail on demand: the per-CPU caches' area (mmap, madvise, munmap), the
// CPU a locked cache is chosen by (sched_getcpu), the eventfd notice
// (write), the drains' fence (membarrier) and mlock. Each failure is a
// Status from Create(), or is survived, as its comment says.
#include <errno.h>
#include <linux/membarrier.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <vector>

#include "bufpool/buffer_pool.h"
#include "gtest/gtest.h"
#include "os/syscalls.h"
#include "pool/pool_internal.h"
#include "test_util.h"

namespace bufpool {
namespace {

using testing_util::MakePool;

bool RseqMode() {
  const PerCpuMode m = MakePool({.buffer_count = 64})->per_cpu_mode();
  return m == PerCpuMode::kRseq || m == PerCpuMode::kRseqMmCid;
}

// The length of the per-CPU caches' area (rseq mode): a 4 KiB cache per
// CPU and one page more (cpu_cache.cc).
size_t CachesAreaBytes() {
  return internal::rseq::kCacheStride * (PoolAccess::CpuCount() + 1);
}

std::atomic<int> g_calls{0};
std::atomic<size_t> g_len{0};

TEST(PoolOsTest,
     CreateReturnsResourceExhaustedWhenTheCachesAreaCannotBeMapped) {
  if (!RseqMode()) GTEST_SKIP() << "the locked caches map no area";
  os::SyscallTable table = os::RealSyscalls();
  table.mmap = [](void* addr, size_t len, int prot, int flags, int fd,
                  off_t off) -> void* {
    if (len == CachesAreaBytes()) {
      g_calls.fetch_add(1);
      errno = ENOMEM;
      return MAP_FAILED;
    }
    return ::mmap(addr, len, prot, flags, fd, off);
  };
  g_calls = 0;
  absl::StatusOr<std::unique_ptr<BufferPool>> pool;
  {
    const os::ScopedSyscalls seam(&table);
    pool = BufferPool::Create({.buffer_count = 1024,
                               .huge_pages = HugePages::kNever,
                               .populate = false});
  }
  EXPECT_EQ(g_calls.load(), 1);
  ASSERT_FALSE(pool.ok());
  EXPECT_EQ(pool.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(pool.status().message().find("per-CPU caches"),
            absl::string_view::npos)
      << pool.status();
  // The failed Create() left nothing behind: the next one works.
  EXPECT_TRUE(BufferPool::Create({.buffer_count = 1024}).ok());
}

TEST(PoolOsTest, AFailedNoHugePageAdviceForTheCachesAreaIsHarmless) {
  if (!RseqMode()) GTEST_SKIP() << "the locked caches map no area";
  os::SyscallTable table = os::RealSyscalls();
  table.madvise = [](void* addr, size_t len, int advice) {
    if (advice == MADV_NOHUGEPAGE) {
      g_calls.fetch_add(1);
      g_len = len;
      errno = EINVAL;  // THP compiled out
      return -1;
    }
    return ::madvise(addr, len, advice);
  };
  g_calls = 0;
  std::unique_ptr<BufferPool> pool;
  {
    const os::ScopedSyscalls seam(&table);
    pool = MakePool({.buffer_count = 256});
  }
  EXPECT_EQ(g_calls.load(), 1);
  EXPECT_EQ(g_len.load(), CachesAreaBytes());
  std::vector<Buffer> all(256);
  EXPECT_EQ(pool->TryAcquireBulk(absl::MakeSpan(all)), 256u);
  all.clear();
  EXPECT_EQ(pool->Stats().in_use, 0u);
}

TEST(PoolOsTest, TheCachesAreaIsUnmappedThroughTheSeam) {
  if (!RseqMode()) GTEST_SKIP() << "the locked caches map no area";
  os::SyscallTable table = os::RealSyscalls();
  table.munmap = [](void* addr, size_t len) {
    if (len == CachesAreaBytes()) g_calls.fetch_add(1);
    return ::munmap(addr, len);
  };
  g_calls = 0;
  auto pool = MakePool({.buffer_count = 256});
  {
    const os::ScopedSyscalls seam(&table);
    pool.reset();
  }
  EXPECT_EQ(g_calls.load(), 1);
}

// The locked caches: a thread's cache is the one sched_getcpu() names; an
// answer of -1 (failure) or past the CPUs still picks a cache, and every
// buffer stays reachable.
TEST(PoolOsTest, LockedCachesSurviveAFailingOrStrangeCpuNumber) {
  if (RseqMode()) GTEST_SKIP() << "the rseq caches read the rseq area";
  os::SyscallTable table = os::RealSyscalls();
  table.sched_getcpu = [] {
    const int n = g_calls.fetch_add(1);
    if (n % 3 == 0) {
      errno = ENOSYS;
      return -1;
    }
    return n % 3 == 1 ? 100000 : 1;
  };
  g_calls = 0;
  auto pool = MakePool({.buffer_count = 256, .cache_size = 8});
  const os::ScopedSyscalls seam(&table);
  for (int round = 0; round < 3; ++round) {
    std::vector<Buffer> all;
    for (int i = 0; i < 256; ++i) {
      all.push_back(pool->TryAcquire());
      ASSERT_TRUE(all.back()) << "round " << round << " buffer " << i;
    }
    EXPECT_FALSE(pool->TryAcquire());
  }
  EXPECT_GT(g_calls.load(), 0);
  EXPECT_EQ(pool->Stats().in_use, 0u);
}

// NotifyWhenFree's write to the eventfd: an EINTR is retried, so the
// notice arrives.
TEST(PoolOsTest, TheEventfdNoticeIsRetriedAfterEintr) {
  os::SyscallTable table = os::RealSyscalls();
  table.write = [](int fd, const void* buf, size_t n) -> ssize_t {
    if (g_calls.fetch_add(1) == 0) {
      errno = EINTR;
      return -1;
    }
    return ::write(fd, buf, n);
  };
  g_calls = 0;
  auto pool = MakePool({.buffer_count = 64, .cache_size = 4});
  std::vector<Buffer> all(64);
  ASSERT_EQ(pool->TryAcquireBulk(absl::MakeSpan(all)), 64u);
  const testing_util::UniqueFd event(::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC));
  const int efd = event.get();
  ASSERT_GE(efd, 0);
  ASSERT_TRUE(pool->NotifyWhenFree(efd).ok());
  {
    const os::ScopedSyscalls seam(&table);
    all[0].Reset();
  }
  EXPECT_EQ(g_calls.load(), 2);
  uint64_t value = 0;
  EXPECT_EQ(::read(efd, &value, sizeof(value)),
            static_cast<ssize_t>(sizeof(value)));
  EXPECT_EQ(value, 1u);
}

// The drains' fence: a refusal with EPERM (a fork() child, whose
// registration the kernel dropped) registers again and fences; the drain
// completes.
TEST(PoolOsTest, ADrainRegistersAgainWhenTheFenceIsRefused) {
  if (!RseqMode()) GTEST_SKIP() << "the locked caches fence nothing";
  os::SyscallTable table = os::RealSyscalls();
  table.membarrier = [](int cmd, unsigned flags, int cpu) -> long {
    if (cmd == MEMBARRIER_CMD_PRIVATE_EXPEDITED_RSEQ &&
        g_calls.fetch_add(1) == 0) {
      errno = EPERM;
      return -1;
    }
    return os::RealSyscalls().membarrier(cmd, flags, cpu);
  };
  g_calls = 0;
  auto pool = MakePool({.buffer_count = 256, .cache_size = 16});
  Buffer b = pool->TryAcquire();
  b.Reset();
  ASSERT_GT(pool->Stats().cached, 0u);
  {
    const os::ScopedSyscalls seam(&table);
    pool->FlushCaches();
  }
  EXPECT_GE(g_calls.load(), 2);
  EXPECT_EQ(pool->Stats().cached, 0u);
}

// mlock through the seam: a refusal is ResourceExhausted naming the limit.
TEST(PoolOsTest, ALockRefusedByTheKernelIsResourceExhausted) {
  os::SyscallTable table = os::RealSyscalls();
  table.mlock = [](const void*, size_t) {
    errno = ENOMEM;
    return -1;
  };
  const os::ScopedSyscalls seam(&table);
  absl::StatusOr<std::unique_ptr<BufferPool>> pool =
      BufferPool::Create({.buffer_count = 16,
                          .huge_pages = HugePages::kNever,
                          .lock_memory = true});
  ASSERT_FALSE(pool.ok());
  EXPECT_EQ(pool.status().code(), absl::StatusCode::kResourceExhausted)
      << pool.status();
  EXPECT_NE(pool.status().message().find("RLIMIT_MEMLOCK"),
            absl::string_view::npos)
      << pool.status();
}

}  // namespace
}  // namespace bufpool

// A pool shared by processes: joining by fork() and by SCM_RIGHTS, tokens
// (forged, stale, imported twice), death and ReclaimDead(), and the kill
// loop: a child killed with SIGKILL at random moments while it acquires,
// caches, exports, imports and releases, after which every buffer is back
// exactly once. BUFPOOL_KILL_LOOP=N runs N kills instead of the short CI
// form (and prints how long each ReclaimDead() took).
#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "bufpool/buffer_pool.h"
#include "bufpool/metrics.h"
#include "gtest/gtest.h"
#include "pool/pool_internal.h"
#include "test_util.h"

namespace bufpool {
namespace {

std::unique_ptr<BufferPool> MakeShared(size_t count = 64, size_t cache = 8) {
  PoolOptions o;
  o.buffer_size = 4096;
  o.buffer_count = count;
  o.cache_size = cache;
  o.shared = true;
  auto pool = BufferPool::Create(o);
  EXPECT_TRUE(pool.ok()) << pool.status();
  return pool.ok() ? std::move(*pool) : nullptr;
}

// What a buffer's owner writes at its start, checked before it lets go.
struct Stamp {
  uint32_t magic;
  int32_t pid;
  uint32_t slot;
  uint32_t seq;
};
constexpr uint32_t kStampMagic = 0x5354414d;

void StampBuffer(const Buffer& b, uint32_t seq) {
  const Stamp s{kStampMagic, static_cast<int32_t>(::getpid()), b.slot(), seq};
  std::memcpy(b.data(), &s, sizeof(s));
}
bool StampIsMine(const Buffer& b) {
  Stamp s;
  std::memcpy(&s, b.data(), sizeof(s));
  return s.magic == kStampMagic && s.pid == ::getpid() && s.slot == b.slot();
}

// The shared state's invariants, read from the ledger (the test sees
// src/): every kFree slot exactly once in the shared depot and nothing
// else there; no slot owned or exported by an entry that is empty.
// Holds the shared mutex, so other processes may run meanwhile (their
// Export and Import change no free word).
void ExpectLedgerConsistent(BufferPool& pool) {
  ProcessShare& x = *PoolAccess::S(pool).xproc;
  // A victim killed while it held the mutex is repaired here, as by any
  // locker.
  PoolAccess::LockSharedState(pool);
  struct Unlock {
    BufferPool& pool;
    ~Unlock() { PoolAccess::UnlockSharedState(pool); }
  } unlock{pool};
  const size_t n = pool.capacity();
  std::vector<int> in_depot(n, 0);
  for (uint32_t k = 0; k < x.hdr->depot_count; ++k) {
    ASSERT_LT(x.depot[k], n);
    ++in_depot[x.depot[k]];
  }
  size_t free_words = 0;
  for (uint32_t s = 0; s < n; ++s) {
    const uint64_t w = x.ledger[s].load();
    if (ledger::Kind(w) == ledger::kFree) {
      ++free_words;
      EXPECT_EQ(in_depot[s], 1)
          << "free slot " << s << " in the depot " << in_depot[s] << " times";
    } else {
      EXPECT_EQ(in_depot[s], 0) << "owned slot " << s << " in the depot";
      EXPECT_NE(x.procs[ledger::Proc(w)].state.load(), ProcessEntry::kEmpty)
          << "slot " << s << " owned by an empty entry " << ledger::Proc(w);
    }
  }
  EXPECT_EQ(free_words, x.hdr->depot_count);
}

// Takes every buffer the process can get: each slot must come once.
std::vector<Buffer> TakeAll(BufferPool& pool) {
  std::vector<Buffer> all;
  std::vector<int> seen(pool.capacity(), 0);
  for (;;) {
    Buffer b = pool.TryAcquire();
    if (!b) break;
    EXPECT_EQ(seen[b.slot()]++, 0) << "slot " << b.slot() << " twice";
    all.push_back(std::move(b));
  }
  return all;
}

int WaitExit(pid_t pid) {
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  return status;
}

TEST(SharedPoolTest, CreatesASealedMemfd) {
  auto pool = MakeShared();
  ASSERT_NE(pool, nullptr);
  const int fd = pool->shared_fd();
  ASSERT_GE(fd, 0);
  const int seals = ::fcntl(fd, F_GET_SEALS);
  EXPECT_EQ(seals & (F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL),
            F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL);
  EXPECT_NE(::ftruncate(fd, 4096), 0);  // sealed against shrinking
  PoolStats st = pool->Stats();
  EXPECT_EQ(st.processes, 1u);
  EXPECT_EQ(st.reclaimed, 0u);
  EXPECT_EQ(st.capacity, 64u);
  {
    std::vector<Buffer> all = TakeAll(*pool);
    EXPECT_EQ(all.size(), 64u);
    EXPECT_EQ(pool->Stats().in_use, 64u);
  }
  EXPECT_EQ(pool->Stats().in_use, 0u);
  {
    // A bulk call takes batch after batch from the shared depot.
    std::vector<Buffer> bulk(64);
    EXPECT_EQ(pool->TryAcquireBulk(absl::MakeSpan(bulk)), 64u);
    pool->ReleaseBulk(absl::MakeSpan(bulk));
  }
  ExpectLedgerConsistent(*pool);
}

TEST(SharedPoolTest, MetricsNameTheProcess) {
  auto pool = MakeShared();
  ASSERT_NE(pool, nullptr);
  std::string text;
  WriteMetrics(*pool, &text, {.name = "rx"});
  const std::string me =
      "pool=\"rx\",process=\"" + std::to_string(::getpid()) + "\"";
  EXPECT_NE(text.find("bufpool_pool_processes{" + me + "} 1\n"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("bufpool_pool_reclaimed_total{" + me + "} 0\n"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("bufpool_pool_buffers{" + me + ",state=\"in_use\"} 0"),
            std::string::npos)
      << text;
}

TEST(SharedPoolTest, HoldersReportNamesTheProcess) {
  auto pool = MakeShared();
  ASSERT_NE(pool, nullptr);
  Buffer b = pool->TryAcquire();
  const std::string report = pool->HoldersReport();
  EXPECT_NE(report.find("bufpool: 1 of 64 buffer(s) out in process pid " +
                        std::to_string(::getpid()) + " (shared pool)"),
            std::string::npos)
      << report;
}

TEST(SharedPoolTest, AProcessGivesBackWhatItsDepotDoesNotNeed) {
  for (size_t cache : {size_t{0}, size_t{8}}) {
    auto pool = MakeShared(256, cache);
    ASSERT_NE(pool, nullptr);
    auto joined = BufferPool::Join(pool->shared_fd());
    ASSERT_TRUE(joined.ok());
    {
      std::vector<Buffer> all(256);
      ASSERT_EQ(pool->TryAcquireBulk(absl::MakeSpan(all)), 256u);
      pool->ReleaseBulk(absl::MakeSpan(all));
    }
    pool->FlushCaches();
    pool->TryAcquire().Reset();  // a release that finds the depot full
    // Past four batches it gives back down to two: the other gets the rest.
    const size_t kept = pool->Stats().committed;
    EXPECT_LE(kept, 2 * 32 + 1u) << "cache " << cache;
    EXPECT_EQ(TakeAll(**joined).size(), 256 - kept) << "cache " << cache;
  }
}

// A process that takes most of the pool in a burst, releases it all and
// then idles keeps at most its caches and max(batch, capacity / (4 x
// processes)) in its depot: the other process gets all the rest.
TEST(SharedPoolTest, AnIdleProcessAfterABurstKeepsOnlyItsCachesAndAShare) {
  SKIP_FORKED_JOIN_UNDER_TSAN();
  constexpr size_t kCount = 256;
  auto pool = MakeShared(kCount, 64);  // batch 32 (= kCount / 8)
  ASSERT_NE(pool, nullptr);
  int p[2];
  ASSERT_EQ(::pipe(p), 0);
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    ::close(p[0]);
    auto joined = BufferPool::Join(pool->shared_fd());
    if (!joined.ok()) _exit(2);
    {
      std::vector<Buffer> all = TakeAll(**joined);  // the burst
      if (all.size() != kCount) _exit(3);
    }  // every buffer released
    const PoolStats st = (*joined)->Stats();
    const size_t report[2] = {st.committed, st.cached};
    if (::write(p[1], report, sizeof(report)) != sizeof(report)) _exit(4);
    for (;;) ::pause();  // idle, never releasing again
  }
  ::close(p[1]);
  size_t report[2] = {0, 0};
  ASSERT_EQ(::read(p[0], report, sizeof(report)),
            static_cast<ssize_t>(sizeof(report)));
  ::close(p[0]);
  const size_t kept = report[0], cached = report[1];
  const size_t share = std::max<size_t>(32, kCount / (4 * 2));
  EXPECT_LE(kept, cached + share) << "cached " << cached;
  EXPECT_EQ(TakeAll(*pool).size(), kCount - kept);
  ::kill(child, SIGKILL);
  WaitExit(child);
  EXPECT_GE(pool->ReclaimDead(), kept);
}

TEST(SharedPoolTest, PrivatePoolHasNoFd) {
  auto pool = BufferPool::Create({.buffer_count = 16});
  ASSERT_TRUE(pool.ok());
  EXPECT_EQ((*pool)->shared_fd(), -1);
  EXPECT_EQ((*pool)->ReclaimDead(), 0u);
  EXPECT_EQ((*pool)->Stats().processes, 1u);
}

TEST(SharedPoolTest, RefusesElasticAndRequiredHugePages) {
  PoolOptions o;
  o.buffer_count = 64;
  o.max_buffer_count = 128;
  o.shared = true;
  auto pool = BufferPool::Create(o);
  ASSERT_FALSE(pool.ok());
  EXPECT_EQ(pool.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(pool.status().message().find("max_buffer_count"),
            absl::string_view::npos)
      << pool.status();
  o.max_buffer_count = 0;
  o.huge_pages = HugePages::kRequire;
  pool = BufferPool::Create(o);
  ASSERT_FALSE(pool.ok());
  EXPECT_NE(pool.status().message().find("kRequire"), absl::string_view::npos)
      << pool.status();
}

TEST(SharedPoolTest, JoinRefusesWhatIsNotAPool) {
  auto r = BufferPool::Join(-1);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  int p[2];
  ASSERT_EQ(::pipe(p), 0);
  r = BufferPool::Join(p[0]);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("not a shared pool"),
            absl::string_view::npos)
      << r.status();
  ::close(p[0]);
  ::close(p[1]);
  const int mfd = ::memfd_create("other", MFD_CLOEXEC);
  ASSERT_GE(mfd, 0);
  ASSERT_EQ(::ftruncate(mfd, 1 << 20), 0);
  r = BufferPool::Join(mfd);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("no bufpool header"),
            absl::string_view::npos)
      << r.status();
  ::close(mfd);
}

TEST(SharedPoolTest, JoinRefusesAnotherLayoutVersion) {
  auto pool = MakeShared();
  ASSERT_NE(pool, nullptr);
  auto* h = static_cast<SharedHeader*>(::mmap(
      nullptr, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, pool->shared_fd(), 0));
  ASSERT_NE(h, MAP_FAILED);
  h->version = kSharedVersion + 1;
  auto r = BufferPool::Join(pool->shared_fd());
  h->version = kSharedVersion;
  ::munmap(h, 4096);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(r.status().message().find("version"), absl::string_view::npos)
      << r.status();
  EXPECT_EQ(pool->Stats().processes, 1u);
}

// A header with the magic whose buffer_size x buffer_count wraps around
// 2^64 to the real region's size: every offset would match the file.
TEST(SharedPoolTest, JoinRefusesAHeaderWhoseSizesOverflow) {
  auto pool = MakeShared(64, 8);
  ASSERT_NE(pool, nullptr);
  auto* h = static_cast<SharedHeader*>(::mmap(
      nullptr, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, pool->shared_fd(), 0));
  ASSERT_NE(h, MAP_FAILED);
  const uint64_t real = h->buffer_size;
  h->buffer_size = real + (uint64_t{1} << 58);  // x 64 wraps to real x 64
  auto r = BufferPool::Join(pool->shared_fd());
  h->buffer_size = real;
  ::munmap(h, 4096);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("corrupt"), absl::string_view::npos)
      << r.status();
  EXPECT_EQ(pool->Stats().processes, 1u);
}

TEST(SharedPoolTest, TwoJoinsInOneProcessShareTheSlots) {
  auto a = MakeShared(32, 4);
  ASSERT_NE(a, nullptr);
  auto joined = BufferPool::Join(a->shared_fd());
  ASSERT_TRUE(joined.ok()) << joined.status();
  BufferPool& b = **joined;
  EXPECT_EQ(b.capacity(), 32u);
  EXPECT_EQ(b.buffer_size(), 4096u);
  EXPECT_EQ(a->Stats().processes, 2u);
  EXPECT_NE(b.shared_fd(), a->shared_fd());  // its own dup
  // Between them, every slot once; a token moves one across.
  std::vector<Buffer> from_a = TakeAll(*a);
  std::vector<Buffer> from_b = TakeAll(b);
  EXPECT_EQ(from_a.size() + from_b.size(), 32u);
  std::vector<int> seen(32, 0);
  for (const Buffer& x : from_a) ++seen[x.slot()];
  for (const Buffer& x : from_b) ++seen[x.slot()];
  for (int s : seen) EXPECT_EQ(s, 1);
  ASSERT_FALSE(from_a.empty());
  std::memcpy(from_a.back().data(), "hello", 6);
  const uint32_t slot = from_a.back().slot();
  const BufferToken t = a->Export(std::move(from_a.back()));
  from_a.pop_back();
  auto imported = b.Import(t);
  ASSERT_TRUE(imported.ok()) << imported.status();
  EXPECT_EQ(imported->slot(), slot);
  EXPECT_STREQ(reinterpret_cast<const char*>(imported->data()), "hello");
  from_b.push_back(std::move(*imported));
  from_a.clear();
  from_b.clear();
  EXPECT_EQ(a->Stats().in_use, 0u);
  EXPECT_EQ(b.Stats().in_use, 0u);
  joined->reset();
  EXPECT_EQ(a->Stats().processes, 1u);
  ExpectLedgerConsistent(*a);
  EXPECT_EQ(TakeAll(*a).size(), 32u);
}

TEST(SharedPoolTest, ForgedStaleAndTwiceImportedTokensAreRefused) {
  auto pool = MakeShared();
  ASSERT_NE(pool, nullptr);
  Buffer b = pool->TryAcquire();
  ASSERT_TRUE(b);
  const uint32_t slot = b.slot();
  const BufferToken t = pool->Export(std::move(b));
  EXPECT_FALSE(b);
  ASSERT_NE(t.value, 0u);
  const PoolStats before = pool->Stats();
  auto expect_refused = [&](BufferToken bad, absl::StatusCode code) {
    auto r = pool->Import(bad);
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.status().code(), code) << r.status();
    const PoolStats after = pool->Stats();
    EXPECT_EQ(after.in_use, before.in_use);
    EXPECT_EQ(after.committed, before.committed);
  };
  expect_refused(BufferToken{}, absl::StatusCode::kInvalidArgument);
  expect_refused(BufferToken{(uint64_t{1} << 32) | 64},  // slot out of range
                 absl::StatusCode::kInvalidArgument);
  expect_refused(BufferToken{t.value + (uint64_t{1} << 32)},  // wrong gen
                 absl::StatusCode::kFailedPrecondition);
  expect_refused(BufferToken{(t.value & ~uint64_t{0xffffffff}) |
                             ((slot + 1) % 64)},  // never exported
                 absl::StatusCode::kFailedPrecondition);
  auto first = pool->Import(t);
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_EQ(first->slot(), slot);
  auto twice = pool->Import(t);
  ASSERT_FALSE(twice.ok());
  EXPECT_EQ(twice.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(twice.status().message().find("imported already"),
            absl::string_view::npos)
      << twice.status();
  // Exported again: the old token is stale, the new one works once.
  const BufferToken t2 = pool->Export(std::move(*first));
  EXPECT_NE(t2.value, t.value);
  auto stale = pool->Import(t);
  ASSERT_FALSE(stale.ok());
  EXPECT_NE(stale.status().message().find("stale"), absl::string_view::npos);
  auto again = pool->Import(t2);
  ASSERT_TRUE(again.ok());
  again->Reset();
  EXPECT_EQ(pool->Stats().in_use, 0u);
  ExpectLedgerConsistent(*pool);
}

TEST(SharedPoolTest, PrivatePoolExportsWithinTheProcess) {
  auto pool = BufferPool::Create({.buffer_count = 16, .cache_size = 0});
  ASSERT_TRUE(pool.ok());
  Buffer b = (*pool)->TryAcquire();
  const uint32_t slot = b.slot();
  const BufferToken t = (*pool)->Export(std::move(b));
  EXPECT_EQ((*pool)->Stats().in_use, 1u);  // out, as a token
  auto r = (*pool)->Import(t);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->slot(), slot);
  EXPECT_FALSE((*pool)->Import(t).ok());
  r->Reset();
  EXPECT_EQ((*pool)->Stats().in_use, 0u);
}

// A private pool pays for its export ledger only once it exports: the
// first Export allocates it (threads racing install one, the others free
// theirs); an Import before any Export is refused, not a crash.
TEST(SharedPoolTest, PrivatePoolAllocatesItsLedgerAtTheFirstExport) {
  auto pool = BufferPool::Create({.buffer_count = 64, .cache_size = 4});
  ASSERT_TRUE(pool.ok());
  EXPECT_EQ(PoolAccess::S(**pool).local_ledger.Load(), nullptr);
  auto early = (*pool)->Import(BufferToken{(uint64_t{1} << 32) | 3});
  ASSERT_FALSE(early.ok());
  EXPECT_EQ(early.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(PoolAccess::S(**pool).local_ledger.Load(), nullptr);
  constexpr int kThreads = 8;
  std::vector<BufferToken> tokens(kThreads);
  std::atomic<int> ready{0};
  {
    std::vector<std::thread> threads;
    for (int i = 0; i < kThreads; ++i) {
      threads.emplace_back([&, i] {
        Buffer b = (*pool)->TryAcquire();
        ready.fetch_add(1);
        while (ready.load() < kThreads) {
        }
        tokens[i] = (*pool)->Export(std::move(b));
      });
    }
    for (std::thread& t : threads) t.join();
  }
  EXPECT_NE(PoolAccess::S(**pool).local_ledger.Load(), nullptr);
  for (const BufferToken& t : tokens) {
    auto r = (*pool)->Import(t);
    ASSERT_TRUE(r.ok()) << r.status();
  }
  EXPECT_EQ((*pool)->Stats().in_use, 0u);
}

TEST(SharedPoolTest, ForkedChildJoinsAndHandsABufferBack) {
  SKIP_FORKED_JOIN_UNDER_TSAN();
  auto pool = MakeShared();
  ASSERT_NE(pool, nullptr);
  // The parent holds some, with slots cached: the child must not get them.
  std::vector<Buffer> mine;
  for (int i = 0; i < 10; ++i) {
    mine.push_back(pool->TryAcquire());
    StampBuffer(mine.back(), 1);
  }
  int p[2];
  ASSERT_EQ(::pipe(p), 0);
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    ::close(p[0]);
    auto joined = BufferPool::Join(pool->shared_fd());
    if (!joined.ok()) _exit(2);
    std::vector<Buffer> got;
    for (int i = 0; i < 20; ++i) {
      Buffer b = (*joined)->TryAcquire();
      if (!b) _exit(3);
      StampBuffer(b, 2);
      got.push_back(std::move(b));
    }
    std::memcpy(got[0].data() + 64, "from the child", 15);
    const BufferToken t = (*joined)->Export(std::move(got[0]));
    if (::write(p[1], &t, sizeof(t)) != sizeof(t)) _exit(4);
    for (size_t i = 1; i < got.size(); ++i) {
      if (!StampIsMine(got[i])) _exit(5);
    }
    got.clear();
    joined->reset();  // leaves: its slots back, its token still valid
    _exit(0);
  }
  ::close(p[1]);
  BufferToken t;
  ASSERT_EQ(::read(p[0], &t, sizeof(t)), static_cast<ssize_t>(sizeof(t)));
  ::close(p[0]);
  const int status = WaitExit(child);
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
  for (const Buffer& b : mine) EXPECT_TRUE(StampIsMine(b));
  auto imported = pool->Import(t);
  ASSERT_TRUE(imported.ok()) << imported.status();
  EXPECT_STREQ(reinterpret_cast<const char*>(imported->data() + 64),
               "from the child");
  imported->Reset();
  mine.clear();
  // The child left with a token out: its entry stays until the token is
  // imported and someone reclaims the (now empty) entry.
  pool->ReclaimDead();
  EXPECT_EQ(pool->Stats().processes, 1u);
  ExpectLedgerConsistent(*pool);
  EXPECT_EQ(TakeAll(*pool).size(), 64u);
}

TEST(SharedPoolTest, JoinsThroughAUnixSocket) {
  int sv[2];
  ASSERT_EQ(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
  // The child is forked before the pool exists: it can only join through
  // the descriptor it receives.
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    ::close(sv[0]);
    char byte;
    iovec iov{&byte, 1};
    alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))];
    msghdr msg{};
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control;
    msg.msg_controllen = sizeof(control);
    if (::recvmsg(sv[1], &msg, MSG_CMSG_CLOEXEC) != 1) _exit(2);
    const cmsghdr* c = CMSG_FIRSTHDR(&msg);
    if (c == nullptr || c->cmsg_type != SCM_RIGHTS) _exit(3);
    int fd;
    std::memcpy(&fd, CMSG_DATA(c), sizeof(fd));
    auto joined = BufferPool::Join(fd);
    ::close(fd);
    if (!joined.ok()) _exit(4);
    Buffer b = (*joined)->TryAcquire();
    if (!b) _exit(5);
    std::memcpy(b.data(), "over the socket", 16);
    const BufferToken t = (*joined)->Export(std::move(b));
    if (::write(sv[1], &t, sizeof(t)) != sizeof(t)) _exit(6);
    joined->reset();
    _exit(0);
  }
  ::close(sv[1]);
  auto pool = MakeShared();
  ASSERT_NE(pool, nullptr);
  char byte = 'f';
  iovec iov{&byte, 1};
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))] = {};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  msg.msg_control = control;
  msg.msg_controllen = sizeof(control);
  cmsghdr* c = CMSG_FIRSTHDR(&msg);
  c->cmsg_level = SOL_SOCKET;
  c->cmsg_type = SCM_RIGHTS;
  c->cmsg_len = CMSG_LEN(sizeof(int));
  const int fd = pool->shared_fd();
  std::memcpy(CMSG_DATA(c), &fd, sizeof(fd));
  ASSERT_EQ(::sendmsg(sv[0], &msg, 0), 1);
  BufferToken t;
  ASSERT_EQ(::read(sv[0], &t, sizeof(t)), static_cast<ssize_t>(sizeof(t)));
  ::close(sv[0]);
  ASSERT_EQ(WaitExit(child), 0);
  auto imported = pool->Import(t);
  ASSERT_TRUE(imported.ok()) << imported.status();
  EXPECT_STREQ(reinterpret_cast<const char*>(imported->data()),
               "over the socket");
}

TEST(SharedPoolTest, ExitWithBuffersOutIsReclaimedAndCounted) {
  SKIP_FORKED_JOIN_UNDER_TSAN();
  auto pool = MakeShared(64, 8);
  ASSERT_NE(pool, nullptr);
  int p[2];
  ASSERT_EQ(::pipe(p), 0);
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    ::close(p[0]);
    auto joined = BufferPool::Join(pool->shared_fd());
    if (!joined.ok()) _exit(2);
    BufferPool& j = **joined;
    std::vector<Buffer> held;
    for (int i = 0; i < 12; ++i) held.push_back(j.TryAcquire());
    std::byte* raw = j.TryAcquireRaw();
    (void)raw;
    const BufferToken t = j.Export(j.TryAcquire());
    held.resize(6);  // some back to its caches
    if (::write(p[1], &t, sizeof(t)) != sizeof(t)) _exit(3);
    // Exits without destroying anything (_exit runs no destructor):
    // handles, a raw pointer, cached slots and a token out.
    _exit(0);
  }
  ::close(p[1]);
  BufferToken t;
  ASSERT_EQ(::read(p[0], &t, sizeof(t)), static_cast<ssize_t>(sizeof(t)));
  ::close(p[0]);
  ASSERT_EQ(WaitExit(child), 0);
  EXPECT_EQ(pool->Stats().processes, 2u);  // dead, not yet reclaimed
  const size_t got = pool->ReclaimDead();
  EXPECT_GE(got, 8u);  // 6 handles, the raw pointer, the token, + cached
  EXPECT_EQ(pool->Stats().reclaimed, got);
  EXPECT_EQ(pool->Stats().processes, 1u);
  EXPECT_EQ(pool->ReclaimDead(), 0u);  // twice is harmless
  auto stale = pool->Import(t);        // the dead exporter's token went stale
  ASSERT_FALSE(stale.ok());
  EXPECT_EQ(stale.status().code(), absl::StatusCode::kFailedPrecondition);
  ExpectLedgerConsistent(*pool);
  EXPECT_EQ(TakeAll(*pool).size(), 64u);
}

// A joined process P forks a child C that does not join and outlives P:
// C must not keep P's liveness lock, or P's death goes unseen.
TEST(SharedPoolTest, AForkedChildDoesNotKeepItsDeadParentAlive) {
  SKIP_FORKED_JOIN_UNDER_TSAN();
  auto pool = MakeShared(64, 8);
  ASSERT_NE(pool, nullptr);
  int p[2];
  ASSERT_EQ(::pipe(p), 0);
  const pid_t parent = ::fork();
  ASSERT_GE(parent, 0);
  if (parent == 0) {
    ::close(p[0]);
    auto joined = BufferPool::Join(pool->shared_fd());
    if (!joined.ok()) _exit(2);
    std::vector<Buffer> held;
    for (int i = 0; i < 5; ++i) held.push_back((*joined)->TryAcquire());
    const pid_t c = ::fork();
    if (c < 0) _exit(3);
    if (c == 0) {
      for (;;) ::pause();  // lives on, joins nothing; killed by the test
    }
    if (::write(p[1], &c, sizeof(c)) != sizeof(c)) _exit(4);
    for (;;) ::pause();  // killed by the test with buffers out
  }
  ::close(p[1]);
  pid_t c = 0;
  ASSERT_EQ(::read(p[0], &c, sizeof(c)), static_cast<ssize_t>(sizeof(c)));
  ::close(p[0]);
  ASSERT_GT(c, 0);
  ASSERT_EQ(::kill(parent, SIGKILL), 0);
  const int status = WaitExit(parent);
  EXPECT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL) << status;
  ASSERT_EQ(::kill(c, 0), 0) << "the grandchild should still live";
  EXPECT_GE(pool->ReclaimDead(), 5u);  // P's 5 buffers (and its caches)
  EXPECT_EQ(pool->Stats().processes, 1u);
  ::kill(c, SIGKILL);  // init reaps it
  ExpectLedgerConsistent(*pool);
  EXPECT_EQ(TakeAll(*pool).size(), 64u);
}

TEST(SharedPoolTest, SlowPathReclaimsTheDeadWhenTheDepotIsEmpty) {
  SKIP_FORKED_JOIN_UNDER_TSAN();
  auto pool = MakeShared(32, 0);
  ASSERT_NE(pool, nullptr);
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    auto joined = BufferPool::Join(pool->shared_fd());
    if (!joined.ok()) _exit(2);
    std::vector<Buffer> all = TakeAll(**joined);
    _exit(all.empty() ? 3 : 0);  // with every buffer out
  }
  ASSERT_EQ(WaitExit(child), 0);
  std::this_thread::sleep_for(std::chrono::milliseconds(2));
  Buffer b = pool->TryAcquire();  // empty depot: reclaims, then takes
  EXPECT_TRUE(b);
  EXPECT_EQ(pool->Stats().reclaimed, 32u);
}

TEST(SharedPoolTest, AcquireWaitsForAnotherProcessToGiveBack) {
  SKIP_FORKED_JOIN_UNDER_TSAN();
  auto pool = MakeShared(16, 0);
  ASSERT_NE(pool, nullptr);
  int p[2];
  ASSERT_EQ(::pipe(p), 0);
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    ::close(p[0]);
    auto joined = BufferPool::Join(pool->shared_fd());
    if (!joined.ok()) _exit(2);
    {
      std::vector<Buffer> all = TakeAll(**joined);
      if (all.size() != 16) _exit(3);
      const char c = 'x';
      if (::write(p[1], &c, 1) != 1) _exit(4);
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    joined->reset();  // leaves: everything back to the shared depot
    _exit(0);
  }
  ::close(p[1]);
  char c;
  ASSERT_EQ(::read(p[0], &c, 1), 1);
  ::close(p[0]);
  EXPECT_FALSE(pool->TryAcquire());
  auto b = pool->Acquire(absl::Seconds(10));
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ(WaitExit(child), 0);
}

using SharedPoolDeathTest = ::testing::Test;

TEST(SharedPoolDeathTest, ReleasingAnotherProcessesBufferNamesBoth) {
  SKIP_FORKED_JOIN_UNDER_TSAN();
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_DEATH(
      {
        auto pool = MakeShared();
        int p[2];
        if (::pipe(p) != 0) std::abort();
        const pid_t child = ::fork();
        if (child == 0) {
          ::close(p[0]);
          auto joined = BufferPool::Join(pool->shared_fd());
          if (!joined.ok()) _exit(2);
          std::byte* raw = (*joined)->TryAcquireRaw();
          const uint32_t slot = (*joined)->SlotOf(raw);
          if (::write(p[1], &slot, sizeof(slot)) != sizeof(slot)) _exit(3);
          // Lives until the parent dies.
          ::prctl(PR_SET_PDEATHSIG, SIGKILL);
          if (::getppid() == 1) _exit(0);
          ::pause();
          _exit(0);
        }
        ::close(p[1]);
        uint32_t slot = 0;
        if (::read(p[0], &slot, sizeof(slot)) != sizeof(slot)) std::abort();
        pool->ReleaseRaw(pool->SlotData(slot));
      },
      "released in process pid [0-9]+ .*ledger says process pid [0-9]+ .*"
      "owns it");
}

TEST(SharedPoolDeathTest, AForkedChildMayNotUseItsParentsPool) {
  SKIP_FORKED_JOIN_UNDER_TSAN();
  auto pool = MakeShared();
  ASSERT_NE(pool, nullptr);
  // The parent caches slots: a child using its copy would own them twice.
  pool->TryAcquire().Reset();
  GTEST_FLAG_SET(death_test_style, "fast");  // the child is a fork() child
  EXPECT_DEATH(pool->TryAcquire().Reset(),
               "a fork\\(\\) child must BufferPool::Join\\(shared_fd\\(\\)\\)");
  EXPECT_DEATH(pool->ReclaimDead(), "must BufferPool::Join");
  // The parent's pool is untouched.
  Buffer b = pool->TryAcquire();
  EXPECT_TRUE(b);
  ExpectLedgerConsistent(*pool);
}

// One kill: a child that joins and works the pool at random until it is
// killed at a random moment. Its stamps catch a buffer owned twice while
// it lives (exit 5: a stamp changed under it).
[[noreturn]] void Worker(int fd, uint32_t seed, int ready_fd) {
  auto joined = BufferPool::Join(fd);
  if (!joined.ok()) _exit(2);
  if (ready_fd >= 0) {
    const char c = 'r';
    if (::write(ready_fd, &c, 1) != 1) _exit(7);
  }
  BufferPool& pool = **joined;
  std::mt19937 rng(seed);
  std::vector<Buffer> held;
  std::vector<BufferToken> tokens;
  uint32_t seq = 0;
  Buffer bulk[8];
  for (;;) {
    switch (rng() % 7) {
      case 0:
      case 1: {
        Buffer b = pool.TryAcquire();
        if (b) {
          StampBuffer(b, ++seq);
          held.push_back(std::move(b));
        }
        break;
      }
      case 2:
        if (!held.empty()) {
          const size_t i = rng() % held.size();
          if (!StampIsMine(held[i])) _exit(5);
          std::swap(held[i], held.back());
          held.pop_back();
        }
        break;
      case 3:
        if (!held.empty()) {
          if (!StampIsMine(held.back())) _exit(5);
          tokens.push_back(pool.Export(std::move(held.back())));
          held.pop_back();
        }
        break;
      case 4:
        if (!tokens.empty() && (tokens.size() > 8 || rng() % 2 == 0)) {
          auto b = pool.Import(tokens.back());
          tokens.pop_back();
          if (!b.ok()) _exit(6);
          if (!StampIsMine(*b)) _exit(5);
          held.push_back(std::move(*b));
        }
        break;
      case 5: {
        const size_t n = pool.TryAcquireBulk(absl::MakeSpan(bulk));
        for (size_t i = 0; i < n; ++i) {
          StampBuffer(bulk[i], ++seq);
          held.push_back(std::move(bulk[i]));
        }
        break;
      }
      case 6: {
        std::byte* raw = pool.TryAcquireRaw();
        if (raw != nullptr) pool.ReleaseRaw(raw);
        break;
      }
    }
    if (held.size() > 40) {
      for (size_t i = 20; i < held.size(); ++i) {
        if (!StampIsMine(held[i])) _exit(5);
      }
      held.resize(20);
    }
  }
}

void KillLoop(size_t kills, size_t cache_size) {
  SKIP_FORKED_JOIN_UNDER_TSAN();
  if (const char* n = std::getenv("BUFPOOL_KILL_LOOP")) kills = std::atoi(n);
  constexpr size_t kCount = 256;
  auto pool = MakeShared(kCount, cache_size);
  ASSERT_NE(pool, nullptr);
  std::mt19937 rng(59);
  std::vector<double> reclaim_us;
  // A survivor works beside the victims the whole time: a slot handed to
  // two owners shows as a changed stamp there (exit 5).
  int ready[2];
  ASSERT_EQ(::pipe(ready), 0);
  char c;
  const pid_t survivor = ::fork();
  ASSERT_GE(survivor, 0);
  if (survivor == 0) Worker(pool->shared_fd(), 1, ready[1]);
  ASSERT_EQ(::read(ready[0], &c, 1), 1);
  for (size_t k = 0; k < kills; ++k) {
    const pid_t victim = ::fork();
    ASSERT_GE(victim, 0);
    if (victim == 0) {
      Worker(pool->shared_fd(), static_cast<uint32_t>(k + 2), ready[1]);
    }
    // Most victims are killed while they work; one in 8 at any moment
    // from its fork on, joining included.
    if (k % 8 != 0) {
      ASSERT_EQ(::read(ready[0], &c, 1), 1);
    }
    std::this_thread::sleep_for(std::chrono::microseconds(rng() % 2000));
    ASSERT_EQ(::kill(victim, SIGKILL), 0);
    const int status = WaitExit(victim);
    ASSERT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL)
        << "victim " << k << " exited by itself: " << status;
    if (k % 8 == 0) {
      // It may have said it was ready before it died: drain that.
      const int fl = ::fcntl(ready[0], F_GETFL);
      ::fcntl(ready[0], F_SETFL, fl | O_NONBLOCK);
      while (::read(ready[0], &c, 1) == 1) {
      }
      ::fcntl(ready[0], F_SETFL, fl);
    }
    const auto t0 = std::chrono::steady_clock::now();
    // The survivor's slow path (or the next victim's join) may reclaim
    // first: any live process does; only this process's reclaims are timed.
    if (pool->ReclaimDead() != 0) {
      reclaim_us.push_back(std::chrono::duration<double, std::micro>(
                               std::chrono::steady_clock::now() - t0)
                               .count());
    }
    EXPECT_EQ(pool->Stats().processes, 2u) << "after kill " << k;
    if (::testing::Test::HasFailure()) break;
    ExpectLedgerConsistent(*pool);
  }
  ASSERT_EQ(::kill(survivor, 0), 0) << "the survivor died";
  ASSERT_EQ(::kill(survivor, SIGKILL), 0);
  const int status = WaitExit(survivor);
  ASSERT_TRUE(WIFSIGNALED(status)) << "survivor failed: " << status;
  pool->ReclaimDead();
  EXPECT_EQ(pool->Stats().processes, 1u);
  ExpectLedgerConsistent(*pool);
  // Every buffer back, each once.
  EXPECT_EQ(TakeAll(*pool).size(), kCount);
  std::sort(reclaim_us.begin(), reclaim_us.end());
  if (reclaim_us.empty()) reclaim_us.push_back(0);
  {
    std::printf("repairs after a holder of the mutex died: %llu\n",
                static_cast<unsigned long long>(
                    PoolAccess::S(*pool).xproc->hdr->repairs.load()));
    std::printf(
        "kills %zu, reclaimed %llu buffers (by any process); "
        "%zu reclaims by the test after waitpid(): p50 %.1f us, p99 "
        "%.1f us, max %.1f us\n",
        kills, static_cast<unsigned long long>(pool->Stats().reclaimed),
        reclaim_us.size(), reclaim_us[reclaim_us.size() / 2],
        reclaim_us[reclaim_us.size() * 99 / 100], reclaim_us.back());
  }
}

TEST(SharedPoolTest, KillLoopLosesNothingAndOwnsNothingTwice) {
  KillLoop(150, 16);
}

// Caches off: every release reaches the process's depot, and batches go
// back to the shared one from there.
TEST(SharedPoolTest, KillLoopWithCachesOff) { KillLoop(50, 0); }

// Threads of one process on a shared pool (the paths ThreadSanitizer can
// see): acquire, release, export and import between threads.
// Import racing ReclaimDead: a victim exports stamped buffers and passes
// the tokens through a pipe to a survivor that imports and keeps them,
// while the test kills the victim and reclaims at once, the pipe's backlog
// still being imported. Every token is imported or reclaimed, never both:
// the test then takes every free buffer and stamps it, so a slot the
// survivor imported that the reclaim also freed gets the test's stamp over
// the survivor's (the survivor checks its stamps after that; the ledger
// check would also see it owned while in the depot); and never neither:
// every slot comes back at the end.
TEST(SharedPoolTest, ImportRacingReclaimImportsXorReclaims) {
  SKIP_FORKED_JOIN_UNDER_TSAN();
  constexpr size_t kCount = 256;
  auto pool = MakeShared(kCount, 8);
  ASSERT_NE(pool, nullptr);
  int rounds = 40;
  if (const char* n = std::getenv("BUFPOOL_KILL_LOOP")) rounds = std::atoi(n);
  std::mt19937 rng(59);
  size_t imported_all = 0, refused_all = 0, reclaimed_all = 0;
  for (int round = 0; round < rounds; ++round) {
    SCOPED_TRACE(round);
    int tp[2], rp[2], gp[2];
    ASSERT_EQ(::pipe(tp), 0);
    ASSERT_EQ(::pipe(rp), 0);
    ASSERT_EQ(::pipe(gp), 0);
    const pid_t survivor = ::fork();
    ASSERT_GE(survivor, 0);
    if (survivor == 0) {
      ::close(tp[1]);
      ::close(rp[0]);
      ::close(gp[1]);
      auto joined = BufferPool::Join(pool->shared_fd());
      if (!joined.ok()) _exit(2);
      BufferPool& j = **joined;
      std::vector<Buffer> held;
      size_t counts[2] = {0, 0};  // imported, refused
      BufferToken t;
      while (::read(tp[0], &t, sizeof(t)) == sizeof(t)) {
        auto r = j.Import(t);
        if (!r.ok()) {
          if (r.status().code() != absl::StatusCode::kFailedPrecondition) {
            _exit(3);
          }
          ++counts[1];
          continue;
        }
        Stamp st;
        std::memcpy(&st, r->data(), sizeof(st));
        if (st.magic != kStampMagic || st.slot != r->slot() ||
            st.pid == ::getpid()) {
          _exit(4);  // not the exporter's bytes
        }
        ++counts[0];
        StampBuffer(*r, 0);
        held.push_back(*std::move(r));
      }
      char go;
      if (::read(gp[0], &go, 1) != 1) _exit(6);  // the test has stamped
      for (const Buffer& b : held) {
        if (!StampIsMine(b)) _exit(5);  // owned twice
      }
      if (::write(rp[1], counts, sizeof(counts)) != sizeof(counts)) _exit(6);
      _exit(0);  // the kernel's exit: what it holds is reclaimed
    }
    ::close(gp[0]);
    const pid_t victim = ::fork();
    ASSERT_GE(victim, 0);
    if (victim == 0) {
      ::close(tp[0]);
      ::close(rp[0]);
      ::close(rp[1]);
      ::close(gp[1]);
      auto joined = BufferPool::Join(pool->shared_fd());
      if (!joined.ok()) _exit(2);
      BufferPool& j = **joined;
      for (uint32_t seq = 0;; ++seq) {
        Buffer b = j.TryAcquire();
        if (!b) {
          std::this_thread::yield();
          continue;
        }
        StampBuffer(b, seq);
        const BufferToken t = j.Export(std::move(b));
        if (::write(tp[1], &t, sizeof(t)) != sizeof(t)) _exit(3);
      }
    }
    ::close(tp[0]);
    ::close(tp[1]);  // EOF for the survivor once the victim is dead
    ::close(rp[1]);
    std::this_thread::sleep_for(std::chrono::microseconds(
        std::uniform_int_distribution<int>(100, 3000)(rng)));
    ASSERT_EQ(::kill(victim, SIGKILL), 0);
    WaitExit(victim);
    reclaimed_all += pool->ReclaimDead();  // the survivor still importing
    ExpectLedgerConsistent(*pool);
    std::vector<Buffer> mine = TakeAll(*pool);
    for (const Buffer& b : mine) StampBuffer(b, 1);
    ASSERT_EQ(::write(gp[1], "g", 1), 1);
    ::close(gp[1]);
    size_t counts[2] = {0, 0};
    const ssize_t got = ::read(rp[0], counts, sizeof(counts));
    ::close(rp[0]);
    const int status = WaitExit(survivor);
    // Exit 5: a buffer it imported carries the test's stamp (owned twice).
    ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0)
        << "survivor exit status " << WEXITSTATUS(status);
    ASSERT_EQ(got, static_cast<ssize_t>(sizeof(counts)));
    for (const Buffer& b : mine) EXPECT_TRUE(StampIsMine(b));
    mine.clear();
    imported_all += counts[0];
    refused_all += counts[1];
    reclaimed_all += pool->ReclaimDead();  // the survivor's holdings
    ExpectLedgerConsistent(*pool);
    ASSERT_EQ(TakeAll(*pool).size(), kCount);  // nothing lost
    ASSERT_EQ(pool->Stats().processes, 1u);
  }
  // A refused token's slot was reclaimed (counted among the reclaimed).
  EXPECT_GE(reclaimed_all, refused_all);
  std::fprintf(stderr,
               "import/reclaim race: %d rounds, %zu imported, %zu refused "
               "(reclaimed first), %zu reclaimed in all\n",
               rounds, imported_all, refused_all, reclaimed_all);
}

TEST(SharedPoolTest, ThreadsHandBuffersOverByToken) {
  auto pool = MakeShared(128, 8);
  ASSERT_NE(pool, nullptr);
  auto joined = BufferPool::Join(pool->shared_fd());
  ASSERT_TRUE(joined.ok());
  constexpr int kThreads = 8;
  std::atomic<uint64_t> mailbox[kThreads];
  for (auto& m : mailbox) m.store(0);
  std::atomic<bool> bad{false};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      BufferPool& mine = t % 2 == 0 ? *pool : **joined;
      for (int i = 0; i < 3000; ++i) {
        Buffer b = mine.TryAcquire();
        if (!b) continue;
        std::memset(b.data(), t, 64);
        const BufferToken tok = mine.Export(std::move(b));
        uint64_t old = mailbox[(t + 1) % kThreads].exchange(tok.value);
        if (old != 0) {
          // A token another thread left: import it into our pool view.
          auto got = mine.Import(BufferToken{old});
          if (!got.ok()) {
            bad = true;
            continue;
          }
        }
      }
    });
  }
  for (auto& th : threads) th.join();
  for (auto& m : mailbox) {
    const uint64_t v = m.exchange(0);
    if (v != 0) {
      auto got = pool->Import(BufferToken{v});
      EXPECT_TRUE(got.ok()) << got.status();
    }
  }
  EXPECT_FALSE(bad.load());
  EXPECT_EQ(pool->Stats().in_use, 0u);
  EXPECT_EQ((*joined)->Stats().in_use, 0u);
  joined->reset();
  ExpectLedgerConsistent(*pool);
  EXPECT_EQ(TakeAll(*pool).size(), 128u);
}

}  // namespace
}  // namespace bufpool

// The copy engine: every method copies exactly (sizes, holes, /proc files,
// modes), replaces the destination atomically, and turns every injected
// fault into a byte-identical copy or a clear error that leaves the
// destination untouched and no temporary file behind.
#include "bufpool/file_copy.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <memory>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "os/file.h"
#include "os/syscalls.h"
#include "os/uring.h"
#include "test_util.h"

namespace bufpool {
namespace {

using testing_util::RandomBytes;
using testing_util::ReadFileOrDie;
using testing_util::TempFiles;
using testing_util::UniqueFd;
using testing_util::WriteFileOrDie;

struct MethodCase {
  CopyMethod method;
  bool direct_io;
  const char* name;
};
void PrintTo(const MethodCase& m, std::ostream* os) { *os << m.name; }

const MethodCase kMethods[] = {
    {CopyMethod::kAuto, false, "auto"},
    {CopyMethod::kReadWrite, false, "readwrite"},
    {CopyMethod::kDirect, false, "direct"},
    {CopyMethod::kUring, false, "uring"},
    {CopyMethod::kUring, true, "uring_direct"},
    {CopyMethod::kKernel, false, "kernel"},
};

class CopyTest : public testing::Test {
 protected:
  void SetUp() override {
    const char* base = std::getenv("TMPDIR");
    std::string tmpl =
        std::string(base ? base : "/tmp") + "/bufpool_file_copy_test.XXXXXX";
    ASSERT_NE(mkdtemp(tmpl.data()), nullptr) << std::strerror(errno);
    dir_ = tmpl;
  }
  void TearDown() override {
    std::string cmd = "rm -rf '" + dir_ + "'";
    ASSERT_EQ(std::system(cmd.c_str()), 0);
  }
  std::string Path(const std::string& name) const { return dir_ + "/" + name; }

  // Writes `data` to src, copies it to dst with the io_uring method through
  // `pool`, and checks the bytes and that the copy used fixed buffers.
  static void CopyByUring(BufferPool* pool, const std::string& src,
                          const std::string& dst, const std::string& data) {
    WriteFileOrDie(src, data);
    CopyOptions o;
    o.method = CopyMethod::kUring;
    o.pool = pool;
    absl::StatusOr<CopyStats> r = CopyFile(src, dst, o);
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_TRUE(r->fixed_buffers);
    EXPECT_TRUE(r->fallbacks.empty()) << r->fallbacks[0];
    EXPECT_EQ(ReadFileOrDie(dst), data);
  }

  static CopyOptions Options(const MethodCase& m) {
    CopyOptions o;
    o.method = m.method;
    o.direct_io = m.direct_io;
    return o;
  }

  std::string dir_;
};

class MethodTest : public CopyTest,
                   public testing::WithParamInterface<MethodCase> {};

std::vector<size_t> Sizes() {
  std::vector<size_t> sizes = {0,    1,    511,     512,     4095,
                               4096, 4097, 1048575, 1048576, 1048577};
  std::mt19937 rng(20261130);
  for (int i = 0; i < 16; ++i) sizes.push_back(rng() % (600 * 1024));
  return sizes;
}

TEST_P(MethodTest, CopiesEverySizeExactly) {
  const std::string src = Path("src"), dst = Path("dst");
  // The defaults, and a small batch and queue so many operations cycle.
  for (size_t batch : {size_t{64}, size_t{3}}) {
    for (size_t size : Sizes()) {
      SCOPED_TRACE("size " + std::to_string(size) + " batch " +
                   std::to_string(batch));
      const std::string data = RandomBytes(size, static_cast<uint32_t>(size));
      WriteFileOrDie(src, data);
      CopyOptions o = Options(GetParam());
      o.batch_buffers = batch;
      o.queue_depth = batch == 3 ? 2 : 8;
      absl::StatusOr<CopyStats> stats = CopyFile(src, dst, o);
      ASSERT_TRUE(stats.ok()) << stats.status();
      EXPECT_EQ(ReadFileOrDie(dst), data);
      EXPECT_EQ(stats->bytes_copied, size);
      EXPECT_EQ(stats->file_size, size);
      EXPECT_EQ(stats->destination, dst);
      if (size > 0 && GetParam().method != CopyMethod::kAuto) {
        EXPECT_EQ(stats->method, GetParam().method)
            << (stats->fallbacks.empty() ? "" : stats->fallbacks[0]);
      }
    }
  }
  EXPECT_TRUE(TempFiles(dir_).empty());
}

TEST_P(MethodTest, KeepsHolesOfSparseFiles) {
  const std::string src = Path("sparse"), dst = Path("copy");
  constexpr off_t kSize = 8 << 20;
  const std::string a = RandomBytes(65536, 1), b = RandomBytes(70000, 2),
                    c = RandomBytes(5000, 3);
  {
    const UniqueFd file(open(src.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644));
    const int fd = file.get();
    ASSERT_GE(fd, 0);
    ASSERT_EQ(pwrite(fd, a.data(), a.size(), 0), ssize_t(a.size()));
    ASSERT_EQ(pwrite(fd, b.data(), b.size(), 3 << 20), ssize_t(b.size()));
    ASSERT_EQ(pwrite(fd, c.data(), c.size(), kSize - 5000), ssize_t(c.size()));
  }
  // A file ending in a hole as well.
  const std::string src2 = Path("sparse_tail"), dst2 = Path("copy_tail");
  {
    const UniqueFd file(open(src2.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644));
    const int fd = file.get();
    ASSERT_GE(fd, 0);
    ASSERT_EQ(pwrite(fd, b.data(), b.size(), 1 << 20), ssize_t(b.size()));
    ASSERT_EQ(ftruncate(fd, kSize), 0);
  }
  for (auto [s, d] : {std::pair{src, dst}, std::pair{src2, dst2}}) {
    absl::StatusOr<CopyStats> stats = CopyFile(s, d, Options(GetParam()));
    ASSERT_TRUE(stats.ok()) << stats.status();
    EXPECT_EQ(ReadFileOrDie(d), ReadFileOrDie(s));
    struct stat ss, ds;
    ASSERT_EQ(stat(s.c_str(), &ss), 0);
    ASSERT_EQ(stat(d.c_str(), &ds), 0);
    EXPECT_EQ(ds.st_size, kSize);
    // Holes stay holes: at most a few blocks more (O_DIRECT copies whole
    // 4 KiB blocks at the edges of each data range).
    EXPECT_LE(ds.st_blocks, ss.st_blocks + 64) << "src blocks " << ss.st_blocks;
    EXPECT_LT(ds.st_blocks * 512, kSize / 2);
    EXPECT_LT(stats->bytes_copied, uint64_t{kSize} / 2);
  }
}

TEST_P(MethodTest, ReadsProcFilesToEndOfFile) {
  const std::string dst = Path("version");
  absl::StatusOr<CopyStats> stats =
      CopyFile("/proc/version", dst, Options(GetParam()));
  ASSERT_TRUE(stats.ok()) << stats.status();
  const std::string got = ReadFileOrDie(dst);
  EXPECT_FALSE(got.empty());
  EXPECT_EQ(got, ReadFileOrDie("/proc/version"));
  EXPECT_EQ(stats->method, CopyMethod::kReadWrite);
  if (GetParam().method != CopyMethod::kAuto &&
      GetParam().method != CopyMethod::kReadWrite) {
    ASSERT_FALSE(stats->fallbacks.empty());
    EXPECT_NE(stats->fallbacks[0].find("size 0"), std::string::npos);
  }
}

// A new file gets the source's permission bits under the umask, without
// the set-user-ID, set-group-ID and sticky bits (as cp creates it).
TEST_P(MethodTest, NewFileGetsThePermissionBitsUnderTheUmask) {
  const std::string src = Path("src");
  WriteFileOrDie(src, "mode");
  const mode_t old_umask = umask(022);
  for (mode_t mode : {0751, 0600, 0444, 02755, 04777, 01777}) {
    ASSERT_EQ(chmod(src.c_str(), mode), 0);
    const std::string dst = Path("dst" + std::to_string(mode));
    absl::StatusOr<CopyStats> r = CopyFile(src, dst, Options(GetParam()));
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_TRUE(r->created);
    struct stat st;
    ASSERT_EQ(stat(dst.c_str(), &st), 0);
    EXPECT_EQ(st.st_mode & 07777, mode & 0755) << std::oct << mode;
    EXPECT_EQ(ReadFileOrDie(dst), "mode");
  }
  umask(old_umask);
}

TEST_P(MethodTest, PreserveModeKeepsTheSpecialBits) {
  const std::string src = Path("src");
  WriteFileOrDie(src, "mode");
  const mode_t old_umask = umask(077);
  for (mode_t mode : {0751, 0444, 02755, 04755, 01777}) {
    ASSERT_EQ(chmod(src.c_str(), mode), 0);
    CopyOptions o = Options(GetParam());
    o.preserve_mode = true;
    const std::string dst = Path("dst" + std::to_string(mode));
    ASSERT_TRUE(CopyFile(src, dst, o).ok());
    struct stat st;
    ASSERT_EQ(stat(dst.c_str(), &st), 0);
    EXPECT_EQ(st.st_mode & 07777, mode) << std::oct << mode;
  }
  umask(old_umask);
}

TEST_P(MethodTest, InPlaceWritesIntoTheExistingInode) {
  const std::string src = Path("src"), dst = Path("dst");
  WriteFileOrDie(src, "new");
  WriteFileOrDie(dst, RandomBytes(100000, 9));
  ASSERT_EQ(chmod(dst.c_str(), 0600), 0);
  ASSERT_EQ(link(dst.c_str(), Path("other_name").c_str()), 0);
  UniqueFd old_file(open(dst.c_str(), O_RDONLY));
  const int old_fd = old_file.get();
  ASSERT_GE(old_fd, 0);
  absl::StatusOr<CopyStats> r = CopyFile(src, dst, Options(GetParam()));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->replace, CopyOptions::Replace::kInPlace);
  EXPECT_FALSE(r->created);
  EXPECT_EQ(ReadFileOrDie(dst), "new");
  EXPECT_EQ(ReadFileOrDie(Path("other_name")), "new");  // the link kept
  struct stat old_st, st;
  ASSERT_EQ(fstat(old_fd, &old_st), 0);
  ASSERT_EQ(stat(dst.c_str(), &st), 0);
  EXPECT_EQ(old_st.st_ino, st.st_ino);
  EXPECT_EQ(old_st.st_size, 3);
  EXPECT_EQ(st.st_mode & 07777, 0600u);  // the mode is not widened
  EXPECT_EQ(st.st_nlink, 2u);
  old_file.reset();
  EXPECT_TRUE(TempFiles(dir_).empty());
}

TEST_P(MethodTest, AtomicReplacesAnExistingDestination) {
  const std::string src = Path("src"), dst = Path("dst");
  WriteFileOrDie(src, "new");
  WriteFileOrDie(dst, RandomBytes(100000, 9));
  ASSERT_EQ(chmod(dst.c_str(), 0640), 0);
  UniqueFd old_file(open(dst.c_str(), O_RDONLY));  // sees the old inode
  const int old_fd = old_file.get();
  ASSERT_GE(old_fd, 0);
  CopyOptions o = Options(GetParam());
  o.replace = CopyOptions::Replace::kAtomic;
  absl::StatusOr<CopyStats> r = CopyFile(src, dst, o);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->replace, CopyOptions::Replace::kAtomic);
  EXPECT_EQ(ReadFileOrDie(dst), "new");
  struct stat old_st, st;
  ASSERT_EQ(fstat(old_fd, &old_st), 0);
  EXPECT_EQ(old_st.st_size, 100000);  // replaced by rename, not rewritten
  ASSERT_EQ(stat(dst.c_str(), &st), 0);
  EXPECT_NE(old_st.st_ino, st.st_ino);
  EXPECT_EQ(st.st_mode & 07777, 0640u);  // the old file's mode
  old_file.reset();
  EXPECT_TRUE(TempFiles(dir_).empty());
}

TEST_P(MethodTest, CopiesIntoADestinationDirectory) {
  const std::string src = Path("file.bin");
  ASSERT_EQ(mkdir(Path("into").c_str(), 0755), 0);
  WriteFileOrDie(src, RandomBytes(10000, 4));
  absl::StatusOr<CopyStats> stats =
      CopyFile(src, Path("into"), Options(GetParam()));
  ASSERT_TRUE(stats.ok()) << stats.status();
  EXPECT_EQ(stats->destination, Path("into/file.bin"));
  EXPECT_EQ(ReadFileOrDie(Path("into/file.bin")), ReadFileOrDie(src));
  // With a trailing slash too.
  ASSERT_TRUE(CopyFile(src, Path("into/"), Options(GetParam())).ok());
}

TEST_P(MethodTest, WithFsyncStillCopies) {
  const std::string src = Path("src"), dst = Path("dst");
  WriteFileOrDie(src, RandomBytes(300000, 5));
  CopyOptions o = Options(GetParam());
  o.fsync = true;
  ASSERT_TRUE(CopyFile(src, dst, o).ok());
  EXPECT_EQ(ReadFileOrDie(dst), ReadFileOrDie(src));
}

TEST_P(MethodTest, DrawsFromTheCallersPoolAndReturnsEveryBuffer) {
  PoolOptions po;
  po.buffer_count = 20;  // fewer than batch * queue_depth
  auto pool = BufferPool::Create(po);
  ASSERT_TRUE(pool.ok()) << pool.status();
  const std::string src = Path("src"), dst = Path("dst");
  WriteFileOrDie(src, RandomBytes(777777, 6));
  CopyOptions o = Options(GetParam());
  o.pool = pool->get();
  ASSERT_TRUE(CopyFile(src, dst, o).ok());
  EXPECT_EQ(ReadFileOrDie(dst), ReadFileOrDie(src));
  EXPECT_EQ((*pool)->Stats().in_use, 0u);
}

// A 96-buffer pool (no caches) whose free slots come in runs of two,
// apart from each other: adjacent slots share one iovec (or one io_uring
// operation), the gaps between runs start new ones. Held slots must come
// back untouched. `held` is declared last, so it returns before the pool
// dies.
struct FragmentedPool {
  std::unique_ptr<BufferPool> pool;
  std::vector<Buffer> held;
};

FragmentedPool MakeFragmentedPool() {
  PoolOptions po;
  po.buffer_count = 96;
  po.cache_size = 0;
  auto created = BufferPool::Create(po);
  if (!created.ok()) {
    ADD_FAILURE() << created.status();
    std::abort();
  }
  FragmentedPool f{std::move(*created), {}};
  std::vector<Buffer> all(f.pool->capacity());
  all.resize(f.pool->TryAcquireBulk(absl::MakeSpan(all)));
  for (Buffer& b : all) {
    if (b.slot() % 3 == 2) {
      std::memset(b.data(), 0x5a, b.size());
      f.held.push_back(std::move(b));
    }
  }
  return f;  // the others go back to the pool here
}

TEST_P(MethodTest, CopiesExactlyThroughNonContiguousSlots) {
  FragmentedPool f = MakeFragmentedPool();
  const std::string src = Path("src"), dst = Path("dst");
  for (size_t size : {size_t{4097}, size_t{300001}, size_t{1 << 20}}) {
    SCOPED_TRACE("size " + std::to_string(size));
    WriteFileOrDie(src, RandomBytes(size, static_cast<uint32_t>(size)));
    CopyOptions o = Options(GetParam());
    o.pool = f.pool.get();
    o.batch_buffers = 16;
    absl::StatusOr<CopyStats> r = CopyFile(src, dst, o);
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(ReadFileOrDie(dst), ReadFileOrDie(src));
  }
  for (const Buffer& b : f.held) {
    EXPECT_EQ(std::memchr(b.data(), 0x5a, 1), b.data());
    EXPECT_EQ(std::to_integer<int>(b.data()[b.size() - 1]), 0x5a);
  }
  EXPECT_EQ(f.pool->Stats().in_use, f.held.size());
}

TEST_P(MethodTest, ReportsProgressUpToTheTotal) {
  const std::string src = Path("src"), dst = Path("dst");
  WriteFileOrDie(src, RandomBytes(1000000, 7));
  CopyOptions o = Options(GetParam());
  o.batch_buffers = 8;
  std::vector<uint64_t> seen;
  o.progress = [&](const CopyProgress& p) {
    seen.push_back(p.bytes_done);
    EXPECT_EQ(p.bytes_total, 1000000u);
  };
  ASSERT_TRUE(CopyFile(src, dst, o).ok());
  ASSERT_FALSE(seen.empty());
  EXPECT_TRUE(std::is_sorted(seen.begin(), seen.end()));
  EXPECT_EQ(seen.back(), 1000000u);
}

INSTANTIATE_TEST_SUITE_P(AllMethods, MethodTest, testing::ValuesIn(kMethods),
                         [](const testing::TestParamInfo<MethodCase>& i) {
                           return std::string(i.param.name);
                         });

TEST_F(CopyTest, RefusesToCopyAFileOntoItself) {
  const std::string src = Path("self");
  WriteFileOrDie(src, "precious");
  ASSERT_EQ(link(src.c_str(), Path("hardlink").c_str()), 0);
  for (const std::string& dst : {src, Path("hardlink"), dir_}) {
    absl::StatusOr<CopyStats> stats = CopyFile(src, dst);
    ASSERT_FALSE(stats.ok()) << dst;
    EXPECT_NE(stats.status().message().find("same file"), std::string::npos)
        << stats.status();
  }
  EXPECT_EQ(ReadFileOrDie(src), "precious");
  EXPECT_TRUE(TempFiles(dir_).empty());
}

TEST_F(CopyTest, RefusesADirectorySource) {
  absl::StatusOr<CopyStats> stats = CopyFile(dir_, Path("x"));
  ASSERT_FALSE(stats.ok());
  EXPECT_EQ(stats.status().message(),
            "source is a directory: " + dir_ + ": Is a directory");
}

TEST_F(CopyTest, MissingSourceNamesPathAndSystemWords) {
  absl::StatusOr<CopyStats> stats = CopyFile(Path("nope"), Path("x"));
  ASSERT_FALSE(stats.ok());
  EXPECT_EQ(stats.status().message(),
            "open source: " + Path("nope") + ": No such file or directory");
  EXPECT_EQ(stats.status().code(), absl::StatusCode::kNotFound);
}

// kAuto says what it chose and why; between file systems it starts with
// sendfile instead of a copy_file_range the kernel would refuse.
TEST_F(CopyTest, AutoExplainsItsChoice) {
  const std::string data = RandomBytes(100000, 3);
  WriteFileOrDie(Path("src"), data);
  absl::StatusOr<CopyStats> r = CopyFile(Path("src"), Path("same"));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->method, CopyMethod::kKernel);
  EXPECT_EQ(r->method_reason.rfind("auto: kernel: ", 0), 0u)
      << r->method_reason;
  EXPECT_EQ(r->buffer_bytes, 0u);  // copy_file_range needs none
  EXPECT_EQ(ReadFileOrDie(Path("same")), data);

  r = CopyFile("/proc/version", Path("proc"));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->method, CopyMethod::kReadWrite);
  EXPECT_EQ(r->method_reason.rfind("auto: readwrite: the source reports no", 0),
            0u)
      << r->method_reason;

  CopyOptions asked;
  asked.method = CopyMethod::kUring;
  r = CopyFile(Path("src"), Path("asked"), asked);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->method_reason, "uring: as asked");

  // /dev/shm is another file system than the test's directory, where there
  // is one.
  struct stat a, b;
  if (stat("/dev/shm", &a) != 0 || stat(dir_.c_str(), &b) != 0 ||
      a.st_dev == b.st_dev) {
    GTEST_SKIP() << "no second file system at /dev/shm";
  }
  const std::string other =
      "/dev/shm/bufpool_auto_test." + std::to_string(getpid());
  r = CopyFile(Path("src"), other);
  const std::string copied = ReadFileOrDie(other);
  unlink(other.c_str());
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->method, CopyMethod::kKernel);
  EXPECT_EQ(r->method_reason.rfind("auto: kernel (sendfile): ", 0), 0u)
      << r->method_reason;
  EXPECT_TRUE(r->fallbacks.empty()) << r->fallbacks[0];
  EXPECT_EQ(copied, data);
}

TEST_F(CopyTest, MethodNamesRoundTrip) {
  for (const MethodCase& m : kMethods) {
    EXPECT_EQ(ParseCopyMethod(CopyMethodName(m.method)), m.method);
  }
  EXPECT_EQ(ParseCopyMethod("cp"), std::nullopt);
}

// ---- The io_uring method's per-thread ring ---------------------------------
//
// Each thread keeps its ring between copies and registers only the buffers
// a copy uses, so a pool of any size copies with fixed buffers, and a pool
// destroyed between copies leaves nothing behind that a new pool (likely at
// the same address) could inherit.

TEST_F(CopyTest, UringUsesFixedBuffersFromAPoolAboveOneGib) {
  // Not populated: only the buffers a copy uses are ever touched or pinned.
  auto pool =
      BufferPool::Create({.buffer_size = 64 * 1024,
                          .buffer_count = (size_t{1} << 30) / 65536 + 64,
                          .populate = false});
  ASSERT_TRUE(pool.ok()) << pool.status();
  const std::string src = Path("src"), dst = Path("dst");
  for (int i = 0; i < 3; ++i) {
    ASSERT_NO_FATAL_FAILURE(
        CopyByUring(pool->get(), src, dst, RandomBytes(300001 + i, 40 + i)));
  }
  EXPECT_EQ((*pool)->Stats().in_use, 0u);
}

TEST_F(CopyTest, UringCopiesCorrectlyThroughAPoolThatReplacedADeadOne) {
  const std::string src = Path("src"), dst = Path("dst");
  for (int round = 0; round < 4; ++round) {
    SCOPED_TRACE("round " + std::to_string(round));
    // A fresh pool each round, most likely mapped where the last one was.
    auto pool = BufferPool::Create({.buffer_count = 256});
    ASSERT_TRUE(pool.ok()) << pool.status();
    for (int i = 0; i < 2; ++i) {
      ASSERT_NO_FATAL_FAILURE(
          CopyByUring(pool->get(), src, dst,
                      RandomBytes(200000 + round * 1000 + i, round)));
    }
  }
}

TEST_F(CopyTest, UringCopyStartedFromAProgressCallbackGetsItsOwnRing) {
  const std::string src = Path("src"), dst = Path("dst");
  const std::string src2 = Path("src2"), dst2 = Path("dst2");
  const std::string data = RandomBytes(3 << 20, 5);
  const std::string data2 = RandomBytes(123457, 6);
  WriteFileOrDie(src, data);
  WriteFileOrDie(src2, data2);
  bool nested_done = false;
  CopyOptions o;
  o.method = CopyMethod::kUring;
  o.progress = [&](const CopyProgress&) {
    if (nested_done) return;
    nested_done = true;
    CopyOptions inner;
    inner.method = CopyMethod::kUring;
    absl::StatusOr<CopyStats> r = CopyFile(src2, dst2, inner);
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_TRUE(r->fixed_buffers);
  };
  absl::StatusOr<CopyStats> r = CopyFile(src, dst, o);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(nested_done);
  EXPECT_EQ(ReadFileOrDie(dst), data);
  EXPECT_EQ(ReadFileOrDie(dst2), data2);
  // And the kept ring still works afterwards.
  ASSERT_TRUE(CopyFile(src2, dst, o).ok());
  EXPECT_EQ(ReadFileOrDie(dst), data2);
}

// ---- Fault injection through the OS seam ----------------------------------

// Faults the fake syscalls and ring apply; reset by each test.
struct Faults {
  bool eintr = false;         // every other data call fails with EINTR
  size_t short_max = 0;       // data calls move at most this many bytes
  int64_t enospc_after = -1;  // writes fail with ENOSPC past this many bytes
  int read_errno = 0;         // reads fail with this
  int fsync_errno = 0;
  int close_errno = 0;        // close of a writable descriptor
  int direct_open_errno = 0;  // open with O_DIRECT
  int cfr_errno = 0;          // copy_file_range
  int sendfile_errno = 0;
  int uring_create_errno = 0;
  int register_errno = 0;
  int submit_errno = 0;       // io_uring_enter fails
  bool uring_short = false;   // halve every other operation
  bool uring_eagain = false;  // every third completion is -EAGAIN
  int fallocate_errno = 0;
  // Observed.
  int calls = 0;
  int fallocates = 0;
  int fsyncs = 0;
  int64_t written = 0;
  int eagains = 0;
  int shorts = 0;
};
Faults g;

bool IsDirect(int fd) { return (fcntl(fd, F_GETFL) & O_DIRECT) != 0; }

// Bytes a data call may move now, or -1 with errno set.
ssize_t Allow(int fd, size_t n, bool write) {
  if (g.eintr && ++g.calls % 2 == 1) {
    errno = EINTR;
    return -1;
  }
  if (write && g.enospc_after >= 0) {
    if (g.written >= g.enospc_after) {
      errno = ENOSPC;
      return -1;
    }
    n = std::min<size_t>(n, g.enospc_after - g.written);  // fill the disk
  }
  if (!write && g.read_errno != 0) {
    errno = g.read_errno;
    return -1;
  }
  if (g.short_max != 0 && n > g.short_max) {
    // O_DIRECT transfers stay whole blocks, as a real device's would.
    n = IsDirect(fd) ? std::max<size_t>(4096, g.short_max & ~size_t{4095})
                     : g.short_max;
  }
  return static_cast<ssize_t>(n);
}

int CountIov(const iovec* iov, int cnt, size_t limit, std::vector<iovec>& out) {
  out.clear();
  for (int i = 0; i < cnt && limit > 0; ++i) {
    const size_t n = std::min(iov[i].iov_len, limit);
    out.push_back({iov[i].iov_base, n});
    limit -= n;
  }
  return static_cast<int>(out.size());
}

size_t IovBytes(const iovec* iov, int cnt) {
  size_t n = 0;
  for (int i = 0; i < cnt; ++i) n += iov[i].iov_len;
  return n;
}

ssize_t FakePreadv(int fd, const iovec* iov, int cnt, off_t off) {
  const ssize_t allow = Allow(fd, IovBytes(iov, cnt), false);
  if (allow < 0) return -1;
  std::vector<iovec> v;
  return os::RealSyscalls().preadv(fd, v.data(), CountIov(iov, cnt, allow, v),
                                   off);
}
ssize_t FakeReadv(int fd, const iovec* iov, int cnt) {
  const ssize_t allow = Allow(fd, IovBytes(iov, cnt), false);
  if (allow < 0) return -1;
  std::vector<iovec> v;
  const int n = CountIov(iov, cnt, allow, v);
  return os::RealSyscalls().readv(fd, v.data(), n);
}
ssize_t FakePwritev(int fd, const iovec* iov, int cnt, off_t off) {
  const ssize_t allow = Allow(fd, IovBytes(iov, cnt), true);
  if (allow < 0) return -1;
  std::vector<iovec> v;
  const int n = CountIov(iov, cnt, allow, v);
  const ssize_t r = os::RealSyscalls().pwritev(fd, v.data(), n, off);
  if (r > 0) g.written += r;
  return r;
}
ssize_t FakeCopyFileRange(int in, off_t* oin, int out, off_t* oout, size_t n,
                          unsigned flags) {
  if (g.cfr_errno != 0) {
    errno = g.cfr_errno;
    return -1;
  }
  const ssize_t allow = Allow(in, n, true);
  if (allow < 0) return -1;
  const ssize_t r =
      os::RealSyscalls().copy_file_range(in, oin, out, oout, allow, flags);
  if (r > 0) g.written += r;
  return r;
}
ssize_t FakeSendfile(int out, int in, off_t* off, size_t n) {
  if (g.sendfile_errno != 0) {
    errno = g.sendfile_errno;
    return -1;
  }
  const ssize_t allow = Allow(in, n, true);
  if (allow < 0) return -1;
  const ssize_t r = os::RealSyscalls().sendfile(out, in, off, allow);
  if (r > 0) g.written += r;
  return r;
}
int FakeFsync(int fd) {
  ++g.fsyncs;
  if (g.fsync_errno != 0) {
    errno = g.fsync_errno;
    return -1;
  }
  return os::RealSyscalls().fsync(fd);
}
int FakeFallocate(int fd, int mode, off_t offset, off_t len) {
  ++g.fallocates;
  if (g.fallocate_errno != 0) {
    errno = g.fallocate_errno;
    return -1;
  }
  return os::RealSyscalls().fallocate(fd, mode, offset, len);
}
int FakeClose(int fd) {
  const bool writable = (fcntl(fd, F_GETFL) & O_ACCMODE) != O_RDONLY;
  const int r = os::RealSyscalls().close(fd);
  if (r == 0 && writable && g.close_errno != 0) {
    errno = g.close_errno;
    return -1;
  }
  return r;
}
int FakeOpen(const char* path, int flags, mode_t mode) {
  if ((flags & O_DIRECT) && g.direct_open_errno != 0) {
    errno = g.direct_open_errno;
    return -1;
  }
  return os::RealSyscalls().open(path, flags, mode);
}

// Wraps the real ring: shortens operations, fakes -EAGAIN, ENOSPC and a
// failed registration.
class FaultyRing final : public os::Uring {
 public:
  explicit FaultyRing(std::unique_ptr<os::Uring> real)
      : real_(std::move(real)) {}
  int RegisterBuffers(const iovec* iov, unsigned n) override {
    if (g.register_errno != 0) return -g.register_errno;
    return real_->RegisterBuffers(iov, n);
  }
  int UnregisterBuffers() override { return real_->UnregisterBuffers(); }
  bool PrepareRead(int fd, void* buf, unsigned len, uint64_t off, int index,
                   uint64_t ud) override {
    if (g.read_errno != 0) {  // a zero-length read whose result is the error
      return real_->PrepareRead(fd, buf, 0, off, -1, ud | kReadFailTag);
    }
    return real_->PrepareRead(fd, buf, Shorten(fd, len), off, index, ud);
  }
  bool PrepareWrite(int fd, const void* buf, unsigned len, uint64_t off,
                    int index, uint64_t ud) override {
    if (g.enospc_after >= 0 && queued_ >= g.enospc_after) {
      // Turn this write into a zero-length read; its result becomes ENOSPC.
      return real_->PrepareRead(fd, const_cast<void*>(buf), 0, off, -1,
                                ud | kEnospcTag);
    }
    unsigned n = Shorten(fd, len);
    if (g.enospc_after >= 0 && queued_ + n > g.enospc_after) {
      n = static_cast<unsigned>(g.enospc_after - queued_);  // fills the disk
    }
    queued_ += n;
    return real_->PrepareWrite(fd, buf, n, off, index, ud | kWriteTag);
  }
  int SubmitAndWait(unsigned wait_nr) override {
    if (g.submit_errno != 0) return -g.submit_errno;
    return real_->SubmitAndWait(wait_nr);
  }
  bool Supports(Op op) override { return real_->Supports(op); }
  bool PrepareOpenat(int dirfd, const char* path, int flags, mode_t mode,
                     uint64_t ud) override {
    return real_->PrepareOpenat(dirfd, path, flags, mode, ud);
  }
  bool PrepareStatx(int dirfd, const char* path, int flags, unsigned mask,
                    struct statx* out, uint64_t ud) override {
    return real_->PrepareStatx(dirfd, path, flags, mask, out, ud);
  }
  bool PrepareClose(int fd, uint64_t ud) override {
    return real_->PrepareClose(fd, ud);
  }
  bool PrepareMkdirat(int dirfd, const char* path, mode_t mode,
                      uint64_t ud) override {
    return real_->PrepareMkdirat(dirfd, path, mode, ud);
  }
  bool PrepareSymlinkat(const char* target, int dirfd, const char* path,
                        uint64_t ud) override {
    return real_->PrepareSymlinkat(target, dirfd, path, ud);
  }
  void LinkLast(Link link) override { real_->LinkLast(link); }
  unsigned SubmissionSpace() override { return real_->SubmissionSpace(); }
  bool PopCompletion(Completion* out) override {
    if (!real_->PopCompletion(out)) return false;
    const bool write = out->user_data & kWriteTag;
    if (out->user_data & kEnospcTag) out->res = -ENOSPC;
    if (out->user_data & kReadFailTag) out->res = -g.read_errno;
    out->user_data &= ~(kWriteTag | kEnospcTag | kReadFailTag);
    if (write && out->res > 0) g.written += out->res;
    if (g.uring_eagain && ++completions_ % 3 == 0 && out->res >= 0) {
      // The operation ran, but the engine must treat it as not done.
      ++g.eagains;
      out->res = -EAGAIN;
    }
    return true;
  }

 private:
  static constexpr uint64_t kWriteTag = uint64_t{1} << 62;
  static constexpr uint64_t kEnospcTag = uint64_t{1} << 61;
  static constexpr uint64_t kReadFailTag = uint64_t{1} << 60;

  unsigned Shorten(int fd, unsigned len) {
    if (!g.uring_short || ++ops_ % 2 == 0) return len;
    if (IsDirect(fd)) {
      if (len <= 4096) return len;
      ++g.shorts;
      return std::max(4096u, (len / 2) & ~4095u);
    }
    if (len <= 1) return len;
    ++g.shorts;
    return len / 2 + 1;
  }

  std::unique_ptr<os::Uring> real_;
  int64_t queued_ = 0;  // bytes of writes queued
  uint64_t ops_ = 0, completions_ = 0;
};

int FakeUringCreate(unsigned entries, std::unique_ptr<os::Uring>* out) {
  if (g.uring_create_errno != 0) return -g.uring_create_errno;
  std::unique_ptr<os::Uring> real;
  const int rc = os::CreateUring(entries, &real);
  if (rc < 0) return rc;
  *out = std::make_unique<FaultyRing>(std::move(real));
  return 0;
}

class FaultTest : public CopyTest,
                  public testing::WithParamInterface<MethodCase> {
 protected:
  void SetUp() override {
    CopyTest::SetUp();
    g = Faults{};
    table_ = os::RealSyscalls();
    table_.open = FakeOpen;
    table_.close = FakeClose;
    table_.preadv = FakePreadv;
    table_.readv = FakeReadv;
    table_.pwritev = FakePwritev;
    table_.copy_file_range = FakeCopyFileRange;
    table_.sendfile = FakeSendfile;
    table_.fsync = FakeFsync;
    table_.fallocate = FakeFallocate;
    uring_table_ = os::RealUringSyscalls();
    uring_table_.uring_create = FakeUringCreate;
    src_ = Path("src");
    dst_ = Path("dst");
    data_ = RandomBytes(1234567, 11);
    WriteFileOrDie(src_, data_);
  }

  absl::StatusOr<CopyStats> Run(CopyOptions o) {
    os::ScopedSyscalls seam(&table_);
    os::ScopedUringSyscalls uring_seam(&uring_table_);
    return CopyFile(src_, dst_, o);
  }
  // Atomic unless a test asks otherwise: a failed atomic copy leaves the
  // old destination whole, which ExpectCleanFailure checks.
  CopyOptions AtomicOptions() const {
    CopyOptions o = Options(GetParam());
    o.replace = CopyOptions::Replace::kAtomic;
    return o;
  }
  absl::StatusOr<CopyStats> Run() { return Run(AtomicOptions()); }

  // The copy failed cleanly: the old destination is intact, no temp file.
  void ExpectCleanFailure(const absl::StatusOr<CopyStats>& r,
                          const std::string& words) {
    ASSERT_FALSE(r.ok());
    EXPECT_NE(r.status().message().find(words), std::string::npos)
        << r.status();
    EXPECT_EQ(ReadFileOrDie(dst_), "old destination");
    EXPECT_TRUE(TempFiles(dir_).empty());
  }

  os::SyscallTable table_;
  os::UringSyscallTable uring_table_;
  std::string src_, dst_, data_;
};

TEST_P(FaultTest, SurvivesEintrOnEveryCallAndShortTransfers) {
  g.eintr = true;
  g.short_max = 5000;
  g.uring_short = true;
  CopyOptions o = Options(GetParam());
  o.batch_buffers = 16;
  absl::StatusOr<CopyStats> r = Run(o);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(ReadFileOrDie(dst_), data_);
  EXPECT_GT(g.calls + g.shorts, 10);  // the faults really were hit
}

// Short transfers and EINTR that split coalesced segments of a fragmented
// pool (runs of two adjacent slots) still give a byte-identical copy.
TEST_P(FaultTest, ShortTransfersInsideCoalescedSegments) {
  FragmentedPool f = MakeFragmentedPool();
  g.eintr = true;
  g.short_max = 6000;  // ends inside the second slot of a pair
  g.uring_short = true;
  CopyOptions o = Options(GetParam());
  o.pool = f.pool.get();
  o.batch_buffers = 16;
  absl::StatusOr<CopyStats> r = Run(o);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(ReadFileOrDie(dst_), data_);
  EXPECT_GT(g.calls + g.shorts, 10);
}

TEST_P(FaultTest, UringEagainCompletionsAreRetried) {
  g.uring_eagain = true;
  g.uring_short = true;
  absl::StatusOr<CopyStats> r = Run();
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(ReadFileOrDie(dst_), data_);
  const CopyMethod m = GetParam().method;
  if (m == CopyMethod::kUring || m == CopyMethod::kDirect) {
    EXPECT_GT(g.eagains, 0);
    EXPECT_GT(g.shorts, 0);
  }
}

TEST_P(FaultTest, DiskFullLeavesTheDestinationUntouched) {
  WriteFileOrDie(dst_, "old destination");
  g.enospc_after = 70 * 4096;
  absl::StatusOr<CopyStats> r = Run();
  ExpectCleanFailure(r, "No space left on device");
  EXPECT_NE(r.status().message().find(dst_), std::string::npos);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kResourceExhausted);
}

// O_DIRECT copies reserve the destination's blocks first; where the file
// system cannot, the copy goes on without.
TEST_P(FaultTest, UnsupportedPreallocationIsSkipped) {
  for (int uring_errno : {0, ENOSYS}) {  // io_uring, then the sync loop
    SCOPED_TRACE(uring_errno == 0 ? "io_uring" : "synchronous");
    g = Faults{};
    g.fallocate_errno = EOPNOTSUPP;
    g.uring_create_errno = uring_errno;
    g.short_max = 5000;
    absl::StatusOr<CopyStats> r = Run();
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(ReadFileOrDie(dst_), data_);
    if (r->direct_io) {
      EXPECT_GT(g.fallocates, 0);
    }
  }
}

TEST_P(FaultTest, PreallocationOutOfSpaceFailsCleanly) {
  WriteFileOrDie(dst_, "old destination");
  g.fallocate_errno = ENOSPC;
  absl::StatusOr<CopyStats> r = Run();
  if (GetParam().method == CopyMethod::kDirect || GetParam().direct_io) {
    ExpectCleanFailure(r, "No space left on device");
    EXPECT_EQ(r.status().message(),
              "allocate space for: " + dst_ + ": No space left on device");
  } else {
    ASSERT_TRUE(r.ok()) << r.status();  // buffered methods do not reserve
    EXPECT_EQ(ReadFileOrDie(dst_), data_);
    EXPECT_EQ(g.fallocates, 0);
  }
}

TEST_P(FaultTest, ReadErrorNamesTheSource) {
  WriteFileOrDie(dst_, "old destination");
  g.read_errno = EIO;
  table_.copy_file_range = [](int, off_t*, int, off_t*, size_t, unsigned) {
    errno = EIO;
    return ssize_t{-1};
  };
  absl::StatusOr<CopyStats> r = Run();
  ExpectCleanFailure(r, "Input/output error");
  const CopyMethod m = GetParam().method;
  if (m != CopyMethod::kKernel && m != CopyMethod::kAuto) {
    EXPECT_EQ(r.status().message(), "read: " + src_ + ": Input/output error");
  }
}

TEST_P(FaultTest, FsyncErrorIsReportedOnceAndNeverRetried) {
  WriteFileOrDie(dst_, "old destination");
  g.fsync_errno = EIO;
  CopyOptions o = AtomicOptions();
  o.fsync = true;
  absl::StatusOr<CopyStats> r = Run(o);
  ExpectCleanFailure(r, "Input/output error");
  EXPECT_EQ(r.status().message(), "fsync: " + dst_ + ": Input/output error");
  EXPECT_EQ(g.fsyncs, 1);
}

TEST_P(FaultTest, CloseErrorIsReported) {
  WriteFileOrDie(dst_, "old destination");
  g.close_errno = EIO;
  absl::StatusOr<CopyStats> r = Run();
  ExpectCleanFailure(r, "Input/output error");
  EXPECT_NE(r.status().message().find("close: " + dst_), std::string::npos);
}

TEST_P(FaultTest, BrokenRingFailsCleanly) {
  WriteFileOrDie(dst_, "old destination");
  g.submit_errno = EIO;
  absl::StatusOr<CopyStats> r = Run();
  const CopyMethod m = GetParam().method;
  if (m == CopyMethod::kUring || m == CopyMethod::kDirect) {
    ExpectCleanFailure(r, "io_uring submit: " + src_ + ": Input/output error");
  } else {
    ASSERT_TRUE(r.ok()) << r.status();  // no ring involved
    EXPECT_EQ(ReadFileOrDie(dst_), data_);
  }
}

TEST_P(FaultTest, FallsBackToBufferedWhenODirectIsRefused) {
  g.direct_open_errno = EINVAL;
  absl::StatusOr<CopyStats> r = Run();
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(ReadFileOrDie(dst_), data_);
  EXPECT_FALSE(r->direct_io);
  if (GetParam().method == CopyMethod::kDirect || GetParam().direct_io) {
    ASSERT_FALSE(r->fallbacks.empty());
    EXPECT_NE(r->fallbacks[0].find("O_DIRECT refused"), std::string::npos);
  }
}

TEST_P(FaultTest, FallsBackToUnregisteredBuffersOnEnomem) {
  g.register_errno = ENOMEM;
  absl::StatusOr<CopyStats> r = Run();
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(ReadFileOrDie(dst_), data_);
  EXPECT_FALSE(r->fixed_buffers);
  const CopyMethod m = GetParam().method;
  if (m == CopyMethod::kUring || m == CopyMethod::kDirect) {
    ASSERT_FALSE(r->fallbacks.empty());
    EXPECT_NE(r->fallbacks.back().find("Cannot allocate memory"),
              std::string::npos);
    EXPECT_EQ(r->method, m);
  }
}

TEST_P(FaultTest, FallsBackWhenIoUringIsUnavailable) {
  g.uring_create_errno = ENOSYS;
  g.eintr = true;
  g.short_max = 7000;
  absl::StatusOr<CopyStats> r = Run();
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(ReadFileOrDie(dst_), data_);
  if (GetParam().method == CopyMethod::kUring && !GetParam().direct_io) {
    EXPECT_EQ(r->method, CopyMethod::kReadWrite);
  }
  if (GetParam().method == CopyMethod::kDirect) {
    EXPECT_EQ(r->method, CopyMethod::kDirect);  // synchronous O_DIRECT loop
    EXPECT_TRUE(r->direct_io);
  }
}

// Without io_uring, kDirect runs its synchronous O_DIRECT loop: every size
// and a sparse file through it too.
TEST_P(FaultTest, WithoutIoUringEverySizeAndHoleIsCopied) {
  g.uring_create_errno = ENOSYS;
  for (size_t size : Sizes()) {
    SCOPED_TRACE("size " + std::to_string(size));
    data_ = RandomBytes(size, static_cast<uint32_t>(size) + 1);
    WriteFileOrDie(src_, data_);
    absl::StatusOr<CopyStats> r = Run();
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(ReadFileOrDie(dst_), data_);
    EXPECT_EQ(r->bytes_copied, size);
  }
  UniqueFd file(open(src_.c_str(), O_WRONLY | O_TRUNC));
  const int fd = file.get();
  ASSERT_GE(fd, 0);
  ASSERT_EQ(pwrite(fd, "middle", 6, 2 << 20), 6);
  ASSERT_EQ(ftruncate(fd, 5 << 20), 0);
  file.reset();
  absl::StatusOr<CopyStats> r = Run();
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(ReadFileOrDie(dst_), ReadFileOrDie(src_));
  struct stat st;
  ASSERT_EQ(stat(dst_.c_str(), &st), 0);
  EXPECT_LE(st.st_blocks, 64);  // the holes stayed holes
}

TEST_P(FaultTest, KernelRefusalsFallBackToSendfileThenReadWrite) {
  for (int err : {EXDEV, EINVAL, ENOSYS, EOPNOTSUPP}) {
    g = Faults{};
    g.cfr_errno = err;
    absl::StatusOr<CopyStats> r = Run();
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(ReadFileOrDie(dst_), data_);
    g.sendfile_errno = EINVAL;
    r = Run();
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(ReadFileOrDie(dst_), data_);
    if (GetParam().method == CopyMethod::kKernel) {
      EXPECT_EQ(r->method, CopyMethod::kReadWrite);
      ASSERT_EQ(r->fallbacks.size(), 2u);
      EXPECT_NE(r->fallbacks[0].find("copy_file_range refused"),
                std::string::npos);
      EXPECT_NE(r->fallbacks[1].find("sendfile refused"), std::string::npos);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(AllMethods, FaultTest, testing::ValuesIn(kMethods),
                         [](const testing::TestParamInfo<MethodCase>& i) {
                           return std::string(i.param.name);
                         });

// ---- A real full disk -----------------------------------------------------

TEST_F(CopyTest, RealFullDiskFailsCleanlyForEveryMethod) {
  const std::string mnt = Path("small");
  ASSERT_EQ(mkdir(mnt.c_str(), 0755), 0);
  if (mount("bufpool-test", mnt.c_str(), "tmpfs", 0, "size=1m") != 0) {
    GTEST_SKIP() << "cannot mount a tmpfs here (" << std::strerror(errno)
                 << "); run as root with CAP_SYS_ADMIN to test a full disk";
  }
  struct Unmount {
    std::string path;
    ~Unmount() { umount2(path.c_str(), MNT_DETACH); }
  } unmount{mnt};
  const std::string src = Path("big");
  WriteFileOrDie(src, RandomBytes(3 << 20, 12));
  const std::string dst = mnt + "/dst";
  WriteFileOrDie(dst, "old destination");
  for (const MethodCase& m : kMethods) {
    SCOPED_TRACE(m.name);
    CopyOptions o = Options(m);
    o.replace = CopyOptions::Replace::kAtomic;
    absl::StatusOr<CopyStats> r = CopyFile(src, dst, o);
    ASSERT_FALSE(r.ok());
    // "write" or, for kernel, the call that moved the data.
    EXPECT_TRUE(std::string(r.status().message())
                    .ends_with(": " + dst + ": No space left on device"))
        << r.status();
    EXPECT_EQ(ReadFileOrDie(dst), "old destination");
    EXPECT_TRUE(TempFiles(mnt).empty());
  }
}

}  // namespace
}  // namespace bufpool

// How CopyFile writes its destination, the way cp does: devices and FIFOs
// written in place and never replaced, modes never widened, owners and
// links kept, symbolic links followed, the atomic replace's refusals,
// no-clobber, and every new system call's failure through the OS seam.
#include <fcntl.h>
#include <grp.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <sstream>
#include <string>
#include <thread>

#include "bufpool/file_copy.h"
#include "gtest/gtest.h"
#include "os/file.h"
#include "os/syscalls.h"
#include "test_util.h"

namespace bufpool {
namespace {

using testing_util::BindUnixSocket;
using testing_util::Lstat;
using testing_util::ReadFileOrDie;
using testing_util::UniqueFd;
using testing_util::WriteFileOrDie;

using Replace = CopyOptions::Replace;
constexpr uid_t kNobody = 65534;
constexpr gid_t kNogroup = 65534;

bool Contains(const absl::Status& s, const std::string& words) {
  return std::string(s.message()).find(words) != std::string::npos;
}

// Runs `body` in a child process as nobody:nogroup; its exit status. Only
// root can switch users.
int AsNobody(const std::function<int()>& body) {
  const pid_t pid = fork();
  if (pid == 0) {
    if (setgroups(0, nullptr) != 0 || setgid(kNogroup) != 0 ||
        setuid(kNobody) != 0) {
      _exit(99);
    }
    _exit(body());
  }
  int status = 0;
  waitpid(pid, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 98;
}

class DestinationTest : public testing::TestWithParam<Replace> {
 protected:
  void SetUp() override {
    std::string tmpl = "/tmp/bufpool_copy_destination_test.XXXXXX";
    ASSERT_NE(mkdtemp(tmpl.data()), nullptr);
    dir_ = tmpl;
    ASSERT_EQ(chmod(dir_.c_str(), 0777), 0);  // nobody may work in it
    src_ = Path("src");
    WriteFileOrDie(src_, "twelve bytes");
  }
  void TearDown() override {
    ASSERT_EQ(std::system(("rm -rf '" + dir_ + "'").c_str()), 0);
  }
  std::string Path(const std::string& name) const { return dir_ + "/" + name; }
  CopyOptions Options() const {
    CopyOptions o;
    o.replace = GetParam();
    return o;
  }
  static bool Root() { return geteuid() == 0; }

  std::string dir_, src_;
};

TEST_P(DestinationTest, FifoIsWrittenNotReplaced) {
  const std::string fifo = Path("fifo");
  ASSERT_EQ(mkfifo(fifo.c_str(), 0600), 0);
  const ino_t ino = Lstat(fifo).st_ino;
  std::string got;
  std::thread reader([&] { got = ReadFileOrDie(fifo); });
  absl::StatusOr<CopyStats> r = CopyFile(src_, fifo, Options());
  reader.join();
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(got, "twelve bytes");
  const struct stat st = Lstat(fifo);
  EXPECT_TRUE(S_ISFIFO(st.st_mode));
  EXPECT_EQ(st.st_ino, ino);
  EXPECT_EQ(st.st_mode & 07777, 0600u);
  EXPECT_EQ(r->replace, Replace::kInPlace);  // whatever was asked
  EXPECT_FALSE(r->created);
}

// The bug this guards against replaced /dev/null with a file. A node made
// here with the numbers of /dev/null (1, 3) stands in for it.
TEST_P(DestinationTest, CharacterDeviceIsWrittenNotReplaced) {
  const std::string dev = Path("null");
  if (mknod(dev.c_str(), S_IFCHR | 0666, makedev(1, 3)) != 0) {
    GTEST_SKIP() << "mknod needs CAP_MKNOD: " << std::strerror(errno);
  }
  ASSERT_EQ(chmod(dev.c_str(), 0666), 0);  // mknod applied the umask
  const ino_t ino = Lstat(dev).st_ino;
  for (CopyMethod m : {CopyMethod::kAuto, CopyMethod::kKernel,
                       CopyMethod::kUring, CopyMethod::kDirect}) {
    CopyOptions o = Options();
    o.method = m;
    absl::StatusOr<CopyStats> r = CopyFile(src_, dev, o);
    ASSERT_TRUE(r.ok()) << r.status();
    const struct stat st = Lstat(dev);
    EXPECT_TRUE(S_ISCHR(st.st_mode));
    EXPECT_EQ(st.st_rdev, makedev(1, 3));
    EXPECT_EQ(st.st_ino, ino);
    EXPECT_EQ(st.st_mode & 07777, 0666u);
    EXPECT_EQ(r->replace, Replace::kInPlace);
    EXPECT_EQ(r->method, CopyMethod::kReadWrite);
  }
  EXPECT_EQ(ReadFileOrDie(Path("null")), "");  // still reads as /dev/null
}

TEST_P(DestinationTest, SocketDestinationIsAnErrorNamingIt) {
  const std::string path = Path("sock");
  const UniqueFd sock = BindUnixSocket(path);
  ASSERT_TRUE(sock.valid());
  absl::StatusOr<CopyStats> r = CopyFile(src_, path, Options());
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(Contains(r.status(), "destination is a socket: " + path))
      << r.status();
  EXPECT_TRUE(S_ISSOCK(Lstat(path).st_mode));
}

TEST_P(DestinationTest, SymlinkIsFollowedAndStaysALink) {
  WriteFileOrDie(Path("target"), "old");
  ASSERT_EQ(symlink("target", Path("link").c_str()), 0);
  absl::StatusOr<CopyStats> r = CopyFile(src_, Path("link"), Options());
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(S_ISLNK(Lstat(Path("link")).st_mode));
  EXPECT_EQ(ReadFileOrDie(Path("target")), "twelve bytes");
  EXPECT_EQ(r->replace, GetParam());
}

TEST_P(DestinationTest, DanglingSymlinkIsRefusedAsCpRefusesIt) {
  ASSERT_EQ(symlink("nowhere", Path("link").c_str()), 0);
  absl::StatusOr<CopyStats> r = CopyFile(src_, Path("link"), Options());
  ASSERT_FALSE(r.ok());
  EXPECT_TRUE(Contains(r.status(), "not writing through dangling symlink"))
      << r.status();
  EXPECT_TRUE(S_ISLNK(Lstat(Path("link")).st_mode));
  EXPECT_NE(access(Path("nowhere").c_str(), F_OK), 0);
}

TEST_P(DestinationTest, SameFileThroughLinksIsRefusedAndUntouched) {
  ASSERT_EQ(link(src_.c_str(), Path("hard").c_str()), 0);
  ASSERT_EQ(symlink("src", Path("soft").c_str()), 0);
  for (const char* name : {"hard", "soft", "src"}) {
    absl::StatusOr<CopyStats> r = CopyFile(src_, Path(name), Options());
    ASSERT_FALSE(r.ok()) << name;
    EXPECT_TRUE(Contains(r.status(), "same file")) << r.status();
  }
  EXPECT_EQ(ReadFileOrDie(src_), "twelve bytes");
}

TEST_P(DestinationTest, NoClobberLeavesAnExistingFileAlone) {
  WriteFileOrDie(Path("dst"), "old");
  CopyOptions o = Options();
  o.no_clobber = true;
  absl::StatusOr<CopyStats> r = CopyFile(src_, Path("dst"), o);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kAlreadyExists);
  EXPECT_EQ(ReadFileOrDie(Path("dst")), "old");
  r = CopyFile(src_, Path("new"), o);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(r->created);
  EXPECT_EQ(ReadFileOrDie(Path("new")), "twelve bytes");
}

TEST_P(DestinationTest, ExistingOwnerGroupAndModeStay) {
  if (!Root()) GTEST_SKIP() << "giving a file to nobody needs root";
  WriteFileOrDie(Path("dst"), "old");
  ASSERT_EQ(chown(Path("dst").c_str(), kNobody, kNogroup), 0);
  ASSERT_EQ(chmod(Path("dst").c_str(), 0600), 0);
  ASSERT_EQ(chmod(src_.c_str(), 0644), 0);
  absl::StatusOr<CopyStats> r = CopyFile(src_, Path("dst"), Options());
  ASSERT_TRUE(r.ok()) << r.status();
  const struct stat st = Lstat(Path("dst"));
  EXPECT_EQ(st.st_uid, kNobody);
  EXPECT_EQ(st.st_gid, kNogroup);
  EXPECT_EQ(st.st_mode & 07777, 0600u);
  EXPECT_EQ(ReadFileOrDie(Path("dst")), "twelve bytes");
}

TEST_P(DestinationTest, PreserveKeepsOwnerModeAndTimes) {
  ASSERT_EQ(chmod(src_.c_str(), 0640), 0);
  const struct timespec times[2] = {{1000000000, 5}, {1200000000, 7}};
  ASSERT_EQ(utimensat(AT_FDCWD, src_.c_str(), times, 0), 0);
  if (Root()) {
    ASSERT_EQ(chown(src_.c_str(), kNobody, kNogroup), 0);
  }
  CopyOptions o = Options();
  o.preserve_mode = o.preserve_ownership = o.preserve_timestamps = true;
  absl::StatusOr<CopyStats> r = CopyFile(src_, Path("dst"), o);
  ASSERT_TRUE(r.ok()) << r.status();
  const struct stat st = Lstat(Path("dst"));
  EXPECT_EQ(st.st_mode & 07777, 0640u);
  EXPECT_EQ(st.st_mtim.tv_sec, 1200000000);
  EXPECT_EQ(st.st_mtim.tv_nsec, 7);
  EXPECT_EQ(st.st_atim.tv_sec, 1000000000);
  if (Root()) {
    EXPECT_EQ(st.st_uid, kNobody);
  }
}

// An unprivileged copy of someone else's file: ownership cannot be kept,
// which is not an error, and the set-user-ID bit is then dropped.
TEST_P(DestinationTest, PreserveOwnershipAsNobodyIsNotAnError) {
  if (!Root()) GTEST_SKIP() << "switching to nobody needs root";
  ASSERT_EQ(chmod(src_.c_str(), 04755), 0);
  CopyOptions o = Options();
  o.preserve_mode = o.preserve_ownership = true;
  const std::string dst = Path("dst");
  EXPECT_EQ(AsNobody([&] { return CopyFile(src_, dst, o).ok() ? 0 : 1; }), 0);
  const struct stat st = Lstat(dst);
  EXPECT_EQ(st.st_uid, kNobody);
  EXPECT_EQ(st.st_mode & 07777, 0755u);
}

// A directory where nobody may write the file but not create names: in
// place works (as cp does), atomic says why it cannot.
TEST_P(DestinationTest, DirectoryThatTakesNoNewNames) {
  if (!Root()) GTEST_SKIP() << "switching to nobody needs root";
  const std::string sub = Path("sub"), dst = Path("sub/dst");
  ASSERT_EQ(mkdir(sub.c_str(), 0755), 0);  // root's: nobody cannot add names
  WriteFileOrDie(dst, "old");
  ASSERT_EQ(chown(dst.c_str(), kNobody, kNogroup), 0);
  const CopyOptions o = Options();
  const int rc = AsNobody([&] {
    absl::StatusOr<CopyStats> r = CopyFile(src_, dst, o);
    if (o.replace == Replace::kInPlace) return r.ok() ? 0 : 1;
    return !r.ok() && Contains(r.status(), "takes no new names") ? 0 : 2;
  });
  EXPECT_EQ(rc, 0);
  EXPECT_EQ(ReadFileOrDie(dst),
            GetParam() == Replace::kInPlace ? "twelve bytes" : "old");
}

INSTANTIATE_TEST_SUITE_P(Modes, DestinationTest,
                         testing::Values(Replace::kInPlace, Replace::kAtomic),
                         [](const testing::TestParamInfo<Replace>& i) {
                           return i.param == Replace::kInPlace ? "in_place"
                                                               : "atomic";
                         });

class AtomicTest : public DestinationTest {};

TEST_F(AtomicTest, RefusesADestinationWithOtherHardLinks) {
  WriteFileOrDie(Path("dst"), "old");
  ASSERT_EQ(link(Path("dst").c_str(), Path("other").c_str()), 0);
  CopyOptions o;
  o.replace = Replace::kAtomic;
  absl::StatusOr<CopyStats> r = CopyFile(src_, Path("dst"), o);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(Contains(r.status(), "2 hard links")) << r.status();
  EXPECT_TRUE(Contains(r.status(), "copy in place instead")) << r.status();
  EXPECT_EQ(ReadFileOrDie(Path("dst")), "old");
  EXPECT_EQ(Lstat(Path("dst")).st_nlink, 2u);
}

TEST_F(AtomicTest, ReplacementGetsTheOldOwnerGroupAndMode) {
  if (!Root()) GTEST_SKIP() << "giving a file to nobody needs root";
  WriteFileOrDie(Path("dst"), "old");
  ASSERT_EQ(chown(Path("dst").c_str(), kNobody, kNogroup), 0);
  ASSERT_EQ(chmod(Path("dst").c_str(), 0604), 0);
  const ino_t ino = Lstat(Path("dst")).st_ino;
  CopyOptions o;
  o.replace = Replace::kAtomic;
  ASSERT_TRUE(CopyFile(src_, Path("dst"), o).ok());
  const struct stat st = Lstat(Path("dst"));
  EXPECT_NE(st.st_ino, ino);
  EXPECT_EQ(st.st_uid, kNobody);
  EXPECT_EQ(st.st_gid, kNogroup);
  EXPECT_EQ(st.st_mode & 07777, 0604u);
}

// ---- The new system calls' failures, through the OS seam ---------------

struct SeamFaults {
  int lstat_errno = 0;
  int fchown_errno = 0;
  int futimens_errno = 0;
  int renameat2_errno = 0;
  int link_errno = 0;
  int realpath_errno = 0;
  int temp_open_errno = 0;  // open of a ".bufpool-copy." temporary file
  int links = 0;
  int readv_errno = 0;
} f;

class SeamTest : public DestinationTest {
 protected:
  void SetUp() override {
    DestinationTest::SetUp();
    f = SeamFaults{};
    table_ = os::RealSyscalls();
    table_.lstat = [](const char* p, struct stat* st) {
      if (f.lstat_errno != 0) return errno = f.lstat_errno, -1;
      return os::RealSyscalls().lstat(p, st);
    };
    table_.fchown = [](int fd, uid_t u, gid_t g) {
      if (f.fchown_errno != 0) return errno = f.fchown_errno, -1;
      return os::RealSyscalls().fchown(fd, u, g);
    };
    table_.futimens = [](int fd, const struct timespec* t) {
      if (f.futimens_errno != 0) return errno = f.futimens_errno, -1;
      return os::RealSyscalls().futimens(fd, t);
    };
    table_.renameat2 = [](int a, const char* p, int b, const char* q,
                          unsigned fl) {
      if (f.renameat2_errno != 0) return errno = f.renameat2_errno, -1;
      return os::RealSyscalls().renameat2(a, p, b, q, fl);
    };
    table_.link = [](const char* p, const char* q) {
      ++f.links;
      if (f.link_errno != 0) return errno = f.link_errno, -1;
      return os::RealSyscalls().link(p, q);
    };
    table_.realpath = [](const char* p, char* out) -> char* {
      if (f.realpath_errno != 0) return errno = f.realpath_errno, nullptr;
      return os::RealSyscalls().realpath(p, out);
    };
    table_.open = [](const char* p, int fl, mode_t m) {
      if (f.temp_open_errno != 0 && std::strstr(p, ".bufpool-copy.")) {
        return errno = f.temp_open_errno, -1;
      }
      return os::RealSyscalls().open(p, fl, m);
    };
  }
  absl::StatusOr<CopyStats> Run(const std::string& dst, CopyOptions o) {
    os::ScopedSyscalls seam(&table_);
    return CopyFile(src_, dst, o);
  }
  static CopyOptions Atomic() {
    CopyOptions o;
    o.replace = Replace::kAtomic;
    return o;
  }
  os::SyscallTable table_;
};

TEST_F(SeamTest, LstatErrorNamesTheDestination) {
  f.lstat_errno = EIO;
  absl::StatusOr<CopyStats> r = Run(Path("dst"), {});
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().message(),
            "stat destination: " + Path("dst") + ": Input/output error");
}

TEST_F(SeamTest, OwnerRefusedForTheReplacementLeavesTheOldFile) {
  if (!Root()) GTEST_SKIP() << "needs a destination owned by someone else";
  WriteFileOrDie(Path("dst"), "old");
  ASSERT_EQ(chown(Path("dst").c_str(), kNobody, kNogroup), 0);
  f.fchown_errno = EPERM;
  absl::StatusOr<CopyStats> r = Run(Path("dst"), Atomic());
  ASSERT_FALSE(r.ok());
  EXPECT_TRUE(Contains(r.status(), "give the new file the owner and group of"))
      << r.status();
  EXPECT_EQ(ReadFileOrDie(Path("dst")), "old");
  EXPECT_EQ(
      std::system(("ls -a '" + dir_ + "' | grep -q bufpool-copy").c_str()) != 0,
      true);  // no temporary file left
}

TEST_F(SeamTest, TimesErrorIsReportedAndANewFileRemoved) {
  f.futimens_errno = EIO;
  CopyOptions o;
  o.preserve_timestamps = true;
  absl::StatusOr<CopyStats> r = Run(Path("dst"), o);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().message(),
            "set times of: " + Path("dst") + ": Input/output error");
  EXPECT_NE(access(Path("dst").c_str(), F_OK), 0);
}

TEST_F(SeamTest, NoClobberWithoutRenameNoreplaceUsesLink) {
  CopyOptions o = Atomic();
  o.no_clobber = true;
  f.renameat2_errno = EINVAL;
  absl::StatusOr<CopyStats> r = Run(Path("dst"), o);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(f.links, 1);
  EXPECT_EQ(ReadFileOrDie(Path("dst")), "twelve bytes");
  EXPECT_EQ(Lstat(Path("dst")).st_nlink, 1u);  // the temporary name is gone
  // A name that appears during the copy is never replaced.
  f.link_errno = EEXIST;
  r = Run(Path("dst2"), o);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kAlreadyExists);
  f.renameat2_errno = EEXIST;
  r = Run(Path("dst3"), o);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kAlreadyExists);
}

TEST_F(SeamTest, RealpathErrorNamesTheLink) {
  WriteFileOrDie(Path("target"), "old");
  ASSERT_EQ(symlink("target", Path("link").c_str()), 0);
  f.realpath_errno = ELOOP;
  absl::StatusOr<CopyStats> r = Run(Path("link"), Atomic());
  ASSERT_FALSE(r.ok());
  EXPECT_TRUE(Contains(r.status(), "resolve symbolic link: " + Path("link")))
      << r.status();
  EXPECT_EQ(ReadFileOrDie(Path("target")), "old");
}

TEST_F(SeamTest, RefusedTemporaryNameSuggestsInPlace) {
  WriteFileOrDie(Path("dst"), "old");
  f.temp_open_errno = EPERM;
  absl::StatusOr<CopyStats> r = Run(Path("dst"), Atomic());
  ASSERT_FALSE(r.ok());
  EXPECT_TRUE(Contains(r.status(), "create temporary file for: " + Path("dst")))
      << r.status();
  EXPECT_TRUE(Contains(r.status(), "in-place copy")) << r.status();
  EXPECT_EQ(ReadFileOrDie(Path("dst")), "old");
}

TEST_F(SeamTest, InspectPathFollowsLinksAndKeepsStatsErrno) {
  ASSERT_EQ(mkdir(Path("d").c_str(), 0755), 0);
  ASSERT_EQ(symlink("d", Path("to_d").c_str()), 0);
  ASSERT_EQ(mkfifo(Path("fifo").c_str(), 0600), 0);
  PathInfo i = InspectPath(Path("to_d"));
  EXPECT_TRUE(i.directory);
  EXPECT_FALSE(i.regular);
  EXPECT_EQ(i.error, 0);
  i = InspectPath(src_);
  EXPECT_TRUE(i.regular);
  EXPECT_FALSE(i.directory);
  i = InspectPath(Path("fifo"));
  EXPECT_FALSE(i.regular || i.directory);
  EXPECT_EQ(i.error, 0);
  EXPECT_EQ(InspectPath(Path("none")).error, ENOENT);
}

TEST_F(SeamTest, CopyDestinationNamesWhatCopyFileWrites) {
  ASSERT_EQ(mkdir(Path("d").c_str(), 0755), 0);
  EXPECT_EQ(CopyDestination(src_, Path("d")), Path("d/src"));
  EXPECT_EQ(CopyDestination(src_ + "/", Path("d") + "/"), Path("d/src"));
  EXPECT_EQ(CopyDestination(src_, Path("new")), Path("new"));
  absl::StatusOr<CopyStats> r = CopyFile(src_, Path("d"));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->destination, CopyDestination(src_, Path("d")));
}

TEST_F(SeamTest, VerifyCopyComparesRegularFilesOnly) {
  WriteFileOrDie(Path("same"), "twelve bytes");
  WriteFileOrDie(Path("other"), "twelve bytez");
  WriteFileOrDie(Path("short"), "twelve");
  absl::StatusOr<bool> v = VerifyCopy(src_, Path("same"));
  ASSERT_TRUE(v.ok()) << v.status();
  EXPECT_TRUE(*v);
  v = VerifyCopy(src_, Path("other"));
  EXPECT_EQ(v.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ(v.status().message(), "verify: " + Path("other") +
                                      ": differs from " + src_ + " at byte 11");
  v = VerifyCopy(src_, Path("short"));
  EXPECT_EQ(v.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_TRUE(Contains(v.status(), "at byte 6")) << v.status();
  v = VerifyCopy(src_, "/dev/null");  // not read back: not a regular file
  ASSERT_TRUE(v.ok()) << v.status();
  EXPECT_FALSE(*v);
  v = VerifyCopy(Path("none"), Path("same"));
  EXPECT_EQ(v.status().code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(Contains(v.status(), "verify: " + Path("none"))) << v.status();
}

TEST_F(SeamTest, VerifyCopyReportsAReadErrorThroughTheSeam) {
  WriteFileOrDie(Path("same"), "twelve bytes");
  table_.readv = [](int fd, const iovec* iov, int n) -> ssize_t {
    if (f.readv_errno != 0) return errno = f.readv_errno, -1;
    return os::RealSyscalls().readv(fd, iov, n);
  };
  f.readv_errno = EIO;
  os::ScopedSyscalls seam(&table_);
  absl::StatusOr<bool> v = VerifyCopy(src_, Path("same"));
  ASSERT_FALSE(v.ok());
  EXPECT_TRUE(Contains(v.status(), "verify: read: " + src_)) << v.status();
  EXPECT_TRUE(Contains(v.status(), "Input/output error")) << v.status();
}

}  // namespace
}  // namespace bufpool

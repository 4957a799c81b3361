// CopyTree: every kind of entry recreated as cp -R recreates it, errors on
// one entry reported while the rest is copied, and each system call of the
// walk failing through the OS seam.
#include <fcntl.h>
#include <grp.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <sstream>
#include <string>

#include "bufpool/file_copy.h"
#include "gtest/gtest.h"
#include "os/file.h"
#include "os/syscalls.h"
#include "test_util.h"

namespace bufpool {
namespace {

using testing_util::Lstat;
using testing_util::ReadFileOrDie;

// The trees' files have a known mode whatever the umask: 0644 unless given.
void WriteFileOrDie(const std::string& path, const std::string& data,
                    mode_t mode = 0644) {
  testing_util::WriteFileOrDie(path, data, mode);
}

std::string Link(const std::string& path) {
  char buf[4096];
  const ssize_t n = readlink(path.c_str(), buf, sizeof buf);
  return n < 0 ? "" : std::string(buf, n);
}

class TreeTest : public testing::Test {
 protected:
  void SetUp() override {
    std::string tmpl = "/tmp/bufpool_copy_tree_test.XXXXXX";
    ASSERT_NE(mkdtemp(tmpl.data()), nullptr);
    dir_ = tmpl;
    ASSERT_EQ(chmod(dir_.c_str(), 0777), 0);
    src_ = Path("src");
    ASSERT_EQ(mkdir(src_.c_str(), 0755), 0);
    old_umask_ = umask(022);
  }
  void TearDown() override {
    umask(old_umask_);
    ASSERT_EQ(
        std::system(
            ("chmod -R u+rwx '" + dir_ + "'; rm -rf '" + dir_ + "'").c_str()),
        0);
  }
  std::string Path(const std::string& name) const { return dir_ + "/" + name; }
  std::string S(const std::string& name) const { return src_ + "/" + name; }

  std::string dir_, src_;
  mode_t old_umask_ = 022;
};

TEST_F(TreeTest, RecreatesEveryKindOfEntry) {
  ASSERT_EQ(mkdir(S("a").c_str(), 0750), 0);
  ASSERT_EQ(mkdir(S("a/b").c_str(), 0755), 0);
  ASSERT_EQ(mkdir(S("a/b/c").c_str(), 0700), 0);
  WriteFileOrDie(S("a/b/c/deep"), "deep", 0600);
  ASSERT_EQ(chmod(S("a/b").c_str(), 0555), 0);  // read-only: still filled
  WriteFileOrDie(S("a/f"), "file", 04755);
  WriteFileOrDie(S("empty"), "");
  WriteFileOrDie(S("with space"), "space");
  WriteFileOrDie(S("new\nline"), "newline");
  ASSERT_EQ(symlink("a/f", S("rel").c_str()), 0);
  ASSERT_EQ(symlink("/etc/hostname", S("abs").c_str()), 0);
  ASSERT_EQ(symlink("nowhere", S("dangling").c_str()), 0);
  ASSERT_EQ(symlink("a", S("todir").c_str()), 0);
  ASSERT_EQ(mkfifo(S("fifo").c_str(), 0640), 0);
  ASSERT_EQ(link(S("a/f").c_str(), S("hard").c_str()), 0);
  WriteFileOrDie(S("sparse"), "");
  {
    const int fd = open(S("sparse").c_str(), O_WRONLY);
    ASSERT_EQ(pwrite(fd, "mid", 3, 3 << 20), 3);
    ASSERT_EQ(ftruncate(fd, 8 << 20), 0);
    close(fd);
  }
  const bool root = geteuid() == 0;
  if (root) {
    ASSERT_EQ(mknod(S("null").c_str(), S_IFCHR | 0666, makedev(1, 3)), 0);
  }

  absl::StatusOr<TreeStats> r = CopyTree(src_, Path("dst"));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(r->errors.empty()) << r->errors.front();
  const std::string d = Path("dst");
  EXPECT_EQ(r->destination, d);
  EXPECT_EQ(r->files, 7u);
  EXPECT_EQ(r->directories, 4u);
  EXPECT_EQ(r->symlinks, 4u);
  EXPECT_EQ(r->nodes, root ? 2u : 1u);
  EXPECT_EQ(Lstat(d).st_mode & 07777, 0755u);
  EXPECT_EQ(Lstat(d + "/a").st_mode & 07777, 0750u);
  EXPECT_EQ(Lstat(d + "/a/b").st_mode & 07777, 0555u);
  EXPECT_EQ(ReadFileOrDie(d + "/a/b/c/deep"), "deep");
  EXPECT_EQ(Lstat(d + "/a/f").st_mode & 07777, 0755u);  // no setuid
  EXPECT_EQ(ReadFileOrDie(d + "/empty"), "");
  EXPECT_EQ(ReadFileOrDie(d + "/with space"), "space");
  EXPECT_EQ(ReadFileOrDie(d + "/new\nline"), "newline");
  for (const char* l : {"rel", "abs", "dangling", "todir"}) {
    EXPECT_TRUE(S_ISLNK(Lstat(d + "/" + l).st_mode)) << l;
    EXPECT_EQ(Link(d + "/" + l), Link(S(l))) << l;
  }
  EXPECT_TRUE(S_ISFIFO(Lstat(d + "/fifo").st_mode));
  EXPECT_EQ(Lstat(d + "/fifo").st_mode & 07777, 0640u);
  // Hard links become separate files, as with cp -R.
  EXPECT_EQ(Lstat(d + "/hard").st_nlink, 1u);
  EXPECT_NE(Lstat(d + "/hard").st_ino, Lstat(d + "/a/f").st_ino);
  EXPECT_EQ(ReadFileOrDie(d + "/hard"), "file");
  EXPECT_EQ(ReadFileOrDie(d + "/sparse"), ReadFileOrDie(S("sparse")));
  EXPECT_LE(Lstat(d + "/sparse").st_blocks, 64);  // the holes stayed holes
  if (root) {
    EXPECT_TRUE(S_ISCHR(Lstat(d + "/null").st_mode));
    EXPECT_EQ(Lstat(d + "/null").st_rdev, makedev(1, 3));
  }
}

TEST_F(TreeTest, IntoAnExistingDirectoryAndMergingAgain) {
  WriteFileOrDie(S("f"), "one");
  ASSERT_EQ(mkdir(Path("into").c_str(), 0755), 0);
  absl::StatusOr<TreeStats> r = CopyTree(src_, Path("into"));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->destination, Path("into/src"));
  EXPECT_EQ(ReadFileOrDie(Path("into/src/f")), "one");
  WriteFileOrDie(S("f"), "two");
  WriteFileOrDie(S("g"), "new");
  r = CopyTree(src_, Path("into/"));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(r->errors.empty());
  EXPECT_EQ(ReadFileOrDie(Path("into/src/f")), "two");  // in place
  EXPECT_EQ(ReadFileOrDie(Path("into/src/g")), "new");
}

TEST_F(TreeTest, NoClobberSkipsExistingEntriesSilently) {
  WriteFileOrDie(S("f"), "new");
  ASSERT_EQ(symlink("f", S("l").c_str()), 0);
  ASSERT_EQ(mkfifo(S("p").c_str(), 0644), 0);
  ASSERT_EQ(mkdir(Path("into").c_str(), 0755), 0);
  CopyOptions o;
  o.no_clobber = true;
  absl::StatusOr<TreeStats> r = CopyTree(src_, Path("into"), o);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(r->errors.empty()) << r->errors[0];
  // Merging again: every entry exists now, and none is an error or changed.
  WriteFileOrDie(S("f"), "newer");
  r = CopyTree(src_, Path("into"), o);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(r->errors.empty()) << r->errors[0];
  EXPECT_EQ(ReadFileOrDie(Path("into/src/f")), "new");
  EXPECT_EQ(Link(Path("into/src/l")), "f");
  EXPECT_TRUE(S_ISFIFO(Lstat(Path("into/src/p")).st_mode));
}

TEST_F(TreeTest, ASymlinkToADirectoryAtAFilesPlaceIsRefused) {
  WriteFileOrDie(S("x"), "data");
  ASSERT_EQ(mkdir(Path("elsewhere").c_str(), 0755), 0);
  ASSERT_EQ(mkdir(Path("dst").c_str(), 0755), 0);
  ASSERT_EQ(mkdir(Path("dst/src").c_str(), 0755), 0);
  ASSERT_EQ(symlink(Path("elsewhere").c_str(), Path("dst/src/x").c_str()), 0);
  absl::StatusOr<TreeStats> r = CopyTree(src_, Path("dst"));
  ASSERT_TRUE(r.ok()) << r.status();  // the entry failed, not the tree
  ASSERT_EQ(r->errors.size(), 1u);
  EXPECT_NE(r->errors[0].find("cannot overwrite directory"), std::string::npos)
      << r->errors[0];
  EXPECT_NE(access(Path("elsewhere/x").c_str(), F_OK), 0);  // nothing inside
}

TEST_F(TreeTest, SocketsAreReportedAndSkipped) {
  WriteFileOrDie(S("f"), "kept");
  const int fd = socket(AF_UNIX, SOCK_STREAM, 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::strncpy(addr.sun_path, S("sock").c_str(), sizeof(addr.sun_path) - 1);
  ASSERT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
  absl::StatusOr<TreeStats> r = CopyTree(src_, Path("dst"));
  close(fd);
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(r->errors.size(), 1u);
  EXPECT_EQ(r->errors[0].find("skipped: " + S("sock")), 0u) << r->errors[0];
  EXPECT_EQ(ReadFileOrDie(Path("dst/f")), "kept");
}

TEST_F(TreeTest, RefusesToCopyADirectoryIntoItself) {
  ASSERT_EQ(mkdir(S("sub").c_str(), 0755), 0);
  for (const std::string& dst : {S("sub"), S("sub/x"), src_}) {
    absl::StatusOr<TreeStats> r = CopyTree(src_, dst);
    ASSERT_FALSE(r.ok()) << dst;
    EXPECT_NE(r.status().message().find("into itself"), std::string::npos)
        << r.status();
  }
  EXPECT_NE(access(S("sub/src").c_str(), F_OK), 0);
}

TEST_F(TreeTest, AFileSourceIsRefused) {
  WriteFileOrDie(S("f"), "x");
  absl::StatusOr<TreeStats> r = CopyTree(S("f"), Path("dst"));
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().message(),
            "source is not a directory: " + S("f") + ": Not a directory");
}

TEST_F(TreeTest, PreserveAppliesToDirectoriesLinksAndFiles) {
  ASSERT_EQ(mkdir(S("d").c_str(), 0700), 0);
  WriteFileOrDie(S("d/f"), "x", 02750);
  ASSERT_EQ(symlink("d/f", S("l").c_str()), 0);
  const struct timespec t[2] = {{1000000000, 0}, {1100000000, 0}};
  for (const char* p : {"d/f", "l", "d"}) {
    ASSERT_EQ(utimensat(AT_FDCWD, S(p).c_str(), t, AT_SYMLINK_NOFOLLOW), 0);
  }
  CopyOptions o;
  o.preserve_mode = o.preserve_ownership = o.preserve_timestamps = true;
  absl::StatusOr<TreeStats> r = CopyTree(src_, Path("dst"), o);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(r->errors.empty()) << r->errors.front();
  for (const char* p : {"d/f", "l", "d"}) {
    EXPECT_EQ(Lstat(Path("dst/") + p).st_mtim.tv_sec, 1100000000) << p;
  }
  EXPECT_EQ(Lstat(Path("dst/d/f")).st_mode & 07777, 02750u);
  EXPECT_EQ(Lstat(Path("dst/d")).st_mode & 07777, 0700u);
}

// As nobody, an unreadable file and an unreadable directory are reported;
// everything else is copied.
TEST_F(TreeTest, UnreadableEntriesAreReportedAndTheRestCopied) {
  if (geteuid() != 0) GTEST_SKIP() << "switching to nobody needs root";
  WriteFileOrDie(S("ok"), "fine");
  WriteFileOrDie(S("secret"), "no", 0600);
  ASSERT_EQ(mkdir(S("closed").c_str(), 0700), 0);
  WriteFileOrDie(S("closed/inside"), "no");
  ASSERT_EQ(mkdir(S("open").c_str(), 0755), 0);
  WriteFileOrDie(S("open/also"), "fine too");
  const std::string report = Path("report");
  const pid_t pid = fork();
  if (pid == 0) {
    if (setgroups(0, nullptr) != 0 || setgid(65534) != 0 ||
        setuid(65534) != 0) {
      _exit(99);
    }
    absl::StatusOr<TreeStats> r = CopyTree(src_, Path("dst"));
    if (!r.ok()) _exit(2);
    std::ofstream out(report);
    for (const std::string& e : r->errors) out << e << "\n";
    out.close();  // _exit skips the destructor
    _exit(r->errors.size() == 2 ? 0 : 3);
  }
  int status = 0;
  waitpid(pid, &status, 0);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0) << ReadFileOrDie(report);
  const std::string errors = ReadFileOrDie(report);
  EXPECT_NE(errors.find("open source: " + S("secret") + ": Permission denied"),
            std::string::npos)
      << errors;
  EXPECT_NE(
      errors.find("open directory: " + S("closed") + ": Permission denied"),
      std::string::npos)
      << errors;
  EXPECT_EQ(ReadFileOrDie(Path("dst/ok")), "fine");
  EXPECT_EQ(ReadFileOrDie(Path("dst/open/also")), "fine too");
}

// ---- Each system call of the walk failing, through the OS seam ---------

struct WalkFaults {
  std::string fail_path;  // calls on a path ending with this fail
  int err = EIO;
  bool readdir_fails = false;
} w;

bool Hit(const char* path) {
  const std::string p = path;
  return !w.fail_path.empty() && p.size() >= w.fail_path.size() &&
         p.compare(p.size() - w.fail_path.size(), w.fail_path.size(),
                   w.fail_path) == 0;
}

class WalkSeamTest : public TreeTest {
 protected:
  void SetUp() override {
    TreeTest::SetUp();
    w = WalkFaults{};
    ASSERT_EQ(mkdir(S("sub").c_str(), 0755), 0);
    WriteFileOrDie(S("sub/f"), "in sub");
    WriteFileOrDie(S("top"), "top");
    ASSERT_EQ(symlink("top", S("link").c_str()), 0);
    ASSERT_EQ(mkfifo(S("fifo").c_str(), 0644), 0);
    t_ = os::RealSyscalls();
    t_.mkdir = [](const char* p, mode_t m) {
      return Hit(p) ? (errno = w.err, -1) : os::RealSyscalls().mkdir(p, m);
    };
    t_.symlink = [](const char* a, const char* p) {
      return Hit(p) ? (errno = w.err, -1) : os::RealSyscalls().symlink(a, p);
    };
    t_.readlink = [](const char* p, char* b, size_t n) -> ssize_t {
      return Hit(p) ? (errno = w.err, -1)
                    : os::RealSyscalls().readlink(p, b, n);
    };
    t_.mknod = [](const char* p, mode_t m, dev_t d) {
      return Hit(p) ? (errno = w.err, -1) : os::RealSyscalls().mknod(p, m, d);
    };
    t_.opendir = [](const char* p) -> DIR* {
      return Hit(p) ? (errno = w.err, nullptr) : os::RealSyscalls().opendir(p);
    };
    t_.readdir = [](DIR* d) -> dirent* {
      if (w.readdir_fails) return errno = w.err, nullptr;
      return os::RealSyscalls().readdir(d);
    };
    t_.lchown = [](const char* p, uid_t u, gid_t g) {
      return Hit(p) ? (errno = w.err, -1) : os::RealSyscalls().lchown(p, u, g);
    };
    t_.utimensat = [](int fd, const char* p, const struct timespec* ts,
                      int fl) {
      return Hit(p) ? (errno = w.err, -1)
                    : os::RealSyscalls().utimensat(fd, p, ts, fl);
    };
    t_.chmod = [](const char* p, mode_t m) {
      return Hit(p) ? (errno = w.err, -1) : os::RealSyscalls().chmod(p, m);
    };
  }
  absl::StatusOr<TreeStats> Run(CopyOptions o = {}) {
    os::ScopedSyscalls seam(&t_);
    return CopyTree(src_, Path("dst"), o);
  }
  // The one error expected, and everything else copied.
  void ExpectOneError(const absl::StatusOr<TreeStats>& r,
                      const std::string& line, const char* missing) {
    ASSERT_TRUE(r.ok()) << r.status();
    ASSERT_EQ(r->errors.size(), 1u) << (r->errors.empty() ? "" : r->errors[0]);
    EXPECT_EQ(r->errors[0], line);
    for (const char* p : {"sub/f", "top", "link", "fifo"}) {
      if (*missing != 0 && std::string(p).rfind(missing, 0) == 0) continue;
      struct stat st;
      EXPECT_EQ(lstat(Path(std::string("dst/") + p).c_str(), &st), 0) << p;
    }
  }
  os::SyscallTable t_;
};

TEST_F(WalkSeamTest, MkdirFailure) {
  w.fail_path = "dst/sub";
  ExpectOneError(
      Run(), "create directory: " + Path("dst/sub") + ": Input/output error",
      "sub");
}

TEST_F(WalkSeamTest, MkdirOfTheRootFailsTheCall) {
  w.fail_path = "/dst";
  absl::StatusOr<TreeStats> r = Run();
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().message(),
            "create directory: " + Path("dst") + ": Input/output error");
}

TEST_F(WalkSeamTest, SymlinkAndReadlinkFailures) {
  w.fail_path = "dst/link";
  ExpectOneError(
      Run(),
      "create symbolic link: " + Path("dst/link") + ": Input/output error",
      "link");
  ASSERT_EQ(std::system(("rm -rf '" + Path("dst") + "'").c_str()), 0);
  w.fail_path = "src/link";
  ExpectOneError(Run(),
                 "read symbolic link: " + S("link") + ": Input/output error",
                 "link");
}

TEST_F(WalkSeamTest, MknodFailure) {
  w.fail_path = "dst/fifo";
  ExpectOneError(Run(),
                 "create FIFO: " + Path("dst/fifo") + ": Input/output error",
                 "fifo");
}

TEST_F(WalkSeamTest, OpendirAndReaddirFailures) {
  w.fail_path = "src/sub";
  ExpectOneError(Run(), "open directory: " + S("sub") + ": Input/output error",
                 "sub/f");
  ASSERT_EQ(std::system(("rm -rf '" + Path("dst") + "'").c_str()), 0);
  w = WalkFaults{};
  w.readdir_fails = true;
  absl::StatusOr<TreeStats> r = Run();
  ASSERT_TRUE(r.ok());
  ASSERT_EQ(r->errors.size(), 1u);
  EXPECT_EQ(r->errors[0], "read directory: " + src_ + ": Input/output error");
}

TEST_F(WalkSeamTest, PreserveFailuresOnLinksAndDirectories) {
  t_.symlink = os::RealSyscalls().symlink;  // only the attributes fail
  t_.mkdir = os::RealSyscalls().mkdir;
  CopyOptions o;
  o.preserve_timestamps = true;
  w.fail_path = "dst/link";
  ExpectOneError(
      Run(o), "set times of: " + Path("dst/link") + ": Input/output error", "");
  ASSERT_EQ(std::system(("rm -rf '" + Path("dst") + "'").c_str()), 0);
  o = {};
  o.preserve_ownership = true;
  w.fail_path = "dst/sub";
  w.err = EIO;  // EPERM would be no error
  ExpectOneError(
      Run(o), "set owner of: " + Path("dst/sub") + ": Input/output error", "");
}

TEST_F(WalkSeamTest, ReadOnlyDirectoryModeFailure) {
  ASSERT_EQ(chmod(S("sub").c_str(), 0555), 0);
  w.fail_path = "dst/sub";
  // mkdir is not hit (it ends with "dst/sub" too): only chmod may fail, so
  // mkdir is let through by failing nothing but chmod.
  t_.mkdir = os::RealSyscalls().mkdir;
  ExpectOneError(
      Run(), "set mode of: " + Path("dst/sub") + ": Input/output error", "");
}

}  // namespace
}  // namespace bufpool

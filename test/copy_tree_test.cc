// CopyTree: every kind of entry recreated as cp -R recreates it, errors on
// one entry reported while the rest is copied, and each system call of the
// walk failing through the OS seam.
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
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "bufpool/file_copy.h"
#include "gtest/gtest.h"
#include "os/file.h"
#include "os/syscalls.h"
#include "os/uring.h"
#include "test_util.h"

namespace bufpool {
namespace {

using testing_util::BindUnixSocket;
using testing_util::Lstat;
using testing_util::ReadFileOrDie;
using testing_util::UniqueFd;

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
    const UniqueFd fd(open(S("sparse").c_str(), O_WRONLY));
    ASSERT_EQ(pwrite(fd.get(), "mid", 3, 3 << 20), 3);
    ASSERT_EQ(ftruncate(fd.get(), 8 << 20), 0);
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
  const UniqueFd sock = BindUnixSocket(S("sock"));
  ASSERT_TRUE(sock.valid());
  absl::StatusOr<TreeStats> r = CopyTree(src_, Path("dst"));
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
    // The walk's system calls: no ring, so that directories and links are
    // made by mkdir and symlink (their ring operations failing is
    // RingEntryFaultTest's).
    no_ring_ = os::RealUringSyscalls();
    no_ring_.uring_create = [](unsigned, std::unique_ptr<os::Uring>*) {
      return -ENOSYS;
    };
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
    os::ScopedUringSyscalls uring_seam(&no_ring_);
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
  os::UringSyscallTable no_ring_;
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

// ---- The io_uring tree copy and the threaded fallback -------------------

// Descriptors this process has open.
int OpenFds() {
  int n = 0;
  DIR* d = opendir("/proc/self/fd");
  if (d == nullptr) return -1;
  while (dirent* e = readdir(d)) n += e->d_name[0] != '.';
  closedir(d);
  return n - 1;  // the one opendir holds
}

// What a tree holds, entry by entry: type, mode, size, contents or target.
std::map<std::string, std::string> Describe(const std::string& root) {
  std::map<std::string, std::string> out;
  std::function<void(const std::string&, const std::string&)> walk =
      [&](const std::string& dir, const std::string& rel) {
        DIR* d = opendir(dir.c_str());
        if (d == nullptr) return;
        std::vector<std::string> names;
        while (dirent* e = readdir(d)) {
          const std::string n = e->d_name;
          if (n != "." && n != "..") names.push_back(n);
        }
        closedir(d);
        for (const std::string& n : names) {
          const std::string p = dir + "/" + n;
          const std::string r = rel + "/" + n;
          const struct stat st = Lstat(p);
          std::ostringstream desc;
          desc << std::oct << st.st_mode << std::dec << " " << st.st_size;
          if (S_ISREG(st.st_mode)) {
            desc << " " << std::hash<std::string>()(ReadFileOrDie(p))
                 << " blocks " << (st.st_blocks > 0);
          }
          if (S_ISLNK(st.st_mode)) desc << " -> " << Link(p);
          out[r] = desc.str();
          if (S_ISDIR(st.st_mode)) walk(p, r);
        }
      };
  walk(root, "");
  return out;
}

// The two ways a tree's files are copied; the test seam picks one.
// kRingNoEntries: the ring without mkdirat and symlinkat (a 5.6 kernel).
enum class Walker { kRing, kThreads, kThreadsNoStatx, kRingNoEntries };

// Wraps the real ring; makes the kernel fail one operation of the first
// file that reaches it (a bad descriptor, so that links behave as for a
// real failure), then reports `err` for it. A failed close still closes.
struct RingFaults {
  Walker walker = Walker::kRing;
  std::string fail;  // "statx", "open src", "open dst", "read", "write",
                     // "close dst", "mkdir", "symlink", or empty
  int err = EIO;
  int skip = 0;       // operations of that kind let through first
  bool done = false;  // the one failure was injected
  int mkdirs = 0;     // mkdirat and symlinkat operations prepared
  int symlinks = 0;
} f;

class FaultRing final : public os::Uring {
 public:
  explicit FaultRing(std::unique_ptr<os::Uring> real)
      : real_(std::move(real)) {}
  int RegisterBuffers(const iovec* iov, unsigned n) override {
    return real_->RegisterBuffers(iov, n);
  }
  int UnregisterBuffers() override { return real_->UnregisterBuffers(); }
  bool PrepareRead(int fd, void* buf, unsigned len, uint64_t off, int index,
                   uint64_t ud) override {
    if (Inject("read"))
      return real_->PrepareRead(-1, buf, len, off, -1, ud | kTag);
    return real_->PrepareRead(fd, buf, len, off, index, ud);
  }
  bool PrepareWrite(int fd, const void* buf, unsigned len, uint64_t off,
                    int index, uint64_t ud) override {
    if (Inject("write")) {
      return real_->PrepareWrite(-1, buf, len, off, -1, ud | kTag);
    }
    return real_->PrepareWrite(fd, buf, len, off, index, ud);
  }
  int SubmitAndWait(unsigned wait_nr) override {
    // "submit": io_uring_enter fails from the second call on.
    if (f.fail == "submit" && ++submits_ > 1) {
      f.done = true;
      return -f.err;
    }
    return real_->SubmitAndWait(wait_nr);
  }
  bool PopCompletion(Completion* out) override {
    if (!real_->PopCompletion(out)) return false;
    if (out->user_data & kTag) out->res = -f.err;
    if ((out->user_data & kWritable) && out->res >= 0)
      writable_.push_back(out->res);
    out->user_data &= ~(kTag | kWritable);
    return true;
  }
  bool Supports(Op op) override {
    if (f.walker == Walker::kThreadsNoStatx && op == Op::kStatx) return false;
    if (f.walker == Walker::kRingNoEntries &&
        (op == Op::kMkdirat || op == Op::kSymlinkat)) {
      return false;
    }
    return real_->Supports(op);
  }
  bool PrepareMkdirat(int dirfd, const char* path, mode_t mode,
                      uint64_t ud) override {
    ++f.mkdirs;
    if (Inject("mkdir")) {
      return real_->PrepareMkdirat(-1, "fault", mode, ud | kTag);
    }
    return real_->PrepareMkdirat(dirfd, path, mode, ud);
  }
  bool PrepareSymlinkat(const char* target, int dirfd, const char* path,
                        uint64_t ud) override {
    ++f.symlinks;
    if (Inject("symlink")) {
      return real_->PrepareSymlinkat(target, -1, "fault", ud | kTag);
    }
    return real_->PrepareSymlinkat(target, dirfd, path, ud);
  }
  bool PrepareOpenat(int dirfd, const char* path, int flags, mode_t mode,
                     uint64_t ud) override {
    const bool dst = (flags & O_ACCMODE) != O_RDONLY;
    if (Inject(dst ? "open dst" : "open src")) {
      return real_->PrepareOpenat(-1, "fault", flags, mode, ud | kTag);
    }
    return real_->PrepareOpenat(dirfd, path, flags, mode,
                                dst ? ud | kWritable : ud);
  }
  bool PrepareStatx(int dirfd, const char* path, int flags, unsigned mask,
                    struct statx* out, uint64_t ud) override {
    if (Inject("statx")) {
      return real_->PrepareStatx(-1, "fault", flags, mask, out, ud | kTag);
    }
    return real_->PrepareStatx(dirfd, path, flags, mask, out, ud);
  }
  bool PrepareClose(int fd, uint64_t ud) override {
    const bool dst =
        std::find(writable_.begin(), writable_.end(), fd) != writable_.end();
    if (dst) writable_.erase(std::find(writable_.begin(), writable_.end(), fd));
    // The real close runs; only its result is replaced.
    return real_->PrepareClose(fd, dst && Inject("close dst") ? ud | kTag : ud);
  }
  void LinkLast(Link link) override { real_->LinkLast(link); }
  unsigned SubmissionSpace() override { return real_->SubmissionSpace(); }

 private:
  static constexpr uint64_t kTag = uint64_t{1} << 62;
  static constexpr uint64_t kWritable = uint64_t{1} << 61;
  static bool Inject(const char* what) {
    if (f.done || f.fail != what) return false;
    if (f.skip > 0) {
      --f.skip;
      return false;
    }
    f.done = true;
    return true;
  }
  std::unique_ptr<os::Uring> real_;
  std::vector<int> writable_;  // descriptors opened for writing
  int submits_ = 0;
};

int FaultUringCreate(unsigned entries, std::unique_ptr<os::Uring>* out) {
  if (f.walker == Walker::kThreads) return -ENOSYS;
  std::unique_ptr<os::Uring> real;
  if (const int rc = os::CreateUring(entries, &real); rc < 0) return rc;
  *out = std::make_unique<FaultRing>(std::move(real));
  return 0;
}

// CopyTree(src, dst) with its ring's calls failed as `f` says.
absl::StatusOr<TreeStats> CopyTreeWithRingFaults(const std::string& src,
                                                 const std::string& dst) {
  os::UringSyscallTable t = os::RealUringSyscalls();
  t.uring_create = FaultUringCreate;
  os::ScopedUringSyscalls seam(&t);
  return CopyTree(src, dst);
}

class RingTreeTest : public TreeTest,
                     public testing::WithParamInterface<Walker> {
 protected:
  void SetUp() override {
    TreeTest::SetUp();
    f = RingFaults{};
    f.walker = GetParam();
    t_ = os::RealUringSyscalls();
    t_.uring_create = FaultUringCreate;
    // Is there a ring at all here (io_uring may be disabled)?
    std::unique_ptr<os::Uring> probe;
    if ((GetParam() == Walker::kRing || GetParam() == Walker::kRingNoEntries) &&
        os::CreateUring(4, &probe) < 0) {
      GTEST_SKIP() << "io_uring is not available here";
    }
  }
  absl::StatusOr<TreeStats> Run(const std::string& dst, CopyOptions o = {}) {
    os::ScopedUringSyscalls seam(&t_);
    return CopyTree(src_, dst, o);
  }
  // The walker the parameter asked for is the one that ran.
  void ExpectWalker(const TreeStats& t) {
    switch (GetParam()) {
      case Walker::kRing:
        EXPECT_TRUE(t.ring) << t.ring_fallback;
        EXPECT_EQ(t.ring_fallback, "");
        break;
      case Walker::kThreads:
        EXPECT_FALSE(t.ring);
        EXPECT_NE(t.ring_fallback.find("io_uring setup"), std::string::npos)
            << t.ring_fallback;
        break;
      case Walker::kThreadsNoStatx:
        EXPECT_FALSE(t.ring);
        EXPECT_NE(t.ring_fallback.find("no IORING_OP_STATX"), std::string::npos)
            << t.ring_fallback;
        break;
      case Walker::kRingNoEntries:
        EXPECT_TRUE(t.ring) << t.ring_fallback;
        EXPECT_EQ(f.mkdirs + f.symlinks, 0);
        break;
    }
  }
  // Whether this kernel's ring makes directories and links.
  static bool KernelHasEntryOps() {
    std::unique_ptr<os::Uring> ring;
    return os::CreateUring(4, &ring) == 0 &&
           ring->Supports(os::Uring::Op::kMkdirat) &&
           ring->Supports(os::Uring::Op::kSymlinkat);
  }
  // Small files in a few directories, one of each other kind beside them.
  void MakeMixedTree() {
    for (int d = 0; d < 4; ++d) {
      const std::string dir = S("d" + std::to_string(d));
      ASSERT_EQ(mkdir(dir.c_str(), 0755), 0);
      for (int i = 0; i < 50; ++i) {
        WriteFileOrDie(dir + "/f" + std::to_string(i),
                       testing_util::RandomBytes(1 + (i * 97) % 4096, i),
                       i % 3 == 0 ? 0600 : 0644);
      }
    }
    WriteFileOrDie(S("large"), testing_util::RandomBytes(300000, 7));
    WriteFileOrDie(S("exactly one buffer"), testing_util::RandomBytes(4096, 8));
    WriteFileOrDie(S("one more"), testing_util::RandomBytes(4097, 9));
    WriteFileOrDie(S("empty"), "", 0640);
    WriteFileOrDie(S("setuid"), "s", 04755);
    WriteFileOrDie(S("new\nline"), "newline");
    WriteFileOrDie(S("sparse"), "");
    ASSERT_EQ(truncate(S("sparse").c_str(), 3000), 0);
    ASSERT_EQ(symlink("d0/f1", S("link").c_str()), 0);
    ASSERT_EQ(mkfifo(S("fifo").c_str(), 0640), 0);
    ASSERT_EQ(mkdir(S("ro").c_str(), 0755), 0);
    WriteFileOrDie(S("ro/inside"), "read-only directory");
    ASSERT_EQ(chmod(S("ro").c_str(), 0555), 0);
  }
  os::UringSyscallTable t_;
};

TEST_P(RingTreeTest, CopiesEveryEntryAsTheOtherWalkerDoes) {
  MakeMixedTree();
  const int fds = OpenFds();
  absl::StatusOr<TreeStats> r = Run(Path("dst"));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(r->errors.empty()) << r->errors[0];
  ExpectWalker(*r);
  EXPECT_EQ(r->files, 208u);
  EXPECT_EQ(r->directories, 6u);
  EXPECT_EQ(r->symlinks, 1u);
  EXPECT_EQ(OpenFds(), fds);
  if (GetParam() == Walker::kRing && KernelHasEntryOps()) {
    // Every directory and the link were ring operations.
    EXPECT_EQ(f.mkdirs, 6);
    EXPECT_EQ(f.symlinks, 1);
  }
  std::map<std::string, std::string> want = Describe(src_);
  // New files lose set-user-ID, as cp gives them.
  EXPECT_EQ(want.erase("/setuid"), 1u);
  std::map<std::string, std::string> got = Describe(Path("dst"));
  EXPECT_EQ(Lstat(Path("dst/setuid")).st_mode & 07777, 0755u);
  got.erase("/setuid");
  EXPECT_EQ(got, want);
  // Run again into the copy: every file now exists (CopyFile writes them
  // in place), and nothing changes.
  r = Run(Path("dst/"));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(OpenFds(), fds);
}

TEST_P(RingTreeTest, PreserveAppliesToRingFiles) {
  WriteFileOrDie(S("f"), "bytes", 02751);
  WriteFileOrDie(S("empty"), "", 0600);
  const struct timespec t[2] = {{1000000000, 0}, {1100000000, 0}};
  ASSERT_EQ(utimensat(AT_FDCWD, S("f").c_str(), t, 0), 0);
  ASSERT_EQ(utimensat(AT_FDCWD, S("empty").c_str(), t, 0), 0);
  CopyOptions o;
  o.preserve_mode = o.preserve_timestamps = o.preserve_ownership = true;
  absl::StatusOr<TreeStats> r = Run(Path("dst"), o);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(r->errors.empty()) << r->errors[0];
  ExpectWalker(*r);
  for (const char* n : {"f", "empty"}) {
    const struct stat st = Lstat(Path(std::string("dst/") + n));
    EXPECT_EQ(st.st_mtim.tv_sec, 1100000000) << n;
    EXPECT_EQ(st.st_mode & 07777, Lstat(S(n)).st_mode & 07777) << n;
  }
}

TEST_P(RingTreeTest, ProgressCountsFilesAndBytesOnTheCallingThread) {
  for (int i = 0; i < 20; ++i) WriteFileOrDie(S(std::to_string(i)), "12345");
  CopyOptions o;
  CopyProgress last;
  int calls = 0;
  const std::thread::id me = std::this_thread::get_id();
  bool other_thread = false;
  o.progress = [&](const CopyProgress& p) {
    last = p;
    ++calls;
    other_thread |= std::this_thread::get_id() != me;
  };
  absl::StatusOr<TreeStats> r = Run(Path("dst"), o);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_GE(calls, 1);
  EXPECT_FALSE(other_thread);
  EXPECT_EQ(last.files_done, 20u);
  EXPECT_EQ(last.bytes_done, 100u);
}

INSTANTIATE_TEST_SUITE_P(Walkers, RingTreeTest,
                         testing::Values(Walker::kRing, Walker::kThreads,
                                         Walker::kThreadsNoStatx,
                                         Walker::kRingNoEntries),
                         [](const testing::TestParamInfo<Walker>& p) {
                           switch (p.param) {
                             case Walker::kRing:
                               return "Ring";
                             case Walker::kThreads:
                               return "NoRing";
                             case Walker::kRingNoEntries:
                               return "RingNoMkdirat";
                             default:
                               return "NoStatx";
                           }
                         });

// Each operation of the ring's chain failing for one file: one line naming
// it, the file's copy removed, every other file copied, nothing left open.
struct OpFault {
  const char* op;
  int err;
  const char* words;  // the line's start; the path follows
  bool names_dst;     // the line names the destination, not the source
};

class RingFaultTest : public TreeTest,
                      public testing::WithParamInterface<OpFault> {};

TEST_P(RingFaultTest, OneFileFailsAndTheRestIsCopied) {
  std::unique_ptr<os::Uring> probe;
  if (os::CreateUring(4, &probe) < 0) GTEST_SKIP() << "no io_uring here";
  for (int i = 0; i < 10; ++i) {
    WriteFileOrDie(S("f" + std::to_string(i)), "data " + std::to_string(i));
  }
  f = RingFaults{};
  f.fail = GetParam().op;
  f.err = GetParam().err;
  const int fds = OpenFds();
  absl::StatusOr<TreeStats> r = CopyTreeWithRingFaults(src_, Path("dst"));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(r->ring) << r->ring_fallback;
  EXPECT_TRUE(f.done);
  ASSERT_EQ(r->errors.size(), 1u);
  const std::string& line = r->errors[0];
  EXPECT_EQ(line.rfind(GetParam().words, 0), 0u) << line;
  EXPECT_NE(line.find(": " + std::string(strerror(GetParam().err))),
            std::string::npos)
      << line;
  EXPECT_EQ(r->files, 9u);
  EXPECT_EQ(OpenFds(), fds);
  int copied = 0;
  for (int i = 0; i < 10; ++i) {
    const std::string n = "f" + std::to_string(i);
    struct stat st;
    if (lstat(Path("dst/" + n).c_str(), &st) != 0) {
      // The failed one: named in the line, its copy removed.
      EXPECT_NE(line.find((GetParam().names_dst ? Path("dst/") : S("")) + n),
                std::string::npos)
          << line;
      continue;
    }
    EXPECT_EQ(ReadFileOrDie(Path("dst/" + n)), "data " + std::to_string(i));
    ++copied;
  }
  EXPECT_EQ(copied, 9);
}

INSTANTIATE_TEST_SUITE_P(
    Ops, RingFaultTest,
    testing::Values(OpFault{"statx", EIO, "stat: ", false},
                    OpFault{"open src", EACCES, "open source: ", false},
                    OpFault{"open dst", EIO, "create: ", true},
                    OpFault{"read", EIO, "read: ", false},
                    OpFault{"write", ENOSPC, "write: ", true},
                    OpFault{"close dst", EIO, "close: ", true}),
    [](const testing::TestParamInfo<OpFault>& p) {
      std::string n = p.param.op;
      std::replace(n.begin(), n.end(), ' ', '_');
      return n;
    });

// A directory's or a link's ring operation failing: one line naming the
// destination, everything else copied (the failed directory's contents
// too are missing, as cp leaves them), nothing left open.
struct EntryFault {
  const char* op;
  const char* words;
  const char* missing;  // the entry whose creation failed
};

class RingEntryFaultTest : public TreeTest,
                           public testing::WithParamInterface<EntryFault> {};

TEST_P(RingEntryFaultTest, OneEntryFailsAndTheRestIsMade) {
  std::unique_ptr<os::Uring> probe;
  if (os::CreateUring(4, &probe) < 0 ||
      !probe->Supports(os::Uring::Op::kMkdirat) ||
      !probe->Supports(os::Uring::Op::kSymlinkat)) {
    GTEST_SKIP() << "no IORING_OP_MKDIRAT / SYMLINKAT here";
  }
  // One subdirectory with a file and a link; the walk makes the root first.
  ASSERT_EQ(mkdir(S("sub").c_str(), 0755), 0);
  WriteFileOrDie(S("sub/file"), "file");
  ASSERT_EQ(symlink("file", S("sub/link").c_str()), 0);
  WriteFileOrDie(S("top"), "top");
  f = RingFaults{};
  f.fail = GetParam().op;
  f.err = EIO;
  f.skip = f.fail == "mkdir" ? 1 : 0;  // the root is made
  const int fds = OpenFds();
  absl::StatusOr<TreeStats> r = CopyTreeWithRingFaults(src_, Path("dst"));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(f.done);
  EXPECT_EQ(OpenFds(), fds);
  ASSERT_EQ(r->errors.size(), 1u);
  EXPECT_EQ(r->errors[0], std::string(GetParam().words) +
                              Path(std::string("dst/") + GetParam().missing) +
                              ": " + strerror(EIO));
  struct stat st;
  EXPECT_NE(lstat(Path(std::string("dst/") + GetParam().missing).c_str(), &st),
            0);
  EXPECT_EQ(ReadFileOrDie(Path("dst/top")), "top");
  if (f.fail == "symlink") {
    EXPECT_EQ(ReadFileOrDie(Path("dst/sub/file")), "file");
  }
}

// The root's mkdirat failing fails the call, as its mkdir does.
TEST_F(TreeTest, ARingMkdirOfTheRootFailsTheCall) {
  std::unique_ptr<os::Uring> probe;
  if (os::CreateUring(4, &probe) < 0 ||
      !probe->Supports(os::Uring::Op::kMkdirat)) {
    GTEST_SKIP() << "no IORING_OP_MKDIRAT here";
  }
  WriteFileOrDie(S("f"), "f");
  f = RingFaults{};
  f.fail = "mkdir";
  absl::StatusOr<TreeStats> r = CopyTreeWithRingFaults(src_, Path("dst"));
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().message(),
            "create directory: " + Path("dst") + ": Input/output error");
}

INSTANTIATE_TEST_SUITE_P(
    Ops, RingEntryFaultTest,
    testing::Values(EntryFault{"mkdir", "create directory: ", "sub"},
                    EntryFault{"symlink",
                               "create symbolic link: ", "sub/link"}),
    [](const testing::TestParamInfo<EntryFault>& p) {
      return std::string(p.param.op);
    });

// The ring itself failing (io_uring_enter refused) part-way: the files
// whose operations the kernel had are reported, every other one is copied
// by CopyFile; nothing is left open.
TEST_F(TreeTest, ARingThatFailsHandsTheRestToCopyFile) {
  std::unique_ptr<os::Uring> probe;
  if (os::CreateUring(4, &probe) < 0) GTEST_SKIP() << "no io_uring here";
  for (int d = 0; d < 3; ++d) {
    ASSERT_EQ(mkdir(S("d" + std::to_string(d)).c_str(), 0755), 0);
    for (int i = 0; i < 40; ++i) {
      WriteFileOrDie(S("d" + std::to_string(d) + "/f" + std::to_string(i)),
                     "data " + std::to_string(i));
    }
  }
  f = RingFaults{};
  f.fail = "submit";
  const int fds = OpenFds();
  absl::StatusOr<TreeStats> r = CopyTreeWithRingFaults(src_, Path("dst"));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(f.done);
  EXPECT_EQ(OpenFds(), fds);
  size_t missing = 0;
  for (int d = 0; d < 3; ++d) {
    for (int i = 0; i < 40; ++i) {
      const std::string n = "d" + std::to_string(d) + "/f" + std::to_string(i);
      struct stat st;
      if (lstat(Path("dst/" + n).c_str(), &st) != 0) {
        ++missing;
        continue;
      }
      // A file reported may have been written all the same; one not
      // reported must be whole.
      bool reported = false;
      for (const std::string& e : r->errors) {
        reported |= e == "io_uring submit: " + S(n) + ": Input/output error";
      }
      if (!reported) {
        EXPECT_EQ(ReadFileOrDie(Path("dst/" + n)), "data " + std::to_string(i))
            << n;
      }
    }
  }
  for (const std::string& e : r->errors) {
    EXPECT_EQ(e.rfind("io_uring submit: ", 0), 0u) << e;
  }
  EXPECT_LE(missing, r->errors.size());
  EXPECT_EQ(r->files + r->errors.size(), 120u);
}

// A caller's pool of one buffer is left to CopyFile (the ring would hold it
// for the whole tree, and a file copied with readwrite would wait for it).
TEST_F(TreeTest, APoolOfOneBufferIsLeftToCopyFile) {
  WriteFileOrDie(S("small"), "small");
  WriteFileOrDie(S("large"), testing_util::RandomBytes(100000, 4));
  PoolOptions po;
  po.buffer_count = 1;
  po.cache_size = 0;
  absl::StatusOr<std::unique_ptr<BufferPool>> pool = BufferPool::Create(po);
  ASSERT_TRUE(pool.ok()) << pool.status();
  CopyOptions o;
  o.pool = pool->get();
  o.method = CopyMethod::kReadWrite;
  absl::StatusOr<TreeStats> r = CopyTree(src_, Path("dst"), o);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(r->errors.empty()) << r->errors[0];
  EXPECT_FALSE(r->ring);
  EXPECT_NE(r->ring_fallback.find("no free buffer"), std::string::npos)
      << r->ring_fallback;
  EXPECT_EQ(ReadFileOrDie(Path("dst/large")), ReadFileOrDie(S("large")));
  EXPECT_EQ(ReadFileOrDie(Path("dst/small")), "small");
}

// A destination file system that fills up in the middle of the tree: each
// file that did not fit is one line, every file that is there is whole.
TEST_F(TreeTest, ADestinationThatFillsUpLosesNothingSilently) {
  if (geteuid() != 0) GTEST_SKIP() << "mounting tmpfs needs root";
  const std::string mnt = Path("small");
  ASSERT_EQ(mkdir(mnt.c_str(), 0755), 0);
  if (std::system(
          ("mount -t tmpfs -o size=256k tmpfs '" + mnt + "' 2>/dev/null")
              .c_str()) != 0) {
    GTEST_SKIP() << "cannot mount tmpfs here";
  }
  for (int d = 0; d < 4; ++d) {
    ASSERT_EQ(mkdir(S("d" + std::to_string(d)).c_str(), 0755), 0);
    for (int i = 0; i < 40; ++i) {
      WriteFileOrDie(S("d" + std::to_string(d) + "/f" + std::to_string(i)),
                     testing_util::RandomBytes(4096, d * 100 + i));
    }
  }
  WriteFileOrDie(S("large"), testing_util::RandomBytes(100000, 5));
  const int fds = OpenFds();
  absl::StatusOr<TreeStats> r = CopyTree(src_, mnt + "/dst");
  const int fds_after = OpenFds();
  std::map<std::string, std::string> src = Describe(src_);
  std::map<std::string, std::string> dst = Describe(mnt + "/dst");
  ASSERT_EQ(std::system(("umount '" + mnt + "'").c_str()), 0);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(fds_after, fds);
  ASSERT_FALSE(r->errors.empty());
  for (const std::string& e : r->errors) {
    EXPECT_NE(e.find("No space left on device"), std::string::npos) << e;
    EXPECT_EQ(e.find('\n'), std::string::npos) << e;
  }
  // Every regular file there is whole; every one missing was reported.
  size_t missing = 0;
  for (const auto& [name, desc] : src) {
    auto it = dst.find(name);
    if (it == dst.end()) {
      ++missing;
      continue;
    }
    if (desc[0] == '1' && desc[1] == '0') {
      EXPECT_EQ(it->second, desc) << name;
    }
  }
  EXPECT_EQ(missing, r->errors.size());
  EXPECT_EQ(r->files + missing, 161u);
}

}  // namespace
}  // namespace bufpool

// bufpool-copy side by side with GNU cp (in the manner of coreutils'
// tests/cp): each case is set up twice, identically; cp runs on one copy
// and the INSTALLED bufpool-copy on the other, with the same arguments, as
// root and as nobody:nogroup (through setpriv). The results must match:
// every entry's bytes, type, mode, owner, group, link count and link
// target, whether the destination kept its inode, the exit status, and the
// key words of the error.
#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <ostream>
#include <string>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "run_tool.h"

namespace {

using bufpool_test::Result;
using bufpool_test::Slurp;

const std::string kBin = std::string(BUFPOOL_INSTALLED_BIN) + "/bufpool-copy";
constexpr char kCp[] = "/bin/cp";
constexpr char kSetpriv[] = "/usr/bin/setpriv";
constexpr uid_t kNobody = 65534;
constexpr gid_t kNogroup = 65534;

void Write(const std::string& path, const std::string& data, mode_t mode) {
  std::ofstream(path, std::ios::binary | std::ios::trunc) << data;
  ASSERT_EQ(chmod(path.c_str(), mode), 0) << path;
}

void Own(const std::string& path, uid_t uid, gid_t gid) {
  ASSERT_EQ(lchown(path.c_str(), uid, gid), 0) << path;
}

// One line per entry under `dir` (sorted by path): what the comparison
// covers. Inode numbers differ between the two trees, so they are not in
// it; `kept` says whether `watch` kept the inode it had before the run.
void Snapshot(const std::string& root, const std::string& rel,
              std::vector<std::string>& out) {
  const std::string path = rel.empty() ? root : root + "/" + rel;
  DIR* d = opendir(path.c_str());
  ASSERT_NE(d, nullptr) << path;
  std::vector<std::string> names;
  while (dirent* e = readdir(d)) {
    const std::string n = e->d_name;
    if (n != "." && n != ".." && n[0] != '.') names.push_back(n);
  }
  closedir(d);
  std::sort(names.begin(), names.end());
  for (const std::string& n : names) {
    const std::string r = rel.empty() ? n : rel + "/" + n;
    const std::string p = root + "/" + r;
    struct stat st;
    ASSERT_EQ(lstat(p.c_str(), &st), 0) << p;
    std::string line = r + " type=" + std::to_string(st.st_mode & S_IFMT) +
                       " mode=" + std::to_string(st.st_mode & 07777) +
                       " uid=" + std::to_string(st.st_uid) +
                       " gid=" + std::to_string(st.st_gid) +
                       " nlink=" + std::to_string(st.st_nlink);
    if (S_ISREG(st.st_mode)) {
      line += " size=" + std::to_string(st.st_size) +
              " bytes=" + std::to_string(std::hash<std::string>()(Slurp(p)));
    } else if (S_ISLNK(st.st_mode)) {
      char buf[4096];
      const ssize_t k = readlink(p.c_str(), buf, sizeof buf);
      line += " -> " + std::string(buf, k < 0 ? 0 : k);
    } else if (S_ISCHR(st.st_mode) || S_ISBLK(st.st_mode)) {
      line += " rdev=" + std::to_string(st.st_rdev);
    }
    out.push_back(line);
    if (S_ISDIR(st.st_mode)) Snapshot(root, r, out);
  }
}

struct Case {
  const char* name;
  // Makes the inputs in `dir` (as root). `as_nobody`: the run that follows
  // is unprivileged.
  std::function<void(const std::string& dir, bool as_nobody)> setup;
  // "@" at the start is the case directory; "+" at the start: an argument
  // for bufpool-copy only.
  std::vector<std::string> args;
  std::string watch;               // whose inode is checked kept or not
  std::vector<std::string> words;  // in both tools' stderr
  std::string fifo;                // read while the tool runs, compared
};

// The numbered cases of the issue that motivated the in-place rules.
std::vector<Case> Cases() {
  std::vector<Case> c;
  auto chown_for = [](const std::string& dir, bool as_nobody) {
    if (as_nobody) {
      ASSERT_EQ(std::system(("chown -R nobody:nogroup '" + dir + "'").c_str()),
                0);
    }
  };
  c.push_back({"1_fifo_destination",
               [=](const std::string& d, bool n) {
                 Write(d + "/src", "twelve bytes", 0644);
                 ASSERT_EQ(mkfifo((d + "/fifo").c_str(), 0666), 0);
                 chown_for(d, n);
               },
               {"@/src", "@/fifo"},
               "fifo",
               {},
               "fifo"});
  c.push_back(
      {"1_char_device_destination",
       [](const std::string& d, bool) {
         Write(d + "/src", "twelve bytes", 0644);
         ASSERT_EQ(mknod((d + "/null").c_str(), S_IFCHR | 0666, makedev(1, 3)),
                   0);
         ASSERT_EQ(chmod((d + "/null").c_str(), 0666), 0);
       },
       {"@/src", "@/null"},
       "null",
       {},
       ""});
  c.push_back({"2_existing_mode_is_not_widened",
               [=](const std::string& d, bool n) {
                 Write(d + "/src", "new bytes", 0644);
                 Write(d + "/dst", "old", 0600);
                 chown_for(d, n);
               },
               {"@/src", "@/dst"},
               "dst",
               {},
               ""});
  c.push_back({"2_new_file_loses_setuid_under_umask",
               [=](const std::string& d, bool n) {
                 Write(d + "/src", "program", 04775);
                 chown_for(d, n);
               },
               {"@/src", "@/dst"},
               "",
               {},
               ""});
  c.push_back({"3_owner_and_group_stay",
               [](const std::string& d, bool) {
                 Write(d + "/src", "new bytes", 0644);
                 Write(d + "/dst", "old", 0666);
                 Own(d + "/dst", kNobody, kNogroup);
               },
               {"@/src", "@/dst"},
               "dst",
               {},
               ""});
  c.push_back({"4_hard_links_stay",
               [=](const std::string& d, bool n) {
                 Write(d + "/src", "new bytes", 0644);
                 Write(d + "/dst", "old", 0644);
                 ASSERT_EQ(link((d + "/dst").c_str(), (d + "/other").c_str()),
                           0);
                 chown_for(d, n);
               },
               {"@/src", "@/dst"},
               "dst",
               {},
               ""});
  c.push_back({"5_symlink_is_followed",
               [=](const std::string& d, bool n) {
                 Write(d + "/src", "new bytes", 0644);
                 Write(d + "/target", "old", 0640);
                 ASSERT_EQ(symlink("target", (d + "/link").c_str()), 0);
                 chown_for(d, n);
               },
               {"@/src", "@/link"},
               "target",
               {},
               ""});
  c.push_back({"5_dangling_symlink_is_refused",
               [=](const std::string& d, bool n) {
                 Write(d + "/src", "new bytes", 0644);
                 ASSERT_EQ(symlink("nowhere", (d + "/link").c_str()), 0);
                 chown_for(d, n);
               },
               {"@/src", "@/link"},
               "link",
               {"not writing through dangling symlink"},
               ""});
  c.push_back({"6_directory_takes_no_new_names",
               [](const std::string& d, bool) {
                 Write(d + "/src", "new bytes", 0644);
                 ASSERT_EQ(mkdir((d + "/sub").c_str(), 0755), 0);
                 Write(d + "/sub/dst", "old", 0644);
                 Own(d + "/sub/dst", kNobody, kNogroup);
               },
               {"@/src", "@/sub/dst"},
               "sub/dst",
               {},
               ""});
  auto tree = [=](const std::string& d, bool n) {
    const std::string s = d + "/tree";
    ASSERT_EQ(mkdir(s.c_str(), 0755), 0);
    ASSERT_EQ(mkdir((s + "/a").c_str(), 0750), 0);
    ASSERT_EQ(mkdir((s + "/a/b").c_str(), 0555), 0);
    Write(s + "/a/f", "file", 0640);
    Write(s + "/with space", "", 0600);
    Write(s + "/new\nline", "x", 0644);
    ASSERT_EQ(symlink("a/f", (s + "/rel").c_str()), 0);
    ASSERT_EQ(symlink("/etc/hostname", (s + "/abs").c_str()), 0);
    ASSERT_EQ(symlink("nowhere", (s + "/dangling").c_str()), 0);
    ASSERT_EQ(symlink("a", (s + "/todir").c_str()), 0);
    ASSERT_EQ(mkfifo((s + "/fifo").c_str(), 0640), 0);
    ASSERT_EQ(link((s + "/a/f").c_str(), (s + "/hard").c_str()), 0);
    Write(s + "/sparse", "", 0644);
    ASSERT_EQ(truncate((s + "/sparse").c_str(), 5 << 20), 0);
    chown_for(d, n);
  };
  // The tree as the io_uring walker copies it, and as the threaded one.
  c.push_back(
      {"7_recursive_tree", tree, {"-r", "@/tree", "@/copy"}, "", {}, ""});
  c.push_back({"7_recursive_tree_threaded_walker",
               tree,
               {"+--walker=threads", "-r", "@/tree", "@/copy"},
               "",
               {},
               ""});
  c.push_back(
      {"7_preserve",
       [=](const std::string& d, bool n) {
         Write(d + "/src", "bytes", 02751);
         const struct timespec t[2] = {{1000000000, 0}, {1100000000, 0}};
         ASSERT_EQ(utimensat(AT_FDCWD, (d + "/src").c_str(), t, 0), 0);
         chown_for(d, n);
       },
       {"-p", "@/src", "@/dst"},
       "",
       {},
       ""});
  return c;
}

struct Param {
  size_t index;
  bool as_nobody;
};
void PrintTo(const Param& p, std::ostream* os) {
  *os << Cases()[p.index].name << (p.as_nobody ? " as nobody" : " as root");
}

class VsCpTest : public testing::TestWithParam<Param> {
 protected:
  void SetUp() override {
    ASSERT_EQ(access(kBin.c_str(), X_OK), 0) << kBin << " (is it installed?)";
    if (access(kCp, X_OK) != 0) GTEST_SKIP() << "no " << kCp << " to compare";
    if (GetParam().as_nobody &&
        (geteuid() != 0 || access(kSetpriv, X_OK) != 0)) {
      GTEST_SKIP() << "running as nobody needs root and " << kSetpriv;
    }
    std::string tmpl = "/tmp/bufpool_copy_vs_cp_test.XXXXXX";
    ASSERT_NE(mkdtemp(tmpl.data()), nullptr) << std::strerror(errno);
    base_ = tmpl;
    ASSERT_EQ(chmod(base_.c_str(), 0755), 0);
  }
  void TearDown() override {
    if (!base_.empty()) {
      ASSERT_EQ(std::system(("rm -rf '" + base_ + "'").c_str()), 0);
    }
  }

  struct Outcome {
    Result result;
    std::vector<std::string> entries;
    bool inode_kept = false;
    std::string fifo_bytes;
  };

  Outcome RunOne(const Case& c, const std::string& tool,
                 const std::string& dir) {
    Outcome o;
    EXPECT_EQ(mkdir(dir.c_str(), 0755), 0);
    c.setup(dir, GetParam().as_nobody);
    struct stat before {};
    const bool watched =
        !c.watch.empty() && lstat((dir + "/" + c.watch).c_str(), &before) == 0;
    std::vector<std::string> args;
    for (const std::string& a : c.args) {
      if (a[0] == '+') {
        if (tool != kCp) args.push_back(a.substr(1));
        continue;
      }
      args.push_back(a[0] == '@' ? dir + a.substr(1) : a);
    }
    std::thread reader;
    if (!c.fifo.empty()) {
      reader = std::thread(
          [&] { o.fifo_bytes = Slurp(dir + "/" + std::string(c.fifo)); });
    }
    if (GetParam().as_nobody) {
      args.insert(args.begin(), {"--reuid=nobody", "--regid=nogroup",
                                 "--clear-groups", tool});
      o.result = bufpool_test::RunTool(kSetpriv, args, base_);
    } else {
      o.result = bufpool_test::RunTool(tool, args, base_);
    }
    if (reader.joinable()) reader.join();
    struct stat after {};
    o.inode_kept = watched &&
                   lstat((dir + "/" + c.watch).c_str(), &after) == 0 &&
                   after.st_ino == before.st_ino;
    Snapshot(dir, "", o.entries);
    return o;
  }

  std::string base_;
};

TEST_P(VsCpTest, SameResultAsGnuCp) {
  const Case c = Cases()[GetParam().index];
  if (std::string(c.name) == "1_char_device_destination" && geteuid() != 0) {
    GTEST_SKIP() << "mknod needs root";
  }
  const Outcome cp = RunOne(c, kCp, base_ + "/cp");
  const Outcome ours = RunOne(c, kBin, base_ + "/bufpool");
  EXPECT_EQ(ours.result.status, cp.result.status)
      << "cp: " << cp.result.err << "bufpool-copy: " << ours.result.err;
  EXPECT_EQ(ours.entries, cp.entries);
  EXPECT_EQ(ours.inode_kept, cp.inode_kept);
  EXPECT_EQ(ours.fifo_bytes, cp.fifo_bytes);
  EXPECT_EQ(ours.result.err.empty(), cp.result.err.empty())
      << "cp: " << cp.result.err << "bufpool-copy: " << ours.result.err;
  for (const std::string& w : c.words) {
    EXPECT_NE(cp.result.err.find(w), std::string::npos) << cp.result.err;
    EXPECT_NE(ours.result.err.find(w), std::string::npos) << ours.result.err;
  }
}

std::vector<Param> Params() {
  std::vector<Param> p;
  for (size_t i = 0; i < Cases().size(); ++i) {
    p.push_back({i, false});
    p.push_back({i, true});
  }
  return p;
}

INSTANTIATE_TEST_SUITE_P(Cases, VsCpTest, testing::ValuesIn(Params()),
                         [](const testing::TestParamInfo<Param>& i) {
                           return std::string(Cases()[i.param.index].name) +
                                  (i.param.as_nobody ? "_as_nobody"
                                                     : "_as_root");
                         });

}  // namespace

// bufpool-copy's command line, run as the INSTALLED program (the
// tools_install fixture puts it under BUFPOOL_INSTALLED_BIN): every flag in
// both forms, every exit code, cp's conventions (SRC... DIR, -n, a file
// onto itself, a directory without -r, '-'), the one-line errors, --help,
// --json, --verify, and kill -9 in the middle of a copy.
#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "run_tool.h"
#include "test_util.h"

namespace {

const std::string kBin = std::string(BUFPOOL_INSTALLED_BIN) + "/bufpool-copy";

using bufpool::testing_util::BindUnixSocket;
using bufpool::testing_util::TempFiles;
using bufpool::testing_util::UniqueFd;
using bufpool_test::Result;
using bufpool_test::Slurp;

class CopyCliTest : public testing::Test {
 protected:
  void SetUp() override {
    ASSERT_EQ(access(kBin.c_str(), X_OK), 0)
        << kBin << ": " << std::strerror(errno) << " (is it installed?)";
    std::string tmpl = "/tmp/bufpool_copy_cli_test.XXXXXX";
    ASSERT_NE(mkdtemp(tmpl.data()), nullptr) << std::strerror(errno);
    dir_ = tmpl;
  }
  void TearDown() override {
    ASSERT_EQ(chdir("/"), 0);  // some tests work inside dir_
    ASSERT_EQ(std::system(("rm -rf '" + dir_ + "'").c_str()), 0);
  }
  std::string Path(const std::string& n) const { return dir_ + "/" + n; }

  // Runs bufpool-copy with `args` (no shell), stdin from /dev/null.
  Result Run(const std::vector<std::string>& args) {
    return bufpool_test::RunTool(kBin, args, dir_);
  }

  void Write(const std::string& name, const std::string& data) {
    std::ofstream(Path(name), std::ios::binary) << data;
  }
  bool Exists(const std::string& name) {
    struct stat st;
    return lstat(Path(name).c_str(), &st) == 0;
  }

  // A usage error: exit 2, one line naming `what`, nothing on stdout.
  void ExpectUsageError(const std::vector<std::string>& args,
                        const std::string& what) {
    Result r = Run(args);
    EXPECT_EQ(r.status, 2) << r.err;
    EXPECT_EQ(r.out, "");
    EXPECT_EQ(r.err.rfind("bufpool-copy: ", 0), 0u) << r.err;
    EXPECT_NE(r.err.find(what), std::string::npos) << r.err;
    EXPECT_TRUE(r.err.ends_with("; see 'bufpool-copy --help'\n")) << r.err;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
  }

  std::string dir_;
};

TEST_F(CopyCliTest, CopiesAndPrintsJsonWithEveryMethodInBothForms) {
  Write("a", std::string(100000, 'x'));
  for (const char* m : {"auto", "readwrite", "direct", "uring", "kernel"}) {
    SCOPED_TRACE(m);
    for (bool joined : {true, false}) {
      std::vector<std::string> args =
          joined ? std::vector<std::string>{std::string("--method=") + m}
                 : std::vector<std::string>{"--method", m};
      args.insert(args.end(), {"--json", "--verify", Path("a"), Path("b")});
      Result r = Run(args);
      EXPECT_EQ(r.status, 0) << r.err;
      EXPECT_EQ(r.err, "");  // stderr is not a terminal: no progress
      EXPECT_NE(r.out.find("\"bytes_copied\": 100000"), std::string::npos)
          << r.out;
      EXPECT_NE(r.out.find("\"method_requested\": \"" + std::string(m) + "\""),
                std::string::npos)
          << r.out;
      EXPECT_EQ(Slurp(Path("b")), Slurp(Path("a")));
      ASSERT_EQ(unlink(Path("b").c_str()), 0);
    }
  }
}

// --verbose says how each copy ran; -r --progress draws files and bytes
// when asked even though stderr is no terminal, and by default not.
TEST_F(CopyCliTest, VerboseAndTreeProgress) {
  Write("a", std::string(5000, 'v'));
  Result r = Run({"--verbose", Path("a"), Path("b")});
  EXPECT_EQ(r.status, 0) << r.err;
  EXPECT_NE(
      r.err.find("'" + Path("a") + "' -> '" + Path("b") + "': auto: kernel: "),
      std::string::npos)
      << r.err;
  ASSERT_EQ(mkdir(Path("tree").c_str(), 0755), 0);
  for (int i = 0; i < 30; ++i) Write("tree/f" + std::to_string(i), "12345");
  r = Run({"-r", "--progress", "--verbose", Path("tree"), Path("copy")});
  EXPECT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.err.find("30 files  150 B"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find(Path("tree") + ": small files through one io_uring"),
            std::string::npos)
      << r.err;
  r = Run({"-r", Path("tree"), Path("copy2")});
  EXPECT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(r.err, "");
}

TEST_F(CopyCliTest, BufferFlagsInBothFormsReachTheCopy) {
  Write("a", std::string(1 << 20, 'q'));
  // 8 buffers of 64 KiB per operation, 2 in flight: the copy holds 1 MiB.
  for (const auto& args :
       {std::vector<std::string>{"--method=uring", "--buffer-size=65536",
                                 "--batch-buffers=8", "--queue-depth=2"},
        std::vector<std::string>{"--method", "uring", "--buffer-size", "65536",
                                 "--batch-buffers", "8", "--queue-depth",
                                 "2"}}) {
    std::vector<std::string> a = args;
    a.insert(a.end(), {"--json", Path("a"), Path("b")});
    Result r = Run(a);
    EXPECT_EQ(r.status, 0) << r.err;
    EXPECT_NE(r.out.find("\"buffer_bytes\": 1048576"), std::string::npos)
        << r.out;
    EXPECT_EQ(Slurp(Path("b")), Slurp(Path("a")));
  }
  // readwrite holds one batch: 4 buffers of 1 KiB.
  Result r = Run({"--method=readwrite", "--buffer-size", "1024",
                  "--batch-buffers", "4", "--json", Path("a"), Path("c")});
  EXPECT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.out.find("\"buffer_bytes\": 4096"), std::string::npos) << r.out;
  EXPECT_EQ(Slurp(Path("c")), Slurp(Path("a")));
}

// The 0.2 name of --batch-buffers still copies, with one line on stderr that
// says so.
TEST_F(CopyCliTest, DeprecatedBufferCountCopiesWithANote) {
  Write("a", std::string(100000, 'd'));
  Result r = Run({"--method=readwrite", "--buffer-size=1024",
                  "--buffer-count=4", "--json", Path("a"), Path("b")});
  EXPECT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(r.err,
            "bufpool-copy: --buffer-count is deprecated and goes in 0.4; use "
            "--batch-buffers\n");
  EXPECT_NE(r.out.find("\"buffer_bytes\": 4096"), std::string::npos) << r.out;
  EXPECT_EQ(Slurp(Path("b")), Slurp(Path("a")));
}

TEST_F(CopyCliTest, DirectIoAndFsyncFlags) {
  Write("a", std::string(200000, 'd'));
  Result r = Run({"--method=uring", "--direct-io", "--fsync", "--json",
                  Path("a"), Path("b")});
  EXPECT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(Slurp(Path("b")), Slurp(Path("a")));
  // O_DIRECT, unless this file system refuses it (then a fallback says so).
  EXPECT_TRUE(r.out.find("\"direct_io\": true") != std::string::npos ||
              r.out.find("O_DIRECT") != std::string::npos)
      << r.out;
}

TEST_F(CopyCliTest, ProgressGoesToStderrWhenAskedAndTheLastFlagWins) {
  Write("a", std::string(300000, 'y'));
  Result r = Run({"--progress", Path("a"), Path("b")});
  EXPECT_EQ(r.status, 0);
  EXPECT_NE(r.err.find("100%"), std::string::npos) << r.err;
  EXPECT_EQ(r.out, "");
  r = Run({"--progress", "--no-progress", Path("a"), Path("c")});
  EXPECT_EQ(r.err, "");
  r = Run({"--no-progress", "--progress", Path("a"), Path("d")});
  EXPECT_NE(r.err.find("100%"), std::string::npos) << r.err;
}

TEST_F(CopyCliTest, MissingSourceIsOneErrorLineAndExitOne) {
  Result r = Run({Path("nope"), Path("b")});
  EXPECT_EQ(r.status, 1);
  EXPECT_EQ(r.err, "bufpool-copy: open source: " + Path("nope") +
                       ": No such file or directory\n");
  EXPECT_FALSE(Exists("b"));
}

// A source that changes between the copy and the re-read: /proc/self/status
// of the program itself (its memory differs once the copy's buffers are
// gone and the comparison's are in use).
TEST_F(CopyCliTest, JsonSaysHowTheDestinationWasWrittenAndIfItWasVerified) {
  Write("a", "data");
  Result r = Run({"--json", Path("a"), Path("b")});
  EXPECT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.out.find("\"replace\": \"in_place\", \"created\": true, "
                       "\"verified\": false"),
            std::string::npos)
      << r.out;
  r = Run({"--json", "--verify", "--atomic", Path("a"), Path("b")});
  EXPECT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.out.find("\"replace\": \"atomic\", \"created\": false, "
                       "\"verified\": true"),
            std::string::npos)
      << r.out;
}

TEST_F(CopyCliTest, VerifyOfAFifoDestinationDoesNotReadItBack) {
  Write("a", "data");
  ASSERT_EQ(mkfifo(Path("fifo").c_str(), 0600), 0);
  std::string got;
  std::thread reader([&] {
    std::ifstream f(Path("fifo"));
    std::getline(f, got);
  });
  Result r = Run({"--json", "--verify", Path("a"), Path("fifo")});
  reader.join();
  EXPECT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(got, "data");
  EXPECT_NE(r.out.find("\"verified\": false"), std::string::npos) << r.out;
}

TEST_F(CopyCliTest, AVerifyMismatchIsExitOne) {
  Result r = Run({"--verify", "/proc/self/status", Path("status")});
  EXPECT_EQ(r.status, 1) << r.err;
  EXPECT_EQ(r.err.rfind("bufpool-copy: verify: " + Path("status") +
                            ": differs from /proc/self/status at byte ",
                        0),
            0u)
      << r.err;
}

TEST_F(CopyCliTest, UnwritableDestinationDirectoryIsOneErrorLine) {
  Write("a", "data");
  Result r = Run({Path("a"), Path("no/such/dir/b")});
  EXPECT_EQ(r.status, 1);
  EXPECT_EQ(r.err, "bufpool-copy: create: " + Path("no/such/dir/b") +
                       ": No such file or directory\n");
}

TEST_F(CopyCliTest, CopyingAFileOntoItselfIsRefusedAndDestroysNothing) {
  Write("a", "data");
  ASSERT_EQ(link(Path("a").c_str(), Path("hard").c_str()), 0);
  ASSERT_EQ(mkdir(Path("d").c_str(), 0755), 0);
  Write("d/a", "inside");
  for (const auto& args : {std::vector<std::string>{Path("a"), Path("a")},
                           std::vector<std::string>{Path("a"), Path("hard")},
                           std::vector<std::string>{Path("d/a"), Path("d")}}) {
    Result r = Run(args);
    EXPECT_EQ(r.status, 1);
    EXPECT_NE(r.err.find("refusing to copy a file onto itself"),
              std::string::npos)
        << r.err;
  }
  Result r = Run({Path("a"), Path("a")});
  EXPECT_EQ(r.err,
            "bufpool-copy: refusing to copy a file onto itself: " + Path("a") +
                ": source and destination are the same file\n");
  EXPECT_EQ(Slurp(Path("a")), "data");
  EXPECT_EQ(Slurp(Path("d/a")), "inside");
}

TEST_F(CopyCliTest, CopiesIntoADirectory) {
  Write("a", "into the directory");
  ASSERT_EQ(mkdir(Path("d").c_str(), 0755), 0);
  Result r = Run({"--fsync", Path("a"), Path("d")});
  EXPECT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(Slurp(Path("d/a")), "into the directory");
  Write("a", "again, with a slash");
  r = Run({Path("a"), Path("d") + "/"});
  EXPECT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(Slurp(Path("d/a")), "again, with a slash");
}

TEST_F(CopyCliTest, SeveralSourcesGoIntoTheDirectory) {
  Write("a", "one");
  Write("b", "two");
  Write("c", "three");
  ASSERT_EQ(mkdir(Path("d").c_str(), 0755), 0);
  Result r = Run({"--json", Path("a"), Path("b"), Path("c"), Path("d")});
  EXPECT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(Slurp(Path("d/a")), "one");
  EXPECT_EQ(Slurp(Path("d/b")), "two");
  EXPECT_EQ(Slurp(Path("d/c")), "three");
  // One JSON object per line, one per copy.
  EXPECT_EQ(std::count(r.out.begin(), r.out.end(), '\n'), 3) << r.out;
  EXPECT_NE(r.out.find("\"destination\": \"" + Path("d") + "/c\""),
            std::string::npos)
      << r.out;
}

// As cp: a second source with the same name does not replace the copy
// just made, and a source named twice is copied once.
TEST_F(CopyCliTest, SeveralSourcesNeverOverwriteWhatThisRunCreated) {
  ASSERT_EQ(mkdir(Path("x").c_str(), 0755), 0);
  ASSERT_EQ(mkdir(Path("y").c_str(), 0755), 0);
  ASSERT_EQ(mkdir(Path("d").c_str(), 0755), 0);
  Write("x/f", "from x");
  Write("y/f", "from y");
  Write("g", "g");
  Result r = Run({Path("x/f"), Path("y/f"), Path("g"), Path("d")});
  EXPECT_EQ(r.status, 1);
  EXPECT_EQ(r.err, "bufpool-copy: will not overwrite just-created '" +
                       Path("d") + "/f' with '" + Path("y/f") + "'\n");
  EXPECT_EQ(Slurp(Path("d/f")), "from x");
  EXPECT_EQ(Slurp(Path("d/g")), "g");
  r = Run({"--json", Path("g"), Path("g"), Path("d")});
  EXPECT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(r.err, "bufpool-copy: warning: source file '" + Path("g") +
                       "' specified more than once\n");
  EXPECT_EQ(std::count(r.out.begin(), r.out.end(), '\n'), 1) << r.out;
}

TEST_F(CopyCliTest, SeveralSourcesNeedADirectoryAndCopyNothingWithout) {
  Write("a", "one");
  Write("b", "two");
  Write("file", "stays");
  Result r = Run({Path("a"), Path("b"), Path("file")});
  EXPECT_EQ(r.status, 1);
  EXPECT_EQ(r.err,
            "bufpool-copy: target '" + Path("file") + "': Not a directory\n");
  EXPECT_EQ(Slurp(Path("file")), "stays");
  r = Run({Path("a"), Path("b"), Path("nodir")});
  EXPECT_EQ(r.status, 1);
  EXPECT_EQ(r.err, "bufpool-copy: target '" + Path("nodir") +
                       "': No such file or directory\n");
  EXPECT_FALSE(Exists("nodir"));
}

TEST_F(CopyCliTest, ADirectorySourceIsOmittedWithCpsWordsAndTheRestCopied) {
  ASSERT_EQ(mkdir(Path("src").c_str(), 0755), 0);
  ASSERT_EQ(mkdir(Path("d").c_str(), 0755), 0);
  Write("a", "file");
  Result r = Run({Path("src"), Path("a"), Path("d")});
  EXPECT_EQ(r.status, 1);
  EXPECT_EQ(r.err, "bufpool-copy: -r not specified; omitting directory '" +
                       Path("src") + "'\n");
  EXPECT_EQ(Slurp(Path("d/a")), "file");
  EXPECT_FALSE(Exists("d/src"));
  r = Run({Path("src"), Path("x")});
  EXPECT_EQ(r.status, 1);
  EXPECT_EQ(r.err, "bufpool-copy: -r not specified; omitting directory '" +
                       Path("src") + "'\n");
  EXPECT_FALSE(Exists("x"));
}

// -r: a skipped entry (a socket) is one error line and exit 1; the rest of
// the tree and the other sources are still copied.
TEST_F(CopyCliTest, RecursiveReportsEachFailedEntryAndCopiesTheRest) {
  ASSERT_EQ(mkdir(Path("src").c_str(), 0755), 0);
  ASSERT_EQ(mkdir(Path("src/sub").c_str(), 0700), 0);
  Write("src/sub/f", "deep");
  Write("a", "file");
  const std::string sock = Path("src/sock");
  const UniqueFd sock_fd = BindUnixSocket(sock);
  ASSERT_TRUE(sock_fd.valid());
  ASSERT_EQ(mkdir(Path("d").c_str(), 0755), 0);
  for (const char* flag : {"-r", "-R", "--recursive"}) {
    SCOPED_TRACE(flag);
    Result r = Run({flag, "--json", Path("src"), Path("a"), Path("d")});
    EXPECT_EQ(r.status, 1);
    EXPECT_EQ(r.err, "bufpool-copy: skipped: " + sock +
                         ": a socket or other special file is not copied\n");
    EXPECT_EQ(Slurp(Path("d/src/sub/f")), "deep");
    EXPECT_EQ(Slurp(Path("d/a")), "file");
    EXPECT_NE(r.out.find("\"files\": 1, \"directories\": 2"), std::string::npos)
        << r.out;
  }
}

TEST_F(CopyCliTest, NoClobberNeverOverwritesInBothSpellings) {
  Write("a", "new");
  Write("b", "old");
  ASSERT_EQ(mkdir(Path("d").c_str(), 0755), 0);
  Write("d/a", "old in d");
  for (const char* flag : {"-n", "--no-clobber"}) {
    SCOPED_TRACE(flag);
    Result r = Run({flag, "--json", Path("a"), Path("b")});
    EXPECT_EQ(r.status, 0) << r.err;  // skipped silently, as cp -n
    EXPECT_EQ(r.err, "");
    EXPECT_EQ(r.out, "");  // nothing was copied
    EXPECT_EQ(Slurp(Path("b")), "old");
    r = Run({flag, Path("a"), Path("d")});
    EXPECT_EQ(r.status, 0) << r.err;
    EXPECT_EQ(Slurp(Path("d/a")), "old in d");
    // A file onto itself is simply not overwritten.
    r = Run({flag, Path("a"), Path("a")});
    EXPECT_EQ(r.status, 0) << r.err;
    EXPECT_EQ(Slurp(Path("a")), "new");
  }
  // A dangling symbolic link is not written through either: an error, as
  // GNU cp 9.1 -n reports it.
  ASSERT_EQ(symlink(Path("nowhere").c_str(), Path("link").c_str()), 0);
  Result r = Run({"-n", Path("a"), Path("link")});
  EXPECT_EQ(r.status, 1) << r.err;
  EXPECT_NE(r.err.find("not writing through dangling symlink"),
            std::string::npos)
      << r.err;
  EXPECT_FALSE(Exists("nowhere"));
  // Nothing is left behind: no temporary file in either directory.
  for (const std::string& d : {dir_, Path("d")}) {
    DIR* dp = opendir(d.c_str());
    ASSERT_NE(dp, nullptr);
    while (dirent* e = readdir(dp)) {
      EXPECT_EQ(std::strstr(e->d_name, ".bufpool-copy."), nullptr) << e->d_name;
    }
    closedir(dp);
  }
}

TEST_F(CopyCliTest, NoClobberCopiesWhatIsNotThere) {
  Write("a", "fresh");
  Write("b", "also fresh");
  ASSERT_EQ(chmod(Path("a").c_str(), 0640), 0);
  ASSERT_EQ(mkdir(Path("d").c_str(), 0755), 0);
  Write("d/b", "kept");
  Result r = Run(
      {"-n", "--fsync", "--verify", "--json", Path("a"), Path("b"), Path("d")});
  EXPECT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(Slurp(Path("d/a")), "fresh");
  EXPECT_EQ(Slurp(Path("d/b")), "kept");
  struct stat st;
  ASSERT_EQ(stat(Path("d/a").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 07777, 0640u);
  // The JSON names the real destination, once (d/b was skipped).
  EXPECT_EQ(r.out.find("\"destination\": \"" + Path("d") + "/a\""),
            r.out.rfind("\"destination\""))
      << r.out;
  EXPECT_EQ(std::count(r.out.begin(), r.out.end(), '\n'), 1) << r.out;
  r = Run({"--no-clobber", Path("a"), Path("new")});
  EXPECT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(Slurp(Path("new")), "fresh");
}

TEST_F(CopyCliTest, ALoneDashIsRefused) {
  Write("a", "data");
  ExpectUsageError({"-", Path("b")}, "'-' (standard input or output)");
  ExpectUsageError({Path("a"), "-"}, "'-' (standard input or output)");
  EXPECT_FALSE(Exists("b"));
  // A file named '-' is reachable as ./- (and after --).
  Write("-", "dash");
  ASSERT_EQ(chdir(dir_.c_str()), 0);
  Result r = Run({"--", "./-", "copy-of-dash"});
  EXPECT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(Slurp(Path("copy-of-dash")), "dash");
}

TEST_F(CopyCliTest, DoubleDashEndsTheOptions) {
  Write("-n", "named like a flag");
  ASSERT_EQ(chdir(dir_.c_str()), 0);
  Result r = Run({"--", "-n", "plain"});
  EXPECT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(Slurp(Path("plain")), "named like a flag");
}

TEST_F(CopyCliTest, UsageErrorsExitTwoWithOneLineNamingTheProblem) {
  Write("a", "data");
  const std::string a = Path("a"), b = Path("b");
  ExpectUsageError({"--bogus", a, b}, "--bogus");
  ExpectUsageError({"-x", a, b}, "-x");
  ExpectUsageError({"--preserve=links", a, b}, "unknown attribute 'links'");
  ExpectUsageError({"--method=fast", a, b}, "--method: unknown method 'fast'");
  ExpectUsageError({"--method", "fast", a, b}, "unknown method 'fast'");
  ExpectUsageError({a, b, "--method"}, "--method");
  ExpectUsageError({a}, "missing the destination operand");
  ExpectUsageError({}, "missing SRC and DEST operands");
  ExpectUsageError({"--no-clobber=maybe", a, b}, "--no-clobber");
  // An empty value is refused, not filled from the next argument.
  ExpectUsageError({"--method=", "uring", a, b}, "--method: an empty value");
  ExpectUsageError({"--buffer-size=", "4096", a, b},
                   "--buffer-size: an empty value");
  EXPECT_FALSE(Exists("b"));
}

TEST_F(CopyCliTest, BufferFlagsAreCheckedAgainstCopyOptionsLimits) {
  Write("a", "data");
  const std::string a = Path("a"), b = Path("b");
  ExpectUsageError({"--buffer-size=100", a, b},
                   "--buffer-size: '100' is not a power of two from 64 to "
                   "4194304");
  ExpectUsageError({"--buffer-size", "32", a, b}, "--buffer-size");
  ExpectUsageError({"--buffer-size=8388608", a, b}, "--buffer-size");
  ExpectUsageError({"--buffer-size=4k", a, b}, "--buffer-size: '4k'");
  ExpectUsageError({"--batch-buffers=4097", a, b},
                   "--batch-buffers: 4097 is out of range (0 to 4096)");
  ExpectUsageError({"--batch-buffers", "-1", a, b}, "--batch-buffers");
  ExpectUsageError({"--queue-depth=5000", a, b},
                   "--queue-depth: 5000 is out of range (0 to 4096)");
  ExpectUsageError({"--queue-depth", "many", a, b},
                   "--queue-depth: 'many' is not a whole number");
  ExpectUsageError({"--buffer-size=1048576", "--batch-buffers=2048", a, b},
                   "--buffer-size 1048576 x --batch-buffers 2048 is over 1024 "
                   "MiB per operation");
  EXPECT_FALSE(Exists("b"));
  // The limits themselves are fine.
  Result r = Run({"--buffer-size=64", "--batch-buffers=4096",
                  "--queue-depth=4096", "--method=readwrite", a, b});
  EXPECT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(Slurp(b), "data");
}

TEST_F(CopyCliTest, HelpListsEveryFlagWithItsDefaultAndTheExitCodes) {
  for (const char* h : {"--help", "-h"}) {
    Result r = Run({h});
    EXPECT_EQ(r.status, 0);
    EXPECT_EQ(r.err, "");
    const std::string& t = r.out;
    EXPECT_EQ(t.rfind("usage: bufpool-copy [OPTIONS] SRC DEST\n", 0), 0u) << t;
    for (const char* flag :
         {"--method METHOD", "-n, --no-clobber", "--buffer-size BYTES",
          "--batch-buffers, --buffer-count N", "--queue-depth N", "--direct-io",
          "--fsync", "--progress, --no-progress", "--verify", "--json",
          "-r, -R, --recursive", "-p", "--preserve LIST", "--atomic"}) {
      SCOPED_TRACE(flag);
      // The flag starts a line; its description follows on the same line
      // or, for a long name, on the next.
      size_t at = t.find(std::string("\n  ") + flag + " ");
      if (at == std::string::npos) {
        at = t.find(std::string("\n  ") + flag + "\n");
      }
      ASSERT_NE(at, std::string::npos) << t;
      const size_t next = t.find("\n  -", at + 1);
      EXPECT_NE(t.substr(at, next - at).find("default"), std::string::npos)
          << t.substr(at, next - at);
    }
    for (const char* word :
         {"-h, --help", "SRC... DIR", "auto", "readwrite", "direct", "uring",
          "kernel", "O_DIRECT", "copy_file_range", "Differences from GNU cp",
          "'-' is refused", "  0  success", "  1  the work failed",
          "  2  usage error"}) {
      EXPECT_NE(t.find(word), std::string::npos) << word;
    }
  }
}

// kill -9 in the middle of an --atomic copy leaves the old destination and
// at most a recognisably named temporary file. The source is a FIFO, so the
// copy is held mid-way for as long as the test keeps the writing end open.
TEST_F(CopyCliTest, KillNineMidCopyLeavesTheOldDestination) {
  Write("dst", "old destination");
  const std::string fifo = Path("fifo");
  ASSERT_EQ(mkfifo(fifo.c_str(), 0600), 0);
  const std::string dst = Path("dst");
  char* argv[] = {
      const_cast<char*>(kBin.c_str()), const_cast<char*>("--no-progress"),
      const_cast<char*>("--atomic"),   const_cast<char*>(fifo.c_str()),
      const_cast<char*>(dst.c_str()),  nullptr};
  pid_t pid;
  ASSERT_EQ(posix_spawn(&pid, kBin.c_str(), nullptr, nullptr, argv, environ),
            0);
  const UniqueFd writer(open(fifo.c_str(), O_WRONLY));  // waits for the reader
  ASSERT_TRUE(writer.valid());
  const int w = writer.get();
  // More than one batch (128 KiB), so the copy writes before it waits.
  const std::string chunk(300000, 'n');
  ASSERT_EQ(write(w, chunk.data(), chunk.size()), ssize_t(chunk.size()));
  // Wait until the copy has written into its temporary file.
  std::vector<std::string> temps;
  struct stat st {};
  for (int i = 0; i < 3000; ++i) {
    temps = TempFiles(dir_);
    if (temps.size() == 1 && stat(Path(temps[0]).c_str(), &st) == 0 &&
        st.st_size > 0) {
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_GT(st.st_size, 0);  // killed mid-copy, not before it started
  ASSERT_EQ(kill(pid, SIGKILL), 0);
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  EXPECT_TRUE(WIFSIGNALED(status));
  EXPECT_EQ(Slurp(dst), "old destination");
  ASSERT_EQ(TempFiles(dir_).size(), 1u);
  EXPECT_EQ(TempFiles(dir_)[0].rfind(".dst.bufpool-copy.", 0), 0u);
}

// -n --atomic holds even against a destination that appears while the
// copy runs: the source is a FIFO, so the copy waits while the test creates
// `dst`. (In place, -n claims the name with O_EXCL before any byte moves.)
TEST_F(CopyCliTest, NoClobberDoesNotReplaceAFileThatAppearsDuringTheCopy) {
  const std::string fifo = Path("fifo"), dst = Path("dst");
  ASSERT_EQ(mkfifo(fifo.c_str(), 0600), 0);
  const std::string out = Path(".out"), err = Path(".err");
  char* argv[] = {
      const_cast<char*>(kBin.c_str()), const_cast<char*>("-n"),
      const_cast<char*>("--atomic"),   const_cast<char*>(fifo.c_str()),
      const_cast<char*>(dst.c_str()),  nullptr};
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, 2, err.c_str(),
                                   O_WRONLY | O_CREAT | O_TRUNC, 0600);
  pid_t pid;
  ASSERT_EQ(posix_spawn(&pid, kBin.c_str(), &fa, nullptr, argv, environ), 0);
  posix_spawn_file_actions_destroy(&fa);
  UniqueFd writer(open(fifo.c_str(), O_WRONLY));  // the copy has started
  ASSERT_TRUE(writer.valid());
  const int w = writer.get();
  // More than a pipe holds: once written, the copy is reading, so it has
  // looked at `dst` already and writes a temporary file.
  const std::string data(300000, 'f');
  ASSERT_EQ(write(w, data.data(), data.size()), ssize_t(data.size()));
  Write("dst", "appeared meanwhile");
  writer.reset();
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0) << Slurp(err);
  EXPECT_EQ(Slurp(dst), "appeared meanwhile");
  EXPECT_EQ(TempFiles(dir_), std::vector<std::string>{});
}

}  // namespace

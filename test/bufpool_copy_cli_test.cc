// bufpool-copy's command line: exit codes, the one-line error format, --help,
// --json, --verify and unknown flags.
#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
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

namespace {

struct Result {
  int status;  // exit status
  std::string out, err;
};

std::string Slurp(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

class CliTest : public testing::Test {
 protected:
  void SetUp() override {
    std::string tmpl = "/tmp/bufpool_copy_cli_test.XXXXXX";
    ASSERT_NE(mkdtemp(tmpl.data()), nullptr) << std::strerror(errno);
    dir_ = tmpl;
  }
  void TearDown() override {
    ASSERT_EQ(std::system(("rm -rf '" + dir_ + "'").c_str()), 0);
  }
  std::string Path(const std::string& n) const { return dir_ + "/" + n; }

  // Runs bufpool-copy with `args` (already shell-quoted as needed).
  Result Run(const std::string& args) {
    const std::string cmd = std::string("'") + BUFPOOL_COPY_BIN + "' " + args +
                            " >'" + Path("stdout") + "' 2>'" + Path("stderr") +
                            "' </dev/null";
    const int raw = std::system(cmd.c_str());
    return {WIFEXITED(raw) ? WEXITSTATUS(raw) : -1, Slurp(Path("stdout")),
            Slurp(Path("stderr"))};
  }

  void Write(const std::string& name, const std::string& data) {
    std::ofstream(Path(name), std::ios::binary) << data;
  }

  std::string dir_;
};

TEST_F(CliTest, CopiesAndPrintsJson) {
  Write("a", std::string(100000, 'x'));
  for (const char* m : {"auto", "readwrite", "direct", "uring", "kernel"}) {
    SCOPED_TRACE(m);
    Result r = Run(std::string("--method=") + m + " --json --verify " +
                   Path("a") + " " + Path("b"));
    EXPECT_EQ(r.status, 0) << r.err;
    EXPECT_EQ(r.err, "");  // stderr is not a terminal: no progress
    EXPECT_NE(r.out.find("\"bytes_copied\": 100000"), std::string::npos)
        << r.out;
    EXPECT_NE(r.out.find("\"method_requested\": \"" + std::string(m) + "\""),
              std::string::npos)
        << r.out;
    EXPECT_EQ(Slurp(Path("b")), Slurp(Path("a")));
  }
}

TEST_F(CliTest, ProgressGoesToStderrWhenAsked) {
  Write("a", std::string(300000, 'y'));
  Result r = Run("--progress " + Path("a") + " " + Path("b"));
  EXPECT_EQ(r.status, 0);
  EXPECT_NE(r.err.find("100%"), std::string::npos) << r.err;
  EXPECT_EQ(r.out, "");
  r = Run("--progress --no-progress " + Path("a") + " " + Path("c"));
  EXPECT_EQ(r.err, "");
}

TEST_F(CliTest, MissingSourceIsOneErrorLine) {
  Result r = Run(Path("nope") + " " + Path("b"));
  EXPECT_EQ(r.status, 1);
  EXPECT_EQ(r.err, "bufpool-copy: open source: " + Path("nope") +
                       ": No such file or directory\n");
  EXPECT_EQ(access(Path("b").c_str(), F_OK), -1);
}

TEST_F(CliTest, UnwritableDestinationDirectoryIsOneErrorLine) {
  Write("a", "data");
  Result r = Run(Path("a") + " " + Path("no/such/dir/b"));
  EXPECT_EQ(r.status, 1);
  EXPECT_EQ(r.err, "bufpool-copy: create temporary file for: " +
                       Path("no/such/dir/b") + ": No such file or directory\n");
}

TEST_F(CliTest, SelfCopyIsRefused) {
  Write("a", "data");
  Result r = Run(Path("a") + " " + Path("a"));
  EXPECT_EQ(r.status, 1);
  EXPECT_EQ(r.err,
            "bufpool-copy: refusing to copy a file onto itself: " + Path("a") +
                ": source and destination are the same file\n");
  EXPECT_EQ(Slurp(Path("a")), "data");
}

TEST_F(CliTest, UnknownFlagAndBadUsageAreErrors) {
  Write("a", "data");
  Result r = Run("--bogus " + Path("a") + " " + Path("b"));
  EXPECT_EQ(r.status, 2);
  EXPECT_EQ(r.err, "bufpool-copy: unknown flag: --bogus (see --help)\n");
  EXPECT_EQ(access(Path("b").c_str(), F_OK), -1);
  r = Run("--method=fast " + Path("a") + " " + Path("b"));
  EXPECT_EQ(r.status, 2);
  EXPECT_NE(r.err.find("unknown method: fast"), std::string::npos) << r.err;
  r = Run(Path("a"));
  EXPECT_EQ(r.status, 2);
  EXPECT_NE(r.err.find("expected SRC and DST"), std::string::npos) << r.err;
}

TEST_F(CliTest, HelpExplainsEveryMethod) {
  Result r = Run("--help");
  EXPECT_EQ(r.status, 0);
  for (const char* word :
       {"usage: bufpool-copy", "auto", "readwrite", "direct", "uring", "kernel",
        "--fsync", "--progress", "--no-progress", "--verify", "--json",
        "O_DIRECT", "copy_file_range"}) {
    EXPECT_NE(r.out.find(word), std::string::npos) << word;
  }
}

TEST_F(CliTest, CopiesIntoADirectory) {
  Write("a", "into the directory");
  ASSERT_EQ(mkdir(Path("d").c_str(), 0755), 0);
  Result r = Run("--fsync " + Path("a") + " " + Path("d"));
  EXPECT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(Slurp(Path("d/a")), "into the directory");
}

std::vector<std::string> TempFiles(const std::string& dir) {
  std::vector<std::string> out;
  DIR* d = opendir(dir.c_str());
  if (d == nullptr) return out;
  while (dirent* e = readdir(d)) {
    if (std::strstr(e->d_name, ".bufpool-copy.") != nullptr) {
      out.push_back(e->d_name);
    }
  }
  closedir(d);
  return out;
}

// kill -9 in the middle of a copy leaves the old destination and at most a
// recognisably named temporary file. The source is a FIFO, so the copy is
// held mid-way for as long as the test keeps the writing end open.
TEST_F(CliTest, KillNineMidCopyLeavesTheOldDestination) {
  Write("dst", "old destination");
  const std::string fifo = Path("fifo");
  ASSERT_EQ(mkfifo(fifo.c_str(), 0600), 0);
  const std::string dst = Path("dst");
  char* argv[] = {
      const_cast<char*>(BUFPOOL_COPY_BIN), const_cast<char*>("--no-progress"),
      const_cast<char*>(fifo.c_str()), const_cast<char*>(dst.c_str()), nullptr};
  pid_t pid;
  ASSERT_EQ(
      posix_spawn(&pid, BUFPOOL_COPY_BIN, nullptr, nullptr, argv, environ), 0);
  const int w = open(fifo.c_str(), O_WRONLY);  // waits for the reader
  ASSERT_GE(w, 0);
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
  close(w);
  EXPECT_TRUE(WIFSIGNALED(status));
  EXPECT_EQ(Slurp(dst), "old destination");
  ASSERT_EQ(TempFiles(dir_).size(), 1u);
  EXPECT_EQ(TempFiles(dir_)[0].rfind(".dst.bufpool-copy.", 0), 0u);
}

}  // namespace

// The OS seam and its loops: short transfers and EINTR are absorbed, errors
// name the path and the system's words.
#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <string>

#include "gtest/gtest.h"
#include "os/file.h"
#include "os/syscalls.h"

namespace bufpool::os {
namespace {

// Fault injection: every other call fails with EINTR, the rest move at most
// 3 bytes of the first iovec.
int g_calls = 0;
ssize_t StingyWritev(int fd, const iovec* iov, int, off_t off) {
  if (++g_calls % 2 == 1) {
    errno = EINTR;
    return -1;
  }
  iovec one{iov[0].iov_base, std::min<size_t>(iov[0].iov_len, 3)};
  return RealSyscalls().pwritev(fd, &one, 1, off);
}
ssize_t StingyReadv(int fd, const iovec* iov, int, off_t off) {
  if (++g_calls % 2 == 1) {
    errno = EINTR;
    return -1;
  }
  iovec one{iov[0].iov_base, std::min<size_t>(iov[0].iov_len, 3)};
  return RealSyscalls().preadv(fd, &one, 1, off);
}
ssize_t FullDisk(int, const iovec*, int, off_t) {
  errno = ENOSPC;
  return -1;
}

class FileTest : public testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/bufpool_os_file_test.XXXXXX";
    fd_ = mkstemp(tmpl);
    ASSERT_GE(fd_, 0);
    path_ = tmpl;
    g_calls = 0;
  }
  void TearDown() override {
    ::close(fd_);
    ::unlink(path_.c_str());
  }
  int fd_ = -1;
  std::string path_;
};

TEST_F(FileTest, WriteAllAndReadFullSurviveShortTransfersAndEintr) {
  SyscallTable stingy = RealSyscalls();
  stingy.pwritev = StingyWritev;
  stingy.preadv = StingyReadv;
  ScopedSyscalls seam(&stingy);

  char a[] = "hello, ";
  char b[] = "pooled world";
  iovec out[2] = {{a, 7}, {b, 12}};
  ASSERT_TRUE(WriteAll(fd_, out, 2, 0, path_).ok());
  EXPECT_GT(g_calls, 10);  // it really was fed in dribbles

  char x[5] = {}, y[14] = {};
  iovec in[2] = {{x, 5}, {y, 14}};
  auto n = ReadFull(fd_, in, 2, 0, path_);
  ASSERT_TRUE(n.ok()) << n.status();
  EXPECT_EQ(*n, 19u);
  EXPECT_EQ(std::string(x, 5).append(y, 14), "hello, pooled world");
}

TEST_F(FileTest, ReadFullStopsAtEndOfFile) {
  iovec out{const_cast<char*>("abc"), 3};
  ASSERT_TRUE(WriteAll(fd_, &out, 1, 0, path_).ok());
  char buf[10];
  iovec in{buf, 10};
  auto n = ReadFull(fd_, &in, 1, 0, path_);
  ASSERT_TRUE(n.ok());
  EXPECT_EQ(*n, 3u);
}

TEST_F(FileTest, WriteErrorNamesPathAndSystemWords) {
  SyscallTable full = RealSyscalls();
  full.pwritev = FullDisk;
  ScopedSyscalls seam(&full);
  iovec out{const_cast<char*>("abc"), 3};
  absl::Status s = WriteAll(fd_, &out, 1, 0, path_);
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(s.message().find(path_), std::string::npos) << s;
  EXPECT_NE(s.message().find("No space left on device"), std::string::npos)
      << s;
}

TEST_F(FileTest, ErrorsReadWhatPathAndSystemWords) {
  SyscallTable full = RealSyscalls();
  full.pwritev = FullDisk;
  ScopedSyscalls seam(&full);
  iovec out{const_cast<char*>("abc"), 3};
  EXPECT_EQ(WriteAll(fd_, &out, 1, 0, path_).message(),
            "write: " + path_ + ": No space left on device");
  char buf[4];
  iovec in{buf, sizeof(buf)};
  EXPECT_EQ(ReadFull(-1, &in, 1, 0, "/nowhere").status().message(),
            "read: /nowhere: Bad file descriptor");
}

TEST_F(FileTest, CountsEverySystemCallIncludingRetries) {
  SyscallTable stingy = RealSyscalls();
  stingy.pwritev = StingyWritev;
  stingy.preadv = StingyReadv;
  ScopedSyscalls seam(&stingy);
  char a[] = "pooled world";
  iovec out{a, 12};
  g_calls = 0;
  uint64_t writes = 0;
  ASSERT_TRUE(WriteAll(fd_, &out, 1, 0, path_, {.calls = &writes}).ok());
  EXPECT_EQ(writes, static_cast<uint64_t>(g_calls));
  char x[12];
  iovec in{x, 12};
  g_calls = 0;
  uint64_t reads = 0;
  ASSERT_TRUE(ReadFull(fd_, &in, 1, 0, path_, {.calls = &reads}).ok());
  EXPECT_EQ(reads, static_cast<uint64_t>(g_calls));
  EXPECT_GT(reads, 2u);
}

// O_DIRECT reads: a read that ends inside a block is the end of the file.
TEST_F(FileTest, ReadFullStopsAtAnUnalignedEndWhenAsked) {
  const std::string data(6000, 'x');
  iovec out{const_cast<char*>(data.data()), data.size()};
  ASSERT_TRUE(WriteAll(fd_, &out, 1, 0, path_).ok());
  SyscallTable stingy = RealSyscalls();
  stingy.preadv = StingyReadv;
  ScopedSyscalls seam(&stingy);
  std::string buf(8192, '\0');
  iovec in{buf.data(), buf.size()};
  auto n = ReadFull(fd_, &in, 1, 0, path_, {.stop_unaligned = 4096});
  ASSERT_TRUE(n.ok()) << n.status();
  EXPECT_GT(*n, 0u);
  EXPECT_LT(*n, 4096u);  // the first dribble was not a whole block: stopped
  auto all = ReadFull(fd_, &in, 1, 0, path_);
  ASSERT_TRUE(all.ok());
  EXPECT_EQ(*all, 6000u);
}

TEST_F(FileTest, SeamIsRemovedWhenScopeEnds) {
  {
    SyscallTable full = RealSyscalls();
    full.pwritev = FullDisk;
    ScopedSyscalls seam(&full);
  }
  iovec out{const_cast<char*>("abc"), 3};
  EXPECT_TRUE(WriteAll(fd_, &out, 1, 0, path_).ok());
}

}  // namespace
}  // namespace bufpool::os

// BufferedWriter / BufferedReader: round trips, buffer boundaries, truncated
// files, a full disk, injected faults, the empty-pool policy, and thousands of
// streams sharing one small pool.
#include "bufpool/buffered_stream.h"

#include <fcntl.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "os/file.h"
#include "os/syscalls.h"
#include "test_util.h"

namespace bufpool {
namespace {

using testing_util::MakePool;
using testing_util::Pipe;
using testing_util::ReadFileOrDie;
using testing_util::UniqueFd;

// True when `text` contains `part`; prints both otherwise.
testing::AssertionResult Contains(const std::string& text,
                                  const std::string& part) {
  if (text.find(part) != std::string::npos) return testing::AssertionSuccess();
  return testing::AssertionFailure()
         << "\"" << text << "\" does not contain \"" << part << "\"";
}

absl::Span<const std::byte> Bytes(const std::string& s) {
  return {reinterpret_cast<const std::byte*>(s.data()), s.size()};
}

// A fresh directory per test, removed afterwards.
class StreamTest : public testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/bufpool_stream_test.XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::string Path(const std::string& name) const { return dir_ + "/" + name; }

  std::string dir_;
};

// ---- Round trips
// --------------------------------------------------------------

enum class Mix { kSmall, kBufferSized, kLarge, kAll };

struct RoundTripCase {
  size_t buffer_size;
  size_t buffers;
  Mix mix;
};

std::string CaseName(const testing::TestParamInfo<RoundTripCase>& info) {
  const char* mix[] = {"Small", "BufferSized", "Large", "All"};
  return absl::StrCat("Buf", info.param.buffer_size, "x", info.param.buffers,
                      mix[static_cast<int>(info.param.mix)]);
}

class RoundTripTest : public StreamTest,
                      public testing::WithParamInterface<RoundTripCase> {};

// Random records: length (LE uint32), payload, an LE uint64 tag. Payload sizes
// are drawn from the mix: small (< 1/4 buffer), exactly one buffer, or large
// (1-5 buffers plus a tail). The file must equal the concatenation, and must
// read back record by record with random read sizes.
TEST_P(RoundTripTest, RandomRecordsSurviveEveryAppendMix) {
  const RoundTripCase c = GetParam();
  auto pool = MakePool(c.buffer_size, 32);
  std::mt19937_64 rng(1234 + c.buffer_size + c.buffers);
  const size_t bs = c.buffer_size;
  auto payload_size = [&](Mix m) -> size_t {
    switch (m) {
      case Mix::kSmall:
        return rng() % (bs / 4);
      case Mix::kBufferSized:
        return bs;
      case Mix::kLarge:
        return bs + 1 + rng() % (4 * bs);
      case Mix::kAll:
        break;
    }
    return 0;
  };

  std::vector<std::string> records;
  std::string expected;
  const std::string path = Path("records");
  {
    auto w = BufferedWriter::Open(path, *pool, {.buffers = c.buffers});
    ASSERT_TRUE(w.ok()) << w.status();
    EXPECT_EQ(w->buffer_count(), c.buffers);
    for (int i = 0; i < 400; ++i) {
      const Mix m = c.mix == Mix::kAll ? static_cast<Mix>(rng() % 3) : c.mix;
      std::string rec(payload_size(m), '\0');
      for (char& ch : rec) ch = static_cast<char>(rng());
      const uint64_t tag = rng();
      ASSERT_TRUE(
          w->AppendLE<uint32_t>(static_cast<uint32_t>(rec.size())).ok());
      ASSERT_TRUE(w->Append(Bytes(rec)).ok());
      ASSERT_TRUE(w->AppendLE<uint64_t>(tag).ok());
      uint32_t len_le = static_cast<uint32_t>(rec.size());
      expected.append(reinterpret_cast<const char*>(&len_le), 4);
      expected += rec;
      expected.append(reinterpret_cast<const char*>(&tag), 8);
      records.push_back(std::move(rec));
      ASSERT_EQ(w->position(), expected.size());
    }
    ASSERT_TRUE(w->Close().ok());
    EXPECT_EQ(pool->Stats().in_use, 0u);
  }
  ASSERT_EQ(ReadFileOrDie(path), expected);

  // Record by record.
  {
    auto r = BufferedReader::Open(path, *pool, {.buffers = c.buffers});
    ASSERT_TRUE(r.ok()) << r.status();
    std::string got;
    for (const std::string& rec : records) {
      auto len = r->ReadLE<uint32_t>();
      ASSERT_TRUE(len.ok()) << len.status();
      ASSERT_EQ(*len, rec.size());
      got.resize(*len);
      ASSERT_TRUE(
          r->ReadExact({reinterpret_cast<std::byte*>(got.data()), got.size()})
              .ok());
      ASSERT_EQ(got, rec);
      auto tag = r->ReadLE<uint64_t>();
      ASSERT_TRUE(tag.ok()) << tag.status();
    }
    EXPECT_EQ(r->ReadLE<uint32_t>().status().code(),
              absl::StatusCode::kOutOfRange);
  }
  // As a byte stream, with random Read sizes (0 .. 3 buffers).
  {
    auto r = BufferedReader::Open(path, *pool, {.buffers = c.buffers});
    ASSERT_TRUE(r.ok()) << r.status();
    std::string got;
    std::vector<std::byte> chunk(3 * bs + 1);
    for (;;) {
      const size_t want = 1 + rng() % chunk.size();
      auto n = r->Read(absl::MakeSpan(chunk.data(), want));
      ASSERT_TRUE(n.ok()) << n.status();
      ASSERT_LE(*n, want);
      if (*n == 0) break;
      got.append(reinterpret_cast<const char*>(chunk.data()), *n);
    }
    EXPECT_EQ(got, expected);
    EXPECT_EQ(r->position(), expected.size());
  }
  EXPECT_EQ(pool->Stats().in_use, 0u);
}

INSTANTIATE_TEST_SUITE_P(
    AllMixes, RoundTripTest,
    testing::Values(RoundTripCase{64, 1, Mix::kSmall},
                    RoundTripCase{64, 1, Mix::kBufferSized},
                    RoundTripCase{64, 1, Mix::kLarge},
                    RoundTripCase{64, 1, Mix::kAll},
                    RoundTripCase{64, 3, Mix::kSmall},
                    RoundTripCase{64, 3, Mix::kBufferSized},
                    RoundTripCase{64, 3, Mix::kLarge},
                    RoundTripCase{64, 3, Mix::kAll},
                    RoundTripCase{4096, 16, Mix::kSmall},
                    RoundTripCase{4096, 16, Mix::kBufferSized},
                    RoundTripCase{4096, 16, Mix::kLarge},
                    RoundTripCase{4096, 16, Mix::kAll}),
    CaseName);

// ---- Reader details
// -------------------------------------------------------------

TEST_F(StreamTest, FixedIntegersAreLittleEndianAndCrossBufferBoundaries) {
  auto pool = MakePool(64, 8);
  const std::string path = Path("ints");
  {
    auto w = BufferedWriter::Open(path, *pool, {.buffers = 2});
    ASSERT_TRUE(w.ok());
    ASSERT_TRUE(w->Append(std::string(61, 'x').data(), 61).ok());
    ASSERT_TRUE(w->AppendLE<uint64_t>(0x0102030405060708ull).ok());  // 61..68
    ASSERT_TRUE(w->AppendLE<uint32_t>(0xa1b2c3d4u).ok());            // 69..72
    ASSERT_TRUE(w->Close().ok());
  }
  const std::string bytes = ReadFileOrDie(path);
  ASSERT_EQ(bytes.size(), 73u);
  EXPECT_EQ(bytes.substr(61, 8),
            std::string("\x08\x07\x06\x05\x04\x03\x02\x01", 8));
  EXPECT_EQ(bytes.substr(69, 4), std::string("\xd4\xc3\xb2\xa1", 4));

  // One 64-byte buffer: the uint64 straddles a refill.
  auto r = BufferedReader::Open(path, *pool, {.buffers = 1});
  ASSERT_TRUE(r.ok());
  std::byte skip[61];
  ASSERT_TRUE(r->ReadExact(skip).ok());
  auto v64 = r->ReadLE<uint64_t>();
  ASSERT_TRUE(v64.ok()) << v64.status();
  EXPECT_EQ(*v64, 0x0102030405060708ull);
  auto v32 = r->ReadLE<uint32_t>();
  ASSERT_TRUE(v32.ok());
  EXPECT_EQ(*v32, 0xa1b2c3d4u);
  EXPECT_EQ(r->position(), 73u);
}

TEST_F(StreamTest, BigEndianIntegersOfEveryWidthRoundTrip) {
  auto pool = MakePool(64, 8);
  const std::string path = Path("be");
  {
    auto w = BufferedWriter::Open(path, *pool, {.buffers = 2});
    ASSERT_TRUE(w.ok());
    ASSERT_TRUE(w->Append(std::string(60, 'x').data(), 60).ok());
    ASSERT_TRUE(w->AppendBE<uint16_t>(0x0102).ok());       // 60..61
    ASSERT_TRUE(w->AppendBE<uint32_t>(0xa1b2c3d4u).ok());  // 62..65
    ASSERT_TRUE(w->AppendBE<int64_t>(-2).ok());            // 66..73
    ASSERT_TRUE(w->AppendBE<uint8_t>(0x7f).ok());          // 74
    ASSERT_TRUE(w->Close().ok());
  }
  const std::string bytes = ReadFileOrDie(path);
  ASSERT_EQ(bytes.size(), 75u);
  EXPECT_EQ(bytes.substr(60, 6), std::string("\x01\x02\xa1\xb2\xc3\xd4", 6));
  EXPECT_EQ(bytes.substr(66, 8),
            std::string("\xff\xff\xff\xff\xff\xff\xff\xfe", 8));

  // One 64-byte buffer: the uint32 straddles a refill.
  auto r = BufferedReader::Open(path, *pool, {.buffers = 1});
  ASSERT_TRUE(r.ok());
  std::byte skip[60];
  ASSERT_TRUE(r->ReadExact(skip).ok());
  auto v16 = r->ReadBE<uint16_t>();
  ASSERT_TRUE(v16.ok()) << v16.status();
  EXPECT_EQ(*v16, 0x0102);
  auto v32 = r->ReadBE<uint32_t>();
  ASSERT_TRUE(v32.ok()) << v32.status();
  EXPECT_EQ(*v32, 0xa1b2c3d4u);
  auto v64 = r->ReadBE<int64_t>();
  ASSERT_TRUE(v64.ok());
  EXPECT_EQ(*v64, -2);
  auto v8 = r->ReadBE<uint8_t>();
  ASSERT_TRUE(v8.ok());
  EXPECT_EQ(*v8, 0x7f);
  EXPECT_EQ(r->ReadBE<uint16_t>().status().code(),
            absl::StatusCode::kOutOfRange);
}

TEST_F(StreamTest, ReadsAcrossBufferBoundariesAtEveryOffset) {
  auto pool = MakePool(64, 8);
  const std::string path = Path("pattern");
  std::string pattern(64 * 7 + 13, '\0');
  for (size_t i = 0; i < pattern.size(); ++i)
    pattern[i] = static_cast<char>(i * 7 + 3);
  { std::ofstream(path, std::ios::binary) << pattern; }
  // For every read size, with 3 buffers: reads that span 0, 1, 2, 3+ buffer
  // edges and refills must all return the file in order.
  for (size_t step = 1; step <= 200; step += 7) {
    auto r = BufferedReader::Open(path, *pool, {.buffers = 3});
    ASSERT_TRUE(r.ok());
    std::string got;
    std::vector<std::byte> buf(step);
    for (;;) {
      auto n = r->Read(absl::MakeSpan(buf));
      ASSERT_TRUE(n.ok());
      if (*n == 0) break;
      got.append(reinterpret_cast<const char*>(buf.data()), *n);
    }
    ASSERT_EQ(got, pattern) << "read size " << step;
  }
}

TEST_F(StreamTest, ReadReturnsZeroOnlyAtEndOfFile) {
  auto pool = MakePool(64, 4);
  const std::string path = Path("empty");
  { std::ofstream(path, std::ios::binary) << "abc"; }
  auto r = BufferedReader::Open(path, *pool, {.buffers = 1});
  ASSERT_TRUE(r.ok());
  std::byte b[8];
  auto n = r->Read(b);
  ASSERT_TRUE(n.ok());
  EXPECT_EQ(*n, 3u);
  n = r->Read(b);
  ASSERT_TRUE(n.ok());
  EXPECT_EQ(*n, 0u);
  EXPECT_EQ(r->ReadExact(b).code(), absl::StatusCode::kOutOfRange);
}

// ---- Truncated files
// --------------------------------------------------------------

// Cut the file at every offset. Reading field by field, a cut on a field
// boundary reads as a clean end of file (OutOfRange) exactly where the cut
// is; any other cut is DataLoss naming the file. Every field before the cut
// reads back right: never garbage.
TEST_F(StreamTest, TruncatedFilesGiveDataLossNeverGarbage) {
  auto pool = MakePool(64, 8);
  const std::string whole_path = Path("whole");
  std::vector<size_t> field_ends = {0};
  {
    auto w = BufferedWriter::Open(whole_path, *pool, {.buffers = 2});
    ASSERT_TRUE(w.ok());
    for (uint32_t i = 0; i < 10; ++i) {
      ASSERT_TRUE(w->AppendLE<uint32_t>(i).ok());
      field_ends.push_back(w->position());
      ASSERT_TRUE(w->AppendLE<uint64_t>(uint64_t{i} * 1000003).ok());
      field_ends.push_back(w->position());
      const std::string s(i * 9 + 1, static_cast<char>('a' + i));
      ASSERT_TRUE(w->Append(Bytes(s)).ok());
      field_ends.push_back(w->position());
    }
    ASSERT_TRUE(w->Close().ok());
  }
  const std::string whole = ReadFileOrDie(whole_path);
  ASSERT_EQ(whole.size(), field_ends.back());
  const std::string path = Path("cut");
  for (size_t cut = 0; cut <= whole.size(); ++cut) {
    { std::ofstream(path, std::ios::binary) << whole.substr(0, cut); }
    auto r = BufferedReader::Open(path, *pool, {.buffers = 1});
    ASSERT_TRUE(r.ok());
    absl::Status end;
    size_t fields = 0;  // fields read whole
    for (uint32_t rec = 0; end.ok(); ++rec) {
      auto i = r->ReadLE<uint32_t>();
      if (!(end = i.status()).ok()) break;
      ASSERT_EQ(*i, rec);
      ++fields;
      auto v = r->ReadLE<uint64_t>();
      if (!(end = v.status()).ok()) break;
      ASSERT_EQ(*v, uint64_t{rec} * 1000003);
      ++fields;
      std::string s(rec * 9 + 1, '\0');
      end = r->ReadExact({reinterpret_cast<std::byte*>(s.data()), s.size()});
      if (!end.ok()) break;
      ASSERT_EQ(s, std::string(rec * 9 + 1, static_cast<char>('a' + rec)));
      ++fields;
    }
    const auto at = std::find(field_ends.begin(), field_ends.end(), cut);
    if (at != field_ends.end()) {
      EXPECT_EQ(end.code(), absl::StatusCode::kOutOfRange)
          << cut << ": " << end;
      EXPECT_EQ(fields, static_cast<size_t>(at - field_ends.begin()));
    } else {
      EXPECT_EQ(end.code(), absl::StatusCode::kDataLoss) << cut << ": " << end;
      EXPECT_TRUE(Contains(std::string(end.message()), path));
      EXPECT_EQ(field_ends[fields] < cut && cut < field_ends[fields + 1], true)
          << "cut " << cut << " reported after " << fields << " fields";
    }
  }
}

// ---- Writer details
// ------------------------------------------------------------

// Counts and checks the writev calls the writer makes.
struct WritevLog {
  static inline std::vector<std::vector<iovec>> calls;
  static ssize_t Writev(int fd, const iovec* iov, int cnt) {
    calls.emplace_back(iov, iov + cnt);
    return os::RealSyscalls().writev(fd, iov, cnt);
  }
};

TEST_F(StreamTest, FullBuffersGoOutInOneWritevAndLargeAppendsAreNotCopied) {
  auto pool = MakePool(64, 8);
  os::SyscallTable table = os::RealSyscalls();
  table.writev = WritevLog::Writev;
  os::ScopedSyscalls seam(&table);
  WritevLog::calls.clear();

  const std::string path = Path("gather");
  auto w = BufferedWriter::Open(path, *pool, {.buffers = 3});
  ASSERT_TRUE(w.ok());
  const std::string small(64 * 3, 's');  // exactly fills the three buffers
  for (size_t i = 0; i < small.size(); i += 16) {
    ASSERT_TRUE(w->Append(small.data() + i, 16).ok());
  }
  EXPECT_TRUE(WritevLog::calls.empty());  // all three buffers still in memory
  ASSERT_TRUE(w->Append("t", 1).ok());    // needs room: one writev of all three
  ASSERT_EQ(WritevLog::calls.size(), 1u);
  EXPECT_EQ(WritevLog::calls[0].size(), 3u);

  // A large append: the buffered "t" and the caller's own memory, one call.
  const std::string large(1000, 'L');
  ASSERT_TRUE(w->Append(Bytes(large)).ok());
  ASSERT_EQ(WritevLog::calls.size(), 2u);
  ASSERT_EQ(WritevLog::calls[1].size(), 2u);
  EXPECT_EQ(WritevLog::calls[1][0].iov_len, 1u);
  EXPECT_EQ(WritevLog::calls[1][1].iov_base, large.data());  // not copied
  EXPECT_EQ(WritevLog::calls[1][1].iov_len, large.size());
  ASSERT_TRUE(w->Close().ok());
  EXPECT_EQ(ReadFileOrDie(path), small + "t" + large);
}

// Records the reader's system calls.
struct ReadLog {
  static inline std::vector<int> readv_counts;  // iovcnt of each readv
  static inline std::vector<const void*> read_targets;
  static ssize_t Readv(int fd, const iovec* iov, int cnt) {
    readv_counts.push_back(cnt);
    return os::RealSyscalls().readv(fd, iov, cnt);
  }
  static ssize_t Read(int fd, void* buf, size_t n) {
    read_targets.push_back(buf);
    return os::RealSyscalls().read(fd, buf, n);
  }
};

TEST_F(StreamTest, RefillIsOneReadvIntoEveryBufferAndBigReadsBypassThem) {
  auto pool = MakePool(64, 8);
  const std::string path = Path("refill");
  std::string data(1000, '\0');
  for (size_t i = 0; i < data.size(); ++i) data[i] = static_cast<char>(i % 251);
  { std::ofstream(path, std::ios::binary) << data; }
  os::SyscallTable table = os::RealSyscalls();
  table.readv = ReadLog::Readv;
  table.read = ReadLog::Read;
  os::ScopedSyscalls seam(&table);
  ReadLog::readv_counts.clear();
  ReadLog::read_targets.clear();

  auto r = BufferedReader::Open(path, *pool, {.buffers = 4});
  ASSERT_TRUE(r.ok());
  std::string got(data.size(), '\0');
  auto* out = reinterpret_cast<std::byte*>(got.data());
  // 10 small reads: one readv fills all four buffers (256 bytes).
  for (int i = 0; i < 10; ++i)
    ASSERT_TRUE(r->ReadExact({out + i * 20, 20}).ok());
  EXPECT_EQ(ReadLog::readv_counts, std::vector<int>{4});
  EXPECT_TRUE(ReadLog::read_targets.empty());
  // 56 bytes are still buffered; a 600-byte read takes them, then reads the
  // rest (>= 256, the reader's capacity) straight into the caller's memory.
  auto n = r->Read({out + 200, 600});
  ASSERT_TRUE(n.ok());
  EXPECT_EQ(*n, 600u);
  ASSERT_EQ(ReadLog::read_targets.size(), 1u);
  EXPECT_EQ(ReadLog::read_targets[0], out + 256);
  EXPECT_EQ(ReadLog::readv_counts.size(), 1u);
  ASSERT_TRUE(r->ReadExact({out + 800, 200}).ok());
  EXPECT_EQ(got, data);
  EXPECT_EQ(r->position(), data.size());
}

TEST_F(StreamTest, EmptyAppendsAndReadsAreHarmless) {
  auto pool = MakePool(64, 4);
  const std::string path = Path("empty_ops");
  auto w = BufferedWriter::Open(path, *pool, {.buffers = 1});
  ASSERT_TRUE(w.ok());
  EXPECT_TRUE(w->Append(nullptr, 0).ok());
  EXPECT_TRUE(w->Append(absl::Span<const std::byte>()).ok());
  ASSERT_TRUE(w->Append("x", 1).ok());
  ASSERT_TRUE(w->Close().ok());
  auto r = BufferedReader::Open(path, *pool, {.buffers = 1});
  ASSERT_TRUE(r.ok());
  auto n = r->Read(absl::Span<std::byte>());
  ASSERT_TRUE(n.ok());
  EXPECT_EQ(*n, 0u);
  EXPECT_TRUE(r->ReadExact(absl::Span<std::byte>()).ok());
  std::byte b;
  ASSERT_TRUE(r->ReadExact({&b, 1}).ok());
  EXPECT_EQ(b, std::byte{'x'});
  // After Close() even an empty read says the reader is closed.
  ASSERT_TRUE(r->Close().ok());
  EXPECT_EQ(r->Read(absl::Span<std::byte>()).status().code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(r->ReadExact(absl::Span<std::byte>()).code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(r->ReadExact({&b, 1}).code(),
            absl::StatusCode::kFailedPrecondition);
}

TEST_F(StreamTest, FlushPutsEverythingInTheKernelAndCloseIsIdempotent) {
  auto pool = MakePool(4096, 8);
  const std::string path = Path("flush");
  auto w = BufferedWriter::Open(path, *pool);
  ASSERT_TRUE(w.ok());
  ASSERT_TRUE(w->Append("hello", 5).ok());
  EXPECT_EQ(ReadFileOrDie(path), "");
  ASSERT_TRUE(w->Flush().ok());
  EXPECT_EQ(ReadFileOrDie(path), "hello");
  ASSERT_TRUE(w->Append(" world", 6).ok());
  ASSERT_TRUE(w->Sync().ok());
  EXPECT_EQ(ReadFileOrDie(path), "hello world");
  ASSERT_TRUE(w->Close().ok());
  EXPECT_TRUE(w->Close().ok());
  EXPECT_EQ(w->Append("x", 1).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(w->Flush().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(pool->Stats().in_use, 0u);
}

// ---- Fault injection
// ---------------------------------------------------------

// Every third call fails with EINTR; the others move at most 7 bytes.
std::atomic<int> g_calls{0};
ssize_t StingyWritev(int fd, const iovec* iov, int cnt, off_t) {
  (void)cnt;
  if (++g_calls % 3 == 0) {
    errno = EINTR;
    return -1;
  }
  iovec one{iov[0].iov_base, std::min<size_t>(iov[0].iov_len, 7)};
  return os::RealSyscalls().writev(fd, &one, 1);
}
ssize_t StingyWritevNoOffset(int fd, const iovec* iov, int cnt) {
  return StingyWritev(fd, iov, cnt, -1);
}
ssize_t StingyReadv(int fd, const iovec* iov, int) {
  if (++g_calls % 3 == 0) {
    errno = EINTR;
    return -1;
  }
  iovec one{iov[0].iov_base, std::min<size_t>(iov[0].iov_len, 5)};
  return os::RealSyscalls().readv(fd, &one, 1);
}
ssize_t StingyRead(int fd, void* buf, size_t n) {
  if (++g_calls % 3 == 0) {
    errno = EINTR;
    return -1;
  }
  return os::RealSyscalls().read(fd, buf, std::min<size_t>(n, 5));
}

TEST_F(StreamTest, ShortTransfersAndEintrAreAbsorbed) {
  auto pool = MakePool(64, 8);
  os::SyscallTable table = os::RealSyscalls();
  table.writev = StingyWritevNoOffset;
  table.readv = StingyReadv;
  table.read = StingyRead;
  os::ScopedSyscalls seam(&table);
  g_calls = 0;

  std::mt19937 rng(7);
  std::string expected;
  const std::string path = Path("stingy");
  {
    auto w = BufferedWriter::Open(path, *pool, {.buffers = 2});
    ASSERT_TRUE(w.ok());
    for (int i = 0; i < 300; ++i) {
      std::string s(rng() % 200, '\0');
      for (char& ch : s) ch = static_cast<char>(rng());
      ASSERT_TRUE(w->Append(Bytes(s)).ok());
      expected += s;
    }
    ASSERT_TRUE(w->Close().ok());
  }
  EXPECT_GT(g_calls.load(), 1000);  // it really was fed in dribbles
  EXPECT_EQ(ReadFileOrDie(path), expected);

  auto r = BufferedReader::Open(path, *pool, {.buffers = 2});
  ASSERT_TRUE(r.ok());
  std::string got(expected.size(), '\0');
  // Sizes below and above the reader's capacity (128): refills and direct
  // reads.
  size_t done = 0;
  while (done < got.size()) {
    const size_t want = std::min<size_t>(got.size() - done, 1 + rng() % 300);
    ASSERT_TRUE(
        r->ReadExact({reinterpret_cast<std::byte*>(got.data() + done), want})
            .ok());
    done += want;
  }
  EXPECT_EQ(got, expected);
}

// The first writev fails with EIO, later ones would succeed: the writer must
// stay failed and report the same error from every call, including Close.
std::atomic<int> g_eio_left{0};
ssize_t EioOnceWritev(int fd, const iovec* iov, int cnt) {
  if (g_eio_left.fetch_sub(1) > 0) {
    errno = EIO;
    return -1;
  }
  return os::RealSyscalls().writev(fd, iov, cnt);
}

TEST_F(StreamTest, WriterStaysFailedAfterAnErrorAndReturnsItsBuffers) {
  auto pool = MakePool(64, 8);
  os::SyscallTable table = os::RealSyscalls();
  table.writev = EioOnceWritev;
  os::ScopedSyscalls seam(&table);
  g_eio_left = 1;

  const std::string path = Path("eio");
  auto w = BufferedWriter::Open(path, *pool, {.buffers = 2});
  ASSERT_TRUE(w.ok());
  ASSERT_TRUE(w->Append(std::string(50, 'a').data(), 50).ok());
  const absl::Status first = w->Flush();
  EXPECT_FALSE(first.ok());
  EXPECT_TRUE(Contains(std::string(first.message()), path));
  EXPECT_TRUE(Contains(std::string(first.message()), "Input/output error"));
  EXPECT_EQ(pool->Stats().in_use, 0u);  // given back at once
  EXPECT_EQ(w->buffer_count(), 0u);
  EXPECT_EQ(w->Append("b", 1), first);
  EXPECT_EQ(w->AppendLE<uint32_t>(1), first);
  EXPECT_EQ(w->AppendLE<uint64_t>(1), first);
  EXPECT_EQ(w->Append(std::string(1000, 'c').data(), 1000), first);
  EXPECT_EQ(w->Flush(), first);
  EXPECT_EQ(w->Close(), first);
  EXPECT_EQ(w->Close(), first);
}

ssize_t EnospcWritev(int, const iovec*, int) {
  errno = ENOSPC;
  return -1;
}

TEST_F(StreamTest, DestructorFlushesAndReportsAFailureOnStderr) {
  auto pool = MakePool(64, 8);
  const std::string path = Path("dtor");
  {
    auto w = BufferedWriter::Open(path, *pool);
    ASSERT_TRUE(w.ok());
    ASSERT_TRUE(w->Append("kept", 4).ok());
  }  // no Close(): the destructor flushes
  EXPECT_EQ(ReadFileOrDie(path), "kept");
  EXPECT_EQ(pool->Stats().in_use, 0u);

  os::SyscallTable table = os::RealSyscalls();
  table.writev = EnospcWritev;
  os::ScopedSyscalls seam(&table);
  testing::internal::CaptureStderr();
  {
    auto w = BufferedWriter::Open(path, *pool);
    ASSERT_TRUE(w.ok());
    ASSERT_TRUE(w->Append("lost", 4).ok());
  }
  const std::string err = testing::internal::GetCapturedStderr();
  EXPECT_TRUE(Contains(err, path));
  EXPECT_TRUE(Contains(err, "No space left on device"));
  EXPECT_EQ(pool->Stats().in_use, 0u);
}

ssize_t EioReadv(int, const iovec*, int) {
  errno = EIO;
  return -1;
}

TEST_F(StreamTest, ReaderReportsAReadErrorOnceAndThenStaysFailed) {
  auto pool = MakePool(64, 8, /*cache=*/0);
  const std::string path = Path("unreadable");
  { std::ofstream(path, std::ios::binary) << "some bytes"; }
  auto r = BufferedReader::Open(path, *pool, {.buffers = 2});
  ASSERT_TRUE(r.ok());
  os::SyscallTable table = os::RealSyscalls();
  table.readv = EioReadv;
  os::ScopedSyscalls seam(&table);
  const absl::Status first = r->ReadLE<uint32_t>().status();
  EXPECT_FALSE(first.ok());
  EXPECT_TRUE(Contains(std::string(first.message()), "read: " + path + ": "));
  EXPECT_TRUE(Contains(std::string(first.message()), "Input/output error"));
  EXPECT_EQ(pool->Stats().in_use, 0u);  // given back at once
  std::byte b[4];
  EXPECT_EQ(r->Read(b).status(), first);
  EXPECT_EQ(r->ReadExact(b), first);
  EXPECT_EQ(r->ReadExact(absl::Span<std::byte>()), first);
  EXPECT_EQ(r->Close(), first);
}

// ---- Full disk
// -------------------------------------------------------------------

// Mounts a 64 KiB tmpfs when permitted (root); unmounts in every case.
class FullDiskTest : public StreamTest {
 protected:
  void SetUp() override {
    StreamTest::SetUp();
    mnt_ = Path("tmpfs");
    ASSERT_EQ(mkdir(mnt_.c_str(), 0755), 0);
    if (mount("tmpfs", mnt_.c_str(), "tmpfs", 0, "size=64k") != 0) {
      GTEST_SKIP() << "cannot mount a small tmpfs here (" << strerror(errno)
                   << "); run as root to test a full disk";
    }
    mounted_ = true;
  }
  void TearDown() override {
    if (mounted_) {
      EXPECT_EQ(umount(mnt_.c_str()), 0) << strerror(errno);
    }
    StreamTest::TearDown();
  }
  std::string mnt_;
  bool mounted_ = false;
};

TEST_F(FullDiskTest, NoSpaceNamesThePathAndTheWriterStaysFailed) {
  auto pool = MakePool(4096, 32);
  const std::string path = mnt_ + "/big";
  auto w = BufferedWriter::Open(path, *pool, {.buffers = 4});
  ASSERT_TRUE(w.ok()) << w.status();
  absl::Status s;
  const std::string chunk(1000, 'z');
  size_t appended = 0;
  // 64 KiB fill up long before 1 MiB; the error may come from any append.
  while (appended < (1 << 20) && (s = w->Append(Bytes(chunk))).ok()) {
    appended += chunk.size();
  }
  if (s.ok()) s = w->Close();
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted) << s;
  EXPECT_TRUE(Contains(std::string(s.message()), path));
  EXPECT_TRUE(Contains(std::string(s.message()), "No space left on device"));
  EXPECT_LT(appended, size_t{1} << 20);
  EXPECT_EQ(w->Append(Bytes(chunk)), s);
  EXPECT_EQ(w->Close(), s);
  EXPECT_EQ(pool->Stats().in_use, 0u);
}

// ---- Empty pool, ownership, moves
// -------------------------------------------------

TEST_F(StreamTest, OnABusyPoolAStreamWorksWithFewerBuffers) {
  auto pool = MakePool(64, 8, /*cache=*/0);
  Buffer held[6];
  ASSERT_EQ(pool->TryAcquireBulk(held), 6u);
  auto w = BufferedWriter::Open(Path("few"), *pool, {.buffers = 16});
  ASSERT_TRUE(w.ok()) << w.status();
  EXPECT_EQ(w->buffer_count(), 2u);
  const std::string data(1000, 'f');
  for (int i = 0; i < 10; ++i) ASSERT_TRUE(w->Append(data.data(), 50).ok());
  ASSERT_TRUE(w->Close().ok());
  EXPECT_EQ(ReadFileOrDie(Path("few")), data.substr(0, 500));
}

TEST_F(StreamTest, EmptyPoolFailsAfterTheTimeoutWithoutTouchingTheFile) {
  auto pool = MakePool(64, 2, /*cache=*/0);
  const std::string path = Path("victim");
  { std::ofstream(path, std::ios::binary) << "precious"; }
  auto first = BufferedReader::Open(path, *pool, {.buffers = 2});
  ASSERT_TRUE(first.ok());
  EXPECT_EQ(pool->Stats().in_use, 2u);

  auto w = BufferedWriter::Open(
      path, *pool, {.buffers = 1, .open_timeout = absl::Milliseconds(20)});
  ASSERT_EQ(w.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_TRUE(Contains(std::string(w.status().message()), path));
  EXPECT_TRUE(Contains(std::string(w.status().message()),
                       "no free buffer in the pool (2 buffers of 64 bytes"));
  EXPECT_EQ(ReadFileOrDie(path), "precious");  // not truncated

  // FromFd with kTake closes the descriptor when it fails.
  const int fd = open(path.c_str(), O_RDONLY);
  ASSERT_GE(fd, 0);
  auto r = BufferedReader::FromFd(fd, FdOwnership::kTake, *pool, "",
                                  {.open_timeout = absl::ZeroDuration()});
  ASSERT_EQ(r.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_TRUE(
      Contains(std::string(r.status().message()), absl::StrCat("fd ", fd)));
  EXPECT_EQ(fcntl(fd, F_GETFD), -1);
  EXPECT_EQ(errno, EBADF);
}

TEST_F(StreamTest, OpenWaitsForABufferAnotherThreadReturns) {
  auto pool = MakePool(64, 1, /*cache=*/0);
  auto first = BufferedWriter::Open(Path("a"), *pool);
  ASSERT_TRUE(first.ok());
  std::mutex mu;
  std::condition_variable cv;
  bool started = false;
  absl::Status second_status;
  std::thread t([&] {
    {
      std::lock_guard<std::mutex> lock(mu);
      started = true;
    }
    cv.notify_one();
    auto second = BufferedWriter::Open(Path("b"), *pool,
                                       {.open_timeout = absl::Seconds(30)});
    second_status = second.status();
    if (second.ok()) second_status = second->Close();
  });
  {
    std::unique_lock<std::mutex> lock(mu);
    cv.wait(lock, [&] { return started; });
  }
  // Most likely the thread is parked in Open() by now; if not, it finds the
  // buffer free. Either way it must succeed (the outcome, not the timing, is
  // what is checked).
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  ASSERT_TRUE(first->Close().ok());  // gives the only buffer back
  t.join();
  EXPECT_TRUE(second_status.ok()) << second_status;
  EXPECT_EQ(pool->Stats().in_use, 0u);
}

TEST_F(StreamTest, BadOptionsAndBadDescriptorsAreClearErrors) {
  auto pool = MakePool(64, 4);
  auto w = BufferedWriter::Open(Path("x"), *pool, {.buffers = 0});
  EXPECT_EQ(w.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(Contains(std::string(w.status().message()),
                       "StreamOptions.buffers must be in [1, 64], got 0"));
  auto r = BufferedReader::Open(Path("missing"), *pool);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(Contains(std::string(r.status().message()),
                       Path("missing") + " for reading: No such file"));
  auto bad = BufferedWriter::FromFd(-1, FdOwnership::kBorrow, *pool);
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(pool->Stats().in_use, 0u);
}

TEST_F(StreamTest, BorrowedDescriptorStaysOpenAndTakenOneIsClosed) {
  auto pool = MakePool(64, 4);
  UniqueFd fds[2];
  ASSERT_EQ(Pipe(fds), 0);
  {
    auto w = BufferedWriter::FromFd(fds[1].get(), FdOwnership::kBorrow, *pool,
                                    "pipe");
    ASSERT_TRUE(w.ok());
    ASSERT_TRUE(w->Append("via pipe", 8).ok());
    ASSERT_TRUE(w->Close().ok());
  }
  EXPECT_NE(fcntl(fds[1].get(), F_GETFD), -1);  // still ours
  ASSERT_EQ(fds[1].Close(), 0);
  const int read_end = fds[0].release();  // the reader's from here
  auto r = BufferedReader::FromFd(read_end, FdOwnership::kTake, *pool);
  ASSERT_TRUE(r.ok());
  std::string got(8, '\0');
  ASSERT_TRUE(r->ReadExact({reinterpret_cast<std::byte*>(got.data()), 8}).ok());
  EXPECT_EQ(got, "via pipe");
  EXPECT_EQ(r->ReadLE<uint32_t>().status().code(),
            absl::StatusCode::kOutOfRange);
  ASSERT_TRUE(r->Close().ok());
  EXPECT_EQ(fcntl(read_end, F_GETFD), -1);  // closed by the reader
}

TEST_F(StreamTest, MovesKeepBuffersAndDestructionReturnsThem) {
  auto pool = MakePool(64, 8, /*cache=*/0);
  {
    auto w = BufferedWriter::Open(Path("m"), *pool, {.buffers = 2});
    ASSERT_TRUE(w.ok());
    ASSERT_TRUE(w->Append("one ", 4).ok());
    BufferedWriter moved = *std::move(w);
    ASSERT_TRUE(moved.Append("two", 3).ok());
    EXPECT_EQ(pool->Stats().in_use, 2u);
    auto other = BufferedWriter::Open(Path("n"), *pool, {.buffers = 2});
    ASSERT_TRUE(other.ok());
    ASSERT_TRUE(other->Append("n", 1).ok());
    moved = *std::move(other);  // closes "m" (flushing it), takes "n"
    EXPECT_EQ(ReadFileOrDie(Path("m")), "one two");
    EXPECT_EQ(pool->Stats().in_use, 2u);
    auto r = BufferedReader::Open(Path("m"), *pool, {.buffers = 3});
    ASSERT_TRUE(r.ok());
    EXPECT_EQ(pool->Stats().in_use, 5u);
  }
  EXPECT_EQ(pool->Stats().in_use, 0u);
  EXPECT_EQ(ReadFileOrDie(Path("n")), "n");
}

// ---- Many streams, one small pool
// ---------------------------------------------

// 2,000 writers open at once on a 512 KiB pool (2,048 buffers of 256 bytes),
// written by 4 threads in interleaved order so every writer flushes many
// times, then read back by 2,000 readers open at once. Caches are off so the
// pool's capacity is exact (see buffer_pool.h). Every record must come back.
TEST_F(StreamTest, ThousandsOfConcurrentStreamsShareOneSmallPool) {
  constexpr int kThreads = 4;
  constexpr int kStreamsPerThread = 500;
  constexpr int kRounds = 12;
  auto pool = MakePool(256, 2048, /*cache=*/0);
  std::atomic<int> failures{0};
  std::mutex mu;
  std::string first_error;
  auto fail = [&](const absl::Status& s) {
    std::lock_guard<std::mutex> lock(mu);
    if (failures++ == 0) first_error = s.ToString();
  };
  auto name = [&](int t, int i) { return Path(absl::StrCat(t, "_", i)); };
  // Record r of stream (t, i): LE uint32 id, LE uint64 r, then r % 97 bytes.
  auto run = [&](int t, bool write) {
    std::vector<BufferedWriter> ws;
    std::vector<BufferedReader> rs;
    for (int i = 0; i < kStreamsPerThread; ++i) {
      if (write) {
        auto w = BufferedWriter::Open(name(t, i), *pool, {.buffers = 1});
        if (!w.ok()) return fail(w.status());
        ws.push_back(*std::move(w));
      } else {
        auto r = BufferedReader::Open(name(t, i), *pool, {.buffers = 1});
        if (!r.ok()) return fail(r.status());
        rs.push_back(*std::move(r));
      }
    }
    const uint32_t id0 = static_cast<uint32_t>(t * kStreamsPerThread);
    for (uint64_t round = 0; round < kRounds; ++round) {
      for (int i = 0; i < kStreamsPerThread; ++i) {
        const std::string payload(round * 7 % 97,
                                  static_cast<char>('a' + i % 26));
        if (write) {
          BufferedWriter& w = ws[i];
          absl::Status s = w.AppendLE<uint32_t>(id0 + i);
          if (s.ok()) s = w.AppendLE<uint64_t>(round);
          if (s.ok()) s = w.Append(Bytes(payload));
          if (!s.ok()) return fail(s);
        } else {
          BufferedReader& r = rs[i];
          auto id = r.ReadLE<uint32_t>();
          auto rd = r.ReadLE<uint64_t>();
          std::string got(payload.size(), '\0');
          absl::Status s = r.ReadExact(
              {reinterpret_cast<std::byte*>(got.data()), got.size()});
          if (!id.ok() || !rd.ok() || !s.ok() || *id != id0 + i ||
              *rd != round || got != payload) {
            return fail(absl::DataLossError(absl::StrCat(
                "stream ", t, "_", i, " round ", round, " read back wrong")));
          }
        }
      }
    }
    for (auto& w : ws) {
      if (absl::Status s = w.Close(); !s.ok()) return fail(s);
    }
    for (auto& r : rs) {
      if (r.ReadLE<uint32_t>().status().code() !=
          absl::StatusCode::kOutOfRange) {
        return fail(absl::DataLossError("trailing bytes"));
      }
    }
  };
  for (bool write : {true, false}) {
    std::vector<std::thread> threads;
    for (int t = 0; t < kThreads; ++t) threads.emplace_back(run, t, write);
    for (auto& th : threads) th.join();
    ASSERT_EQ(failures.load(), 0) << first_error;
    EXPECT_EQ(pool->Stats().in_use, 0u);
  }
}

// 2,000 streams through a 28-buffer pool with the per-CPU caches on: 4
// threads each keep a window of 4 writers open (asking for 2 buffers each,
// 32 in all), opening a new one as they close the oldest, so Open() finds
// the pool empty and waits, and streams get fewer buffers than they ask for.
// No deadlock: a thread waiting in Open() holds at most 3 streams, and
// 4 threads x 3 streams x 2 buffers = 24 < 28, so someone can always
// proceed. Every file must hold exactly what was written.
TEST_F(StreamTest, MoreStreamsThanBuffersTakeTurns) {
  constexpr int kThreads = 4;
  constexpr int kStreamsPerThread = 500;
  constexpr size_t kWindow = 4;
  auto pool = MakePool(256, 28);
  std::atomic<int> failures{0};
  std::atomic<int> short_handed{0};  // streams that got fewer buffers
  std::mutex mu;
  std::string first_error;
  auto fail = [&](const absl::Status& s) {
    std::lock_guard<std::mutex> lock(mu);
    if (failures++ == 0) first_error = s.ToString();
  };
  auto contents = [](int t, int i) {
    return std::string(100 + (t * 31 + i) % 400,
                       static_cast<char>('A' + i % 26));
  };
  auto name = [&](int t, int i) { return Path(absl::StrCat("w", t, "_", i)); };
  auto run = [&](int t) {
    std::vector<BufferedWriter> open;
    for (int i = 0; i < kStreamsPerThread; ++i) {
      auto w = BufferedWriter::Open(
          name(t, i), *pool, {.buffers = 2, .open_timeout = absl::Seconds(60)});
      if (!w.ok()) return fail(w.status());
      if (w->buffer_count() < 2) ++short_handed;
      const std::string data = contents(t, i);
      for (size_t k = 0; k < data.size(); k += 37) {
        absl::Status s =
            w->Append(data.data() + k, std::min<size_t>(37, data.size() - k));
        if (!s.ok()) return fail(s);
      }
      open.push_back(*std::move(w));
      if (open.size() == kWindow) {
        if (absl::Status s = open.front().Close(); !s.ok()) return fail(s);
        open.erase(open.begin());
      }
    }
    for (auto& w : open) {
      if (absl::Status s = w.Close(); !s.ok()) return fail(s);
    }
  };
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) threads.emplace_back(run, t);
  for (auto& th : threads) th.join();
  ASSERT_EQ(failures.load(), 0) << first_error;
  EXPECT_EQ(pool->Stats().in_use, 0u);
  for (int t = 0; t < kThreads; ++t) {
    for (int i = 0; i < kStreamsPerThread; ++i) {
      ASSERT_EQ(ReadFileOrDie(name(t, i)), contents(t, i)) << t << "_" << i;
    }
  }
  // Reported, not asserted: how often the pool was short depends on timing.
  std::printf("streams that ran with fewer buffers: %d of %d\n",
              short_handed.load(), kThreads * kStreamsPerThread);
}

}  // namespace
}  // namespace bufpool

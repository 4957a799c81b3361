// Fuzz target 3: BufferedReader over arbitrary contents and read calls.
//
// The input gives a pool (buffer size 64 to 4096, 1 to 8 buffers), stream
// options (1 to 64 buffers), the kind of descriptor (a regular file in
// memory, a pipe or a socket, each holding the whole contents and then closed
// for writing), the contents (from the input, optionally extended by a
// pattern to tens of KiB), and a sequence of calls: Read of any length (a
// skip, when its bytes are ignored), ReadExact,
// ReadLE<uint32_t>/ReadLE<uint64_t>, a move of the reader, Close. Each call is
// checked against the contents and the model's offset:
//   * Read returns 1..n bytes that are the next ones, 0 only at the end;
//   * ReadExact/ReadFixed* return the next bytes, OutOfRange exactly at the
//     end (nothing consumed), DataLoss for a truncated record, whose message
//     says how many bytes of how many at which offset;
//   * position() is the model's offset; reads after Close() fail with
//     FailedPrecondition; the pool's in_use is the reader's buffer_count()
//     while open and 0 once closed or destroyed.
#include <fcntl.h>
#include <fuzzer/FuzzedDataProvider.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "bufpool/buffer_pool.h"
#include "bufpool/buffered_stream.h"
#include "fuzz_check.h"

namespace {

using bufpool::BufferedReader;
using bufpool::BufferPool;

void WriteAll(int fd, const std::string& s) {
  size_t done = 0;
  while (done < s.size()) {
    const ssize_t n = write(fd, s.data() + done, s.size() - done);
    FUZZ_CHECK(n > 0 || errno == EINTR, "write: %s", strerror(errno));
    if (n > 0) done += static_cast<size_t>(n);
  }
}

// A descriptor, positioned at 0, whose reads return `contents` and then end.
int MakeFd(int kind, const std::string& contents) {
  if (kind == 0) {
    const int fd = memfd_create("reader_fuzz", MFD_CLOEXEC);
    FUZZ_CHECK(fd >= 0, "memfd_create: %s", strerror(errno));
    WriteAll(fd, contents);
    FUZZ_CHECK(lseek(fd, 0, SEEK_SET) == 0, "lseek");
    return fd;
  }
  int fds[2];
  if (kind == 1) {
    FUZZ_CHECK(pipe2(fds, O_CLOEXEC) == 0, "pipe2");
  } else {
    FUZZ_CHECK(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds) == 0,
               "socketpair");
  }
  // Both hold far more than kMaxPipeContents, so the write never blocks.
  WriteAll(fds[1], contents);
  close(fds[1]);
  return fds[0];
}

constexpr size_t kMaxPipeContents = 48 * 1024;

void Run(FuzzedDataProvider& in) {
  bufpool::PoolOptions po;
  po.buffer_size = size_t{64} << in.ConsumeIntegralInRange<int>(0, 6);
  po.buffer_count = in.ConsumeIntegralInRange<size_t>(1, 8);
  po.cache_size = 0;
  po.huge_pages = bufpool::HugePages::kNever;
  po.populate = false;
  auto pool_or = BufferPool::Create(po);
  FUZZ_CHECK(pool_or.ok(), "Create: %s", pool_or.status().ToString().c_str());
  BufferPool& pool = **pool_or;

  bufpool::StreamOptions so;
  so.buffers = in.ConsumeIntegralInRange<size_t>(1, bufpool::kMaxStreamBuffers);
  const int kind = in.ConsumeIntegralInRange<int>(0, 2);
  std::string contents =
      in.ConsumeBytesAsString(in.ConsumeIntegralInRange<size_t>(0, 600));
  const size_t extend = in.ConsumeIntegralInRange<size_t>(0, 3) == 0
                            ? in.ConsumeIntegralInRange<size_t>(0, 40000)
                            : 0;
  for (size_t i = 0; i < extend; ++i) {
    contents.push_back(static_cast<char>(i * 7 + i / 251));
  }
  if (kind != 0 && contents.size() > kMaxPipeContents) {
    contents.resize(kMaxPipeContents);
  }
  const int fd = MakeFd(kind, contents);
  auto reader_or =
      BufferedReader::FromFd(fd, bufpool::FdOwnership::kTake, pool, "fuzz", so);
  FUZZ_CHECK(reader_or.ok(), "FromFd: %s",
             reader_or.status().ToString().c_str());
  std::optional<BufferedReader> reader(std::move(*reader_or));
  FUZZ_CHECK(
      reader->buffer_count() >= 1 &&
          reader->buffer_count() <= std::min(so.buffers, po.buffer_count),
      "buffer_count %zu for %zu asked, pool of %zu", reader->buffer_count(),
      so.buffers, po.buffer_count);

  const size_t capacity = reader->buffer_count() * po.buffer_size;
  uint64_t pos = 0;
  bool closed = false;
  std::vector<std::byte> out;
  auto next = [&](size_t n) {  // the model's next n bytes
    return std::string_view(contents).substr(pos, n);
  };
  auto check_exact = [&](const absl::Status& s, size_t n,
                         const std::byte* got) {
    const size_t left = contents.size() - pos;
    if (closed) {  // even ReadExact of nothing says the reader is closed
      FUZZ_CHECK(absl::IsFailedPrecondition(s),
                 "ReadExact(%zu) after Close: %s", n, s.ToString().c_str());
      return;
    }
    if (n <= left) {
      FUZZ_CHECK(s.ok(), "ReadExact(%zu) at %llu of %zu: %s", n,
                 (unsigned long long)pos, contents.size(),
                 s.ToString().c_str());
      FUZZ_CHECK(n == 0 || std::memcmp(got, next(n).data(), n) == 0,
                 "ReadExact(%zu) at %llu: wrong bytes", n,
                 (unsigned long long)pos);
      pos += n;
    } else if (left == 0) {
      FUZZ_CHECK(absl::IsOutOfRange(s), "ReadExact(%zu) at the end: %s", n,
                 s.ToString().c_str());
    } else {
      const std::string want =
          absl::StrCat("got ", left, " of ", n, " bytes at offset ", pos);
      FUZZ_CHECK(absl::IsDataLoss(s) &&
                     s.message().find(want) != absl::string_view::npos,
                 "ReadExact(%zu) with %zu left: '%s', expected DataLoss "
                 "with '%s'",
                 n, left, s.ToString().c_str(), want.c_str());
      pos = contents.size();
    }
  };

  int steps = 0;
  while (in.remaining_bytes() > 0 && steps++ < 300) {
    switch (in.ConsumeIntegralInRange<int>(0, 6)) {
      case 0:
      case 1: {  // Read, short or long (past every buffer: a direct read)
        const size_t n =
            in.ConsumeBool()
                ? in.ConsumeIntegralInRange<size_t>(0, 300)
                : in.ConsumeIntegralInRange<size_t>(0, 2 * capacity + 64);
        out.assign(n, std::byte{0x5a});
        absl::StatusOr<size_t> got = reader->Read(absl::MakeSpan(out));
        if (closed) {
          FUZZ_CHECK(absl::IsFailedPrecondition(got.status()),
                     "Read(%zu) after Close: %s", n,
                     got.status().ToString().c_str());
          break;
        }
        FUZZ_CHECK(got.ok(), "Read(%zu): %s", n,
                   got.status().ToString().c_str());
        const size_t left = contents.size() - pos;
        if (n == 0 || left == 0) {
          FUZZ_CHECK(*got == 0, "Read(%zu) with %zu left returned %zu", n, left,
                     *got);
        } else {
          FUZZ_CHECK(*got >= 1 && *got <= std::min(n, left),
                     "Read(%zu) with %zu left returned %zu", n, left, *got);
          FUZZ_CHECK(std::memcmp(out.data(), next(*got).data(), *got) == 0,
                     "Read(%zu) at %llu: wrong bytes", n,
                     (unsigned long long)pos);
          for (size_t i = *got; i < n; ++i) {
            FUZZ_CHECK(out[i] == std::byte{0x5a},
                       "Read returned %zu but wrote byte %zu", *got, i);
          }
          pos += *got;
        }
        break;
      }
      case 2: {  // ReadExact: a fixed-width record
        const size_t n =
            in.ConsumeBool()
                ? in.ConsumeIntegralInRange<size_t>(0, 40)
                : in.ConsumeIntegralInRange<size_t>(0, 2 * capacity + 64);
        out.assign(n, std::byte{0});
        check_exact(reader->ReadExact(absl::MakeSpan(out)), n, out.data());
        break;
      }
      case 3: {
        absl::StatusOr<uint32_t> v = reader->ReadLE<uint32_t>();
        uint32_t want = 0;
        if (!closed && contents.size() - pos >= 4) {
          std::memcpy(&want, contents.data() + pos, 4);
        }
        const uint32_t value = v.ok() ? *v : 0;
        check_exact(v.status(), 4, reinterpret_cast<const std::byte*>(&want));
        FUZZ_CHECK(value == want, "ReadLE<uint32_t> %u, want %u", value, want);
        break;
      }
      case 4: {
        absl::StatusOr<uint64_t> v = reader->ReadLE<uint64_t>();
        uint64_t want = 0;
        if (!closed && contents.size() - pos >= 8) {
          std::memcpy(&want, contents.data() + pos, 8);
        }
        const uint64_t value = v.ok() ? *v : 0;
        check_exact(v.status(), 8, reinterpret_cast<const std::byte*>(&want));
        FUZZ_CHECK(value == want, "ReadLE<uint64_t> %llu, want %llu",
                   (unsigned long long)value, (unsigned long long)want);
        break;
      }
      case 5: {  // the reader moves; the moved-to one carries on
        std::optional<BufferedReader> other(std::move(*reader));
        reader.reset();
        reader.emplace(std::move(*other));
        break;
      }
      default:  // 6: Close (again: the same status)
        if (!in.ConsumeIntegralInRange<int>(0, 3)) {
          FUZZ_CHECK(reader->Close().ok(), "Close");
          closed = true;
        }
        break;
    }
    if (!closed) {
      FUZZ_CHECK(reader->position() == pos, "position() %llu, model %llu",
                 (unsigned long long)reader->position(),
                 (unsigned long long)pos);
    }
    FUZZ_CHECK(pool.Stats().in_use == reader->buffer_count(),
               "pool in_use %zu, reader holds %zu", pool.Stats().in_use,
               reader->buffer_count());
    FUZZ_CHECK(!closed || reader->buffer_count() == 0,
               "closed reader holds %zu buffers", reader->buffer_count());
  }
  reader.reset();
  FUZZ_CHECK(pool.Stats().in_use == 0, "in_use %zu after the reader is gone",
             pool.Stats().in_use);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  FuzzedDataProvider in(data, size);
  Run(in);
  return 0;
}

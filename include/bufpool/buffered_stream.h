// libbufpool: buffered record streams whose buffers come from a BufferPool.
//
// BufferedWriter appends bytes and little-endian integers to a file;
// BufferedReader reads them back. Their buffers are borrowed from a
// BufferPool, so thousands of open streams cost a bounded, preallocated
// amount of memory: at most `StreamOptions::buffers` pooled buffers each.
//
//   writer: bufs_[0]      bufs_[1]      bufs_[2]  (pooled, anywhere)
//           +------------+------------+-------+-----+
//           | full       | full       | data  |     |
//           +------------+------------+-------+-----+
//                                      cursor_^     ^end_
//   Flush(): one writev({bufs_[0], bufs_[1], bufs_[2][0, cursor_)})
//
// Writing. A small Append is a bounds check and a memcpy into the current
// buffer (inline, below). When the current buffer fills, the writer moves on
// to its next buffer; when all are full it writes them with one writev. An
// append larger than one buffer is never copied: it goes to the kernel in the
// same writev as the buffered bytes before it. Short writes and EINTR are
// retried.
//
// Reading. A refill is one readv into all of the reader's buffers. Reads that
// the buffered bytes satisfy are a bounds check and a memcpy; a Read of at
// least the reader's whole buffer capacity (after the buffered bytes) goes
// straight into the caller's memory with one read(2), never through the
// buffers.
//
// Empty pool. Open() needs one buffer: it waits for it up to
// `StreamOptions::open_timeout` and then fails with ResourceExhausted, naming
// the file and the pool's size ("no free buffer in the pool (8 buffers of
// 4096 bytes, all in use) after 100ms"). The other `buffers - 1` are taken
// only if free at once, so on a busy pool a stream works with fewer buffers
// (at least one). Open() takes the buffer before opening the file, so a
// writer that cannot get one never truncates anything. Size the pool for
// the streams open at once. Threads that hold streams while opening another
// can wait on each other; that cannot happen while threads x (streams each
// holds while opening) x buffers < capacity(), and otherwise the timeout
// turns it into an error, not a hang. Many small streams: use buffers = 1.
//
// Errors are never lost. The first failed write is returned by the Append,
// Flush or Close that hit it, and by every later call: a failed writer stays
// failed (and gives its buffers back at once). Messages name the file and the
// system's words, e.g. "write: /data/x: No space left on device". If a
// writer is destroyed without Close(), its destructor flushes and closes, and
// prints any failure as one line on stderr.
//
// Ownership. A stream holds its buffers until Close() or destruction, then
// returns them to the pool; the pool must outlive every stream made from it.
// Open() opens (and Close() closes) its own descriptor. FromFd() takes a
// descriptor the caller opened: with FdOwnership::kTake the stream owns it
// from that call on (it is closed by Close(), by the destructor, and also
// when FromFd() itself fails); with FdOwnership::kBorrow the caller keeps it,
// must keep it open until the stream is closed or destroyed, and closes it.
// Streams use the descriptor's file position (writev/readv), so they work on
// pipes and sockets too; do not move that position behind a stream's back.
//
// Sockets, pipes and non-blocking descriptors. A stream never raises
// SIGPIPE: on a socket it writes with sendmsg(MSG_NOSIGNAL), on a pipe (or
// any descriptor that is not a regular file or block device) with SIGPIPE
// blocked for the call, so a peer that has closed or reset the connection
// is an error status (FailedPrecondition, "write: <name>: Broken pipe"),
// sticky like any write error. On a non-blocking descriptor, "would block"
// is not an error: the stream waits for the descriptor with poll(2), up to
// StreamOptions::io_timeout each time it finds no room (or, reading, no
// data), and carries on; no byte is dropped and the stream stays usable. If
// the timeout passes:
//   * a writer fails with DeadlineExceeded (sticky, buffers returned, as any
//     write error): the peer stopped reading, and bytes it never took are
//     lost with the writer;
//   * a reader returns DeadlineExceeded from that Read() and loses nothing:
//     call again later. (A ReadExact() that times out part-way through its
//     record fails for good, since the record's start is consumed.)
// The default io_timeout is infinite: a non-blocking descriptor then behaves
// like a blocking one.
//
// Thread safety. A stream is not thread-safe: use it from one thread at a
// time (like std::ofstream); it may be moved to and used on another thread
// through your own synchronisation. Different streams, on one pool or on
// many, may be used from different threads at once.
#ifndef BUFPOOL_BUFFERED_STREAM_H_
#define BUFPOOL_BUFFERED_STREAM_H_

#include <sys/uio.h>

#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <type_traits>
#include <vector>

#include "absl/base/attributes.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "bufpool/buffer_pool.h"
#include "bufpool/export.h"
#include "bufpool/internal/stream_base.h"

namespace bufpool {

// The most pooled buffers one stream may hold (and write with one writev).
inline constexpr size_t kMaxStreamBuffers = 64;

struct StreamOptions {
  // Pooled buffers the stream holds, in [1, kMaxStreamBuffers]. The first is
  // waited for; the rest are taken only when free (see the file comment).
  size_t buffers = 16;
  // How long Open()/FromFd() wait for the first buffer of an empty pool.
  absl::Duration open_timeout = absl::Seconds(1);
  // How long a read or write on a non-blocking descriptor waits for it to
  // become ready before giving up (see "Sockets, pipes and non-blocking
  // descriptors" above). Infinite: wait as a blocking descriptor would.
  absl::Duration io_timeout = absl::InfiniteDuration();
};

// Who closes a descriptor handed to FromFd().
enum class FdOwnership {
  kBorrow,  // the caller: keep it open until the stream is closed/destroyed
  kTake,    // the stream: closed by Close()/destructor, or if FromFd() fails
};

class BUFPOOL_EXPORT BufferedWriter : private internal::StreamBase {
 public:
  // Creates or truncates `path` (mode 0644 before umask). Errors:
  // InvalidArgument for bad options, ResourceExhausted when the pool stays
  // empty for open_timeout, the open(2) error naming the path otherwise.
  static absl::StatusOr<BufferedWriter> Open(const std::string& path,
                                             BufferPool& pool,
                                             const StreamOptions& options = {});
  // Writes to `fd` at its file position. `name` appears in error messages
  // (default "fd <n>").
  static absl::StatusOr<BufferedWriter> FromFd(
      int fd, FdOwnership ownership, BufferPool& pool, std::string name = "",
      const StreamOptions& options = {});

  BufferedWriter(BufferedWriter&& other) noexcept;
  // Closes this writer as the destructor would, then takes `other`'s state.
  BufferedWriter& operator=(BufferedWriter&& other) noexcept;
  BufferedWriter(const BufferedWriter&) = delete;
  BufferedWriter& operator=(const BufferedWriter&) = delete;
  // Flushes and closes if Close() was not called; a failure then goes to
  // stderr as one line, never silently.
  ~BufferedWriter();

  // Appends `data`. Returns the error of a write this append needed, or the
  // writer's earlier failure; FailedPrecondition after Close().
  absl::Status Append(absl::Span<const std::byte> data);
  absl::Status Append(const void* data, size_t n) {
    return Append(absl::MakeConstSpan(static_cast<const std::byte*>(data), n));
  }
  // Appends integer `v`'s sizeof(T) bytes, little- or big-endian (as
  // AppendLE/AppendBE of bufpool/cursor.h write a chain); Append()'s errors.
  template <class T>
  absl::Status AppendLE(T v);
  template <class T>
  absl::Status AppendBE(T v);
  // Removed in 0.4.
  ABSL_DEPRECATED("use AppendLE<uint32_t>()")
  absl::Status AppendFixed32(uint32_t v) { return AppendLE(v); }
  ABSL_DEPRECATED("use AppendLE<uint64_t>()")
  absl::Status AppendFixed64(uint64_t v) { return AppendLE(v); }

  // Hands everything appended so far to the kernel (one writev). Does not
  // fsync; see Sync().
  absl::Status Flush();
  // Flush(), then fsync(2): the bytes are on stable storage.
  absl::Status Sync();
  // Flushes, returns the buffers, and closes an owned descriptor. Returns the
  // first error of any write or of close(2); calling it again returns the
  // same status.
  absl::Status Close();

  // Bytes appended so far (written or still buffered).
  uint64_t position() const;
  // Pooled buffers held now (0 once closed or failed), and the name used in
  // messages.
  using StreamBase::buffer_count;
  using StreamBase::name;

 private:
  BufferedWriter(Parts parts, const StreamOptions& options);
  // Writes all of iov[0, cnt) to a socket or pipe, waiting out "would block"
  // (see the file comment). The iovecs are modified.
  absl::Status WriteAllWaiting(iovec* iov, int cnt);

  absl::Status AppendSlow(const std::byte* p, size_t n);
  // Writes the buffered bytes followed by extra[0, extra_len) in one writev.
  absl::Status WriteBuffered(const std::byte* extra, size_t extra_len);
  size_t BufferedBytes() const;
  absl::Status Fail(absl::Status s);
  void ReleaseBuffers();
  void MoveFrom(BufferedWriter& other) noexcept;
  void CloseForDestructor() noexcept;

  // Hot path: the free space of bufs_[cur_]. Both are nullptr once the
  // writer is closed or failed, so every append then takes the slow path.
  std::byte* cursor_ = nullptr;
  std::byte* end_ = nullptr;
  size_t cur_ = 0;
  uint64_t flushed_ = 0;  // bytes handed to the kernel
};

class BUFPOOL_EXPORT BufferedReader : private internal::StreamBase {
 public:
  // Opens `path` for reading. Errors as BufferedWriter::Open.
  static absl::StatusOr<BufferedReader> Open(const std::string& path,
                                             BufferPool& pool,
                                             const StreamOptions& options = {});
  // Reads `fd` from its file position. `name` appears in error messages.
  static absl::StatusOr<BufferedReader> FromFd(
      int fd, FdOwnership ownership, BufferPool& pool, std::string name = "",
      const StreamOptions& options = {});

  BufferedReader(BufferedReader&& other) noexcept;
  BufferedReader& operator=(BufferedReader&& other) noexcept;
  BufferedReader(const BufferedReader&) = delete;
  BufferedReader& operator=(const BufferedReader&) = delete;
  // Close(); a close(2) failure goes to stderr (read errors were returned).
  ~BufferedReader();

  // Reads up to out.size() bytes, making at most one system call (none when
  // buffered bytes suffice). Returns 0 only at end of file (or when `out` is
  // empty). A read error is returned and stays.
  absl::StatusOr<size_t> Read(absl::Span<std::byte> out);
  // Fills all of `out`. OutOfRange when the file ended cleanly before it
  // (no byte read); DataLoss when it ended part-way (a truncated record: the
  // message says how many bytes of how many at which offset). Never returns
  // partial data as if it were whole. As Read(), even for an empty `out`:
  // FailedPrecondition after Close(), and a failed reader's error.
  absl::Status ReadExact(absl::Span<std::byte> out);
  // The next sizeof(T) bytes as an integer, little- or big-endian (as
  // ChainCursor::ReadLE/ReadBE read a chain); ReadExact()'s errors.
  template <class T>
  absl::StatusOr<T> ReadLE();
  template <class T>
  absl::StatusOr<T> ReadBE();
  // Removed in 0.4.
  ABSL_DEPRECATED("use ReadLE<uint32_t>()")
  absl::StatusOr<uint32_t> ReadFixed32() { return ReadLE<uint32_t>(); }
  ABSL_DEPRECATED("use ReadLE<uint64_t>()")
  absl::StatusOr<uint64_t> ReadFixed64() { return ReadLE<uint64_t>(); }

  // Returns the buffers and closes an owned descriptor. Returns the first
  // read error the reader hit, or close(2)'s; again the same when repeated.
  absl::Status Close();

  // Bytes consumed so far (returned to the caller).
  uint64_t position() const;
  using StreamBase::buffer_count;
  using StreamBase::name;

 private:
  BufferedReader(Parts parts, const StreamOptions& options);
  // One read(2)/readv(2) (EINTR retried) that waits out "would block" on a
  // socket or pipe. Returns the bytes read (0 at end of file); on a timeout,
  // DeadlineExceeded without failing the reader; on an error, the error,
  // with the reader failed.
  absl::StatusOr<size_t> ReadOnce(const iovec* iov, int cnt);

  // OK, or why nothing can be read: the reader's error, or
  // FailedPrecondition once closed.
  absl::Status Readable() const;
  absl::StatusOr<size_t> ReadSlow(std::byte* out, size_t n);
  absl::Status ReadExactSlow(absl::Span<std::byte> out);
  size_t CopyBuffered(std::byte* out, size_t n);
  absl::Status Refill();  // one readv into every buffer
  size_t Buffered() const;
  size_t LengthOf(size_t i) const {
    return i + 1 < filled_ ? bufs_[i].size() : last_len_;
  }
  void ReleaseBuffers();
  void MoveFrom(BufferedReader& other) noexcept;
  void CloseForDestructor() noexcept;

  // Hot path: unread bytes of bufs_[cur_]; nullptr once closed or failed.
  const std::byte* cursor_ = nullptr;
  const std::byte* limit_ = nullptr;
  size_t cur_ = 0;
  size_t filled_ = 0;     // bufs_[0, filled_) hold data from the last refill
  size_t last_len_ = 0;   // bytes in bufs_[filled_ - 1]; the others are full
  uint64_t fetched_ = 0;  // bytes read from the kernel
};

// ---- Inline fast paths ------------------------------------------------------

namespace internal {
// `v` in the byte order asked for (kBig: big-endian), from or to native.
template <bool kBig, typename T>
inline T ToByteOrder(T v) {
  static_assert(std::is_integral_v<T> && sizeof(T) <= 8,
                "AppendLE/AppendBE/ReadLE/ReadBE take 1- to 8-byte integers");
  using U = std::make_unsigned_t<T>;
  auto u = static_cast<U>(v);
  if constexpr ((std::endian::native == std::endian::big) != kBig) {
    if constexpr (sizeof(T) == 2) u = __builtin_bswap16(u);
    if constexpr (sizeof(T) == 4) u = __builtin_bswap32(u);
    if constexpr (sizeof(T) == 8) u = __builtin_bswap64(u);
  }
  return static_cast<T>(u);
}
}  // namespace internal

inline absl::Status BufferedWriter::Append(absl::Span<const std::byte> data) {
  const size_t n = data.size();
  // Strictly less: a full buffer, a closed or failed writer (nullptr == end)
  // and an empty append (data() may be null) all take the slow path.
  if (n != 0 && n < static_cast<size_t>(end_ - cursor_)) {
    std::memcpy(cursor_, data.data(), n);
    cursor_ += n;
    return absl::OkStatus();
  }
  return AppendSlow(data.data(), n);
}

template <class T>
inline absl::Status BufferedWriter::AppendLE(T v) {
  v = internal::ToByteOrder<false>(v);
  if (end_ - cursor_ > static_cast<ptrdiff_t>(sizeof(v))) {
    std::memcpy(cursor_, &v, sizeof(v));
    cursor_ += sizeof(v);
    return absl::OkStatus();
  }
  return AppendSlow(reinterpret_cast<const std::byte*>(&v), sizeof(v));
}

template <class T>
inline absl::Status BufferedWriter::AppendBE(T v) {
  v = internal::ToByteOrder<true>(v);
  if (end_ - cursor_ > static_cast<ptrdiff_t>(sizeof(v))) {
    std::memcpy(cursor_, &v, sizeof(v));
    cursor_ += sizeof(v);
    return absl::OkStatus();
  }
  return AppendSlow(reinterpret_cast<const std::byte*>(&v), sizeof(v));
}

inline absl::StatusOr<size_t> BufferedReader::Read(absl::Span<std::byte> out) {
  const size_t n = out.size();
  // n - 1 wraps for n == 0, which (with closed/failed) takes the slow path.
  if (n - 1 < static_cast<size_t>(limit_ - cursor_)) {
    std::memcpy(out.data(), cursor_, n);
    cursor_ += n;
    return n;
  }
  return ReadSlow(out.data(), n);
}

inline absl::Status BufferedReader::ReadExact(absl::Span<std::byte> out) {
  const size_t n = out.size();
  if (n - 1 < static_cast<size_t>(limit_ - cursor_)) {
    std::memcpy(out.data(), cursor_, n);
    cursor_ += n;
    return absl::OkStatus();
  }
  return ReadExactSlow(out);
}

template <class T>
inline absl::StatusOr<T> BufferedReader::ReadLE() {
  T v;
  if (limit_ - cursor_ >= static_cast<ptrdiff_t>(sizeof(v))) {
    std::memcpy(&v, cursor_, sizeof(v));
    cursor_ += sizeof(v);
  } else if (absl::Status s =
                 ReadExact({reinterpret_cast<std::byte*>(&v), sizeof(v)});
             !s.ok()) {
    return s;
  }
  return internal::ToByteOrder<false>(v);
}

template <class T>
inline absl::StatusOr<T> BufferedReader::ReadBE() {
  T v;
  if (limit_ - cursor_ >= static_cast<ptrdiff_t>(sizeof(v))) {
    std::memcpy(&v, cursor_, sizeof(v));
    cursor_ += sizeof(v);
  } else if (absl::Status s =
                 ReadExact({reinterpret_cast<std::byte*>(&v), sizeof(v)});
             !s.ok()) {
    return s;
  }
  return internal::ToByteOrder<true>(v);
}

}  // namespace bufpool

#endif  // BUFPOOL_BUFFERED_STREAM_H_

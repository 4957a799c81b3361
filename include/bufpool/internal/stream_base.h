// What BufferedWriter and BufferedReader (bufpool/buffered_stream.h) share:
// the buffers a stream holds and the pool they return to, the descriptor and
// who closes it, its kind, the I/O timeout, the name in messages and the
// sticky status; and the code that opens, adopts, moves and closes them.
// Installed because the streams' layout includes it; not API.
//
// Thread safety: as the streams (one thread at a time).
#ifndef BUFPOOL_INTERNAL_STREAM_BASE_H_
#define BUFPOOL_INTERNAL_STREAM_BASE_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "bufpool/buffer_pool.h"
#include "bufpool/export.h"

namespace bufpool {

struct StreamOptions;
enum class FdOwnership;

namespace internal {

// What a stream's descriptor is, from fstat(2) at open: how it writes.
enum class FdKind : uint8_t {
  kFile,    // regular file or block device: writev, never "would block"
  kSocket,  // sendmsg(MSG_NOSIGNAL)
  kOther,   // pipe, FIFO, terminal...: writev with SIGPIPE blocked
};

class BUFPOOL_EXPORT StreamBase {
 public:
  // Pooled buffers held now (0 once closed or failed).
  size_t buffer_count() const { return bufs_.size(); }
  const std::string& name() const { return name_; }

 protected:
  // A descriptor with its first buffers, before it becomes a stream.
  struct Parts {
    BufferPool* pool = nullptr;
    int fd = -1;
    bool owns_fd = false;
    std::string name;
    std::vector<Buffer> bufs;  // at least one
  };

  // Takes the buffers (see "Empty pool" in buffered_stream.h), then opens
  // `path` with `flags` (mode 0644 when it creates). `what` names the call
  // in errors ("BufferedWriter::Open"), `purpose` the open ("writing").
  static absl::StatusOr<Parts> OpenPath(const std::string& path, int flags,
                                        BufferPool& pool,
                                        const StreamOptions& options,
                                        absl::string_view what,
                                        absl::string_view purpose);
  // Takes the buffers for a caller's descriptor; with FdOwnership::kTake
  // closes `fd` when that fails. An empty `name` becomes "fd <n>".
  static absl::StatusOr<Parts> AdoptFd(int fd, FdOwnership ownership,
                                       BufferPool& pool, std::string name,
                                       const StreamOptions& options,
                                       absl::string_view what);

  StreamBase() = default;
  StreamBase(Parts parts, const StreamOptions& options);
  StreamBase(const StreamBase&) = delete;
  StreamBase& operator=(const StreamBase&) = delete;
  ~StreamBase() = default;

  // Takes `other`'s shared state, leaving it moved-from (no pool, no
  // descriptor, closed).
  void MoveBaseFrom(StreamBase& other) noexcept;
  // Gives the buffers back to the pool.
  void ReleasePooled();
  // Marks the stream closed, gives the buffers back, and closes an owned
  // descriptor (its error becomes the status unless one is there already).
  // Returns the status. The caller clears its own cursors first.
  absl::Status CloseBase();
  // Whether the stream can do I/O: not moved from and not closed.
  bool open() const { return pool_ != nullptr && !closed_; }

  std::vector<Buffer> bufs_;
  BufferPool* pool_ = nullptr;  // nullptr once moved from
  int fd_ = -1;
  bool owns_fd_ = false;
  bool closed_ = false;
  FdKind kind_ = FdKind::kFile;
  int64_t io_timeout_ms_ = -1;  // -1: forever
  std::string name_;
  absl::Status status_;  // the first failure, sticky
};

}  // namespace internal
}  // namespace bufpool

#endif  // BUFPOOL_INTERNAL_STREAM_BASE_H_

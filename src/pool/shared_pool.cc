// A pool shared by processes (PoolOptions::shared): the memfd, joining,
// the ledger, the shared depot, death and reclaim, Export and Import.
#include "absl/status/status.h"
#include "pool/pool_internal.h"

namespace bufpool {

int BufferPool::shared_fd() const { return -1; }

absl::StatusOr<std::unique_ptr<BufferPool>> BufferPool::Join(int fd) {
  (void)fd;
  return absl::UnimplementedError("BufferPool::Join: not built yet");
}

BufferToken BufferPool::Export(Buffer&& buffer) {
  Buffer gone = std::move(buffer);
  return BufferToken{};
}

absl::StatusOr<Buffer> BufferPool::Import(BufferToken token) {
  (void)token;
  return absl::UnimplementedError("BufferPool::Import: not built yet");
}

size_t BufferPool::ReclaimDead() { return 0; }

}  // namespace bufpool

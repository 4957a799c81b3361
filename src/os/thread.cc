#include "os/thread.h"

#include <linux/membarrier.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <mutex>

namespace bufpool::os {

int CurrentThreadId() { return static_cast<int>(::gettid()); }

namespace {

long Membarrier(int cmd) { return ::syscall(SYS_membarrier, cmd, 0, 0); }

bool RegisterExpedited() {
  const long supported = Membarrier(MEMBARRIER_CMD_QUERY);
  if (supported < 0 || (supported & MEMBARRIER_CMD_PRIVATE_EXPEDITED) == 0) {
    return false;
  }
  return Membarrier(MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED) == 0;
}

}  // namespace

void HeavyFence() {
  static const bool expedited = RegisterExpedited();
  std::atomic_thread_fence(std::memory_order_seq_cst);
  if (expedited) Membarrier(MEMBARRIER_CMD_PRIVATE_EXPEDITED);
}

}  // namespace bufpool::os

#include "os/thread.h"

#include <fcntl.h>
#include <linux/membarrier.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <mutex>

namespace bufpool::os {

int CurrentThreadId() { return static_cast<int>(::gettid()); }

ThreadState GetThreadState(int tid) {
  char path[64];
  std::snprintf(path, sizeof(path), "/proc/self/task/%d/stat", tid);
  int fd;
  do {
    fd = ::open(path, O_RDONLY | O_CLOEXEC);
  } while (fd < 0 && errno == EINTR);
  if (fd < 0) {
    if (errno != ENOENT) return ThreadState::kRunning;
    // Gone only if /proc works for this thread: without /proc every thread
    // would look gone.
    std::snprintf(path, sizeof(path), "/proc/self/task/%d/stat",
                  CurrentThreadId());
    return ::access(path, R_OK) == 0 ? ThreadState::kGone
                                     : ThreadState::kRunning;
  }
  // "tid (comm) S ...": comm may hold spaces and parentheses, so the state
  // follows the last ')'. 512 bytes hold comm (at most 16) and the state.
  char buf[512];
  ssize_t n;
  do {
    n = ::read(fd, buf, sizeof(buf) - 1);
  } while (n < 0 && errno == EINTR);
  ::close(fd);
  if (n <= 0) return ThreadState::kRunning;
  buf[n] = '\0';
  const char* close_paren = std::strrchr(buf, ')');
  if (close_paren == nullptr || close_paren[1] != ' ') {
    return ThreadState::kRunning;
  }
  return close_paren[2] == 'S' ? ThreadState::kBlocked : ThreadState::kRunning;
}

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

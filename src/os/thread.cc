#include "os/thread.h"

#include <linux/membarrier.h>
#include <pthread.h>
#include <signal.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>

#include "os/syscalls.h"

namespace bufpool::os {

int CurrentThreadId() { return static_cast<int>(::gettid()); }

int CurrentCpu() { return Sys().sched_getcpu(); }

ScopedBlockSignals::ScopedBlockSignals() {
  sigset_t all;
  ::sigfillset(&all);
  // Fails only for a bad `how` or a bad address: neither can happen here.
  ::pthread_sigmask(SIG_BLOCK, &all, &saved_);
}

ScopedBlockSignals::~ScopedBlockSignals() {
  ::pthread_sigmask(SIG_SETMASK, &saved_, nullptr);
}

namespace {

long Membarrier(int cmd, unsigned flags = 0, int cpu = 0) {
  return Sys().membarrier(cmd, flags, cpu);
}

// Older <linux/membarrier.h> lack these (Linux 5.10).
constexpr int kExpeditedRseq = 1 << 7;          // ..._PRIVATE_EXPEDITED_RSEQ
constexpr int kRegisterExpeditedRseq = 1 << 8;  // ..._REGISTER_..._RSEQ
constexpr unsigned kFlagCpu = 1 << 0;           // MEMBARRIER_CMD_FLAG_CPU

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

bool RegisterRseqFence() {
  const long supported = Membarrier(MEMBARRIER_CMD_QUERY);
  if (supported < 0 || (supported & kExpeditedRseq) == 0) return false;
  return Membarrier(kRegisterExpeditedRseq) == 0;
}

namespace {
std::atomic<uint64_t> g_rseq_fences{0};
}  // namespace

uint64_t RseqFenceCount() {
  return g_rseq_fences.load(std::memory_order_relaxed);
}

void RseqFence(int cpu) {
  g_rseq_fences.fetch_add(1, std::memory_order_relaxed);
  for (int attempt = 0; attempt < 2; ++attempt) {
    const long r = cpu < 0 ? Membarrier(kExpeditedRseq)
                           : Membarrier(kExpeditedRseq, kFlagCpu, cpu);
    if (r == 0) return;
    if (errno == EINVAL && cpu >= 0) {  // offline: fence everything instead
      cpu = -1;
      continue;
    }
    if (errno != EPERM || Membarrier(kRegisterExpeditedRseq) != 0) break;
  }
  std::fprintf(stderr,
               "bufpool: membarrier(PRIVATE_EXPEDITED_RSEQ) failed: "
               "%s\n",
               std::strerror(errno));
  std::abort();
}

}  // namespace bufpool::os

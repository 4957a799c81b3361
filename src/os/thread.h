// Threads: who a thread is, and the heavy sides of asymmetric fences (the
// rseq one for the pool's per-CPU caches).
//
// Thread safety: every function may be called from any thread.
#ifndef BUFPOOL_SRC_OS_THREAD_H_
#define BUFPOOL_SRC_OS_THREAD_H_

#include <signal.h>

#include <cstdint>

namespace bufpool::os {

// The calling thread's kernel id (gettid).
int CurrentThreadId();

// The CPU this thread runs on, or ran on a moment ago (sched_getcpu: no
// system call where glibc reads it from the rseq area or the vDSO); -1 on
// failure.
int CurrentCpu();

// Makes every store this thread did before the call visible to every other
// thread of the process before that thread executes any further user code,
// as if each had executed a full fence (membarrier(2),
// MEMBARRIER_CMD_PRIVATE_EXPEDITED; registered on first use). Where the
// kernel lacks it, a sequentially consistent fence, which gives the same
// guarantee on x86.
void HeavyFence();

// Registers this process for RseqFence()
// (MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED_RSEQ); false where the kernel
// lacks it (before Linux 5.10) or refuses.
bool RegisterRseqFence();

// membarrier(MEMBARRIER_CMD_PRIVATE_EXPEDITED_RSEQ): on return, every rseq
// critical section of this process that was running on `cpu` (every CPU
// when cpu < 0) has committed or been restarted, and each such CPU ran a
// full memory barrier. Registers again once if the kernel asks (a child
// after fork()); an offline `cpu` runs no section and is a full fence of
// every CPU instead. Aborts when the kernel refuses: the pool's drains rely
// on it.
void RseqFence(int cpu);

// Blocks every blockable signal on this thread for its scope
// (pthread_sigmask), so that a handler cannot run between steps that must
// look like one to it; restores the thread's mask on destruction.
class ScopedBlockSignals {
 public:
  ScopedBlockSignals();
  ~ScopedBlockSignals();
  ScopedBlockSignals(const ScopedBlockSignals&) = delete;
  ScopedBlockSignals& operator=(const ScopedBlockSignals&) = delete;

 private:
  sigset_t saved_;
};

// The RseqFence() calls this process has made (relaxed; for tests that
// check how many fences a drain costs).
uint64_t RseqFenceCount();

}  // namespace bufpool::os

#endif  // BUFPOOL_SRC_OS_THREAD_H_

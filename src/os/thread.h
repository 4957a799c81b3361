// Threads, for the pool's reclaim path: who a thread is, whether it is
// blocked in the kernel, and the heavy side of an asymmetric fence.
//
// Thread safety: every function may be called from any thread.
#ifndef BUFPOOL_SRC_OS_THREAD_H_
#define BUFPOOL_SRC_OS_THREAD_H_

namespace bufpool::os {

// The calling thread's kernel id (gettid).
int CurrentThreadId();

enum class ThreadState {
  kBlocked,  // asleep in a system call (state 'S'): it runs no user code
             // until the call returns
  kGone,     // no such thread in this process (it exited, or this is a
             // child after fork() and it was one of the parent's threads)
  kRunning,  // anything else: running, runnable, stopped, uninterruptible
             // sleep; also when /proc cannot be read
};

// Thread `tid`'s state, from /proc/self/task/<tid>/stat.
ThreadState GetThreadState(int tid);

// Makes every store this thread did before the call visible to every other
// thread of the process before that thread executes any further user code,
// as if each had executed a full fence (membarrier(2),
// MEMBARRIER_CMD_PRIVATE_EXPEDITED; registered on first use). Where the
// kernel lacks it, a sequentially consistent fence, which gives the same
// guarantee for the reclaim path's use on x86 (see src/pool/buffer_pool.cc).
void HeavyFence();

}  // namespace bufpool::os

#endif  // BUFPOOL_SRC_OS_THREAD_H_

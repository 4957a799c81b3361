// Threads: who a thread is, and the heavy side of an asymmetric fence.
//
// Thread safety: every function may be called from any thread.
#ifndef BUFPOOL_SRC_OS_THREAD_H_
#define BUFPOOL_SRC_OS_THREAD_H_

namespace bufpool::os {

// The calling thread's kernel id (gettid).
int CurrentThreadId();

// Makes every store this thread did before the call visible to every other
// thread of the process before that thread executes any further user code,
// as if each had executed a full fence (membarrier(2),
// MEMBARRIER_CMD_PRIVATE_EXPEDITED; registered on first use). Where the
// kernel lacks it, a sequentially consistent fence, which gives the same
// guarantee on x86.
void HeavyFence();

}  // namespace bufpool::os

#endif  // BUFPOOL_SRC_OS_THREAD_H_

// holders_test's code without frame pointers (this file is compiled with
// -fomit-frame-pointer; a function attribute would not do: GCC applies it to
// the functions that follow it too).
#include <vector>

#include "bufpool/buffer_pool.h"

namespace bufpool {

// As holders_test.cc declares it (one definition, written twice).
struct FramelessArgs {
  BufferPool* pool;
  std::vector<Buffer>* kept;
};

}  // namespace bufpool

// A thread's start routine: acquires one buffer into the FramelessArgs's
// `kept`.
extern "C" void* BufpoolTestAcquireWithoutFramePointer(void* arg) {
  auto* a = static_cast<bufpool::FramelessArgs*>(arg);
#if defined(__x86_64__)
  // As in a program built without frame pointers: the register holds no
  // frame (here zero, whatever the thread's start left in it), so the
  // unwinder cannot go past this function.
  asm volatile("xorl %%ebp, %%ebp" ::: "rbp");
#endif
  a->kept->push_back(a->pool->TryAcquire());
  return nullptr;
}

// A plugin that called the pool's inline API can be unloaded (dlclose)
// while the threads that ran its code live on: the main thread, and a
// worker that made the call and then blocked until after the unload. With a
// thread's rseq_cs still pointing at a descriptor inside the unmapped
// plugin, the kernel's next read of it (at the thread's next preemption)
// kills the process with SIGSEGV.
#include <dlfcn.h>
#include <sched.h>
#include <unistd.h>

#include <condition_variable>
#include <mutex>
#include <thread>

#include "bufpool/buffer_pool.h"
#include "gtest/gtest.h"

namespace bufpool {
namespace {

using Cycle = int (*)(BufferPool*, int);

TEST(PluginUnloadTest, ThreadsThatRanAnUnloadedPluginsInlineCallsLiveOn) {
  auto pool = BufferPool::Create({.buffer_count = 256});
  ASSERT_TRUE(pool.ok()) << pool.status();
  for (int round = 0; round < 100; ++round) {
    void* so = dlopen(BUFPOOL_TEST_PLUGIN, RTLD_NOW | RTLD_LOCAL);
    ASSERT_NE(so, nullptr) << dlerror();
    auto cycle = reinterpret_cast<Cycle>(dlsym(so, "PluginCycle"));
    ASSERT_NE(cycle, nullptr) << dlerror();
    ASSERT_EQ(cycle(pool->get(), 8), 8);
    std::mutex mu;
    std::condition_variable cv;
    bool ran = false, unloaded = false;
    int worker_got = 0;
    std::thread worker([&] {
      worker_got = cycle(pool->get(), 8);
      std::unique_lock lock(mu);
      ran = true;
      cv.notify_all();
      cv.wait(lock, [&] { return unloaded; });  // blocked across dlclose
      lock.unlock();
      sched_yield();
      usleep(100);  // preempted and resumed after the unload
    });
    {
      std::unique_lock lock(mu);
      cv.wait(lock, [&] { return ran; });
    }
    ASSERT_EQ(dlclose(so), 0) << dlerror();
    {
      std::lock_guard lock(mu);
      unloaded = true;
    }
    cv.notify_all();
    worker.join();
    EXPECT_EQ(worker_got, 8);
    sched_yield();
    usleep(100);
  }
  EXPECT_EQ((*pool)->Stats().in_use, 0u);
}

}  // namespace
}  // namespace bufpool

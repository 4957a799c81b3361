// A plugin that uses the pool's inline API (TryAcquire, the handle's
// release: restartable sequences inlined here), loaded and unloaded by
// test/plugin_unload_test.cc. Its references to the pool's out-of-line
// code resolve against the test executable (ENABLE_EXPORTS).
#include <cstddef>

#include "bufpool/buffer_pool.h"

extern "C" __attribute__((visibility("default"))) int PluginCycle(
    bufpool::BufferPool* pool, int pairs) {
  int got = 0;
  for (int i = 0; i < pairs; ++i) {
    bufpool::Buffer b = pool->TryAcquire();
    if (!b) continue;
    b.data()[0] = std::byte{1};
    ++got;
  }
  return got;
}

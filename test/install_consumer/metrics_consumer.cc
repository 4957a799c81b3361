// Prints every metrics family the installed library writes (a pool that can
// grow, a budget, and an io_uring ring where the kernel has one), so that
// install_consumer_test can check that bufpool/metrics.h lists each.
#include <liburing.h>

#include <cstdio>
#include <string>

#include "bufpool/budget.h"
#include "bufpool/buffer_pool.h"
#include "bufpool/metrics.h"
#include "bufpool/uring.h"

int main() {
  auto pool =
      bufpool::BufferPool::Create({.buffer_count = 16, .max_buffer_count = 64});
  if (!pool.ok()) {
    std::fprintf(stderr, "%s\n", pool.status().ToString().c_str());
    return 1;
  }
  auto budget = (*pool)->CreateBudget({.name = "b", .max_bytes = 8 * 4096});
  if (!budget.ok()) {
    std::fprintf(stderr, "%s\n", budget.status().ToString().c_str());
    return 1;
  }
  std::string body;
  bufpool::WriteMetrics(**pool, &body, {.name = "p"});
  io_uring ring;
  if (io_uring_queue_init(8, &ring, 0) == 0) {
    {
      auto br = bufpool::ProvidedBufferRing::Create(
          &ring, **pool,
          {.group_id = 1, .max_buffers = 4, .initial_buffers = 4});
      if (br.ok()) bufpool::WriteMetrics(**br, &body, {.name = "p"});
    }  // the ring gives its buffers back before the pool goes
    io_uring_queue_exit(&ring);
  }
  budget->reset();
  std::fputs(body.c_str(), stdout);
  return 0;
}

// Uses the installed io_uring toolkit (bufpool/uring.h) and calls liburing
// itself, as a server on the toolkit does: its link line must bring
// liburing, whether libbufpool is static or shared.
#include <liburing.h>

#include <cstdio>

#include "bufpool/buffer_pool.h"
#include "bufpool/uring.h"

int main() {
  auto pool = bufpool::BufferPool::Create({.buffer_count = 16});
  if (!pool.ok()) {
    std::fprintf(stderr, "%s\n", pool.status().ToString().c_str());
    return 1;
  }
  io_uring ring;
  absl::StatusOr<bufpool::ServerRingSetup> setup =
      bufpool::InitServerRing(&ring, {.entries = 8});
  if (!setup.ok()) {
    // Linked is what this checks; a kernel without io_uring (or with it
    // disabled) cannot run it further.
    std::printf("uring consumer ok (io_uring unavailable: %s)\n",
                setup.status().ToString().c_str());
    return 0;
  }
  bool ok = true;
  {
    auto fixed = bufpool::FixedBuffers::Register(&ring, **pool);
    // Registration may be refused (RLIMIT_MEMLOCK); the call linked anyway.
    // The table is dropped here, before the ring.
    ok = !fixed.ok() || fixed->IndexOf((*pool)->region().data()) == 0;
  }
  io_uring_queue_exit(&ring);
  if (!ok) return 1;
  std::printf("uring consumer ok (%s)\n", setup->Describe().c_str());
  return 0;
}

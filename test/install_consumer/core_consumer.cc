// A user of the pool and chains who links bufpool::core only: no
// io_uring header, no liburing at build or run time (install_consumer_test
// checks the executable's and the library's needed entries).
#include <cstddef>
#include <cstdio>
#include <string>

#include "bufpool/buffer_pool.h"
#include "bufpool/chain.h"

int main() {
  auto pool = bufpool::BufferPool::Create({.buffer_count = 8});
  if (!pool.ok()) {
    std::fprintf(stderr, "%s\n", pool.status().ToString().c_str());
    return 1;
  }
  {
    bufpool::BufferChain chain(**pool);
    const std::string line(6000, 'x');  // spans two buffers
    if (!chain.Append(line).ok() || !chain.Append("\n").ok()) return 1;
    if (chain.size() != line.size() + 1) return 1;
    std::string back(chain.size(), '\0');
    if (chain.CopyTo(absl::Span<std::byte>(
            reinterpret_cast<std::byte*>(back.data()), back.size())) !=
            back.size() ||
        back != line + "\n") {
      return 1;
    }
  }
  if ((*pool)->Stats().in_use != 0) return 1;
  std::puts("core consumer ok");
  return 0;
}

// A counting malloc hook for the echo benchmark: linked into
// bufpool-echo-counting (apps/echo/bufpool_echo.cc plus this file), it counts
// every heap allocation the process makes (operator new ends in malloc), and
// the tool prints the count in its stats line. bench/run_echo_bench reads it
// around two load runs of different lengths, so connection setup cancels out
// and what is left is allocations per message on the data path.
//
// glibc lets an executable interpose malloc & co.; the real allocator stays
// reachable through its __libc_* entry points, so free() needs no hook.
#include <atomic>
#include <cerrno>
#include <cstddef>
#include <cstdint>

extern "C" {
void* __libc_malloc(size_t n);
void* __libc_calloc(size_t n, size_t m);
void* __libc_realloc(void* p, size_t n);
void* __libc_memalign(size_t align, size_t n);
}

namespace {
// Relaxed: a statistic, read only after the work it counts has finished.
std::atomic<uint64_t> g_allocations{0};
void Count() { g_allocations.fetch_add(1, std::memory_order_relaxed); }
}  // namespace

extern "C" {

void* malloc(size_t n) {
  Count();
  return __libc_malloc(n);
}

void* calloc(size_t n, size_t m) {
  Count();
  return __libc_calloc(n, m);
}

void* realloc(void* p, size_t n) {
  Count();
  return __libc_realloc(p, n);
}

void* memalign(size_t align, size_t n) {
  Count();
  return __libc_memalign(align, n);
}

void* aligned_alloc(size_t align, size_t n) {
  Count();
  return __libc_memalign(align, n);
}

int posix_memalign(void** out, size_t align, size_t n) {
  Count();
  void* p = __libc_memalign(align, n);
  if (p == nullptr) return ENOMEM;
  *out = p;
  return 0;
}

uint64_t BufpoolEchoHeapAllocations() {
  return g_allocations.load(std::memory_order_relaxed);
}

}  // extern "C"

// Allocation failure on demand, for tests of all-or-nothing behaviour: while
// bufpool::test_alloc::g_fail_allocations is set on a thread, operator new (and
// new[]) on that thread throws std::bad_alloc; bufpool::test_alloc::
// g_allocations counts the allocations made on it.
//
// This replaces the program's global operator new: include it in exactly one
// source file of a test program.
#ifndef BUFPOOL_TEST_ALLOC_FAILURE_H_
#define BUFPOOL_TEST_ALLOC_FAILURE_H_

#include <cstddef>
#include <cstdlib>
#include <new>

namespace bufpool::test_alloc {
thread_local bool g_fail_allocations = false;
thread_local size_t g_allocations = 0;

void* AllocateOrThrow(size_t n) {
  if (g_fail_allocations) throw std::bad_alloc();
  ++g_allocations;
  if (void* p = std::malloc(n == 0 ? 1 : n)) return p;
  throw std::bad_alloc();
}

// Sets g_fail_allocations for its scope.
class FailAllocations {
 public:
  FailAllocations() { g_fail_allocations = true; }
  ~FailAllocations() { g_fail_allocations = false; }
  FailAllocations(const FailAllocations&) = delete;
  FailAllocations& operator=(const FailAllocations&) = delete;
};
}  // namespace bufpool::test_alloc

// Every unaligned form, so that no allocation made through one of them is
// freed through another (the sanitizers' allocators tell them apart).
void* operator new(size_t n) { return bufpool::test_alloc::AllocateOrThrow(n); }
void* operator new[](size_t n) { return bufpool::test_alloc::AllocateOrThrow(n); }
void* operator new(size_t n, const std::nothrow_t&) noexcept {
  try {
    return bufpool::test_alloc::AllocateOrThrow(n);
  } catch (const std::bad_alloc&) {
    return nullptr;
  }
}
void* operator new[](size_t n, const std::nothrow_t& tag) noexcept {
  return operator new(n, tag);
}
void operator delete(void* p) noexcept { std::free(p); }
void operator delete[](void* p) noexcept { std::free(p); }
void operator delete(void* p, size_t) noexcept { std::free(p); }
void operator delete[](void* p, size_t) noexcept { std::free(p); }
void operator delete(void* p, const std::nothrow_t&) noexcept { std::free(p); }
void operator delete[](void* p, const std::nothrow_t&) noexcept {
  std::free(p);
}

#endif  // BUFPOOL_TEST_ALLOC_FAILURE_H_

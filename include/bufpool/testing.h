// libbufpool: GoogleTest checks that a test left no buffer out of a pool,
// naming where each one still out was acquired (BufferPool::HoldersReport(),
// bufpool/holders.h).
//
//   #include "bufpool/testing.h"
//
//   TEST(ServerTest, ClosingAConnectionReturnsItsBuffers) {
//     auto pool = *bufpool::BufferPool::Create(
//         {.track_holders = bufpool::TrackHolders::kAll});
//     bufpool::testing::NoHoldersAtExit no_leaks(*pool);  // checked last
//     ...
//     EXPECT_TRUE(bufpool::testing::NoHolders(*pool));    // or at any point
//   }
//
// A failure's message is the pool's HoldersReport(): with tracking on
// (kAll, or BUFPOOL_TRACK_HOLDERS=all in the test's environment), each
// acquire site with its stack, file and line; with tracking off, the counts
// per kind of holder and the switch that turns tracking on. Buffers idle
// in the pool's caches are free and never count; buffers a live io_uring
// ring holds for the kernel are out (destroy the ring first, as the pool
// needs anyway).
//
// Header-only, on the public API and GoogleTest: a test target links
// GoogleTest and bufpool::bufpool (or bufpool::core) as it does anyway;
// the library itself never depends on GoogleTest.
//
// Thread safety: call these when no other thread acquires from or releases
// to the pool (what is out is read once, as a snapshot).
#ifndef BUFPOOL_TESTING_H_
#define BUFPOOL_TESTING_H_

#include "bufpool/buffer_pool.h"
#include "gtest/gtest.h"

namespace bufpool::testing {

// Success when no buffer of `pool` is out; otherwise a failure whose
// message is the pool's HoldersReport().
//   EXPECT_TRUE(bufpool::testing::NoHolders(*pool));
inline ::testing::AssertionResult NoHolders(const BufferPool& pool) {
  if (pool.Stats().in_use == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "buffers are still out of the pool:\n"
                                       << pool.HoldersReport();
}

// The same as a statement: adds a (non-fatal) failure to the running test.
inline void ExpectNoHolders(const BufferPool& pool) {
  const ::testing::AssertionResult result = NoHolders(pool);
  if (!result) ADD_FAILURE() << result.message();
}

// Checks NoHolders() when it goes out of scope. Declare it after the pool
// and before whatever holds buffers (chains, rings, handles), so that those
// are destroyed first and the pool after it.
class NoHoldersAtExit {
 public:
  explicit NoHoldersAtExit(const BufferPool& pool) : pool_(pool) {}
  ~NoHoldersAtExit() { ExpectNoHolders(pool_); }
  NoHoldersAtExit(const NoHoldersAtExit&) = delete;
  NoHoldersAtExit& operator=(const NoHoldersAtExit&) = delete;

 private:
  const BufferPool& pool_;
};

}  // namespace bufpool::testing

#endif  // BUFPOOL_TESTING_H_

// GoogleTest checks that a test left no buffer out of a pool, naming where
// each one still out was acquired (BufferPool::HoldersReport()).
//
//   auto pool = BufferPool::Create({.track_holders = TrackHolders::kAll});
//   ...
//   EXPECT_TRUE(bufpool::testing::NoHolders(**pool));
//
// or, for the whole test body:
//
//   bufpool::testing::NoHoldersAtExit check(**pool);
//
// With tracking off the failure gives the counts per kind of holder and
// the switch that turns tracking on (BUFPOOL_TRACK_HOLDERS=all). Buffers
// idle in the pool's caches are free and never count.
//
// Not installed: the project's own tests link it (bufpool_testing); it
// uses only the public API, so a user's test can copy it.
#ifndef BUFPOOL_TEST_TESTING_NO_HOLDERS_H_
#define BUFPOOL_TEST_TESTING_NO_HOLDERS_H_

#include "bufpool/buffer_pool.h"
#include "gtest/gtest.h"

namespace bufpool::testing {

// Success when no buffer of `pool` is out; otherwise a failure whose
// message is the pool's HoldersReport(). Call it when no other thread
// acquires from or releases to the pool.
::testing::AssertionResult NoHolders(const BufferPool& pool);

// The same as a statement: adds a failure to the running test.
void ExpectNoHolders(const BufferPool& pool);

// Checks NoHolders() when it goes out of scope (declare it after what holds
// buffers, so that those are destroyed first).
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

#endif  // BUFPOOL_TEST_TESTING_NO_HOLDERS_H_

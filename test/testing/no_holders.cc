#include "testing/no_holders.h"

namespace bufpool::testing {

::testing::AssertionResult NoHolders(const BufferPool& pool) {
  if (pool.Stats().in_use == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "buffers are still out of the pool:\n"
                                       << pool.HoldersReport();
}

void ExpectNoHolders(const BufferPool& pool) {
  const ::testing::AssertionResult result = NoHolders(pool);
  if (!result) ADD_FAILURE() << result.message();
}

}  // namespace bufpool::testing

// Chains, budgets and metrics in a process that joined a shared pool: they
// work on the joined pool as on a private one, the budget counts what the
// joined process's chains keep out, and everything goes back to the shared
// depot when the process leaves.
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "bufpool/budget.h"
#include "bufpool/buffer_pool.h"
#include "bufpool/chain.h"
#include "bufpool/metrics.h"
#include "gtest/gtest.h"
#include "test_util.h"

namespace bufpool {
namespace {

// The child's checks, each with its own exit code (0: all passed).
int ChildUsesChainsAndABudget(int fd) {
  auto joined = BufferPool::Join(fd);
  if (!joined.ok()) return 10;
  BufferPool& pool = **joined;
  auto budget = pool.CreateBudget({.name = "conn", .max_bytes = 4 * 4096});
  if (!budget.ok()) return 11;
  {
    BufferChain in(**budget);
    std::string bytes(10000, '\0');
    for (size_t i = 0; i < bytes.size(); ++i) bytes[i] = static_cast<char>(i);
    if (!in.Append(bytes).ok()) return 12;
    // 10,000 bytes pin three buffers of the joined pool.
    if ((*budget)->pinned_bytes() != 3 * 4096) return 13;
    // A clone shares the buffers: still three, counted once.
    BufferChain copy = in.Clone();
    if ((*budget)->pinned_bytes() != 3 * 4096) return 14;
    std::string back(bytes.size(), '\0');
    if (copy.CopyTo(absl::MakeSpan(reinterpret_cast<std::byte*>(back.data()),
                                   back.size())) != bytes.size() ||
        back != bytes) {
      return 15;
    }
    // Past the cap: refused, nothing lost.
    if (in.Append(std::string(8192, 'x')).ok()) return 16;
    if (in.size() != bytes.size()) return 17;
    std::string metrics;
    WriteMetrics(pool, &metrics, {.name = "joined"});
    if (metrics.find(absl::StrCat("process=\"", ::getpid(), "\"")) ==
        std::string::npos) {
      return 18;
    }
  }
  if ((*budget)->pinned_bytes() != 0) return 19;
  budget->reset();
  joined->reset();  // leaves: what it cached goes back to the shared depot
  return 0;
}

TEST(SharedChainTest, ChainsAndBudgetsWorkInAJoinedProcess) {
  SKIP_FORKED_JOIN_UNDER_TSAN();
  auto pool = BufferPool::Create({.buffer_size = 4096,
                                  .buffer_count = 64,
                                  .cache_size = 8,
                                  .shared = true});
  ASSERT_TRUE(pool.ok()) << pool.status();
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) _exit(ChildUsesChainsAndABudget((*pool)->shared_fd()));
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status)) << status;
  EXPECT_EQ(WEXITSTATUS(status), 0) << "the child's check that failed";
  // The child left cleanly: nothing to reclaim, every buffer takeable here.
  EXPECT_EQ((*pool)->ReclaimDead(), 0u);
  std::vector<Buffer> all;
  while (Buffer b = (*pool)->TryAcquire()) all.push_back(std::move(b));
  EXPECT_EQ(all.size(), 64u);
}

}  // namespace
}  // namespace bufpool

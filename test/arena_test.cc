#include "arena/arena.h"

#include <sys/mman.h>

#include <cstdint>
#include <vector>

#include "gtest/gtest.h"
#include "os/memory.h"

namespace bufpool {
namespace {

bool AllResident(const Arena& a) {
  std::vector<unsigned char> vec(a.mapped_size() / os::kPageSize);
  if (mincore(a.data(), a.mapped_size(), vec.data()) != 0) return false;
  for (unsigned char v : vec) {
    if ((v & 1) == 0) return false;
  }
  return true;
}

TEST(ArenaTest, SmallArenaIsPageAlignedAndRoundedToPages) {
  auto a = Arena::Map({.size = 10000, .huge_pages = HugePages::kTry});
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(reinterpret_cast<uintptr_t>(a->data()) % os::kPageSize, 0u);
  EXPECT_EQ(a->size(), 10000u);
  EXPECT_EQ(a->mapped_size(), 3 * os::kPageSize);
  EXPECT_FALSE(a->huge_pages());  // under 2 MiB there is no huge page to use
}

TEST(ArenaTest, LargeArenaWithHugePagesIsTwoMebibyteAligned) {
  auto a = Arena::Map({.size = 5 << 20, .huge_pages = HugePages::kTry});
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(reinterpret_cast<uintptr_t>(a->data()) % os::kHugePageSize, 0u);
  EXPECT_EQ(a->mapped_size(), 6u << 20);
}

TEST(ArenaTest, NeverUsesSmallPages) {
  auto a = Arena::Map({.size = 5 << 20, .huge_pages = HugePages::kNever});
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_FALSE(a->huge_pages());
  EXPECT_EQ(a->mapped_size(), 5u << 20);
}

TEST(ArenaTest, PopulateFaultsEveryPageIn) {
  auto a = Arena::Map(
      {.size = 4 << 20, .huge_pages = HugePages::kNever, .populate = true});
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_TRUE(AllResident(*a));
}

TEST(ArenaTest, WithoutPopulateNothingIsResident) {
  auto a = Arena::Map(
      {.size = 4 << 20, .huge_pages = HugePages::kNever, .populate = false});
  ASSERT_TRUE(a.ok()) << a.status();
  std::vector<unsigned char> vec(a->mapped_size() / os::kPageSize);
  ASSERT_EQ(mincore(a->data(), a->mapped_size(), vec.data()), 0);
  for (unsigned char v : vec) EXPECT_EQ(v & 1, 0);
}

TEST(ArenaTest, RequireHugePagesFailsClearlyWithoutReservedPages) {
  if (os::ReservedHugePages() != 0) {
    GTEST_SKIP()
        << "this machine reserves huge pages; the error path needs none";
  }
  auto a = Arena::Map({.size = 2 << 20, .huge_pages = HugePages::kRequire});
  ASSERT_FALSE(a.ok());
  EXPECT_EQ(a.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_NE(a.status().message().find("no huge pages are reserved"),
            std::string::npos)
      << a.status();
  EXPECT_NE(a.status().message().find("vm.nr_hugepages"), std::string::npos);
}

TEST(ArenaTest, MoveTransfersTheMapping) {
  auto a = Arena::Map({.size = 8192});
  ASSERT_TRUE(a.ok());
  std::byte* p = a->data();
  Arena b = std::move(*a);
  EXPECT_EQ(b.data(), p);
  EXPECT_EQ(a->data(), nullptr);  // NOLINT: moved-from is empty by contract
  p[8191] = std::byte{7};         // still mapped
}

}  // namespace
}  // namespace bufpool

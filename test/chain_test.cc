// SharedBuffer slices and BufferChain (bufpool/chain.h), checked against a
// std::string model; every test ends with the pool's in_use back at 0.
#include "bufpool/chain.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <random>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "test_util.h"

namespace bufpool {
namespace {

using testing_util::Contents;
using testing_util::MakePool;
using testing_util::Pipe;
using testing_util::RandomBytes;
using testing_util::UniqueFd;

size_t InUse(const BufferPool& pool) { return pool.Stats().in_use; }

// Structure and bytes: the spans, CopyTo and FillIovecs all agree with the
// model, and no slice is empty.
void ExpectChainIs(const BufferChain& chain, const std::string& model) {
  ASSERT_EQ(chain.size(), model.size());
  EXPECT_EQ(chain.empty(), model.empty());
  size_t total = 0;
  for (size_t i = 0; i < chain.slice_count(); ++i) {
    ASSERT_NE(chain.slice(i).size(), 0u) << "empty slice " << i;
    total += chain.slice(i).size();
  }
  ASSERT_EQ(total, model.size());
  ASSERT_EQ(Contents(chain), model);
  std::string copy(model.size(), '\0');
  ASSERT_EQ(chain.CopyTo(absl::MakeSpan(
                reinterpret_cast<std::byte*>(copy.data()), copy.size())),
            model.size());
  ASSERT_EQ(copy, model);
  std::vector<iovec> iov(chain.slice_count() + 1);
  ASSERT_EQ(chain.FillIovecs(absl::MakeSpan(iov)), chain.slice_count());
  std::string from_iov;
  for (size_t i = 0; i < chain.slice_count(); ++i) {
    from_iov.append(static_cast<const char*>(iov[i].iov_base), iov[i].iov_len);
  }
  ASSERT_EQ(from_iov, model);
}

// segment_count(), segment(i) and keeps_room() are deprecated (removed in
// 0.4) and still work until then: the one place that calls them.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
TEST(BufferChainTest, DeprecatedSegmentNamesStillWork) {
  auto pool = MakePool(64, 8);
  BufferChain chain(*pool);
  const std::string bytes =
      std::string(64, 'a') + std::string(64, 'b') + std::string(22, 'c');
  ASSERT_TRUE(chain.Append(bytes).ok());
  ASSERT_EQ(chain.segment_count(), 3u);
  std::string read;
  for (size_t i = 0; i < chain.segment_count(); ++i) {
    const absl::string_view v = chain.segment(i).view();
    read.append(v.data(), v.size());
  }
  EXPECT_EQ(read, bytes);
  EXPECT_EQ(chain.segment(2).size(), 22u);
  chain.Consume(chain.size());
  EXPECT_EQ(chain.segment_count(), 0u);
  EXPECT_FALSE(chain.keeps_room());
  EXPECT_EQ(InUse(*pool), 0u);
}
#pragma GCC diagnostic pop

TEST(SharedBufferTest, WholeBufferAndSlicesShareOneBuffer) {
  auto pool = MakePool(4096, 8);
  Buffer b = pool->TryAcquire();
  std::memcpy(b.data(), "0123456789abcdefBODY", 20);
  std::byte* const start = b.data();
  SharedBuffer whole(std::move(b));
  EXPECT_FALSE(b);
  EXPECT_EQ(whole.data(), start);
  EXPECT_EQ(whole.size(), 4096u);
  EXPECT_EQ(whole.use_count(), 1u);
  SharedBuffer header = whole.Slice(0, 16);
  SharedBuffer body = whole.Slice(16, 4);
  EXPECT_EQ(header.view(), "0123456789abcdef");
  EXPECT_EQ(body.view(), "BODY");
  EXPECT_EQ(body.offset(), 16u);
  EXPECT_EQ(body.room(), 4096u - 20);
  EXPECT_EQ(whole.use_count(), 3u);
  EXPECT_EQ(InUse(*pool), 1u);
  whole.Reset();
  header.Reset();
  EXPECT_EQ(InUse(*pool), 1u);  // body still holds it
  EXPECT_EQ(body.use_count(), 1u);
  body.Reset();
  EXPECT_EQ(InUse(*pool), 0u);
}

TEST(SharedBufferTest, CopyMoveAndAssignCountReferences) {
  auto pool = MakePool(4096, 8);
  SharedBuffer a(pool->TryAcquire());
  SharedBuffer b = a;
  EXPECT_EQ(a.use_count(), 2u);
  SharedBuffer c = std::move(b);
  EXPECT_FALSE(b);
  EXPECT_EQ(a.use_count(), 2u);
  SharedBuffer d(pool->TryAcquire());
  EXPECT_EQ(InUse(*pool), 2u);
  d = a;  // drops d's buffer, shares a's
  EXPECT_EQ(InUse(*pool), 1u);
  EXPECT_EQ(a.use_count(), 3u);
  d = d;  // self-assignment keeps it
  EXPECT_EQ(a.use_count(), 3u);
  c = std::move(d);
  EXPECT_EQ(a.use_count(), 2u);
  a.Reset();
  c.Reset();
  EXPECT_EQ(InUse(*pool), 0u);
}

TEST(SharedBufferTest, EmptyHandleGivesAnEmptySlice) {
  SharedBuffer s{Buffer()};
  EXPECT_FALSE(s);
  EXPECT_EQ(s.size(), 0u);
  EXPECT_EQ(s.use_count(), 0u);
}

// Found by test/fuzz/chain_fuzz: a reset or moved-from slice kept its
// data() and size(), a view of a buffer already back in the pool.
TEST(SharedBufferTest, ResetAndMovedFromSlicesAreEmpty) {
  auto pool = MakePool(4096, 8);
  SharedBuffer a(pool->TryAcquire());
  SharedBuffer b = a.Slice(8, 16);
  a.Reset();
  EXPECT_FALSE(a);
  EXPECT_EQ(a.data(), nullptr);
  EXPECT_EQ(a.size(), 0u);
  EXPECT_TRUE(a.view().empty());
  SharedBuffer c = std::move(b);
  EXPECT_EQ(b.data(), nullptr);
  EXPECT_EQ(b.size(), 0u);
  SharedBuffer d;
  d = std::move(c);
  EXPECT_EQ(c.data(), nullptr);
  EXPECT_EQ(c.size(), 0u);
  EXPECT_EQ(d.size(), 16u);
  d.Reset();
  EXPECT_EQ(d.size(), 0u);
  EXPECT_EQ(InUse(*pool), 0u);
}

TEST(SharedBufferTest, SliceOfASliceIsRelativeToIt) {
  auto pool = MakePool(4096, 2);
  Buffer b = pool->TryAcquire();
  for (int i = 0; i < 100; ++i) b.data()[i] = static_cast<std::byte>(i);
  SharedBuffer whole(std::move(b));
  SharedBuffer mid = whole.Slice(10, 50).Slice(5, 10);
  EXPECT_EQ(mid.offset(), 15u);
  EXPECT_EQ(static_cast<int>(mid.data()[0]), 15);
  EXPECT_EQ(mid.Slice(10, 0).size(), 0u);  // an empty slice at the end
}

class ChainDeathTest : public testing::Test {
 protected:
  void SetUp() override { GTEST_FLAG_SET(death_test_style, "threadsafe"); }
};

TEST_F(ChainDeathTest, SliceOutsideTheSliceAborts) {
  auto pool = MakePool(4096, 2);
  SharedBuffer s = SharedBuffer(pool->TryAcquire()).Slice(100, 50);
  EXPECT_DEATH(s.Slice(10, 41), "Slice\\(10, 41\\) lies outside .* 50 bytes");
  EXPECT_DEATH(s.Slice(51, 0), "Slice\\(51, 0\\)");
  EXPECT_DEATH(SharedBuffer().Slice(0, 0), "of an empty SharedBuffer");
}

TEST_F(ChainDeathTest, PoolDestroyedWhileASliceLivesAborts) {
  auto pool = MakePool(4096, 4);
  SharedBuffer s = SharedBuffer(pool->TryAcquire()).Slice(0, 8);
  EXPECT_EQ(InUse(*pool), 1u);
  EXPECT_DEATH(pool.reset(), "still in use .*1 held by Buffer handles");
  s.Reset();
}

TEST_F(ChainDeathTest, PoolDestroyedWhileAChainHoldsBytesAborts) {
  auto pool = MakePool(64, 8);
  auto chain = std::make_unique<BufferChain>(*pool);
  ASSERT_TRUE(chain->Append(std::string(200, 'x')).ok());
  EXPECT_EQ(InUse(*pool), 4u);
  EXPECT_DEATH(pool.reset(), "4 buffer\\(s\\) still in use");
  chain.reset();
  EXPECT_EQ(InUse(*pool), 0u);
}

TEST(BufferChainTest, AppendOfAFilledBufferLinksItsPrefix) {
  auto pool = MakePool(64, 4);
  BufferChain c(*pool);
  Buffer b = pool->TryAcquire();
  std::memcpy(b.data(), "filled", 6);
  c.Append(std::move(b), 6);
  EXPECT_FALSE(b);
  ExpectChainIs(c, "filled");
  ASSERT_TRUE(c.Append("+room").ok());  // the chain owns it: its room is used
  EXPECT_EQ(c.slice_count(), 1u);
  c.Append(pool->TryAcquire(), 0);  // nothing to link: straight back
  EXPECT_EQ(InUse(*pool), 1u);
  ExpectChainIs(c, "filled+room");
}

TEST_F(ChainDeathTest, AppendOfMoreBytesThanTheBufferHoldsAborts) {
  auto pool = MakePool(64, 4);
  BufferChain c(*pool);
  EXPECT_DEATH(c.Append(pool->TryAcquire(), 65),
               "Append\\(buffer, 65\\) of a buffer of 64 bytes");
}

TEST(BufferChainTest, AppendCopiesIntoRoomThenFreshBuffers) {
  auto pool = MakePool(64, 16);
  BufferChain c(*pool);
  EXPECT_TRUE(c.empty());
  ASSERT_TRUE(c.Append("hello ").ok());
  ASSERT_TRUE(c.Append("world").ok());
  EXPECT_EQ(c.slice_count(), 1u);  // both in one buffer's room
  EXPECT_EQ(InUse(*pool), 1u);
  const std::string big = std::string(150, 'b');
  ASSERT_TRUE(c.Append(big).ok());
  ExpectChainIs(c, "hello world" + big);
  EXPECT_EQ(c.slice_count(), 3u);  // 11 + 150 = 161 bytes: 64 + 64 + 33
  EXPECT_EQ(InUse(*pool), 3u);
  c.Clear();
  EXPECT_EQ(InUse(*pool), 0u);
}

TEST(BufferChainTest, LinkingDoesNotCopy) {
  auto pool = MakePool(4096, 8);
  Buffer b = pool->TryAcquire();
  std::memcpy(b.data(), "HEADbody", 8);
  SharedBuffer whole(std::move(b));
  BufferChain msg(*pool);
  msg.Append(whole.Slice(4, 4));
  msg.Append(whole.Slice(0, 4));
  msg.Append(SharedBuffer());  // empty: dropped
  msg.Append(whole.Slice(0, 0));
  EXPECT_EQ(msg.slice_count(), 2u);
  EXPECT_EQ(msg.slice(0).data(), whole.data() + 4);
  ExpectChainIs(msg, "bodyHEAD");
  EXPECT_EQ(whole.use_count(), 3u);
  whole.Reset();
  msg.Consume(4);  // the first slice goes; the buffer stays for the second
  EXPECT_EQ(InUse(*pool), 1u);
  msg.Consume(100);
  EXPECT_TRUE(msg.empty());
  EXPECT_EQ(InUse(*pool), 0u);  // emptied: the buffer went back
}

// An emptied chain pins no buffer, whatever it held and however it was
// emptied (one slice consumed whole inline, several, part by part), so a
// server's idle connections hold none; the next bytes take a fresh one.
TEST(BufferChainTest, AnEmptiedChainPinsNoBuffer) {
  auto pool = MakePool(4096, 8, /*cache=*/0);
  BufferChain q(*pool);
  ASSERT_TRUE(q.Append("hello").ok());
  q.Consume(5);  // one slice, whole: inline
  EXPECT_EQ(InUse(*pool), 0u);
  EXPECT_EQ(q.pinned_bytes(), 0u);
  EXPECT_EQ(q.tail_room(), 0u);
  ASSERT_TRUE(q.Append(std::string(5000, 'a')).ok());  // two buffers
  q.Consume(1);
  q.Consume(4999);
  EXPECT_EQ(InUse(*pool), 0u);
  ASSERT_TRUE(q.Append(std::string(9000, 'b')).ok());
  for (size_t left = q.size(); left != 0; left -= std::min<size_t>(left, 7)) {
    q.Consume(7);
  }
  EXPECT_TRUE(q.empty());
  EXPECT_EQ(InUse(*pool), 0u);
  // Moving an emptied chain, or into it, moves nothing pinned.
  BufferChain moved = std::move(q);
  EXPECT_EQ(InUse(*pool), 0u);
  ASSERT_TRUE(moved.Append("x").ok());
  EXPECT_EQ(InUse(*pool), 1u);
  ExpectChainIs(moved, "x");
  moved.Consume(1);
  EXPECT_EQ(InUse(*pool), 0u);
}

// slice(i) outside [0, slice_count()) names the mistake instead of handing
// out an unused ring entry, in builds that check (without NDEBUG: the asan
// preset's Debug build).
TEST_F(ChainDeathTest, SliceIndexOutsideTheChainAborts) {
#ifdef NDEBUG
  GTEST_SKIP() << "slice(i) is checked only without NDEBUG";
#endif
  auto pool = MakePool(4096, 2, /*cache=*/0);
  BufferChain q(*pool);
  ASSERT_TRUE(q.Append("a").ok());
  q.Consume(1);
  EXPECT_DEATH(q.slice(0), "slice\\(0\\) of a chain of 0 slices");
  ASSERT_TRUE(q.Append("b").ok());
  EXPECT_DEATH(q.slice(1), "slice\\(1\\) of a chain of 1 slices");
}

// Memory follows bytes: a queue fed a byte at a time and consumed now and
// then pins at most its bytes plus two buffers (a partly consumed head, a
// partly filled tail), and nothing once empty.
TEST(BufferChainTest, TrickledQueueStaysWithinTheBound) {
  auto pool = MakePool(4096, 16, /*cache=*/0);
  BufferChain q(*pool);
  std::mt19937 rng(7);
  for (int i = 0; i < 50000; ++i) {
    ASSERT_TRUE(q.Append("x").ok());
    if (rng() % 97 == 0) q.Consume(rng() % (q.size() + 1));
    ASSERT_LE(q.pinned_bytes(), q.size() + 2 * 4096) << i;
    ASSERT_LE(InUse(*pool) * 4096, q.size() + 2 * 4096) << i;
  }
  q.Consume(q.size());
  EXPECT_EQ(InUse(*pool), 0u);
}

// A tail shared with another slice is never written into: the bytes past it
// may be visible through that slice.
TEST(BufferChainTest, AppendNeverWritesIntoASharedTail) {
  auto pool = MakePool(4096, 8);
  Buffer b = pool->TryAcquire();
  std::memcpy(b.data(), "abcdefgh", 8);
  SharedBuffer whole(std::move(b));
  BufferChain c(*pool);
  c.Append(whole.Slice(0, 4));  // "abcd"; whole still sees "efgh" after it
  ASSERT_TRUE(c.Append("XY").ok());
  EXPECT_EQ(whole.view().substr(0, 8), "abcdefgh");
  EXPECT_EQ(c.slice_count(), 2u);
  ExpectChainIs(c, "abcdXY");
  // Once the chain's tail is the only reference, its room is used.
  whole.Reset();
  ASSERT_TRUE(c.Append("Z").ok());
  EXPECT_EQ(c.slice_count(), 2u);
  ExpectChainIs(c, "abcdXYZ");
}

TEST(BufferChainTest, SplitSharesTheBufferItCuts) {
  auto pool = MakePool(64, 8);
  BufferChain c(*pool);
  ASSERT_TRUE(c.Append(std::string(100, 'q')).ok());
  BufferChain first = c.Split(70);
  ExpectChainIs(first, std::string(70, 'q'));
  ExpectChainIs(c, std::string(30, 'q'));
  EXPECT_EQ(first.slice_count(), 2u);
  EXPECT_EQ(c.slice_count(), 1u);
  EXPECT_EQ(first.slice(1).slot(), c.slice(0).slot());
  EXPECT_EQ(c.slice(0).use_count(), 2u);
  EXPECT_EQ(InUse(*pool), 2u);
  // The first chain's tail is shared, so an append starts a fresh buffer
  // rather than overwrite bytes the second chain holds.
  ASSERT_TRUE(first.Append("!").ok());
  ExpectChainIs(c, std::string(30, 'q'));
  EXPECT_EQ(InUse(*pool), 3u);
}

TEST(BufferChainTest, SplitAtEveryOffset) {
  auto pool = MakePool(64, 64);
  std::mt19937_64 rng(7);
  const std::string model = RandomBytes(300, rng);
  for (size_t n = 0; n <= model.size() + 1; ++n) {
    BufferChain c(*pool);
    // Mixed slices: copied bytes, then a linked slice from mid-buffer.
    ASSERT_TRUE(c.Append(absl::string_view(model).substr(0, 150)).ok());
    BufferChain tmp(*pool);
    ASSERT_TRUE(tmp.Append(std::string("..") + model.substr(150)).ok());
    tmp.Consume(2);
    c.Append(std::move(tmp));
    EXPECT_TRUE(tmp.empty());
    BufferChain first = c.Split(n);
    const size_t k = std::min(n, model.size());
    ExpectChainIs(first, model.substr(0, k));
    ExpectChainIs(c, model.substr(k));
  }
  EXPECT_EQ(InUse(*pool), 0u);
}

// Cuts of one buffer count their references ahead in one add: the chain's
// front keeps the rest, which its own use_count() leaves out, so the tail's
// room is still writable once the cut frames are gone, and every reference
// goes back however the cuts and the chain are dropped.
TEST(BufferChainTest, CutsOfOneBufferShareReservedReferences) {
  auto pool = MakePool(4096, 8);
  std::mt19937_64 rng(11);
  const std::string model = RandomBytes(2000, rng);
  BufferChain c(*pool);
  ASSERT_TRUE(c.Append(model).ok());
  ASSERT_EQ(c.slice_count(), 1u);
  std::vector<BufferChain> frames;
  for (int i = 0; i < 10; ++i) frames.push_back(c.Split(100));
  for (int i = 0; i < 10; ++i) {
    ExpectChainIs(frames[i], model.substr(100 * i, 100));
    EXPECT_EQ(frames[i].slice(0).slot(), c.slice(0).slot());
    EXPECT_GE(frames[i].slice(0).use_count(), 11u);
  }
  EXPECT_EQ(c.slice(0).use_count(), 11u);  // ten frames and the chain
  EXPECT_EQ(InUse(*pool), 1u);
  frames.clear();
  EXPECT_EQ(c.slice(0).use_count(), 1u);
  EXPECT_EQ(c.tail_room(), 4096u - 2000);
  ASSERT_TRUE(c.Append("xyz").ok());  // into the room: no frame holds it
  EXPECT_EQ(c.slice_count(), 1u);
  std::string rest = model.substr(1000) + "xyz";
  ExpectChainIs(c, rest);

  // Cuts of other sizes (the count's guess runs out, or is left over on
  // the last cut, which takes the front itself); a copy takes none of the
  // front's reserve; the chain goes first, its frames after it.
  const size_t sizes[] = {7, 300, 1, 250, 90, 5};
  for (size_t n : sizes) frames.push_back(c.Split(n));
  frames.push_back(c.Split(c.size()));
  EXPECT_TRUE(c.empty());
  SharedBuffer copy = frames[2].slice(0);
  size_t at = 0;
  for (const BufferChain& f : frames) {
    ExpectChainIs(f, rest.substr(at, f.size()));
    at += f.size();
  }
  EXPECT_EQ(at, rest.size());
  c.Clear();
  EXPECT_EQ(InUse(*pool), 1u);
  for (size_t i = 0; i + 1 < frames.size(); ++i) frames[i] = BufferChain();
  EXPECT_EQ(InUse(*pool), 1u);  // the last frame and the copy hold it
  // The last cut took the front and what it had left of its reserve.
  EXPECT_EQ(copy.use_count(),
            2u + internal::ChainAccess::Reserved(frames.back().slice(0)));
  frames.clear();
  EXPECT_EQ(copy.use_count(), 1u);
  copy.Reset();
  EXPECT_EQ(InUse(*pool), 0u);
}

// Frames cut on one thread (sizes at random, so cuts take, run out of and
// leave over reserved references) and dropped on others while the cutting
// goes on: every frame reads its bytes, and every buffer comes back once.
TEST(BufferChainTest, FramesCutOnOneThreadAreDroppedOnOthers) {
  constexpr int kThreads = 3;
  constexpr int kBuffers = 400;
  auto pool = MakePool(1024, 64);
  std::mutex mu;
  std::vector<BufferChain> queue;
  std::vector<std::string> expect;
  bool done = false;
  std::atomic<int> bad{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&] {
      for (;;) {
        BufferChain frame;
        std::string want;
        bool got = false;
        {
          std::lock_guard<std::mutex> lock(mu);
          if (!queue.empty()) {
            frame = std::move(queue.back());
            want = std::move(expect.back());
            queue.pop_back();
            expect.pop_back();
            got = true;
          } else if (done) {
            return;
          }
        }
        if (!got) {
          std::this_thread::yield();
          continue;
        }
        if (Contents(frame) != want) bad.fetch_add(1);
      }
    });
  }
  std::mt19937_64 rng(5);
  BufferChain in(*pool);
  std::string model;
  for (int b = 0; b < kBuffers; ++b) {
    for (;;) {  // leave buffers for the pool
      {
        std::lock_guard<std::mutex> lock(mu);
        if (queue.size() < 32) break;
      }
      std::this_thread::yield();
    }
    const std::string bytes = RandomBytes(1024, rng);
    ASSERT_TRUE(in.Append(bytes).ok());
    model += bytes;
    while (!in.empty()) {
      const size_t n = std::min<size_t>(in.size(), 1 + rng() % 600);
      if (n == in.size() && b + 1 < kBuffers && rng() % 2 == 0) break;
      BufferChain frame = in.Split(n);
      std::lock_guard<std::mutex> lock(mu);
      queue.push_back(std::move(frame));
      expect.push_back(model.substr(0, n));
      model.erase(0, n);
    }
  }
  {
    std::lock_guard<std::mutex> lock(mu);
    done = true;
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(bad.load(), 0);
  EXPECT_TRUE(in.empty());
  EXPECT_EQ(InUse(*pool), 0u);
}

TEST(BufferChainTest, DryPoolMidAppendAppendsNothingAndLosesNothing) {
  auto pool = MakePool(64, 5);
  BufferChain c(*pool);
  ASSERT_TRUE(c.Append(std::string(60, 'a')).ok());  // 4 bytes of room left
  Buffer held = pool->TryAcquire();
  // 4 bytes into the room, then 4 fresh buffers for 196 more: 3 are free.
  absl::Status s = c.Append(std::string(200, 'b'));
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted) << s;
  EXPECT_NE(s.message().find("needed 4 buffers of 64, got 3"),
            std::string::npos)
      << s;
  ExpectChainIs(c, std::string(60, 'a'));
  EXPECT_EQ(InUse(*pool), 2u);  // the chain's one and `held`
  held.Reset();
  ASSERT_TRUE(c.Append(std::string(200, 'b')).ok());
  ExpectChainIs(c, std::string(60, 'a') + std::string(200, 'b'));
  c.Clear();
  EXPECT_EQ(InUse(*pool), 0u);
}

TEST(BufferChainTest, ChainWithoutAPoolLinksButCannotCopyIn) {
  auto pool = MakePool(64, 4);
  BufferChain c;
  absl::Status s = c.Append("x");
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  BufferChain src(*pool);
  ASSERT_TRUE(src.Append("abc").ok());
  c.Append(src.slice(0));
  ExpectChainIs(c, "abc");
  src.Clear();
  c.Clear();
  EXPECT_EQ(InUse(*pool), 0u);
}

TEST(BufferChainTest, MovesKeepSlicesInlineAndOnTheHeap) {
  auto pool = MakePool(64, 64);
  for (size_t len : {10, 200, 64 * 20}) {  // 1, 4 (inline) and 20 slices
    const std::string model(len, 'm');
    BufferChain a(*pool);
    ASSERT_TRUE(a.Append("xx").ok());
    a.Consume(1);  // moves the ring's head
    ASSERT_TRUE(a.Append(model).ok());
    BufferChain b(std::move(a));
    EXPECT_TRUE(a.empty());
    EXPECT_EQ(a.slice_count(), 0u);
    ExpectChainIs(b, "x" + model);
    BufferChain c(*pool);
    ASSERT_TRUE(c.Append("old").ok());
    c = std::move(b);
    ExpectChainIs(c, "x" + model);
    // A moved-from chain is usable.
    ASSERT_TRUE(a.Append("again").ok());
    ExpectChainIs(a, "again");
  }
  EXPECT_EQ(InUse(*pool), 0u);
}

// Move assignment between every mix of inline (<= 4 slices) and grown
// chains: the target gets exactly the source's bytes, the source is empty
// and usable (holding the target's old storage), nothing leaks (ASan).
TEST(BufferChainTest, MoveAssignmentTradesStorage) {
  auto pool = MakePool(64, 128);
  for (size_t target_len : {0, 10, 64 * 20}) {
    for (size_t source_len : {0, 10, 200, 64 * 20}) {
      for (int round = 0; round < 3; ++round) {  // back and forth
        BufferChain target(*pool);
        ASSERT_TRUE(target.Append(std::string(target_len, 't')).ok());
        BufferChain source(*pool);
        ASSERT_TRUE(source.Append("yy").ok());
        source.Consume(1);  // moves the ring's head
        const std::string model = "y" + std::string(source_len, 's');
        ASSERT_TRUE(source.Append(std::string(source_len, 's')).ok());
        target = std::move(source);
        ExpectChainIs(target, model);
        EXPECT_TRUE(source.empty());
        EXPECT_EQ(source.slice_count(), 0u);
        EXPECT_EQ(source.pool(), pool.get());
        ASSERT_TRUE(source.Append(std::string(64 * 9, 'a')).ok());
        ExpectChainIs(source, std::string(64 * 9, 'a'));
        source = std::move(target);
        ExpectChainIs(source, model);
        EXPECT_TRUE(target.empty());
      }
    }
  }
  EXPECT_EQ(InUse(*pool), 0u);
}

// The sources above all start their ring at entry 0. A chain that has
// consumed slices starts mid-ring, inline (and wrapped) or grown: move
// assignment must keep its slices in order whatever the target holds.
TEST(BufferChainTest, MoveAssignmentKeepsAMidRingSourceInOrder) {
  auto pool = MakePool(64, 128);
  // Whole-buffer slices, one letter each, so a slice out of order shows.
  auto letters = [](const std::string& order) {
    std::string s;
    for (char ch : order) s += std::string(64, ch);
    return s;
  };
  for (size_t target_len : {0, 10, 64 * 20}) {
    for (bool grown_source : {false, true}) {
      SCOPED_TRACE(testing::Message() << "target " << target_len
                                      << (grown_source ? " grown" : " inline"));
      BufferChain target(*pool);
      ASSERT_TRUE(target.Append(std::string(target_len, 't')).ok());
      BufferChain source(*pool);
      std::string model;
      if (grown_source) {  // 10 slices in a ring of 16, from entry 3
        ASSERT_TRUE(source.Append(letters("abcdefghij")).ok());
        source.Consume(64 * 3);
        model = letters("defghij");
      } else {  // 4 inline slices from entry 2: c d | e f wrapped to 0, 1
        ASSERT_TRUE(source.Append(letters("abcd")).ok());
        source.Consume(64 * 2);
        ASSERT_TRUE(source.Append(letters("ef")).ok());
        ASSERT_EQ(source.slice_count(), BufferChain::kInlineSlices);
        model = letters("cdef");
      }
      target = std::move(source);
      ExpectChainIs(target, model);
      EXPECT_TRUE(source.empty());
      // The source, holding whatever storage it was given, still works.
      ASSERT_TRUE(source.Append(letters("xyzuvw")).ok());
      ExpectChainIs(source, letters("xyzuvw"));
    }
  }
  EXPECT_EQ(InUse(*pool), 0u);
}

TEST(BufferChainTest, CloneSharesEveryBuffer) {
  auto pool = MakePool(64, 16);
  BufferChain a(*pool);
  ASSERT_TRUE(a.Append(std::string(150, 'c')).ok());
  BufferChain b = a.Clone();
  EXPECT_EQ(InUse(*pool), 3u);
  ExpectChainIs(b, std::string(150, 'c'));
  a.Clear();
  EXPECT_EQ(InUse(*pool), 3u);
  b.Consume(64);
  EXPECT_EQ(InUse(*pool), 2u);
  b.Clear();
  EXPECT_EQ(InUse(*pool), 0u);
}

// Random sequences of every operation on several chains, each against a
// std::string model. Small buffers and a small pool, so appends cross many
// buffers and sometimes find the pool dry.
TEST(BufferChainTest, RandomOperationsMatchAStringModel) {
  for (uint64_t seed : {1, 2, 3, 4, 5, 6, 7, 8}) {
    SCOPED_TRACE(seed);
    auto pool = MakePool(64, 48, seed % 2 ? 4 : 0);
    std::mt19937_64 rng(seed);
    constexpr int kChains = 4;
    std::vector<BufferChain> chains;
    std::vector<std::string> models(kChains);
    for (int i = 0; i < kChains; ++i) chains.emplace_back(*pool);
    int exhausted = 0;
    for (int step = 0; step < 3000; ++step) {
      const int i = static_cast<int>(rng() % kChains);
      const int j = static_cast<int>(rng() % kChains);
      BufferChain& c = chains[i];
      std::string& m = models[i];
      switch (rng() % 8) {
        case 0:
        case 1: {  // append bytes
          const std::string bytes = RandomBytes(rng() % 300, rng);
          absl::Status s = c.Append(bytes);
          if (s.ok()) {
            m += bytes;
          } else {
            ASSERT_EQ(s.code(), absl::StatusCode::kResourceExhausted) << s;
            ++exhausted;
          }
          break;
        }
        case 2: {  // link a slice of another chain's slice
          const BufferChain& o = chains[j];
          if (o.slice_count() == 0) break;
          size_t at = rng() % o.slice_count();
          size_t before = 0;
          for (size_t k = 0; k < at; ++k) before += o.slice(k).size();
          const SharedBuffer& seg = o.slice(at);
          const size_t off = rng() % (seg.size() + 1);
          const size_t len = rng() % (seg.size() - off + 1);
          c.Append(seg.Slice(off, len));
          m += models[j].substr(before + off, len);
          break;
        }
        case 3: {  // move another chain onto this one
          if (i == j) break;
          c.Append(std::move(chains[j]));
          m += models[j];
          models[j].clear();
          break;
        }
        case 4: {  // split and keep both halves somewhere
          const size_t n = rng() % (m.size() + 2);
          BufferChain first = c.Split(n);
          const size_t k = std::min(n, m.size());
          ExpectChainIs(first, m.substr(0, k));
          const std::string split_off = m.substr(0, k);
          m.erase(0, k);
          if (i != j) {  // the split-off part goes to the end of chain j
            chains[j].Append(std::move(first));
            models[j] += split_off;
          }
          break;
        }
        case 5: {  // consume
          const size_t n = rng() % (m.size() / 2 + 2);
          c.Consume(n);
          m.erase(0, std::min(n, m.size()));
          break;
        }
        case 6: {  // copy out a prefix
          std::string out(rng() % (m.size() + 2), '\0');
          const size_t got = c.CopyTo(absl::MakeSpan(
              reinterpret_cast<std::byte*>(out.data()), out.size()));
          ASSERT_EQ(got, std::min(out.size(), m.size()));
          ASSERT_EQ(out.substr(0, got), m.substr(0, got));
          break;
        }
        case 7: {  // clone over another chain
          if (i == j) break;
          chains[j] = c.Clone();
          models[j] = m;
          break;
        }
      }
      ASSERT_NO_FATAL_FAILURE(ExpectChainIs(chains[i], models[i]));
      ASSERT_NO_FATAL_FAILURE(ExpectChainIs(chains[j], models[j]));
    }
    EXPECT_GT(exhausted, 0) << "the pool never ran dry; raise the load";
    chains.clear();
    EXPECT_EQ(InUse(*pool), 0u);
  }
}

// Slices of the same buffers dropped on 8 threads at once: every buffer goes
// back exactly once, after its last slice, and the bytes stay intact until
// then (TSan checks the counts' ordering).
TEST(SharedBufferTest, SlicesReleasedOnOtherThreads) {
  constexpr int kThreads = 8;
  constexpr int kBuffers = 64;
  constexpr int kRounds = 50;
  auto pool = MakePool(256, kBuffers * 2);
  for (int round = 0; round < kRounds; ++round) {
    std::vector<std::vector<SharedBuffer>> per_thread(kThreads);
    for (int b = 0; b < kBuffers; ++b) {
      Buffer buf = pool->TryAcquire();
      ASSERT_TRUE(buf);
      std::memset(buf.data(), b, 256);
      SharedBuffer whole(std::move(buf));
      for (int t = 0; t < kThreads; ++t) {
        per_thread[t].push_back(whole.Slice(t * 32, 32));
      }
    }
    EXPECT_EQ(InUse(*pool), static_cast<size_t>(kBuffers));
    std::atomic<int> bad{0};
    std::vector<std::thread> threads;
    for (int t = 0; t < kThreads; ++t) {
      threads.emplace_back([&, t] {
        for (int b = 0; b < kBuffers; ++b) {
          SharedBuffer mine = std::move(per_thread[t][b]);
          SharedBuffer copy = mine;  // one more count, on this thread
          for (std::byte x : copy.span()) {
            if (x != static_cast<std::byte>(b)) bad.fetch_add(1);
          }
        }
        per_thread[t].clear();
      });
    }
    for (auto& th : threads) th.join();
    EXPECT_EQ(bad.load(), 0);
    EXPECT_EQ(InUse(*pool), 0u);
  }
}

}  // namespace
}  // namespace bufpool

namespace bufpool {
namespace {

// A chain of small slices, each of its own buffer (as one linked buffer
// per tiny receive would make), Compact()s into as few buffers as its
// bytes need; a well-filled buffer between them stays linked.
TEST(ChainCompactTest, CopiesSparseSlicesIntoFewBuffersAndKeepsFullOnes) {
  auto pool = MakePool(1024, 64);
  BufferChain chain(*pool);
  std::string model;
  std::vector<BufferChain> sources;
  auto add_small = [&](int k) {
    for (int i = 0; i < k; ++i) {
      BufferChain one(*pool);
      const std::string b(100, static_cast<char>('a' + i % 26));
      ASSERT_TRUE(one.Append(b).ok());
      model += b;
      chain.Append(std::move(one));
    }
  };
  add_small(20);
  BufferChain full(*pool);
  const std::string f(900, 'F');
  ASSERT_TRUE(full.Append(f).ok());
  const SharedBuffer* kept = &full.slice(0);
  const uint32_t kept_slot = kept->slot();
  chain.Append(std::move(full));
  model += f;
  add_small(3);
  EXPECT_EQ(chain.pinned_bytes(), 24u * 1024);
  EXPECT_EQ(InUse(*pool), 24u);
  ASSERT_TRUE(chain.Compact().ok());
  ExpectChainIs(chain, model);
  // 2000 bytes in 2 buffers, the kept one, 300 bytes in 1 more.
  EXPECT_EQ(chain.pinned_bytes(), 4u * 1024);
  EXPECT_EQ(InUse(*pool), 4u);
  bool found = false;
  for (size_t i = 0; i < chain.slice_count(); ++i) {
    found |= chain.slice(i).slot() == kept_slot;
  }
  EXPECT_TRUE(found) << "the well-filled buffer was copied";
  // Nothing sparse left: a second Compact() changes nothing.
  ASSERT_TRUE(chain.Compact().ok());
  EXPECT_EQ(chain.pinned_bytes(), 4u * 1024);
  chain.Clear();
  EXPECT_EQ(InUse(*pool), 0u);
}

TEST(ChainCompactTest, ADryPoolLeavesTheChainAsItWas) {
  auto pool = MakePool(1024, 8, 0);
  BufferChain chain(*pool);
  std::string model;
  for (int i = 0; i < 8; ++i) {
    BufferChain one(*pool);
    ASSERT_TRUE(one.Append("xy").ok());
    model += "xy";
    chain.Append(std::move(one));
  }
  EXPECT_EQ(InUse(*pool), 8u);
  absl::Status s = chain.Compact();
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted) << s;
  ExpectChainIs(chain, model);
  EXPECT_EQ(chain.slice_count(), 8u);
  // One buffer back: enough for the 16 bytes.
  BufferChain first = chain.Split(2);
  first.Clear();
  model.erase(0, 2);
  ASSERT_TRUE(chain.Compact().ok());
  ExpectChainIs(chain, model);
  EXPECT_EQ(chain.slice_count(), 1u);
  EXPECT_EQ(InUse(*pool), 1u);
  BufferChain no_pool;
  no_pool.Append(chain.slice(0));
  EXPECT_EQ(no_pool.Compact().code(), absl::StatusCode::kFailedPrecondition);
  no_pool.Clear();
  chain.Clear();
}

TEST(ChainCompactTest, PinnedBytesCountsEachBufferOnceAndEmptyIsZero) {
  auto pool = MakePool(1024, 8);
  BufferChain chain(*pool);
  EXPECT_EQ(chain.pinned_bytes(), 0u);
  ASSERT_TRUE(chain.Append(std::string(3000, 'z')).ok());  // 3 buffers
  EXPECT_EQ(chain.pinned_bytes(), 3u * 1024);
  BufferChain head = chain.Split(1500);  // 1500 | 1500, one buffer cut
  head.Append(std::move(chain));         // the cut buffer's two slices adjacent
  chain = std::move(head);
  EXPECT_EQ(chain.slice_count(), 4u);
  EXPECT_EQ(chain.pinned_bytes(), 3u * 1024);
  EXPECT_EQ(chain.tail_room(), 3u * 1024 - 3000);
  BufferChain clone = chain.Clone();
  EXPECT_EQ(chain.tail_room(), 0u);  // shared
  clone.Clear();
  chain.Clear();
}

}  // namespace
}  // namespace bufpool

namespace bufpool {
namespace {

std::span<const std::byte> Bytes(const std::string& s) {
  return {reinterpret_cast<const std::byte*>(s.data()), s.size()};
}

// Short receives of many chains share the pack's buffer: each chain pins
// about its bytes; a chain's next bytes join its slice; the buffer is
// filled again from its start once its slices are gone, and goes back to
// the pool with the pack and its last slice.
TEST(ReceivePackTest, ChainsShareOneBufferAndItComesBack) {
  auto pool = testing_util::MakePool(4096, 8);
  {
    ReceivePack pack(*pool);
    EXPECT_FALSE(pack.holds_buffer());
    std::vector<BufferChain> conns;
    for (int i = 0; i < 30; ++i) conns.emplace_back(*pool);
    for (int i = 0; i < 30; ++i) {
      ASSERT_TRUE(conns[i].AppendPacked(
          absl::MakeConstSpan(Bytes("conn" + std::to_string(i))), pack));
    }
    EXPECT_TRUE(pack.holds_buffer());
    EXPECT_EQ(InUse(*pool), 1u);  // thirty chains, one buffer
    // A chain's next bytes: adjacent only for the last one packed.
    ASSERT_TRUE(conns[29].AppendPacked(absl::MakeConstSpan(Bytes("+")), pack));
    EXPECT_EQ(conns[29].slice_count(), 1u);
    EXPECT_EQ(Contents(conns[29]), "conn29+");
    ASSERT_TRUE(conns[3].AppendPacked(absl::MakeConstSpan(Bytes("+")), pack));
    EXPECT_EQ(conns[3].slice_count(), 2u);
    EXPECT_EQ(Contents(conns[3]), "conn3+");
    EXPECT_EQ(conns[3].tail_room(), 0u);  // shared: never the chain's own
    // A chain whose bytes lie in a buffer of its own moves them into the
    // pack with the new ones, one slice, and its buffer goes back.
    BufferChain own(*pool);
    ASSERT_TRUE(own.Append(absl::string_view("abc")).ok());
    EXPECT_EQ(InUse(*pool), 2u);
    EXPECT_TRUE(own.AppendPacked(absl::MakeConstSpan(Bytes("x")), pack));
    EXPECT_EQ(Contents(own), "abcx");
    EXPECT_EQ(own.slice_count(), 1u);
    EXPECT_EQ(InUse(*pool), 1u);
    // One over an eighth of a buffer is refused, unchanged: a move copies
    // at most that many of a chain's bytes; at an eighth it moves.
    const std::string most(513, 'm');
    BufferChain long_one(*pool);
    ASSERT_TRUE(long_one.Append(absl::string_view(most)).ok());
    EXPECT_FALSE(
        long_one.AppendPacked(absl::MakeConstSpan(Bytes("xyz")), pack));
    EXPECT_EQ(Contents(long_one), most);
    long_one.Consume(1);
    EXPECT_TRUE(long_one.AppendPacked(absl::MakeConstSpan(Bytes("xyz")), pack));
    EXPECT_EQ(Contents(long_one), most.substr(1) + "xyz");
    long_one.Clear();
    own.Clear();
    for (auto& c : conns) c.Clear();
    EXPECT_EQ(InUse(*pool), 1u);  // the pack's own
    // More slices than one batch of spare references, each dropped at
    // once: the buffer wraps and is reused, never a second one.
    BufferChain c(*pool);
    const std::string part(100, 'q');
    for (int i = 0; i < 1000; ++i) {
      ASSERT_TRUE(c.AppendPacked(absl::MakeConstSpan(Bytes(part)), pack));
      ASSERT_EQ(Contents(c), part);
      c.Consume(c.size());
      ASSERT_EQ(InUse(*pool), 1u);
    }
    // A slice kept while the buffer fills: the next bytes go to a fresh
    // pack buffer, and the old one lives on with its slice.
    ASSERT_TRUE(c.AppendPacked(absl::MakeConstSpan(Bytes("keep")), pack));
    BufferChain d(*pool);
    for (int i = 0; i < 50; ++i) {
      ASSERT_TRUE(d.AppendPacked(absl::MakeConstSpan(Bytes(part)), pack));
      d.Consume(d.size());
    }
    EXPECT_EQ(InUse(*pool), 2u);
    EXPECT_EQ(Contents(c), "keep");
    // Bytes longer than a buffer are refused.
    const std::string big(5000, 'b');
    EXPECT_FALSE(d.AppendPacked(absl::MakeConstSpan(Bytes(big)), pack));
    EXPECT_TRUE(d.empty());
    c.Clear();
    EXPECT_EQ(InUse(*pool), 1u);
    ASSERT_TRUE(d.AppendPacked(absl::MakeConstSpan(Bytes("last")), pack));
  }  // the pack goes first; d's slice keeps the buffer
  EXPECT_EQ(InUse(*pool), 0u);
}

// Slices of one pack buffer dropped on other threads while the pack keeps
// filling it (and, their slices gone, refilling it from the start): every
// byte a slice reads is the one packed for it. Run under TSan too.
TEST(ReceivePackTest, SlicesDroppedOnOtherThreadsWhileThePackRefills) {
  auto pool = testing_util::MakePool(4096, 64);
  {
    ReceivePack pack(*pool);
    std::mutex mu;
    std::vector<std::pair<int, BufferChain>> handed;
    std::atomic<bool> done{false};
    std::atomic<int> bad{0}, checked{0};
    std::vector<std::thread> threads;
    auto message = [](int i) {
      return std::string(1 + i % 97, static_cast<char>('a' + i % 26));
    };
    for (int t = 0; t < 3; ++t) {
      threads.emplace_back([&] {
        for (;;) {
          std::vector<std::pair<int, BufferChain>> mine;
          {
            std::lock_guard<std::mutex> lock(mu);
            mine.swap(handed);
          }
          if (mine.empty()) {
            if (done.load()) return;
            std::this_thread::yield();
            continue;
          }
          for (auto& [i, c] : mine) {
            if (Contents(c) != message(i)) bad.fetch_add(1);
            checked.fetch_add(1);
          }
        }
      });
    }
    const int kMessages = 20000;
    for (int i = 0; i < kMessages; ++i) {
      // The checkers lag behind: wait for them rather than drain the pool.
      while (InUse(*pool) > 32) std::this_thread::yield();
      BufferChain c(*pool);
      const std::string msg = message(i);
      if (!c.AppendPacked(absl::MakeConstSpan(Bytes(msg)), pack)) {
        bad.fetch_add(1000000);  // the pool ran dry: a pack buffer leaked
        break;
      }
      std::lock_guard<std::mutex> lock(mu);
      handed.emplace_back(i, std::move(c));
    }
    done.store(true);
    for (auto& th : threads) th.join();
    EXPECT_EQ(bad.load(), 0);
    EXPECT_EQ(checked.load(), kMessages);
  }
  EXPECT_EQ(InUse(*pool), 0u);
}

}  // namespace
}  // namespace bufpool

namespace bufpool {
namespace {

// The receive primitive against a std::string model, under arrival
// patterns from 1 byte to a whole buffer, with copying off, on, and on
// with a pack shared by a second chain: the bytes are the model's, a
// copied buffer stays the caller's and a linked one is taken, and what the
// chain pins stays within its bytes plus two buffers (copying on).
TEST(ReceiveTest, MatchesAStringModelUnderEveryArrivalPattern) {
  constexpr size_t kBs = 4096;
  auto pool = testing_util::MakePool(kBs, 256);
  std::mt19937 rng(7);
  for (int mode = 0; mode < 3; ++mode) {
    ReceivePack pack(*pool);
    const BufferChain::ReceiveOptions opts{
        .copy_below = mode == 0 ? 0 : kBs / 8,
        .pack = mode == 2 ? &pack : nullptr};
    BufferChain chain(*pool), neighbour(*pool);
    std::string model;
    for (int step = 0; step < 3000; ++step) {
      const int pattern = static_cast<int>(rng() % 4);
      size_t n = pattern == 0   ? 1
                 : pattern == 1 ? 1 + rng() % 64
                 : pattern == 2 ? 1 + rng() % kBs
                                : kBs;
      if (rng() % 3 == 0) {  // a reader that writes into the room itself
        const absl::Span<std::byte> room = chain.Preallocate();
        n = std::min(n, room.size());
        for (size_t i = 0; i < n; ++i) {
          room[i] = static_cast<std::byte>('a' + (model.size() + i) % 26);
        }
        for (size_t i = 0; i < n; ++i) {
          model.push_back(static_cast<char>('a' + model.size() % 26));
        }
        chain.Postallocate(n);
      } else {
        Buffer b = pool->TryAcquire();
        ASSERT_TRUE(b);
        for (size_t i = 0; i < n; ++i) {
          b.data()[i] = static_cast<std::byte>('a' + (model.size() + i) % 26);
        }
        for (size_t i = 0; i < n; ++i) {
          model.push_back(static_cast<char>('a' + model.size() % 26));
        }
        const bool taken = chain.Receive(b, n, opts);
        EXPECT_EQ(taken, !b) << step;
        if (mode == 0) {
          EXPECT_TRUE(taken) << step;  // copying off: linked
        }
      }
      if (mode == 2 && rng() % 4 == 0) {  // another connection's partial
        Buffer b = pool->TryAcquire();
        ASSERT_TRUE(b);
        std::memset(b.data(), 'z', 10);
        neighbour.Receive(b, 10, opts);
        if (neighbour.size() > 200) neighbour.Clear();
      }
      if (mode != 0) {
        ASSERT_LE(chain.pinned_bytes(), chain.size() + 2 * kBs) << step;
      }
      const size_t eat = rng() % 2 == 0 ? rng() % (chain.size() + 1) : 0;
      chain.Consume(eat);
      model.erase(0, eat);
      ASSERT_EQ(Contents(chain), model) << "mode " << mode << " step " << step;
      if (model.empty()) {
        ASSERT_EQ(chain.pinned_bytes(), 0u) << step;  // nothing pinned
      }
    }
  }
  EXPECT_EQ(InUse(*pool), 0u);
}

// A short read into an empty chain with a pack pins no buffer of its own:
// ten "connections" holding a half command share one buffer.
TEST(ReceiveTest, ReadFromWithAPackPinsAboutTheBytes) {
  auto pool = testing_util::MakePool(4096, 64);
  ReceivePack pack(*pool);
  std::vector<BufferChain> conns;
  for (int i = 0; i < 10; ++i) {
    conns.emplace_back(*pool);
    UniqueFd fds[2];
    ASSERT_EQ(Pipe(fds), 0);
    ASSERT_EQ(write(fds[1].get(), "*3\r\n$3\r\nSET\r\n$1", 15), 15);
    absl::StatusOr<size_t> n = ReadFrom(fds[0].get(), conns.back(), 4096,
                                        {.copy_below = 512, .pack = &pack});
    ASSERT_TRUE(n.ok()) << n.status();
    EXPECT_EQ(*n, 15u);
  }
  EXPECT_EQ(InUse(*pool), 1u);  // the pack's buffer, shared by all ten
  for (auto& c : conns) EXPECT_EQ(Contents(c), "*3\r\n$3\r\nSET\r\n$1");
  // Without a pack each would keep the buffer it read into.
  BufferChain plain(*pool);
  UniqueFd fds[2];
  ASSERT_EQ(Pipe(fds), 0);
  ASSERT_EQ(write(fds[1].get(), "abc", 3), 3);
  ASSERT_TRUE(ReadFrom(fds[0].get(), plain, 4096).ok());
  EXPECT_EQ(plain.pinned_bytes(), 4096u);
}

// `n` connections' chains on one pool and one pack, and a short receive
// into one of them by the pack's policy (copied, never linked).
struct PackRig {
  explicit PackRig(size_t n)
      : pool(testing_util::MakePool(4096, n + 16)), pack(*pool) {
    for (size_t i = 0; i < n; ++i) conns.emplace_back(*pool);
  }
  void Receive(BufferChain& c, absl::string_view s) {
    Buffer b = pool->TryAcquire();
    ASSERT_TRUE(b);
    std::memcpy(b.data(), s.data(), s.size());
    EXPECT_FALSE(c.Receive(b, s.size(), opts));  // copied
  }
  std::unique_ptr<BufferPool> pool;
  ReceivePack pack;
  const BufferChain::ReceiveOptions opts{.copy_below = 512, .pack = &pack};
  std::vector<BufferChain> conns;
};

// Half commands that arrive in two reads, many connections interleaved, so
// that some first parts sit at a pack buffer's end when their second parts
// come: every connection still pins about its bytes (a second part that
// does not fit moves the partial whole to where the pack writes now), not
// a buffer of its own.
TEST(ReceiveTest, HalfCommandsInTwoReadsStayPacked) {
  constexpr size_t kConns = 400;
  PackRig rig(kConns);
  auto& conns = rig.conns;
  const std::string first(37, 'f'), second(63, 's');
  for (size_t i = 0; i < kConns; ++i) {
    rig.Receive(conns[i], first);
    if (i >= 3) rig.Receive(conns[i - 3], second);  // others' bytes between
  }
  for (size_t i = kConns - 3; i < kConns; ++i) rig.Receive(conns[i], second);
  for (auto& c : conns) ASSERT_EQ(Contents(c), first + second);
  // kConns * 100 bytes fill this many buffers, plus the pack's last one.
  EXPECT_LE(InUse(*rig.pool), (kConns * 100 + 4095) / 4096 + 1);
  conns.clear();
  EXPECT_EQ(InUse(*rig.pool), 1u);  // the pack's own
}

// The same half commands when every connection's first part arrives before
// any second part: the first parts fill pack buffers that the second parts
// find full, and the last chain left in an old pack buffer holds its only
// reference (room after its slice). It still moves to the pack rather than
// fill that room, which would keep a whole buffer for its 100 bytes.
TEST(ReceiveTest, AChainLeftAloneInAnOldPackBufferMovesOut) {
  constexpr size_t kConns = 400;
  PackRig rig(kConns);
  BufferPool& pool = *rig.pool;
  const std::string first(37, 'f'), second(63, 's');
  for (auto& c : rig.conns) rig.Receive(c, first);
  for (auto& c : rig.conns) rig.Receive(c, second);
  for (auto& c : rig.conns) ASSERT_EQ(Contents(c), first + second);
  EXPECT_LE(InUse(pool), (kConns * 100 + 4095) / 4096 + 1);
  // A chain whose bytes are the rest of a large read it linked: short
  // now, and its next short read moves it into the pack, its buffer back.
  BufferChain big(pool);
  Buffer b = pool.TryAcquire();
  ASSERT_TRUE(b);
  std::memset(b.data(), 'L', 3000);
  ASSERT_TRUE(big.Receive(b, 3000, rig.opts));  // linked
  big.Consume(2990);
  const size_t before = InUse(pool);
  rig.Receive(big, "tail");
  EXPECT_EQ(Contents(big), std::string(10, 'L') + "tail");
  EXPECT_LT(InUse(pool), before);
  rig.conns.clear();
  big.Clear();
  EXPECT_EQ(InUse(pool), 1u);  // the pack's own
}

// A round-robin trickle, one byte a receive for each of 200 connections:
// what they pin stays near their bytes (old pack buffers empty out as their
// chains move on), and each chain's bytes stay whole.
TEST(ReceiveTest, ARoundRobinTricklePinsAboutItsBytes) {
  constexpr size_t kConns = 200, kBytes = 100;
  PackRig rig(kConns);
  std::vector<std::string> model(kConns);
  size_t most = 0, most_slices = 0;
  for (size_t k = 0; k < kBytes; ++k) {
    for (size_t i = 0; i < kConns; ++i) {
      const char ch = static_cast<char>('a' + (i + k) % 26);
      rig.Receive(rig.conns[i], absl::string_view(&ch, 1));
      model[i].push_back(ch);
      // A slice per read would grow each chain a heap ring of 100 slices.
      most_slices = std::max(most_slices, rig.conns[i].slice_count());
    }
    most = std::max(most, InUse(*rig.pool));
  }
  for (size_t i = 0; i < kConns; ++i) {
    ASSERT_EQ(Contents(rig.conns[i]), model[i]);
  }
  EXPECT_LE(most_slices, 4u);  // what a chain keeps inline
  // 20,000 bytes fill 5 buffers; the chains still in older ones when the
  // pack moves on keep those a while.
  EXPECT_LE(most, 2 * ((kConns * kBytes + 4095) / 4096) + 2);
  rig.conns.clear();
  EXPECT_EQ(InUse(*rig.pool), 1u);
}

TEST_F(ChainDeathTest, PostallocatePastThePreallocatedRoomAborts) {
  auto pool = testing_util::MakePool(4096, 4);
  BufferChain chain(*pool);
  EXPECT_TRUE(chain.Preallocate().empty());  // no tail: no room
  EXPECT_DEATH(chain.Postallocate(1), "Postallocate\\(1\\) past the 0 bytes");
  ASSERT_TRUE(chain.Append(absl::string_view("abc")).ok());
  EXPECT_EQ(chain.Preallocate().size(), 4093u);
  EXPECT_DEATH(chain.Postallocate(4094), "Postallocate\\(4094\\)");
}

}  // namespace
}  // namespace bufpool

namespace bufpool {
namespace {

absl::Span<const std::byte> B(const std::string& s) {
  return {reinterpret_cast<const std::byte*>(s.data()), s.size()};
}

// Bytes to pack that lie in the chain's own slice are copied before the
// move lets that slice go (a scrubbing pool zeroes a buffer it gets back).
TEST(ReceivePackTest, AMoveCopiesBytesOfTheChainItselfBeforeDroppingThem) {
  auto pool = testing_util::MakePool({.buffer_size = 4096,
                                      .buffer_count = 8,
                                      .huge_pages = HugePages::kNever,
                                      .populate = false,
                                      .scrub_on_release = true});
  ReceivePack pack(*pool);
  BufferChain own(*pool);
  ASSERT_TRUE(own.Append(absl::string_view("abc")).ok());
  const SharedBuffer& s = own.slice(0);
  ASSERT_TRUE(own.AppendPacked(s.span(), pack));
  EXPECT_EQ(Contents(own), "abcabc");
  own.Clear();
}

// A move of a bound chain is one change for its budget: no watermark
// crossed down and up again, and a callback (which may pack another
// connection's bytes, budget.h) never runs while the pack's used bytes
// lag the moved slice. A packed slice is charged its bytes rounded up to
// 64, a buffer of the chain's own a whole buffer.
TEST(ReceivePackTest, AMoveOfABoundChainIsOneBudgetChange) {
  auto pool = testing_util::MakePool(4096, 16);
  ReceivePack pack(*pool);
  BufferChain other(*pool);
  int lows = 0, highs = 0;
  auto budget = pool->CreateBudget({.name = "b",
                                    .max_bytes = 8 * 4096,
                                    .high_watermark = 2 * 4096,
                                    .low_watermark = 1 * 4096,
                                    .on_high = [&] { ++highs; },
                                    .on_low =
                                        [&] {
                                          ++lows;
                                          other.AppendPacked(B("OTHER"), pack);
                                        }});
  ASSERT_TRUE(budget.ok());
  BufferChain keep(**budget), a(**budget);
  ASSERT_TRUE(keep.Append(absl::string_view("k")).ok());
  ASSERT_TRUE(a.Append(absl::string_view("0123456789")).ok());  // own buffer
  EXPECT_EQ(highs, 1);
  ASSERT_TRUE(a.AppendPacked(B("+"), pack));  // moves
  EXPECT_EQ(Contents(a), "0123456789+");
  EXPECT_TRUE(Contents(other).empty() || Contents(other) == "OTHER");
  EXPECT_EQ((*budget)->pinned_bytes(), 4096u + 64);
  // A short chain of two runs (two buffers) moves: one buffer less pinned.
  BufferChain two(**budget);
  ASSERT_TRUE(two.Append(absl::string_view("xy")).ok());
  {
    BufferChain y(*pool);
    ASSERT_TRUE(y.Append(absl::string_view("zw")).ok());
    two.Append(y.slice(0));
  }
  EXPECT_EQ(two.pinned_bytes(), 2u * 4096);
  ASSERT_TRUE(two.AppendPacked(B("!"), pack));
  EXPECT_EQ(Contents(two), "xyzw!");
  EXPECT_EQ(two.pinned_bytes(), 4096u);
  EXPECT_EQ((*budget)->pinned_bytes(), 4096u + 64 + 64);
  two.Clear();
  EXPECT_EQ(lows, 0) << "on_low ran inside a move that pins no less";
  EXPECT_EQ(highs, 1);
  a.Clear();
  keep.Clear();
  other.Clear();
}

}  // namespace
}  // namespace bufpool

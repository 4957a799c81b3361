// ChainCursor, the frame splitters and the integer writers
// (bufpool/cursor.h), checked against std::string models on chains cut at
// every slice boundary: 1-byte slices, slices of 4 KiB buffers, and slices
// of three pools. Every test ends with each pool's in_use back at 0.
#include "bufpool/cursor.h"

#include <malloc.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "test_util.h"

namespace bufpool {
namespace {

using testing_util::Contents;
using testing_util::MakePool;
using testing_util::RandomBytes;

class CursorTest : public ::testing::Test {
 protected:
  void TearDown() override {
    for (auto* p : {small_.get(), mid_.get(), page_.get()})
      EXPECT_EQ(p->Stats().in_use, 0u);
  }

  // `piece` appended as a buffer of its own from `pool` (or several, when
  // longer than a buffer).
  void AppendPiece(BufferChain& chain, BufferPool& pool,
                   const std::string& piece) {
    BufferChain part(pool);
    ASSERT_TRUE(part.Append(piece).ok());
    chain.Append(std::move(part));
  }

  // Every byte a slice of its own (all of them slices of one or two
  // buffers).
  BufferChain OneByteSlices(const std::string& s) {
    BufferChain whole(*page_);
    EXPECT_TRUE(whole.Append(s).ok());
    BufferChain chain(*page_);
    for (size_t k = 0; k < whole.slice_count(); ++k) {
      const SharedBuffer& seg = whole.slice(k);
      for (size_t i = 0; i < seg.size(); ++i) chain.Append(seg.Slice(i, 1));
    }
    return chain;
  }
  // The bytes in 4 KiB buffers, after a first slice of `lead` bytes, so
  // the 4 KiB boundaries fall at every offset as `lead` varies.
  BufferChain PageSlices(const std::string& s, size_t lead) {
    BufferChain chain(*page_);
    lead = std::min(lead, s.size());
    if (lead != 0) AppendPiece(chain, *page_, s.substr(0, lead));
    if (lead != s.size()) AppendPiece(chain, *page_, s.substr(lead));
    return chain;
  }
  // Pieces of 1 to 9 bytes, taken in turn from three pools.
  BufferChain ThreePools(const std::string& s, uint32_t seed) {
    std::mt19937 rng(seed);
    BufferChain chain(*mid_);
    BufferPool* pools[3] = {small_.get(), mid_.get(), page_.get()};
    for (size_t at = 0, i = 0; at < s.size(); ++i) {
      const size_t n = std::min<size_t>(1 + rng() % 9, s.size() - at);
      AppendPiece(chain, *pools[i % 3], s.substr(at, n));
      at += n;
    }
    return chain;
  }
  // Two slices, cut at `cut`.
  BufferChain CutAt(const std::string& s, size_t cut) {
    BufferChain chain(*small_);
    if (cut != 0) AppendPiece(chain, *mid_, s.substr(0, cut));
    if (cut != s.size()) AppendPiece(chain, *small_, s.substr(cut));
    return chain;
  }

  // Calls f on the model cut every way the tests use.
  void ForEachShape(const std::string& s,
                    const std::function<void(const BufferChain&)>& f) {
    {
      SCOPED_TRACE("1-byte slices");
      f(OneByteSlices(s));
    }
    for (size_t lead : {size_t{0}, size_t{1}, size_t{3}, size_t{4095}}) {
      SCOPED_TRACE("4 KiB buffers, lead " + std::to_string(lead));
      f(PageSlices(s, lead));
    }
    for (uint32_t seed = 0; seed < 4; ++seed) {
      SCOPED_TRACE("three pools, seed " + std::to_string(seed));
      f(ThreePools(s, seed));
    }
    for (size_t cut = 0; cut <= s.size(); ++cut) {
      SCOPED_TRACE("cut at " + std::to_string(cut));
      f(CutAt(s, cut));
    }
  }

  std::unique_ptr<BufferPool> small_ = MakePool(64, 4096);
  std::unique_ptr<BufferPool> mid_ = MakePool(256, 4096);
  std::unique_ptr<BufferPool> page_ = MakePool(4096, 512);
};

uint64_t ModelInt(const std::string& s, size_t at, size_t width, bool big) {
  uint64_t v = 0;
  for (size_t i = 0; i < width; ++i) {
    const uint64_t b = static_cast<uint8_t>(s[at + (big ? i : width - 1 - i)]);
    v = (v << 8) | b;
  }
  return v;
}

// Reads a T at every offset of `chain` (a copy of `s`), little- and
// big-endian, peeking and reading, and checks the model's value, the moves
// and the nullopt past the end.
template <class T>
void CheckIntegers(const BufferChain& chain, const std::string& s) {
  using U = std::make_unsigned_t<T>;
  for (size_t at = 0; at <= s.size(); ++at) {
    ChainCursor c(chain);
    ASSERT_TRUE(c.Skip(at));
    ASSERT_EQ(c.position(), at);
    ASSERT_EQ(c.remaining(), s.size() - at);
    if (s.size() - at < sizeof(T)) {
      EXPECT_FALSE(c.PeekLE<T>());
      EXPECT_FALSE(c.PeekBE<T>());
      EXPECT_FALSE(c.ReadLE<T>());
      EXPECT_FALSE(c.ReadBE<T>());
      EXPECT_EQ(c.position(), at) << "a failed read moved the cursor";
      continue;
    }
    const T le =
        static_cast<T>(static_cast<U>(ModelInt(s, at, sizeof(T), false)));
    const T be =
        static_cast<T>(static_cast<U>(ModelInt(s, at, sizeof(T), true)));
    ASSERT_EQ(c.PeekLE<T>(), le) << "at " << at << " width " << sizeof(T);
    ASSERT_EQ(c.PeekBE<T>(), be) << "at " << at << " width " << sizeof(T);
    ASSERT_EQ(c.position(), at);
    ChainCursor d = c;
    ASSERT_EQ(c.ReadLE<T>(), le);
    ASSERT_EQ(d.ReadBE<T>(), be);
    ASSERT_EQ(c.position(), at + sizeof(T));
    ASSERT_EQ(d.position(), at + sizeof(T));
  }
}

TEST_F(CursorTest, ReadsIntegersAtEveryOffsetAndWidth) {
  const std::string s = RandomBytes(37, 1);
  ForEachShape(s, [&](const BufferChain& chain) {
    ASSERT_EQ(Contents(chain), s);
    CheckIntegers<uint8_t>(chain, s);
    CheckIntegers<int8_t>(chain, s);
    CheckIntegers<uint16_t>(chain, s);
    CheckIntegers<int16_t>(chain, s);
    CheckIntegers<uint32_t>(chain, s);
    CheckIntegers<int32_t>(chain, s);
    CheckIntegers<uint64_t>(chain, s);
    CheckIntegers<int64_t>(chain, s);
  });
}

TEST_F(CursorTest, ReadsIntegersAcrossPageBoundaries) {
  const std::string s = RandomBytes(3 * 4096 + 100, 2);
  for (size_t lead : {size_t{0}, size_t{5}}) {
    const BufferChain chain = PageSlices(s, lead);
    ASSERT_GE(chain.slice_count(), 3u);
    CheckIntegers<uint32_t>(chain, s);
    CheckIntegers<int64_t>(chain, s);
  }
}

TEST_F(CursorTest, SkipReadAndContiguousFollowTheModel) {
  const std::string s = RandomBytes(29, 3);
  ForEachShape(s, [&](const BufferChain& chain) {
    for (size_t at = 0; at <= s.size(); ++at) {
      for (size_t n = 0; n <= s.size() - at + 2; ++n) {
        ChainCursor c(chain);
        ASSERT_TRUE(c.Skip(at));
        absl::Span<const std::byte> here = c.Contiguous();
        ASSERT_EQ(here.empty(), at == s.size());
        ASSERT_EQ(absl::string_view(reinterpret_cast<const char*>(here.data()),
                                    here.size()),
                  absl::string_view(s).substr(at, here.size()));
        ChainCursor skip = c;
        ASSERT_EQ(skip.Skip(n), n <= s.size() - at);
        ASSERT_EQ(skip.position(), n <= s.size() - at ? at + n : at);
        std::string out(n, '\0');
        const size_t got =
            c.Read(absl::MakeSpan(reinterpret_cast<std::byte*>(out.data()), n));
        ASSERT_EQ(got, std::min(n, s.size() - at));
        ASSERT_EQ(out.substr(0, got), s.substr(at, got));
        ASSERT_EQ(c.position(), at + got);
      }
    }
    ChainCursor c(chain);
    ASSERT_TRUE(c.Skip(c.Contiguous().size()));
    ASSERT_EQ(c.position(), chain.slice(0).size());
  });
}

TEST_F(CursorTest, EmptyChain) {
  BufferChain empty(*small_);
  ChainCursor c(empty);
  EXPECT_EQ(c.position(), 0u);
  EXPECT_EQ(c.remaining(), 0u);
  EXPECT_TRUE(c.Skip(0));
  EXPECT_FALSE(c.Skip(1));
  EXPECT_FALSE(c.ReadLE<uint8_t>());
  EXPECT_TRUE(c.Contiguous().empty());
  EXPECT_FALSE(c.Find(std::byte{'a'}));
  EXPECT_EQ(c.Find(""), 0u);
  EXPECT_FALSE(c.Find("a"));
}

// std::string's answer for a search of the `limit` bytes after `at`.
std::optional<size_t> ModelFind(const std::string& s, size_t at,
                                absl::string_view needle, size_t limit) {
  const std::string window = s.substr(at, limit);
  const size_t hit = window.find(std::string(needle));
  if (hit == std::string::npos) return std::nullopt;
  return hit;
}

TEST_F(CursorTest, FindsBytesAndNeedlesWithinTheLimit) {
  const std::string s = RandomBytes(31, 4, "ab\r\n");
  ForEachShape(s, [&](const BufferChain& chain) {
    for (size_t at = 0; at <= s.size(); ++at) {
      ChainCursor c(chain);
      ASSERT_TRUE(c.Skip(at));
      for (size_t limit :
           {size_t{0}, size_t{1}, size_t{2}, size_t{5}, size_t{17}, SIZE_MAX}) {
        for (char b : {'a', '\n', '\r', 'z'}) {
          ASSERT_EQ(c.Find(static_cast<std::byte>(b), limit),
                    ModelFind(s, at, std::string(1, b), limit))
              << "at " << at << " limit " << limit << " byte " << int{b};
        }
        for (absl::string_view needle :
             {"", "\r\n", "ab", "abab", "\n\n", "b\r\na", "zz"}) {
          ASSERT_EQ(c.Find(needle, limit), ModelFind(s, at, needle, limit))
              << "at " << at << " limit " << limit << " needle '" << needle
              << "'";
        }
      }
      ASSERT_EQ(c.position(), at) << "Find moved the cursor";
    }
  });
}

// ---- LineSplitter -----------------------------------------------------------

struct Lines {
  std::vector<std::string> lines;
  std::optional<std::string> error;
};

// The model: the lines of `s` (delimiter stripped or kept), and the error
// the splitter must report once it has seen everything before it.
Lines ModelLines(const std::string& s, size_t max_line, bool strip) {
  Lines out;
  size_t at = 0;
  for (;;) {
    const size_t nl = s.find('\n', at);
    if (nl == std::string::npos) {
      if (s.size() - at >= max_line + 2) out.error = "no";
      return out;
    }
    size_t len = nl - at;
    if (len > 0 && s[nl - 1] == '\r') --len;
    if (len > max_line) {
      out.error = nl - at >= max_line + 2 ? "no" : "line";
      return out;
    }
    out.lines.push_back(s.substr(at, strip ? len : nl + 1 - at));
    at = nl + 1;
  }
}

// Feeds `s` to a LineSplitter in the pieces `cuts` says (piece ends), a
// buffer of its own each, calling Next() until nullopt after each piece.
// mode 0: Next(); 1: NextView(); 2: ForEachLine().
Lines SplitOnce(BufferPool& pool, const std::string& s,
                const std::vector<size_t>& cuts, size_t max_line, bool strip,
                int mode) {
  Lines got;
  LineSplitter lines({.max_line = max_line, .strip_delimiter = strip});
  BufferChain in(pool);
  size_t from = 0;
  for (size_t cut : cuts) {
    BufferChain piece(pool);
    EXPECT_TRUE(
        piece.Append(absl::string_view(s).substr(from, cut - from)).ok());
    in.Append(std::move(piece));
    from = cut;
    for (;;) {
      const std::string before = Contents(in);
      absl::StatusOr<std::optional<std::string>> line;
      if (mode == 2) {
        absl::Status st = lines.ForEachLine(
            in, [&](absl::string_view l) { got.lines.emplace_back(l); });
        if (st.ok()) break;  // every complete line handed out
        line = st;
      } else if (mode == 1) {
        auto v = lines.NextView(in);
        if (!v.ok()) {
          line = v.status();
        } else if (v->has_value()) {
          line = std::string(**v);
        } else {
          line = std::nullopt;
        }
      } else {
        auto c = lines.Next(in);
        if (!c.ok()) {
          line = c.status();
        } else if (c->has_value()) {
          line = Contents(**c);
        } else {
          line = std::nullopt;
        }
      }
      if (!line.ok()) {
        EXPECT_TRUE(absl::IsOutOfRange(line.status())) << line.status();
        // ForEachLine() removed the lines it handed out; nothing else.
        const std::string after = Contents(in);
        EXPECT_TRUE(mode == 2 ? before.ends_with(after) : after == before)
            << "an error changed the input";
        const std::string msg(line.status().message());
        got.error =
            msg.find("no \"\\n\" within") != std::string::npos ? "no" : "line";
        EXPECT_NE(msg.find(std::to_string(max_line)), std::string::npos) << msg;
        return got;
      }
      if (!line->has_value()) break;
      got.lines.push_back(**line);
    }
  }
  return got;
}

// Next(), NextView() and ForEachLine() must all give the model's lines.
Lines Split(BufferPool& pool, const std::string& s,
            const std::vector<size_t>& cuts, size_t max_line, bool strip) {
  Lines chains = SplitOnce(pool, s, cuts, max_line, strip, 0);
  for (int mode : {1, 2}) {
    Lines other = SplitOnce(pool, s, cuts, max_line, strip, mode);
    EXPECT_EQ(chains.lines, other.lines) << "mode " << mode;
    EXPECT_EQ(chains.error, other.error) << "mode " << mode;
  }
  return chains;
}

void ExpectSameLines(const Lines& got, const Lines& want) {
  EXPECT_EQ(got.lines, want.lines);
  EXPECT_EQ(got.error, want.error);
}

TEST_F(CursorTest, LineSplitterWithEveryCut) {
  const std::string s =
      "GET a\r\n\nxy\r\r\nlong line here\n\r\n\rz\n"
      "tail";
  for (bool strip : {true, false}) {
    const Lines want = ModelLines(s, 100, strip);
    ASSERT_EQ(want.lines.size(), 6u);
    ASSERT_FALSE(want.error);
    // Two pieces, cut everywhere (so "\r" | "\n" is split too).
    for (size_t cut = 0; cut <= s.size(); ++cut) {
      SCOPED_TRACE("cut at " + std::to_string(cut));
      ExpectSameLines(Split(*small_, s, {cut, s.size()}, 100, strip), want);
    }
    // One byte at a time.
    std::vector<size_t> each;
    for (size_t i = 1; i <= s.size(); ++i) each.push_back(i);
    ExpectSameLines(Split(*small_, s, each, 100, strip), want);
  }
}

// A handler that returns false stops ForEachLine() after that line: the
// line is removed, the lines after it stay, and the next call goes on from
// there. Every way a line is found (inside one slice, ending in the next,
// across many) is cut at every line.
TEST_F(CursorTest, ForEachLineStopsWhenTheHandlerSaysSo) {
  const std::string s = "GET a\r\n\nxy\r\r\nlong line here\n\r\n\rz\n";
  const Lines want = ModelLines(s, 100, true);
  ASSERT_EQ(want.lines.size(), 6u);
  for (size_t piece : {s.size(), size_t{7}, size_t{3}, size_t{1}}) {
    for (size_t stop = 1; stop <= want.lines.size(); ++stop) {
      SCOPED_TRACE("pieces of " + std::to_string(piece) + ", stop after " +
                   std::to_string(stop));
      BufferChain in(*small_);
      for (size_t at = 0; at < s.size(); at += piece) {
        AppendPiece(in, *small_, s.substr(at, piece));
      }
      LineSplitter lines({.max_line = 100, .strip_delimiter = true});
      std::vector<std::string> got;
      ASSERT_TRUE(lines
                      .ForEachLine(in,
                                   [&](absl::string_view l) {
                                     got.emplace_back(l);
                                     return got.size() < stop;
                                   })
                      .ok());
      ASSERT_EQ(got.size(), stop);
      // What is left is the input after the stopping line's "\n".
      size_t end = 0;
      for (size_t i = 0; i < stop; ++i) end = s.find('\n', end) + 1;
      EXPECT_EQ(Contents(in), s.substr(end));
      // A handler returning void, or one that never stops, takes the rest.
      ASSERT_TRUE(lines
                      .ForEachLine(
                          in, [&](absl::string_view l) { got.emplace_back(l); })
                      .ok());
      EXPECT_EQ(got, want.lines);
      EXPECT_TRUE(in.empty());
    }
  }
}

TEST_F(CursorTest, LineSplitterRandomAgainstTheModel) {
  std::mt19937 rng(5);
  for (int round = 0; round < 300; ++round) {
    const std::string s = RandomBytes(rng() % 200, rng(), "ab\r\n\n");
    const size_t max_line = rng() % 12;
    std::vector<size_t> cuts;
    for (size_t at = 0; at < s.size();) {
      at = std::min(s.size(), at + 1 + rng() % 9);
      cuts.push_back(at);
    }
    for (bool strip : {true, false}) {
      ExpectSameLines(Split(*small_, s, cuts, max_line, strip),
                      ModelLines(s, max_line, strip));
    }
  }
}

TEST_F(CursorTest, LineSplitterTooLongLeavesTheInputAndNamesTheLimit) {
  LineSplitter lines({.max_line = 8});
  BufferChain in(*small_);
  ASSERT_TRUE(in.Append("123456789\n").ok());  // 9 bytes: one too many
  auto got = lines.Next(in);
  ASSERT_FALSE(got.ok());
  EXPECT_TRUE(absl::IsOutOfRange(got.status()));
  EXPECT_EQ(got.status().message(),
            "LineSplitter: a line of 9 bytes exceeds max_line 8");
  EXPECT_EQ(Contents(in), "123456789\n");

  // Exactly max_line, with "\r\n": fine.
  in.Clear();
  lines.Reset();
  ASSERT_TRUE(in.Append("12345678\r\n").ok());
  got = lines.Next(in);
  ASSERT_TRUE(got.ok() && got->has_value());
  EXPECT_EQ(Contents(**got), "12345678");
  EXPECT_TRUE(in.empty());

  // No newline within max_line + 2 bytes.
  ASSERT_TRUE(in.Append("1234567890").ok());
  got = lines.Next(in);
  ASSERT_FALSE(got.ok());
  EXPECT_EQ(got.status().message(),
            "LineSplitter: no \"\\n\" within 10 bytes (max_line 8); 10 bytes "
            "waiting");
  EXPECT_EQ(Contents(in), "1234567890");
}

TEST_F(CursorTest, LineSplitterSearchesAPartialLineOnce) {
  LineSplitter lines;
  BufferChain in(*small_);
  for (int i = 0; i < 1000; ++i) {
    ASSERT_TRUE(in.Append("x").ok());
    auto got = lines.Next(in);
    ASSERT_TRUE(got.ok() && !got->has_value());
    ASSERT_EQ(lines.searched(), in.size());
  }
  ASSERT_TRUE(in.Append("\n").ok());
  auto got = lines.Next(in);
  ASSERT_TRUE(got.ok() && got->has_value());
  EXPECT_EQ(Contents(**got), std::string(1000, 'x'));
  EXPECT_EQ(lines.searched(), 0u);
  EXPECT_TRUE(in.empty());
}

TEST_F(CursorTest, LineFramesShareTheInputsBuffers) {
  BufferChain in(*page_);
  ASSERT_TRUE(in.Append("one\ntwo\n").ok());
  const std::byte* data = in.slice(0).data();
  LineSplitter lines;
  auto one = lines.Next(in);
  ASSERT_TRUE(one.ok() && one->has_value());
  EXPECT_EQ((*one)->slice(0).data(), data);  // a slice, not a copy
  EXPECT_EQ(page_->Stats().in_use, 1u);
}

TEST_F(CursorTest, LineViewsOutliveTheirSliceUntilTheNextCall) {
  BufferChain in(*small_);
  BufferChain piece(*mid_);
  ASSERT_TRUE(piece.Append("ab\ncd").ok());
  in.Append(std::move(piece));
  ASSERT_TRUE(in.Append("e\n").ok());  // into the same buffer's room
  in.Append(in.Split(in.size()));      // (a no-op move, for a fresh tail)
  LineSplitter lines;
  auto a = lines.NextView(in);
  ASSERT_TRUE(a.ok() && a->has_value());
  EXPECT_EQ(**a, "ab");
  auto b = lines.NextView(in);  // "cde": one slice, consumed with it
  ASSERT_TRUE(b.ok() && b->has_value());
  EXPECT_EQ(**b, "cde");
  EXPECT_TRUE(in.empty());
  EXPECT_EQ(mid_->Stats().in_use, 1u);  // held for the view
  // A call that finds no line ends the last view: the splitter of an idle
  // connection pins no buffer.
  auto none = lines.NextView(in);
  ASSERT_TRUE(none.ok() && !none->has_value());
  EXPECT_EQ(mid_->Stats().in_use, 0u);

  // A line across two buffers is copied.
  in.Append(CutAt("xyz\n", 2));
  auto c = lines.NextView(in);
  ASSERT_TRUE(c.ok() && c->has_value());
  EXPECT_EQ(**c, "xyz");
  // Consumed: `in` pins nothing; the line's copy is the splitter's.
  EXPECT_EQ(in.pinned_bytes(), 0u);
  EXPECT_EQ(small_->Stats().in_use, 0u);
  EXPECT_EQ(mid_->Stats().in_use, 0u);
  in.Clear();
  EXPECT_EQ(small_->Stats().in_use + mid_->Stats().in_use, 0u);
}

// Bytes the heap has handed out and not had back (glibc); 0 where a
// sanitizer's allocator answers instead.
size_t HeapInUse() { return mallinfo2().uordblks; }

// After a line of 100,000 bytes that crossed slices (copied into the
// splitter), an idle splitter keeps neither the copy nor a buffer: through
// ForEachLine, and through NextView once a call finds no line.
TEST_F(CursorTest, AnIdleSplitterKeepsNoLongLineNorBuffer) {
  const std::string big(100'000, 'x');
  for (const bool each : {true, false}) {
    SCOPED_TRACE(each ? "ForEachLine" : "NextView");
    LineSplitter lines({.max_line = 1 << 20});
    BufferChain in(*small_);
    ASSERT_TRUE(in.Append(big + "\nPING\n").ok());
    const size_t before = HeapInUse();
    size_t max_heap = 0;
    std::vector<size_t> got;
    const auto on_line = [&](absl::string_view l) {
      got.push_back(l.size());
      max_heap = std::max(max_heap, HeapInUse());
      if (l.size() == big.size()) {
        EXPECT_EQ(l, big);
      }
    };
    if (each) {
      ASSERT_TRUE(lines.ForEachLine(in, on_line).ok());
    } else {
      for (;;) {
        auto line = lines.NextView(in);
        ASSERT_TRUE(line.ok()) << line.status();
        if (!line->has_value()) break;
        on_line(**line);
      }
    }
    EXPECT_EQ(got, (std::vector<size_t>{big.size(), 4}));
    EXPECT_TRUE(in.empty());
    EXPECT_EQ(small_->Stats().in_use, 0u);
    if (before == 0) continue;  // no glibc heap counts (sanitizers)
    EXPECT_GE(max_heap, before + big.size());  // the copy was made...
    EXPECT_LT(HeapInUse(),
              before + LineSplitter::kKeptCopy + 1024);  // ...and freed
  }
}

// ---- LengthPrefixSplitter ---------------------------------------------------

// Encodes frames of `bodies` as `opt` describes (the field holds
// body.size() - adjustment, after `length_offset` bytes of 'h').
std::string EncodeFrames(const LengthPrefixSplitter& opt,
                         const std::vector<std::string>& bodies) {
  std::string s;
  for (const std::string& body : bodies) {
    const uint64_t field = body.size() - opt.length_adjustment;
    s.append(opt.length_offset, 'h');
    for (size_t i = 0; i < opt.length_bytes; ++i) {
      const size_t shift = 8 * (opt.big_endian ? opt.length_bytes - 1 - i : i);
      s.push_back(static_cast<char>(field >> shift));
    }
    s += body;
  }
  return s;
}

TEST_F(CursorTest, LengthPrefixSplitterWithEveryCutAndOption) {
  std::mt19937 rng(6);
  std::vector<std::string> bodies;
  for (int i = 0; i < 5; ++i) bodies.push_back(RandomBytes(rng() % 20, rng()));
  bodies.push_back("");
  for (size_t width : {1, 2, 3, 4, 8}) {
    for (bool big : {true, false}) {
      for (size_t offset : {0, 3}) {
        for (int64_t adjust : {0, -2, 5}) {
          for (size_t strip : {size_t{0}, offset + width}) {
            LengthPrefixSplitter opt{.length_offset = offset,
                                     .length_bytes = width,
                                     .big_endian = big,
                                     .length_adjustment = adjust,
                                     .strip_bytes = strip};
            // A body shorter than a positive adjustment has no field.
            std::vector<std::string> bs;
            for (const std::string& b : bodies) {
              if (static_cast<int64_t>(b.size()) >= adjust) bs.push_back(b);
            }
            const std::string s = EncodeFrames(opt, bs);
            std::vector<std::string> want;
            for (const std::string& b : bs) {
              want.push_back((std::string(offset, 'h') +
                              EncodeFrames({.length_bytes = width,
                                            .big_endian = big,
                                            .length_adjustment = adjust},
                                           {b}))
                                 .substr(strip));
            }
            SCOPED_TRACE(testing::Message()
                         << "width " << width << " big " << big << " offset "
                         << offset << " adjust " << adjust << " strip "
                         << strip);
            ForEachShape(s, [&](const BufferChain& whole) {
              // Feed the shape's slices one at a time.
              BufferChain in(*small_);
              std::vector<std::string> got;
              for (size_t k = 0; k < whole.slice_count(); ++k) {
                in.Append(whole.slice(k));
                for (;;) {
                  auto f = opt.Next(in);
                  ASSERT_TRUE(f.ok()) << f.status();
                  if (!f->has_value()) break;
                  got.push_back(Contents(**f));
                }
              }
              ASSERT_EQ(got, want);
              ASSERT_TRUE(in.empty());
              // The same through ForEachFrame(): views, crossing frames
              // copied into the scratch string.
              BufferChain in2(*small_);
              std::vector<std::string> got2;
              std::string scratch;
              for (size_t k = 0; k < whole.slice_count(); ++k) {
                in2.Append(whole.slice(k));
                auto n = opt.ForEachFrame(
                    in2, scratch,
                    [&](absl::string_view f) { got2.emplace_back(f); });
                ASSERT_TRUE(n.ok()) << n.status();
              }
              ASSERT_EQ(got2, want);
              ASSERT_TRUE(in2.empty());
            });
          }
        }
      }
    }
  }
}

// ForEachFrame() hands out the frames before a bad one, then reports it
// with the bad frame and the rest left in the input.
TEST_F(CursorTest, ForEachFrameStopsAtATooLongFrame) {
  LengthPrefixSplitter opt{.strip_bytes = 4, .max_frame = 100};
  BufferChain in(*page_);
  ASSERT_TRUE(AppendBE(in, 2, 4).ok());
  ASSERT_TRUE(in.Append("ok").ok());
  ASSERT_TRUE(AppendBE(in, 97, 4).ok());  // 101 bytes in all
  ASSERT_TRUE(in.Append("abc").ok());
  std::vector<std::string> got;
  std::string scratch;
  auto n = opt.ForEachFrame(in, scratch,
                            [&](absl::string_view f) { got.emplace_back(f); });
  ASSERT_FALSE(n.ok());
  EXPECT_TRUE(absl::IsOutOfRange(n.status())) << n.status();
  EXPECT_EQ(got, std::vector<std::string>{"ok"});
  EXPECT_EQ(in.size(), 7u);  // the bad header and what followed it
}

TEST_F(CursorTest, LengthPrefixSplitterTooLongLeavesTheInput) {
  LengthPrefixSplitter opt{.max_frame = 100};
  BufferChain in(*small_);
  ASSERT_TRUE(AppendBE(in, 97, 4).ok());  // 101 bytes in all
  ASSERT_TRUE(in.Append("abc").ok());
  const std::string before = Contents(in);
  auto f = opt.Next(in);
  ASSERT_FALSE(f.ok());
  EXPECT_TRUE(absl::IsOutOfRange(f.status()));
  EXPECT_EQ(f.status().message(),
            "LengthPrefixSplitter: a frame of 101 bytes (length field 97) "
            "exceeds max_frame 100");
  EXPECT_EQ(Contents(in), before);

  // 96: exactly max_frame, and only when all of it has arrived.
  in.Clear();
  ASSERT_TRUE(AppendBE(in, 96, 4).ok());
  ASSERT_TRUE(in.Append(std::string(95, 'x')).ok());
  f = opt.Next(in);
  ASSERT_TRUE(f.ok() && !f->has_value());
  ASSERT_TRUE(in.Append("y").ok());
  f = opt.Next(in);
  ASSERT_TRUE(f.ok() && f->has_value());
  EXPECT_EQ((*f)->size(), 100u);
  EXPECT_TRUE(in.empty());
}

TEST_F(CursorTest, LengthPrefixSplitterFieldOverflowingWithTheAdjustment) {
  // 2^64 - 1 + 10 must not wrap to a small frame.
  LengthPrefixSplitter opt{.length_bytes = 8, .length_adjustment = 10};
  BufferChain in(*small_);
  ASSERT_TRUE(AppendBE(in, UINT64_MAX, 8).ok());
  ASSERT_TRUE(in.Append("0123456789abcdef").ok());
  const std::string before = Contents(in);
  auto f = opt.Next(in);
  ASSERT_FALSE(f.ok());
  EXPECT_TRUE(absl::IsOutOfRange(f.status())) << f.status();
  EXPECT_NE(f.status().message().find("more than 2^64 - 1"), std::string::npos);
  EXPECT_EQ(Contents(in), before);

  // A field that the adjustment takes below the header's end.
  opt = {.length_bytes = 2, .big_endian = false, .length_adjustment = -5};
  in.Clear();
  ASSERT_TRUE(AppendLE(in, 4, 2).ok());
  ASSERT_TRUE(in.Append("abcd").ok());
  f = opt.Next(in);
  ASSERT_FALSE(f.ok());
  EXPECT_TRUE(absl::IsInvalidArgument(f.status())) << f.status();
  EXPECT_EQ(Contents(in), std::string("\x04\x00"
                                      "abcd",
                                      6));

  // More bytes to strip than the frame has.
  opt = {.length_bytes = 1, .strip_bytes = 5};
  in.Clear();
  ASSERT_TRUE(AppendLE(in, 2, 1).ok());
  ASSERT_TRUE(in.Append("ab").ok());
  f = opt.Next(in);
  ASSERT_FALSE(f.ok());
  EXPECT_TRUE(absl::IsInvalidArgument(f.status())) << f.status();
  EXPECT_EQ(in.size(), 3u);

  opt = {.length_bytes = 5};
  f = opt.Next(in);
  ASSERT_FALSE(f.ok());
  EXPECT_EQ(f.status().message(),
            "LengthPrefixSplitter: length_bytes is 5; it must be 1, 2, 3, 4 "
            "or 8");
}

// ---- Writing ----------------------------------------------------------------

TEST_F(CursorTest, AppendedIntegersReadBack) {
  BufferChain out(*small_);  // 64-byte buffers: fields cross them
  std::mt19937_64 rng(7);
  struct Put {
    uint64_t value;
    size_t bytes;
    bool big;
  };
  std::vector<Put> puts;
  for (int i = 0; i < 200; ++i) {
    const size_t bytes = 1 + rng() % 8;
    uint64_t v = rng();
    if (bytes < 8) v &= (uint64_t{1} << (8 * bytes)) - 1;
    const bool big = rng() & 1;
    ASSERT_TRUE((big ? AppendBE : AppendLE)(out, v, bytes).ok());
    puts.push_back({v, bytes, big});
  }
  const std::string s = Contents(out);
  ChainCursor c(out);
  size_t at = 0;
  for (const Put& p : puts) {
    EXPECT_EQ(ModelInt(s, at, p.bytes, p.big), p.value);
    if (p.bytes == 8) {
      EXPECT_EQ(p.big ? c.ReadBE<uint64_t>() : c.ReadLE<uint64_t>(), p.value);
    } else {
      ASSERT_TRUE(c.Skip(p.bytes));
    }
    at += p.bytes;
  }
  EXPECT_EQ(c.remaining(), 0u);

  const size_t size = out.size();
  absl::Status s1 = AppendLE(out, 256, 1);
  EXPECT_TRUE(absl::IsInvalidArgument(s1));
  EXPECT_EQ(s1.message(), "AppendLE: 256 does not fit in 1 bytes");
  EXPECT_TRUE(absl::IsInvalidArgument(AppendBE(out, 0, 9)));
  EXPECT_TRUE(absl::IsInvalidArgument(AppendBE(out, 0, 0)));
  EXPECT_EQ(out.size(), size);
}

TEST_F(CursorTest, LengthFieldWrittenOnceTheSizeIsKnown) {
  for (size_t lead = 0; lead < 70; ++lead) {
    BufferChain frame(*small_);
    ASSERT_TRUE(frame.Append(std::string(lead, 'L')).ok());
    auto len = LengthField::Reserve(frame, 4);
    ASSERT_TRUE(len.ok());
    EXPECT_EQ(len->offset(), lead);
    ASSERT_TRUE(frame.Append(std::string(100, 'b')).ok());
    ASSERT_TRUE(len->Write(frame, len->BytesAfter(frame)).ok());
    ChainCursor c(frame);
    ASSERT_TRUE(c.Skip(lead));
    EXPECT_EQ(c.ReadBE<uint32_t>(), 100u) << "lead " << lead;
    // The splitter reads it back.
    frame.Consume(lead);
    auto f = LengthPrefixSplitter{}.Next(frame);
    ASSERT_TRUE(f.ok() && f->has_value());
    EXPECT_EQ((*f)->size(), 104u);
  }
}

TEST_F(CursorTest, LengthFieldRefusesSharedBytesAndBadValues) {
  BufferChain frame(*small_);
  auto len = LengthField::Reserve(frame, 2, /*big_endian=*/false);
  ASSERT_TRUE(len.ok());
  ASSERT_TRUE(frame.Append("body").ok());
  EXPECT_TRUE(absl::IsInvalidArgument(len->Write(frame, 65536)));
  {
    BufferChain copy = frame.Clone();
    absl::Status s = len->Write(frame, 4);
    EXPECT_TRUE(absl::IsFailedPrecondition(s)) << s;
    EXPECT_EQ(Contents(copy), std::string("\0\0body", 6));
  }
  ASSERT_TRUE(len->Write(frame, 0x0102).ok());
  EXPECT_EQ(Contents(frame),
            "\x02\x01"
            "body");
  EXPECT_TRUE(absl::IsInvalidArgument(LengthField::Reserve(frame, 9).status()));
  BufferChain shorter(*small_);
  EXPECT_TRUE(absl::IsFailedPrecondition(len->Write(shorter, 1)));
}

}  // namespace
}  // namespace bufpool

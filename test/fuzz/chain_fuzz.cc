// Fuzz target 2: BufferChain and SharedBuffer against std::string models.
//
// The input picks two small pools (buffer size 64 to 1024, 1 to 40 buffers,
// so appends run dry) and operates on four chains (each with one of the pools
// or none) and on up to 16 slices held apart from them: Append of bytes, of a
// slice (moved or copied), of another chain, of a filled Buffer; Consume,
// Split, Clone, Clear, CopyTo, FillIovecs, spans(), move-assignment, Slice(),
// Compact() (same bytes, all or nothing) and tail_room(); the receive
// primitive (Receive() of a filled buffer of either pool with every
// copy_below and with or without a ReceivePack, Preallocate/Postallocate,
// GrowTail, AppendPacked, a pack dropped); and reads a chain
// with a ChainCursor (integers of every width and order, Skip, Read,
// Contiguous, Find of a byte and of a string, from a position) and cuts
// frames off it with a LineSplitter (one per chain, whose state survives
// appends) and a LengthPrefixSplitter, each checked against the same
// operation on the model. After every step:
//   * each chain's bytes (through spans()) equal its model, size() and the
//     slice sizes agree, no slice is empty or reaches outside its buffer;
//   * every held slice still reads the bytes it had (nothing writes shared
//     bytes);
//   * for every slot referenced, its count (use_count() plus the handle's
//     own reserve) equals the references the handles the fuzzer holds own
//     (one each, plus their reserves: cuts count references ahead), and
//     each pool's in_use equals the slots referenced;
//   * a failed Append leaves the chain as it was;
//   * a chain consumed to empty pins no buffer (the pool's in_use counts
//     only the slots slices reference, plus a pack's buffer);
//   * Receive() took the buffer (the handle is empty) or left it as it was,
//     and a failed AppendPacked left the chain as it was;
//   * budgets (bufpool/budget.h): a chain is unbound, or bound to one of two
//     budgets of pool 0 (with limits the input picks, so they refuse), and
//     slices, chains and clones travel between them. The budgets' pinned
//     bytes sum to at most the bytes of the buffers their chains hold plus
//     a buffer per budget, and no budget's high water passes its max_bytes
//     (receives into a bound chain are made, as the arming rule says, only
//     while its budget has room for what they may bring). When the chains
//     are gone, every budget pins nothing.
#include <fuzzer/FuzzedDataProvider.h>
#include <sys/uio.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "bufpool/budget.h"
#include "bufpool/buffer_pool.h"
#include "bufpool/chain.h"
#include "bufpool/cursor.h"
#include "fuzz_check.h"

namespace {

using bufpool::Buffer;
using bufpool::BufferChain;
using bufpool::BufferPool;
using bufpool::SharedBuffer;

constexpr int kChains = 4;
constexpr size_t kMaxHeld = 16;

struct Held {
  SharedBuffer slice;
  std::string bytes;
};

std::string Contents(const BufferChain& c) {
  std::string s;
  for (absl::Span<const std::byte> part : c.spans()) {
    s.append(reinterpret_cast<const char*>(part.data()), part.size());
  }
  return s;
}

class Session {
 public:
  explicit Session(FuzzedDataProvider& in) : in_(in) {}

  void Run() {
    for (auto& pool : pools_) {
      bufpool::PoolOptions o;
      o.buffer_size = size_t{64} << in_.ConsumeIntegralInRange<int>(0, 4);
      o.buffer_count = in_.ConsumeIntegralInRange<size_t>(1, 40);
      o.cache_size = in_.ConsumeBool() ? 0 : 64;
      o.huge_pages = bufpool::HugePages::kNever;
      o.populate = false;
      auto p = BufferPool::Create(o);
      FUZZ_CHECK(p.ok(), "Create: %s", p.status().ToString().c_str());
      pool = std::move(*p);
    }
    for (int k = 0; k < 2; ++k) {
      packs_[k] = std::make_unique<bufpool::ReceivePack>(*pools_[k]);
    }
    const size_t bs0 = pools_[0]->buffer_size();
    for (int k = 0; k < 2; ++k) {
      const size_t buffers = in_.ConsumeIntegralInRange<size_t>(1, 12);
      auto b = pools_[0]->CreateBudget(
          {.name = k == 0 ? "A" : "B", .max_bytes = buffers * bs0});
      FUZZ_CHECK(b.ok(), "CreateBudget: %s", b.status().ToString().c_str());
      budgets_[k] = std::move(*b);
    }
    for (int i = 0; i < kChains; ++i) {
      chains_[i] = MakeChain();
      // Fixed per chain, so they take no input bytes away from the steps.
      static constexpr size_t kMaxLine[kChains] = {0, 7, 64, 300};
      lines_[i] = bufpool::LineSplitter(
          {.max_line = kMaxLine[i], .strip_delimiter = i % 2 == 0});
    }
    int steps = 0;
    while (in_.remaining_bytes() > 0 && steps++ < 256) {
      Step();
      Check();
    }
    for (auto& c : chains_) c.reset();
    for (auto& l : lines_) l.Reset();  // views hold buffers too
    held_.clear();
    for (auto& b : budgets_) {
      FUZZ_CHECK(b->pinned_bytes() == 0,
                 "budget %s pins %zu after its chains are gone",
                 b->name().c_str(), b->pinned_bytes());
      b.reset();
    }
    for (auto& p : packs_) p.reset();
    for (auto& pool : pools_) {
      FUZZ_CHECK(pool->Stats().in_use == 0,
                 "in_use %zu after every chain "
                 "and slice is gone",
                 pool->Stats().in_use);
    }
  }

 private:
  BufferChain MakeChain() {
    const int which = in_.ConsumeIntegralInRange<int>(0, 4);
    if (which >= 3) return BufferChain(*budgets_[which - 3]);
    return which == 2 ? BufferChain() : BufferChain(*pools_[which]);
  }
  size_t PickChain() {
    return in_.ConsumeIntegralInRange<size_t>(0, kChains - 1);
  }

  std::string Bytes(size_t max) {
    const size_t n = in_.ConsumeIntegralInRange<size_t>(0, max);
    std::string s =
        in_.ConsumeBytesAsString(in_.ConsumeIntegralInRange<size_t>(0, n));
    // The rest of the length is a pattern, so long appends need no input.
    while (s.size() < n) s.push_back(static_cast<char>('a' + s.size() % 26));
    return s;
  }

  void Step() {
    const size_t i = PickChain();
    BufferChain& c = *chains_[i];
    std::string& m = models_[i];
    const int op = in_.ConsumeIntegralInRange<int>(0, 22);
    // The line splitters' state is valid while their chain only grows.
    if (op >= 4 && op != 6 && op != 9 && op < 15) lines_[i].Reset();
    switch (op) {
      case 0: {  // Append bytes: all or nothing
        const std::string b = Bytes(in_.ConsumeBool() ? 64 : 3000);
        const size_t segs = c.slice_count();
        absl::Status s = c.Append(b);
        if (s.ok()) {
          m += b;
        } else {
          FUZZ_CHECK(absl::IsResourceExhausted(s) ||
                         (absl::IsFailedPrecondition(s) && !c.pool()),
                     "Append(%zu bytes): %s", b.size(), s.ToString().c_str());
          FUZZ_CHECK(c.slice_count() == segs,
                     "failed Append changed the slices");
        }
        break;
      }
      case 1: {  // Append a held slice, moved or copied
        if (held_.empty()) break;
        const size_t h =
            in_.ConsumeIntegralInRange<size_t>(0, held_.size() - 1);
        m += held_[h].bytes;
        if (in_.ConsumeBool()) {
          c.Append(std::move(held_[h].slice));
          held_.erase(held_.begin() + h);
        } else {
          c.Append(held_[h].slice);
        }
        break;
      }
      case 2: {  // Append another chain (itself: nothing happens)
        const size_t j = PickChain();
        c.Append(std::move(*chains_[j]));
        lines_[j].Reset();
        if (j != i) {
          m += models_[j];
          models_[j].clear();
        }
        FUZZ_CHECK(j == i || chains_[j]->empty(), "appended chain not empty");
        break;
      }
      case 3: {  // Append a Buffer filled by the caller
        BufferPool& pool = *pools_[in_.ConsumeIntegralInRange<int>(0, 1)];
        Buffer b = pool.TryAcquire();
        if (!b) break;
        const std::string bytes = Bytes(b.size());
        std::memcpy(b.data(), bytes.data(), bytes.size());
        c.Append(std::move(b), bytes.size());
        FUZZ_CHECK(!b, "Append(Buffer&&) left the handle set");
        m += bytes;
        break;
      }
      case 4: {  // Consume
        const size_t n = in_.ConsumeIntegralInRange<size_t>(0, m.size() + 8);
        c.Consume(n);
        m.erase(0, std::min(n, m.size()));
        break;
      }
      case 5: {  // Split into another chain (replacing it)
        const size_t j = PickChain();
        const size_t n = in_.ConsumeIntegralInRange<size_t>(0, m.size() + 8);
        BufferChain first = c.Split(n);
        FUZZ_CHECK(first.pool() == c.pool(), "Split: pool differs");
        const std::string head = m.substr(0, std::min(n, m.size()));
        m.erase(0, head.size());
        FUZZ_CHECK(Contents(first) == head && first.size() == head.size(),
                   "Split(%zu): %zu bytes '%s' expected '%s'", n, first.size(),
                   Contents(first).c_str(), head.c_str());
        *chains_[j] = std::move(first);
        models_[j] = head;
        lines_[j].Reset();
        break;
      }
      case 6: {  // CopyTo a span shorter or longer than the chain
        const size_t n = in_.ConsumeIntegralInRange<size_t>(0, m.size() + 8);
        std::string out(n, '\0');
        const size_t got = c.CopyTo(
            absl::MakeSpan(reinterpret_cast<std::byte*>(out.data()), n));
        FUZZ_CHECK(got == std::min(n, m.size()), "CopyTo returned %zu", got);
        FUZZ_CHECK(out.compare(0, got, m, 0, got) == 0, "CopyTo bytes");
        break;
      }
      case 7: {  // Clone into another chain
        const size_t j = PickChain();
        BufferChain copy = c.Clone();
        FUZZ_CHECK(copy.pool() == c.pool(), "Clone: pool differs");
        const std::string model = m;
        *chains_[j] = std::move(copy);
        models_[j] = model;
        lines_[j].Reset();
        break;
      }
      case 8:  // Clear
        c.Clear();
        m.clear();
        break;
      case 9: {  // FillIovecs
        const size_t k = in_.ConsumeIntegralInRange<size_t>(0, 12);
        std::vector<iovec> iov(k);
        const size_t got = c.FillIovecs(absl::MakeSpan(iov));
        FUZZ_CHECK(got == std::min(k, c.slice_count()), "FillIovecs %zu", got);
        std::string s;
        for (size_t x = 0; x < got; ++x) {
          s.append(static_cast<const char*>(iov[x].iov_base), iov[x].iov_len);
        }
        FUZZ_CHECK(m.compare(0, s.size(), s) == 0,
                   "FillIovecs bytes are not the chain's prefix");
        if (got == c.slice_count()) {
          FUZZ_CHECK(s == m, "FillIovecs of every slice");
        }
        break;
      }
      case 10: {  // Slice() of a segment, held apart
        if (c.slice_count() == 0 || held_.size() >= kMaxHeld) break;
        const size_t k =
            in_.ConsumeIntegralInRange<size_t>(0, c.slice_count() - 1);
        const SharedBuffer& seg = c.slice(k);
        const size_t off = in_.ConsumeIntegralInRange<size_t>(0, seg.size());
        const size_t len =
            in_.ConsumeIntegralInRange<size_t>(0, seg.size() - off);
        SharedBuffer s = seg.Slice(off, len);
        FUZZ_CHECK(s && s.size() == len && s.data() == seg.data() + off &&
                       s.slot() == seg.slot() && s.pool() == seg.pool(),
                   "Slice(%zu, %zu)", off, len);
        std::string bytes(s.view());
        held_.push_back({std::move(s), std::move(bytes)});
        break;
      }
      case 11:  // drop a held slice
        if (held_.empty()) break;
        held_.erase(held_.begin() +
                    in_.ConsumeIntegralInRange<size_t>(0, held_.size() - 1));
        break;
      case 12: {  // move-assign another chain (or a fresh one) onto this one
        const size_t j = PickChain();
        if (j == i) {
          *chains_[i] = MakeChain();
          m.clear();
        } else {
          *chains_[i] = std::move(*chains_[j]);
          m = std::move(models_[j]);
          models_[j].clear();
          lines_[j].Reset();
          FUZZ_CHECK(chains_[j]->empty() && chains_[j]->slice_count() == 0,
                     "moved-from chain not empty");
        }
        break;
      }
      case 14: {  // Compact: same bytes, or all or nothing
        const size_t segs = c.slice_count();
        const size_t pinned = c.pinned_bytes();
        // Slices of another pool may copy into larger buffers.
        bool same_pool = c.pool() != nullptr;
        for (size_t k = 0; k < segs; ++k) {
          same_pool &= c.slice(k).pool() == c.pool();
        }
        absl::Status st = c.Compact();
        if (st.ok()) {
          FUZZ_CHECK(!same_pool || c.pinned_bytes() <= pinned,
                     "Compact grew pinned_bytes %zu -> %zu", pinned,
                     c.pinned_bytes());
        } else {
          FUZZ_CHECK(absl::IsResourceExhausted(st) ||
                         (absl::IsFailedPrecondition(st) && !c.pool()),
                     "Compact: %s", st.ToString().c_str());
          FUZZ_CHECK(c.slice_count() == segs, "failed Compact changed it");
        }
        break;
      }
      case 15: {  // tail_room(): the tail's room only when it is ours alone
        if (c.empty()) {
          FUZZ_CHECK(c.tail_room() == 0, "tail_room of an empty chain");
          break;
        }
        const SharedBuffer& t = c.slice(c.slice_count() - 1);
        FUZZ_CHECK(c.tail_room() == (t.use_count() == 1 ? t.room() : 0),
                   "tail_room %zu, room %zu, use_count %u", c.tail_room(),
                   t.room(), t.use_count());
        break;
      }
      case 16:
        CursorStep(c, m);
        break;
      case 17:  // the splitters consume or split: observed, not predicted
        LineStep(c, m, lines_[i]);
        break;
      case 18:  // takes frames off the front: the line state goes too
        lines_[i].Reset();
        LengthPrefixStep(c, m);
        break;
      case 19:
        lines_[i].Reset();
        EmptiedStep(i);
        break;
      case 20:
        ReceiveStep(c, m);
        break;
      case 21:
        RoomStep(c, m);
        break;
      case 22:
        PackStep(c, m);
        break;
      default: {  // 13: a held slice copied, then reset
        if (held_.empty()) break;
        Held& h =
            held_[in_.ConsumeIntegralInRange<size_t>(0, held_.size() - 1)];
        SharedBuffer copy = h.slice;
        FUZZ_CHECK(copy.use_count() >= 2, "copy's use_count %u",
                   copy.use_count());
        copy.Reset();
        FUZZ_CHECK(!copy && copy.size() == 0, "Reset slice not empty");
        break;
      }
    }
  }

  // Consume to empty: the chain pins nothing (Check() then finds the
  // pool's in_use equal to the slots other slices reference).
  void EmptiedStep(size_t i) {
    BufferChain& c = *chains_[i];
    c.Consume(c.size());
    models_[i].clear();
    FUZZ_CHECK(c.empty() && c.slice_count() == 0 && c.pinned_bytes() == 0 &&
                   c.tail_room() == 0,
               "chain %zu emptied still holds %zu slices, pins %zu", i,
               c.slice_count(), c.pinned_bytes());
  }

  // A buffer of either pool filled with n bytes, handed to Receive() with
  // options the input picks. The chain grows by exactly those bytes,
  // whether it linked the buffer or copied them.
  void ReceiveStep(BufferChain& c, std::string& m) {
    BufferPool& from = *pools_[in_.ConsumeIntegralInRange<int>(0, 1)];
    Buffer b = from.TryAcquire();
    if (!b) return;
    const std::string bytes = Bytes(b.size());
    std::memcpy(b.data(), bytes.data(), bytes.size());
    const size_t bs = c.pool() != nullptr ? c.pool()->buffer_size() : b.size();
    static constexpr size_t kDivisors[] = {0, 8, 2, 1};
    const size_t d = kDivisors[in_.ConsumeIntegralInRange<int>(0, 3)];
    BufferChain::ReceiveOptions options;
    options.copy_below = d == 0 ? 0 : bs / d;
    const int pack = in_.ConsumeIntegralInRange<int>(-1, 1);
    if (pack >= 0) options.pack = packs_[pack].get();
    // The arming rule (budget.h): bytes that have arrived are kept even
    // past the limit, so a bound chain receives only with room for what a
    // receive may bring: the buffer linked, or a buffer of its pool.
    if (c.budget() != nullptr &&
        c.budget()->room_bytes() < std::max(b.size(), bs)) {
      return;
    }
    std::byte* const data = b.data();
    const size_t size = b.size();
    const bool took = c.Receive(b, bytes.size(), options);
    if (took) {
      FUZZ_CHECK(!b && bytes.size() != 0, "Receive took the buffer: %s",
                 b ? "handle still set" : "0 bytes");
    } else {
      FUZZ_CHECK(b && b.data() == data && b.size() == size,
                 "Receive copied but changed the buffer");
    }
    m += bytes;
  }

  // Preallocate/Postallocate: bytes written into the tail's room become the
  // chain's. Or GrowTail over them, which refuses any other address.
  void RoomStep(BufferChain& c, std::string& m) {
    const absl::Span<std::byte> room = c.Preallocate();
    FUZZ_CHECK(room.size() == c.tail_room(), "Preallocate %zu, tail_room %zu",
               room.size(), c.tail_room());
    if (room.empty()) {
      FUZZ_CHECK(!c.empty() || !c.GrowTail(nullptr, 1),
                 "GrowTail of an empty chain");
      return;
    }
    const std::string bytes = Bytes(room.size());
    std::memcpy(room.data(), bytes.data(), bytes.size());
    if (in_.ConsumeBool()) {
      c.Postallocate(bytes.size());
    } else if (!bytes.empty()) {
      FUZZ_CHECK(!c.GrowTail(room.data() + 1, bytes.size()),
                 "GrowTail at a gap");
      FUZZ_CHECK(c.GrowTail(room.data(), bytes.size()),
                 "GrowTail over the tail's room");
    }
    m += bytes;
  }

  // AppendPacked of a few bytes, or a pack dropped (its buffer goes back
  // with its last slice).
  void PackStep(BufferChain& c, std::string& m) {
    const int k = in_.ConsumeIntegralInRange<int>(0, 1);
    if (in_.ConsumeIntegralInRange<int>(0, 7) == 0) {
      packs_[k] = std::make_unique<bufpool::ReceivePack>(*pools_[k]);
      return;
    }
    const std::string bytes = Bytes(in_.ConsumeBool() ? 16 : 300);
    const size_t slices = c.slice_count(), size = c.size();
    if (c.AppendPacked(
            absl::MakeConstSpan(
                reinterpret_cast<const std::byte*>(bytes.data()), bytes.size()),
            *packs_[k])) {
      FUZZ_CHECK(!bytes.empty(), "AppendPacked of nothing said yes");
      m += bytes;
    } else {
      FUZZ_CHECK(c.slice_count() == slices && c.size() == size,
                 "a failed AppendPacked changed the chain");
    }
  }

  // The model's integer of `width` bytes at `at`.
  static uint64_t ModelInt(const std::string& m, size_t at, size_t width,
                           bool big) {
    uint64_t v = 0;
    for (size_t k = 0; k < width; ++k) {
      v = (v << 8) | static_cast<uint8_t>(m[at + (big ? k : width - 1 - k)]);
    }
    return v;
  }

  template <class T>
  void CheckInt(bufpool::ChainCursor& cur, const std::string& m, bool big,
                bool peek) {
    const size_t at = cur.position();
    std::optional<T> got =
        big ? (peek ? cur.template PeekBE<T>() : cur.template ReadBE<T>())
            : (peek ? cur.template PeekLE<T>() : cur.template ReadLE<T>());
    if (m.size() - at < sizeof(T)) {
      FUZZ_CHECK(!got && cur.position() == at, "a %zu-byte read with %zu left",
                 sizeof(T), m.size() - at);
      return;
    }
    const T want = static_cast<T>(
        static_cast<std::make_unsigned_t<T>>(ModelInt(m, at, sizeof(T), big)));
    FUZZ_CHECK(got && *got == want, "%s%s of %zu bytes at %zu",
               peek ? "Peek" : "Read", big ? "BE" : "LE", sizeof(T), at);
    FUZZ_CHECK(cur.position() == at + (peek ? 0 : sizeof(T)),
               "position %zu after a read at %zu", cur.position(), at);
  }

  // A cursor at a position the input picks, then a few reads and searches.
  void CursorStep(const BufferChain& c, const std::string& m) {
    bufpool::ChainCursor cur(c);
    const size_t skip = in_.ConsumeIntegralInRange<size_t>(0, m.size() + 2);
    FUZZ_CHECK(cur.Skip(skip) == (skip <= m.size()), "Skip(%zu) of %zu", skip,
               m.size());
    FUZZ_CHECK(cur.position() == (skip <= m.size() ? skip : 0), "position");
    for (int n = in_.ConsumeIntegralInRange<int>(1, 3); n > 0; --n) {
      const size_t at = cur.position();
      FUZZ_CHECK(cur.remaining() == m.size() - at, "remaining()");
      const bool big = in_.ConsumeBool(), peek = in_.ConsumeBool();
      const int what = in_.ConsumeIntegralInRange<int>(0, 11);
      switch (what) {
        case 0:
          CheckInt<uint8_t>(cur, m, big, peek);
          break;
        case 1:
          CheckInt<int16_t>(cur, m, big, peek);
          break;
        case 2:
          CheckInt<uint16_t>(cur, m, big, peek);
          break;
        case 3:
          CheckInt<uint32_t>(cur, m, big, peek);
          break;
        case 4:
          CheckInt<int32_t>(cur, m, big, peek);
          break;
        case 5:
          CheckInt<uint64_t>(cur, m, big, peek);
          break;
        case 6:
          CheckInt<int64_t>(cur, m, big, peek);
          break;
        case 7: {  // Read into a span
          std::string out(in_.ConsumeIntegralInRange<size_t>(0, 300), '\0');
          const size_t got = cur.Read(absl::MakeSpan(
              reinterpret_cast<std::byte*>(out.data()), out.size()));
          FUZZ_CHECK(got == std::min(out.size(), m.size() - at) &&
                         out.compare(0, got, m, at, got) == 0 &&
                         cur.position() == at + got,
                     "Read of %zu at %zu", out.size(), at);
          break;
        }
        case 8: {  // Contiguous, then past it
          absl::Span<const std::byte> here = cur.Contiguous();
          FUZZ_CHECK(here.empty() == (at == m.size()) &&
                         m.compare(at, here.size(),
                                   reinterpret_cast<const char*>(here.data()),
                                   here.size()) == 0,
                     "Contiguous() at %zu", at);
          FUZZ_CHECK(cur.Skip(here.size()), "Skip(Contiguous().size())");
          break;
        }
        case 9:
        case 10: {  // Find a byte or a string, within a limit
          const size_t limit = in_.ConsumeBool()
                                   ? SIZE_MAX
                                   : in_.ConsumeIntegralInRange<size_t>(0, 64);
          std::string needle;
          if (what == 9) {
            needle.push_back(static_cast<char>(in_.ConsumeIntegral<uint8_t>()));
          } else if (in_.ConsumeBool() && at < m.size()) {  // one that is there
            const size_t from =
                in_.ConsumeIntegralInRange<size_t>(at, m.size() - 1);
            needle = m.substr(from, in_.ConsumeIntegralInRange<size_t>(0, 6));
          } else {
            needle = in_.ConsumeBytesAsString(
                in_.ConsumeIntegralInRange<size_t>(0, 4));
          }
          const std::string window = m.substr(at, limit);
          const size_t want = window.find(needle);
          const std::optional<size_t> got =
              needle.size() == 1 && in_.ConsumeBool()
                  ? cur.Find(static_cast<std::byte>(needle[0]), limit)
                  : cur.Find(absl::string_view(needle), limit);
          FUZZ_CHECK(want == std::string::npos ? !got : got && *got == want,
                     "Find of %zu bytes at %zu within %zu: got %zd, want %zd",
                     needle.size(), at, limit, got ? ssize_t(*got) : -1,
                     want == std::string::npos ? -1 : ssize_t(want));
          FUZZ_CHECK(cur.position() == at, "Find moved the cursor");
          break;
        }
        default: {  // Skip some
          const size_t k = in_.ConsumeIntegralInRange<size_t>(0, 80);
          FUZZ_CHECK(cur.Skip(k) == (k <= m.size() - at) &&
                         cur.position() == (k <= m.size() - at ? at + k : at),
                     "Skip(%zu) at %zu", k, at);
          break;
        }
      }
    }
  }

  // A frame's slices add up to its size (checked before its bytes).
  static void CheckFrame(const BufferChain& f) {
    size_t sum = 0;
    for (size_t k = 0; k < f.slice_count(); ++k) sum += f.slice(k).size();
    FUZZ_CHECK(sum == f.size(), "frame: slices hold %zu, size() %zu", sum,
               f.size());
  }

  // LineSplitter::Next until nullopt or an error, against the model's lines.
  // Next() (a chain per line), NextView() (a view per line) or ForEachLine()
  // (every line at once, replayed here against the model one by one).
  void LineStep(BufferChain& c, std::string& m, bufpool::LineSplitter& lines) {
    const size_t max_line = lines.options().max_line;
    const bool strip = lines.options().strip_delimiter;
    const size_t window = max_line + 2;
    const int mode = in_.ConsumeIntegralInRange<int>(0, 2);
    std::vector<std::string> batch;
    size_t next = 0;
    absl::Status batch_status;
    if (mode == 2) {
      batch_status = lines.ForEachLine(
          c, [&](absl::string_view l) { batch.emplace_back(l); });
    }
    for (;;) {
      absl::StatusOr<std::optional<std::string>> got = std::nullopt;
      if (mode == 2) {
        if (next < batch.size()) {
          got = batch[next++];
        } else if (!batch_status.ok()) {
          got = batch_status;
        }
      } else if (mode == 1) {
        auto v = lines.NextView(c);
        if (!v.ok()) {
          got = v.status();
        } else if (v->has_value()) {
          got = std::string(**v);
        }
      } else {
        auto line = lines.Next(c);
        if (!line.ok()) {
          got = line.status();
        } else if (line->has_value()) {
          CheckFrame(**line);
          got = Contents(**line);
        }
      }
      const size_t nl = m.find('\n');
      if (nl == std::string::npos || nl >= window) {
        const bool too_long = std::min(nl, m.size()) >= window;
        FUZZ_CHECK(got.ok() != too_long && (!got.ok() || !got->has_value()),
                   "Next() with no newline in %zu of %zu bytes (max_line %zu)",
                   std::min(window, m.size()), m.size(), max_line);
        if (!got.ok()) {
          FUZZ_CHECK(absl::IsOutOfRange(got.status()), "line error code");
        }
        return;
      }
      const size_t length = nl - (nl > 0 && m[nl - 1] == '\r');
      if (length > max_line) {
        FUZZ_CHECK(!got.ok() && absl::IsOutOfRange(got.status()),
                   "a line of %zu bytes (max_line %zu) was taken", length,
                   max_line);
        return;
      }
      FUZZ_CHECK(got.ok() && got->has_value(), "a complete line not taken");
      const std::string want = m.substr(0, strip ? length : nl + 1);
      FUZZ_CHECK(**got == want, "line '%s', want '%s'", (*got)->c_str(),
                 want.c_str());
      // The view's buffer is held until the next call; drop it, so the
      // reference checks see only the chains' and held slices'.
      if (mode == 1) lines.Reset();
      m.erase(0, nl + 1);
    }
  }

  // LengthPrefixSplitter::Next with options the input picks.
  void LengthPrefixStep(BufferChain& c, std::string& m) {
    static constexpr size_t kWidths[] = {1, 2, 3, 4, 8};
    bufpool::LengthPrefixSplitter s;
    s.length_offset = in_.ConsumeIntegralInRange<size_t>(0, 5);
    s.length_bytes = kWidths[in_.ConsumeIntegralInRange<int>(0, 4)];
    s.big_endian = in_.ConsumeBool();
    s.length_adjustment = in_.ConsumeIntegralInRange<int64_t>(-20, 20);
    s.strip_bytes = in_.ConsumeIntegralInRange<size_t>(0, 12);
    s.max_frame = in_.ConsumeIntegralInRange<size_t>(0, 4000);
    for (int n = 0; n < 64; ++n) {
      auto got = s.Next(c);
      const size_t header = s.length_offset + s.length_bytes;
      if (m.size() < header) {
        FUZZ_CHECK(got.ok() && !got->has_value(),
                   "a frame from a short header");
        return;
      }
      const uint64_t field =
          ModelInt(m, s.length_offset, s.length_bytes, s.big_endian);
      const __int128 frame =
          static_cast<__int128>(header) + field + s.length_adjustment;
      if (frame < static_cast<__int128>(header) ||
          frame < static_cast<__int128>(s.strip_bytes)) {
        FUZZ_CHECK(!got.ok() && absl::IsInvalidArgument(got.status()),
                   "a frame shorter than its header or strip");
        return;
      }
      if (frame > static_cast<__int128>(s.max_frame)) {
        FUZZ_CHECK(!got.ok() && absl::IsOutOfRange(got.status()),
                   "a frame over max_frame");
        return;
      }
      if (m.size() < static_cast<size_t>(frame)) {
        FUZZ_CHECK(got.ok() && !got->has_value(), "an incomplete frame taken");
        return;
      }
      const std::string want =
          m.substr(s.strip_bytes, static_cast<size_t>(frame) - s.strip_bytes);
      FUZZ_CHECK(got.ok() && got->has_value(), "a complete frame not taken");
      CheckFrame(**got);
      FUZZ_CHECK(Contents(**got) == want, "frame of %zu bytes differs",
                 want.size());
      m.erase(0, static_cast<size_t>(frame));
    }
  }

  void Note(const SharedBuffer& s,
            std::map<std::pair<BufferPool*, uint32_t>, uint32_t>& refs) {
    FUZZ_CHECK(s && s.size() > 0, "an empty slice");
    BufferPool* pool = s.pool();
    FUZZ_CHECK(pool == pools_[0].get() || pool == pools_[1].get(),
               "slice of an unknown pool");
    FUZZ_CHECK(s.slot() < pool->capacity(), "slot %u", s.slot());
    FUZZ_CHECK(s.offset() + s.size() <= pool->buffer_size() &&
                   s.room() == pool->buffer_size() - s.offset() - s.size(),
               "slice [%zu, +%zu) of a %zu-byte buffer", s.offset(), s.size(),
               pool->buffer_size());
    refs[{pool, s.slot()}] += 1 + bufpool::internal::ChainAccess::Reserved(s);
  }

  void Check() {
    std::map<std::pair<BufferPool*, uint32_t>, uint32_t> refs;
    std::vector<const SharedBuffer*> any;  // one slice per referenced slot
    for (int i = 0; i < kChains; ++i) {
      const BufferChain& c = *chains_[i];
      size_t sum = 0;
      for (size_t k = 0; k < c.slice_count(); ++k) {
        Note(c.slice(k), refs);
        any.push_back(&c.slice(k));
        sum += c.slice(k).size();
      }
      FUZZ_CHECK(sum == c.size(), "chain %d: slices hold %zu, size() %zu", i,
                 sum, c.size());
      FUZZ_CHECK(c.spans().size() == c.slice_count(), "spans().size()");
      FUZZ_CHECK(c.size() == models_[i].size() && Contents(c) == models_[i],
                 "chain %d: %zu bytes differ from the model's %zu", i, c.size(),
                 models_[i].size());
      FUZZ_CHECK(c.empty() == models_[i].empty(), "empty()");
      // pinned_bytes(): a buffer size per run of adjacent slices of one
      // buffer (a chain may repeat a buffer's bytes, so it can be < size()).
      size_t pinned = 0;
      for (size_t k = 0; k < c.slice_count(); ++k) {
        const SharedBuffer& s = c.slice(k);
        if (k == 0 || c.slice(k - 1).pool() != s.pool() ||
            c.slice(k - 1).slot() != s.slot()) {
          pinned += s.pool()->buffer_size();
        }
      }
      FUZZ_CHECK(c.pinned_bytes() == pinned, "chain %d pins %zu, not %zu", i,
                 c.pinned_bytes(), pinned);
    }
    for (const Held& h : held_) {
      FUZZ_CHECK(h.slice.view() == h.bytes,
                 "a held slice's bytes changed (slot %u)", h.slice.slot());
      if (h.slice.size() > 0) {
        Note(h.slice, refs);
        any.push_back(&h.slice);
      } else if (h.slice) {
        // Slice(off, 0) holds its buffer but is not a chain's slice.
        refs[{h.slice.pool(), h.slice.slot()}] +=
            1 + bufpool::internal::ChainAccess::Reserved(h.slice);
        any.push_back(&h.slice);
      }
    }
    // A pack holds its buffer's references beyond its slices': at most one
    // slot of each pool counts more than the fuzzer holds, and only while
    // that pool's pack holds a buffer.
    std::map<std::pair<BufferPool*, uint32_t>, bool> extra;
    for (const SharedBuffer* s : any) {
      const uint32_t want = refs[{s->pool(), s->slot()}];
      // use_count() leaves out the handle's own reserve.
      const uint32_t count =
          s->use_count() + bufpool::internal::ChainAccess::Reserved(*s);
      FUZZ_CHECK(count >= want, "slot %u: count %u, held %u", s->slot(), count,
                 want);
      if (count > want) extra[{s->pool(), s->slot()}] = true;
    }
    CheckBudgets();
    for (int k = 0; k < 2; ++k) {
      BufferPool* pool = pools_[k].get();
      size_t slots = 0, extras = 0;
      for (const auto& [key, n] : refs) slots += key.first == pool;
      for (const auto& [key, yes] : extra) extras += key.first == pool;
      const bool packed = packs_[k]->holds_buffer();
      FUZZ_CHECK(extras <= (packed ? 1u : 0u),
                 "%zu slots of pool %d count references nobody holds", extras,
                 k);
      const size_t in_use = pool->Stats().in_use;
      // The pack's buffer is out either way; slices may reference it.
      FUZZ_CHECK(
          in_use == slots || (packed && extras == 0 && in_use == slots + 1),
          "pool %d in_use %zu but %zu slots referenced (pack %s)", k, in_use,
          slots, packed ? "holds a buffer" : "empty");
    }
  }

  // The accounting invariant (budget.h) after every step: the budgets pin
  // at most the buffers their chains hold (each once) plus, for slices of
  // pack buffers, each chain's runs of them rounded up to 64 bytes.
  void CheckBudgets() {
    using bufpool::internal::SharedAccess;
    std::map<std::pair<BufferPool*, uint32_t>, bool> held;
    size_t out = 0, packed = 0;
    for (int i = 0; i < kChains; ++i) {
      const BufferChain& c = *chains_[i];
      if (c.budget() == nullptr) continue;
      size_t run = 0;
      for (size_t k = 0; k < c.slice_count(); ++k) {
        const SharedBuffer& s = c.slice(k);
        const bool pack =
            SharedAccess::Owner(*s.pool(), s.slot())
                .load(std::memory_order_relaxed) == SharedAccess::kOwnerPack;
        const bool ends = k + 1 == c.slice_count() ||
                          c.slice(k + 1).pool() != s.pool() ||
                          c.slice(k + 1).slot() != s.slot();
        if (pack) {
          run += s.size();
          if (ends) {
            packed += (run + BufferChain::kPackGranule - 1) /
                      BufferChain::kPackGranule * BufferChain::kPackGranule;
            run = 0;
          }
          continue;
        }
        if (!held[{s.pool(), s.slot()}]) out += s.pool()->buffer_size();
        held[{s.pool(), s.slot()}] = true;
      }
    }
    size_t pinned = 0;
    for (const auto& b : budgets_) {
      const bufpool::BudgetStats st = b->Stats();
      pinned += st.pinned_bytes;
      FUZZ_CHECK(st.high_water_bytes <= b->max_bytes(),
                 "budget %s high water %zu past its max_bytes %zu",
                 b->name().c_str(), st.high_water_bytes, b->max_bytes());
    }
    FUZZ_CHECK(pinned <= out + packed,
               "budgets pin %zu, their chains hold buffers of %zu bytes and "
               "packed runs of %zu rounded",
               pinned, out, packed);
  }

  FuzzedDataProvider& in_;
  std::unique_ptr<BufferPool> pools_[2];
  // Destroyed after the chains (declared before them), before the pools.
  std::unique_ptr<bufpool::BufferBudget> budgets_[2];
  // Destroyed before the pools (declared after them).
  std::optional<BufferChain> chains_[kChains];
  std::string models_[kChains];
  bufpool::LineSplitter lines_[kChains];
  std::vector<Held> held_;
  // One per pool; destroyed before the pools.
  std::unique_ptr<bufpool::ReceivePack> packs_[2];
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  FuzzedDataProvider in(data, size);
  Session(in).Run();
  return 0;
}

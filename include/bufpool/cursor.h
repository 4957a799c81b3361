// libbufpool: parsing messages out of chains.
//
// ChainCursor reads a BufferChain from a position (integers of any width and
// byte order, bytes, searches for a byte or a string) across its slice
// boundaries, without copying where the bytes are contiguous. LineSplitter
// and LengthPrefixSplitter cut complete frames off the front of an input
// chain as chains of slices of the same buffers (no copy). AppendLE /
// AppendBE and LengthField write integers and length prefixes.
//
// The receive loop (examples/resp_server.cc is a complete server; the
// examples are installed in share/doc/bufpool):
//
//   struct Conn { bufpool::BufferChain in; bufpool::LineSplitter lines; ... };
//   ... on each receive completion for `conn`:
//   if (absl::Status s = bufs->Take(*cqe, conn->in); !s.ok()) ...;
//   for (;;) {
//     absl::StatusOr<std::optional<bufpool::BufferChain>> line =
//         conn->lines.Next(conn->in);
//     if (!line.ok()) { ... too long: reply with line.status(), close ... }
//     if (!line->has_value()) break;  // the rest has not arrived yet
//     Handle(**line);                 // the line's slices; no copy
//   }
//   // or, handing out views, every complete line in one call (fastest):
//   absl::Status s = conn->lines.ForEachLine(
//       conn->in, [&](absl::string_view line) { Handle(line); });
//
// examples/asio_line_server.cc is the same loop on Asio.
//
// Ownership. A frame a splitter returns owns its slices: it may outlive
// `in`, travel to another thread and be dropped there; its buffers go back
// to their pool when the last slice of them is gone. A partial frame stays
// in `in` and holds exactly its own bytes (plus the rest of the buffers it
// lies in, as any slice does).
//
// Thread safety. A ChainCursor, LineSplitter or LengthPrefixSplitter is a
// value used by one thread at a time, as is the chain it reads.
#ifndef BUFPOOL_CURSOR_H_
#define BUFPOOL_CURSOR_H_

#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <optional>
#include <string>
#include <type_traits>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "bufpool/chain.h"
#include "bufpool/export.h"

namespace bufpool {

// A read position in a chain. It never changes the chain, and it is valid
// only while the chain is not modified (any Append, Consume, Split, Clear or
// move of the chain invalidates it: make a new one). Reads that fit in the
// current slice are a bounds check and a load; a read that crosses into the
// next slice copies its few bytes.
//
// Thread safety: one thread at a time, like the chain it reads.
class BUFPOOL_EXPORT ChainCursor {
 public:
  // At the chain's first byte. The chain must outlive the cursor.
  explicit ChainCursor(const BufferChain& chain) : chain_(&chain) {
    if (chain.slice_count() != 0) {
      const SharedBuffer& s = chain.slice(0);
      begin_ = p_ = s.data();
      end_ = begin_ + s.size();  // a chain holds no empty slice
    }
  }

  // Bytes before the cursor, and after it.
  size_t position() const { return before_ + static_cast<size_t>(p_ - begin_); }
  size_t remaining() const { return chain_->size() - position(); }

  // Moves forward n bytes; false (and no move) when fewer remain.
  bool Skip(size_t n);

  // The fixed-width integer (uint8_t..uint64_t, int8_t..int64_t) at the
  // cursor, little- or big-endian; Read* moves past it. nullopt (and no
  // move) when fewer than sizeof(T) bytes remain.
  template <class T>
  std::optional<T> ReadLE() {
    return ReadInt<T, false, true>();
  }
  template <class T>
  std::optional<T> ReadBE() {
    return ReadInt<T, true, true>();
  }
  template <class T>
  std::optional<T> PeekLE() const {
    return const_cast<ChainCursor*>(this)->ReadInt<T, false, false>();
  }
  template <class T>
  std::optional<T> PeekBE() const {
    return const_cast<ChainCursor*>(this)->ReadInt<T, true, false>();
  }

  // Copies min(out.size(), remaining()) bytes into `out` and moves past
  // them; returns how many.
  size_t Read(absl::Span<std::byte> out);

  // The rest of the current slice (empty only at the end of the chain): the
  // bytes readable in place. Skip(Contiguous().size()) moves to the next
  // slice.
  absl::Span<const std::byte> Contiguous() const {
    return {p_, static_cast<size_t>(end_ - p_)};
  }

  // The offset from position() of the first `byte`, or of the first
  // occurrence of `needle`, lying wholly within the next `limit` bytes;
  // nullopt when there is none. An empty needle is found at 0. The cursor
  // does not move.
  std::optional<size_t> Find(std::byte byte, size_t limit = SIZE_MAX) const;
  std::optional<size_t> Find(absl::string_view needle,
                             size_t limit = SIZE_MAX) const;

 private:
  // Steps to the next non-empty slice, or to the chain's end.
  void NextSlice();
  // Copies n bytes from the cursor into out and moves past them (advance)
  // or not; false when fewer remain.
  bool CopyOut(void* out, size_t n, bool advance);
  // Whether the bytes from the cursor start with `s` (at least s.size()
  // remain).
  bool StartsWith(absl::string_view s) const;

  template <class T, bool kBig, bool kAdvance>
  std::optional<T> ReadInt() {
    static_assert(
        std::is_integral_v<T> && !std::is_same_v<T, bool> && sizeof(T) <= 8,
        "ReadLE/ReadBE/PeekLE/PeekBE read 1- to 8-byte integers");
    using U = std::make_unsigned_t<T>;
    U u;
    if (static_cast<size_t>(end_ - p_) > sizeof(T)) [[likely]] {
      std::memcpy(&u, p_, sizeof(T));
      if constexpr (kAdvance) p_ += sizeof(T);
    } else if (!CopyOut(&u, sizeof(T), kAdvance)) {
      return std::nullopt;
    }
    if constexpr ((std::endian::native == std::endian::big) != kBig &&
                  sizeof(T) > 1) {
      u = ByteSwap(u);
    }
    return static_cast<T>(u);
  }
  template <class U>
  static U ByteSwap(U u) {
    if constexpr (sizeof(U) == 2) return __builtin_bswap16(u);
    if constexpr (sizeof(U) == 4) return __builtin_bswap32(u);
    if constexpr (sizeof(U) == 8) return __builtin_bswap64(u);
  }

  // Invariant: p_ < end_ (the current slice has a byte to read) unless the
  // cursor is at the chain's end.
  const BufferChain* chain_;
  size_t slice_ = 0;                  // the current slice's index
  size_t before_ = 0;                 // bytes in the slices before it
  const std::byte* begin_ = nullptr;  // the current slice
  const std::byte* p_ = nullptr;
  const std::byte* end_ = nullptr;
};

struct LineSplitterOptions {
  // The longest line accepted, not counting its "\r\n" or "\n".
  size_t max_line = 64 * 1024;
  // Lines exclude their "\n" and a "\r" just before it; false: returned as
  // received.
  bool strip_delimiter = true;
};

// Cuts lines ending in "\n" off the front of a chain.
//
// Next() returns the next complete line as a chain of slices of `in` (no
// copy) and removes it, with its delimiter, from `in`; nullopt when `in`
// holds no complete line yet. NextView() is the same for a caller that is
// done with each line before asking for the next: the line as a view, with
// no chain made and no reference counted per line (see below).
//
// A line longer than max_line bytes, or max_line + 2 bytes with no "\n"
// among them, is an OutOfRange error naming the limit and what was seen;
// `in` is unchanged (the caller usually answers and closes the connection).
//
// State: the splitter remembers how many bytes at the front of `in` it has
// searched without finding "\n" (searched()), so a line arriving in many
// pieces is searched once in all, not once per piece. Use one splitter per
// input chain; if the chain is changed other than by appending to it and
// calling Next()/NextView(), call Reset() first.
//
// Thread safety: one thread at a time, with its input chain.
class BUFPOOL_EXPORT LineSplitter {
 public:
  using Options = LineSplitterOptions;
  LineSplitter() = default;
  explicit LineSplitter(const Options& options) : options_(options) {}

  absl::StatusOr<std::optional<BufferChain>> Next(BufferChain& in);

  // The next line as a view of its bytes, removed from `in` as Next() does.
  // The view stays valid until the next call of NextView(), Next() or
  // Reset(), or the splitter's destruction, whatever happens to `in`
  // meanwhile: the splitter keeps a reference to the buffer the line lies
  // in (taken once per slice, not per line), and a line that crosses slices
  // is copied into the splitter's own storage. A call that finds no
  // complete line (or fails) lets both go, keeping at most kKeptCopy bytes
  // of storage, so the splitter of an idle connection holds no pool buffer
  // and next to no heap, whatever lines came before.
  absl::StatusOr<std::optional<absl::string_view>> NextView(BufferChain& in);

  // Calls fn(absl::string_view line) for every complete line in `in`, in
  // order, removing each (the loop a receive handler runs, in one call:
  // lines inside one slice are found by a memchr loop and removed together).
  // A view is valid during its call; fn must not change `in`. Returns OK
  // when no complete line is left, or the too-long error of Next() (the
  // lines before it were handed out and removed; the rest is unchanged).
  // fn may return bool: false stops the loop after that line (removed, as
  // every line handed out is; the lines after it stay in `in`), and
  // ForEachLine returns OK, so a handler whose reply fails can stop there.
  // On return the splitter holds no pool buffer and at most kKeptCopy bytes
  // of storage for lines that crossed slices.
  template <class Fn>
  absl::Status ForEachLine(BufferChain& in, Fn&& fn);

  void Reset() {
    searched_ = 0;
    Settle();
  }
  size_t searched() const { return searched_; }
  const Options& options() const { return options_; }
  // Storage for lines that crossed slices kept between lines; a larger copy
  // is freed once its line is done with.
  static constexpr size_t kKeptCopy = 256;

 private:
  struct Found {
    size_t length;  // the line's bytes, without the delimiter
    size_t end;     // through its "\n"
  };
  absl::StatusOr<std::optional<Found>> Locate(const BufferChain& in);
  absl::StatusOr<std::optional<absl::string_view>> NextViewSlow(
      BufferChain& in);
  // Lets go of what the last view needed: its buffer, and a copy larger
  // than kKeptCopy.
  void Settle() {
    held_.Reset();
    if (copy_.capacity() > kKeptCopy) [[unlikely]]
      std::string().swap(copy_);
  }

  Options options_;
  size_t searched_ = 0;
  SharedBuffer held_;  // NextView(): the buffer of the last view
  std::string copy_;   // NextView(): a line that crossed slices
};

// The common case inline: a whole line at the front of the first slice,
// found with one memchr over that slice.
inline absl::StatusOr<std::optional<absl::string_view>> LineSplitter::NextView(
    BufferChain& in) {
  if (searched_ == 0 && !in.empty()) {
    const SharedBuffer& front = in.slice(0);
    const size_t max_line = options_.max_line;
    const size_t window = max_line > SIZE_MAX - 2 ? SIZE_MAX : max_line + 2;
    const size_t n = front.size() < window ? front.size() : window;
    const char* p = reinterpret_cast<const char*>(front.data());
    if (const void* hit = std::memchr(p, '\n', n)) {
      const size_t nl = static_cast<size_t>(static_cast<const char*>(hit) - p);
      const size_t length = nl - (nl > 0 && p[nl - 1] == '\r' ? 1 : 0);
      if (length <= max_line) [[likely]] {
        // Keeps the slice's buffer alive past the Consume(); one reference
        // for all the lines of a slice.
        if (held_.pool() != front.pool() || held_.slot() != front.slot())
          held_ = front;
        in.Consume(nl + 1);
        return absl::string_view(p, options_.strip_delimiter ? length : nl + 1);
      }
    }
  }
  return NextViewSlow(in);
}

template <class Fn>
absl::Status LineSplitter::ForEachLine(BufferChain& in, Fn&& fn) {
  // One line to fn; false when fn returned false (a void fn never stops).
  const auto give = [&fn](absl::string_view line) {
    if constexpr (std::is_same_v<std::invoke_result_t<Fn&, absl::string_view>,
                                 bool>) {
      return fn(line);
    } else {
      fn(line);
      return true;
    }
  };
  const size_t max_line = options_.max_line;
  const size_t window = max_line > SIZE_MAX - 2 ? SIZE_MAX : max_line + 2;
  for (;;) {
    if (searched_ == 0 && !in.empty()) {
      // The lines that lie wholly in the first slice, then one Consume().
      const SharedBuffer& front = in.slice(0);
      const char* const begin = reinterpret_cast<const char*>(front.data());
      const char* const end = begin + front.size();
      const char* p = begin;
      for (;;) {
        const size_t rest = static_cast<size_t>(end - p);
        const void* hit = std::memchr(p, '\n', rest < window ? rest : window);
        if (hit == nullptr) break;
        const char* nl = static_cast<const char*>(hit);
        const size_t length =
            static_cast<size_t>(nl - p) - (nl > p && nl[-1] == '\r' ? 1 : 0);
        if (length > max_line) break;  // NextView() below reports it
        const bool more = give(absl::string_view(
            p, options_.strip_delimiter ? length
                                        : static_cast<size_t>(nl + 1 - p)));
        p = nl + 1;
        if (!more) {
          in.Consume(static_cast<size_t>(p - begin));
          Settle();
          return absl::OkStatus();
        }
      }
      if (p != begin) {
        in.Consume(static_cast<size_t>(p - begin));
        continue;
      }
      // A line that ends in the second slice: copied, found with a memchr.
      const size_t rest = static_cast<size_t>(end - p);
      if (in.slice_count() > 1 && rest < window) {
        const SharedBuffer& next = in.slice(1);
        const char* q = reinterpret_cast<const char*>(next.data());
        const size_t room = window - rest;
        const void* hit =
            std::memchr(q, '\n', next.size() < room ? next.size() : room);
        if (hit != nullptr) {
          const size_t k =
              static_cast<size_t>(static_cast<const char*>(hit) - q);
          copy_.assign(p, rest).append(q, k + 1);  // through the "\n"
          const size_t all = rest + k + 1;
          const size_t length =
              all - 1 - (all > 1 && copy_[all - 2] == '\r' ? 1 : 0);
          if (length <= max_line) {
            const bool more = give(absl::string_view(
                copy_.data(), options_.strip_delimiter ? length : all));
            in.Consume(all);
            if (!more) {
              Settle();
              return absl::OkStatus();
            }
            continue;
          }
        }
      }
    }
    // A line that crosses slices, a partial one, or an error.
    absl::StatusOr<std::optional<absl::string_view>> line = NextViewSlow(in);
    if (!line.ok() || !line->has_value() || !give(**line)) {
      Settle();  // no view outlives the call
      return line.status();
    }
  }
}

// Cuts frames that carry their own length off the front of a chain (the
// shape of Netty's LengthFieldBasedFrameDecoder):
//
//   | length_offset bytes | length field (length_bytes) | L bytes ... |
//   L = field value + length_adjustment
//   frame = length_offset + length_bytes + L bytes, of which the first
//           strip_bytes are dropped from what Next() returns.
//
// Next() returns the next complete frame as a chain of slices of `in` (no
// copy) and removes the whole frame from `in`; nullopt when `in` does not
// hold it all yet. Errors, with `in` unchanged:
//   InvalidArgument  bad options (length_bytes not 1, 2, 3, 4 or 8), or a
//                    frame length that the adjustment takes below the end of
//                    the length field or below strip_bytes;
//   OutOfRange       a frame longer than max_frame bytes (the message names
//                    the limit and the length seen). The field value plus
//                    the adjustment is computed without wrapping, so a
//                    field near 2^64 is too long, never short.
// The splitter keeps no state: the header is read again on each call (a
// few loads).
struct BUFPOOL_EXPORT LengthPrefixSplitter {
  size_t length_offset = 0;
  size_t length_bytes = 4;
  bool big_endian = true;
  int64_t length_adjustment = 0;
  size_t strip_bytes = 0;
  size_t max_frame = 16 << 20;

  // Cost, when the header lies in the front slice: a few loads and one cut
  // (inline; about one atomic add per buffer, and one subtraction when the
  // frame is dropped).
  absl::StatusOr<std::optional<BufferChain>> Next(BufferChain& in) const;

  // Calls fn(absl::string_view frame) for every complete frame in `in`, in
  // order (the bytes Next() would return, after strip_bytes), and removes
  // them: for a handler that is done with each frame when fn returns. A
  // frame inside one slice is a view of it (no chain made, no reference
  // counted, the frames of a slice removed together); one that crosses
  // slices is copied into `scratch` (the caller's, kept across calls: it
  // grows to the longest such frame). A view is valid during its call; fn
  // must not change `in`. Returns the frames handed out, or Next()'s error
  // (the frames before it handed out and removed, the rest unchanged).
  template <class Fn>
  absl::StatusOr<size_t> ForEachFrame(BufferChain& in, std::string& scratch,
                                      Fn&& fn) const;

  // The size of the frame at the front of `in` (header included) as soon as
  // its header is in, whether or not the rest has come: what a reader asks
  // an AdmissionQueue (bufpool/admission.h) for, all or nothing, before it
  // receives the rest. nullopt while the header is incomplete; Next()'s
  // errors (InvalidArgument, OutOfRange past max_frame), `in` unchanged.
  absl::StatusOr<std::optional<size_t>> FrameSize(const BufferChain& in) const;

 private:
  // Next() past its inline case: the frame measured in full.
  absl::StatusOr<std::optional<BufferChain>> NextSlow(BufferChain& in) const;
  // The size of the frame at the front of `in` (header included), nullopt
  // while `in` does not hold all of it; Next()'s errors.
  absl::StatusOr<std::optional<size_t>> Measure(const BufferChain& in) const;
  // The front frame copied into `scratch` and removed from `in`, as a view
  // past strip_bytes; nullopt while incomplete; Next()'s errors.
  absl::StatusOr<std::optional<absl::string_view>> CopyCrossing(
      BufferChain& in, std::string& scratch) const;
  // The field at `p` (length_bytes of 1, 2, 4 or 8; 0 for any other, which
  // the slow path reads or refuses).
  uint64_t LoadField(const std::byte* p) const {
    uint64_t v = 0;
    switch (length_bytes) {
      case 1:
        return static_cast<uint8_t>(*p);
      case 2: {
        uint16_t x;
        std::memcpy(&x, p, 2);
        v = big_endian ? __builtin_bswap16(x) : x;
        return v;
      }
      case 4: {
        uint32_t x;
        std::memcpy(&x, p, 4);
        v = big_endian ? __builtin_bswap32(x) : x;
        return v;
      }
      case 8: {
        uint64_t x;
        std::memcpy(&x, p, 8);
        return big_endian ? __builtin_bswap64(x) : x;
      }
      default:
        return 0;
    }
  }
};

// The common case: the header inside the front slice, its field read in
// place (as ForEachFrame() does), and the frame all in `in`.
inline absl::StatusOr<std::optional<BufferChain>> LengthPrefixSplitter::Next(
    BufferChain& in) const {
  if ((length_bytes == 1 || length_bytes == 2 || length_bytes == 4 ||
       length_bytes == 8) &&
      length_adjustment == 0 && length_offset <= 64 && !in.empty()) {
    const SharedBuffer& front = in.slice(0);
    const size_t header = length_offset + length_bytes;
    if (front.size() >= header) {
      const uint64_t field = LoadField(front.data() + length_offset);
      if (field <= max_frame && header + field <= max_frame &&
          header + field >= strip_bytes && header + field <= in.size()) {
        const size_t size = header + static_cast<size_t>(field);
        if (strip_bytes != 0) in.Consume(strip_bytes);
        return internal::ChainAccess::SplitFront(in, size - strip_bytes);
      }
    }
  }
  return NextSlow(in);
}

template <class Fn>
absl::StatusOr<size_t> LengthPrefixSplitter::ForEachFrame(BufferChain& in,
                                                          std::string& scratch,
                                                          Fn&& fn) const {
  size_t count = 0;
  const bool fast = (length_bytes == 1 || length_bytes == 2 ||
                     length_bytes == 4 || length_bytes == 8) &&
                    length_offset <= 64 && length_adjustment == 0;
  const size_t header = length_offset + length_bytes;
  while (!in.empty()) {
    // Frames inside the front slice: read in place, removed together.
    size_t pos = 0;
    if (fast) {
      const SharedBuffer& front = in.slice(0);
      const std::byte* const p = front.data();
      const size_t avail = front.size();
      while (avail - pos >= header) {
        const uint64_t field = LoadField(p + pos + length_offset);
        // Anything odd (too long, shorter than strip_bytes, past the slice)
        // goes to the general path below, which reports it.
        if (field > max_frame || header + field > max_frame ||
            header + field < strip_bytes || header + field > avail - pos) {
          break;
        }
        const size_t size = header + static_cast<size_t>(field);
        fn(absl::string_view(
            reinterpret_cast<const char*>(p) + pos + strip_bytes,
            size - strip_bytes));
        pos += size;
        ++count;
      }
    }
    if (pos != 0) {
      in.Consume(pos);
      continue;
    }
    absl::StatusOr<std::optional<absl::string_view>> crossing =
        CopyCrossing(in, scratch);
    if (!crossing.ok()) return crossing.status();
    if (!crossing->has_value()) break;
    fn(**crossing);
    ++count;
  }
  return count;
}

// Appends the low `bytes` (1 to 8) bytes of `value` to `out`, little- or
// big-endian, as BufferChain::Append(bytes) does (into the tail's room or a
// fresh buffer of out.pool()). InvalidArgument when `bytes` is out of range
// or `value` does not fit in it; Append's errors otherwise (the chain is
// unchanged on any error).
BUFPOOL_EXPORT absl::Status AppendLE(BufferChain& out, uint64_t value,
                                     size_t bytes);
BUFPOOL_EXPORT absl::Status AppendBE(BufferChain& out, uint64_t value,
                                     size_t bytes);

// A length field reserved in a chain now and written once the frame's size
// is known:
//
//   auto len = bufpool::LengthField::Reserve(frame, 4);   // 4 zero bytes
//   ... append the body to `frame` ...
//   len->Write(frame, len->BytesAfter(frame));            // fills them in
//
// The field is the bytes [offset(), offset() + bytes()) of the chain,
// counted from its front: between Reserve() and Write() the chain may grow
// at its end (Append of bytes, slices or chains) but must not lose bytes at
// its front. Reserve() places the field in buffers only this chain refers
// to (as Append(bytes) does), and Write() checks that they still are:
// FailedPrecondition when a Clone() or Split() has shared them since, as
// writing would change bytes someone else holds.
class BUFPOOL_EXPORT LengthField {
 public:
  // Appends `bytes` (1 to 8) zero bytes to `out` for the field.
  // InvalidArgument for a bad width; Append's errors otherwise.
  static absl::StatusOr<LengthField> Reserve(BufferChain& out, size_t bytes,
                                             bool big_endian = true);

  size_t offset() const { return offset_; }
  size_t bytes() const { return bytes_; }
  // Bytes the chain holds after the field: the usual value of a length
  // prefix.
  size_t BytesAfter(const BufferChain& out) const {
    return out.size() - offset_ - bytes_;
  }
  // Writes `value` into the field. InvalidArgument when it does not fit in
  // bytes(); FailedPrecondition when the chain is shorter than the field's
  // end or the field's bytes are shared (nothing is written then).
  absl::Status Write(BufferChain& out, uint64_t value) const;

 private:
  LengthField(size_t offset, size_t bytes, bool big_endian)
      : offset_(offset), bytes_(bytes), big_endian_(big_endian) {}
  size_t offset_;
  size_t bytes_;
  bool big_endian_;
};

}  // namespace bufpool

#endif  // BUFPOOL_CURSOR_H_

// LineSplitter and LengthPrefixSplitter (bufpool/cursor.h).
#include <algorithm>
#include <cstring>
#include <limits>
#include <string>

#include "absl/strings/str_cat.h"
#include "bufpool/cursor.h"

namespace bufpool {

namespace {

// The byte at `offset` (< chain.size()).
std::byte ByteAt(const BufferChain& chain, size_t offset) {
  ChainCursor c(chain);
  c.Skip(offset);
  return static_cast<std::byte>(*c.PeekLE<uint8_t>());
}

}  // namespace

absl::StatusOr<std::optional<LineSplitter::Found>> LineSplitter::Locate(
    const BufferChain& in) {
  const size_t max_line = options_.max_line;
  // A line of max_line bytes may end in "\r\n": its "\n" lies within the
  // first max_line + 2 bytes.
  const size_t window = max_line > SIZE_MAX - 2 ? SIZE_MAX : max_line + 2;
  if (searched_ > in.size()) searched_ = 0;  // the chain was changed
  const size_t end = std::min(window, in.size());
  std::optional<size_t> hit;
  bool cr = false;  // a "\r" before the "\n"
  if (searched_ < end) {
    ChainCursor c(in);
    c.Skip(searched_);
    hit = c.Find(std::byte{'\n'}, end - searched_);
    if (!hit) {
      searched_ = end;
    } else if (*hit > 0) {  // the byte before it, read from here
      c.Skip(*hit - 1);
      cr = *c.PeekLE<uint8_t>() == '\r';
    } else if (searched_ > 0) {
      cr = ByteAt(in, searched_ - 1) == std::byte{'\r'};
    }
  }
  if (!hit) {
    if (searched_ < window) return std::nullopt;
    return absl::OutOfRangeError(absl::StrCat(
        "LineSplitter: no \"\\n\" within ", window, " bytes (max_line ",
        max_line, "); ", in.size(), " bytes waiting"));
  }
  const size_t nl = searched_ + *hit;  // where the "\n" is
  const size_t length = nl - (cr ? 1 : 0);
  if (length > max_line) {
    return absl::OutOfRangeError(
        absl::StrCat("LineSplitter: a line of ", length,
                     " bytes exceeds max_line ", max_line));
  }
  searched_ = 0;
  return Found{options_.strip_delimiter ? length : nl + 1, nl + 1};
}

absl::StatusOr<std::optional<BufferChain>> LineSplitter::Next(BufferChain& in) {
  held_.Reset();
  absl::StatusOr<std::optional<Found>> found = Locate(in);
  if (!found.ok()) return found.status();
  if (!found->has_value()) return std::nullopt;
  const auto [length, end] = **found;
  absl::StatusOr<std::optional<BufferChain>> line =
      internal::ChainAccess::SplitFront(in, length);
  in.Consume(end - length);
  return line;
}

absl::StatusOr<std::optional<absl::string_view>> LineSplitter::NextViewSlow(
    BufferChain& in) {
  absl::StatusOr<std::optional<Found>> found = Locate(in);
  if (!found.ok() || !found->has_value()) {
    Settle();  // the last view is done with: an idle splitter holds nothing
    if (!found.ok()) return found.status();
    return std::nullopt;
  }
  const auto [length, end] = **found;
  const SharedBuffer& front = in.slice(0);
  absl::string_view line;
  if (length <= front.size()) {
    // Keep the front slice's buffer alive past the Consume() below; one
    // reference for all the lines of a slice.
    if (held_.pool() != front.pool() || held_.slot() != front.slot())
      held_ = front;
    line = front.view().substr(0, length);
  } else {
    held_.Reset();
    copy_.resize(length);
    ChainCursor c(in);
    c.Read(absl::MakeSpan(reinterpret_cast<std::byte*>(copy_.data()), length));
    line = copy_;
  }
  in.Consume(end);
  return line;
}

namespace {

// The length field's value: `bytes` bytes at the cursor.
uint64_t ReadField(ChainCursor& c, size_t bytes, bool big_endian) {
  switch (bytes) {
    case 1:
      return *c.ReadLE<uint8_t>();
    case 2:
      return big_endian ? *c.ReadBE<uint16_t>() : *c.ReadLE<uint16_t>();
    case 4:
      return big_endian ? *c.ReadBE<uint32_t>() : *c.ReadLE<uint32_t>();
    case 8:
      return big_endian ? *c.ReadBE<uint64_t>() : *c.ReadLE<uint64_t>();
    default: {  // 3
      std::byte b[3];
      c.Read(absl::MakeSpan(b));
      uint64_t v = 0;
      for (int i = 0; i < 3; ++i) {
        const uint64_t byte = static_cast<uint8_t>(b[big_endian ? i : 2 - i]);
        v = (v << 8) | byte;
      }
      return v;
    }
  }
}

}  // namespace

absl::StatusOr<std::optional<size_t>> LengthPrefixSplitter::Measure(
    const BufferChain& in) const {
  absl::StatusOr<std::optional<size_t>> size = FrameSize(in);
  if (size.ok() && size->has_value() && in.size() < **size) {
    return std::nullopt;
  }
  return size;
}

absl::StatusOr<std::optional<size_t>> LengthPrefixSplitter::FrameSize(
    const BufferChain& in) const {
  if (length_bytes != 1 && length_bytes != 2 && length_bytes != 3 &&
      length_bytes != 4 && length_bytes != 8) [[unlikely]] {
    return absl::InvalidArgumentError(
        absl::StrCat("LengthPrefixSplitter: length_bytes is ", length_bytes,
                     "; it must be 1, 2, 3, 4 or 8"));
  }
  if (length_offset > SIZE_MAX - 8) [[unlikely]] {
    return absl::InvalidArgumentError(absl::StrCat(
        "LengthPrefixSplitter: length_offset ", length_offset, " too large"));
  }
  const size_t header = length_offset + length_bytes;
  if (in.size() < header) return std::nullopt;
  ChainCursor c(in);
  c.Skip(length_offset);
  const uint64_t field = ReadField(c, length_bytes, big_endian);
  // In 128 bits, so no field and adjustment can wrap around.
  const __int128 frame = static_cast<__int128>(header) + field +
                         static_cast<__int128>(length_adjustment);
  if (frame < static_cast<__int128>(header) ||
      frame < static_cast<__int128>(strip_bytes)) [[unlikely]] {
    return absl::InvalidArgumentError(absl::StrCat(
        "LengthPrefixSplitter: length field ", field, " with adjustment ",
        length_adjustment, " makes a frame of ", static_cast<int64_t>(frame),
        " bytes, shorter than its ", header, "-byte header or the ",
        strip_bytes, " bytes to strip"));
  }
  if (frame > static_cast<__int128>(max_frame)) [[unlikely]] {
    // frame fits in 65 bits (field < 2^64, the rest < 2^64).
    const unsigned __int128 u = static_cast<unsigned __int128>(frame);
    const std::string seen = u > std::numeric_limits<uint64_t>::max()
                                 ? std::string("more than 2^64 - 1")
                                 : absl::StrCat(static_cast<uint64_t>(u));
    return absl::OutOfRangeError(absl::StrCat(
        "LengthPrefixSplitter: a frame of ", seen, " bytes (length field ",
        field, ") exceeds max_frame ", max_frame));
  }
  return static_cast<size_t>(frame);
}

absl::StatusOr<std::optional<BufferChain>> LengthPrefixSplitter::NextSlow(
    BufferChain& in) const {
  absl::StatusOr<std::optional<size_t>> size = Measure(in);
  if (!size.ok()) return size.status();
  if (!size->has_value()) return std::nullopt;
  in.Consume(strip_bytes);
  return internal::ChainAccess::SplitFront(in, **size - strip_bytes);
}

absl::StatusOr<std::optional<absl::string_view>>
LengthPrefixSplitter::CopyCrossing(BufferChain& in,
                                   std::string& scratch) const {
  absl::StatusOr<std::optional<size_t>> size = Measure(in);
  if (!size.ok()) return size.status();
  if (!size->has_value()) return std::nullopt;
  scratch.resize(**size);
  in.CopyTo(absl::MakeSpan(reinterpret_cast<std::byte*>(scratch.data()),
                           scratch.size()));
  in.Consume(**size);
  return absl::string_view(scratch).substr(strip_bytes);
}

}  // namespace bufpool

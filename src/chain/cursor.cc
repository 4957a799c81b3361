// ChainCursor's out-of-line parts and the integer writers (bufpool/cursor.h).
#include "bufpool/cursor.h"

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace bufpool {

void ChainCursor::NextSlice() {
  // Called with p_ == end_; the chain's slices are never empty.
  if (slice_ + 1 >= chain_->slice_count()) return;  // at the end
  before_ += static_cast<size_t>(end_ - begin_);
  const SharedBuffer& s = chain_->slice(++slice_);
  begin_ = p_ = s.data();
  end_ = begin_ + s.size();
}

bool ChainCursor::Skip(size_t n) {
  if (n > remaining()) return false;
  for (;;) {
    const size_t here = static_cast<size_t>(end_ - p_);
    if (n < here) {
      p_ += n;
      return true;
    }
    n -= here;
    p_ = end_;
    NextSlice();
    if (n == 0) return true;
  }
}

bool ChainCursor::CopyOut(void* out, size_t n, bool advance) {
  if (n > remaining()) return false;
  if (!advance) {
    ChainCursor copy = *this;
    return copy.CopyOut(out, n, true);
  }
  auto* dst = static_cast<std::byte*>(out);
  while (n != 0) {
    const size_t take = std::min(n, static_cast<size_t>(end_ - p_));
    std::memcpy(dst, p_, take);
    dst += take;
    p_ += take;
    n -= take;
    if (p_ == end_) NextSlice();
  }
  return true;
}

size_t ChainCursor::Read(absl::Span<std::byte> out) {
  const size_t n = std::min(out.size(), remaining());
  CopyOut(out.data(), n, true);
  return n;
}

std::optional<size_t> ChainCursor::Find(std::byte byte, size_t limit) const {
  limit = std::min(limit, remaining());
  size_t done = 0;
  const std::byte* p = p_;
  const std::byte* end = end_;
  size_t seg = slice_;
  while (done < limit) {
    const size_t n = std::min(limit - done, static_cast<size_t>(end - p));
    if (const void* hit = std::memchr(p, static_cast<int>(byte), n)) {
      return done + static_cast<size_t>(static_cast<const std::byte*>(hit) - p);
    }
    done += n;
    if (done == limit) break;
    const SharedBuffer& s = chain_->slice(++seg);
    p = s.data();
    end = p + s.size();
  }
  return std::nullopt;
}

bool ChainCursor::StartsWith(absl::string_view s) const {
  ChainCursor c = *this;
  while (!s.empty()) {
    const size_t n = std::min(s.size(), static_cast<size_t>(c.end_ - c.p_));
    if (std::memcmp(c.p_, s.data(), n) != 0) return false;
    s.remove_prefix(n);
    c.p_ += n;
    if (c.p_ == c.end_) c.NextSlice();
  }
  return true;
}

std::optional<size_t> ChainCursor::Find(absl::string_view needle,
                                        size_t limit) const {
  if (needle.empty()) return 0;
  limit = std::min(limit, remaining());
  if (needle.size() > limit) return std::nullopt;
  // Within the current slice: one memmem. A match found there is the
  // first; none there means none starts before its last needle.size() - 1
  // bytes, and the search goes on from those, across the boundary.
  size_t at = 0;
  const size_t here = std::min(limit, static_cast<size_t>(end_ - p_));
  if (here >= needle.size()) {
    if (const void* hit = memmem(p_, here, needle.data(), needle.size())) {
      return static_cast<size_t>(static_cast<const std::byte*>(hit) - p_);
    }
    if (here == limit) return std::nullopt;
    at = here - needle.size() + 1;
  }
  // Candidates: each place the first byte occurs, leaving room for the rest.
  const size_t last_start = limit - needle.size();
  ChainCursor c = *this;
  c.Skip(at);
  for (;;) {
    std::optional<size_t> hit =
        c.Find(static_cast<std::byte>(needle[0]), last_start - at + 1);
    if (!hit) return std::nullopt;
    c.Skip(*hit);
    at += *hit;
    if (c.StartsWith(needle)) return at;
    c.Skip(1);
    ++at;
    if (at > last_start) return std::nullopt;
  }
}

// ---- Writing ----------------------------------------------------------------

namespace {

absl::Status CheckWidth(const char* what, uint64_t value, size_t bytes) {
  if (bytes < 1 || bytes > 8) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": width ", bytes, " bytes; it must be 1 to 8"));
  }
  if (bytes < 8 && (value >> (8 * bytes)) != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": ", value, " does not fit in ", bytes, " bytes"));
  }
  return absl::OkStatus();
}

// The low `bytes` bytes of value in the order asked for.
void Encode(uint64_t value, size_t bytes, bool big_endian, std::byte* out) {
  for (size_t i = 0; i < bytes; ++i) {
    const size_t shift = 8 * (big_endian ? bytes - 1 - i : i);
    out[i] = static_cast<std::byte>(value >> shift);
  }
}

absl::Status AppendInt(const char* what, BufferChain& out, uint64_t value,
                       size_t bytes, bool big_endian) {
  if (absl::Status s = CheckWidth(what, value, bytes); !s.ok()) return s;
  std::byte b[8];
  Encode(value, bytes, big_endian, b);
  return out.Append(absl::MakeConstSpan(b, bytes));
}

}  // namespace

absl::Status AppendLE(BufferChain& out, uint64_t value, size_t bytes) {
  return AppendInt("AppendLE", out, value, bytes, false);
}

absl::Status AppendBE(BufferChain& out, uint64_t value, size_t bytes) {
  return AppendInt("AppendBE", out, value, bytes, true);
}

absl::StatusOr<LengthField> LengthField::Reserve(BufferChain& out, size_t bytes,
                                                 bool big_endian) {
  if (absl::Status s = CheckWidth("LengthField::Reserve", 0, bytes); !s.ok())
    return s;
  const size_t offset = out.size();
  const std::byte zeros[8] = {};
  if (absl::Status s = out.Append(absl::MakeConstSpan(zeros, bytes)); !s.ok())
    return s;
  return LengthField(offset, bytes, big_endian);
}

absl::Status LengthField::Write(BufferChain& out, uint64_t value) const {
  if (absl::Status s = CheckWidth("LengthField::Write", value, bytes_); !s.ok())
    return s;
  if (out.size() < offset_ + bytes_) {
    return absl::FailedPreconditionError(
        absl::StrCat("LengthField::Write: the field is bytes [", offset_, ", ",
                     offset_ + bytes_, ") but the chain holds ", out.size()));
  }
  // Find the slices holding the field; check them all before writing.
  size_t seg = 0, start = 0;
  while (start + out.slice(seg).size() <= offset_)
    start += out.slice(seg++).size();
  const size_t first = seg, first_start = start;
  for (size_t end = offset_ + bytes_; start < end;) {
    if (out.slice(seg).use_count() != 1) {
      return absl::FailedPreconditionError(absl::StrCat(
          "LengthField::Write: the field's buffer (slot ",
          out.slice(seg).slot(),
          ") is shared since Reserve(); writing would change bytes "
          "another slice holds"));
    }
    start += out.slice(seg++).size();
  }
  std::byte b[8];
  Encode(value, bytes_, big_endian_, b);
  size_t at = offset_ - first_start;
  for (size_t i = 0, k = first; i < bytes_; ++k, at = 0) {
    const SharedBuffer& s = out.slice(k);
    const size_t n = std::min(bytes_ - i, s.size() - at);
    std::memcpy(s.mutable_data() + at, b + i, n);
    i += n;
  }
  return absl::OkStatus();
}

}  // namespace bufpool

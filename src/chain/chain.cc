// SharedBuffer's and BufferChain's out-of-line parts (bufpool/chain.h).
#include "bufpool/chain.h"

#include <algorithm>
#include <bit>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <new>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"

namespace bufpool {

void SharedBuffer::DieBadSlice(size_t offset, size_t length) const {
  if (pool_ == nullptr) {
    std::fprintf(stderr,
                 "bufpool: SharedBuffer::Slice(%zu, %zu) of an empty "
                 "SharedBuffer\n",
                 offset, length);
  } else {
    std::fprintf(stderr,
                 "bufpool: SharedBuffer::Slice(%zu, %zu) lies outside the "
                 "slice's %zu bytes\n",
                 offset, length, size_);
  }
  std::abort();
}

void SharedBuffer::ReleaseLast(BufferPool& pool, uint32_t slot) {
  internal::SharedAccess::ReleaseSlot(pool, slot);
}

// ---- BufferChain
// -------------------------------------------------------------

BufferChain& BufferChain::MoveAssignSlow(BufferChain& other) noexcept {
  if (this == &other) return *this;
  Clear();
  pool_ = other.pool_;
  budget_ = other.budget_;  // the slices keep the charge they made there
  const uint32_t packed = std::exchange(other.packed_, 0);
  if (slices_ == inline_) {
    StealFrom(other);
  } else if (other.slices_ != other.inline_) {
    // Both grown: swap the rings; `other` keeps ours, empty.
    std::swap(slices_, other.slices_);
    std::swap(cap_, other.cap_);
    head_ = std::exchange(other.head_, 0);
    count_ = std::exchange(other.count_, 0);
    size_ = std::exchange(other.size_, 0);
  } else {
    // `other`'s at most kInlineSlices slices move into our ring.
    for (uint32_t i = 0; i < other.count_; ++i) {
      const uint32_t at = (other.head_ + i) & (kInlineSlices - 1);
      Place(slices_[i], std::move(other.inline_[at]));
    }
    head_ = 0;
    count_ = std::exchange(other.count_, 0);
    other.head_ = 0;
    size_ = std::exchange(other.size_, 0);
  }
  packed_ = packed;
  return *this;
}

void BufferChain::DestroySlow() noexcept {
  Clear();
  FreeHeap();
}

void BufferChain::FreeHeap() noexcept {
  if (slices_ != inline_) {
    delete[] slices_;
    slices_ = inline_;
    cap_ = kInlineSlices;
    head_ = 0;
  }
}

void BufferChain::StealFrom(BufferChain& other) noexcept {
  size_ = std::exchange(other.size_, 0);
  packed_ = std::exchange(other.packed_, 0);
  if (other.slices_ != other.inline_) {
    slices_ = std::exchange(other.slices_, other.inline_);
    cap_ = std::exchange(other.cap_, kInlineSlices);
    head_ = std::exchange(other.head_, 0);
    count_ = std::exchange(other.count_, 0);
    return;
  }
  // Inline: move the slices, keeping their positions in the ring.
  for (uint32_t i = 0; i < other.count_; ++i) {
    const uint32_t at = (other.head_ + i) & (kInlineSlices - 1);
    Place(inline_[at], std::move(other.inline_[at]));
  }
  head_ = std::exchange(other.head_, 0);
  count_ = std::exchange(other.count_, 0);
}

void BufferChain::GrowTo(uint32_t cap) {
  if (cap <= cap_) throw std::bad_alloc();  // cap_ * 2 wrapped: 2^32 slices
  auto* segs = new SharedBuffer[cap];       // the only step that can throw
  for (uint32_t i = 0; i < count_; ++i) segs[i] = std::move(At(i));
  if (slices_ != inline_) delete[] slices_;
  slices_ = segs;
  cap_ = cap;
  head_ = 0;
}

void BufferChain::ReserveSlow(size_t segments) {
  if (segments > (size_t{1} << 31)) throw std::bad_alloc();
  GrowTo(static_cast<uint32_t>(std::bit_ceil(segments)));
}

void BufferChain::Clear() {
  // A bound chain's budget hears once, after every slice is dropped.
  const size_t released = budget_ != nullptr ? ReleaseRuns() : 0;
  while (count_ != 0) {
    At(count_ - 1).Reset();
    --count_;
  }
  head_ = 0;
  size_ = 0;
  if (released != 0) internal::BudgetAccess::Release(*budget_, released);
}

void BufferChain::DieBadPostallocate(size_t n) const {
  std::fprintf(stderr,
               "bufpool: BufferChain::Postallocate(%zu) past the %zu bytes "
               "of room Preallocate() gave\n",
               n, count_ == 0 ? size_t{0} : At(count_ - 1).room());
  std::abort();
}

bool BufferChain::ReceiveSlow(Buffer& buffer, size_t n,
                              const ReceiveOptions& options) {
  if (n == 0) return false;
  if (n > buffer.size()) DieTooLong(n, buffer.size());
  const std::byte* const src = buffer.data();
  if (options.copy_below != 0) {
    // A short partial: packed, pinning about its bytes, even when its tail
    // has room (a buffer of its own kept for a few bytes, or a pack buffer
    // whose other slices are gone): AppendPacked() moves it.
    if (options.pack != nullptr && size_ + n < options.copy_below &&
        AppendPackedSlow(src, n, *options.pack, /*arrived=*/true)) {
      return false;
    }
    const size_t room = TailRoom();
    if (room >= n) {
      std::memcpy(At(count_ - 1).data_ + At(count_ - 1).size_, src, n);
      Postallocate(n);
      return false;
    }
    // Room left empty inside the chain would let what it pins grow past
    // its bytes plus two buffers: fill it, and a fresh buffer the rest.
    if (room != 0 && Append(absl::MakeConstSpan(src, n)).ok()) return false;
  }
  Reserve(size_t{count_} + 1);
  AppendFilled(std::move(buffer), n);
  return true;
}

// Append() past its inline case (chain_inl.h).
absl::Status BufferChain::AppendSlow(absl::Span<const std::byte> bytes) {
  const size_t n = bytes.size();
  if (n == 0) return absl::OkStatus();
  const size_t room = std::min(n, TailRoom());
  const size_t rest = n - room;
  const uint32_t tail = count_;  // the first new slice, if any
  if (rest != 0) {
    if (pool_ == nullptr) {
      return absl::FailedPreconditionError(
          absl::StrCat("BufferChain::Append: ", rest,
                       " bytes need a fresh buffer but the chain has no pool"));
    }
    const size_t bs = pool_->buffer_size();
    const size_t need = (rest + bs - 1) / bs;
    // Each fresh buffer starts a run: need * bs more pinned.
    if (budget_ != nullptr && need * bs > budget_->room_bytes()) {
      return internal::BudgetAccess::Refuse(*budget_, "BufferChain::Append",
                                            need * bs);
    }
    // Take every buffer first, as empty slices, so a dry pool leaves the
    // chain as it was.
    for (size_t got = 0; got < need; ++got) {
      Buffer b = AcquireFresh();
      if (!b) {
        while (count_ != tail) PopBack();
        return absl::ResourceExhaustedError(absl::StrCat(
            "BufferChain::Append: the pool has no free buffer (", n,
            " bytes needed ", need, " buffers of ", bs, ", got ", got, ")"));
      }
      SharedBuffer s(std::move(b));
      s.size_ = 0;
      if (budget_ != nullptr) {
        PushFresh(std::move(s));  // ours alone: claimed with a store
      } else {
        PushBack(std::move(s));
      }
    }
  }
  const std::byte* src = bytes.data();
  if (room != 0) {
    SharedBuffer& t = At(tail - 1);
    std::memcpy(t.data_ + t.size_, src, room);
    t.size_ += room;
    src += room;
  }
  for (uint32_t i = tail; i < count_; ++i) {
    SharedBuffer& s = At(i);
    const size_t take =
        std::min<size_t>(pool_->buffer_size(), bytes.data() + n - src);
    std::memcpy(s.data_, src, take);
    s.size_ = take;
    src += take;
  }
  size_ += n;
  return absl::OkStatus();
}

void BufferChain::Append(SharedBuffer&& slice) {
  if (!slice || slice.size() == 0) {
    slice.Reset();
    return;
  }
  size_ += slice.size();
  PushBack(std::move(slice));
}

void BufferChain::DieTooLong(size_t length, size_t size) {
  std::fprintf(stderr,
               "bufpool: BufferChain::Append(buffer, %zu) of a buffer of %zu "
               "bytes\n",
               length, size);
  std::abort();
}

void BufferChain::DieBadIndex(size_t i) const {
  std::fprintf(stderr,
               "bufpool: BufferChain::slice(%zu) of a chain of %u slices\n", i,
               count_);
  std::abort();
}

void BufferChain::Append(Buffer&& buffer, size_t length) {
  if (length > buffer.size()) DieTooLong(length, buffer.size());
  if (length == 0) {
    buffer.Reset();
    return;
  }
  // A link (PushBack(), which claims the buffer only with room), not an
  // arrival: the buffer is already out of the pool.
  SharedBuffer s(std::move(buffer));
  s.size_ = length;
  size_ += length;
  PushBack(std::move(s));
}

void BufferChain::Append(BufferChain&& other) {
  if (&other == this) return;
  if (other.count_ == 0) return;
  Reserve(size_t{count_} + other.count_);  // then nothing below can throw
  if (budget_ != nullptr && budget_ == other.budget_) {
    // One budget: the charge stays, less a run where the two chains'
    // slices of one buffer now meet.
    bool pack = false;
    const size_t joined =
        count_ != 0 && SameBuffer(At(count_ - 1), other.At(0))
            ? UnlinkRun(other.At(0).pool_, other.At(0).slot_, true, &pack)
            : 0;
    BufferBudget* const b = budget_;
    budget_ = nullptr;  // no charge per slice
    for (size_t i = 0; i < other.count_; ++i) PushBack(std::move(other.At(i)));
    budget_ = b;
    packed_ += std::exchange(other.packed_, 0);
    size_ += other.size_;
    other.count_ = 0;
    other.head_ = 0;
    other.size_ = 0;
    if (pack || packed_ != 0) RecountPacked();
    if (joined != 0) internal::BudgetAccess::Release(*b, joined);
    return;
  } else {
    if (other.budget_ != nullptr) other.ReleaseAll();
    for (size_t i = 0; i < other.count_; ++i) PushBack(std::move(other.At(i)));
  }
  size_ += other.size_;
  other.count_ = 0;
  other.head_ = 0;
  other.size_ = 0;
}

size_t BufferChain::FillIovecs(absl::Span<iovec> out) const {
  const size_t k = std::min<size_t>(count_, out.size());
  for (size_t i = 0; i < k; ++i) {
    const SharedBuffer& s = At(i);
    out[i] = {s.data_, s.size_};
  }
  return k;
}

// A bound chain's consumed slices are all dropped first, then its budget
// hears once of the buffers whose runs ended: one charge update, and one
// look at the watermarks and the reserve, per Consume() rather than per
// buffer (a reserve refilling finds the buffers back in the pool).
void BufferChain::ConsumeSlow(size_t n) {
  n = std::min(n, size_);
  size_ -= n;
  size_t released = 0;
  bool pack = false;
  while (n != 0) {
    SharedBuffer& front = At(0);
    if (n < front.size_) {
      front.data_ += n;
      front.size_ -= n;
      break;
    }
    n -= front.size_;
    if (budget_ != nullptr) [[unlikely]] {
      released += UnlinkRun(front.pool_, front.slot_,
                            count_ == 1 || !SameBuffer(front, At(1)), &pack);
    }
    front.Reset();
    head_ = (head_ + 1) & (cap_ - 1);
    --count_;
  }
  if (budget_ == nullptr) return;
  // A packed front that shrank, or packed slices that went.
  if (pack || packed_ != 0) RecountPacked();
  if (released != 0) internal::BudgetAccess::Release(*budget_, released);
}

// Split() past its inline case: `first` is the empty chain it returns.
void BufferChain::SplitSlow(BufferChain& first, size_t n) {
  n = std::min(n, size_);
  const size_t cut = n;
  size_ -= n;
  first.size_ = n;
  size_t released = 0;
  bool pack = false;
  while (n != 0) {
    SharedBuffer& front = At(0);
    if (n < front.size_) {
      first.PushBack(ShareFront(n, cut));
      if (budget_ != nullptr && packed_ != 0) pack = true;  // front shrank
      break;
    }
    n -= front.size_;
    // The slice joins `first`'s run before it leaves this chain's, so a
    // buffer that both chains' runs hold stays counted throughout.
    const bool ends = count_ == 1 || !SameBuffer(front, At(1));
    BufferPool* const pool = front.pool_;
    const uint32_t slot = front.slot_;
    first.PushBack(std::move(front));
    head_ = (head_ + 1) & (cap_ - 1);
    --count_;
    if (budget_ != nullptr) released += UnlinkRun(pool, slot, ends, &pack);
  }
  if (pack) RecountPacked();
  if (released != 0) internal::BudgetAccess::Release(*budget_, released);
}

size_t BufferChain::CopyTo(absl::Span<std::byte> out) const {
  size_t done = 0;
  for (uint32_t i = 0; i < count_ && done < out.size(); ++i) {
    const SharedBuffer& s = At(i);
    const size_t take = std::min(s.size_, out.size() - done);
    std::memcpy(out.data() + done, s.data_, take);
    done += take;
  }
  return done;
}

BufferChain BufferChain::Clone() const {
  BufferChain copy;
  copy.pool_ = pool_;
  copy.budget_ = budget_;
  for (uint32_t i = 0; i < count_; ++i) copy.PushBack(SharedBuffer(At(i)));
  copy.size_ = size_;
  return copy;
}

// ---- Memory that follows bytes ---------------------------------------------

// ---- Budgets (bufpool/budget.h) ---------------------------------------------

void BufferChain::ReleaseAll() {
  const size_t released = ReleaseRuns();
  if (released != 0) internal::BudgetAccess::Release(*budget_, released);
}

// Unlinks every run, as if every slice left (they stay): the bytes to
// release, the packed ones among them; packed_ becomes 0.
size_t BufferChain::ReleaseRuns() {
  size_t released = std::exchange(packed_, 0);
  bool pack = false;
  for (uint32_t i = 0; i < count_; ++i) {
    const SharedBuffer& s = At(i);
    released += UnlinkRun(s.pool_, s.slot_,
                          i + 1 == count_ || !SameBuffer(s, At(i + 1)), &pack);
  }
  return released;
}

// Links every run, as if every slice arrived (they are here), with
// `credit` bytes released that the budget has not yet heard of: the bytes
// to charge, the packed ones among them (then in packed_, which was 0).
size_t BufferChain::ChargeRuns(size_t credit) {
  const size_t room = budget_->room_bytes() + credit;
  size_t charged = 0;
  for (uint32_t i = 0; i < count_; ++i) {
    const SharedBuffer& s = At(i);
    if (i != 0 && SameBuffer(At(i - 1), s)) continue;
    const uint32_t owner = internal::SharedAccess::Owner(*s.pool_, s.slot_)
                               .load(std::memory_order_relaxed);
    if (owner != internal::SharedAccess::kOwnerPack) {
      charged += LinkRun(s, owner, charged < room ? room - charged : 0);
    }
  }
  // Packed bytes count as far as there is room (see RecountPacked()).
  const size_t left = charged < room ? room - charged : 0;
  packed_ = static_cast<uint32_t>(std::min(PackedTarget(), left));
  return charged + packed_;
}

// Calls fn(first, end, bytes, copy) for each run [first, end) of adjacent
// slices of one buffer; `copy` when the run holds less than half of it.
template <typename Fn>
void BufferChain::ForEachRun(Fn&& fn) const {
  uint32_t i = 0;
  while (i < count_) {
    const SharedBuffer& first = At(i);
    size_t bytes = first.size_;
    uint32_t j = i + 1;
    for (; j < count_ && SameBuffer(At(j), first); ++j) bytes += At(j).size_;
    fn(i, j, bytes, bytes * 2 < first.pool_->buffer_size());
    i = j;
  }
}

size_t BufferChain::PackedTarget() const {
  size_t total = 0;
  ForEachRun([&](uint32_t first, uint32_t, size_t bytes, bool) {
    const SharedBuffer& s = At(first);
    if (internal::SharedAccess::Owner(*s.pool_, s.slot_)
            .load(std::memory_order_relaxed) ==
        internal::SharedAccess::kOwnerPack) {
      total += PackCharge(bytes);
    }
  });
  return std::min<size_t>(total, ~uint32_t{0} / 2);
}

// What ReleaseRuns() would release: the packed charge and each buffer this
// chain's runs alone hold for the budget.
size_t BufferChain::ReleasableBytes() const {
  size_t total = packed_;
  const uint32_t me = internal::BudgetAccess::OwnerId(*budget_);
  for (uint32_t i = 0; i < count_; ++i) {
    const SharedBuffer& s = At(i);
    if (i + 1 != count_ && SameBuffer(s, At(i + 1))) continue;
    if (internal::SharedAccess::Owner(*s.pool_, s.slot_)
            .load(std::memory_order_relaxed) == (me | 1)) {
      total += s.pool_->buffer_size();
    }
  }
  return total;
}

// Packed bytes that arrive with no room in the budget (linked from a chain
// of no budget, or received while it is full) are counted as far as there
// is room and the rest at a later recount: they stay, like a linked buffer
// no budget counts, out of the budget rather than over its limit.
void BufferChain::RecountPacked() {
  const size_t target = PackedTarget();
  if (target <= packed_) {
    const size_t less = packed_ - target;
    packed_ = static_cast<uint32_t>(target);
    if (less != 0) internal::BudgetAccess::Release(*budget_, less);
    return;
  }
  const size_t more = std::min(target - packed_, budget_->room_bytes());
  packed_ += static_cast<uint32_t>(more);
  if (more != 0) internal::BudgetAccess::Charge(*budget_, more);
}

void BufferChain::Settle(size_t charge, size_t release) {
  if (charge > release) {
    internal::BudgetAccess::Charge(*budget_, charge - release);
  } else if (release > charge) {
    internal::BudgetAccess::Release(*budget_, release - charge);
  }
}

size_t BufferChain::pinned_bytes() const {
  size_t total = 0;
  for (uint32_t i = 0; i < count_; ++i) {
    const SharedBuffer& s = At(i);
    if (i == 0 || !SameBuffer(At(i - 1), s)) total += s.pool_->buffer_size();
  }
  return total;
}

// Compact()'s first pass: the fresh buffers the copied bytes fill, in
// order; a linked run between two copied ones closes the fresh buffer being
// filled, so the slices of every buffer stay adjacent. *any: some run is
// copied.
size_t BufferChain::CompactNeed(size_t bs, bool* any) const {
  size_t need = 0;
  size_t fill = bs;  // bytes in the fresh buffer being filled; bs: none open
  *any = false;
  ForEachRun([&](uint32_t, uint32_t, size_t bytes, bool copy) {
    if (!copy) {
      fill = bs;
      return;
    }
    *any = true;
    for (size_t left = bytes; left != 0 && bs != 0;) {
      if (fill == bs) {
        ++need;
        fill = 0;
      }
      const size_t take = std::min(left, bs - fill);
      fill += take;
      left -= take;
    }
  });
  return need;
}

// Compact()'s second pass, into an unbound chain: kept slices move, copied
// ones fill `fresh` in order. Nothing fails or throws (the ring is reserved
// first).
BufferChain BufferChain::CompactInto(absl::Span<Buffer> fresh) {
  const size_t bs = pool_->buffer_size();
  BufferChain packed(*pool_);
  packed.Reserve(size_t{count_} + fresh.size());
  SharedBuffer cur;  // the open fresh buffer's slice
  size_t next = 0;
  auto flush = [&] {
    if (cur.size_ != 0) {
      packed.size_ += cur.size_;
      packed.PushBack(std::move(cur));
    }
    cur.Reset();
  };
  ForEachRun([&](uint32_t first, uint32_t end, size_t, bool copy) {
    for (uint32_t i = first; i < end; ++i) {
      SharedBuffer& s = At(i);
      if (!copy) {
        flush();
        packed.size_ += s.size_;
        packed.PushBack(std::move(s));
        continue;
      }
      for (size_t done = 0; done < s.size_;) {
        if (!cur || cur.size_ == bs) {
          flush();
          cur = SharedBuffer(std::move(fresh[next++]));
          cur.size_ = 0;
        }
        const size_t take = std::min(s.size_ - done, bs - cur.size_);
        std::memcpy(cur.data_ + cur.size_, s.data_ + done, take);
        cur.size_ += take;
        done += take;
      }
    }
  });
  flush();
  return packed;
}

absl::Status BufferChain::Compact() {
  const size_t bs = pool_ != nullptr ? pool_->buffer_size() : 0;
  bool any = false;
  const size_t need = CompactNeed(bs, &any);
  if (!any) return absl::OkStatus();
  if (pool_ == nullptr) {
    return absl::FailedPreconditionError(
        "BufferChain::Compact: slices to copy but the chain has no pool");
  }
  // The fresh buffers may not take the budget past its limit, counting
  // what the copied runs give back (a buffer that another of its chains
  // shares stays charged).
  if (budget_ != nullptr &&
      need * bs > budget_->room_bytes() + ReleasableBytes()) {
    return internal::BudgetAccess::Refuse(
        *budget_, "BufferChain::Compact", need * bs,
        "nothing was copied; consume or clear the budget's chains first");
  }
  std::vector<Buffer> fresh(need);
  size_t got = 0;
  if (budget_ == nullptr) {
    got = pool_->TryAcquireBulk(absl::MakeSpan(fresh));
  } else {
    while (got < need && (fresh[got] = AcquireFresh())) ++got;
  }
  if (got < need) {
    // What came from the budget's reserve goes back to it.
    if (budget_ != nullptr) {
      for (size_t i = 0; i < got; ++i) {
        internal::BudgetAccess::GiveBack(*budget_, std::move(fresh[i]));
      }
    }
    return absl::ResourceExhaustedError(absl::StrCat(
        "BufferChain::Compact: the pool has no free buffer (", need,
        " buffers of ", bs, " bytes needed, got ", got, ")"));
  }
  // The packed chain is built unbound and the budget hears of the change
  // once, at the end: the kept slices are moved out of this chain as it
  // goes, so it cannot release run by run, and a watermark callback sees
  // no dip between the two.
  BufferBudget* const budget = budget_;
  const size_t released = budget != nullptr ? ReleaseRuns() : 0;
  budget_ = nullptr;
  // Unbound while it moves: nothing is read from the moved-from slices.
  *this = CompactInto(absl::MakeSpan(fresh));
  budget_ = budget;
  if (budget != nullptr) Settle(ChargeRuns(released), released);
  return absl::OkStatus();
}

// ---- ReceivePack ------------------------------------------------------------
//
// Counts. The buffer's count is the pack's own reference, plus spare_
// references added in one relaxed fetch_add (made from the pack's own, so
// the count cannot reach 0 meanwhile), plus one per live slice, each of
// which took a spare without an atomic. So every slice of the buffer is
// gone exactly when the count is 1 + spare_; that load is acquire, pairing
// with the slices' release subtractions, so their reads of the bytes
// happen-before the pack writes over them again.

bool ReceivePack::MakeRoom(size_t len) {
  if (buf_) {
    if (buf_.size_ - used_ >= len) return true;
    if (internal::SharedAccess::Ref(*buf_.pool_, buf_.slot_)
            .load(std::memory_order_acquire) == 1 + spare_) {
      used_ = 0;  // every slice gone: fill it again, warm
      return true;
    }
  }
  Buffer fresh = pool_->TryAcquire();
  if (!fresh || fresh.size() < len) return false;
  Drop();  // the old buffer goes back with its last slice
  buf_ = SharedBuffer(std::move(fresh));
  // Chains count this buffer's slices by their bytes (chain_inl.h,
  // "Accounting"): marked while the pack holds it alone.
  internal::SharedAccess::Owner(*buf_.pool_, buf_.slot_)
      .store(internal::SharedAccess::kOwnerPack, std::memory_order_relaxed);
  // held_ mirrors bool(buf_) for holds_buffer() on other threads (a pool's
  // lender count): written here and in Drop() only, when the pack takes or
  // lets go of a buffer, never on the append path.
  held_.store(true, std::memory_order_relaxed);
  return true;
}

void ReceivePack::Drop() noexcept {
  if (!buf_) return;
  if (spare_ != 0) {
    // The pack's own reference stays, so this cannot take the count to 0.
    internal::SharedAccess::Ref(*buf_.pool_, buf_.slot_)
        .fetch_sub(spare_, std::memory_order_acq_rel);
  }
  buf_.Reset();
  held_.store(false, std::memory_order_relaxed);
  spare_ = 0;
  used_ = 0;
}

// `arrived`: for Receive(), bytes that have arrived already, packed even
// past the budget's limit (they would otherwise be linked, a buffer).
bool BufferChain::AppendPackedSlow(const std::byte* src, size_t len,
                                   ReceivePack& pack, bool arrived) {
  if (len == 0) return false;
  SharedBuffer& b = pack.buf_;
  // Onto the chain's own earlier pack bytes when they are in the current
  // buffer and it has room; otherwise the chain's bytes (a short partial
  // whose pack buffer filled, or that lies in a buffer of its own) move
  // with the new ones to where the pack writes now, as one slice, and what
  // they pinned goes back. They move too once the chain has as many slices
  // as it keeps inline (reads of many connections interleaved, each a
  // slice): a trickle never grows a heap ring of one-byte slices.
  bool move = false;
  if (count_ != 0) {
    const SharedBuffer& t = At(count_ - 1);
    move =
        !b || t.pool_ != b.pool_ || t.slot_ != b.slot_ ||
        b.size_ - pack.used_ < len ||
        (count_ >= kInlineSlices && t.data_ + t.size_ != b.data_ + pack.used_);
  }
  // A move copies the chain's bytes: at most an eighth of a buffer of them,
  // so a trickle of many connections costs a bounded copy per read.
  const size_t bs = pack.pool_->buffer_size();
  if (move && size_ > bs / 8) return false;
  const size_t total = move ? size_ + len : len;
  if (total > bs) return false;
  // The budget's room for the bytes (what a move releases is not counted:
  // a refusal errs on the side of the cap).
  if (budget_ != nullptr && !arrived &&
      budget_->room_bytes() < PackCharge(total)) {
    return false;
  }
  // MakeRoom() refills the current buffer from its start only when no
  // slice is left in it, so the chain's bytes are never written over.
  if ((count_ == 0 || move) && !pack.MakeRoom(total)) return false;
  if (!move) Reserve(size_t{count_} + 1);  // the only step that can throw
  if (pack.spare_ == 0) {
    internal::SharedAccess::Ref(*b.pool_, b.slot_)
        .fetch_add(ReceivePack::kRefBatch, std::memory_order_relaxed);
    pack.spare_ = ReceivePack::kRefBatch;
  }
  std::byte* const dst = b.data_ + pack.used_;
  const size_t moved = move ? CopyTo({dst, size_}) : 0;
  // Before the old slices go: `src` may lie in them.
  std::memcpy(dst + moved, src, len);
  pack.used_ += static_cast<uint32_t>(total);
  // Bytes past the pack's used ones belong to no slice: the tail grows over
  // them when it ends where they start (its own earlier pack bytes).
  if (!move && GrowTail(dst, len)) {
    if (budget_ != nullptr) RecountPacked();
    return true;
  }
  SharedBuffer s;
  s.pool_ = b.pool_;
  s.data_ = dst;
  s.size_ = total;
  s.slot_ = b.slot_;
  --pack.spare_;
  if (!move) {
    size_ += total;
    PushBack(std::move(s));
    return true;
  }
  // The old slices go and the new one comes as one change for the budget,
  // made once the pack's used_ covers the moved bytes: a watermark callback
  // (which may pack another chain's bytes) sees neither a dip below the low
  // mark nor the moved bytes where the pack would write next.
  BufferBudget* const budget = budget_;
  const size_t released = budget != nullptr ? ReleaseRuns() : 0;
  budget_ = nullptr;
  Clear();  // the ring keeps its capacity: the push below cannot throw
  size_ = total;
  PushBack(std::move(s));
  budget_ = budget;
  if (budget != nullptr) Settle(ChargeRuns(released), released);
  return true;
}

}  // namespace bufpool

// BufferBudget and the pool's commitments (bufpool/budget.h).
//
// What a pool has promised (reservations, ring lending) and which budgets
// it has live are kept beside the pool, in one process-wide table keyed by
// the pool, rather than in BufferPool itself: they change only when a
// budget or ring is made or destroyed, and the pool's hot paths never look
// at them. An entry goes when its pool's last budget and ring have gone.
#include "bufpool/budget.h"

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <unordered_map>
#include <utility>

#include "absl/strings/str_cat.h"
#include "bufpool/internal/shared_access.h"

namespace bufpool {
namespace {

struct Commitments {
  size_t reserved = 0;  // buffers held in budgets' reservations
  size_t lending = 0;   // the most buffers rings may lend at once
  size_t queued = 0;    // admission queues' capacities
  std::vector<const BufferBudget*> budgets;
  size_t promised() const { return reserved + lending + queued; }
  bool empty() const { return promised() == 0 && budgets.empty(); }
};

// Account ids of live budgets (BufferBudget::account_), guarded by
// BookMutex(): the next never used, and those given back.
uint32_t next_account = 1;
std::vector<uint32_t>& FreeAccounts() {
  static auto* const free = new std::vector<uint32_t>;
  return *free;
}

std::mutex& BookMutex() {
  static std::mutex* const mu = new std::mutex;  // never destroyed
  return *mu;
}

// Guarded by BookMutex().
std::unordered_map<const BufferPool*, Commitments>& Book() {
  static auto* const book =
      new std::unordered_map<const BufferPool*, Commitments>;
  return *book;
}

void DropIfEmpty(const BufferPool* pool) {
  auto it = Book().find(pool);
  if (it != Book().end() && it->second.empty()) Book().erase(it);
}

std::string Promised(const Commitments& c) {
  std::string s = absl::StrCat(c.reserved, " reserved by budgets and ",
                               c.lending, " lent to rings");
  if (c.queued != 0) {
    absl::StrAppend(&s, ", ", c.queued, " held by admission queues");
  }
  return s;
}

// The options' own consistency, before anything is made: InvalidArgument
// naming the field and the values.
absl::Status CheckBudgetOptions(const BudgetOptions& o, size_t bs,
                                const std::string& who) {
  if (o.max_bytes < bs) {
    return absl::InvalidArgumentError(
        absl::StrCat(who, ": max_bytes ", o.max_bytes,
                     " is less than one buffer (", bs, " bytes)"));
  }
  if (o.high_watermark != 0 &&
      (o.low_watermark >= o.high_watermark || o.high_watermark > o.max_bytes)) {
    return absl::InvalidArgumentError(absl::StrCat(
        who, ": watermarks must satisfy low < high <= max_bytes (low ",
        o.low_watermark, ", high ", o.high_watermark, ", max_bytes ",
        o.max_bytes, ")"));
  }
  if (o.high_watermark == 0 && o.low_watermark != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        who, ": low_watermark ", o.low_watermark, " without a high_watermark"));
  }
  if (o.reserved_bytes > o.max_bytes) {
    return absl::InvalidArgumentError(
        absl::StrCat(who, ": reserved_bytes ", o.reserved_bytes,
                     " exceeds max_bytes ", o.max_bytes));
  }
  return absl::OkStatus();
}

}  // namespace

namespace internal {

absl::Status CommitLending(BufferPool& pool, size_t buffers,
                           absl::string_view who, Commitment kind) {
  std::lock_guard<std::mutex> lock(BookMutex());
  Commitments& c = Book()[&pool];
  if (buffers > pool.capacity() || c.promised() > pool.capacity() - buffers) {
    std::string msg =
        kind == Commitment::kRing
            ? absl::StrCat(who, ": lending up to ", buffers,
                           " buffers would over-commit the pool (",
                           pool.capacity(), " buffers, ", Promised(c),
                           "); lower max_buffers or the reservations")
            : absl::StrCat(who, ": holding ", buffers,
                           " buffers would over-commit the pool (",
                           pool.capacity(), " buffers, ", Promised(c),
                           "); lower capacity_buffers or the reservations");
    DropIfEmpty(&pool);
    return absl::ResourceExhaustedError(std::move(msg));
  }
  (kind == Commitment::kRing ? c.lending : c.queued) += buffers;
  return absl::OkStatus();
}

void UncommitLending(BufferPool& pool, size_t buffers, Commitment kind) {
  std::lock_guard<std::mutex> lock(BookMutex());
  Commitments& c = Book()[&pool];
  size_t& n = kind == Commitment::kRing ? c.lending : c.queued;
  n -= std::min(n, buffers);
  DropIfEmpty(&pool);
}

size_t UncommittedBuffers(const BufferPool& pool) {
  std::lock_guard<std::mutex> lock(BookMutex());
  auto it = Book().find(&pool);
  if (it == Book().end()) return pool.capacity();
  const size_t promised = it->second.promised();
  return promised < pool.capacity() ? pool.capacity() - promised : 0;
}

void ForEachBudget(const BufferPool& pool,
                   const std::function<void(const BufferBudget&)>& fn) {
  std::lock_guard<std::mutex> lock(BookMutex());
  auto it = Book().find(&pool);
  if (it == Book().end()) return;
  for (const BufferBudget* b : it->second.budgets) fn(*b);
}

}  // namespace internal

absl::StatusOr<std::unique_ptr<BufferBudget>> BufferPool::CreateBudget(
    const BudgetOptions& o) {
  const size_t bs = buffer_size();
  const std::string who = absl::StrCat("CreateBudget(\"", o.name, "\")");
  if (absl::Status st = CheckBudgetOptions(o, bs, who); !st.ok()) return st;
  const size_t reserve = o.reserved_bytes / bs + (o.reserved_bytes % bs != 0);

  std::unique_ptr<BufferBudget> b(new BufferBudget);
  b->pool_ = this;
  b->name_ = o.name;
  b->group_ = o.group;
  {
    // relaxed: an id, not an order; it wraps after 2^24 budgets, and the
    // report names a reused id's live budget.
    static std::atomic<uint32_t> next_id{0};
    b->holder_id_ =
        next_id.fetch_add(1, std::memory_order_relaxed) % 0xffffff + 1;
  }
  b->buffer_size_ = bs;
  b->max_bytes_ =
      o.max_bytes == ~size_t{0} ? o.max_bytes : o.max_bytes / bs * bs;
  if (o.high_watermark != 0) {
    b->high_mark_ = o.high_watermark;
    b->low_mark_ = o.low_watermark;
  }
  b->on_high_ = o.on_high;
  b->on_low_ = o.on_low;
  b->reserved_buffers_ = reserve;
  b->floor_ = reserve * bs;
  b->reserve_.resize(reserve);

  std::lock_guard<std::mutex> lock(BookMutex());
  if (FreeAccounts().empty() &&
      next_account > internal::BudgetAccess::kMaxAccounts) {
    return absl::ResourceExhaustedError(absl::StrCat(
        who, ": ", internal::BudgetAccess::kMaxAccounts,
        " budgets are live in this process, the most there may be; destroy "
        "some, or let connections share one"));
  }
  Commitments& c = Book()[this];
  if (reserve > capacity() || c.promised() > capacity() - reserve) {
    std::string msg = absl::StrCat(who, ": reserving ", reserve,
                                   " buffers would over-commit the pool (",
                                   capacity(), " buffers, ", Promised(c),
                                   "); lower reserved_bytes or what rings and "
                                   "admission queues hold, or grow the pool");
    DropIfEmpty(this);
    return absl::ResourceExhaustedError(std::move(msg));
  }
  if (reserve != 0) {
    const size_t got = TryAcquireBulk(absl::MakeSpan(b->reserve_));
    if (got < reserve) {
      for (Buffer& r : b->reserve_) r.Reset();
      DropIfEmpty(this);
      return absl::ResourceExhaustedError(absl::StrCat(
          who, ": the pool has ", got, " free buffers of the ", reserve,
          " to reserve (", capacity(), " buffers, ", Stats().in_use,
          " in use); create it when buffers are free, or lower "
          "reserved_bytes"));
    }
  }
  for (const Buffer& r : b->reserve_) b->NoteReserve(r, true);
  b->reserve_size_ = reserve;
  b->reserve_count_.store(reserve, std::memory_order_relaxed);
  b->Rearm();
  if (!FreeAccounts().empty()) {
    b->account_ = FreeAccounts().back();
    FreeAccounts().pop_back();
  } else {
    b->account_ = next_account++;
  }
  c.reserved += reserve;
  c.budgets.push_back(b.get());
  return b;
}

BufferBudget::~BufferBudget() {
  const size_t pinned = pinned_.load(std::memory_order_relaxed);
  if (pinned != 0) {
    std::fprintf(stderr,
                 "bufpool: budget \"%s\" destroyed while it pins %zu bytes "
                 "(first empty its chains and release the buffers acquired "
                 "through it)\n",
                 name_.c_str(), pinned);
    std::abort();
  }
  for (size_t i = 0; i < reserve_size_; ++i) reserve_[i].Reset();
  if (pool_ == nullptr) return;
  std::lock_guard<std::mutex> lock(BookMutex());
  // No owner word names this account now: a budget pinning nothing holds
  // no run of any slot (see "Accounting" in budget.h).
  if (account_ != 0) FreeAccounts().push_back(account_);
  Commitments& c = Book()[pool_];
  c.reserved -= std::min(c.reserved, reserved_buffers_);
  auto it = std::find(c.budgets.begin(), c.budgets.end(), this);
  if (it != c.budgets.end()) c.budgets.erase(it);
  DropIfEmpty(pool_);
}

BudgetStats BufferBudget::Stats() const {
  return {pinned_.load(std::memory_order_relaxed),
          high_water_.load(std::memory_order_relaxed),
          refusals_.load(std::memory_order_relaxed)};
}

absl::Status BufferBudget::Refuse(absl::string_view what, size_t wanted,
                                  absl::string_view then) {
  // relaxed: a statistic; the one writer is this budget's thread.
  refusals_.store(refusals_.load(std::memory_order_relaxed) + 1,
                  std::memory_order_relaxed);
  return absl::ResourceExhaustedError(absl::StrCat(
      what, ": budget \"", name_, "\" is at its limit of ", max_bytes_,
      " bytes (it pins ", pinned_bytes(),
      wanted != 0 ? absl::StrCat(", ", wanted, " more needed") : "", ")", "; ",
      then.empty() ? "nothing was taken: consume or clear what its chains "
                     "hold, or raise max_bytes"
                   : then));
}

void BufferBudget::Rearm() {
  const size_t held = reserve_size_ * buffer_size_;  // <= floor_
  charge_event_ = above_high_ ? ~size_t{0} : high_mark_;
  charge_event_ =
      std::min(charge_event_, high_water_.load(std::memory_order_relaxed) + 1);
  if (reserve_size_ != 0) {
    charge_event_ = std::min(charge_event_, floor_ - held + 1);
  }
  release_below_ = above_high_ ? low_mark_ + 1 : 0;
  release_below_ = std::max(release_below_, floor_ - held);
}

void BufferBudget::OnChargeEvent(size_t p) {
  // relaxed: one writer (the budget's thread); Stats() wants a recent value.
  if (p > high_water_.load(std::memory_order_relaxed)) {
    high_water_.store(p, std::memory_order_relaxed);
  }
  if (!above_high_ && p >= high_mark_) CrossHigh();
  if (reserve_size_ != 0 && p + reserve_size_ * buffer_size_ > floor_) {
    TrimReserve();
  }
  Rearm();
}

void BufferBudget::OnReleaseEvent(size_t p) {
  if (above_high_ && p <= low_mark_) CrossLow();
  if (p + reserve_size_ * buffer_size_ < floor_) RefillReserve();
  Rearm();
}

void BufferBudget::CrossHigh() {
  above_high_ = true;
  if (on_high_) on_high_();
}

void BufferBudget::CrossLow() {
  above_high_ = false;
  if (on_low_) on_low_();
}

Buffer BufferBudget::TakeReserved() {
  --reserve_size_;
  reserve_count_.store(reserve_size_, std::memory_order_relaxed);
  Rearm();
  NoteReserve(reserve_[reserve_size_], false);
  return std::move(reserve_[reserve_size_]);
}

void BufferBudget::NoteReserve(const Buffer& b, bool in) const {
  internal::SharedAccess::NoteHeld(
      *pool_, b.slot(),
      in ? internal::kHeldReserved | holder_id_ << 8
         : internal::kHeldAsAcquired);
}

void BufferBudget::GiveBack(Buffer&& b) {
  if (!b) return;
  const size_t p = pinned_.load(std::memory_order_relaxed);
  if (b.pool() == pool_ && p + reserve_size_ * buffer_size_ < floor_) {
    NoteReserve(b, true);
    reserve_[reserve_size_++] = std::move(b);
    reserve_count_.store(reserve_size_, std::memory_order_relaxed);
    Rearm();
    return;
  }
  b.Reset();
}

void BufferBudget::TrimReserve() {
  const size_t p = pinned_.load(std::memory_order_relaxed);
  while (reserve_size_ != 0 && p + reserve_size_ * buffer_size_ > floor_) {
    reserve_[--reserve_size_].Reset();
  }
  reserve_count_.store(reserve_size_, std::memory_order_relaxed);
}

void BufferBudget::RefillReserve() {
  const size_t p = pinned_.load(std::memory_order_relaxed);
  while (p + reserve_size_ * buffer_size_ < floor_) {
    Buffer b = pool_->TryAcquire();
    if (!b) break;  // a later release tries again
    NoteReserve(b, true);
    reserve_[reserve_size_++] = std::move(b);
  }
  reserve_count_.store(reserve_size_, std::memory_order_relaxed);
}

}  // namespace bufpool

// Holder tracking: the per-slot records (holders.h), the tracked slow
// paths, Holders() and the reports, including the one a pool destroyed with
// buffers out prints.
#include "pool/holders.h"

#include <pthread.h>
#include <time.h>

#include <algorithm>
#include <atomic>
#include <cassert>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <new>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "absl/debugging/stacktrace.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "bufpool/budget.h"
#include "bufpool/internal/shared_access.h"
#include "os/thread.h"
#include "pool/pool_internal.h"
#include "pool/stack_symbolizer.h"

namespace bufpool {

namespace {

// This thread's id, cached: gettid() is a system call (~80 ns here), and
// a kAll pool records one per acquire. 0 until the thread's first record;
// reset in a fork() child, whose thread has a new id.
__thread pid_t t_thread_id __attribute__((tls_model("initial-exec"))) = 0;

pid_t ThisThreadId() {
  if (t_thread_id == 0) {
    static const bool registered = [] {
      ::pthread_atfork(nullptr, nullptr, [] { t_thread_id = 0; });
      return true;
    }();
    (void)registered;
    t_thread_id = static_cast<pid_t>(os::CurrentThreadId());
  }
  return t_thread_id;
}

// Nanoseconds on the coarse monotonic clock (the kernel's tick, 1-10 ms):
// enough for a holder's age, and read without a system call (the precise
// clocks cost 30-80 ns on this kind of VM, the coarse one 10).
int64_t CoarseNanos() {
  timespec ts;
  ::clock_gettime(CLOCK_MONOTONIC_COARSE, &ts);
  return int64_t{ts.tv_sec} * 1'000'000'000 + ts.tv_nsec;
}

}  // namespace

// kSampled: acquires of sampled pools left on this thread before the next
// one is recorded. One countdown per thread for every sampled pool (the
// recording pool's sample_every restarts it): what is recorded is 1 in N
// of the thread's sampled acquires, starting with its first. A plain
// thread-local, read and written only by its thread.
__thread uint32_t internal::t_holder_countdown
    __attribute__((tls_model("initial-exec"))) = 1;

// ---- The table --------------------------------------------------------------

namespace {

// `n` zeroed T from calloc (large ones are fresh zero pages, backed when
// first written). T's every field starts at zero and needs no destructor.
template <typename T>
T* Zeroed(size_t n) {
  static_assert(std::is_trivially_destructible_v<T>);
  void* p = std::calloc(n, sizeof(T));
  if (p == nullptr) throw std::bad_alloc();
  return static_cast<T*>(p);
}

}  // namespace

BufferPool::HolderTable::HolderTable(TrackHolders mode, uint32_t sample_every,
                                     size_t capacity)
    : mode_(mode),
      sample_every_(sample_every),
      entries_(Zeroed<Entry>(capacity)),
      marks_(Zeroed<std::atomic<uint8_t>>(capacity)),
      capacity_(capacity) {}

uint32_t BufferPool::HolderTable::Lock(Entry& e) noexcept {
  uint32_t s = e.seq.load(std::memory_order_relaxed);
  for (;;) {
    if ((s & 1) != 0) {  // another holder writes (a shared slice): brief
      s = e.seq.load(std::memory_order_relaxed);
      continue;
    }
    // acquire: this writer's field stores stay after the count turns odd,
    // and it sees the previous writer's stores.
    if (e.seq.compare_exchange_weak(s, s + 1, std::memory_order_acquire,
                                    std::memory_order_relaxed)) {
      return s + 1;
    }
  }
}

uint32_t BufferPool::HolderTable::LockAlone(Entry& e) noexcept {
  const uint32_t s = e.seq.load(std::memory_order_relaxed);
  assert((s & 1) == 0 && "a writer is in while the slot has one holder");
  e.seq.store(s + 1, std::memory_order_relaxed);
  // release: a reader that sees any field store below also sees the odd
  // count, or a later one, in its second load of it (its acquire fence
  // pairs with this one), and retries.
  std::atomic_thread_fence(std::memory_order_release);
  return s + 1;
}

__attribute__((noinline)) void BufferPool::HolderTable::Acquired(
    const BufferPool& pool, uint32_t slot) noexcept {
  if (mode_ == TrackHolders::kSampled) {
    if (--internal::t_holder_countdown != 0) return;
    internal::t_holder_countdown = sample_every_;
  }
  Record(pool, slot);
}

__attribute__((noinline)) void BufferPool::HolderTable::Sampled(
    const BufferPool& pool, uint32_t slot) noexcept {
  internal::t_holder_countdown = sample_every_;
  Record(pool, slot);
}

__attribute__((noinline)) void BufferPool::HolderTable::Record(
    const BufferPool& pool, uint32_t slot) noexcept {
  void* pcs[kMaxFrames];
  const int depth = absl::GetStackTrace(pcs, kMaxFrames, /*skip_count=*/1);
  const int64_t now = CoarseNanos();
  const pid_t tid = ThisThreadId();
  // A SharedBuffer's last holder returns its slot without clearing the
  // count, so a count left from before would make this slot look like a
  // chain's. relaxed: the slot is this thread's alone now (as in
  // SharedBuffer's constructor).
  if (uint32_t* refs = pool.shared_refs_.load(std::memory_order_acquire)) {
    std::atomic_ref<uint32_t>(refs[slot * internal::SharedAccess::kRefStride])
        .store(0, std::memory_order_relaxed);
  }
  Entry& e = entries_[slot];
  const uint32_t locked = LockAlone(e);
  for (int i = 0; i < depth; ++i) {
    e.pcs[i].store(reinterpret_cast<uintptr_t>(pcs[i]),
                   std::memory_order_relaxed);
  }
  e.depth.store(static_cast<uint32_t>(std::max(depth, 0)),
                std::memory_order_relaxed);
  e.acquired_ns.store(now, std::memory_order_relaxed);
  e.tid.store(tid, std::memory_order_relaxed);
  e.note.store(kNoNote, std::memory_order_relaxed);
  e.touch_count.store(0, std::memory_order_relaxed);
  e.live.store(1, std::memory_order_relaxed);
  Unlock(e, locked);
  marks_[slot].store(1, std::memory_order_relaxed);  // see Released()
}

void BufferPool::HolderTable::Clear(Entry& e, uint32_t slot) noexcept {
  marks_[slot].store(0, std::memory_order_relaxed);
  const uint32_t locked = LockAlone(e);
  e.live.store(0, std::memory_order_relaxed);
  e.note.store(kNoNote, std::memory_order_relaxed);
  Unlock(e, locked);
}

void BufferPool::HolderTable::Touch(uint32_t slot,
                                    absl::string_view label) noexcept {
  Entry& e = entries_[slot];
  if (e.live.load(std::memory_order_relaxed) == 0) return;  // not sampled
  uint64_t words[kLabelWords] = {};
  std::memcpy(words, label.data(),
              std::min(label.size(), sizeof(words) - 1));  // NUL-terminated
  const uint32_t locked = Lock(e);
  const uint32_t n = e.touch_count.load(std::memory_order_relaxed);
  for (size_t w = 0; w < kLabelWords; ++w) {
    e.touches[n % kMaxTouches][w].store(words[w], std::memory_order_relaxed);
  }
  e.touch_count.store(n + 1, std::memory_order_relaxed);
  Unlock(e, locked);
}

void BufferPool::HolderTable::Note(uint32_t slot, uint32_t note) noexcept {
  Entry& e = entries_[slot];
  if (e.live.load(std::memory_order_relaxed) == 0) return;  // not sampled
  const uint32_t locked = Lock(e);
  e.note.store(note, std::memory_order_relaxed);
  Unlock(e, locked);
}

std::vector<BufferPool::HolderTable::Snapshot> BufferPool::HolderTable::Live()
    const {
  std::vector<Snapshot> out;
  for (size_t slot = 0; slot < capacity_; ++slot) {
    const Entry& e = entries_[slot];
    // A writer holds an entry for a few dozen stores; a few tries see it
    // stable unless the slot keeps changing hands, and then it was not
    // out for the whole call anyway.
    for (int attempt = 0; attempt < 4; ++attempt) {
      const uint32_t before = e.seq.load(std::memory_order_acquire);
      if ((before & 1) != 0) continue;
      if (e.live.load(std::memory_order_relaxed) == 0) {
        // Stable and not live; nothing to copy.
        std::atomic_thread_fence(std::memory_order_acquire);
        if (e.seq.load(std::memory_order_relaxed) == before) break;
        continue;
      }
      Snapshot s;
      s.slot = static_cast<uint32_t>(slot);
      s.note = e.note.load(std::memory_order_relaxed);
      s.acquired_ns = e.acquired_ns.load(std::memory_order_relaxed);
      s.tid = e.tid.load(std::memory_order_relaxed);
      s.depth = std::min<uint32_t>(e.depth.load(std::memory_order_relaxed),
                                   kMaxFrames);
      for (uint32_t i = 0; i < s.depth; ++i) {
        s.pcs[i] = e.pcs[i].load(std::memory_order_relaxed);
      }
      const uint32_t made = e.touch_count.load(std::memory_order_relaxed);
      const uint32_t kept = std::min(made, kMaxTouches);
      for (uint32_t t = made - kept; t < made; ++t) {
        uint64_t words[kLabelWords];
        for (size_t w = 0; w < kLabelWords; ++w) {
          words[w] =
              e.touches[t % kMaxTouches][w].load(std::memory_order_relaxed);
        }
        const char* text = reinterpret_cast<const char*>(words);
        s.touches.emplace_back(text, strnlen(text, sizeof(words)));
      }
      // acquire: the loads above are done before the count is read again,
      // so an unchanged even count means no writer overlapped them.
      std::atomic_thread_fence(std::memory_order_acquire);
      if (e.seq.load(std::memory_order_relaxed) != before) continue;
      out.push_back(std::move(s));
      break;
    }
  }
  return out;
}

// ---- Create() and the tracked slow paths ------------------------------------

absl::StatusOr<TrackHolders> ResolveTrackHolders(const PoolOptions& options) {
  if (options.holder_sample_every == 0) {
    return absl::InvalidArgumentError(
        "PoolOptions.holder_sample_every must be at least 1, got 0");
  }
  const char* v = ::secure_getenv("BUFPOOL_TRACK_HOLDERS");
  if (v == nullptr || *v == '\0') return options.track_holders;
  if (std::strcmp(v, "off") == 0) return TrackHolders::kOff;
  if (std::strcmp(v, "sampled") == 0) return TrackHolders::kSampled;
  if (std::strcmp(v, "all") == 0) return TrackHolders::kAll;
  std::fprintf(stderr,
               "bufpool: BUFPOOL_TRACK_HOLDERS=%s is none of off, sampled, "
               "all; ignored\n",
               v);
  return options.track_holders;
}

void BufferPool::AcquireSampled(uint32_t slot) noexcept {
  holders_->Sampled(*this, slot);
}

uint32_t BufferPool::AcquireTracked() noexcept {
  const uint32_t slot = AcquireUntracked();
  if (slot != kNoSlot) holders_->Acquired(*this, slot);
  return slot;
}

void BufferPool::ReleaseTracked(uint32_t slot) noexcept {
  holders_->Released(slot);
  ReleaseUntracked(slot);
}

void BufferPool::TouchSlot(uint32_t slot,
                           absl::string_view label) const noexcept {
  holders_->Touch(slot, label);
}

void BufferPool::NoteHolder(uint32_t slot, uint32_t note) const noexcept {
  holders_->Note(slot, note);
}

TrackHolders BufferPool::track_holders() const {
  return holders_ != nullptr ? holders_->mode() : TrackHolders::kOff;
}

// ---- Holders() and the reports ----------------------------------------------

namespace {

// The frames of recorded stacks, each address resolved once per report
// (stack_symbolizer.h), with the library's own frames folded away.
class Symbolizer {
 public:
  // The frames of `pcs`, innermost first, from the caller of the library
  // on: leading addresses whose frames are all the library's are left out,
  // and so are the library's inlined frames at the first address kept.
  // *site: the first address kept (the acquire site's return address).
  // Everything, if every frame is the library's.
  std::vector<std::string> Frames(const uintptr_t* pcs, uint32_t depth,
                                  uintptr_t* site) {
    std::vector<std::string> frames;
    *site = 0;
    uint32_t first = 0;
    size_t skip = 0;  // of the first kept address's frames
    for (; first < depth; ++first) {
      const std::vector<StackFrame>& chain = symbolizer_.Frames(pcs[first]);
      if (chain.back().library) continue;
      for (size_t j = chain.size(); j-- > 0;) {
        if (chain[j].library) {
          skip = j + 1;
          break;
        }
      }
      break;
    }
    if (first == depth) {  // nothing but the library: keep everything
      first = 0;
      skip = 0;
    }
    for (uint32_t i = first; i < depth; ++i) {
      const std::vector<StackFrame>& chain = symbolizer_.Frames(pcs[i]);
      // An address in no mapped file is no return address: the unwinder
      // followed a frame pointer register that held something else (code
      // without frame pointers above); the stack ends there.
      if (i > first && chain.front().module.empty()) break;
      if (i == first) *site = pcs[i];
      for (size_t j = i == first ? skip : 0; j < chain.size(); ++j) {
        frames.push_back(FormatFrame(chain[j]));
      }
    }
    return frames;
  }

 private:
  StackSymbolizer symbolizer_;
};

// The report's counts per kind of holder, over the tracked buffers: ": 3
// Buffer; 1 ring 0 (lent, not leaked)", ending the first line.
void AppendKinds(const std::vector<Holder>& holders, std::string* report) {
  std::map<std::string, size_t> kinds;
  for (const Holder& h : holders) ++kinds[h.held_by];
  absl::StrAppend(report, ":");
  for (const auto& [kind, n] : kinds) {
    absl::StrAppend(report, " ", n, " ", kind,
                    absl::StartsWith(kind, "ring ") ? " (lent, not leaked)"
                    : absl::StartsWith(kind, "budget ")
                        ? " (reserved, not leaked)"
                        : "",
                    ";");
  }
  report->back() == ';' ? void(report->back() = '\n') : report->push_back('\n');
}

// `holders` (oldest first, as Holders()) grouped by acquire site, sites[i]
// being holders[i]'s: the largest group first, then the one whose oldest
// member is oldest. Each group is oldest first.
std::vector<std::vector<const Holder*>> GroupsBySite(
    const std::vector<Holder>& holders, const std::vector<uintptr_t>& sites) {
  std::map<uintptr_t, std::vector<const Holder*>> by_site;
  for (size_t i = 0; i < holders.size(); ++i) {
    by_site[sites[i]].push_back(&holders[i]);
  }
  std::vector<std::vector<const Holder*>> groups;
  groups.reserve(by_site.size());
  for (auto& [site, members] : by_site) groups.push_back(std::move(members));
  std::sort(groups.begin(), groups.end(), [](const auto& a, const auto& b) {
    if (a.size() != b.size()) return a.size() > b.size();
    return a.front()->age > b.front()->age;
  });
  return groups;
}

// How many return addresses `stack`'s frames come from: the frames of one
// address (a function and what was inlined into it) share its
// "module+0xoffset", the last word of each.
size_t Addresses(const std::vector<std::string>& stack) {
  std::vector<absl::string_view> seen;
  for (const std::string& frame : stack) {
    absl::string_view where = frame;
    if (const size_t space = where.rfind(' '); space != where.npos) {
      where.remove_prefix(space + 1);
    }
    if (std::find(seen.begin(), seen.end(), where) == seen.end()) {
      seen.push_back(where);
    }
  }
  return seen.size();
}

// One acquire site's paragraph: how many buffers and what holds them, its
// oldest member's age, thread, touches and stack, and the first 8 slots.
void AppendGroup(const std::vector<const Holder*>& m, std::string* report) {
  const Holder& oldest = *m.front();  // Holders() is oldest first
  std::map<std::string, size_t> by;
  for (const Holder* h : m) ++by[h->held_by];
  absl::StrAppend(report, "  ", m.size(), " buffer(s) held by ");
  bool first = true;
  for (const auto& [kind, n] : by) {
    absl::StrAppend(report, first ? "" : ", ", n, " ", kind);
    first = false;
  }
  const absl::Duration age = absl::Trunc(oldest.age, absl::Milliseconds(1));
  absl::StrAppend(report, "; the oldest for ",
                  age == absl::ZeroDuration() ? std::string("<1ms")
                                              : absl::FormatDuration(age),
                  ", acquired by thread ", oldest.thread, "; slots ");
  for (size_t i = 0; i < m.size() && i < 8; ++i) {
    absl::StrAppend(report, i == 0 ? "" : ", ", m[i]->slot);
  }
  absl::StrAppend(report, m.size() > 8 ? ", ...\n" : "\n");
  if (!oldest.touches.empty()) {
    absl::StrAppend(
        report, "    touched: ", absl::StrJoin(oldest.touches, " -> "), "\n");
  }
  absl::StrAppend(report, "    acquired at:\n");
  for (size_t i = 0; i < oldest.stack.size(); ++i) {
    absl::StrAppend(report, "      #", i, " ", oldest.stack[i], "\n");
  }
  if (Addresses(oldest.stack) == 1) {
    // The unwinder follows frame pointers: code compiled without them ends
    // the stack at its own frame.
    absl::StrAppend(report,
                    "      (one frame: the stack ends where the code that "
                    "acquired has no frame pointer; compile it with "
                    "-fno-omit-frame-pointer to see its callers)\n");
  }
}

}  // namespace

std::string BufferPool::HeldBy(uint32_t slot, uint32_t note) const {
  if ((note & 0xff) == HolderTable::kLent) {
    return absl::StrCat("ring ", (note >> 8) & 0xffff);
  }
  if (note == HolderTable::kSending) return "send in flight";
  if ((note & 0xff) == HolderTable::kReserved) {
    std::string name;
    internal::ForEachBudget(*this, [&](const BufferBudget& b) {
      if (b.holder_id_ == note >> 8) name = b.name();
    });
    return absl::StrCat("budget ", name);
  }
  // relaxed: a snapshot; the holder may change while the report is made.
  if (State(slot).load(std::memory_order_relaxed) == kSlotRaw) {
    return "raw pointer";
  }
  // The counts are atomics wherever they are used (atomic_ref); the
  // pointer never changes once published.
  if (uint32_t* refs = shared_refs_.load(std::memory_order_acquire);
      refs != nullptr &&
      std::atomic_ref<uint32_t>(refs[slot * internal::SharedAccess::kRefStride])
              .load(std::memory_order_relaxed) != 0) {
    return "chain";
  }
  return "Buffer";
}

std::vector<Holder> BufferPool::Holders() const {
  return HoldersAndSites(nullptr);
}

std::vector<Holder> BufferPool::HoldersAndSites(
    std::vector<uintptr_t>* sites) const {
  std::vector<Holder> out;
  if (holders_ == nullptr) return out;
  Symbolizer symbolizer;
  std::vector<HolderTable::Snapshot> live = holders_->Live();
  std::sort(live.begin(), live.end(), [](const auto& a, const auto& b) {
    return a.acquired_ns < b.acquired_ns;
  });
  const int64_t now = CoarseNanos();
  out.reserve(live.size());
  for (HolderTable::Snapshot& s : live) {
    Holder h;
    h.slot = s.slot;
    h.age = absl::Nanoseconds(std::max<int64_t>(0, now - s.acquired_ns));
    h.thread = s.tid;
    h.held_by = HeldBy(s.slot, s.note);
    uintptr_t site;
    h.stack = symbolizer.Frames(s.pcs, s.depth, &site);
    if (sites != nullptr) sites->push_back(site);
    h.touches = std::move(s.touches);
    out.push_back(std::move(h));
  }
  return out;
}

namespace internal {

void AddLender(const BufferPool& pool, const void* lender, LentCount count) {
  auto& s = PoolAccess::S(pool);
  std::lock_guard<std::mutex> lock(s.lenders_mu);
  s.lenders.emplace_back(lender, std::move(count));
}

void RemoveLender(const BufferPool& pool, const void* lender) {
  auto& s = PoolAccess::S(pool);
  std::lock_guard<std::mutex> lock(s.lenders_mu);
  std::erase_if(s.lenders, [&](const auto& l) { return l.first == lender; });
}

}  // namespace internal

namespace {

// The buffers the pool's lenders hold for the kernel now; `detail` gets
// "ProvidedBufferRing group 1: 64 lent, 1 pack; ..." (empty with none).
// Each count is read under lenders_mu, so no lender goes meanwhile.
size_t LentToKernel(const BufferPool& pool, std::string* detail) {
  auto& s = PoolAccess::S(pool);
  std::lock_guard<std::mutex> lock(s.lenders_mu);
  size_t lent = 0;
  for (const auto& [lender, count] : s.lenders) {
    if (!detail->empty()) detail->append("; ");
    lent += count(detail);
  }
  return lent;
}

// The line of a sampled report that counts, by kind, the buffers out that
// were not sampled: what the pool knows of every slot (raw pointers, the
// rings' lent buffers, the budgets' reserves), less the sampled ones of
// each kind; the rest are Buffer handles, chains or sends, which only a
// record tells apart.
void AppendUnsampled(const BufferPool& pool, const std::vector<Holder>& sampled,
                     size_t out_now, size_t raw, size_t lent,
                     std::string* report) {
  size_t reserved = 0;
  internal::ForEachBudget(
      pool, [&](const BufferBudget& b) { reserved += b.reserve_buffers(); });
  size_t sampled_raw = 0, sampled_lent = 0, sampled_reserved = 0;
  for (const Holder& h : sampled) {
    sampled_raw += h.held_by == "raw pointer";
    sampled_lent += absl::StartsWith(h.held_by, "ring ");
    sampled_reserved += absl::StartsWith(h.held_by, "budget ");
  }
  // Each count is a snapshot: clamped, so that none wraps.
  const size_t unsampled = out_now - sampled.size();
  auto less = [](size_t a, size_t b) { return a > b ? a - b : 0; };
  size_t left = unsampled;
  auto take = [&](size_t n) {
    n = std::min(n, left);
    left -= n;
    return n;
  };
  const size_t u_raw = take(less(raw, sampled_raw));
  const size_t u_lent = take(less(lent, sampled_lent));
  const size_t u_reserved = take(less(reserved, sampled_reserved));
  absl::StrAppend(report, "  not sampled: ", unsampled, " (");
  if (u_raw != 0) absl::StrAppend(report, u_raw, " as raw pointers, ");
  if (u_lent != 0) {
    absl::StrAppend(report, u_lent, " lent to io_uring rings, not leaked, ");
  }
  if (u_reserved != 0) {
    absl::StrAppend(report, u_reserved, " in budgets' reserves, not leaked, ");
  }
  absl::StrAppend(report, left,
                  " held by Buffer handles, chains or sends in flight); "
                  "BUFPOOL_TRACK_HOLDERS=all records every acquire\n");
}

}  // namespace

std::string BufferPool::HoldersReport(size_t max_holders) const {
  return Report(max_holders, Stats().in_use);
}

std::string BufferPool::Report(size_t max_holders, size_t out_now) const {
  size_t raw = 0;
  for (size_t i = 0; i < capacity_; ++i) {
    raw += State(static_cast<uint32_t>(i)).load(std::memory_order_relaxed) ==
           kSlotRaw;
  }
  // The counts are read one after another while buffers come and go: each
  // is a snapshot, and `out_now` is raised to cover their sum so that the
  // "other holders" count never wraps.
  std::string lenders;
  const size_t lent = LentToKernel(*this, &lenders);
  out_now = std::max(out_now, raw + lent);
  std::string report =
      absl::StrCat("bufpool: ", out_now, " of ", capacity_, " buffer(s) out");
  // A shared pool's report is one process's: say which.
  if (const ProcessShare* x = shared_->xproc.get()) {
    absl::StrAppend(&report, " in process pid ", x->pid, " (shared pool)");
  }
  // Buffers that io_uring rings hold for the kernel are out for as long as
  // the ring lives, by design: named apart, so that they do not read as
  // leaks.
  const std::string lent_line =
      lent == 0 && lenders.empty()
          ? ""
          : absl::StrCat(lent, " lent to io_uring rings (", lenders, ")");
  if (holders_ == nullptr) {
    // The switch goes in the first line: it is what a reader of a truncated
    // log or a one-line alert needs next.
    absl::StrAppend(&report,
                    " (tracking off: run with BUFPOOL_TRACK_HOLDERS=all, or "
                    "PoolOptions::track_holders, to see where each was "
                    "acquired): ",
                    raw, " as raw pointers, ", lent_line,
                    lent_line.empty() ? "" : ", ", out_now - raw - lent,
                    " held by Buffer handles or chains\n");
    return report;
  }
  std::vector<uintptr_t> sites;
  const std::vector<Holder> holders = HoldersAndSites(&sites);
  if (holders_->mode() == TrackHolders::kAll) {
    absl::StrAppend(&report, " (tracking all)");
  } else {
    // Some out were not sampled: the switch that lists them all goes in
    // the first line, as with tracking off.
    absl::StrAppend(&report, " (tracking 1 in ", holders_->sample_every(), ": ",
                    holders.size(), " sampled",
                    out_now > holders.size()
                        ? "; run with BUFPOOL_TRACK_HOLDERS=all to see where "
                          "each was acquired"
                        : "",
                    ")");
  }
  AppendKinds(holders, &report);
  if (holders_->mode() == TrackHolders::kSampled && out_now > holders.size()) {
    AppendUnsampled(*this, holders, out_now, raw, lent, &report);
  }
  // Tracked, the ring's lent buffers are its "ring N" kind above (its pack
  // buffer is among the chains); this line says which of those counts are
  // the rings', so that a reader does not add them twice. Sampled, the
  // kinds count only the sampled buffers: the rings' counts are not a part
  // of them.
  if (!lent_line.empty()) {
    absl::StrAppend(
        &report, holders_->mode() == TrackHolders::kAll ? "  of these, " : "  ",
        lent_line, "\n");
  }

  // Grouped by acquire site (the return address into the pool's caller:
  // frames beyond it need frame pointers in the caller's code, and may
  // differ), largest first, then oldest first; a group shows its oldest
  // member's stack.
  const std::vector<std::vector<const Holder*>> groups =
      GroupsBySite(holders, sites);
  for (size_t shown = 0; shown < groups.size(); ++shown) {
    if (shown == max_holders) {
      absl::StrAppend(&report, "  ... ", groups.size() - max_holders,
                      " more acquire site(s)\n");
      break;
    }
    AppendGroup(groups[shown], &report);
  }
  return report;
}

}  // namespace bufpool

// An elastic pool (PoolOptions::max_buffer_count): one region reserved to
// the ceiling at Create(), backed in chunks as the load needs them and given
// back by Trim().
//
// Chunks. The region is cut into chunks of `chunk_bytes`: the commit unit
// (a page, or a 2 MiB huge page when the pool uses them), or one buffer when
// buffers are larger, or 1/16384 of the region when that is larger still
// (so that FixedBuffers can register each chunk as one buffer of io_uring's
// sparse table, whose limit is 16384 entries). Every chunk holds whole
// buffers and whole commit units, so backing and trimming never split
// either. Chunk c is either
//
//   backed:   its memory populated, its slots free (in the depot or a
//             cache) or in use; or
//   unbacked: its bit set in `unbacked`, its memory given back, its slots
//             in no free store, so no call can hand one out.
//
// Growing (the slow path only). A call that found no free slot anywhere
// (TakeAnywhere gave kNoSlot) calls GrowAndTake: under `mu` it looks at
// the depot again (a concurrent grower, a release or a Trim() may have
// filled it while this call waited for the lock: then it takes from there
// and nothing grows, which is how concurrent growers grow once), else backs
// the lowest `step_chunks` unbacked chunks (MADV_POPULATE_WRITE, mlock with
// lock_memory), raises `committed`, and pushes their slots to the depot,
// lowest on top, taking one. The hit path, the caches and the drain never
// look at any of this: to them grown slots are ordinary depot slots.
//
// Trimming. Trim() holds `mu`, takes every slot out of the depot, finds
// the chunks all of whose slots it holds (a slot in use or in a cache is
// not in the depot, so its chunk is never among them), and gives back the
// highest of those chunks while more than `keep_free` free slots would stay.
// Their slots stay out, now unbacked; the rest go back to the depot.
// MADV_DONTNEED rather than MADV_FREE: the memory must leave the process's
// resident set now (the point of a trim, and what an operator watches), and
// a trimmed chunk is populated again before reuse anyway, so MADV_FREE's
// saving (pages kept until the kernel needs them, no zeroing if reused)
// would never be collected; it also leaves RSS high until reclaim. With
// huge pages every chunk is whole 2 MiB pages: a partial DONTNEED of a THP
// would split it, and khugepaged could collapse the range again (it fills
// a huge page around a single resident 4 KiB page by default), undoing the
// trim; a hugetlb page cannot be split at all.
//
// Exhaustion (what a caller that finds nothing may conclude). While Trim()
// holds the depot's slots, a caller could find the pool empty though it is
// not. Trim() sets `trimming` (seq_cst) before it takes the first slot and
// clears it after the last is back; GrowAndTake loads `trimming` (seq_cst)
// before its own look at the depot. If that look found the depot empty
// because Trim() held its slots, Trim()'s store precedes its pop, which
// precedes the look, so either the load saw `trimming` set (the caller then
// waits for `mu` and looks again) or the load came before the store, and
// the slots were released after the call looked at them first (a release
// concurrent with the call, which may be ordered after it). A pool at its
// ceiling with no Trim() running answers without taking `mu`.
//
// Sleepers. Trim() gives nothing back while a thread sleeps in Acquire()
// (release_limit_ < 0), and a sleeper tries GrowAndTake each time it wakes.
// A sleeper that counts itself while Trim() runs is woken at its end: the
// sleeper's count (seq_cst) and Trim()'s check of it (seq_cst, after it
// raised `unbacked_chunks`) form a store-load pair with the sleeper's load
// of `unbacked_chunks`, so one of them sees the other.
#include <algorithm>
#include <chrono>
#include <cstring>
#include <limits>
#include <mutex>
#include <new>
#include <span>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "pool/pool_internal.h"

namespace bufpool {

namespace {

// io_uring's limit on a registered-buffer table (IORING_MAX_REG_BUFFERS).
constexpr uint64_t kMaxChunks = 16384;
// Slots pushed to the depot per push when growing (a local array).
constexpr uint32_t kGrowPush = 256;

int64_t NowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

size_t RoundUpPow2(size_t n) {
  size_t p = 1;
  while (p < n) p <<= 1;
  return p;
}

bool Unbacked(const Growth& g, uint32_t c) {
  return (g.unbacked[c >> 6] >> (c & 63)) & 1;
}
void SetUnbacked(Growth& g, uint32_t c, bool on) {
  if (on) {
    g.unbacked[c >> 6] |= uint64_t{1} << (c & 63);
  } else {
    g.unbacked[c >> 6] &= ~(uint64_t{1} << (c & 63));
  }
}

// Slots of chunk c: [first, last).
uint32_t FirstSlot(const Growth& g, uint32_t c) { return c * g.chunk_slots; }
uint32_t LastSlot(const Growth& g, uint32_t c, size_t capacity) {
  return static_cast<uint32_t>(
      std::min<size_t>(size_t{c + 1} * g.chunk_slots, capacity));
}

// Pops the depot's slots into `free`, until it is empty or `free` full;
// how many.
size_t PopAll(Depot& depot, std::span<uint32_t> free) {
  size_t got = 0;
  uint32_t reshelved = 0;  // put back by the trim anyway
  while (got < free.size()) {
    const uint32_t n = depot.Pop(
        free.data() + got,
        static_cast<uint32_t>(std::min<size_t>(free.size() - got, 1u << 30)),
        nullptr, &reshelved);
    if (n == 0) break;
    got += n;
  }
  return got;
}

// What a trim gave back.
struct Trimmed {
  size_t slots = 0;
  size_t bytes = 0;
  uint32_t chunks = 0;  // now unbacked
  uint32_t lowest = 0;  // the lowest of them; g.chunks when none
};

// Trim()'s choice, over the sorted free slots `free` (taken out of the
// depot): from the top chunk down, a chunk all of whose slots are here is
// given back while more than keep_free free slots would stay; its slots
// are marked Depot::kNoSlot, the others stay. A chunk the system would not
// decommit stays backed. With growth->mu held.
Trimmed DecommitFreeChunks(Growth& g, Arena& arena, size_t capacity,
                           std::span<uint32_t> free, size_t keep_free) {
  Trimmed t{.lowest = g.chunks};
  size_t stay = free.size();
  for (size_t i = free.size(); i > 0;) {
    const uint32_t c = free[i - 1] / g.chunk_slots;
    const uint32_t first = FirstSlot(g, c);
    size_t j = i - 1;
    while (j > 0 && free[j - 1] >= first) --j;
    const size_t n = i - j;  // slots of chunk c here (distinct, sorted)
    const size_t whole = LastSlot(g, c, capacity) - first;
    i = j;
    if (n != whole || stay - n < keep_free) continue;
    const size_t off = size_t{c} * g.chunk_bytes;
    const size_t len =
        std::min(arena.mapped_size(), size_t{c + 1} * g.chunk_bytes) - off;
    if (!arena.Decommit(off, len).ok()) continue;  // it stays backed
    SetUnbacked(g, c, true);
    t.lowest = std::min(t.lowest, c);
    ++t.chunks;
    t.bytes += len;
    stay -= n;
    t.slots += n;
    std::fill(free.begin() + static_cast<ptrdiff_t>(j),
              free.begin() + static_cast<ptrdiff_t>(j + n), Depot::kNoSlot);
  }
  return t;
}

}  // namespace

absl::Status PoolAccess::CheckGrowthOptions(const PoolOptions& options) {
  if (options.trim_after_idle < absl::ZeroDuration()) {
    return absl::InvalidArgumentError(
        absl::StrCat("PoolOptions.trim_after_idle must not be negative, got ",
                     absl::FormatDuration(options.trim_after_idle)));
  }
  const size_t max = options.max_buffer_count;
  if (max == 0) {
    if (options.trim_after_idle != absl::ZeroDuration()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "PoolOptions.trim_after_idle (",
          absl::FormatDuration(options.trim_after_idle),
          ") needs max_buffer_count (an elastic pool); a fixed pool is not "
          "trimmed"));
    }
    return absl::OkStatus();
  }
  if (max < options.buffer_count) {
    return absl::InvalidArgumentError(absl::StrCat(
        "PoolOptions.max_buffer_count must be 0 (a fixed pool) or at least "
        "buffer_count (",
        options.buffer_count, "), got ", max));
  }
  if (max >= BufferPool::kNoSlot) {
    return absl::InvalidArgumentError(absl::StrCat(
        "PoolOptions.max_buffer_count must be below ", BufferPool::kNoSlot,
        " (slot numbers are 32-bit), got ", max));
  }
  if (max > std::numeric_limits<size_t>::max() / 2 / options.buffer_size) {
    return absl::InvalidArgumentError(
        absl::StrCat("PoolOptions.buffer_size * max_buffer_count overflows: ",
                     options.buffer_size, " * ", max));
  }
  if (options.grow_step == 0) {
    return absl::InvalidArgumentError(
        "PoolOptions.grow_step must be at least 1 with max_buffer_count, "
        "got 0");
  }
  return absl::OkStatus();
}

absl::StatusOr<size_t> PoolAccess::InitGrowth(BufferPool& p, SharedState& s,
                                              const PoolOptions& options) {
  const size_t count = options.buffer_count;
  if (options.max_buffer_count == 0) {
    s.committed.store(count, std::memory_order_relaxed);
    return count;
  }
  auto g = std::make_unique<Growth>();
  const size_t region = p.region_bytes_;
  g->chunk_bytes =
      std::max({s.arena.commit_unit(), p.buffer_size_,
                RoundUpPow2((region + kMaxChunks - 1) / kMaxChunks)});
  g->chunk_slots = static_cast<uint32_t>(g->chunk_bytes / p.buffer_size_);
  g->chunks = static_cast<uint32_t>((p.capacity_ + g->chunk_slots - 1) /
                                    g->chunk_slots);
  g->step_chunks = static_cast<uint32_t>(std::min<size_t>(
      g->chunks, (options.grow_step + g->chunk_slots - 1) / g->chunk_slots));
  g->idle_ns = absl::ToInt64Nanoseconds(options.trim_after_idle);
  const auto backed = static_cast<uint32_t>(std::min<size_t>(
      g->chunks, (count + g->chunk_slots - 1) / g->chunk_slots));
  g->unbacked.assign((g->chunks + 63) / 64, 0);
  for (uint32_t c = backed; c < g->chunks; ++c) SetUnbacked(*g, c, true);
  g->scan_from = backed;
  g->unbacked_chunks.store(g->chunks - backed, std::memory_order_relaxed);
  const size_t ready =
      std::min<size_t>(size_t{backed} * g->chunk_slots, p.capacity_);
  // Map() backed buffer_count buffers in whole commit units; a chunk may be
  // larger: back the rest of the last one too.
  const size_t mapped_backed =
      std::min(s.arena.mapped_size(),
               (count * p.buffer_size_ + s.arena.commit_unit() - 1) /
                   s.arena.commit_unit() * s.arena.commit_unit());
  const size_t want_backed =
      std::min(s.arena.mapped_size(), size_t{backed} * g->chunk_bytes);
  if (options.populate && want_backed > mapped_backed) {
    if (absl::Status st =
            s.arena.Commit(mapped_backed, want_backed - mapped_backed);
        !st.ok()) {
      return st;
    }
  }
  g->window_start.store(NowNs(), std::memory_order_relaxed);
  g->window_low.store(static_cast<int64_t>(ready), std::memory_order_relaxed);
  s.growth = std::move(g);
  s.committed.store(ready, std::memory_order_relaxed);
  return ready;
}

uint32_t PoolAccess::GrowLocked(BufferPool& p, size_t min_slots,
                                absl::Status* error) {
  SharedState& s = S(p);
  Growth& g = *s.growth;
  const size_t capacity = p.capacity_;
  uint32_t pushed = 0;
  uint32_t chunks_left = std::max<uint32_t>(
      g.step_chunks,
      static_cast<uint32_t>((min_slots + g.chunk_slots - 1) / g.chunk_slots));
  while (chunks_left > 0 &&
         g.unbacked_chunks.load(std::memory_order_relaxed) > 0) {
    // The lowest run of unbacked chunks, at most chunks_left long.
    uint32_t c0 = g.scan_from;
    while (c0 < g.chunks && !Unbacked(g, c0)) ++c0;
    g.scan_from = c0;
    if (c0 >= g.chunks) break;  // (unbacked_chunks said otherwise: a bug)
    uint32_t c1 = c0 + 1;
    while (c1 < g.chunks && c1 - c0 < chunks_left && Unbacked(g, c1)) ++c1;
    const size_t off = size_t{c0} * g.chunk_bytes;
    const size_t len =
        std::min(s.arena.mapped_size(), size_t{c1} * g.chunk_bytes) - off;
    if (absl::Status st = s.arena.Commit(off, len); !st.ok()) {
      // Give back whatever the refused call did back; the chunks stay
      // unbacked, and the pool serves what it has.
      (void)s.arena.Decommit(off, len);
      g.grow_failures.fetch_add(1, std::memory_order_relaxed);
      g.last_error = absl::Status(
          st.code(), absl::StrCat("BufferPool: growing by ", len,
                                  " bytes failed: ", st.message()));
      if (error != nullptr) *error = g.last_error;
      break;
    }
    for (uint32_t c = c0; c < c1; ++c) SetUnbacked(g, c, false);
    g.scan_from = c1;
    chunks_left -= c1 - c0;
    g.unbacked_chunks.fetch_sub(c1 - c0, std::memory_order_seq_cst);
    const uint32_t first = FirstSlot(g, c0);
    const uint32_t last = LastSlot(g, c1 - 1, capacity);
    // Counted before they are free (accounting.cc): in transit = in use.
    s.committed.fetch_add(last - first, std::memory_order_relaxed);
    BUFPOOL_INTERNAL_POISON(p.SlotData(first),
                            size_t{last - first} * p.buffer_size_);
    // Highest pieces first, so that `first` ends on top of the depot and the
    // lowest addresses are handed out first (what stays hot stays low, and
    // the high chunks are the ones Trim() finds free).
    uint32_t piece[kGrowPush];
    for (uint32_t end = last; end > first;) {
      const uint32_t begin = end - std::min<uint32_t>(kGrowPush, end - first);
      for (uint32_t i = begin; i < end; ++i) piece[i - begin] = i;
      s.depot.Push(piece, end - begin, nullptr);
      if (p.cache_capacity_ != 0) {
        s.depot_free.fetch_add(end - begin, std::memory_order_relaxed);
      }
      end = begin;
    }
    pushed += last - first;
    g.grows.fetch_add(1, std::memory_order_relaxed);
    if (pushed >= min_slots && chunks_left == 0) break;
  }
  if (pushed == 0 && error != nullptr && error->ok()) {
    *error = g.last_error.ok()
                 ? absl::ResourceExhaustedError(absl::StrCat(
                       "BufferPool: at its ceiling of ", capacity, " buffers"))
                 : g.last_error;
  }
  return pushed;
}

uint32_t PoolAccess::GrowAndTake(BufferPool& p, uint32_t* reshelved,
                                 absl::Status* error) {
  SharedState& s = S(p);
  Growth* const g = s.growth.get();
  if (g == nullptr) return BufferPool::kNoSlot;
  // "Exhaustion": `trimming` before the depot.
  const bool trimming = g->trimming.load(std::memory_order_seq_cst);
  uint32_t slot = TakeFromDepot(p, reshelved);
  if (slot != BufferPool::kNoSlot) return slot;
  if (!trimming && g->unbacked_chunks.load(std::memory_order_seq_cst) == 0) {
    if (error != nullptr) {
      *error = absl::ResourceExhaustedError(absl::StrCat(
          "BufferPool: at its ceiling of ", p.capacity_, " buffers"));
    }
    return BufferPool::kNoSlot;
  }
  const std::lock_guard<std::mutex> lock(g->mu);
  for (;;) {
    slot = TakeFromDepot(p, reshelved);
    if (slot != BufferPool::kNoSlot) return slot;
    const uint32_t pushed = GrowLocked(p, 1, error);
    if (pushed == 0) return BufferPool::kNoSlot;
    *reshelved += pushed;  // others may sleep for them
  }
}

absl::Status BufferPool::Grow(size_t buffers) {
  Growth* const g = shared_->growth.get();
  if (g == nullptr) {
    return absl::FailedPreconditionError(
        "BufferPool::Grow: a fixed pool (max_buffer_count 0) does not grow");
  }
  uint32_t pushed = 0;
  absl::Status error;
  {
    const std::lock_guard<std::mutex> lock(g->mu);
    pushed = PoolAccess::GrowLocked(*this, buffers, &error);
  }
  PoolAccess::WakeWaiters(*this, pushed);
  if (pushed == 0) return error;
  return absl::OkStatus();
}

size_t PoolAccess::TrimLocked(BufferPool& p, size_t keep_free) {
  SharedState& s = S(p);
  Growth& g = *s.growth;
  // The kernel holds registered pages: DONTNEED would leave it writing to
  // pages the process no longer maps. A sleeper needs what is free.
  if (g.pinned.load(std::memory_order_acquire) != 0 ||
      Waiting(p, std::memory_order_seq_cst)) {
    return 0;
  }
  std::vector<uint32_t> free;
  try {
    free.resize(s.committed.load(std::memory_order_relaxed) + 1);
  } catch (const std::bad_alloc&) {
    return 0;
  }
  g.trimming.store(true, std::memory_order_seq_cst);  // see "Exhaustion"
  const size_t got = PopAll(s.depot, free);
  if (p.cache_capacity_ != 0) {
    s.depot_free.fetch_sub(static_cast<int64_t>(got),
                           std::memory_order_relaxed);
  }
  std::sort(free.begin(), free.begin() + static_cast<ptrdiff_t>(got));
  const Trimmed trimmed = DecommitFreeChunks(
      g, s.arena, p.capacity_, std::span(free.data(), got), keep_free);
  const size_t keep = static_cast<size_t>(
      std::remove(free.begin(), free.begin() + static_cast<ptrdiff_t>(got),
                  Depot::kNoSlot) -
      free.begin());
  g.scan_from = std::min(g.scan_from, trimmed.lowest);
  // Lowered after the slots left the depot (accounting.cc).
  s.committed.fetch_sub(trimmed.slots, std::memory_order_relaxed);
  g.unbacked_chunks.fetch_add(trimmed.chunks, std::memory_order_seq_cst);
  // The rest back, sorted: the lowest on top.
  if (keep != 0) {
    s.depot.Push(free.data(), static_cast<uint32_t>(keep), nullptr);
    if (p.cache_capacity_ != 0) {
      s.depot_free.fetch_add(static_cast<int64_t>(keep),
                             std::memory_order_relaxed);
    }
  }
  g.trimming.store(false, std::memory_order_seq_cst);
  if (trimmed.bytes != 0) g.trims.fetch_add(1, std::memory_order_relaxed);
  // Wake any sleeper that counted itself meanwhile: it grows what it needs
  // ("Sleepers"); with nothing put back, pretend two so all look again.
  WakeWaiters(p, static_cast<uint32_t>(std::max<size_t>(keep, 2)));
  return trimmed.bytes;
}

size_t BufferPool::Trim(size_t keep_free) {
  Growth* const g = shared_->growth.get();
  if (g == nullptr) return 0;
  const std::lock_guard<std::mutex> lock(g->mu);
  return PoolAccess::TrimLocked(*this, keep_free);
}

size_t PoolAccess::IdleTick(BufferPool& p) {
  SharedState& s = S(p);
  Growth* const g = s.growth.get();
  if (g == nullptr || g->idle_ns == 0) return 0;
  const int64_t now = NowNs();
  const int64_t depot = DepotSize(p);
  // The window's low water, sampled here (relaxed: a heuristic; a sample
  // lost to a race only trims a little more or less).
  if (depot < g->window_low.load(std::memory_order_relaxed)) {
    g->window_low.store(depot, std::memory_order_relaxed);
  }
  if (now - g->window_start.load(std::memory_order_relaxed) < g->idle_ns) {
    return 0;
  }
  std::unique_lock<std::mutex> lock(g->mu, std::try_to_lock);
  if (!lock.owns_lock()) return 0;  // a grower or trimmer: later
  if (now - g->window_start.load(std::memory_order_relaxed) < g->idle_ns) {
    return 0;  // another tick closed the window meanwhile
  }
  // Slots free throughout the window: the fewest the depot was seen
  // holding. What was dipped into (depot - low) stays backed; the rest is
  // trimmed, and so are the caches' buffers: a window with no slow path on
  // any CPU is idle for them too, and without this a few cached buffers
  // would keep their huge pages. A cache in use refills from the depot.
  const int64_t depot_now = DepotSize(p);
  const int64_t low =
      std::min(g->window_low.load(std::memory_order_relaxed), depot_now);
  const int64_t keep = std::max<int64_t>(0, depot_now - low);
  WakeWaiters(p, DrainAll(p));
  const size_t bytes = TrimLocked(p, static_cast<size_t>(keep));
  g->window_start.store(NowNs(), std::memory_order_relaxed);
  g->window_low.store(DepotSize(p), std::memory_order_relaxed);
  return bytes;
}

size_t BufferPool::TrimIdle() { return PoolAccess::IdleTick(*this); }

size_t BufferPool::chunk_bytes() const {
  return shared_->growth == nullptr ? 0 : shared_->growth->chunk_bytes;
}

void BufferPool::PinRegion() {
  // acq_rel with TrimLocked's acquire load: a pin taken before a Trim()
  // starts is seen by it; one taken while a Trim() runs waits for `mu`, so
  // that the caller's registration never sees a page about to go.
  if (Growth* const g = shared_->growth.get()) {
    const std::lock_guard<std::mutex> lock(g->mu);
    g->pinned.fetch_add(1, std::memory_order_acq_rel);
  }
}

void BufferPool::UnpinRegion() {
  if (Growth* const g = shared_->growth.get()) {
    g->pinned.fetch_sub(1, std::memory_order_acq_rel);
  }
}

}  // namespace bufpool

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
// either. Chunk c is
//
//   backed:     its memory populated, its slots free (in the depot or a
//               cache, or held by a trimmer that may still hand them out)
//               or in use;
//   unbacked:   its bit set in `unbacked`, its memory given back, its slots
//               in no free store, so no call can hand one out; or
//   in transit: claimed by one grower (its bit cleared, its memory being
//               populated) or one trimmer (all its slots taken out of every
//               free store, its memory being given back). Its owner alone
//               touches it; it becomes backed or unbacked when that is done.
//
// Nobody waits. No acquire, release, growth or drain takes a lock of this
// file, and no system call of this file (populate, mlock, DONTNEED) runs
// under a lock that any of them takes. A grower or trimmer stopped at any
// point (a signal handler that sleeps, preemption) stalls no call that
// needs a buffer: a caller that misses takes the slots a trimmer holds and
// has not yet claimed for decommitting, or claims other chunks and grows
// itself, or, with every chunk in use or in another's transit, reports
// empty at once (TryAcquire*) or sleeps until a buffer is released or the
// stopped thread finishes (Acquire(), woken by it). The only slots out of
// reach meanwhile are those in transit: a grower's step before its push,
// a trimmer's chunks being given back, and at most kTrimBatch slots
// between a trimmer's pop and its publication of them.
//
// Growing (the slow path only). A call that found no free slot anywhere
// (TakeAnywhere gave kNoSlot) calls GrowAndTake: it looks at the depot
// again, then at a running trim's slots, then claims the lowest unbacked
// chunks (next_step of them) by clearing their bits, populates them with
// one MADV_POPULATE_WRITE per run of adjacent chunks (mlock with
// lock_memory), raises `committed`, keeps the lowest new slot and pushes
// the rest to the depot in one push, lowest on top. Concurrent growers
// claim disjoint chunks, so each grows its own step (bounded by threads x
// step; a later Trim() gives the excess back). Each growth on demand
// doubles next_step (up to max_step_chunks, an eighth of the ceiling), and
// a trim that gives memory back resets it: a burst is met with ever larger
// steps, so its cost tends to that of the memory, and what it backs ahead
// of need is at most what it already needed (or an eighth of the
// ceiling). The hit path, the caches and the drain never look at any of
// this: to them grown slots are ordinary depot slots.
//
// Trimming. Trim() holds `mu` (trimmers only), drains the caches (a
// drain waits for no one and no one waits for it: drain.cc), sets
// `trimming`, and pops the depot kTrimBatch slots at a time into `held`,
// publishing each batch (entry i: slot + 1). It counts the entries of each
// chunk and chooses, from the top chunk down, the chunks all of whose slots
// it holds while more than `keep_free` free slots would stay. It then
// claims the chosen chunks' entries (an exchange each: a caller may have
// taken some meanwhile, and then that chunk is not given back), returns
// every other entry to the depot (the lowest chunks last, so on top),
// clears `trimming`, and only then gives the claimed chunks back
// (MADV_DONTNEED) and sets their bits. MADV_DONTNEED rather than
// MADV_FREE: the memory must leave the process's resident set now (the
// point of a trim, and what an operator watches), and a trimmed chunk is
// populated again before reuse anyway, so MADV_FREE's saving (pages kept
// until the kernel needs them, no zeroing if reused) would never be
// collected; it also leaves RSS high until reclaim. With huge pages every
// chunk is whole 2 MiB pages: a partial DONTNEED of a THP would split it,
// and khugepaged could collapse the range again (it fills a huge page
// around a single resident 4 KiB page by default), undoing the trim; a
// hugetlb page cannot be split at all.
//
// Taking a trimmer's slots. The trimmer stores each entry (release) before
// it raises held_n; a taker exchanges an entry with 0 (acq_rel), so it
// synchronizes with the store of the slot it got, which follows the
// trimmer's pop of it (acquire) and so the release that freed it: the
// buffer's bytes are the releaser's. The trimmer's own claims and returns
// are exchanges too, so each slot leaves `held` once. Entries of an
// earlier trim are all 0 before the next one writes them.
//
// Exhaustion (what a caller that finds nothing may conclude). Trim() sets
// `trimming` (seq_cst) before its first pop and clears it after the last
// unclaimed slot is back; GrowAndTake loads `trimming` (seq_cst) before
// its own look at the depot. If that look found the depot empty because a
// trimmer held its slots, the trimmer's store precedes its pop, which
// precedes the look, so either the load saw `trimming` set (the caller then
// looks at `held`) or the load came before the store, and the slots were
// released after the call looked at them first (a release concurrent with
// the call, which may be ordered after it).
//
// Sleepers. Trim() gives nothing back while a thread sleeps in Acquire()
// (release_limit_ < 0): it looks before it pops and again before it
// claims. A sleeper tries GrowAndTake each time it wakes. A sleeper that
// counts itself while Trim() runs is woken at its end: the sleeper's count
// (seq_cst) and Trim()'s check of it (seq_cst, after it raised
// `unbacked_chunks`) form a store-load pair with the sleeper's load of
// `unbacked_chunks`, so one of them sees the other. A grower wakes
// sleepers for what it pushed (the caller's *reshelved).
//
// fork(). A grower between its claim and its push, counted in
// Shared::passing (ResizePass), is waited for by the prepare handler, as
// are the single calls that pass a busy cache; a trimmer holds `mu`, which
// the handler takes. So the child sees every chunk backed or unbacked.
#include <algorithm>
#include <chrono>
#include <cstring>
#include <limits>
#include <mutex>
#include <new>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "pool/pool_internal.h"

namespace bufpool {

namespace {

// io_uring's limit on a registered-buffer table (IORING_MAX_REG_BUFFERS).
constexpr uint64_t kMaxChunks = 16384;
// Slots a trimmer pops from the depot before it publishes them.
constexpr uint32_t kTrimBatch = 256;
// The largest step a doubling reaches: this share of the ceiling (so a
// burst's last step backs at most an eighth of it more than it needs).
constexpr uint32_t kMaxStepShare = 8;

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

// Slots of chunk c: [first, last).
uint32_t FirstSlot(const Growth& g, uint32_t c) { return c * g.chunk_slots; }
uint32_t LastSlot(const Growth& g, uint32_t c, size_t capacity) {
  return static_cast<uint32_t>(
      std::min<size_t>(size_t{c + 1} * g.chunk_slots, capacity));
}

// Chunks [c0, c1), adjacent.
struct Run {
  uint32_t c0;
  uint32_t c1;
};

// Appends chunk c to `runs`, extending the last run when adjacent.
void AddChunk(std::vector<Run>& runs, uint32_t c) {
  if (!runs.empty() && runs.back().c1 == c) {
    ++runs.back().c1;
  } else {
    runs.push_back({c, c + 1});
  }
}

// Claims up to `want` unbacked chunks, the lowest first, clearing their
// bits; appends them to `runs` (ascending; its capacity must hold `want`
// more, so that nothing here allocates) and returns how many.
uint32_t ClaimChunks(Growth& g, uint32_t want, std::vector<Run>& runs) {
  uint32_t got = 0;
  for (uint32_t w = 0; w < g.words && got < want; ++w) {
    uint64_t bits = g.unbacked[w].load(std::memory_order_relaxed);
    while (bits != 0 && got < want) {
      // The lowest run of set bits, at most want - got long.
      const int lo = __builtin_ctzll(bits);
      const uint64_t from_lo = bits >> lo;
      int len = ~from_lo == 0 ? 64 - lo : __builtin_ctzll(~from_lo);
      len = static_cast<int>(std::min<uint32_t>(len, want - got));
      const uint64_t mask =
          (len == 64 ? ~uint64_t{0} : (uint64_t{1} << len) - 1) << lo;
      // acquire: the trimmer's decommit of these chunks happened before its
      // fetch_or (release) set their bits.
      const uint64_t old =
          g.unbacked[w].fetch_and(~mask, std::memory_order_acquire);
      uint64_t mine = old & mask;  // another grower may have taken some
      got += static_cast<uint32_t>(__builtin_popcountll(mine));
      while (mine != 0) {
        const int b = __builtin_ctzll(mine);
        mine &= mine - 1;
        AddChunk(runs, w * 64 + static_cast<uint32_t>(b));
      }
      bits = old & ~mask;
    }
  }
  if (got != 0) g.unbacked_chunks.fetch_sub(got, std::memory_order_seq_cst);
  return got;
}

// Returns chunks [c0, c1) to the reserve (their memory already given back,
// or never backed).
void UnclaimRun(Growth& g, Run r) {
  for (uint32_t c = r.c0; c < r.c1; ++c) {
    // release: pairs with ClaimChunks' acquire (see there).
    g.unbacked[c >> 6].fetch_or(uint64_t{1} << (c & 63),
                                std::memory_order_release);
  }
  g.unbacked_chunks.fetch_add(r.c1 - r.c0, std::memory_order_seq_cst);
}

// Counted in Shared::passing while a grower holds claimed chunks, so that
// a fork() waits for it to push them (growth.cc's "fork()"); while a fork
// is being prepared, waits for it (fork() waits for every call anyway; the
// caller holds no lock that the prepare handler takes).
class ResizePass {
 public:
  explicit ResizePass(PoolAccess::SharedState& s) : s_(s) {
    for (;;) {
      s_.passing.fetch_add(1, std::memory_order_seq_cst);
      if (!s_.forking.load(std::memory_order_seq_cst)) return;
      s_.passing.fetch_sub(1, std::memory_order_release);
      while (s_.forking.load(std::memory_order_seq_cst)) {
        std::this_thread::yield();
      }
    }
  }
  ~ResizePass() { s_.passing.fetch_sub(1, std::memory_order_release); }
  ResizePass(const ResizePass&) = delete;
  ResizePass& operator=(const ResizePass&) = delete;

 private:
  PoolAccess::SharedState& s_;
};

// Records a refused growth for Acquire()'s error and Grow().
void NoteFailure(Growth& g, const absl::Status& st, size_t len,
                 absl::Status* error) {
  g.grow_failures.fetch_add(1, std::memory_order_relaxed);
  absl::Status e(st.code(), absl::StrCat("BufferPool: growing by ", len,
                                         " bytes failed: ", st.message()));
  if (error != nullptr) *error = e;
  const std::lock_guard<std::mutex> lock(g.error_mu);
  g.last_error = std::move(e);
}

absl::Status AtCeiling(const Growth& g, size_t capacity) {
  (void)g;
  return absl::ResourceExhaustedError(
      absl::StrCat("BufferPool: at its ceiling of ", capacity, " buffers"));
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
  g->max_step_chunks = std::max(g->step_chunks, g->chunks / kMaxStepShare);
  g->next_step.store(g->step_chunks, std::memory_order_relaxed);
  g->idle_ns = absl::ToInt64Nanoseconds(options.trim_after_idle);
  const auto backed = static_cast<uint32_t>(std::min<size_t>(
      g->chunks, (count + g->chunk_slots - 1) / g->chunk_slots));
  g->words = (g->chunks + 63) / 64;
  g->unbacked.reset(new std::atomic<uint64_t>[g->words]);
  for (uint32_t w = 0; w < g->words; ++w) {
    g->unbacked[w].store(0, std::memory_order_relaxed);
  }
  for (uint32_t c = backed; c < g->chunks; ++c) {
    g->unbacked[c >> 6].fetch_or(uint64_t{1} << (c & 63),
                                 std::memory_order_relaxed);
  }
  g->unbacked_chunks.store(g->chunks - backed, std::memory_order_relaxed);
  static_assert(sizeof(std::atomic<uint32_t>) == sizeof(uint32_t));
  g->held.reset(static_cast<std::atomic<uint32_t>*>(
      std::calloc(p.capacity_, sizeof(std::atomic<uint32_t>))));
  if (g->held == nullptr) throw std::bad_alloc();
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

namespace {

// Populates each run with one call, outside every lock. A refused run goes
// back to the reserve, and so does everything after it: the pool serves
// what it has. Leaves in `runs` the runs committed; returns their slots.
size_t CommitRuns(Arena& arena, Growth& g, size_t capacity,
                  std::vector<Run>& runs, absl::Status* error) {
  size_t ok_runs = 0;
  for (; ok_runs < runs.size(); ++ok_runs) {
    const Run r = runs[ok_runs];
    const size_t off = size_t{r.c0} * g.chunk_bytes;
    const size_t len =
        std::min(arena.mapped_size(), size_t{r.c1} * g.chunk_bytes) - off;
    if (absl::Status st = arena.Commit(off, len); !st.ok()) {
      (void)arena.Decommit(off, len);  // what the refused call backed
      NoteFailure(g, st, len, error);
      break;
    }
  }
  const bool all_committed = ok_runs == runs.size();
  for (size_t i = ok_runs; i < runs.size(); ++i) UnclaimRun(g, runs[i]);
  runs.resize(ok_runs);
  size_t n = 0;
  for (const Run r : runs) {
    n += LastSlot(g, r.c1 - 1, capacity) - FirstSlot(g, r.c0);
  }
  if (n != 0 && all_committed) {
    // A step that committed all it claimed ends the last failure's story:
    // a caller that later finds nothing to claim is at the ceiling, not
    // refused again.
    const std::lock_guard<std::mutex> lock(g.error_mu);
    g.last_error = absl::OkStatus();
  }
  return n;
}

// Pushes the n new slots of `runs` but `skip` (the one a caller takes, or
// kNoSlot) onto the depot in one push, lowest on top: the lowest
// addresses are handed out first (what stays hot stays low, and the high
// chunks are the ones Trim() finds free). Without memory for the list,
// pieces of it, the highest first.
void PushNewSlots(Depot& depot, const Growth& g, const std::vector<Run>& runs,
                  size_t capacity, size_t n, uint32_t skip) {
  std::vector<uint32_t> slots;
  try {
    slots.reserve(n);
  } catch (const std::bad_alloc&) {
  }
  uint32_t piece[256];
  uint32_t piece_n = 0;
  for (size_t j = runs.size(); j > 0; --j) {
    const Run r = runs[j - 1];
    const uint32_t first = FirstSlot(g, r.c0);
    for (uint32_t i = LastSlot(g, r.c1 - 1, capacity); i > first; --i) {
      if (i - 1 == skip) continue;
      if (slots.capacity() >= n) {
        slots.push_back(i - 1);
        continue;
      }
      piece[piece_n++] = i - 1;
      if (piece_n == 256) {
        std::reverse(piece, piece + piece_n);
        depot.Push(piece, piece_n, nullptr);
        piece_n = 0;
      }
    }
  }
  if (piece_n != 0) {
    std::reverse(piece, piece + piece_n);
    depot.Push(piece, piece_n, nullptr);
  }
  if (!slots.empty()) {
    std::reverse(slots.begin(), slots.end());
    depot.Push(slots.data(), static_cast<uint32_t>(slots.size()), nullptr);
  }
}

}  // namespace

uint32_t PoolAccess::GrowChunks(BufferPool& p, uint32_t chunks, uint32_t* taken,
                                absl::Status* error) {
  SharedState& s = S(p);
  Growth& g = *s.growth;
  const size_t capacity = p.capacity_;
  std::vector<Run> runs;
  uint32_t freed = 0;
  {
    const ResizePass pass(s);
    // Room for a run per chunk first, so that claiming allocates nothing.
    try {
      runs.reserve(std::min(chunks, g.chunks));
    } catch (const std::bad_alloc&) {
      if (error != nullptr) {
        *error = absl::ResourceExhaustedError(
            "BufferPool: growing: out of memory for the step's list");
      }
      return 0;
    }
    if (ClaimChunks(g, std::min(chunks, g.chunks), runs) == 0) {
      if (error != nullptr) {
        const std::lock_guard<std::mutex> lock(g.error_mu);
        *error = g.last_error.ok() ? AtCeiling(g, capacity) : g.last_error;
      }
      return 0;
    }
    if (resize_point_for_test != nullptr) [[unlikely]] {
      resize_point_for_test(ResizePoint::kGrowClaimed);
    }
    const size_t n = CommitRuns(s.arena, g, capacity, runs, error);
    if (n == 0) return 0;
    // Counted before they are free (accounting.cc): in transit = in use.
    s.committed.fetch_add(n, std::memory_order_relaxed);
    g.grows.fetch_add(1, std::memory_order_relaxed);
    for (const Run r : runs) {
      const uint32_t first = FirstSlot(g, r.c0);
      BUFPOOL_INTERNAL_POISON(
          p.SlotData(first),
          size_t{LastSlot(g, r.c1 - 1, capacity) - first} * p.buffer_size_);
    }
    const uint32_t lowest = FirstSlot(g, runs[0].c0);
    if (taken != nullptr) {
      *taken = lowest;
      Lent(p, 1);  // handed out: accounted before it reaches its user
    }
    PushNewSlots(s.depot, g, runs, capacity, n,
                 taken != nullptr ? lowest : BufferPool::kNoSlot);
    const uint32_t pushed =
        static_cast<uint32_t>(n) - (taken != nullptr ? 1 : 0);
    if (p.cache_capacity_ != 0 && pushed != 0) {
      s.depot_free.fetch_add(pushed, std::memory_order_relaxed);
    }
    freed = static_cast<uint32_t>(n);
  }
  return freed;
}

uint32_t PoolAccess::GrowAndTake(BufferPool& p, uint32_t* reshelved,
                                 absl::Status* error) {
  SharedState& s = S(p);
  Growth* const g = s.growth.get();
  if (g == nullptr) {  // a fixed pool; a shared one takes a batch
    if (s.xproc == nullptr) return BufferPool::kNoSlot;
    // What an earlier batch left in the depot first (a bulk call's loop).
    const uint32_t slot = TakeFromDepot(p, reshelved);
    return slot != BufferPool::kNoSlot ? slot : SharedTake(p, reshelved);
  }
  // "Exhaustion": `trimming` before the depot.
  const bool trimming = g->trimming.load(std::memory_order_seq_cst);
  uint32_t slot = TakeFromDepot(p, reshelved);
  if (slot != BufferPool::kNoSlot) return slot;
  if (trimming || g->trimming.load(std::memory_order_seq_cst)) {
    slot = TakeFromTrimmer(p);
    if (slot != BufferPool::kNoSlot) return slot;
  }
  if (g->unbacked_chunks.load(std::memory_order_seq_cst) <= 0) {
    if (error != nullptr) *error = AtCeiling(*g, p.capacity_);
    return BufferPool::kNoSlot;
  }
  // The step: each growth doubles the next, until a trim says the load
  // has fallen (a burst is met with ever larger steps).
  const uint32_t step = g->next_step.load(std::memory_order_relaxed);
  const uint32_t freed = GrowChunks(p, step, &slot, error);
  if (freed == 0) return BufferPool::kNoSlot;
  g->next_step.store(std::min(g->max_step_chunks, step * 2),
                     std::memory_order_relaxed);
  *reshelved += freed - 1;  // others may sleep for them
  return slot;
}

uint32_t PoolAccess::TakeFromTrimmer(BufferPool& p) {
  Growth& g = *S(p).growth;
  const uint32_t n = g.held_n.load(std::memory_order_acquire);
  const uint32_t from =
      std::min(n, g.take_from.load(std::memory_order_relaxed));
  for (uint32_t k = 0; k < n; ++k) {
    const uint32_t i = from + k < n ? from + k : from + k - n;
    if (g.held[i].load(std::memory_order_relaxed) == 0) continue;
    // acq_rel: see "Taking a trimmer's slots".
    const uint32_t v = g.held[i].exchange(0, std::memory_order_acq_rel);
    if (v == 0) continue;
    g.take_from.store(i + 1, std::memory_order_relaxed);
    Lent(p, 1);  // out of the depot already; now in use
    return v - 1;
  }
  return BufferPool::kNoSlot;
}

absl::Status BufferPool::Grow(size_t buffers) {
  Growth* const g = shared_->growth.get();
  if (g == nullptr) {
    return absl::FailedPreconditionError(
        "BufferPool::Grow: a fixed pool (max_buffer_count 0) does not grow");
  }
  absl::Status error;
  const uint32_t chunks = static_cast<uint32_t>(std::min<size_t>(
      g->chunks,
      std::max<size_t>(g->step_chunks,
                       (buffers + g->chunk_slots - 1) / g->chunk_slots)));
  uint32_t freed = 0;
  while (freed < buffers || freed == 0) {
    const uint32_t more =
        PoolAccess::GrowChunks(*this, chunks, nullptr, &error);
    if (more == 0) break;
    freed += more;
    PoolAccess::WakeWaiters(*this, more);
    if (freed >= buffers) break;
  }
  if (freed == 0) return error;
  return absl::OkStatus();
}

namespace {

using SharedState = PoolAccess::SharedState;

void TrimPoint(PoolAccess::ResizePoint point) {
  if (PoolAccess::resize_point_for_test != nullptr) [[unlikely]] {
    PoolAccess::resize_point_for_test(point);
  }
}

// What one trim works with: the pool's fields it reads, and lists
// allocated before any slot leaves the depot, so that nothing allocates
// while the trimmer holds free slots.
struct TrimWork {
  SharedState& s;
  Growth& g;
  size_t capacity;
  bool caches;                    // depot_free is kept (caches on)
  std::vector<uint32_t> count;    // [chunk]: entries seen, then claimed
  std::vector<uint32_t> start;    // [chunk + 1]: counting sort of entries
  std::vector<uint32_t> order;    // entry indexes, grouped by chunk
  std::vector<uint32_t> claimed;  // slots claimed for giving back
  std::vector<Run> runs;          // of claimed chunks, to give back
  uint32_t back[kTrimBatch];      // slots on their way back to the depot
  uint32_t back_n = 0;
  size_t returned = 0;  // slots put back

  uint32_t Whole(uint32_t c) const {
    return LastSlot(g, c, capacity) - FirstSlot(g, c);
  }
  uint32_t ChunkOf(uint32_t entry) const { return (entry - 1) / g.chunk_slots; }
  void FlushBack() {
    if (back_n == 0) return;
    s.depot.Push(back, back_n, nullptr);
    if (caches) s.depot_free.fetch_add(back_n, std::memory_order_relaxed);
    returned += back_n;
    back_n = 0;
  }
  void PutBack(uint32_t slot) {
    back[back_n++] = slot;
    if (back_n == kTrimBatch) FlushBack();
  }
};

// 1. The depot's slots into `held`, published a batch at a time; at most
// `most` entries (a slot taken from `held`, released and popped again
// would otherwise come round for ever). Returns how many.
uint32_t PopIntoHeld(TrimWork& w, size_t most) {
  uint32_t n = 0;
  while (n < most) {
    uint32_t batch[kTrimBatch];
    uint32_t reshelved = 0;  // put back by the trim anyway
    const uint32_t k = w.s.depot.Pop(
        batch, static_cast<uint32_t>(std::min<size_t>(kTrimBatch, most - n)),
        nullptr, &reshelved);
    if (k == 0) break;
    if (w.caches) w.s.depot_free.fetch_sub(k, std::memory_order_relaxed);
    TrimPoint(PoolAccess::ResizePoint::kTrimPopped);
    for (uint32_t i = 0; i < k; ++i) {
      w.g.held[n + i].store(batch[i] + 1, std::memory_order_release);
    }
    n += k;
    w.g.held_n.store(n, std::memory_order_release);
  }
  TrimPoint(PoolAccess::ResizePoint::kTrimHolding);
  return n;
}

// 2. Counts each chunk's entries among the n (a taker may empty some
// meanwhile: that chunk then fails its claim). 3. Chooses, from the top
// down, the chunks all of whose slots are here, while more than keep_free
// free slots would stay; none while a sleeper waits. count[c] becomes 1
// for a chosen chunk, else 0.
void ChooseChunks(TrimWork& w, uint32_t n, size_t keep_free, bool sleeper) {
  size_t stay = 0;
  for (uint32_t i = 0; i < n; ++i) {
    const uint32_t v = w.g.held[i].load(std::memory_order_relaxed);
    if (v == 0) continue;
    ++w.count[w.ChunkOf(v)];
    ++stay;
  }
  for (uint32_t c = w.g.chunks; c > 0; --c) {
    const uint32_t whole = w.Whole(c - 1);
    const bool give = !sleeper && w.count[c - 1] == whole && stay >= whole &&
                      stay - whole >= keep_free;
    if (give) stay -= whole;
    w.count[c - 1] = give ? 1 : 0;
  }
}

// 4. Claims the chosen chunks' entries, one exchange each; count[c]
// becomes the slots of chunk c claimed.
void ClaimChosen(TrimWork& w, uint32_t n) {
  for (uint32_t i = 0; i < n; ++i) {
    const uint32_t v = w.g.held[i].load(std::memory_order_relaxed);
    if (v == 0 || w.count[w.ChunkOf(v)] == 0) continue;
    const uint32_t mine = w.g.held[i].exchange(0, std::memory_order_acq_rel);
    if (mine != 0) w.claimed.push_back(mine - 1);
  }
  std::fill(w.count.begin(), w.count.end(), 0);
  for (const uint32_t slot : w.claimed) ++w.count[slot / w.g.chunk_slots];
}

// 5. Everything else back to the depot, the highest chunks first so that
// the lowest end on top (a counting sort of the entries by chunk), then
// the slots of chosen chunks that lost one to a taker; `claimed` keeps
// the slots of whole chunks only.
void PutBackTheRest(TrimWork& w, uint32_t n) {
  Growth& g = w.g;
  for (uint32_t i = 0; i < n; ++i) {
    const uint32_t v = g.held[i].load(std::memory_order_relaxed);
    if (v != 0) ++w.start[w.ChunkOf(v) + 1];
  }
  for (uint32_t c = 0; c < g.chunks; ++c) w.start[c + 1] += w.start[c];
  w.order.resize(w.start[g.chunks]);  // within the reserve: no allocation
  for (uint32_t i = 0; i < n; ++i) {
    const uint32_t v = g.held[i].load(std::memory_order_relaxed);
    if (v == 0) continue;
    const uint32_t c = w.ChunkOf(v);
    if (w.start[c] < w.start[c + 1]) w.order[w.start[c]++] = i;
  }
  for (size_t j = w.order.size(); j > 0; --j) {
    const uint32_t v =
        g.held[w.order[j - 1]].exchange(0, std::memory_order_acq_rel);
    if (v != 0) w.PutBack(v - 1);
  }
  for (uint32_t i = 0; i < n; ++i) {  // what the grouping missed (races)
    if (g.held[i].load(std::memory_order_relaxed) == 0) continue;
    const uint32_t v = g.held[i].exchange(0, std::memory_order_acq_rel);
    if (v != 0) w.PutBack(v - 1);
  }
  size_t kept = 0;  // claimed slots of whole chunks, to the front
  for (const uint32_t slot : w.claimed) {
    const uint32_t c = slot / g.chunk_slots;
    if (w.count[c] == w.Whole(c)) {
      w.claimed[kept++] = slot;
    } else {
      w.PutBack(slot);
    }
  }
  w.claimed.resize(kept);
  w.FlushBack();
}

// 6. Gives the claimed chunks back, a run of adjacent ones per call; no
// lock but `mu` (trimmers') is held. A chunk the system would not
// decommit is backed still: its slots go back to the depot. Returns the
// bytes given back.
size_t DecommitClaimed(TrimWork& w) {
  Growth& g = w.g;
  for (uint32_t c = g.chunks; c > 0; --c) {
    if (w.count[c - 1] == 0 || w.count[c - 1] != w.Whole(c - 1)) continue;
    if (!w.runs.empty() && w.runs.back().c0 == c) {
      --w.runs.back().c0;
    } else {
      w.runs.push_back({c - 1, c});
    }
  }
  if (!w.runs.empty()) TrimPoint(PoolAccess::ResizePoint::kTrimDecommitting);
  size_t bytes = 0;
  for (const Run r : w.runs) {
    const size_t off = size_t{r.c0} * g.chunk_bytes;
    const size_t len =
        std::min(w.s.arena.mapped_size(), size_t{r.c1} * g.chunk_bytes) - off;
    if (!w.s.arena.Decommit(off, len).ok()) {
      for (const uint32_t slot : w.claimed) {
        if (slot >= FirstSlot(g, r.c0) && slot < FirstSlot(g, r.c1)) {
          w.PutBack(slot);
        }
      }
      w.FlushBack();
      continue;
    }
    // Lowered after the slots left the depot (accounting.cc).
    const size_t nslots =
        LastSlot(g, r.c1 - 1, w.capacity) - FirstSlot(g, r.c0);
    w.s.committed.fetch_sub(nslots, std::memory_order_relaxed);
    UnclaimRun(g, r);
    bytes += len;
  }
  return bytes;
}

}  // namespace

size_t PoolAccess::TrimLocked(BufferPool& p, size_t keep_free) {
  SharedState& s = S(p);
  Growth& g = *s.growth;
  // The kernel holds registered pages: DONTNEED would leave it writing to
  // pages the process no longer maps. A sleeper needs what is free.
  if (g.pinned.load(std::memory_order_acquire) != 0 ||
      Waiting(p, std::memory_order_seq_cst)) {
    return 0;
  }
  TrimWork w{.s = s,
             .g = g,
             .capacity = p.capacity_,
             .caches = p.cache_capacity_ != 0,
             .count = {},
             .start = {},
             .order = {},
             .claimed = {},
             .runs = {},
             .back = {}};
  try {
    w.count.assign(g.chunks, 0);
    w.start.assign(size_t{g.chunks} + 1, 0);
    w.order.reserve(s.committed.load(std::memory_order_relaxed));
    w.claimed.reserve(w.order.capacity());
    w.runs.reserve(g.chunks);
  } catch (const std::bad_alloc&) {
    return 0;
  }
  // Nothing below allocates: no more entries than these lists hold (a
  // growth meanwhile may add free slots; those stay in the depot).
  const size_t most = std::min<size_t>(
      w.capacity, std::min(w.order.capacity(), w.claimed.capacity()));
  g.take_from.store(0, std::memory_order_relaxed);
  g.trimming.store(true, std::memory_order_seq_cst);  // see "Exhaustion"
  const uint32_t n = PopIntoHeld(w, most);
  ChooseChunks(w, n, keep_free, Waiting(p, std::memory_order_seq_cst));
  ClaimChosen(w, n);
  PutBackTheRest(w, n);
  // Every free slot but the claimed chunks' is back: callers that miss from
  // here on grow, or find the pool at its ceiling.
  g.held_n.store(0, std::memory_order_relaxed);
  g.trimming.store(false, std::memory_order_seq_cst);
  const size_t bytes = DecommitClaimed(w);
  if (bytes != 0) {
    g.trims.fetch_add(1, std::memory_order_relaxed);
    g.next_step.store(g.step_chunks, std::memory_order_relaxed);
  }
  // Wake any sleeper that counted itself meanwhile: it grows what it needs
  // ("Sleepers"); with nothing put back, pretend two so all look again.
  WakeWaiters(p, static_cast<uint32_t>(std::max<size_t>(w.returned, 2)));
  return bytes;
}

size_t BufferPool::Trim(size_t keep_free) {
  Growth* const g = shared_->growth.get();
  if (g == nullptr) return 0;
  const std::lock_guard<std::mutex> lock(g->mu);
  // The caches' idle buffers too: a caller asking for memory back expects
  // all that is free. A cache in use refills from the depot.
  PoolAccess::WakeWaiters(*this, PoolAccess::DrainAll(*this));
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
  if (!lock.owns_lock()) return 0;  // another trimmer: later
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
  // Under `mu`: a pin taken while a Trim() runs waits for it (only for a
  // trimmer: no acquire takes `mu`), so that the caller's registration
  // never sees a page about to go. acq_rel with TrimLocked's acquire load.
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

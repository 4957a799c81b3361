// A pool shared by processes (PoolOptions::shared): the memfd and its
// layout (shared_region.h), joining, the ledger, the shared depot, death
// and reclaim, Export and Import.
//
// What is shared. The buffers, the shared depot (a stack of free slot
// numbers), the ledger (one owner word per slot) and the process table.
// What is not: each process's per-CPU caches and its own depot (the
// private Depot of BufferPool::Shared), which together hold the slots the
// ledger says the process owns and that it does not hand out. The inline
// hit path touches only those, so it is a private pool's; slots cross
// between a process and the shared depot in batches on the slow path
// (SharedTake when the process has none free anywhere, SharedMaybeGive
// when its depot holds more than its share, `keep`, down to half of it),
// and one at a time through Export and Import.
//
// Invariants (every slot s, at every instant no one holds the mutex):
//   L1. ledger[s] is kFree  <=>  s is in depot[0, depot_count), once.
//   L2. ledger[s] is kOwned by i  =>  s is in process i's caches or depot,
//       or out in its hands (handle, raw pointer, chain, ring), in one
//       place (the private pool's invariants), and nowhere else.
//   L3. ledger[s] is kExported by i with generation g  =>  s is in no
//       process's caches, depot or hands; the one token (s, g) names it.
//   L4. Every change of a ledger word to or from kFree, of depot_count, of
//       the depot stack and of a process entry's state is made under `mu`.
//       Without it only two changes happen, each one write of one word:
//       Export (kOwned by me -> kExported by me, by the owner, which is
//       alive: a load and a plain store, not a CAS, which is right only
//       because nothing else changes a live owner's kOwned word: Import
//       changes only kExported words, ReclaimDead only the dead's) and
//       Import (kExported -> kOwned by the importer: a CAS, racing a
//       reclaimer's CAS of the same word, one wins).
//
// Kill -9 at any instruction. A process that dies holds nothing but what
// the ledger names as its own (L2, L3): its caches and depot die with it,
// and what it held is kOwned or kExported by its index. What it may leave
// half done:
//   * Outside the mutex: an Export (one store) or Import (one CAS) is one
//     write of one word: before it nothing
//     changed, after it the word names the new state; a slot whose CAS
//     made it the dead process's is reclaimed with the rest. Between a
//     SharedTake's unlock and its push into the private depot, or a
//     SharedMaybeGive's pop and its lock, the slots are kOwned by it and
//     reclaimed likewise.
//   * Under the mutex (TakeLocked, GiveLocked, ReclaimLocked, registering
//     and leaving): each writes its intent (op, process, count) first and
//     clears it last, and between them changes ledger words one at a time
//     and depot_count once (Take, Give) or after each slot (Reclaim). A
//     death anywhere in between leaves the ledger words each in a state
//     that L2/L3 allow (kOwned by the dead process, or kFree), while the
//     stack and count may disagree with them. The next locker gets
//     EOWNERDEAD and repairs (Repair): it rebuilds the stack from the
//     ledger, every kFree slot once, which restores L1 whatever step the
//     dead holder reached; the slots still kOwned by the dead process are
//     given back by the next ReclaimDead(). Ledger words are the only
//     truth; the stack is an index of them. So a repair finishes a Give
//     (the slots it had marked free are free), undoes a Take (the slots it
//     had not marked stay free; those it had marked are the dead's, to be
//     reclaimed), and finishes a Reclaim's slots so far (the rest are
//     reclaimed again, harmlessly: reclaiming is idempotent).
//   * A reclaimer that dies under the mutex is itself the dead holder: the
//     next locker repairs, and the entry it was reclaiming is still in the
//     table (an entry is emptied after its last slot), so the next
//     ReclaimDead() takes the work over.
//   * Registering: the entry is marked live only after its lock is held;
//     a registrant that dies before leaves a free entry or a live one
//     whose lock is free, which ReclaimDead() empties.
//
// Death detection. Each process opens its own open file description of
// the memfd (open("/proc/self/fd/N")) and holds an OFD write lock on the
// byte of its index; the kernel drops it when the last descriptor of that
// description closes, which is at the process's death (or its clean
// exit). F_OFD_GETLK from another description says whether the byte is
// locked: a live entry whose byte is free is dead. A fork() child inherits
// the description: the child handler closes its copy, so the parent's
// death is still seen; the descriptor is close-on-exec. No pid is trusted:
// pid and start time only name the process in messages.
//
// Memory ordering. The mutex orders every change under it (a slot's
// buffer bytes written by one process before it gave the slot back are
// seen by the next process that takes it). Export stores its word with
// release after the exporter's last write to the buffer; Import's CAS is
// acq_rel, so the importer sees those bytes. ReclaimDead's CAS of an
// exported word is acq_rel against Import's: exactly one wins.
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <new>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "arena/arena.h"
#include "os/error.h"
#include "os/memory.h"
#include "os/syscalls.h"
#include "pool/holders.h"
#include "pool/pool_internal.h"

namespace bufpool {

namespace {

using ledger::kExported;
using ledger::kFree;
using ledger::kOwned;

constexpr size_t kHeaderBytes = 4096;
// The most slots one move between the shared depot and a process carries.
constexpr uint32_t kMaxShareBatch = 256;
// The slow path's ReclaimDead() runs at most this often per process.
constexpr int64_t kReclaimEveryNs = 1'000'000;

static_assert(sizeof(SharedHeader) <= kHeaderBytes);
static_assert(sizeof(ProcessEntry) == 64);
static_assert(std::atomic<uint64_t>::is_always_lock_free &&
              sizeof(std::atomic<uint64_t>) == 8);

size_t RoundUp(size_t n, size_t to) { return (n + to - 1) / to * to; }

int64_t NowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// The process's start time, /proc/self/stat field 22 (clock ticks after
// boot): with the pid, a name no later process shares. 0 if unreadable.
uint64_t StartTime() {
  const int fd = os::Sys().open("/proc/self/stat", O_RDONLY, 0);
  if (fd < 0) return 0;
  char buf[1024];
  ssize_t n;
  do {
    n = os::Sys().read(fd, buf, sizeof(buf) - 1);
  } while (n < 0 && errno == EINTR);
  os::Sys().close(fd);
  if (n <= 0) return 0;
  buf[n] = '\0';
  // The command (field 2) may hold spaces and parentheses: count from the
  // last ')'; field 3 follows it.
  const char* p = std::strrchr(buf, ')');
  if (p == nullptr) return 0;
  int field = 2;
  while (*p != '\0' && field < 22) {
    if (*p++ == ' ') ++field;
  }
  return std::strtoull(p, nullptr, 10);
}

struct flock ByteLock(short type, uint32_t index) {
  struct flock l;
  std::memset(&l, 0, sizeof(l));
  l.l_type = type;
  l.l_whence = SEEK_SET;
  l.l_start = index;
  l.l_len = 1;
  return l;
}

// Whether process entry i's lock is held by some description other than
// ours. On an error it answers "alive": never reclaim on a doubt.
bool Alive(const ProcessShare& x, uint32_t i) {
  struct flock l = ByteLock(F_WRLCK, i);
  if (os::Sys().fcntl_lock(x.lock_fd, F_OFD_GETLK, &l) != 0) return true;
  return l.l_type != F_UNLCK;
}

[[noreturn]] void DieShared(const ProcessShare& x, const char* what,
                            uint32_t slot, uint64_t word) {
  std::fprintf(stderr,
               "bufpool: shared pool corrupt: %s: slot %u, owner word "
               "0x%016" PRIx64 " (process pid %d, index %u)\n",
               what, slot, word, x.pid, x.index);
  std::abort();
}

// Rebuilds the depot stack from the ledger (L1), after a holder of the
// mutex died at an unknown step (see the top). Slot 0 ends on top.
void Repair(ProcessShare& x) {
  SharedHeader& h = *x.hdr;
  const auto n = static_cast<uint32_t>(h.buffer_count);
  uint32_t count = 0;
  for (uint32_t s = n; s > 0; --s) {
    if (ledger::Kind(x.ledger[s - 1].load(std::memory_order_relaxed)) ==
        kFree) {
      x.depot[count++] = s - 1;
    }
  }
  h.depot_count = count;
  h.intent_op = SharedOp::kNone;
  h.repairs.fetch_add(1, std::memory_order_relaxed);
}

// Takes the shared mutex; repairs after a dead holder (EOWNERDEAD).
void LockShared(ProcessShare& x) {
  const int rc = ::pthread_mutex_lock(&x.hdr->mu);
  if (rc == EOWNERDEAD) {
    Repair(x);
    ::pthread_mutex_consistent(&x.hdr->mu);
  } else if (rc != 0) {
    std::fprintf(stderr, "bufpool: shared pool's mutex: %s\n",
                 std::strerror(rc));
    std::abort();
  }
}

// The shared mutex for a scope.
class SharedLock {
 public:
  explicit SharedLock(ProcessShare& x) : x_(x) { LockShared(x_); }
  ~SharedLock() { ::pthread_mutex_unlock(&x_.hdr->mu); }
  SharedLock(const SharedLock&) = delete;
  SharedLock& operator=(const SharedLock&) = delete;

 private:
  ProcessShare& x_;
};

void BeginIntent(SharedHeader& h, SharedOp op, uint32_t proc, uint32_t n) {
  h.intent_proc = proc;
  h.intent_n = n;
  h.intent_op = op;
}
void EndIntent(SharedHeader& h) { h.intent_op = SharedOp::kNone; }

// Under the mutex: up to `max` slots from the depot into out[0, n),
// marked ours. Step by step (a death after any of them: see the top):
//   1. intent kTake;  2. each slot's word kFree -> kOwned by us;
//   3. depot_count lowered by n;  4. intent cleared.
uint32_t TakeLocked(ProcessShare& x, uint32_t* out, uint32_t max) {
  SharedHeader& h = *x.hdr;
  const uint32_t n = std::min(max, h.depot_count);
  if (n == 0) return 0;
  BeginIntent(h, SharedOp::kTake, x.index, n);
  for (uint32_t k = 0; k < n; ++k) {
    const uint32_t slot = x.depot[h.depot_count - 1 - k];
    const uint64_t w = x.ledger[slot].load(std::memory_order_relaxed);
    if (ledger::Kind(w) != kFree)
      DieShared(x, "a depot slot not free", slot, w);
    x.ledger[slot].store(ledger::Word(ledger::Gen(w), kOwned, x.index),
                         std::memory_order_relaxed);
    out[k] = slot;
  }
  h.depot_count -= n;
  EndIntent(h);
  return n;
}

// Under the mutex: slots[0, n), ours, onto the depot. Steps:
//   1. intent kGive;  2. each slot written above the count, its word
//   kOwned by us -> kFree;  3. depot_count raised by n;  4. intent cleared.
void GiveLocked(ProcessShare& x, const uint32_t* slots, uint32_t n) {
  SharedHeader& h = *x.hdr;
  BeginIntent(h, SharedOp::kGive, x.index, n);
  const uint32_t count = h.depot_count;
  for (uint32_t k = 0; k < n; ++k) {
    const uint32_t slot = slots[k];
    const uint64_t w = x.ledger[slot].load(std::memory_order_relaxed);
    if (ledger::Kind(w) != kOwned || ledger::Proc(w) != x.index) {
      DieShared(x, "giving back a slot this process does not own", slot, w);
    }
    x.depot[count + k] = slot;
    x.ledger[slot].store(ledger::Word(ledger::Gen(w), kFree, 0),
                         std::memory_order_relaxed);
  }
  h.depot_count = count + n;
  EndIntent(h);
}

// Under the mutex, for a dead process `dead`: every slot it owns or
// exported back onto the depot (an exported one's generation raised, so
// its token turns stale), then its entry emptied. Steps:
//   1. intent kReclaim;  2. per slot: written above the count, its word
//   CAS'd to kFree (an Import may win an exported one: then skipped), the
//   count raised;  3. the entry emptied;  4. intent cleared.
// Idempotent: a second run finds nothing of `dead`'s.
size_t ReclaimLocked(ProcessShare& x, uint32_t dead) {
  SharedHeader& h = *x.hdr;
  BeginIntent(h, SharedOp::kReclaim, dead, 0);
  const auto n = static_cast<uint32_t>(h.buffer_count);
  size_t got = 0;
  for (uint32_t s = 0; s < n; ++s) {
    uint64_t w = x.ledger[s].load(std::memory_order_acquire);
    const uint64_t kind = ledger::Kind(w);
    if (kind == kFree || ledger::Proc(w) != dead) continue;
    uint32_t gen = ledger::Gen(w);
    if (kind == kExported && ++gen == 0) gen = 1;
    x.depot[h.depot_count] = s;
    if (!x.ledger[s].compare_exchange_strong(w, ledger::Word(gen, kFree, 0),
                                             std::memory_order_acq_rel,
                                             std::memory_order_acquire)) {
      continue;  // imported meanwhile: the importer's now
    }
    h.depot_count += 1;
    ++got;
  }
  ProcessEntry& e = x.procs[dead];
  e.pid = 0;
  e.start_time = 0;
  e.state.store(ProcessEntry::kEmpty, std::memory_order_release);
  h.reclaimed.fetch_add(got, std::memory_order_relaxed);
  EndIntent(h);
  return got;
}

// Under the mutex: whether entry i names a process that died (or a
// registrant that died before it finished).
bool DeadLocked(const ProcessShare& x, uint32_t i) {
  return i != x.index &&
         x.procs[i].state.load(std::memory_order_relaxed) !=
             ProcessEntry::kEmpty &&
         !Alive(x, i);
}

// Recounts the processes in the table (entries not empty, the dead not
// yet reclaimed included) and sets what this process keeps in its depot:
// an idle process after a burst then holds at most its caches and
// capacity / (4 x processes) (or one batch) of the slots, the rest given
// back by the burst's own releases.
void RefreshKeep(ProcessShare& x, int64_t now_ns) {
  uint32_t live = 0;
  for (uint32_t i = 0; i < x.hdr->max_processes; ++i) {
    live +=
        x.procs[i].state.load(std::memory_order_relaxed) != ProcessEntry::kEmpty
            ? 1
            : 0;
  }
  const int64_t batch = x.batch;
  const int64_t share = static_cast<int64_t>(x.hdr->buffer_count) /
                        (int64_t{4} * std::max<uint32_t>(live, 1));
  x.keep.store(std::min(int64_t{4} * batch, std::max(batch, share)),
               std::memory_order_relaxed);
  x.keep_ns.store(now_ns, std::memory_order_relaxed);
}

// Takes an entry in the table for this process: its own description of
// the memfd, the lock on the entry's byte, then the entry marked live.
absl::Status RegisterProcess(ProcessShare& x) {
  char path[64];
  std::snprintf(path, sizeof(path), "/proc/self/fd/%d", x.fd);
  x.lock_fd = os::Sys().open(path, O_RDWR, 0);
  if (x.lock_fd < 0) {
    return os::PosixError(absl::StrCat("opening the pool's memfd again (", path,
                                       ") for this process's liveness lock"),
                          errno);
  }
  x.pid = os::Sys().getpid();
  x.start_time = StartTime();
  const uint32_t max = x.hdr->max_processes;
  x.index = max;  // none ours yet: DeadLocked compares with it
  SharedLock lock(x);
  for (uint32_t i = 0; i < max; ++i) {
    ProcessEntry& e = x.procs[i];
    if (e.state.load(std::memory_order_relaxed) != ProcessEntry::kEmpty) {
      if (!DeadLocked(x, i)) continue;
      ReclaimLocked(x, i);
    }
    struct flock l = ByteLock(F_WRLCK, i);
    if (os::Sys().fcntl_lock(x.lock_fd, F_OFD_SETLK, &l) != 0) {
      if (errno == EAGAIN || errno == EACCES) continue;  // a leaver's
      return os::PosixError("F_OFD_SETLK on the pool's memfd", errno);
    }
    BeginIntent(*x.hdr, SharedOp::kRegister, i, 0);
    e.pid = x.pid;
    e.start_time = x.start_time;
    e.state.store(ProcessEntry::kLive, std::memory_order_release);
    EndIntent(*x.hdr);
    x.index = i;
    RefreshKeep(x, NowNs());
    return absl::OkStatus();
  }
  return absl::ResourceExhaustedError(absl::StrCat(
      "the pool's process table is full (", max, " processes live)"));
}

// "pid P (started at T ticks)" of entry i, or what is known.
std::string NameOf(const ProcessShare& x, uint32_t i) {
  if (i >= x.hdr->max_processes) return absl::StrCat("index ", i);
  const ProcessEntry& e = x.procs[i];
  if (e.state.load(std::memory_order_relaxed) == ProcessEntry::kEmpty) {
    return absl::StrCat("index ", i, ", which has left");
  }
  return absl::StrCat("pid ", e.pid, " (start time ", e.start_time, ")");
}

// Sizes of the metadata for `count` slots.
struct Layout {
  size_t procs, ledger, depot, region, file;
};
Layout LayoutFor(size_t buffer_size, size_t count) {
  Layout l;
  l.procs = kHeaderBytes;
  l.ledger = l.procs + size_t{kMaxProcesses} * sizeof(ProcessEntry);
  l.depot = l.ledger + count * sizeof(uint64_t);
  l.region = RoundUp(l.depot + count * sizeof(uint32_t), os::kPageSize);
  l.file = l.region + RoundUp(buffer_size * count, os::kPageSize);
  return l;
}

void PointInto(ProcessShare& x) {
  x.hdr = reinterpret_cast<SharedHeader*>(x.meta);
  x.procs = reinterpret_cast<ProcessEntry*>(x.meta + x.hdr->procs_offset);
  x.ledger =
      reinterpret_cast<std::atomic<uint64_t>*>(x.meta + x.hdr->ledger_offset);
  x.depot = reinterpret_cast<uint32_t*>(x.meta + x.hdr->depot_offset);
}

// Writes a new pool's header into x.meta (the file reads zero: every
// process entry empty, every ledger word kFree with generation 0), makes
// its robust mutex, points x into the file and puts every slot in the
// shared depot, slot 0 on top (handed out first). The magic is stored
// later, by the caller, once the file is sealed.
absl::Status InitHeader(ProcessShare& x, const PoolOptions& options,
                        size_t cache_size, const Layout& l) {
  const size_t count = options.buffer_count;
  auto* h = reinterpret_cast<SharedHeader*>(x.meta);
  h->version = kSharedVersion;
  h->max_processes = kMaxProcesses;
  h->buffer_size = options.buffer_size;
  h->buffer_count = count;
  h->cache_size = cache_size;
  h->procs_offset = l.procs;
  h->ledger_offset = l.ledger;
  h->depot_offset = l.depot;
  h->region_offset = l.region;
  h->file_bytes = l.file;
  pthread_mutexattr_t attr;
  ::pthread_mutexattr_init(&attr);
  ::pthread_mutexattr_setpshared(&attr, PTHREAD_PROCESS_SHARED);
  ::pthread_mutexattr_setrobust(&attr, PTHREAD_MUTEX_ROBUST);
  const int rc = ::pthread_mutex_init(&h->mu, &attr);
  ::pthread_mutexattr_destroy(&attr);
  if (rc != 0) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "pthread_mutex_init (process-shared, robust): ", std::strerror(rc)));
  }
  PointInto(x);
  for (uint32_t k = 0; k < count; ++k) {
    x.depot[k] = static_cast<uint32_t>(count - 1 - k);
  }
  h->depot_count = static_cast<uint32_t>(count);
  return absl::OkStatus();
}

// A joiner's copy of a pool's header, read once (the file is shared: the
// values are copied before they are checked or used).
struct HeaderCopy {
  uint32_t version, max_processes;
  uint64_t buffer_size, buffer_count, cache_size, procs_offset, ledger_offset,
      depot_offset, region_offset, file_bytes;
};

// Reads the header of the file behind `fd` (`st` its fstat) and checks it
// names a pool of this layout version whose geometry fits the file:
// InvalidArgument (not a pool, corrupt, sizes that do not match) or
// FailedPrecondition (another version).
absl::StatusOr<HeaderCopy> ReadHeader(int fd, const struct stat& st) {
  absl::StatusOr<void*> head = os::MapSharedFile(fd, 0, kHeaderBytes);
  if (!head.ok()) return absl::InvalidArgumentError(head.status().message());
  auto* h = static_cast<SharedHeader*>(*head);
  const uint64_t magic =
      std::atomic_ref<uint64_t>(h->magic).load(std::memory_order_acquire);
  const HeaderCopy copy = {h->version,       h->max_processes, h->buffer_size,
                           h->buffer_count,  h->cache_size,    h->procs_offset,
                           h->ledger_offset, h->depot_offset,  h->region_offset,
                           h->file_bytes};
  os::Unmap(*head, kHeaderBytes);
  if (magic != kSharedMagic) {
    return absl::InvalidArgumentError(
        "not a shared pool's memfd (no bufpool header)");
  }
  if (copy.version != kSharedVersion) {
    return absl::FailedPreconditionError(
        absl::StrCat("the pool's layout is version ", copy.version,
                     "; this library reads version ", kSharedVersion));
  }
  // The geometry before any arithmetic on it: a header that carries the
  // magic but whose sizes wrap around would otherwise compute offsets that
  // match the file and map buffers far larger than it.
  size_t region_bytes = 0;
  if (copy.buffer_size == 0 || copy.buffer_count == 0 ||
      copy.buffer_count >= FreeList::kNoSlot ||
      __builtin_mul_overflow(copy.buffer_size, copy.buffer_count,
                             &region_bytes) ||
      region_bytes > static_cast<uint64_t>(st.st_size)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the pool's header is corrupt: ", copy.buffer_count, " buffers of ",
        copy.buffer_size, " bytes do not fit its ", st.st_size, " bytes"));
  }
  const Layout l = LayoutFor(copy.buffer_size, copy.buffer_count);
  if (copy.max_processes != kMaxProcesses || copy.procs_offset != l.procs ||
      copy.ledger_offset != l.ledger || copy.depot_offset != l.depot ||
      copy.region_offset != l.region || copy.file_bytes != l.file ||
      static_cast<size_t>(st.st_size) != l.file) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the pool's header does not match its size (", st.st_size,
        " bytes for ", copy.buffer_count, " x ", copy.buffer_size, ")"));
  }
  return copy;
}

}  // namespace

ProcessShare::~ProcessShare() {
  if (meta != nullptr) os::Unmap(meta, meta_bytes);
  // Closing our description drops our lock: from here we look dead, and
  // what the ledger still names ours (tokens nobody imported) is reclaimed.
  if (lock_fd >= 0) os::Sys().close(lock_fd);
  if (fd >= 0) os::Sys().close(fd);
}

// ---- Creating and joining ---------------------------------------------------

absl::StatusOr<std::unique_ptr<BufferPool>> PoolAccess::CreateShared(
    const PoolOptions& options, size_t cache_size, TrackHolders track) {
  auto error = [&](absl::StatusCode code, const std::string& why) {
    return absl::Status(
        code, absl::StrCat("BufferPool::Create(", options.buffer_count, " x ",
                           options.buffer_size, " bytes, shared): ", why));
  };
  if (options.max_buffer_count != 0) {
    return error(absl::StatusCode::kInvalidArgument,
                 "PoolOptions.shared cannot be combined with "
                 "max_buffer_count (an elastic pool is not shared in this "
                 "version)");
  }
  if (options.huge_pages == HugePages::kRequire) {
    return error(absl::StatusCode::kInvalidArgument,
                 "PoolOptions.shared cannot be combined with "
                 "huge_pages=kRequire (the memfd's pages are shmem's; use "
                 "kTry)");
  }
  const size_t count = options.buffer_count;
  const Layout l = LayoutFor(options.buffer_size, count);
  auto x = std::make_unique<ProcessShare>();
  x->fd = os::Sys().memfd_create("bufpool", MFD_ALLOW_SEALING);
  if (x->fd < 0) {
    return error(absl::StatusCode::kResourceExhausted,
                 os::PosixError("memfd_create", errno).ToString());
  }
  if (os::Sys().ftruncate(x->fd, static_cast<off_t>(l.file)) != 0) {
    return error(absl::StatusCode::kResourceExhausted,
                 std::string(os::PosixError(absl::StrCat("ftruncate of the "
                                                         "memfd to ",
                                                         l.file, " bytes"),
                                            errno)
                                 .message()));
  }
  absl::StatusOr<void*> meta = os::MapSharedFile(x->fd, 0, l.region);
  if (!meta.ok()) {
    return error(absl::StatusCode::kResourceExhausted,
                 std::string(meta.status().message()));
  }
  x->meta = static_cast<char*>(*meta);
  x->meta_bytes = l.region;
  if (absl::Status st = InitHeader(*x, options, cache_size, l); !st.ok()) {
    return error(st.code(), std::string(st.message()));
  }
  auto* h = reinterpret_cast<SharedHeader*>(x->meta);
  // The size is final: nobody may shrink the file under another's mapping
  // (a SIGBUS there) or grow it; then no more seals.
  if (os::Sys().fcntl(x->fd, F_ADD_SEALS,
                      F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) != 0) {
    return error(
        absl::StatusCode::kResourceExhausted,
        std::string(os::PosixError("sealing the memfd", errno).message()));
  }
  // The magic last: a joiner that sees it sees the rest (it gets the fd
  // only after this anyway).
  std::atomic_ref<uint64_t>(h->magic).store(kSharedMagic,
                                            std::memory_order_release);
  absl::StatusOr<std::unique_ptr<BufferPool>> pool =
      PoolAccess::FinishShared(std::move(x), options, cache_size, track);
  if (!pool.ok()) {
    return error(pool.status().code(), std::string(pool.status().message()));
  }
  return pool;
}

absl::StatusOr<std::unique_ptr<BufferPool>> BufferPool::Join(int fd) {
  auto error = [fd](absl::StatusCode code, absl::string_view why) {
    return absl::Status(code,
                        absl::StrCat("BufferPool::Join(fd ", fd, "): ", why));
  };
  if (fd < 0) {
    return error(absl::StatusCode::kInvalidArgument,
                 "not a descriptor (a shared pool's shared_fd() is >= 0)");
  }
  struct stat st;
  if (os::Sys().fstat(fd, &st) != 0) {
    return error(absl::StatusCode::kInvalidArgument,
                 os::PosixError("fstat", errno).message());
  }
  if (!S_ISREG(st.st_mode) || static_cast<size_t>(st.st_size) < kHeaderBytes) {
    return error(
        absl::StatusCode::kInvalidArgument,
        absl::StrCat(
            "not a shared pool's memfd (",
            S_ISREG(st.st_mode) ? "a file of " : "not a file, ",
            S_ISREG(st.st_mode) ? absl::StrCat(st.st_size, " bytes") : "",
            ")"));
  }
  auto x = std::make_unique<ProcessShare>();
  x->fd = os::Sys().fcntl(fd, F_DUPFD_CLOEXEC, 0);
  if (x->fd < 0) {
    return error(absl::StatusCode::kResourceExhausted,
                 os::PosixError("dup", errno).message());
  }
  absl::StatusOr<HeaderCopy> copy = ReadHeader(x->fd, st);
  if (!copy.ok()) return error(copy.status().code(), copy.status().message());
  const Layout l = LayoutFor(copy->buffer_size, copy->buffer_count);
  absl::StatusOr<void*> meta = os::MapSharedFile(x->fd, 0, l.region);
  if (!meta.ok()) {
    return error(absl::StatusCode::kResourceExhausted, meta.status().message());
  }
  x->meta = static_cast<char*>(*meta);
  x->meta_bytes = l.region;
  PointInto(*x);
  PoolOptions options;
  options.buffer_size = copy->buffer_size;
  options.buffer_count = copy->buffer_count;
  options.cache_size = copy->cache_size;
  options.huge_pages = HugePages::kNever;
  options.shared = true;
  const absl::StatusOr<TrackHolders> track = ResolveTrackHolders(options);
  if (!track.ok()) return track.status();
  absl::StatusOr<std::unique_ptr<BufferPool>> pool =
      PoolAccess::FinishShared(std::move(x), options, copy->cache_size, *track);
  if (!pool.ok()) return error(pool.status().code(), pool.status().message());
  return pool;
}

absl::StatusOr<std::unique_ptr<BufferPool>> PoolAccess::FinishShared(
    std::unique_ptr<ProcessShare> x, const PoolOptions& options,
    size_t cache_size, TrackHolders track) {
  const size_t count = x->hdr->buffer_count;
  absl::StatusOr<Arena> arena =
      Arena::MapFile(x->fd, x->hdr->region_offset, x->hdr->buffer_size * count,
                     options.populate, options.lock_memory);
  if (!arena.ok()) return arena.status();
  std::unique_ptr<BufferPool> pool;
  try {
    pool.reset(new BufferPool());
    InitFixedFields(*pool, *arena, options, cache_size, count);
    const absl::StatusOr<size_t> backed =
        InitShared(*pool, std::move(*arena), options);
    if (!backed.ok()) {
      pool->shared_.reset();
      return backed.status();
    }
    if (track != TrackHolders::kOff) {
      pool->holders_ = std::make_unique<BufferPool::HolderTable>(
          track, options.holder_sample_every, count);
    }
  } catch (const std::bad_alloc&) {
    if (pool != nullptr) pool->shared_.reset();
    return absl::ResourceExhaustedError(
        "out of memory for the pool's bookkeeping (state bytes, depot, "
        "caches, holder records)");
  }
  SharedState& s = *pool->shared_;
  // The process owns nothing yet: everything is in the shared depot.
  s.committed.store(0, std::memory_order_relaxed);
  s.depot_free.store(0, std::memory_order_relaxed);
  uint32_t batch = pool->cache_capacity_ != 0 ? 2 * RefillBatch(*pool) : 16;
  batch = std::min<uint32_t>(
      batch, std::max<uint32_t>(1, static_cast<uint32_t>(count / 8)));
  x->batch = std::min(batch, kMaxShareBatch);
  // No fork() between opening the liveness lock's description and the pool
  // being on the fork list, whose child handler closes the child's copy: a
  // child forked in between would keep the description, and with it the
  // lock, open after this process dies, which would then go unseen. The
  // list's mutex is what a fork() takes first (ForkPrepare), so it waits.
  // Lock order: the list's mutex, then the shared mutex (RegisterProcess).
  InstallForkHandlers();
  std::unique_lock<std::mutex> list = LockPoolList();
  if (absl::Status r = RegisterProcess(*x); !r.ok()) {
    list.unlock();
    // Nothing of the pool's is ours yet: the pool goes without leaving.
    pool->shared_.reset();
    return r;
  }
  s.xproc = std::move(x);
  InitInlinePaths(*pool, track);
  RegisterLocked(*pool);
  return pool;
}

int BufferPool::shared_fd() const {
  const ProcessShare* x = shared_->xproc.get();
  return x != nullptr ? x->fd : -1;
}

// ---- Moves between the shared depot and this process ------------------------

uint32_t PoolAccess::SharedTake(BufferPool& p, uint32_t* reshelved) {
  CheckNotForked(p);
  SharedState& s = S(p);
  ProcessShare& x = *s.xproc;
  uint32_t got[kMaxShareBatch];
  uint32_t n;
  if (const int64_t now = NowNs();
      now - x.keep_ns.load(std::memory_order_relaxed) >= kReclaimEveryNs) {
    RefreshKeep(x, now);  // outside the mutex: the states are atomic
  }
  {
    SharedLock lock(x);
    n = TakeLocked(x, got, x.batch);
  }
  if (n == 0) {
    // The dead may hold what we need; cheap when nobody died, and at most
    // once a millisecond per process.
    const int64_t now = NowNs();
    int64_t last = x.last_reclaim_ns.load(std::memory_order_relaxed);
    if (now - last >= kReclaimEveryNs &&
        x.last_reclaim_ns.compare_exchange_strong(last, now,
                                                  std::memory_order_relaxed)) {
      if (p.ReclaimDead() != 0) {
        SharedLock lock(x);
        n = TakeLocked(x, got, x.batch);
      }
    }
  }
  if (n == 0) return BufferPool::kNoSlot;
  // Counted before they are free here (accounting.cc): in transit = in use.
  s.committed.fetch_add(n, std::memory_order_relaxed);
  if (p.cache_capacity_ != 0) Lent(p, 1);  // got[0] is handed out
  if (n > 1) {
    for (uint32_t k = 1; k < n; ++k) {
      BUFPOOL_INTERNAL_POISON(p.SlotData(got[k]), p.buffer_size_);
    }
    // got[1] on top: handed out next.
    s.depot.Push(got + 1, n - 1, nullptr);
    if (p.cache_capacity_ != 0) {
      s.depot_free.fetch_add(n - 1, std::memory_order_relaxed);
    }
    *reshelved += n - 1;
  }
  return got[0];
}

void PoolAccess::SharedMaybeGive(BufferPool& p) {
  SharedState& s = S(p);
  ProcessShare* const x = s.xproc.get();
  if (x == nullptr || x->forked) return;
  // Past `keep` (RefreshKeep: at most four batches, less when many
  // processes share the pool), down to half of it (a drain or a bulk
  // release may leave many more): the gap keeps a process whose load
  // swings by a batch or two from giving back and taking again across the
  // mutex each time, and the cap keeps a process idle after a burst from
  // holding slots the others starve for.
  const int64_t keep = x->keep.load(std::memory_order_relaxed);
  if (DepotSize(p) <= keep) return;
  if (const int64_t now = NowNs();
      now - x->keep_ns.load(std::memory_order_relaxed) >= kReclaimEveryNs) {
    RefreshKeep(*x, now);
  }
  const int64_t low = x->keep.load(std::memory_order_relaxed) / 2;
  for (int64_t size = DepotSize(p); size > low; size = DepotSize(p)) {
    uint32_t out[kMaxShareBatch];
    uint32_t reshelved = 0;
    const uint32_t n = s.depot.Pop(
        out, static_cast<uint32_t>(std::min<int64_t>(x->batch, size - low)),
        nullptr, &reshelved);
    if (n == 0) return;
    if (p.cache_capacity_ != 0) {
      s.depot_free.fetch_sub(n, std::memory_order_relaxed);
    }
    {
      SharedLock lock(*x);
      GiveLocked(*x, out, n);
    }
    s.committed.fetch_sub(n, std::memory_order_relaxed);
  }
}

// ---- Death ------------------------------------------------------------------

size_t BufferPool::ReclaimDead() {
  ProcessShare* const x = shared_->xproc.get();
  if (x == nullptr) return 0;
  PoolAccess::CheckNotForked(*this);
  // A look without the mutex first: nothing to do is the common answer.
  const uint32_t max = x->hdr->max_processes;
  bool any = false;
  for (uint32_t i = 0; i < max && !any; ++i) any = DeadLocked(*x, i);
  if (!any) return 0;
  SharedLock lock(*x);
  size_t got = 0;
  for (uint32_t i = 0; i < max; ++i) {
    if (DeadLocked(*x, i)) got += ReclaimLocked(*x, i);
  }
  return got;
}

void PoolAccess::SharedLeave(BufferPool& p) {
  SharedState& s = S(p);
  ProcessShare& x = *s.xproc;
  if (x.forked) return;  // the parent's; the descriptors close with x
  DrainAll(p);           // every cached slot into our depot
  uint32_t out[kMaxShareBatch];
  for (;;) {
    uint32_t reshelved = 0;
    const uint32_t n = s.depot.Pop(out, kMaxShareBatch, nullptr, &reshelved);
    if (n == 0) break;
    SharedLock lock(x);
    GiveLocked(x, out, n);
  }
  s.committed.store(0, std::memory_order_relaxed);
  s.depot_free.store(0, std::memory_order_relaxed);
  // Tokens we exported that nobody imported stay ours until then: the
  // entry stays, and once our lock goes with our description (~ProcessShare)
  // we look dead, and ReclaimDead() gives them back. Otherwise the entry
  // is emptied now.
  SharedLock lock(x);
  const auto n = static_cast<uint32_t>(x.hdr->buffer_count);
  bool exported = false;
  for (uint32_t slot = 0; slot < n && !exported; ++slot) {
    const uint64_t w = x.ledger[slot].load(std::memory_order_relaxed);
    exported = ledger::Kind(w) == kExported && ledger::Proc(w) == x.index;
  }
  if (!exported) {
    BeginIntent(*x.hdr, SharedOp::kLeave, x.index, 0);
    ProcessEntry& e = x.procs[x.index];
    e.pid = 0;
    e.start_time = 0;
    e.state.store(ProcessEntry::kEmpty, std::memory_order_release);
    EndIntent(*x.hdr);
  }
}

void PoolAccess::SharedForkChild(BufferPool& p) {
  ProcessShare& x = *S(p).xproc;
  x.forked = true;
  // The parent's lock must die with the parent: our copy of its
  // description would keep it held.
  if (x.lock_fd >= 0) os::Sys().close(x.lock_fd);
  x.lock_fd = -1;
  // Every call leaves the inline paths (then aborts, DieForked): the
  // caches hold the parent's slots.
  p.rseq_cpus_ = 0;
  p.rseq_release_cpus_ = 0;
  p.inline_index_ = 0;
}

void PoolAccess::DieForked(const BufferPool& p) {
  std::fprintf(stderr,
               "bufpool: pool %p is a shared pool of the parent process; a "
               "fork() child must BufferPool::Join(shared_fd()) it and use "
               "the joined pool (the parent owns this object's caches)\n",
               static_cast<const void*>(&p));
  std::abort();
}

std::string PoolAccess::OwnerNote(const BufferPool& p, uint32_t slot) {
  const ProcessShare* x = p.shared_->xproc.get();
  if (x == nullptr || slot >= p.capacity_) return "";
  const uint64_t w = x->ledger[slot].load(std::memory_order_relaxed);
  const std::string me = absl::StrCat("released in process pid ", x->pid,
                                      " (start time ", x->start_time, ")");
  switch (ledger::Kind(w)) {
    case kOwned:
      if (ledger::Proc(w) == x->index) return absl::StrCat("; ", me);
      return absl::StrCat("; ", me,
                          ", but the shared pool's ledger says "
                          "process ",
                          NameOf(*x, ledger::Proc(w)), " owns it");
    case kExported:
      return absl::StrCat("; ", me, ", but it is exported by process ",
                          NameOf(*x, ledger::Proc(w)), " and not imported");
    default:
      return absl::StrCat("; ", me,
                          ", but the shared pool's ledger says it is free");
  }
}

void PoolAccess::LockSharedState(BufferPool& p) { LockShared(*S(p).xproc); }

void PoolAccess::UnlockSharedState(BufferPool& p) {
  ::pthread_mutex_unlock(&S(p).xproc->hdr->mu);
}

size_t PoolAccess::SharedProcesses(const BufferPool& p) {
  const ProcessShare& x = *p.shared_->xproc;
  size_t n = 0;
  for (uint32_t i = 0; i < x.hdr->max_processes; ++i) {
    n += x.procs[i].state.load(std::memory_order_relaxed) !=
         ProcessEntry::kEmpty;
  }
  return n;
}

// ---- Export and Import ------------------------------------------------------

BufferToken BufferPool::Export(Buffer&& buffer) {
  if (!buffer) return BufferToken{};
  if (buffer.pool_ != this) {
    buffer.Reset();  // back to its own pool
    return BufferToken{};
  }
  PoolAccess::CheckNotForked(*this);
  ProcessShare* const x = shared_->xproc.get();
  std::atomic<uint64_t>* const words =
      x != nullptr ? x->ledger : shared_->local_ledger.GetOrMake(capacity_);
  if (words == nullptr) {  // a private pool's first Export, out of memory
    buffer.Reset();
    return BufferToken{};
  }
  const uint32_t slot = buffer.slot_;
  buffer.pool_ = nullptr;
  if (holders_ != nullptr) holders_->Released(slot);
  std::atomic<uint64_t>& word = words[slot];
  const uint32_t me = x != nullptr ? x->index : 0;
  const uint64_t w = word.load(std::memory_order_relaxed);
  const uint64_t want = x != nullptr ? kOwned : kFree;
  if (ledger::Kind(w) != want || ledger::Proc(w) != me) {
    PoolAccess::DieCorrupt(*this,
                           "exporting a slot whose owner word is not "
                           "this process's",
                           w);
  }
  uint32_t gen = ledger::Gen(w) + 1;
  if (gen == 0) gen = 1;
  // A plain store after the load, no CAS: nobody else changes a live
  // owner's kOwned word (Import changes kExported words only, a reclaimer
  // only a dead process's), nor a private pool's kFree word of a held slot.
  // release: the buffer's bytes, written before, reach the importer.
  word.store(ledger::Word(gen, kExported, me), std::memory_order_release);
  if (x != nullptr) {
    // The slot has left this process (it was held: in use).
    if (cache_capacity_ != 0) PoolAccess::Returned(*this, 1);
    shared_->committed.fetch_sub(1, std::memory_order_relaxed);
  }
  return BufferToken{(uint64_t{gen} << 32) | slot};
}

absl::StatusOr<Buffer> BufferPool::Import(BufferToken token) {
  const auto slot = static_cast<uint32_t>(token.value);
  const auto gen = static_cast<uint32_t>(token.value >> 32);
  if (gen == 0 || slot >= capacity_) {
    return absl::InvalidArgumentError(absl::StrCat(
        "BufferPool::Import: token 0x", absl::Hex(token.value),
        " names no buffer of this pool (slot ", slot, " of ", capacity_,
        ", generation ", gen, "): forged, or from another pool"));
  }
  PoolAccess::CheckNotForked(*this);
  ProcessShare* const x = shared_->xproc.get();
  std::atomic<uint64_t>* const words =
      x != nullptr ? x->ledger : shared_->local_ledger.Load();
  // A private pool without a ledger has exported nothing: every word free.
  static std::atomic<uint64_t> none{0};
  std::atomic<uint64_t>& word = words != nullptr ? words[slot] : none;
  uint64_t w = word.load(std::memory_order_acquire);
  auto refuse = [&](uint64_t seen) {
    std::string why;
    const uint32_t g = ledger::Gen(seen);
    switch (ledger::Kind(seen)) {
      case kExported:
        why = absl::StrCat("stale: the buffer's export now has generation ", g,
                           ", not ", gen);
        break;
      case kOwned:
        why = absl::StrCat(
            "stale or imported already: the buffer is owned by process ",
            x != nullptr ? NameOf(*x, ledger::Proc(seen)) : "this one",
            ", not exported");
        break;
      default:
        why = x != nullptr
                  ? "stale: the buffer is free (imported and released, "
                    "reclaimed from a dead exporter, or never exported)"
                  : "stale: the buffer is not exported (imported already, "
                    "or never exported)";
    }
    return absl::FailedPreconditionError(absl::StrCat(
        "BufferPool::Import: token 0x", absl::Hex(token.value), " (slot ", slot,
        ", generation ", gen, ") refused: ", why));
  };
  if (ledger::Kind(w) != kExported || ledger::Gen(w) != gen) return refuse(w);
  const uint64_t mine = x != nullptr ? ledger::Word(gen, kOwned, x->index)
                                     : ledger::Word(gen, kFree, 0);
  if (x != nullptr) {
    // Counted before it is ours (accounting.cc): in transit = in use.
    shared_->committed.fetch_add(1, std::memory_order_relaxed);
    if (cache_capacity_ != 0) PoolAccess::Lent(*this, 1);
  }
  // acq_rel: the exporter's bytes (its release store) are seen; exactly
  // one of concurrent importers and a reclaimer wins.
  if (!word.compare_exchange_strong(w, mine, std::memory_order_acq_rel,
                                    std::memory_order_acquire)) {
    if (x != nullptr) {
      if (cache_capacity_ != 0) PoolAccess::Returned(*this, 1);
      shared_->committed.fetch_sub(1, std::memory_order_relaxed);
    }
    return refuse(w);
  }
  BUFPOOL_INTERNAL_UNPOISON(SlotData(slot), buffer_size_);
  if (holders_ != nullptr) holders_->Acquired(*this, slot);
  return Buffer(this, slot);
}

}  // namespace bufpool

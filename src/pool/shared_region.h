// The shared state of a pool joined by several processes (PoolOptions::
// shared), as it lies in the memfd, and each process's handle on it. The
// operations and their kill-safety argument are in shared_pool.cc.
//
//   memfd:
//   +--------+-----------------+------------------+-------------+---------+
//           | header | process table   | ledger           | depot stack |
//           region  | | (4 KiB)| kMaxProcesses x | buffer_count x   |
//           buffer_count| buffers | |        | ProcessEntry    | 8-byte owner
//           word| x uint32_t  |         |
//           +--------+-----------------+------------------+-------------+---------+
//                                                                     ^
//                                                                     page-aligned
//
// Every process maps the metadata (header to depot stack) and the region
// where it likes; slots are numbers, never addresses.
#ifndef BUFPOOL_SRC_POOL_SHARED_REGION_H_
#define BUFPOOL_SRC_POOL_SHARED_REGION_H_

#include <pthread.h>
#include <sys/types.h>

#include <atomic>
#include <cstddef>
#include <cstdint>

namespace bufpool {

inline constexpr uint64_t kSharedMagic = 0x6c6f6f7066756221ull;  // "!bufpool"
// Raised whenever the layout below changes: a process of another build
// refuses to join rather than misread it.
inline constexpr uint32_t kSharedVersion = 1;
inline constexpr uint32_t kMaxProcesses = 256;

// The owner word of one slot (the ledger):
//
//   bits 63..32  generation: raised by each Export and each reclaim of an
//                exported slot, so that a token names one hand-over
//   bits 17..16  kind: free (in the shared depot), owned (by one process:
//                cached there, free in its depot, or out), exported (by
//                one process, until imported once)
//   bits 15..0   the process's index in the table (owned, exported)
//
// Generation 0 is never exported, so no token is 0.
namespace ledger {
inline constexpr uint64_t kFree = 0;
inline constexpr uint64_t kOwned = 1;
inline constexpr uint64_t kExported = 2;
inline uint64_t Word(uint32_t gen, uint64_t kind, uint32_t proc) {
  return (uint64_t{gen} << 32) | (kind << 16) | proc;
}
inline uint32_t Gen(uint64_t w) { return static_cast<uint32_t>(w >> 32); }
inline uint64_t Kind(uint64_t w) { return (w >> 16) & 3; }
inline uint32_t Proc(uint64_t w) { return static_cast<uint32_t>(w & 0xffff); }
}  // namespace ledger

// One process joined to the pool. `state` is written under the header's
// mutex only; pid and start time name the process in messages (the OFD
// lock on its byte, not the pid, says whether it lives).
struct alignas(64) ProcessEntry {
  enum : uint32_t { kEmpty = 0, kLive = 1 };
  std::atomic<uint32_t> state;
  int32_t pid;
  uint64_t start_time;  // /proc/<pid>/stat field 22, clock ticks after boot
};

// The steps of a change under the mutex, for the repair (shared_pool.cc).
enum class SharedOp : uint32_t {
  kNone = 0,
  kTake,      // slots from the depot to a process
  kGive,      // slots from a process to the depot
  kReclaim,   // a dead process's slots back to the depot
  kRegister,  // a process into the table
  kLeave,     // a process out of it
};

struct SharedHeader {
  // Written once by the creator before the memfd is sealed and passed on.
  uint64_t magic;
  uint32_t version;
  uint32_t max_processes;
  uint64_t buffer_size;
  uint64_t buffer_count;
  uint64_t cache_size;  // the creator's PoolOptions::cache_size
  uint64_t procs_offset;
  uint64_t ledger_offset;
  uint64_t depot_offset;
  uint64_t region_offset;
  uint64_t file_bytes;
  // PTHREAD_PROCESS_SHARED | PTHREAD_MUTEX_ROBUST: guards depot_count,
  // the depot stack, the process table's states, and every change of a
  // ledger word to or from kFree.
  alignas(64) pthread_mutex_t mu;
  // Under mu: the depot stack holds depot[0, depot_count), top last.
  uint32_t depot_count;
  // Under mu: the change in progress (written before its first step,
  // cleared after its last), for the repair's report.
  SharedOp intent_op;
  uint32_t intent_proc;
  uint32_t intent_n;
  // Statistics: relaxed.
  alignas(64) std::atomic<uint64_t> reclaimed;
  std::atomic<uint64_t> repairs;  // lockers that found a dead holder
};

// A process's handle on the shared state (BufferPool::Shared::xproc).
struct ProcessShare {
  int fd = -1;           // the memfd (this pool's own descriptor)
  int lock_fd = -1;      // this process's own open file description of it
  char* meta = nullptr;  // header .. depot stack, mapped shared
  size_t meta_bytes = 0;
  SharedHeader* hdr = nullptr;
  ProcessEntry* procs = nullptr;
  std::atomic<uint64_t>* ledger = nullptr;
  uint32_t* depot = nullptr;
  uint32_t index = 0;  // ours in the table
  int32_t pid = 0;
  uint64_t start_time = 0;
  uint32_t batch = 1;  // slots per move between the shared depot and us
  // Set in a fork() child: the parent owns what this object caches.
  bool forked = false;
  // The last ReclaimDead() run from the slow path (steady ns); relaxed.
  std::atomic<int64_t> last_reclaim_ns{0};
  // What this process may keep free in its own depot before it gives back
  // (down to half): max(batch, capacity / (4 x processes in the table)),
  // at most four batches. Recounted at the join and at most once a
  // millisecond from the slow paths (keep_ns: steady ns); relaxed.
  std::atomic<int64_t> keep{1};
  std::atomic<int64_t> keep_ns{0};

  ProcessShare() = default;
  ProcessShare(const ProcessShare&) = delete;
  ProcessShare& operator=(const ProcessShare&) = delete;
  ~ProcessShare();
};

}  // namespace bufpool

#endif  // BUFPOOL_SRC_POOL_SHARED_REGION_H_

// libbufpool: who holds a pool's buffers (holder tracking and leak reports).
//
// A pool made with PoolOptions::track_holders other than kOff records, for
// the acquires it tracks, the acquiring thread, the time and the call stack
// (raw return addresses from absl::GetStackTrace; they are symbolized only
// when a report is made, never on the acquire path).
// BufferPool::Holders() lists what is out now, BufferPool::HoldersReport()
// groups it by acquire site, and destroying a pool with buffers out prints
// the report before it aborts. Each frame reads
//
//   HandleAuth() (/src/server/auth.cc:88) /usr/bin/server+0x2b6db
//
// the function (with the calls inlined there as frames of their own), its
// file and line where the program has debug information (-g; read with
// elfutils' libdw, loaded when a report is made if libdw.so.1 is
// installed), and always the module and offset, which
// `addr2line -f -i -e /usr/bin/server 0x2b6db` resolves later, from the
// binary or its separate debug file. The library's own frames (the pool's,
// a chain's, a ring's) are left out: the first frame is the caller's.
//
// Frame pointers: the stack is unwound by them, so each caller above the
// code that acquired appears only if it was compiled with
// -fno-omit-frame-pointer (the library is). A stack that stops after one
// function says so in the report.
//
// Sampled (kSampled), a report also counts the buffers out that were not
// sampled, by kind (raw pointers, lent to rings, in budgets' reserves; the
// rest handles, chains or sends), and names the switch that records them
// all: BUFPOOL_TRACK_HOLDERS=all.
//
//   auto pool = BufferPool::Create({.track_holders = TrackHolders::kAll});
//   ...
//   std::fputs((*pool)->HoldersReport().c_str(), stderr);
//
// BUFPOOL_TRACK_HOLDERS=off|sampled|all in the environment overrides the
// option for every pool the process creates (read at each Create()), so a
// leak in a deployed program can be found without rebuilding it.
//
// What each level costs the hot pair (TryAcquire(), write a byte, the
// handle's release; one thread; measured by bench/holders_benchmark, the
// figures in docs/benchmarks.md, "Holder tracking and budgets"):
//   kOff      no record exists; the inline paths' test for the index
//             field also rules out sampling, so the pair reads nothing
//             for holder tracking.
//   kSampled  stays inline: each acquire counts down a per-thread counter,
//             each release reads the slot's one-byte mark; 1 acquire in
//             holder_sample_every (per thread, starting with its first) is
//             recorded out of line. About a third more than kOff.
//   kAll      every acquire and release goes out of line and every acquire
//             records its stack: about ten times kOff. For tests and for
//             hunting a leak.
// A record is the stack (absl::GetStackTrace, ~15 ns: it unwinds by frame
// pointers, see above), the thread id (cached per thread) and the time
// (CLOCK_MONOTONIC_COARSE: a holder's age is good to the kernel's tick).
// Reports symbolize: milliseconds (the first in a process reads the
// program's debug information: tens of milliseconds more), never on the
// acquire path. Memory: with tracking on, Create() allocates a record of
// about 350 bytes per buffer (the stack, four touch labels) and a byte per
// buffer; nothing with kOff.
//
// Thread safety. Holders() and HoldersReport() may be called from any
// thread at any time, concurrently with acquires and releases on others
// (they read each slot's record under a per-slot sequence count and skip
// one that changes while read). What they return is a snapshot: a buffer
// released during the call may be listed, one acquired during it may not.
// Buffer::Touch() is called by the handle's owner, as any handle call.
#ifndef BUFPOOL_HOLDERS_H_
#define BUFPOOL_HOLDERS_H_

#include <sys/types.h>

#include <cstdint>
#include <string>
#include <vector>

#include "absl/time/time.h"

namespace bufpool {

// PoolOptions::track_holders.
enum class TrackHolders {
  kOff,      // nothing recorded; the leak report counts holders by kind
  kSampled,  // 1 in PoolOptions::holder_sample_every acquires recorded
  kAll,      // every acquire recorded
};

// One buffer that is out (BufferPool::Holders()).
struct Holder {
  uint32_t slot = 0;
  absl::Duration age;  // since it was acquired
  pid_t thread = 0;    // the thread that acquired it (gettid())
  // What holds it now: "Buffer" (a handle), "raw pointer" (TryAcquireRaw,
  // Detach, the C API), "chain" (SharedBuffer slices, chains, and the pack
  // buffer a ProvidedBufferRing keeps: its pack_buffers(), not leaked),
  // "ring <group>" (lent to a ProvidedBufferRing: lent, not leaked), "send in
  // flight" (a HeldSend the kernel has not finished with), "budget <name>" (in
  // a budget's reservation, bufpool/budget.h: reserved, not leaked).
  std::string held_by;
  // Frames of the acquire, innermost first, starting at the library's
  // caller (its own frames are left out): "function (file:line)
  // module+0xoffset", without "(file:line)" where there is no line
  // information; a function that cannot be named is its address in hex.
  std::vector<std::string> stack;
  // Labels from Buffer::Touch(), oldest first (the last 4).
  std::vector<std::string> touches;
};

}  // namespace bufpool

#endif  // BUFPOOL_HOLDERS_H_

// Internal (installed because the inline fast paths of bufpool/
// buffer_pool.h use it; not API): the restartable sequences of the per-CPU
// caches on x86-64 and (behind BUFPOOL_AARCH64_RSEQ, see below) AArch64.
// The slow paths and drains are in src/pool/rseq.cc.
//
// A cache in rseq mode is a header word and a stack of slots, per index, at
// base + index * kCacheStride:
//
//   word 0: count   slots[0, count) are free; kStopped set while a drainer
//                   owns the cache (the sequences then fail)
//   word 1: floor   floor <= count; slots[floor, count) are lent: a pop
//                   hit may take them without the pool's accounting
//   byte 64: slots  uint32_t[cache_capacity]
//
// The floor is what keeps high_water honest (src/pool/accounting.cc, "High
// water"): a single pop hits only while count > floor, a single push only
// while count - floor < the pool's lend (its allowance), so the hits move a
// cache's count inside a window the pool has accounted for, and the pool's
// bound (buffers held plus buffers lent) changes only out of line. Lend and
// Reclaim (below) move the floor alone; the batch forms move count and floor
// together, so what is lent stays lent; LendPop and ReclaimPush, for the
// slow paths, are a Lend then a pop and a Reclaim then a push, each
// committed as one; a drain takes both to 0.
//
// The index. Where the kernel fills the rseq concurrency id (mm_cid, Linux
// 6.3+: getauxval(AT_RSEQ_FEATURE_SIZE) >= 28), the caches are indexed by
// it, else by cpu_id. mm_cid is unique among the threads of the process
// that run at any instant, and the kernel keeps it dense: below the number
// of the process's threads and (on recent kernels) of the CPUs it may run
// on, so a process confined to 4 of 64 CPUs uses caches 0-3 only
// (tcmalloc's "virtual CPUs"). Both fields are below the number of possible
// CPUs, which bounds the caches either way; a value
// at or above the pool's cache count fails the sequence (the slow path then
// uses the depot). BUFPOOL_RSEQ_INDEX=cpu_id in the environment forces
// cpu_id (for tests and comparisons). What makes either index sound is the
// same: a thread's index changes only when it is scheduled out, which
// restarts its section, and no two threads run with the same index at once.
// So the sections that commit to one cache run one after the other.
//
// Pop and Push are each one restartable sequence on glibc's registered rseq
// area (__rseq_offset from the thread pointer; this library never registers
// its own): it stores its descriptor into rseq_cs, reads the index, indexes
// the cache with it, and commits with a single store of the new count, the
// last instruction of the section. If the thread is preempted, migrated or
// signalled between the start and that store, the kernel moves it to the
// abort label (after the RSEQ_SIG signature), which starts over. So a
// section that commits ran start to end with its index, with no other
// section of that index in between: the cache needs no lock and no atomic
// read-modify-write. A section that sleeps for any reason (a page fault
// resolved by userfaultfd, a freezer, a signal handler that blocks) is
// restarted before it runs on, never resumes on stale state.
//
// Why a drained cache is never written by a section that began before the
// fence. A drainer (holding the cache's CpuCache::mu, so one at a time, and
// excluded from fork) sets kStopped with an atomic OR, then fences with
// membarrier(MEMBARRIER_CMD_PRIVATE_EXPEDITED_RSEQ): on return, every
// section that was in flight has either committed (its stores, slot and
// count, are visible to the drainer: the call is a full barrier on both
// sides) or been restarted; a restarted or later section reads the count
// with kStopped set and fails before any store. Which CPUs the fence must
// reach: with cpu_id, a section on cache i runs on CPU i, so
// MEMBARRIER_CMD_FLAG_CPU with cpu i suffices. With mm_cid the drainer
// cannot know which CPU the thread holding mm_cid i runs on (it may move
// between the drainer's look and the fence), so it fences without FLAG_CPU:
// every CPU that runs a thread of this process is interrupted and every
// section in flight anywhere is committed or restarted, a superset of what
// is needed, at the cost of one IPI per such CPU per drain (drains are the
// rare path). One race is left: a section that read the count before the OR
// and committed after it overwrote kStopped with its own count. The drainer
// therefore reloads the count after the fence and repeats OR + fence until
// kStopped survives one: then no commit came after the OR (each commit
// clears the bit, and only the drainer sets it), and no section can commit
// until the drainer stores a count without the bit (release) to restart it.
// A push writes slots[count] before its commit; an aborted push's write
// lands above the count, which nothing reads. Draining many caches at once
// with mm_cid (FlushCaches(), a sleeper's scan): the drainer try-locks and
// stops each cache that holds slots, fences every CPU once, and then takes
// each cache whose stop survived that fence; a cache whose bit a late
// commit cleared goes through OR + fence again alone. One fence stands for
// each cache's own because each would have reached every CPU; the argument
// per cache is unchanged, since each cache's OR precedes the fence.
//
// Why the stop bit lives in the count word and a drain retries, instead of
// tcmalloc's separate lock field: a section's one load of the count then
// tests room, emptiness and the stop together (one compare), so the hit
// reads nothing a drain adds; the price is the retry when a section that
// read the count before the OR commits after it, which needs a section to
// straddle the OR and costs one more fence.
//
// Waiters. A push also fails while anyone waits (the release limit, read
// inside the section, is negative: kOneWaiter below), so the slow path
// sends the slot to the depot with a wake. A waiter lowers the limit by
// kOneWaiter (the "raise" of src/pool/drain.cc) and then fences every CPU
// (membarrier(..._RSEQ) without FLAG_CPU): sections that began before the
// fence have committed (their slots are in caches it then drains) or
// restart and see the raise.
//
// The fallback (the locked caches of cpu_cache.cc) keeps the same
// invariants with a mutex per CPU instead of the sequence and the fence.
#ifndef BUFPOOL_INTERNAL_RSEQ_H_
#define BUFPOOL_INTERNAL_RSEQ_H_

#include <cstdint>

#include "absl/base/attributes.h"
#include "absl/base/config.h"

#if defined(ABSL_HAVE_ADDRESS_SANITIZER) || defined(ABSL_HAVE_THREAD_SANITIZER)
#define BUFPOOL_NO_RSEQ_SANITIZER 1
#endif

// Sanitizer builds run the locked caches: the sanitizers cannot see stores
// made by inline assembly, nor the fence. The AArch64 sequences (little
// endian) are built only when BUFPOOL_AARCH64_RSEQ is defined (CMake option
// BUFPOOL_AARCH64_RSEQ): they compile with the Debian cross compiler and
// their bodies ran under qemu-user, but qemu does not implement rseq, so
// their restarts have not run on hardware yet; without the option AArch64
// runs the locked caches. A program built with a different choice than the
// library still works: the inline paths then take the out-of-line calls,
// which follow the library's.
#if defined(__x86_64__) ||                                    \
    (defined(__aarch64__) && defined(BUFPOOL_AARCH64_RSEQ) && \
     !defined(__AARCH64EB__))
#define BUFPOOL_RSEQ_ARCH 1
#endif
#if defined(BUFPOOL_RSEQ_ARCH) && !defined(BUFPOOL_NO_RSEQ_SANITIZER) && \
    defined(__has_include)
#if __has_include(<sys/rseq.h>)
#define BUFPOOL_HAVE_RSEQ 1
#include <sys/rseq.h>
#endif
#endif
#ifndef BUFPOOL_HAVE_RSEQ
#define BUFPOOL_HAVE_RSEQ 0
#endif

namespace bufpool::internal::rseq {

inline constexpr uint32_t kStopped = 0x80000000u;
// Set in a kSampled pool's inline index (BufferPool::inline_index_), beside
// the field, so that the inline paths find a sampled pool with the compare
// they make anyway to pick the field.
inline constexpr uint32_t kSampledTag = 0x100;
inline constexpr uint32_t kNoSlot = 0xffffffffu;
// A push compares the cache's count with the pool's release limit, an
// int64_t: the cache capacity minus kOneWaiter for each thread asleep in
// Acquire() and each pending NotifyWhenFree() request. So one signed
// compare fails a push when the cache is full (count >= capacity), stopped
// (count >= 2^31) or anyone waits (the limit is then negative).
inline constexpr int64_t kOneWaiter = int64_t{1} << 32;
inline constexpr unsigned kSlotsOffset = 64;  // bytes, in the asm below
// Cache i starts at base + (i << kCacheShift): a constant power of two, so
// that a sequence finds its cache with a shift by an immediate, not a
// multiply by a stride loaded from the pool. It holds the header's line and
// up to (kCacheStride - kSlotsOffset) / 4 slots.
inline constexpr unsigned kCacheShift = 12;
inline constexpr uint64_t kCacheStride = uint64_t{1} << kCacheShift;
// The fields of struct rseq (Linux uapi <linux/rseq.h>) that can index the
// caches, as byte offsets: glibc's <sys/rseq.h> names cpu_id only.
inline constexpr uint64_t kCpuIdField = 4;
inline constexpr uint64_t kMmCidField = 24;  // Linux 6.3+
static_assert(kCpuIdField == 4, "the sections' .if names cpu_id's offset");
// getauxval() key for the size of struct rseq the kernel fills
// (<sys/auxv.h> of glibc 2.37+; the same number on every architecture).
inline constexpr unsigned long kAtRseqFeatureSize = 27;
// The feature size that covers mm_cid (offset 24, 4 bytes).
inline constexpr unsigned long kMmCidFeatureSize = 28;

#if BUFPOOL_HAVE_RSEQ && defined(__x86_64__)

// The sequences' shared parts, as assembler text. The descriptor
// (__rseq_cs) and the abort handler (__rseq_failure) go in sections of
// their own; the "?" flag puts them in the section group of the code around
// them, so that when a sequence is inlined into a function the linker keeps
// one copy of (a COMDAT group), it keeps or drops them along with that copy.
//
// START: label 6 re-arms rseq_cs (the kernel clears it on an abort), label
// 1 starts the section. It reads the index field (operand `field`: cpu_id
// or mm_cid, a constant) into eax, failing to label 5 when it is not below
// ncpu, and leaves the cache's address in rax. With mm_cid it first reads
// cpu_id, which is negative when rseq is not registered for this thread
// (mm_cid would then read 0 or a stale value while nothing protects the
// section: fail); with cpu_id the bound check already rejects a negative.
#define BUFPOOL_RSEQ_X86_START             \
  ".pushsection __rseq_cs, \"aw?\"\n\t"    \
  ".balign 32\n\t"                         \
  "3:\n\t"                                 \
  ".long 0x0, 0x0\n\t"                     \
  ".quad 1f, 2f - 1f, 4f\n\t"              \
  ".popsection\n\t"                        \
  "6:\n\t"                                 \
  "leaq 3b(%%rip), %%rax\n\t"              \
  "movq %%rax, %%fs:8(%[off])\n\t"         \
  "1:\n\t"                                 \
  ".if %c[field] != 4\n\t"                 \
  "movl %%fs:4(%[off]), %%eax\n\t"         \
  "testl %%eax, %%eax\n\t"                 \
  "js 5f\n\t"                              \
  ".endif\n\t"                             \
  "movl %%fs:%c[field](%[off]), %%eax\n\t" \
  "cmpl %[ncpu], %%eax\n\t"                \
  "jae 5f\n\t"                             \
  "shlq %[shift], %%rax\n\t"               \
  "addq %[base], %%rax\n\t"
// END: label 2, just past the section, clears rseq_cs, so that no thread
// keeps a pointer to this descriptor once the sequence is done: an object
// that inlined the sequence (a plugin) can then be unloaded while threads
// that ran it live on, since the kernel reads rseq_cs on the next
// preemption of each (librseq's rseq_prepare_unload() does the same, once
// per thread). One store to a line the sequence just wrote.
#define BUFPOOL_RSEQ_X86_END \
  "2:\n\t"                   \
  "movq $0, %%fs:8(%[off])\n\t"
// ABORT: the signature the kernel checks before the abort label (4), which
// starts over; the failure code (label 5) follows it in the same section.
#define BUFPOOL_RSEQ_X86_ABORT               \
  ".pushsection __rseq_failure, \"ax?\"\n\t" \
  ".byte 0x0f, 0xb9, 0x3d\n\t"               \
  ".long 0x53053053\n\t" /* RSEQ_SIG */      \
  "4:\n\t"                                   \
  "jmp 6b\n\t"                               \
  "5:\n\t"

// Each sequence exists once per index field (kField: kCpuIdField or
// kMmCidField), so that the field's offset is an immediate in the section;
// the functions without the template parameter choose one with a branch on
// the pool's field. base and ncpu (and Push's *limit) are
// references to the pool's fields, used as memory operands: the section
// folds each load into the instruction that uses it, instead of the caller
// loading them into registers first (the asm's memory clobber would make it
// reload them before every section).

// Pops the top slot of the cache that the index field names; kNoSlot when
// that cache lends nothing (count <= floor: empty, or all of it under the
// floor), is stopped, the index is at or above ncpu (0 where the pool runs
// no sequences), or the thread has no rseq registration. The compare with
// the floor replaces a test for an empty cache: the hit costs what it did.
// (Not an asm goto: GCC 12 miscompiles asm goto with outputs, merging the
// failure edge into the success path.)
template <uint64_t kField>
ABSL_ATTRIBUTE_ALWAYS_INLINE inline uint32_t PopAt(char* const& base,
                                                   const uint32_t& ncpu) {
  uint32_t slot;
  asm volatile(BUFPOOL_RSEQ_X86_START
               "movl (%%rax), %%ecx\n\t"  // count
               "cmpl 4(%%rax), %%ecx\n\t"
               "jle 5f\n\t"  // nothing lent (count <= floor), or kStopped
               "subl $1, %%ecx\n\t"
               "movl 64(%%rax,%%rcx,4), %[slot]\n\t"
               "movl %%ecx, (%%rax)\n\t"  // commit
               BUFPOOL_RSEQ_X86_END BUFPOOL_RSEQ_X86_ABORT
               "movl $0xffffffff, %[slot]\n\t"
               "jmp 2b\n\t"
               ".popsection\n\t"
               : [slot] "=&r"(slot)
               : [off] "r"(__rseq_offset), [field] "i"(kField),
                 [shift] "i"(kCacheShift), [base] "m"(base), [ncpu] "m"(ncpu)
               : "rax", "rcx", "memory", "cc");
  return slot;
}

// Pushes `slot` onto the cache that the index field names; false when the
// count is not below *limit (the cache is full or stopped, or someone
// waits: see kOneWaiter), the cache already lends `lend` slots (count -
// floor: the pool takes the excess back out of line, Reclaim), the index is
// at or above ncpu (0 where the pool runs no sequences, or scrubs), or the
// thread has no rseq registration. The failure leaves the section by a jump
// to the caller's branch (asm goto, no outputs), so the hit carries no flag.
template <uint64_t kField>
ABSL_ATTRIBUTE_ALWAYS_INLINE inline bool PushAt(char* const& base,
                                                const uint32_t& ncpu,
                                                const void* limit,
                                                const uint32_t& lend,
                                                uint32_t slot) {
  asm goto(BUFPOOL_RSEQ_X86_START
           "movl (%%rax), %%ecx\n\t"  // count, zero-extended into rcx
           "cmpq %[limit], %%rcx\n\t"
           "jge 5f\n\t"  // full, kStopped (2^31), or someone waits (< 0)
           "movl %%ecx, %%edx\n\t"
           "subl 4(%%rax), %%edx\n\t"  // lent: count - floor
           "cmpl %[lend], %%edx\n\t"
           "jge 5f\n\t"  // lends its allowance already
           "movl %[slot], 64(%%rax,%%rcx,4)\n\t"
           "addl $1, %%ecx\n\t"
           "movl %%ecx, (%%rax)\n\t"  // commit
           BUFPOOL_RSEQ_X86_END BUFPOOL_RSEQ_X86_ABORT
           "movq $0, %%fs:8(%[off])\n\t"  // as END does
           "jmp %l[miss]\n\t"
           ".popsection\n\t"
           :
           : [off] "r"(__rseq_offset), [field] "i"(kField),
             [shift] "i"(kCacheShift), [base] "m"(base), [ncpu] "m"(ncpu),
             [limit] "m"(*static_cast<const int64_t*>(limit)), [lend] "m"(lend),
             [slot] "r"(slot)
           : "rax", "rcx", "rdx", "memory", "cc"
           : miss);
  return true;
miss:
  return false;
}

ABSL_ATTRIBUTE_ALWAYS_INLINE inline uint32_t Pop(char* const& base,
                                                 const uint32_t& ncpu,
                                                 uint64_t index) {
  // mm_cid is what every kernel since 6.3 gives: its section falls through.
  if (index == kMmCidField) [[likely]] {
    return PopAt<kMmCidField>(base, ncpu);
  }
  return PopAt<kCpuIdField>(base, ncpu);
}

ABSL_ATTRIBUTE_ALWAYS_INLINE inline bool TryPop(char* const& base,
                                                const uint32_t& ncpu,
                                                uint64_t index,
                                                uint32_t* slot) {
  *slot = Pop(base, ncpu, index);
  return *slot != kNoSlot;
}

ABSL_ATTRIBUTE_ALWAYS_INLINE inline bool Push(char* const& base,
                                              const uint32_t& ncpu,
                                              uint64_t index, const void* limit,
                                              const uint32_t& lend,
                                              uint32_t slot) {
  if (index == kMmCidField) [[likely]] {
    return PushAt<kMmCidField>(base, ncpu, limit, lend, slot);
  }
  return PushAt<kCpuIdField>(base, ncpu, limit, lend, slot);
}

// The batch forms, for the slow paths that move a refill or a spill
// (src/pool/rseq.cc) and for the bulk calls (src/pool/pool_calls.cc): one
// section each instead of one per slot. PopBatch copies the top n =
// min(floor, max) slots of this index's cache into out[0, n) (the top last)
// and commits count - n and floor - n; PushBatch copies in[0, n) onto it,
// n = min(count of in, free room), and commits count + n and floor + n.
// So neither changes what the cache lends (count - floor): a batch moves
// slots the pool's accounting sees. Each commit is one 8-byte store of
// count and floor. Each copy runs inside the section, before its single
// committing store: an abort restarts the whole copy (what an aborted
// PopBatch wrote into `out` is rewritten; what an aborted PushBatch wrote
// lands above the count, which nothing reads), so the argument above holds
// unchanged. They return n, 0 where they fail. `max` and `count` must be at
// least 1; ncpu may sit in memory (a cold path).
template <uint64_t kField>
ABSL_ATTRIBUTE_ALWAYS_INLINE inline uint32_t PopBatchAt(char* base,
                                                        uint32_t ncpu,
                                                        uint32_t* out,
                                                        uint32_t max) {
  uint32_t n;
  uint64_t v, i;
  char* src;
  asm volatile(
      BUFPOOL_RSEQ_X86_START
      "movl (%%rax), %%ecx\n\t"  // count
      "testl %%ecx, %%ecx\n\t"
      "js 5f\n\t"                 // kStopped
      "movl 4(%%rax), %%edx\n\t"  // floor
      "testl %%edx, %%edx\n\t"
      "jle 5f\n\t"  // nothing under the floor (an empty cache's is 0)
      "movl %[max], %[n]\n\t"
      "cmpl %%edx, %[n]\n\t"
      "cmoval %%edx, %[n]\n\t"  // n = min(max, floor) >= 1
      "subl %[n], %%ecx\n\t"    // the new count
      "subl %[n], %%edx\n\t"    // the new floor
      "leaq 64(%%rax,%%rcx,4), %[src]\n\t"
      "xorl %k[i], %k[i]\n\t"
      "8:\n\t"
      "movl (%[src],%[i],4), %k[v]\n\t"
      "movl %k[v], (%[out],%[i],4)\n\t"
      "addq $1, %[i]\n\t"
      "cmpl %k[i], %[n]\n\t"
      "jne 8b\n\t"
      "shlq $32, %%rdx\n\t"
      "orq %%rdx, %%rcx\n\t"
      "movq %%rcx, (%%rax)\n\t"  // commit: count and floor
      BUFPOOL_RSEQ_X86_END BUFPOOL_RSEQ_X86_ABORT
      "xorl %[n], %[n]\n\t"
      "jmp 2b\n\t"
      ".popsection\n\t"
      : [n] "=&r"(n), [v] "=&r"(v), [i] "=&r"(i), [src] "=&r"(src)
      : [off] "r"(__rseq_offset), [field] "i"(kField), [shift] "i"(kCacheShift),
        [base] "rm"(base), [ncpu] "rm"(ncpu), [out] "r"(out), [max] "rm"(max)
      : "rax", "rcx", "rdx", "memory", "cc");
  return n;
}

template <uint64_t kField>
ABSL_ATTRIBUTE_ALWAYS_INLINE inline uint32_t PushBatchAt(char* base,
                                                         uint32_t ncpu,
                                                         const void* limit,
                                                         const uint32_t* in,
                                                         uint32_t count) {
  uint64_t n;
  uint64_t v;
  uint64_t i;
  char* dst;
  asm volatile(
      BUFPOOL_RSEQ_X86_START
      "movl (%%rax), %%ecx\n\t"  // count, zero-extended into rcx
      "movq (%[limit]), %[n]\n\t"
      "cmpq %[n], %%rcx\n\t"
      "jge 5f\n\t"             // full, kStopped (2^31), or someone waits
      "subl %%ecx, %k[n]\n\t"  // room = limit (the capacity) - count >= 1
      "cmpl %[count], %k[n]\n\t"
      "cmoval %[count], %k[n]\n\t"  // n = min(room, count)
      "leaq 64(%%rax,%%rcx,4), %[dst]\n\t"
      "xorl %k[i], %k[i]\n\t"
      "8:\n\t"
      "movl (%[in],%[i],4), %k[v]\n\t"
      "movl %k[v], (%[dst],%[i],4)\n\t"
      "addq $1, %[i]\n\t"
      "cmpl %k[i], %k[n]\n\t"
      "jne 8b\n\t"
      "addl %k[n], %%ecx\n\t"
      "movl 4(%%rax), %k[v]\n\t"  // floor
      "addl %k[n], %k[v]\n\t"
      "shlq $32, %[v]\n\t"
      "orq %[v], %%rcx\n\t"
      "movq %%rcx, (%%rax)\n\t"  // commit: count and floor
      BUFPOOL_RSEQ_X86_END BUFPOOL_RSEQ_X86_ABORT
      "xorl %k[n], %k[n]\n\t"
      "jmp 2b\n\t"
      ".popsection\n\t"
      : [n] "=&r"(n), [v] "=&r"(v), [i] "=&r"(i), [dst] "=&r"(dst)
      : [off] "r"(__rseq_offset), [field] "i"(kField), [shift] "i"(kCacheShift),
        [base] "rm"(base), [ncpu] "rm"(ncpu), [limit] "r"(limit), [in] "r"(in),
        [count] "rm"(count)
      : "rax", "rcx", "memory", "cc");
  return static_cast<uint32_t>(n);
}

// Lend lowers the floor of this index's cache to max(0, count - lend), so
// that it lends min(count, lend) slots, when that lends more than it does
// now; it returns how far the floor fell (0: nothing changed, or the cache
// is stopped, or the section could not run). Reclaim raises the floor to the
// count, so that it lends nothing, and returns how far it rose. Each commits
// with one 4-byte store of the floor; the count is only read. The caller
// accounts for the change (accounting.cc): before a Lend, after a Reclaim.
template <uint64_t kField>
ABSL_ATTRIBUTE_ALWAYS_INLINE inline uint32_t LendAt(char* base, uint32_t ncpu,
                                                    uint32_t lend) {
  uint32_t n;
  asm volatile(
      BUFPOOL_RSEQ_X86_START
      "movl (%%rax), %%ecx\n\t"  // count
      "testl %%ecx, %%ecx\n\t"
      "js 5f\n\t"  // kStopped
      "xorl %%edx, %%edx\n\t"
      "subl %[lend], %%ecx\n\t"
      "cmovsl %%edx, %%ecx\n\t"  // the new floor: max(0, count - lend)
      "movl 4(%%rax), %[n]\n\t"
      "subl %%ecx, %[n]\n\t"
      "jle 5f\n\t"                // lends that much already
      "movl %%ecx, 4(%%rax)\n\t"  // commit
      BUFPOOL_RSEQ_X86_END BUFPOOL_RSEQ_X86_ABORT
      "xorl %[n], %[n]\n\t"
      "jmp 2b\n\t"
      ".popsection\n\t"
      : [n] "=&r"(n)
      : [off] "r"(__rseq_offset), [field] "i"(kField), [shift] "i"(kCacheShift),
        [base] "rm"(base), [ncpu] "rm"(ncpu), [lend] "rm"(lend)
      : "rax", "rcx", "rdx", "memory", "cc");
  return n;
}

template <uint64_t kField>
ABSL_ATTRIBUTE_ALWAYS_INLINE inline uint32_t ReclaimAt(char* base,
                                                       uint32_t ncpu) {
  uint32_t n;
  asm volatile(BUFPOOL_RSEQ_X86_START
               "movl (%%rax), %%ecx\n\t"  // count
               "testl %%ecx, %%ecx\n\t"
               "js 5f\n\t"  // kStopped
               "movl %%ecx, %[n]\n\t"
               "subl 4(%%rax), %[n]\n\t"   // lent: count - floor
               "jle 5f\n\t"                // lends nothing
               "movl %%ecx, 4(%%rax)\n\t"  // commit: floor = count
               BUFPOOL_RSEQ_X86_END BUFPOOL_RSEQ_X86_ABORT
               "xorl %[n], %[n]\n\t"
               "jmp 2b\n\t"
               ".popsection\n\t"
               : [n] "=&r"(n)
               : [off] "r"(__rseq_offset), [field] "i"(kField),
                 [shift] "i"(kCacheShift), [base] "rm"(base), [ncpu] "rm"(ncpu)
               : "rax", "rcx", "memory", "cc");
  return n;
}

// The slow paths' fused forms (src/pool/rseq.cc), one section each where
// Lend + Pop and Reclaim + Push took two. LendPop lowers the floor of this
// index's cache to min(floor, max(0, count - lend)) and pops the top slot,
// committing count - 1 and the new floor with one 8-byte store; it fails
// (kNoSlot, *fell 0) when the cache is empty or stopped. *fell is how far
// the floor fell: the caller adds `lend` to the accounting before the
// section and gives back lend - *fell after it (accounting.cc, Lend). The
// popped slot moves from lent to held, which leaves the bound unchanged.
// ReclaimPush pushes `slot` with the floor raised to the old count, so that
// the cache lends one slot (the pushed one, within any lend >= 1),
// committing count + 1 and the floor with one 8-byte store; ReclaimPushAt
// returns how far the floor rose (count - floor before), or kNoSlot when
// the count is not below *limit (full, stopped, or someone waits). The
// caller subtracts the rise after the section (Reclaim's rule). Both write
// nothing before their commit except, for ReclaimPush, the slot above the
// count, which nothing reads: an abort restarts them whole.
template <uint64_t kField>
ABSL_ATTRIBUTE_ALWAYS_INLINE inline uint32_t LendPopAt(char* base,
                                                       uint32_t ncpu,
                                                       uint32_t lend,
                                                       uint32_t* fell) {
  uint32_t slot;
  uint64_t f;
  asm volatile(
      BUFPOOL_RSEQ_X86_START
      "movl (%%rax), %%ecx\n\t"  // count
      "testl %%ecx, %%ecx\n\t"
      "jle 5f\n\t"  // empty, or kStopped (negative)
      "xorl %k[f], %k[f]\n\t"
      "movl %%ecx, %%edx\n\t"
      "subl %[lend], %%edx\n\t"
      "cmovsl %k[f], %%edx\n\t"   // max(0, count - lend)
      "movl 4(%%rax), %k[f]\n\t"  // floor
      "cmpl %k[f], %%edx\n\t"
      "cmoval %k[f], %%edx\n\t"  // the new floor: min(floor, that) < count
      "subl %%edx, %k[f]\n\t"    // how far it falls
      "subl $1, %%ecx\n\t"
      "movl 64(%%rax,%%rcx,4), %[slot]\n\t"
      "shlq $32, %%rdx\n\t"
      "orq %%rdx, %%rcx\n\t"
      "movq %%rcx, (%%rax)\n\t"  // commit: count - 1 and the new floor
      BUFPOOL_RSEQ_X86_END BUFPOOL_RSEQ_X86_ABORT
      "movl $0xffffffff, %[slot]\n\t"
      "xorl %k[f], %k[f]\n\t"
      "jmp 2b\n\t"
      ".popsection\n\t"
      : [slot] "=&r"(slot), [f] "=&r"(f)
      : [off] "r"(__rseq_offset), [field] "i"(kField), [shift] "i"(kCacheShift),
        [base] "rm"(base), [ncpu] "rm"(ncpu), [lend] "rm"(lend)
      : "rax", "rcx", "rdx", "memory", "cc");
  *fell = static_cast<uint32_t>(f);
  return slot;
}

template <uint64_t kField>
ABSL_ATTRIBUTE_ALWAYS_INLINE inline uint32_t ReclaimPushAt(char* base,
                                                           uint32_t ncpu,
                                                           const void* limit,
                                                           uint32_t slot) {
  uint32_t n;
  asm volatile(BUFPOOL_RSEQ_X86_START
               "movl (%%rax), %%ecx\n\t"  // count, zero-extended into rcx
               "cmpq (%[limit]), %%rcx\n\t"
               "jge 5f\n\t"  // full, kStopped (2^31), or someone waits (< 0)
               "movl %%ecx, %[n]\n\t"
               "subl 4(%%rax), %[n]\n\t"  // what the cache lent: count - floor
               "movl %[slot], 64(%%rax,%%rcx,4)\n\t"
               "movq %%rcx, %%rdx\n\t"
               "shlq $32, %%rdx\n\t"  // the new floor: the old count
               "addq $1, %%rcx\n\t"
               "orq %%rdx, %%rcx\n\t"
               "movq %%rcx, (%%rax)\n\t"  // commit: count + 1 and the new floor
               BUFPOOL_RSEQ_X86_END BUFPOOL_RSEQ_X86_ABORT
               "movl $0xffffffff, %[n]\n\t"
               "jmp 2b\n\t"
               ".popsection\n\t"
               : [n] "=&r"(n)
               : [off] "r"(__rseq_offset), [field] "i"(kField),
                 [shift] "i"(kCacheShift), [base] "rm"(base), [ncpu] "rm"(ncpu),
                 [limit] "r"(limit), [slot] "r"(slot)
               : "rax", "rcx", "rdx", "memory", "cc");
  return n;
}

ABSL_ATTRIBUTE_ALWAYS_INLINE inline uint32_t LendPop(char* base, uint32_t ncpu,
                                                     uint64_t index,
                                                     uint32_t lend,
                                                     uint32_t* fell) {
  return index == kMmCidField ? LendPopAt<kMmCidField>(base, ncpu, lend, fell)
                              : LendPopAt<kCpuIdField>(base, ncpu, lend, fell);
}

// Whether it pushed; *rose: how far the floor rose (0 when it failed).
ABSL_ATTRIBUTE_ALWAYS_INLINE inline bool ReclaimPush(char* base, uint32_t ncpu,
                                                     uint64_t index,
                                                     const void* limit,
                                                     uint32_t slot,
                                                     uint32_t* rose) {
  const uint32_t n = index == kMmCidField
                         ? ReclaimPushAt<kMmCidField>(base, ncpu, limit, slot)
                         : ReclaimPushAt<kCpuIdField>(base, ncpu, limit, slot);
  *rose = n == kNoSlot ? 0 : n;
  return n != kNoSlot;
}

ABSL_ATTRIBUTE_ALWAYS_INLINE inline uint32_t PopBatch(char* base, uint32_t ncpu,
                                                      uint64_t index,
                                                      uint32_t* out,
                                                      uint32_t max) {
  return index == kMmCidField ? PopBatchAt<kMmCidField>(base, ncpu, out, max)
                              : PopBatchAt<kCpuIdField>(base, ncpu, out, max);
}

ABSL_ATTRIBUTE_ALWAYS_INLINE inline uint32_t PushBatch(
    char* base, uint32_t ncpu, uint64_t index, const void* limit,
    const uint32_t* in, uint32_t count) {
  return index == kMmCidField
             ? PushBatchAt<kMmCidField>(base, ncpu, limit, in, count)
             : PushBatchAt<kCpuIdField>(base, ncpu, limit, in, count);
}

ABSL_ATTRIBUTE_ALWAYS_INLINE inline uint32_t Lend(char* base, uint32_t ncpu,
                                                  uint64_t index,
                                                  uint32_t lend) {
  return index == kMmCidField ? LendAt<kMmCidField>(base, ncpu, lend)
                              : LendAt<kCpuIdField>(base, ncpu, lend);
}

ABSL_ATTRIBUTE_ALWAYS_INLINE inline uint32_t Reclaim(char* base, uint32_t ncpu,
                                                     uint64_t index) {
  return index == kMmCidField ? ReclaimAt<kMmCidField>(base, ncpu)
                              : ReclaimAt<kCpuIdField>(base, ncpu);
}

#undef BUFPOOL_RSEQ_X86_START
#undef BUFPOOL_RSEQ_X86_ABORT

#elif BUFPOOL_HAVE_RSEQ  // AArch64, little endian

// The same sequences, step for step (see the x86-64 ones); both ways out
// clear rseq_cs where they join, as BUFPOOL_RSEQ_X86_END does. Two
// differences: the area's address (thread pointer + __rseq_offset) is
// computed in C, and the failure code sits inline after the commit, jumped
// over on success: AArch64's conditional branches reach +-1 MiB (tbnz
// +-32 KiB), not a section the linker may place anywhere. Only the abort
// handler, which the kernel jumps to and which leaves with an unconditional
// branch (+-128 MiB, with a veneer beyond), is in __rseq_failure. The signature
// is glibc's RSEQ_SIG for AArch64 (0xd428bc00, BRK #0x45E0), an instruction
// word before the abort label. Loads and stores are plain: the drain's argument
// rests on the membarrier fence, a full barrier on every CPU it reaches, and
// the commit's store depends on the count the section loaded.
#define BUFPOOL_RSEQ_A64_START               \
  ".pushsection __rseq_cs, \"aw?\"\n\t"      \
  ".balign 32\n\t"                           \
  "3:\n\t"                                   \
  ".long 0x0, 0x0\n\t"                       \
  ".quad 1f, 2f - 1f, 4f\n\t"                \
  ".popsection\n\t"                          \
  ".pushsection __rseq_failure, \"ax?\"\n\t" \
  ".inst 0xd428bc00\n\t" /* RSEQ_SIG */      \
  "4:\n\t"                                   \
  "b 6f\n\t"                                 \
  ".popsection\n\t"                          \
  "6:\n\t"                                   \
  "adrp %[t], 3b\n\t"                        \
  "add %[t], %[t], :lo12:3b\n\t"             \
  "str %[t], [%[area], #8]\n\t"              \
  "1:\n\t"                                   \
  "ldr %w[t], [%[area], #4]\n\t"             \
  "tbnz %w[t], #31, 5f\n\t"                  \
  "ldr %w[t], [%[area], %[index]]\n\t"       \
  "cmp %w[t], %w[ncpu]\n\t"                  \
  "b.hs 5f\n\t"                              \
  "add %[c], %[base], %[t], lsl %[shift]\n\t"

inline char* RseqArea() {
  return static_cast<char*>(__builtin_thread_pointer()) + __rseq_offset;
}

ABSL_ATTRIBUTE_ALWAYS_INLINE inline uint32_t Pop(char* base, uint32_t ncpu,
                                                 uint64_t index) {
  uint32_t slot, n;
  uint64_t t, c;
  asm volatile(BUFPOOL_RSEQ_A64_START
               "ldr %w[n], [%[c]]\n\t"      // count
               "ldr %w[t], [%[c], #4]\n\t"  // floor
               "cmp %w[n], %w[t]\n\t"
               "b.le 5f\n\t"  // nothing lent (count <= floor), or kStopped
               "sub %w[n], %w[n], #1\n\t"
               "add %[t], %[c], #64\n\t"
               "ldr %w[slot], [%[t], %w[n], uxtw #2]\n\t"
               "str %w[n], [%[c]]\n\t"  // commit
               "2:\n\t"
               "b 8f\n\t"
               "5:\n\t"
               "mov %w[slot], #-1\n\t"
               "8:\n\t"
               "str xzr, [%[area], #8]\n\t"  // rseq_cs cleared
               : [slot] "=&r"(slot), [n] "=&r"(n), [t] "=&r"(t), [c] "=&r"(c)
               : [area] "r"(RseqArea()), [index] "r"(index), [base] "r"(base),
                 [shift] "i"(kCacheShift), [ncpu] "r"(ncpu)
               : "memory", "cc");
  return slot;
}

ABSL_ATTRIBUTE_ALWAYS_INLINE inline bool Push(char* base, uint32_t ncpu,
                                              uint64_t index, const void* limit,
                                              uint32_t lend, uint32_t slot) {
  uint32_t ok;
  uint64_t n, t, c;
  asm volatile(BUFPOOL_RSEQ_A64_START
               "ldr %w[n], [%[c]]\n\t"  // count, zero-extended
               "ldr %[t], [%[limit]]\n\t"
               "cmp %[n], %[t]\n\t"
               "b.ge 5f\n\t"  // full, kStopped (2^31), or someone waits
               "ldr %w[t], [%[c], #4]\n\t"  // floor
               "sub %w[t], %w[n], %w[t]\n\t"
               "cmp %w[t], %w[lend]\n\t"
               "b.ge 5f\n\t"  // lends its allowance already
               "add %[t], %[c], #64\n\t"
               "str %w[slot], [%[t], %w[n], uxtw #2]\n\t"
               "add %w[n], %w[n], #1\n\t"
               "str %w[n], [%[c]]\n\t"  // commit
               "2:\n\t"
               "mov %w[ok], #1\n\t"
               "b 8f\n\t"
               "5:\n\t"
               "mov %w[ok], #0\n\t"
               "8:\n\t"
               "str xzr, [%[area], #8]\n\t"  // rseq_cs cleared, as in Pop
               : [ok] "=&r"(ok), [n] "=&r"(n), [t] "=&r"(t), [c] "=&r"(c)
               : [area] "r"(RseqArea()), [index] "r"(index), [base] "r"(base),
                 [shift] "i"(kCacheShift), [ncpu] "r"(ncpu), [limit] "r"(limit),
                 [lend] "r"(lend), [slot] "r"(slot)
               : "memory", "cc");
  return ok != 0;
}

ABSL_ATTRIBUTE_ALWAYS_INLINE inline bool TryPop(char* base, uint32_t ncpu,
                                                uint64_t index,
                                                uint32_t* slot) {
  *slot = Pop(base, ncpu, index);
  return *slot != kNoSlot;
}

// The per-mode forms that the inline paths name (buffer_pool_inl.h). Here
// the index field is a register operand of the one sequence, so each is
// that sequence with the field fixed.
template <uint64_t kField>
ABSL_ATTRIBUTE_ALWAYS_INLINE inline uint32_t PopAt(char* base, uint32_t ncpu) {
  return Pop(base, ncpu, kField);
}

template <uint64_t kField>
ABSL_ATTRIBUTE_ALWAYS_INLINE inline bool PushAt(char* base, uint32_t ncpu,
                                                const void* limit,
                                                uint32_t lend, uint32_t slot) {
  return Push(base, ncpu, kField, limit, lend, slot);
}

// One slot of a batch: the top slot under the floor (count and floor both
// fall by one, in one 8-byte commit), or kNoSlot.
ABSL_ATTRIBUTE_ALWAYS_INLINE inline uint32_t PopUnder(char* base, uint32_t ncpu,
                                                      uint64_t index) {
  uint32_t slot;
  uint64_t n, f, t, c;
  asm volatile(BUFPOOL_RSEQ_A64_START
               "ldr %w[n], [%[c]]\n\t"      // count
               "tbnz %w[n], #31, 5f\n\t"    // kStopped
               "ldr %w[f], [%[c], #4]\n\t"  // floor
               "cbz %w[f], 5f\n\t"          // nothing under the floor
               "sub %w[n], %w[n], #1\n\t"
               "sub %w[f], %w[f], #1\n\t"
               "add %[t], %[c], #64\n\t"
               "ldr %w[slot], [%[t], %w[n], uxtw #2]\n\t"
               "orr %[n], %[n], %[f], lsl #32\n\t"
               "str %[n], [%[c]]\n\t"  // commit: count and floor
               "2:\n\t"
               "b 8f\n\t"
               "5:\n\t"
               "mov %w[slot], #-1\n\t"
               "8:\n\t"
               "str xzr, [%[area], #8]\n\t"  // rseq_cs cleared
               : [slot] "=&r"(slot), [n] "=&r"(n), [f] "=&r"(f), [t] "=&r"(t),
                 [c] "=&r"(c)
               : [area] "r"(RseqArea()), [index] "r"(index), [base] "r"(base),
                 [shift] "i"(kCacheShift), [ncpu] "r"(ncpu)
               : "memory", "cc");
  return slot;
}

// One slot of a batch: pushed with count and floor both up by one.
ABSL_ATTRIBUTE_ALWAYS_INLINE inline bool PushOver(char* base, uint32_t ncpu,
                                                  uint64_t index,
                                                  const void* limit,
                                                  uint32_t slot) {
  uint32_t ok;
  uint64_t n, f, t, c;
  asm volatile(
      BUFPOOL_RSEQ_A64_START
      "ldr %w[n], [%[c]]\n\t"  // count, zero-extended
      "ldr %[t], [%[limit]]\n\t"
      "cmp %[n], %[t]\n\t"
      "b.ge 5f\n\t"                // full, kStopped (2^31), or someone waits
      "ldr %w[f], [%[c], #4]\n\t"  // floor
      "add %[t], %[c], #64\n\t"
      "str %w[slot], [%[t], %w[n], uxtw #2]\n\t"
      "add %w[n], %w[n], #1\n\t"
      "add %w[f], %w[f], #1\n\t"
      "orr %[n], %[n], %[f], lsl #32\n\t"
      "str %[n], [%[c]]\n\t"  // commit: count and floor
      "2:\n\t"
      "mov %w[ok], #1\n\t"
      "b 8f\n\t"
      "5:\n\t"
      "mov %w[ok], #0\n\t"
      "8:\n\t"
      "str xzr, [%[area], #8]\n\t"  // rseq_cs cleared
      : [ok] "=&r"(ok), [n] "=&r"(n), [f] "=&r"(f), [t] "=&r"(t), [c] "=&r"(c)
      : [area] "r"(RseqArea()), [index] "r"(index), [base] "r"(base),
        [shift] "i"(kCacheShift), [ncpu] "r"(ncpu), [limit] "r"(limit),
        [slot] "r"(slot)
      : "memory", "cc");
  return ok != 0;
}

// Lend and Reclaim (see the x86-64 ones): the floor alone, one 4-byte commit.
ABSL_ATTRIBUTE_ALWAYS_INLINE inline uint32_t Lend(char* base, uint32_t ncpu,
                                                  uint64_t index,
                                                  uint32_t lend) {
  uint32_t out;
  uint64_t n, t, c;
  asm volatile(BUFPOOL_RSEQ_A64_START
               "ldr %w[n], [%[c]]\n\t"    // count
               "tbnz %w[n], #31, 5f\n\t"  // kStopped
               "subs %w[n], %w[n], %w[lend]\n\t"
               "csel %w[n], wzr, %w[n], lt\n\t"  // max(0, count - lend)
               "ldr %w[t], [%[c], #4]\n\t"       // floor
               "subs %w[t], %w[t], %w[n]\n\t"
               "b.le 5f\n\t"                // lends that much already
               "str %w[n], [%[c], #4]\n\t"  // commit
               "2:\n\t"
               "mov %w[out], %w[t]\n\t"
               "b 8f\n\t"
               "5:\n\t"
               "mov %w[out], #0\n\t"
               "8:\n\t"
               "str xzr, [%[area], #8]\n\t"  // rseq_cs cleared
               : [out] "=&r"(out), [n] "=&r"(n), [t] "=&r"(t), [c] "=&r"(c)
               : [area] "r"(RseqArea()), [index] "r"(index), [base] "r"(base),
                 [shift] "i"(kCacheShift), [ncpu] "r"(ncpu), [lend] "r"(lend)
               : "memory", "cc");
  return out;
}

ABSL_ATTRIBUTE_ALWAYS_INLINE inline uint32_t Reclaim(char* base, uint32_t ncpu,
                                                     uint64_t index) {
  uint32_t out;
  uint64_t n, t, c;
  asm volatile(BUFPOOL_RSEQ_A64_START
               "ldr %w[n], [%[c]]\n\t"      // count
               "tbnz %w[n], #31, 5f\n\t"    // kStopped
               "ldr %w[t], [%[c], #4]\n\t"  // floor
               "subs %w[t], %w[n], %w[t]\n\t"
               "b.le 5f\n\t"                // lends nothing
               "str %w[n], [%[c], #4]\n\t"  // commit: floor = count
               "2:\n\t"
               "mov %w[out], %w[t]\n\t"
               "b 8f\n\t"
               "5:\n\t"
               "mov %w[out], #0\n\t"
               "8:\n\t"
               "str xzr, [%[area], #8]\n\t"  // rseq_cs cleared
               : [out] "=&r"(out), [n] "=&r"(n), [t] "=&r"(t), [c] "=&r"(c)
               : [area] "r"(RseqArea()), [index] "r"(index), [base] "r"(base),
                 [shift] "i"(kCacheShift), [ncpu] "r"(ncpu)
               : "memory", "cc");
  return out;
}

// The batch forms (see the x86-64 ones) as one section per slot, each
// moving count and floor together: sound by the same argument, only slower;
// the slow paths alone call them.
inline uint32_t PopBatch(char* base, uint32_t ncpu, uint64_t index,
                         uint32_t* out, uint32_t max) {
  uint32_t n = 0;
  while (n < max) {
    const uint32_t slot = PopUnder(base, ncpu, index);
    if (slot == kNoSlot) break;
    out[n++] = slot;
  }
  for (uint32_t a = 0, b = n; a + 1 < b; ++a, --b) {  // the top last
    const uint32_t t = out[a];
    out[a] = out[b - 1];
    out[b - 1] = t;
  }
  return n;
}

inline uint32_t PushBatch(char* base, uint32_t ncpu, uint64_t index,
                          const void* limit, const uint32_t* in,
                          uint32_t count) {
  uint32_t n = 0;
  while (n < count && PushOver(base, ncpu, index, limit, in[n])) {
    ++n;
  }
  return n;
}

// LendPop and ReclaimPush (see the x86-64 ones) as two sections each,
// Lend then Pop and Reclaim then Push: the same accounting, one more
// section.
inline uint32_t LendPop(char* base, uint32_t ncpu, uint64_t index,
                        uint32_t lend, uint32_t* fell) {
  *fell = Lend(base, ncpu, index, lend);
  return Pop(base, ncpu, index);
}

inline bool ReclaimPush(char* base, uint32_t ncpu, uint64_t index,
                        const void* limit, uint32_t slot, uint32_t* rose) {
  *rose = Reclaim(base, ncpu, index);
  return Push(base, ncpu, index, limit, 1, slot);
}

#undef BUFPOOL_RSEQ_A64_START

#endif

#if BUFPOOL_HAVE_RSEQ

// The index field of this thread's rseq area, read outside any section (a
// hint: it may change at the next preemption). Always inlined, as Pop and
// Push are: a program built without rseq (a sanitizer build) may link a
// library built with it, and the two bodies must not meet in one symbol.
ABSL_ATTRIBUTE_ALWAYS_INLINE inline uint32_t CurrentIndex(uint64_t index) {
  const char* area =
      static_cast<const char*>(__builtin_thread_pointer()) + __rseq_offset;
  return *reinterpret_cast<const volatile uint32_t*>(area + index);
}

#else

ABSL_ATTRIBUTE_ALWAYS_INLINE inline uint32_t Pop(char*, uint32_t, uint64_t) {
  return kNoSlot;
}
ABSL_ATTRIBUTE_ALWAYS_INLINE inline bool TryPop(char*, uint32_t, uint64_t,
                                                uint32_t*) {
  return false;
}
ABSL_ATTRIBUTE_ALWAYS_INLINE inline bool Push(char*, uint32_t, uint64_t,
                                              const void*, uint32_t, uint32_t) {
  return false;
}
ABSL_ATTRIBUTE_ALWAYS_INLINE inline uint32_t Lend(char*, uint32_t, uint64_t,
                                                  uint32_t) {
  return 0;
}
ABSL_ATTRIBUTE_ALWAYS_INLINE inline uint32_t Reclaim(char*, uint32_t,
                                                     uint64_t) {
  return 0;
}
ABSL_ATTRIBUTE_ALWAYS_INLINE inline uint32_t PopBatch(char*, uint32_t, uint64_t,
                                                      uint32_t*, uint32_t) {
  return 0;
}
ABSL_ATTRIBUTE_ALWAYS_INLINE inline uint32_t PushBatch(char*, uint32_t,
                                                       uint64_t, const void*,
                                                       const uint32_t*,
                                                       uint32_t) {
  return 0;
}
ABSL_ATTRIBUTE_ALWAYS_INLINE inline uint32_t CurrentIndex(uint64_t) {
  return 0;
}
ABSL_ATTRIBUTE_ALWAYS_INLINE inline uint32_t LendPop(char*, uint32_t, uint64_t,
                                                     uint32_t, uint32_t* fell) {
  *fell = 0;
  return kNoSlot;
}
ABSL_ATTRIBUTE_ALWAYS_INLINE inline bool ReclaimPush(char*, uint32_t, uint64_t,
                                                     const void*, uint32_t,
                                                     uint32_t* rose) {
  *rose = 0;
  return false;
}

#endif

}  // namespace bufpool::internal::rseq

#endif  // BUFPOOL_INTERNAL_RSEQ_H_

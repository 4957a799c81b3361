// A by-hand check of the AArch64 restartable sequences (tools/
// check_aarch64_rseq builds and runs it under qemu-user). qemu does not
// implement rseq, so glibc registers no area there: the check runs the
// sequences' failure path for an unregistered thread, then writes a CPU id
// into the area itself and runs their bodies straight through (nothing can
// restart them under qemu, so the restarts are not exercised), and checks
// that each leaves rseq_cs cleared and the descriptors and signature the
// kernel would read.
#include <cstdint>
#include <cstdio>
#include <cstring>

#include "bufpool/internal/rseq.h"

#if !BUFPOOL_HAVE_RSEQ
#error "build with -DBUFPOOL_AARCH64_RSEQ for AArch64"
#endif

namespace rs = bufpool::internal::rseq;

// The linker's bounds of the section the sequences' descriptors live in.
extern "C" const uint64_t __start___rseq_cs[];
extern "C" const uint64_t __stop___rseq_cs[];

namespace {

int failures = 0;

void Expect(bool ok, const char* what) {
  std::printf("%s: %s\n", ok ? "ok  " : "FAIL", what);
  if (!ok) ++failures;
}

// One cache's kCacheStride bytes (rseq.h): the header's line, then slots.
struct alignas(64) Cache {
  uint32_t count = 0;
  uint32_t pad[15] = {};
  uint32_t slots[(rs::kCacheStride - rs::kSlotsOffset) / 4] = {};
};
static_assert(sizeof(Cache) == rs::kCacheStride);

// The descriptors, as the kernel reads them: the linker's bounds of the
// __rseq_cs section that the sequences put them in.
void CheckDescriptors() {
  int descriptors = 0;
  for (const uint64_t* d = __start___rseq_cs; d + 4 <= __stop___rseq_cs;
       d += 4) {
    if (d[1] == 0) continue;  // .balign padding
    ++descriptors;
    const uint64_t start = d[1], post = d[2], abort_ip = d[3];
    uint32_t sig;
    std::memcpy(&sig, reinterpret_cast<const void*>(abort_ip - 4), 4);
    Expect(reinterpret_cast<uintptr_t>(d) % 32 == 0 && d[0] == 0,
           "descriptor: aligned, version 0");
    // Each is the index prologue and a few instructions (72 bytes here).
    Expect(post > 0 && post < 128, "descriptor: a short section");
    Expect(abort_ip < start || abort_ip >= start + post,
           "descriptor: abort outside the section");
    Expect(sig == 0xd428bc00u, "RSEQ_SIG before the abort label");
  }
  Expect(descriptors > 0, "descriptors found in __rseq_cs");
}

}  // namespace

int main() {
  char* area = static_cast<char*>(__builtin_thread_pointer()) + __rseq_offset;
  int32_t cpu_id;
  std::memcpy(&cpu_id, area + 4, 4);
  std::printf("__rseq_size %u, cpu_id %d\n", __rseq_size, cpu_id);
  Cache caches[2];
  char* base = reinterpret_cast<char*>(caches);
  // Release limits (rseq.h, kOneWaiter): room for 8, for 2, and room for 8
  // with one waiter.
  const int64_t room8 = 8, room2 = 2, waiting = 8 - rs::kOneWaiter;
  if (cpu_id < 0) {
    Expect(rs::Pop(base, 2, rs::kCpuIdField) == rs::kNoSlot,
           "unregistered: Pop fails");
    Expect(!rs::Push(base, 2, rs::kMmCidField, &room8, 8, 5),
           "unregistered: Push on mm_cid 0 fails");
    Expect(caches[0].count == 0, "unregistered: no store");
  }
  // Stand in for the kernel: cpu_id 1, mm_cid 0.
  const uint32_t one = 1, zero = 0;
  std::memcpy(area + 4, &one, 4);
  std::memcpy(area + rs::kMmCidField, &zero, 4);
  Expect(rs::Push(base, 2, rs::kCpuIdField, &room8, 8, 7), "Push by cpu_id");
  Expect(caches[1].count == 1 && caches[1].slots[0] == 7,
         "cpu_id 1 indexes cache 1");
  Expect(rs::Push(base, 2, rs::kMmCidField, &room8, 8, 9) &&
             rs::Push(base, 2, rs::kMmCidField, &room8, 8, 10),
         "Push by mm_cid");
  Expect(caches[0].count == 2 && caches[0].slots[1] == 10,
         "mm_cid 0 indexes cache 0");
  Expect(!rs::Push(base, 2, rs::kMmCidField, &waiting, 8, 11),
         "Push fails while someone waits");
  Expect(!rs::Push(base, 2, rs::kMmCidField, &room2, 8, 11),
         "Push fails when full");
  Expect(rs::Pop(base, 2, rs::kMmCidField) == 10 &&
             rs::Pop(base, 2, rs::kMmCidField) == 9 &&
             rs::Pop(base, 2, rs::kMmCidField) == rs::kNoSlot,
         "Pop is LIFO and fails when empty");
  // The lend window (count - floor < lend) and the slow paths' fused
  // forms: cache 0 is empty, its floor 0.
  Expect(rs::Push(base, 2, rs::kMmCidField, &room8, 2, 20) &&
             rs::Push(base, 2, rs::kMmCidField, &room8, 2, 21) &&
             !rs::Push(base, 2, rs::kMmCidField, &room8, 2, 22),
         "Push stops when the cache lends its allowance");
  uint32_t rose = 0;
  Expect(rs::ReclaimPush(base, 2, rs::kMmCidField, &room8, 22, &rose) &&
             rose == 2 && caches[0].count == 3 && caches[0].pad[0] == 2,
         "ReclaimPush takes back what was lent, then pushes");
  uint32_t fell = 0;
  Expect(rs::LendPop(base, 2, rs::kMmCidField, 8, &fell) == 22 &&
             rs::Pop(base, 2, rs::kMmCidField) == 21 &&
             rs::Pop(base, 2, rs::kMmCidField) == 20 &&
             rs::Pop(base, 2, rs::kMmCidField) == rs::kNoSlot,
         "LendPop lends down to the floor and pops");
  Expect(fell == 2 && caches[0].pad[0] == 0, "LendPop lowered the floor");
  caches[1].count |= rs::kStopped;
  Expect(rs::Pop(base, 2, rs::kCpuIdField) == rs::kNoSlot &&
             !rs::Push(base, 2, rs::kCpuIdField, &room8, 8, 3),
         "a stopped cache fails both");
  caches[1].count &= ~rs::kStopped;
  Expect(rs::Pop(base, 1, rs::kCpuIdField) == rs::kNoSlot,
         "an index at or above ncpu fails");
  Expect(rs::Pop(base, 2, rs::kCpuIdField) == 7, "Pop by cpu_id");
  // Every sequence clears rseq_cs on its way out (a plugin that ran one
  // can be unloaded).
  uint64_t cs;
  std::memcpy(&cs, area + 8, 8);
  Expect(cs == 0, "rseq_cs cleared after a sequence");
  CheckDescriptors();
  std::printf("%d failure(s)\n", failures);
  return failures == 0 ? 0 : 1;
}

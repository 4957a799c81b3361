// libbufpool: the option types the pool's layers share.
//
// Small on purpose: the arena (the pool's private lower layer) includes it
// for HugePages without seeing the pool's API. bufpool/buffer_pool.h
// includes it, so users never need to name it.
#ifndef BUFPOOL_OPTIONS_H_
#define BUFPOOL_OPTIONS_H_

namespace bufpool {

// How the region is mapped (PoolOptions::huge_pages).
enum class HugePages {
  kNever,    // 4 KiB pages only
  kTry,      // advise transparent huge pages (2 MiB) where the kernel allows
  kRequire,  // MAP_HUGETLB from the reserved pool, or Create() fails
};

}  // namespace bufpool

#endif  // BUFPOOL_OPTIONS_H_

// Symbol visibility for libbufpool.
//
// The library is built with -fvisibility=hidden; everything a user may call is
// marked BUFPOOL_EXPORT so that a shared build exports exactly the public API.
#ifndef BUFPOOL_EXPORT_H_
#define BUFPOOL_EXPORT_H_

#if defined(__GNUC__) || defined(__clang__)
#define BUFPOOL_EXPORT __attribute__((visibility("default")))
#else
#define BUFPOOL_EXPORT
#endif

#endif  // BUFPOOL_EXPORT_H_

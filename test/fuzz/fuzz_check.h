// Shared by the fuzz targets (test/fuzz): a failed property prints one line
// naming the target and what disagreed, then aborts, which libFuzzer reports
// as a crash and saves the input as crash-<sha1>.
#ifndef BUFPOOL_TEST_FUZZ_FUZZ_CHECK_H_
#define BUFPOOL_TEST_FUZZ_FUZZ_CHECK_H_

#include <cstdio>
#include <cstdlib>

// FUZZ_CHECK(cond, "format", args...): the message says what was expected.
#define FUZZ_CHECK(cond, ...)                                          \
  do {                                                                 \
    if (!(cond)) {                                                     \
      std::fprintf(stderr, "%s:%d: FUZZ_CHECK(%s) failed: ", __FILE__, \
                   __LINE__, #cond);                                   \
      std::fprintf(stderr, __VA_ARGS__);                               \
      std::fputc('\n', stderr);                                        \
      std::abort();                                                    \
    }                                                                  \
  } while (0)

#endif  // BUFPOOL_TEST_FUZZ_FUZZ_CHECK_H_

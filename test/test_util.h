// Helpers the tests share: one definition each, instead of a copy per test.
#ifndef BUFPOOL_TEST_TEST_UTIL_H_
#define BUFPOOL_TEST_TEST_UTIL_H_

#include <fcntl.h>

#include <cstddef>
#include <cstdint>
#include <random>
#include <string>

#include "gtest/gtest.h"

namespace bufpool::testing_util {

// `n` bytes from a fixed seed: the same bytes on every run.
inline std::string RandomBytes(size_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::string s(n, '\0');
  for (char& c : s) c = static_cast<char>(rng());
  return s;
}

// Sets O_NONBLOCK on `fd`; a failure fails the calling test (call it
// through ASSERT_NO_FATAL_FAILURE where the test must stop).
inline void SetNonBlocking(int fd) {
  ASSERT_EQ(::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) | O_NONBLOCK), 0);
}

}  // namespace bufpool::testing_util

#endif  // BUFPOOL_TEST_TEST_UTIL_H_

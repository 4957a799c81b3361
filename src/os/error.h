// The one place errno becomes an absl::Status.
#ifndef BUFPOOL_SRC_OS_ERROR_H_
#define BUFPOOL_SRC_OS_ERROR_H_

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace bufpool::os {

// "<context>: <strerror(err)>", with the status code that fits `err`
// (ENOENT -> NotFound, ENOSPC/ENOMEM -> ResourceExhausted, ...).
absl::Status PosixError(absl::string_view context, int err);

}  // namespace bufpool::os

#endif  // BUFPOOL_SRC_OS_ERROR_H_

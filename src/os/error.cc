#include "os/error.h"

#include <string.h>

#include "absl/strings/str_cat.h"

namespace bufpool::os {

// The message through glibc's strerror_r (thread-safe, no shared table)
// rather than absl::ErrnoToStatus, whose lazily built table of messages
// ThreadSanitizer reports as racing when two threads fail at once (Debian's
// Abseil is not instrumented, so its one-time initialisation is invisible).
absl::Status PosixError(absl::string_view context, int err) {
  char buf[128];
  const char* message = strerror_r(err, buf, sizeof buf);  // GNU: char*
  return absl::Status(absl::ErrnoToStatusCode(err),
                      absl::StrCat(context, ": ", message));
}

}  // namespace bufpool::os

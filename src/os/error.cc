#include "os/error.h"

namespace bufpool::os {

absl::Status PosixError(absl::string_view context, int err) {
  return absl::ErrnoToStatus(err, context);
}

}  // namespace bufpool::os

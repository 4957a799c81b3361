// InitServerRing: an io_uring set up for a single-threaded server, falling
// back flag by flag on kernels that lack the newer setup flags.
#include <liburing.h>

#include <algorithm>
#include <cerrno>
#include <string>

#include "absl/strings/str_cat.h"
#include "bufpool/uring.h"
#include "os/error.h"
#include "os/uring.h"

// Debian's liburing 2.3 headers may predate some of these; the values are
// the kernel's (its uapi header linux/io_uring.h).
#ifndef IORING_SETUP_SUBMIT_ALL
#define IORING_SETUP_SUBMIT_ALL (1U << 7)
#endif
#ifndef IORING_SETUP_COOP_TASKRUN
#define IORING_SETUP_COOP_TASKRUN (1U << 8)
#endif
#ifndef IORING_SETUP_SINGLE_ISSUER
#define IORING_SETUP_SINGLE_ISSUER (1U << 12)
#endif
#ifndef IORING_SETUP_DEFER_TASKRUN
#define IORING_SETUP_DEFER_TASKRUN (1U << 13)
#endif

namespace bufpool {
namespace {

struct NamedFlag {
  unsigned flag;
  const char* name;
};

// Newest first: the order in which an -EINVAL drops them. DEFER_TASKRUN
// needs SINGLE_ISSUER, so it goes first.
constexpr NamedFlag kFlags[] = {
    {IORING_SETUP_DEFER_TASKRUN, "DEFER_TASKRUN"},
    {IORING_SETUP_SINGLE_ISSUER, "SINGLE_ISSUER"},
    {IORING_SETUP_COOP_TASKRUN, "COOP_TASKRUN"},
    {IORING_SETUP_SUBMIT_ALL, "SUBMIT_ALL"},
    {IORING_SETUP_R_DISABLED, "R_DISABLED"},
    {IORING_SETUP_CQSIZE, "CQSIZE"},
};

// The names of `flags`, in the order a reader expects (oldest last), joined
// by '|'.
std::string FlagNames(unsigned flags) {
  std::string out;
  for (const NamedFlag& f : kFlags) {
    if ((flags & f.flag) == 0) continue;
    if (!out.empty()) out += '|';
    out += f.name;
  }
  return out.empty() ? "none" : out;
}

}  // namespace

std::string ServerRingSetup::Describe() const {
  std::string out = FlagNames(flags);
  if (refused != 0)
    absl::StrAppend(&out, " (refused: ", FlagNames(refused), ")");
  return out;
}

absl::StatusOr<ServerRingSetup> InitServerRing(
    io_uring* ring, const ServerRingOptions& options) {
  // The kernel's limits (IORING_MAX_ENTRIES, IORING_MAX_CQ_ENTRIES): past
  // them it says EINVAL, which would read as a refused flag.
  constexpr unsigned kMaxEntries = 32768, kMaxCqEntries = 65536;
  if (options.entries == 0 || options.entries > kMaxEntries) {
    return absl::InvalidArgumentError(
        absl::StrCat("InitServerRing: entries ", options.entries,
                     " must be 1 to ", kMaxEntries));
  }
  const unsigned cq_entries =
      options.cq_entries != 0 ? options.cq_entries
                              : std::min(8 * options.entries, kMaxCqEntries);
  if (cq_entries < options.entries || cq_entries > kMaxCqEntries) {
    return absl::InvalidArgumentError(absl::StrCat(
        "InitServerRing: cq_entries ", options.cq_entries, " must be ",
        options.entries, " (entries) to ", kMaxCqEntries));
  }
  unsigned wanted = IORING_SETUP_SINGLE_ISSUER | IORING_SETUP_DEFER_TASKRUN |
                    IORING_SETUP_COOP_TASKRUN | IORING_SETUP_SUBMIT_ALL |
                    IORING_SETUP_CQSIZE;
  if (options.start_disabled) wanted |= IORING_SETUP_R_DISABLED;

  ServerRingSetup setup;
  setup.flags = wanted;
  size_t next_to_drop = 0;
  for (;;) {
    io_uring_params params{};
    params.flags = setup.flags;
    if ((setup.flags & IORING_SETUP_CQSIZE) != 0)
      params.cq_entries = cq_entries;
    const int rc =
        os::UringSys().uring_queue_init_params(options.entries, ring, &params);
    if (rc == 0) return setup;
    // The kernel says EINVAL for a flag it does not know: drop the newest
    // one still asked for and try again.
    while (rc == -EINVAL && next_to_drop < std::size(kFlags) &&
           (setup.flags & kFlags[next_to_drop].flag) == 0) {
      ++next_to_drop;
    }
    if (rc != -EINVAL || next_to_drop == std::size(kFlags)) {
      return os::PosixError(
          absl::StrCat("io_uring_queue_init_params(entries ", options.entries,
                       ", flags ", FlagNames(setup.flags), ")"),
          -rc);
    }
    setup.flags &= ~kFlags[next_to_drop].flag;
    setup.refused |= kFlags[next_to_drop].flag;
  }
}

absl::Status EnableServerRing(io_uring* ring) {
  if ((ring->flags & IORING_SETUP_R_DISABLED) == 0) return absl::OkStatus();
  if (const int rc = os::UringSys().uring_enable_rings(ring->ring_fd); rc < 0) {
    return os::PosixError("io_uring_register(IORING_REGISTER_ENABLE_RINGS)",
                          -rc);
  }
  return absl::OkStatus();
}

}  // namespace bufpool

// WriteMetrics(ring): bufpool/metrics.h.
#include <algorithm>
#include <string>

#include "absl/strings/str_cat.h"
#include "bufpool/metrics.h"
#include "bufpool/uring.h"
#include "pool/metrics_writer.h"

namespace bufpool {
void WriteMetrics(const ProvidedBufferRing& ring, std::string* out,
                  const MetricsOptions& options) {
  const std::string labels = internal::MetricsLabels(options.name);
  const std::string group = absl::StrCat("group=\"", ring.group_id(), "\"");
  const double target = static_cast<double>(ring.target());
  const double lent = static_cast<double>(ring.available());
  const double used = target == 0 ? 0 : std::max(0.0, 1 - lent / target);
  internal::MetricsFamily(out, "bufpool_ring_lent_buffers", "gauge",
                          "Buffers in the provided-buffer ring now.", labels,
                          group, absl::StrCat(ring.available()));
  internal::MetricsFamily(out, "bufpool_ring_target_buffers", "gauge",
                          "Buffers the ring keeps lent (grows when it runs "
                          "low).",
                          labels, group, absl::StrCat(ring.target()));
  internal::MetricsFamily(out, "bufpool_ring_max_buffers", "gauge",
                          "The most buffers the ring may lend.", labels, group,
                          absl::StrCat(ring.max_buffers()));
  internal::MetricsFamily(
      out, "bufpool_ring_utilization_ratio", "gauge",
      "Share of the ring's target the kernel has consumed and not given back.",
      labels, group, absl::StrCat(used));
  internal::MetricsFamily(out, "bufpool_ring_enobufs_total", "counter",
                          "Receives that ended because the ring was empty.",
                          labels, group, absl::StrCat(ring.enobufs()));
  internal::MetricsFamily(
      out, "bufpool_ring_copied_total", "counter",
      "Completions copied into a chain (their buffers lent again at once).",
      labels, group, absl::StrCat(ring.copied()));
}

}  // namespace bufpool

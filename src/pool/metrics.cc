// WriteMetrics(pool): bufpool/metrics.h.
#include "bufpool/metrics.h"

#include <string>

#include "absl/strings/str_cat.h"

namespace bufpool {
namespace internal {

// `{pool="name"` (no closing brace), or "" for no name; shared with the
// ring's metrics (src/uring/ring_metrics.cc).
std::string MetricsLabels(absl::string_view name) {
  if (name.empty()) return "";
  std::string clean(name);
  for (char& c : clean) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
                    (c >= '0' && c <= '9') || c == '_' || c == '-' ||
                    c == '.' || c == ':';
    if (!ok) c = '_';
  }
  return absl::StrCat("{pool=\"", clean, "\"");
}

// One family of one sample: HELP, TYPE, then `name{labels} value`.
// `labels` is MetricsLabels()'s form; `extra` one more label, or "".
void MetricsFamily(std::string* out, absl::string_view family,
                   absl::string_view type, absl::string_view help,
                   absl::string_view labels, absl::string_view extra,
                   absl::string_view value) {
  absl::StrAppend(out, "# HELP ", family, " ", help, "\n# TYPE ", family, " ",
                  type, "\n");
  absl::StrAppend(out, family);
  if (!labels.empty() || !extra.empty()) {
    absl::StrAppend(out, labels.empty() ? "{" : labels,
                    !labels.empty() && !extra.empty() ? "," : "", extra, "}");
  }
  absl::StrAppend(out, " ", value, "\n");
}

}  // namespace internal

void WriteMetrics(const BufferPool& pool, std::string* out,
                  const MetricsOptions& options) {
  const PoolStats st = pool.Stats();
  const std::string labels = internal::MetricsLabels(options.name);
  // A snapshot of counters read one by one: never report a negative free.
  // Free: backed and in the depot (an elastic pool's unbacked reserve is
  // not free until it grows).
  const size_t free_buffers = st.in_use + st.cached < st.committed
                                  ? st.committed - st.in_use - st.cached
                                  : 0;
  absl::StrAppend(out,
                  "# HELP bufpool_pool_buffers Buffers of the pool by state: "
                  "held by users, idle in the per-CPU caches, free in the "
                  "depot.\n# TYPE bufpool_pool_buffers gauge\n");
  const std::string sep = labels.empty() ? "{" : labels + ",";
  absl::StrAppend(out, "bufpool_pool_buffers", sep, "state=\"in_use\"} ",
                  st.in_use, "\n");
  absl::StrAppend(out, "bufpool_pool_buffers", sep, "state=\"cached\"} ",
                  st.cached, "\n");
  absl::StrAppend(out, "bufpool_pool_buffers", sep, "state=\"free\"} ",
                  free_buffers, "\n");
  internal::MetricsFamily(out, "bufpool_pool_capacity_buffers", "gauge",
                          "Buffers the pool holds in all.", labels, "",
                          absl::StrCat(st.capacity));
  internal::MetricsFamily(out, "bufpool_pool_buffer_size_bytes", "gauge",
                          "Bytes of one buffer.", labels, "",
                          absl::StrCat(pool.buffer_size()));
  internal::MetricsFamily(
      out, "bufpool_pool_high_water_buffers", "gauge",
      "Never below the most buffers in use at once (see PoolStats).", labels,
      "", absl::StrCat(st.high_water));
  internal::MetricsFamily(
      out, "bufpool_pool_acquire_failures_total", "counter",
      "TryAcquire and zero-timeout Acquire calls that got nothing, and bulk "
      "calls that got fewer than asked.",
      labels, "", absl::StrCat(st.acquire_failures));
  internal::MetricsFamily(out, "bufpool_pool_acquire_timeouts_total", "counter",
                          "Acquire calls with a positive timeout that timed "
                          "out.",
                          labels, "", absl::StrCat(st.acquire_timeouts));
  // Elastic pools (max_buffer_count); a fixed pool: committed = capacity.
  internal::MetricsFamily(out, "bufpool_pool_committed_buffers", "gauge",
                          "Buffers backed by memory now (an elastic pool "
                          "grows toward its capacity and trims back).",
                          labels, "", absl::StrCat(st.committed));
  internal::MetricsFamily(out, "bufpool_pool_grows_total", "counter",
                          "Growth steps an elastic pool took.", labels, "",
                          absl::StrCat(st.grows));
  internal::MetricsFamily(out, "bufpool_pool_grow_failures_total", "counter",
                          "Growth steps the system refused (mmap, madvise, "
                          "mlock).",
                          labels, "", absl::StrCat(st.grow_failures));
  internal::MetricsFamily(out, "bufpool_pool_trims_total", "counter",
                          "Trims that gave memory back to the kernel.", labels,
                          "", absl::StrCat(st.trims));
}

}  // namespace bufpool

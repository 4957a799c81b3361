// The exposition-format writing that every WriteMetrics() overload shares
// (the pool's in src/pool/metrics.cc, the admission queue's in
// src/pool/admission_metrics.cc, the ring's in src/uring/ring_metrics.cc).
// Plain functions on strings: no state, safe from any thread.
#ifndef BUFPOOL_SRC_POOL_METRICS_WRITER_H_
#define BUFPOOL_SRC_POOL_METRICS_WRITER_H_

#include <string>

#include "absl/strings/string_view.h"

namespace bufpool {
namespace internal {

// `{pool="name"` (no closing brace), or "" for no name.
std::string MetricsLabels(absl::string_view name);

// A label value as the exposition format quotes it: \\, \" and \n escaped.
std::string MetricsLabelValue(absl::string_view v);

// One family of one sample: HELP, TYPE, then `name{labels} value` into
// `*out`. `labels` is MetricsLabels()'s form; `extra` one more label, or "".
void MetricsFamily(std::string* out, absl::string_view family,
                   absl::string_view type, absl::string_view help,
                   absl::string_view labels, absl::string_view extra,
                   absl::string_view value);

}  // namespace internal
}  // namespace bufpool

#endif  // BUFPOOL_SRC_POOL_METRICS_WRITER_H_

// libbufpool: metrics in the Prometheus text exposition format (0.0.4).
//
//   std::string body;
//   bufpool::WriteMetrics(*pool, &body, {.name = "rx"});
//   bufpool::WriteMetrics(*ring, &body, {.name = "rx"});  // on its thread
//   // serve `body` as text/plain; version=0.0.4
//
// Families (every one with HELP and TYPE lines; `pool` and `group` labels):
//   bufpool_pool_buffers{state="in_use|cached|free"}   gauge
//   bufpool_pool_capacity_buffers, bufpool_pool_buffer_size_bytes,
//   bufpool_pool_high_water_buffers                    gauges
//   bufpool_pool_acquire_failures_total,
//   bufpool_pool_acquire_timeouts_total                counters
//   bufpool_pool_committed_buffers    gauge: buffers backed by memory now
//                                     (an elastic pool grows and trims it)
//   bufpool_pool_grows_total, bufpool_pool_grow_failures_total,
//   bufpool_pool_trims_total                           counters
//   bufpool_pool_processes            gauge: processes using a shared pool
//                                     (1 for a private one)
//   bufpool_pool_reclaimed_total      counter: buffers given back from
//                                     processes that died (shared pools)
//       a shared pool's samples also carry process="<pid>"
//   bufpool_budget_pinned_bytes, bufpool_budget_high_water_bytes,
//   bufpool_budget_max_bytes, bufpool_budget_reserved_bytes   gauges
//   bufpool_budget_refusals_total                      counter
//       one sample per live budget of the pool (bufpool/budget.h) of no
//       group, labelled budget="<its name>" (give budgets distinct names);
//       the families' HELP and TYPE lines are written even when the pool
//       has none
//   bufpool_budget_group_budgets, bufpool_budget_group_pinned_bytes,
//   bufpool_budget_group_max_bytes, bufpool_budget_group_reserved_bytes,
//   bufpool_budget_group_refusals                      gauges
//       one sample per BudgetOptions::group, labelled budget_group="<it>":
//       the count and sums of its live budgets, so 10,000 connections in
//       one group are 5 series, not 50,000
//   bufpool_ring_lent_buffers, bufpool_ring_target_buffers,
//   bufpool_ring_max_buffers                           gauges
//   bufpool_ring_utilization_ratio    share of the ring's target the kernel
//                                     has consumed and not given back (0-1)
//   bufpool_ring_enobufs_total, bufpool_ring_copied_total   counters
// Values are PoolStats, BudgetStats and the ring's accessors, read once
// per call.
//
// One exposition holds each family once: write one pool and its rings per
// body (the families of several pools would repeat their HELP lines; give
// each pool its own body or endpoint).
//
// Thread safety: the pool's metrics, its budgets' included, may be written
// from any thread (they are BufferPool::Stats() and BufferBudget::Stats());
// a ring's only on the ring's thread, as every ring call.
#ifndef BUFPOOL_METRICS_H_
#define BUFPOOL_METRICS_H_

#include <string>

#include "absl/strings/string_view.h"
#include "bufpool/buffer_pool.h"
#include "bufpool/export.h"

namespace bufpool {

class ProvidedBufferRing;

struct MetricsOptions {
  // The `pool` label's value on every sample ("" leaves the label out).
  // Letters, digits, '_', '-', '.' and ':'; others are written as '_'.
  absl::string_view name = "";
};

// Appends the pool's families to *out.
BUFPOOL_EXPORT void WriteMetrics(const BufferPool& pool, std::string* out,
                                 const MetricsOptions& options = {});
// Appends the ring's families to *out (labels: pool, group).
BUFPOOL_EXPORT void WriteMetrics(const ProvidedBufferRing& ring,
                                 std::string* out,
                                 const MetricsOptions& options = {});

}  // namespace bufpool

#endif  // BUFPOOL_METRICS_H_

// WriteMetrics(pool): bufpool/metrics.h.
#include "bufpool/metrics.h"

#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/types/span.h"
#include "bufpool/budget.h"
#include "pool/metrics_writer.h"
#include "pool/pool_internal.h"

namespace bufpool {
namespace internal {

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

std::string MetricsLabelValue(absl::string_view v) {
  std::string out;
  out.reserve(v.size());
  for (char c : v) {
    if (c == '\\' || c == '"') {
      out += '\\';
      out += c;
    } else if (c == '\n') {
      out += "\\n";
    } else {
      out += c;
    }
  }
  return out;
}

}  // namespace internal

namespace {

// One budget's sample, or one group's (its budgets' sums).
struct BudgetRow {
  std::string label;
  BudgetStats st;
  size_t max_bytes, reserved_bytes;
  size_t members;
};

struct BudgetFamily {
  const char* name;
  const char* type;
  const char* help;
  double (*value)(const BudgetRow&);
};

constexpr BudgetFamily kBudgetFamilies[] = {
    {"bufpool_budget_pinned_bytes", "gauge",
     "Pool bytes the budget's chains keep out now (each buffer once; "
     "packed partials by their bytes).",
     [](const BudgetRow& r) { return static_cast<double>(r.st.pinned_bytes); }},
    {"bufpool_budget_high_water_bytes", "gauge",
     "The most bytes the budget's chains have kept out at once.",
     [](const BudgetRow& r) {
       return static_cast<double>(r.st.high_water_bytes);
     }},
    {"bufpool_budget_max_bytes", "gauge", "The budget's limit (whole buffers).",
     [](const BudgetRow& r) { return static_cast<double>(r.max_bytes); }},
    {"bufpool_budget_reserved_bytes", "gauge",
     "Bytes of the pool reserved for the budget.",
     [](const BudgetRow& r) { return static_cast<double>(r.reserved_bytes); }},
    {"bufpool_budget_refusals_total", "counter",
     "Receives and appends refused (or reported) for passing the limit.",
     [](const BudgetRow& r) { return static_cast<double>(r.st.refusals); }},
};

constexpr BudgetFamily kBudgetGroupFamilies[] = {
    {"bufpool_budget_group_budgets", "gauge", "Live budgets of the group.",
     [](const BudgetRow& r) { return static_cast<double>(r.members); }},
    {"bufpool_budget_group_pinned_bytes", "gauge",
     "Pool bytes the group's budgets keep out now, summed.",
     [](const BudgetRow& r) { return static_cast<double>(r.st.pinned_bytes); }},
    {"bufpool_budget_group_max_bytes", "gauge",
     "The group's budgets' limits, summed.",
     [](const BudgetRow& r) { return static_cast<double>(r.max_bytes); }},
    {"bufpool_budget_group_reserved_bytes", "gauge",
     "Bytes of the pool reserved for the group's budgets, summed.",
     [](const BudgetRow& r) { return static_cast<double>(r.reserved_bytes); }},
    {"bufpool_budget_group_refusals", "gauge",
     "Refusals of the group's live budgets, summed (a gauge: a budget's "
     "refusals leave the sum with it).",
     [](const BudgetRow& r) { return static_cast<double>(r.st.refusals); }},
};

// Each family's HELP and TYPE, then a sample per row.
template <typename Rows>
void WriteBudgetFamilies(absl::Span<const BudgetFamily> families,
                         const Rows& rows, std::string* out) {
  for (const BudgetFamily& f : families) {
    absl::StrAppend(out, "# HELP ", f.name, " ", f.help, "\n# TYPE ", f.name,
                    " ", f.type, "\n");
    for (const BudgetRow& r : rows) {
      absl::StrAppend(out, f.name, r.label, " ", f.value(r), "\n");
    }
  }
}

// The budgets' families: one sample per budget of no group (none when the
// pool has none), from one Stats() per budget; then the group families,
// one sample per group, the sums of its budgets' (so the series a scraper
// stores grow with the groups, not with the connections).
void WriteBudgetMetrics(const BufferPool& pool, absl::string_view labels,
                        std::string* out) {
  std::vector<BudgetRow> rows;
  std::map<std::string, BudgetRow> by_group;  // sorted by name
  const std::string open = labels.empty() ? "{" : absl::StrCat(labels, ",");
  internal::ForEachBudget(pool, [&](const BufferBudget& b) {
    const BudgetStats st = b.Stats();
    if (b.group().empty()) {
      rows.push_back(
          {absl::StrCat(open, "budget=\"",
                        internal::MetricsLabelValue(b.name()), "\"}"),
           st, b.max_bytes(), b.reserved_bytes(), 1});
      return;
    }
    auto [it, fresh] = by_group.try_emplace(b.group());
    BudgetRow& g = it->second;
    if (fresh) {
      g.label = absl::StrCat(open, "budget_group=\"",
                             internal::MetricsLabelValue(b.group()), "\"}");
      g.st = {};
      g.max_bytes = g.reserved_bytes = g.members = 0;
    }
    g.st.pinned_bytes += st.pinned_bytes;
    g.st.refusals += st.refusals;
    g.max_bytes += b.max_bytes();
    g.reserved_bytes += b.reserved_bytes();
    ++g.members;
  });
  WriteBudgetFamilies(kBudgetFamilies, rows, out);
  std::vector<BudgetRow> groups;
  groups.reserve(by_group.size());
  for (auto& [name, g] : by_group) groups.push_back(std::move(g));
  WriteBudgetFamilies(kBudgetGroupFamilies, groups, out);
}

}  // namespace

void WriteMetrics(const BufferPool& pool, std::string* out,
                  const MetricsOptions& options) {
  const PoolStats st = pool.Stats();
  std::string labels = internal::MetricsLabels(options.name);
  // A shared pool's samples are this process's: the pid tells the
  // processes' series apart.
  const ProcessShare* const x = PoolAccess::S(pool).xproc.get();
  if (x != nullptr) {
    absl::StrAppend(&labels, labels.empty() ? "{" : ",", "process=\"", x->pid,
                    "\"");
  }
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
  // Shared pools (PoolOptions::shared); a private pool: 1 and 0.
  internal::MetricsFamily(out, "bufpool_pool_processes", "gauge",
                          "Processes joined to the pool (dead ones not yet "
                          "reclaimed count).",
                          labels, "", absl::StrCat(st.processes));
  internal::MetricsFamily(out, "bufpool_pool_reclaimed_total", "counter",
                          "Buffers given back from processes that died.",
                          labels, "", absl::StrCat(st.reclaimed));
  WriteBudgetMetrics(pool, labels, out);
}

}  // namespace bufpool

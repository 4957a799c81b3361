// WriteMetrics (bufpool/metrics.h): the text parsed by Debian's
// python3-prometheus-client, every family present with the values Stats()
// and the ring report.
#include "bufpool/metrics.h"

#include <liburing.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "bufpool/budget.h"
#include "bufpool/chain.h"
#include "bufpool/uring.h"
#include "gtest/gtest.h"

namespace bufpool {
namespace {

// Runs Debian's python3 (not a pyenv one on PATH, which lacks the
// package) on the text: prints "family|labels|value" per sample, or
// fails the test when the parser refuses the text (or is missing).
std::string ParseWithPrometheusClient(const std::string& text) {
  char path[] = "/tmp/bufpool_metrics_XXXXXX";
  const int fd = mkstemp(path);
  EXPECT_GE(fd, 0);
  if (fd < 0) return "";
  EXPECT_EQ(write(fd, text.data(), text.size()),
            static_cast<ssize_t>(text.size()));
  close(fd);
  const std::string cmd = std::string(
                              "/usr/bin/python3 -c '"
                              "import sys\n"
                              "from prometheus_client.parser import "
                              "text_string_to_metric_families as f\n"
                              "for fam in f(open(sys.argv[1]).read()):\n"
                              "  for s in fam.samples:\n"
                              "    l = \",\".join(k + \"=\" + v for k, v in "
                              "sorted(s.labels.items()))\n"
                              "    print(fam.type + \"|\" + s.name + \"|\" + l "
                              "+ \"|\" + repr(s.value))\n"
                              "' ") +
                          path + " 2>&1";
  std::string out;
  FILE* p = popen(cmd.c_str(), "r");
  EXPECT_NE(p, nullptr);
  if (p == nullptr) return "";
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof(buf), p)) > 0) out.append(buf, n);
  EXPECT_EQ(pclose(p), 0) << out;
  unlink(path);
  return out;
}

bool Has(const std::string& parsed, const std::string& line) {
  return parsed.find(line + "\n") != std::string::npos;
}

TEST(MetricsTest, PoolFamiliesParseAndMatchStats) {
  auto pool = BufferPool::Create({.buffer_count = 64, .cache_size = 0});
  ASSERT_TRUE(pool.ok()) << pool.status();
  std::vector<Buffer> held;
  for (int i = 0; i < 5; ++i) held.push_back((*pool)->TryAcquire());
  std::vector<Buffer> all;
  while (Buffer b = (*pool)->TryAcquire()) all.push_back(std::move(b));
  EXPECT_FALSE((*pool)->TryAcquire());  // one failure counted
  all.clear();
  std::string text;
  WriteMetrics(**pool, &text, {.name = "rx pool"});
  const PoolStats st = (*pool)->Stats();
  const std::string parsed = ParseWithPrometheusClient(text);
  EXPECT_TRUE(
      Has(parsed, "gauge|bufpool_pool_buffers|pool=rx_pool,state=in_use|5.0"))
      << parsed;
  EXPECT_TRUE(
      Has(parsed, "gauge|bufpool_pool_buffers|pool=rx_pool,state=cached|" +
                      std::to_string(st.cached) + ".0"))
      << parsed;
  EXPECT_TRUE(
      Has(parsed, "gauge|bufpool_pool_buffers|pool=rx_pool,state=free|" +
                      std::to_string(64 - 5 - st.cached) + ".0"))
      << parsed;
  EXPECT_TRUE(
      Has(parsed, "gauge|bufpool_pool_capacity_buffers|pool=rx_pool|64.0"))
      << parsed;
  EXPECT_TRUE(Has(parsed, "gauge|bufpool_pool_buffer_size_bytes|pool=rx_pool|" +
                              std::to_string((*pool)->buffer_size()) + ".0"))
      << parsed;
  EXPECT_TRUE(
      Has(parsed, "gauge|bufpool_pool_high_water_buffers|pool=rx_pool|" +
                      std::to_string(st.high_water) + ".0"))
      << parsed;
  EXPECT_TRUE(
      Has(parsed, "counter|bufpool_pool_acquire_failures_total|pool=rx_pool|" +
                      std::to_string(st.acquire_failures) + ".0"))
      << parsed;
  EXPECT_GE(st.acquire_failures, 1u);
  EXPECT_TRUE(Has(
      parsed, "counter|bufpool_pool_acquire_timeouts_total|pool=rx_pool|0.0"))
      << parsed;
  // Without a name: no labels but the state.
  text.clear();
  WriteMetrics(**pool, &text);
  EXPECT_TRUE(Has(ParseWithPrometheusClient(text),
                  "gauge|bufpool_pool_capacity_buffers||64.0"));
  held.clear();
}

TEST(MetricsTest, ElasticFamiliesCountGrowthAndTrims) {
  auto pool = BufferPool::Create({.buffer_count = 64,
                                  .huge_pages = HugePages::kNever,
                                  .cache_size = 0,
                                  .max_buffer_count = 1024,
                                  .grow_step = 64});
  ASSERT_TRUE(pool.ok()) << pool.status();
  {
    std::vector<Buffer> burst(200);  // two growth steps: 64, then 128
    ASSERT_EQ((*pool)->TryAcquireBulk(absl::MakeSpan(burst)), 200u);
  }
  ASSERT_GT((*pool)->Trim(100), 0u);
  Buffer held = (*pool)->TryAcquire();
  std::string text;
  WriteMetrics(**pool, &text, {.name = "p"});
  const PoolStats st = (*pool)->Stats();
  const std::string parsed = ParseWithPrometheusClient(text);
  EXPECT_TRUE(Has(parsed, "gauge|bufpool_pool_committed_buffers|pool=p|" +
                              std::to_string(st.committed) + ".0"))
      << parsed;
  EXPECT_EQ(st.committed, 100u);
  EXPECT_TRUE(Has(parsed, "counter|bufpool_pool_grows_total|pool=p|2.0"))
      << parsed;
  EXPECT_TRUE(Has(parsed, "counter|bufpool_pool_trims_total|pool=p|1.0"))
      << parsed;
  EXPECT_TRUE(
      Has(parsed, "counter|bufpool_pool_grow_failures_total|pool=p|0.0"))
      << parsed;
  // Free is what is backed and not held: not the unbacked reserve.
  EXPECT_TRUE(Has(parsed, "gauge|bufpool_pool_buffers|pool=p,state=free|99.0"))
      << parsed;
  EXPECT_TRUE(Has(parsed, "gauge|bufpool_pool_capacity_buffers|pool=p|1024.0"))
      << parsed;
}

TEST(MetricsTest, RingFamiliesParseAndMatchTheRing) {
  io_uring ring;
  ASSERT_EQ(io_uring_queue_init(8, &ring, 0), 0);
  auto pool = BufferPool::Create({.buffer_count = 64});
  ASSERT_TRUE(pool.ok());
  auto br = ProvidedBufferRing::Create(
      &ring, **pool, {.group_id = 7, .max_buffers = 16, .initial_buffers = 8});
  ASSERT_TRUE(br.ok()) << br.status();
  std::string text;
  WriteMetrics(**pool, &text, {.name = "p"});
  WriteMetrics(**br, &text, {.name = "p"});
  const std::string parsed = ParseWithPrometheusClient(text);
  EXPECT_TRUE(Has(parsed, "gauge|bufpool_ring_lent_buffers|group=7,pool=p|8.0"))
      << parsed;
  EXPECT_TRUE(
      Has(parsed, "gauge|bufpool_ring_target_buffers|group=7,pool=p|8.0"))
      << parsed;
  EXPECT_TRUE(Has(parsed, "gauge|bufpool_ring_max_buffers|group=7,pool=p|16.0"))
      << parsed;
  EXPECT_TRUE(
      Has(parsed, "gauge|bufpool_ring_utilization_ratio|group=7,pool=p|0.0"))
      << parsed;
  EXPECT_TRUE(
      Has(parsed, "counter|bufpool_ring_enobufs_total|group=7,pool=p|0.0"))
      << parsed;
  EXPECT_TRUE(
      Has(parsed, "counter|bufpool_ring_copied_total|group=7,pool=p|0.0"))
      << parsed;
  EXPECT_TRUE(Has(parsed, "gauge|bufpool_pool_buffers|pool=p,state=in_use|8.0"))
      << parsed;
  br->reset();
  io_uring_queue_exit(&ring);
}

TEST(MetricsTest, BudgetFamiliesParseAndMatchStats) {
  auto pool = BufferPool::Create({.buffer_count = 64, .cache_size = 0});
  ASSERT_TRUE(pool.ok()) << pool.status();
  const size_t bs = (*pool)->buffer_size();
  // Empty families (no budget yet) still parse.
  std::string text;
  WriteMetrics(**pool, &text, {.name = "p"});
  EXPECT_NE(text.find("# TYPE bufpool_budget_pinned_bytes gauge"),
            std::string::npos);
  ParseWithPrometheusClient(text);
  auto a = (*pool)->CreateBudget(
      {.name = "conn a", .max_bytes = 3 * bs, .reserved_bytes = 2 * bs});
  ASSERT_TRUE(a.ok()) << a.status();
  // A name the exposition format must escape.
  auto b = (*pool)->CreateBudget({.name = "say \"hi\"", .max_bytes = bs});
  ASSERT_TRUE(b.ok()) << b.status();
  BufferChain ca(**a), cb(**b);
  ASSERT_TRUE(ca.Append(std::string(2 * bs + 1, 'a')).ok());
  ca.Consume(bs);
  EXPECT_FALSE(ca.Append(std::string(2 * bs, 'a')).ok());  // one refusal
  ASSERT_TRUE(cb.Append(std::string(10, 'b')).ok());
  text.clear();
  WriteMetrics(**pool, &text, {.name = "p"});
  const std::string parsed = ParseWithPrometheusClient(text);
  const BudgetStats sa = (*a)->Stats();
  const BudgetStats sb = (*b)->Stats();
  EXPECT_EQ(sa.pinned_bytes, 2 * bs);
  EXPECT_EQ(sa.high_water_bytes, 3 * bs);
  EXPECT_EQ(sa.refusals, 1u);
  auto line = [](const std::string& type, const std::string& name,
                 const std::string& budget, size_t v) {
    return type + "|" + name + "|budget=" + budget + ",pool=p|" +
           std::to_string(v) + ".0";
  };
  for (const auto& [budget, st, max, reserved] :
       {std::tuple<std::string, BudgetStats, size_t, size_t>{"conn a", sa,
                                                             3 * bs, 2 * bs},
        {"say \"hi\"", sb, bs, 0}}) {
    EXPECT_TRUE(Has(parsed, line("gauge", "bufpool_budget_pinned_bytes", budget,
                                 st.pinned_bytes)))
        << parsed;
    EXPECT_TRUE(Has(parsed, line("gauge", "bufpool_budget_high_water_bytes",
                                 budget, st.high_water_bytes)))
        << parsed;
    EXPECT_TRUE(
        Has(parsed, line("gauge", "bufpool_budget_max_bytes", budget, max)))
        << parsed;
    EXPECT_TRUE(Has(parsed, line("gauge", "bufpool_budget_reserved_bytes",
                                 budget, reserved)))
        << parsed;
    EXPECT_TRUE(Has(parsed, line("counter", "bufpool_budget_refusals_total",
                                 budget, st.refusals)))
        << parsed;
  }
  ca.Clear();
  cb.Clear();
}

}  // namespace
}  // namespace bufpool

namespace bufpool {
namespace {

// Budgets of one group are one series per family, their sums; budgets of
// no group keep a series each.
TEST(MetricsTest, BudgetGroupsAreOneSeriesEach) {
  auto pool = BufferPool::Create({.buffer_count = 64, .cache_size = 0});
  ASSERT_TRUE(pool.ok()) << pool.status();
  const size_t bs = (*pool)->buffer_size();
  std::vector<std::unique_ptr<BufferBudget>> conns;
  std::vector<BufferChain> chains;
  chains.reserve(100);
  for (int i = 0; i < 100; ++i) {
    auto b = (*pool)->CreateBudget({.name = "conn " + std::to_string(i),
                                    .max_bytes = 2 * bs,
                                    .group = "listener 1"});
    ASSERT_TRUE(b.ok()) << b.status();
    conns.push_back(std::move(*b));
    chains.emplace_back(*conns.back());
    if (i % 10 == 0) ASSERT_TRUE(chains.back().Append("x").ok());
  }
  // One refusal in the group.
  EXPECT_FALSE(chains[0].Append(std::string(2 * bs, 'y')).ok());
  auto alone = (*pool)->CreateBudget({.name = "admin", .max_bytes = bs});
  ASSERT_TRUE(alone.ok()) << alone.status();
  std::string text;
  WriteMetrics(**pool, &text, {.name = "p"});
  const std::string parsed = ParseWithPrometheusClient(text);
  auto group = [](const std::string& type, const std::string& name, size_t v) {
    return type + "|" + name + "|budget_group=listener 1,pool=p|" +
           std::to_string(v) + ".0";
  };
  EXPECT_TRUE(Has(parsed, group("gauge", "bufpool_budget_group_budgets", 100)))
      << parsed;
  EXPECT_TRUE(
      Has(parsed, group("gauge", "bufpool_budget_group_pinned_bytes", 10 * bs)))
      << parsed;
  EXPECT_TRUE(
      Has(parsed, group("gauge", "bufpool_budget_group_max_bytes", 200 * bs)))
      << parsed;
  EXPECT_TRUE(Has(parsed, group("gauge", "bufpool_budget_group_refusals", 1)))
      << parsed;
  EXPECT_TRUE(Has(parsed,
                  "gauge|bufpool_budget_pinned_bytes|budget=admin,"
                  "pool=p|0.0"))
      << parsed;
  // No per-connection series for the grouped budgets.
  EXPECT_EQ(text.find("budget=\"conn "), std::string::npos);
  chains.clear();
}

}  // namespace
}  // namespace bufpool

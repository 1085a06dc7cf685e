// The load client of `loom bench serve` against the in-process server and fake engine.
#include "bench/loom/load_client.h"
#include "serve/server_fixture.h"

namespace loom::serve::testing {
namespace {

using bench::bench_summary_json;
using bench::BenchOptions;
using bench::BenchReport;
using bench::latency_stats;
using bench::LatencyStats;
using bench::run_serve_benchmark;

TEST(ServeBenchClient, Percentiles) {
  std::vector<double> v;
  for (int i = 100; i >= 1; --i) v.push_back(i * 0.001);
  LatencyStats s = latency_stats(v);
  EXPECT_EQ(s.count, 100);
  EXPECT_NEAR(s.p50, 0.0505, 1e-12);  // interpolated, as loom::percentile
  EXPECT_NEAR(s.p99, 0.09901, 1e-12);
  EXPECT_NEAR(s.max, 0.100, 1e-12);
  EXPECT_NEAR(s.mean, 0.0505, 1e-12);
  EXPECT_EQ(latency_stats({}).count, 0);
}

TEST_F(ServeTest, BenchClientMeasuresEveryRequest) {
  ServeOptions opt;
  opt.api_key = "k";
  start(opt, FakeEngineOptions());
  BenchOptions b;
  b.url = "http://127.0.0.1:" + std::to_string(server_->port());
  b.requests = 20;
  b.rate = 400;
  b.max_tokens = 8;
  b.api_key = "k";
  int64_t last_progress = 0;
  BenchReport r = run_serve_benchmark(b, [&](int64_t done, int64_t total) {
    EXPECT_EQ(total, 20);
    last_progress = done;
  });
  EXPECT_EQ(r.model, "fake");
  EXPECT_EQ(r.ok, 20) << (r.errors.empty() ? "" : r.errors[0]);
  EXPECT_EQ(r.failed, 0);
  EXPECT_EQ(last_progress, 20);
  EXPECT_EQ(r.output_tokens, 160);
  EXPECT_EQ(r.prompt_tokens, 20 * 32);
  EXPECT_EQ(r.ttft.count, 20);
  EXPECT_EQ(r.itl.count, 20 * 7);
  EXPECT_GT(r.e2e.p50, 0);
  EXPECT_LE(r.ttft.p50, r.e2e.p99);
  json s = json::parse(bench_summary_json(b, r));
  EXPECT_EQ(s["ok"], 20);
  EXPECT_TRUE(s["ttft"].contains("p99_ms"));

  // A wrong key fails every request and says why.
  b.api_key = "wrong";
  b.model = "fake";
  b.requests = 3;
  BenchReport bad = run_serve_benchmark(b);
  EXPECT_EQ(bad.failed, 3);
  EXPECT_EQ(bad.errors[0], "HTTP 401");
}

}  // namespace
}  // namespace loom::serve::testing

// Prometheus text rendering of counters, gauges and histograms.
#include <gtest/gtest.h>

#include "loom/core/error.h"
#include "loom/net/metrics.h"

using namespace loom::net;

TEST(NetMetrics, RendersExpositionFormat) {
  MetricsRegistry m;
  m.counter("loom_requests_total", "requests", {{"endpoint", "/v1/x"}, {"status", "200"}}).inc();
  m.counter("loom_requests_total", "requests", {{"endpoint", "/v1/x"}, {"status", "200"}}).inc(2);
  m.counter("loom_requests_total", "requests", {{"endpoint", "a\"b"}, {"status", "400"}}).inc();
  m.gauge("loom_ratio", "a ratio").set(0.25);
  Histogram& h = m.histogram("loom_lat_seconds", "latency", {0.1, 1.0});
  h.observe(0.05);
  h.observe(0.1);  // le is inclusive
  h.observe(0.5);
  h.observe(7);
  std::string text = m.render();
  EXPECT_NE(text.find("# TYPE loom_requests_total counter\n"), std::string::npos);
  EXPECT_NE(text.find("loom_requests_total{endpoint=\"/v1/x\",status=\"200\"} 3\n"), std::string::npos);
  EXPECT_NE(text.find("loom_requests_total{endpoint=\"a\\\"b\",status=\"400\"} 1\n"), std::string::npos);
  EXPECT_NE(text.find("# TYPE loom_ratio gauge\nloom_ratio 0.25\n"), std::string::npos);
  EXPECT_NE(text.find("loom_lat_seconds_bucket{le=\"0.1\"} 2\n"), std::string::npos);
  EXPECT_NE(text.find("loom_lat_seconds_bucket{le=\"1\"} 3\n"), std::string::npos);
  EXPECT_NE(text.find("loom_lat_seconds_bucket{le=\"+Inf\"} 4\n"), std::string::npos);
  EXPECT_NE(text.find("loom_lat_seconds_sum 7.65\n"), std::string::npos);
  EXPECT_NE(text.find("loom_lat_seconds_count 4\n"), std::string::npos);
}

TEST(NetMetrics, ATypeClashIsAnError) {
  MetricsRegistry m;
  m.counter("x_total", "x");
  EXPECT_THROW(m.gauge("x_total", "x"), loom::Error);
  EXPECT_THROW(Histogram({1.0, 0.5}), loom::Error);
}

// Load client of `loom bench serve` and `loom bench cascade`: requests arrive as a Poisson
// process at a given rate against a running server; each streams a completion and records time
// to first token, inter-token gaps and end-to-end latency. Pure client: knows only the HTTP API.
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace loom::bench {

struct BenchOptions {
  std::string url = "http://127.0.0.1:8000";
  int64_t requests = 64;
  double rate = 0;  // requests per second; <= 0: all at once
  int64_t max_tokens = 32;
  int64_t prompt_chars = 32;  // random lowercase text of this length
  std::string model;          // empty: the first model of GET /v1/models
  std::string api_key;
  uint64_t seed = 0;  // arrivals and prompts
  double timeout_s = 120;
};

struct LatencyStats {
  int64_t count = 0;
  double mean = 0, p50 = 0, p99 = 0, max = 0;  // seconds
};
LatencyStats latency_stats(std::vector<double> samples);

struct BenchReport {
  std::string model;
  int64_t ok = 0, failed = 0;
  std::vector<std::string> errors;  // first few failure descriptions
  LatencyStats ttft, itl, e2e;
  int64_t output_tokens = 0, prompt_tokens = 0;
  double duration_s = 0;                                 // first send to last finish
  double request_throughput = 0, output_throughput = 0;  // per second
};

// Runs the benchmark; `progress` (may be empty) gets (finished, total) as requests end.
BenchReport run_serve_benchmark(const BenchOptions& opt, const std::function<void(int64_t, int64_t)>& progress = {});

std::string bench_summary_json(const BenchOptions& opt, const BenchReport& r);

}  // namespace loom::bench

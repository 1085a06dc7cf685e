// `loom bench serve`: Poisson-arrival load against a running OpenAI-compatible server;
// prints TTFT, inter-token and end-to-end latency percentiles and throughput, then
// `SUMMARY {json}` as the last line.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>

#include "bench/loom/bench.h"
#include "bench/loom/load_client.h"
#include "loom/core/error.h"

namespace loom::cli {

int bench_serve(const std::vector<std::string>& argv) {
  auto app = bench_app("serve");
  bench::BenchOptions opt;
  opt.requests = 64;
  opt.max_tokens = 32;
  opt.prompt_chars = 32;
  opt.timeout_s = 120;
  opt.url.clear();  // required
  double rate = std::numeric_limits<double>::infinity();
  int64_t seed = 0;
  app->add_option("--url", opt.url, "server base, e.g. http://127.0.0.1:8000")->required();
  app->add_option("--requests", opt.requests, "requests to send")->check(positive());
  app->add_option("--rate", rate, "mean arrivals per second, Poisson; 0 or inf: all at once")->check(non_negative());
  app->add_option("--max-tokens", opt.max_tokens, "tokens per completion")->check(positive());
  app->add_option("--prompt-len", opt.prompt_chars, "characters of random prompt text")
      ->type_name("C")
      ->check(non_negative());
  app->add_option("--model", opt.model, "model to request (default: the first of GET /v1/models)")->type_name("NAME");
  app->add_option("--api-key", opt.api_key, "sent as Authorization: Bearer KEY")->type_name("KEY");
  app->add_option("--seed", seed, "seeds arrivals and prompts");
  app->add_option("--timeout", opt.timeout_s, "seconds a request may take")->check(positive());
  if (auto rc = parse(*app, argv)) return *rc;
  opt.rate = std::isinf(rate) ? 0.0 : rate;
  opt.seed = uint64_t(seed);

  std::printf("bench serve: %lld requests at %s req/s against %s\n", (long long)opt.requests,
              opt.rate > 0 ? str_cat(rate).c_str() : "inf", opt.url.c_str());
  std::fflush(stdout);
  bench::BenchReport r = bench::run_serve_benchmark(opt, [](int64_t done, int64_t total) {
    if (done == total || done % std::max<int64_t>(1, total / 10) == 0) {
      std::printf("  %lld/%lld done\n", (long long)done, (long long)total);
      std::fflush(stdout);
    }
  });
  std::printf("\nmodel %s: %lld ok, %lld failed in %.2f s\n", r.model.c_str(), (long long)r.ok, (long long)r.failed,
              r.duration_s);
  for (const auto& e : r.errors) std::printf("  failure: %s\n", e.c_str());
  std::printf("%-22s %10s %10s %10s %10s\n", "latency (ms)", "mean", "p50", "p99", "max");
  auto row = [](const char* name, const bench::LatencyStats& s) {
    std::printf("%-22s %10.2f %10.2f %10.2f %10.2f\n", name, s.mean * 1e3, s.p50 * 1e3, s.p99 * 1e3, s.max * 1e3);
  };
  row("time to first token", r.ttft);
  row("inter-token", r.itl);
  row("end to end", r.e2e);
  std::printf("throughput: %.2f req/s, %.1f output tok/s (%lld output tokens)\n", r.request_throughput,
              r.output_throughput, (long long)r.output_tokens);
  std::printf("SUMMARY %s\n", bench::bench_summary_json(opt, r).c_str());
  return r.failed == 0 ? 0 : 1;
}

}  // namespace loom::cli

// `loom bench serve`: Poisson-arrival load against a running OpenAI-compatible server;
// prints TTFT, inter-token and end-to-end latency percentiles and throughput, then
// `SUMMARY {json}` as the last line.
#include <algorithm>
#include <cstdio>

#include "loom/serve/client/bench_client.h"
#include "tools/loom/commands.h"

namespace loom::cli {

int bench_serve(const std::vector<std::string>& argv) {
  for (const auto& a : argv)
    if (a == "--help" || a == "-h") {
      std::printf(
          "usage: loom bench serve --url URL [--requests N] [--rate R] [--max-tokens M]\n"
          "                        [--prompt-len C] [--model NAME] [--api-key KEY] [--seed S]\n\n"
          "  --url URL         server base, e.g. http://127.0.0.1:8000 (required)\n"
          "  --requests N      requests to send (default 64)\n"
          "  --rate R          mean arrivals per second, Poisson; 0 or inf: all at once (default inf)\n"
          "  --max-tokens M    tokens per completion (default 32)\n"
          "  --prompt-len C    characters of random prompt text (default 32)\n"
          "  --model NAME      model to request (default: the first of GET /v1/models)\n"
          "  --api-key KEY     sent as Authorization: Bearer KEY\n"
          "  --seed S          seeds arrivals and prompts (default 0)\n");
      return 0;
    }
  Args args("bench serve", argv,
            {{"url", true}, {"requests", true}, {"rate", true}, {"max-tokens", true}, {"prompt-len", true},
             {"model", true}, {"api-key", true}, {"seed", true}, {"timeout", true}});
  if (!args.has("url")) throw UsageError("[bench serve] --url is required, e.g. --url http://127.0.0.1:8000");
  serve::BenchOptions opt;
  opt.url = args.get("url", "");
  opt.requests = args.get_int("requests", 64);
  std::string rate = args.get("rate", "inf");
  opt.rate = rate == "inf" ? 0.0 : args.get_double("rate", 0);
  opt.max_tokens = args.get_int("max-tokens", 32);
  opt.prompt_chars = args.get_int("prompt-len", 32);
  opt.model = args.get("model", "");
  opt.api_key = args.get("api-key", "");
  opt.seed = uint64_t(args.get_int("seed", 0));
  opt.timeout_s = args.get_double("timeout", 120);
  if (opt.requests <= 0) throw UsageError("[bench serve] --requests must be positive");

  std::printf("bench serve: %lld requests at %s req/s against %s\n", (long long)opt.requests,
              opt.rate > 0 ? rate.c_str() : "inf", opt.url.c_str());
  std::fflush(stdout);
  serve::BenchReport r = serve::run_serve_benchmark(opt, [](int64_t done, int64_t total) {
    if (done == total || done % std::max<int64_t>(1, total / 10) == 0) {
      std::printf("  %lld/%lld done\n", (long long)done, (long long)total);
      std::fflush(stdout);
    }
  });
  std::printf("\nmodel %s: %lld ok, %lld failed in %.2f s\n", r.model.c_str(), (long long)r.ok,
              (long long)r.failed, r.duration_s);
  for (const auto& e : r.errors) std::printf("  failure: %s\n", e.c_str());
  std::printf("%-22s %10s %10s %10s %10s\n", "latency (ms)", "mean", "p50", "p99", "max");
  auto row = [](const char* name, const serve::LatencyStats& s) {
    std::printf("%-22s %10.2f %10.2f %10.2f %10.2f\n", name, s.mean * 1e3, s.p50 * 1e3, s.p99 * 1e3, s.max * 1e3);
  };
  row("time to first token", r.ttft);
  row("inter-token", r.itl);
  row("end to end", r.e2e);
  std::printf("throughput: %.2f req/s, %.1f output tok/s (%lld output tokens)\n", r.request_throughput,
              r.output_throughput, (long long)r.output_tokens);
  std::printf("SUMMARY %s\n", serve::bench_summary_json(opt, r).c_str());
  return r.failed == 0 ? 0 : 1;
}

}  // namespace loom::cli

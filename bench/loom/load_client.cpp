// Poisson-arrival load client for a running server (see load_client.h).
#include "bench/loom/load_client.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <mutex>
#include <nlohmann/json.hpp>
#include <random>
#include <thread>

#include "loom/core/error.h"
#include "loom/core/stats.h"
#include "loom/core/timer.h"
#include "loom/serve/client/http_client.h"

namespace loom::bench {

using serve::ClientResponse;
using serve::HttpClient;
using serve::parse_url;
using serve::Url;

using nlohmann::json;

LatencyStats latency_stats(std::vector<double> v) {
  LatencyStats s;
  s.count = int64_t(v.size());
  if (v.empty()) return s;
  std::sort(v.begin(), v.end());
  double sum = 0;
  for (double x : v) sum += x;
  s.mean = sum / double(v.size());
  s.p50 = percentile(v, 50);
  s.p99 = percentile(v, 99);
  s.max = v.back();
  return s;
}

namespace {

struct Sample {
  bool ok = false;
  std::string error;
  double t_start = 0, t_end = 0, ttft = 0;
  std::vector<double> gaps;
  int64_t output_tokens = 0, prompt_tokens = 0;
};

net::HeaderList auth(const std::string& key) {
  if (key.empty()) return {};
  return {{"Authorization", "Bearer " + key}};
}

void one_request(const Url& url, const BenchOptions& opt, const std::string& model, const std::string& prompt,
                 Sample* s) {
  HttpClient http(url.host, url.port, opt.timeout_s);
  json body = {{"model", model}, {"prompt", prompt}, {"max_tokens", opt.max_tokens}, {"stream", true}};
  s->t_start = now_seconds();
  try {
    ClientResponse head = http.start_stream("POST", url.prefix + "/v1/completions", body.dump(), auth(opt.api_key));
    if (head.status != 200) {
      std::string rest;
      while (auto ev = http.next_event()) rest += *ev;
      s->error = str_cat("HTTP ", head.status);
      s->t_end = now_seconds();
      return;
    }
    double t_last = 0;
    bool done = false;
    while (auto ev = http.next_event()) {
      double t = now_seconds();
      if (*ev == "[DONE]") {
        done = true;
        continue;
      }
      json chunk = json::parse(*ev, nullptr, false);
      if (chunk.is_discarded() || chunk.contains("error")) {
        s->error = "error event: " + ev->substr(0, 200);
        break;
      }
      if (chunk.contains("usage") && chunk["usage"].is_object()) {
        s->output_tokens = chunk["usage"].value("completion_tokens", int64_t(0));
        s->prompt_tokens = chunk["usage"].value("prompt_tokens", int64_t(0));
      }
      const json& choices = chunk["choices"];
      if (!choices.is_array() || choices.empty()) continue;
      const json& text = choices[0]["text"];
      if (!text.is_string() || text.get<std::string>().empty()) continue;
      if (t_last == 0)
        s->ttft = t - s->t_start;
      else
        s->gaps.push_back(t - t_last);
      t_last = t;
    }
    s->t_end = now_seconds();
    s->ok = done && s->error.empty();
    if (!done && s->error.empty()) s->error = "stream ended without [DONE]";
  } catch (const std::exception& e) {
    s->t_end = now_seconds();
    s->error = e.what();
  }
}

std::string discover_model(const Url& url, const BenchOptions& opt) {
  HttpClient http(url.host, url.port, 10);
  ClientResponse r = http.request("GET", url.prefix + "/v1/models", "", auth(opt.api_key));
  LOOM_CHECK(r.status == 200, "bench", "GET ", opt.url, "/v1/models answered ", r.status, ": ", r.body,
             " (is the server up? does it need --api-key?)");
  json j = json::parse(r.body, nullptr, false);
  LOOM_CHECK(!j.is_discarded() && j.contains("data") && !j["data"].empty(), "bench",
             "GET /v1/models returned no model: ", r.body);
  return j["data"][0]["id"].get<std::string>();
}

}  // namespace

BenchReport run_serve_benchmark(const BenchOptions& opt, const std::function<void(int64_t, int64_t)>& progress) {
  LOOM_CHECK(opt.requests > 0, "bench", "--requests must be positive, got ", opt.requests);
  LOOM_CHECK(opt.max_tokens > 0, "bench", "--max-tokens must be positive, got ", opt.max_tokens);
  LOOM_CHECK(opt.prompt_chars > 0, "bench", "--prompt-len must be positive, got ", opt.prompt_chars);
  Url url = parse_url(opt.url);
  BenchReport rep;
  rep.model = opt.model.empty() ? discover_model(url, opt) : opt.model;

  std::mt19937_64 rng(opt.seed);
  std::exponential_distribution<double> gap(opt.rate > 0 ? opt.rate : 1.0);
  std::uniform_int_distribution<int> letter('a', 'z');
  std::vector<double> arrival(size_t(opt.requests));
  std::vector<std::string> prompts(size_t(opt.requests));
  double t = 0;
  for (int64_t i = 0; i < opt.requests; ++i) {
    if (opt.rate > 0 && i > 0) t += gap(rng);
    arrival[size_t(i)] = t;
    for (int64_t k = 0; k < opt.prompt_chars; ++k) prompts[size_t(i)] += char(letter(rng));
  }

  std::vector<Sample> samples(size_t(opt.requests));
  std::vector<std::thread> threads;
  std::atomic<int64_t> finished{0};
  std::mutex progress_mu;
  const double t0 = now_seconds();
  for (int64_t i = 0; i < opt.requests; ++i) {
    double wait = t0 + arrival[size_t(i)] - now_seconds();
    if (wait > 0) std::this_thread::sleep_for(std::chrono::duration<double>(wait));
    threads.emplace_back([&, i] {
      one_request(url, opt, rep.model, prompts[size_t(i)], &samples[size_t(i)]);
      int64_t n = ++finished;
      if (progress) {
        std::lock_guard<std::mutex> lock(progress_mu);
        progress(n, opt.requests);
      }
    });
  }
  for (auto& th : threads) th.join();

  std::vector<double> ttft, itl, e2e;
  double first = 1e300, last = 0;
  for (const Sample& s : samples) {
    first = std::min(first, s.t_start);
    last = std::max(last, s.t_end);
    if (!s.ok) {
      ++rep.failed;
      if (rep.errors.size() < 5) rep.errors.push_back(s.error);
      continue;
    }
    ++rep.ok;
    ttft.push_back(s.ttft);
    e2e.push_back(s.t_end - s.t_start);
    itl.insert(itl.end(), s.gaps.begin(), s.gaps.end());
    rep.output_tokens += s.output_tokens;
    rep.prompt_tokens += s.prompt_tokens;
  }
  rep.ttft = latency_stats(ttft);
  rep.itl = latency_stats(itl);
  rep.e2e = latency_stats(e2e);
  rep.duration_s = std::max(last - first, 1e-9);
  rep.request_throughput = double(rep.ok) / rep.duration_s;
  rep.output_throughput = double(rep.output_tokens) / rep.duration_s;
  return rep;
}

std::string bench_summary_json(const BenchOptions& opt, const BenchReport& r) {
  auto ms = [](const LatencyStats& s) {
    return json{{"count", s.count},
                {"mean_ms", s.mean * 1e3},
                {"p50_ms", s.p50 * 1e3},
                {"p99_ms", s.p99 * 1e3},
                {"max_ms", s.max * 1e3}};
  };
  json j = {{"bench", "serve"},
            {"url", opt.url},
            {"model", r.model},
            {"requests", opt.requests},
            {"rate", opt.rate > 0 ? json(opt.rate) : json("inf")},
            {"max_tokens", opt.max_tokens},
            {"prompt_chars", opt.prompt_chars},
            {"ok", r.ok},
            {"failed", r.failed},
            {"ttft", ms(r.ttft)},
            {"itl", ms(r.itl)},
            {"e2e", ms(r.e2e)},
            {"duration_s", r.duration_s},
            {"request_throughput", r.request_throughput},
            {"output_tokens", r.output_tokens},
            {"output_throughput_tok_s", r.output_throughput}};
  return j.dump(-1, ' ', false, json::error_handler_t::replace);
}

}  // namespace loom::bench

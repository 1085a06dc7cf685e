// `loom bench infer --speculative SPEC`: speculative decoding against plain decoding, same
// model, engine settings, prompts and seeds, in one invocation. Batch-1 decode first, the two
// alternating prompt by prompt (tokens/s, acceptance, tokens per target forward, whether
// greedy outputs agree); then a served load at a low Poisson rate and one at saturation, each
// mode on its own engine clock, interleaved (P50/P99 end-to-end latency and throughput).
#include <algorithm>
#include <cstdio>
#include <random>

#include "bench/loom/bench_infer.h"
#include "bench/loom/bench_serving_run.h"
#include "loom/core/stats.h"
#include "loom/core/threads.h"
#include "loom/data/dataset.h"
#include "loom/kernels/cpu/cpu_kernels.h"
#include "loom/model/checkpoint_reader.h"
#include "tools/loom/inference_model.h"

namespace loom::cli {
namespace {

// The prompts of a workload: `text` windows of DIR/val.bin; `quote` such a window followed
// by its own first quarter again (continuing it means quoting it); `random` uniform tokens.
std::vector<std::vector<int32_t>> make_prompts(const std::string& workload, const std::string& data, int64_t n,
                                               int64_t len, int64_t vocab, uint64_t seed) {
  std::vector<std::vector<int32_t>> out;
  if (workload == "random") {
    std::mt19937_64 g(seed);
    for (int64_t i = 0; i < n; ++i) {
      std::vector<int32_t> p(static_cast<size_t>(len), 0);
      for (auto& t : p) t = int32_t(g() % uint64_t(vocab));
      out.push_back(std::move(p));
    }
    return out;
  }
  data::DatasetOptions opt;
  opt.model_vocab = vocab;
  const data::TokenDataset ds = data::TokenDataset::open_split(data, "val", opt);
  const int64_t body = workload == "quote" ? len - len / 4 : len;
  LOOM_CHECK(ds.size() > body * n, "bench", data, "/val.bin holds ", ds.size(), " tokens, fewer than ", n,
             " prompts of ", body, " need; lower --batch1-requests, --requests or --prompt-len");
  for (int64_t i = 0; i < n; ++i) {
    std::vector<int32_t> p(static_cast<size_t>(body));
    ds.read(i * (ds.size() - body) / n, body, p.data());
    if (workload == "quote") {
      const std::vector<int32_t> head(p.begin(), p.begin() + (len - body));
      p.insert(p.end(), head.begin(), head.end());
    }
    out.push_back(std::move(p));
  }
  return out;
}

struct Batch1Result {
  double tokens = 0, seconds = 0;  // decode only: from each request's first token to its last
  std::vector<double> rates;       // per request
  infer::EngineMetrics metrics;
  std::vector<std::vector<int32_t>> outputs;
};

void decode_one(infer::Engine& e, const std::vector<int32_t>& prompt, const infer::SamplingParams& sp,
                Batch1Result& r) {
  double first = -1, last = -1;
  int64_t n = 0;
  const infer::RequestOutput out = e.run(prompt, sp, [&](const infer::TokenEvent& ev) {
    if (ev.token < 0) return;
    last = now_seconds();
    if (first < 0) first = last;
    ++n;
  });
  if (out.finish_reason == infer::FinishReason::error) fail("bench", out.error);
  if (n > 1 && last > first) {
    r.tokens += double(n - 1);
    r.seconds += last - first;
    r.rates.push_back(double(n - 1) / (last - first));
  }
  r.outputs.push_back(out.tokens);
  r.metrics = e.metrics();
}

double acceptance(const infer::EngineMetrics& m) {
  return m.spec_proposed > 0 ? double(m.spec_accepted) / double(m.spec_proposed) : 0;
}
// Tokens each decoding forward of the target produced (1 without speculation).
double tokens_per_forward(int64_t decode_rows, int64_t verifications, int64_t accepted) {
  const int64_t forwards = decode_rows + verifications;
  return forwards > 0 ? double(forwards + accepted) / double(forwards) : 0;
}

// --prompt-len and --output-len, plain numbers here (`def` when not given).
int64_t whole_number(const std::string& text, int64_t def) {
  if (text.empty()) return def;
  size_t used = 0;
  int64_t x = 0;
  try {
    x = std::stoll(text, &used);
  } catch (...) {
    used = 0;
  }
  if (used == 0 || used != text.size())
    throw UsageError("[bench infer] with --speculative, --prompt-len and --output-len must be numbers >= 2, got \"" +
                     text + "\"");
  return x;
}

}  // namespace

int bench_infer_speculative(const InferBenchOptions& a, int threads) {
  SpeculativeSetup spec = parse_speculative(a.speculative, "bench infer");
  const std::string workload = !a.workload.empty() ? a.workload : a.given("data") ? "text" : "random";
  if (workload != "random" && !a.given("data"))
    throw UsageError("[bench infer] --workload " + workload +
                     " takes its prompts from --data DIR (a `loom prepare` output)");
  const int64_t plen = whole_number(a.prompt_len, 64), olen = whole_number(a.output_len, 96);
  const int64_t n_b1 = a.batch1_requests, n_load = a.given("requests") ? a.requests : 16;
  if (plen < 2 || olen < 2 || n_b1 < 1 || n_load < 0)
    throw UsageError(
        "[bench infer] with --speculative, --prompt-len and --output-len must be numbers >= 2, "
        "--batch1-requests >= 1 and --requests >= 0 (0: no load runs)");
  const double temperature = a.temperature;
  const uint64_t seed = uint64_t(a.seed);
  const auto quant = quant_spec_from(a.quant);
  std::string ckpt;
  if (a.given("checkpoint")) ckpt = resolve_inference_checkpoint(a.checkpoint, stderr);
  const model::ModelConfig mc = ckpt.empty() ? model::preset(a.model) : model::checkpoint_model_config(ckpt);
  if (plen + olen > mc.n_ctx)
    throw UsageError(str_cat("[bench infer] --prompt-len ", plen, " plus --output-len ", olen,
                             " exceed the context of ", mc.n_ctx, " tokens"));
  const InferenceModel im = bench_model(ckpt, mc, seed, quant, stderr);
  load_speculative_draft(spec, im, stderr);
  const model::Decoder& m = *im.model;

  infer::EngineConfig plain;
  plain.kv_cache_bytes = (a.given("kv-cache-mb") ? a.kv_cache_mb : 1024) << 20;
  plain.max_num_seqs = a.max_num_seqs;
  plain.max_batched_tokens = a.max_batched_tokens;
  plain.quant = im.quant_ptr();
  infer::EngineConfig with = plain;
  with.speculative = spec.config;

  std::printf("bench infer --speculative: %s%s, %s, %d threads, kernels %s\n", mc.summary().c_str(),
              weights_origin(ckpt).c_str(), im.precision().c_str(), threads, cpu::hot_kernels_isa().c_str());
  std::printf("speculative: %s%s\n", spec.config.describe().c_str(),
              spec.draft ? str_cat(", draft ", spec.draft->checkpoint, " (", spec.draft->model->config().summary(),
                                   ", ", spec.draft->precision(), ")")
                               .c_str()
                         : "");
  std::printf("workload: %s prompts of %lld tokens%s, %lld output tokens, temperature %.2f\n", workload.c_str(),
              (long long)plen, workload == "random" ? "" : (" from " + a.data + "/val.bin").c_str(), (long long)olen,
              temperature);
  std::fflush(stdout);

  // Batch 1: each prompt decoded plainly and speculatively, in alternating order.
  infer::SamplingParams sp;
  sp.temperature = temperature;
  sp.max_tokens = olen;
  const auto prompts = make_prompts(workload, a.data, n_b1, plen, mc.vocab_size, seed);
  infer::EngineConfig b1p = plain, b1s = with;
  b1p.max_num_seqs = b1s.max_num_seqs = 1;
  infer::Engine ep(m, b1p), es(m, b1s);
  Batch1Result rp, rs;
  for (size_t i = 0; i < prompts.size(); ++i) {
    sp.seed = seed + i;
    if (i % 2 == 0) {
      decode_one(ep, prompts[i], sp, rp);
      decode_one(es, prompts[i], sp, rs);
    } else {
      decode_one(es, prompts[i], sp, rs);
      decode_one(ep, prompts[i], sp, rp);
    }
    std::fprintf(stderr, "[bench] batch 1: prompt %zu/%zu: plain %.2f, speculative %.2f tokens/s\n", i + 1,
                 prompts.size(), rp.rates.back(), rs.rates.back());
  }
  int64_t same = 0;
  for (size_t i = 0; i < prompts.size(); ++i) same += rp.outputs[i] == rs.outputs[i] ? 1 : 0;
  const double plain_tps = rp.tokens / rp.seconds, spec_tps = rs.tokens / rs.seconds;
  std::vector<double> ratios;
  for (size_t i = 0; i < rp.rates.size() && i < rs.rates.size(); ++i) ratios.push_back(rs.rates[i] / rp.rates[i]);
  const infer::EngineMetrics& sm = rs.metrics;
  const double acc = acceptance(sm), tpf = tokens_per_forward(sm.decode_rows, sm.spec_verifications, sm.spec_accepted);
  std::printf("\nbatch-1 decode, %zu prompts x %lld tokens:\n", prompts.size(), (long long)olen);
  std::printf("  plain        %8.2f tokens/s\n", plain_tps);
  std::printf("  speculative  %8.2f tokens/s  (%.2fx; median per prompt %.2fx)\n", spec_tps, spec_tps / plain_tps,
              percentile(ratios, 50));
  std::printf(
      "  acceptance %.1f%% (%lld of %lld proposals), %.2f tokens per target forward, proposing %.1f%% of the "
      "time\n",
      100 * acc, (long long)sm.spec_accepted, (long long)sm.spec_proposed, tpf, 100 * sm.spec_propose_s / rs.seconds);
  if (temperature == 0)
    std::printf("  greedy outputs identical: %lld of %zu%s\n", (long long)same, prompts.size(),
                same == int64_t(prompts.size())
                    ? ""
                    : " (f32 rounding differs with the rows per forward; see docs/INFERENCE.md)");

  std::string js = str_cat(
      "{\"model\":\"", mc.name, "\",\"quant\":\"", im.precision(), "\",\"speculative\":\"", spec.config.describe(),
      "\",\"workload\":\"", workload, "\",\"prompt_len\":", plen, ",\"output_len\":", olen,
      ",\"temperature\":", temperature, ",\"plain_tokens_per_s\":", plain_tps, ",\"spec_tokens_per_s\":", spec_tps,
      ",\"speedup\":", spec_tps / plain_tps, ",\"acceptance\":", acc, ",\"tokens_per_forward\":", tpf);
  if (temperature == 0) js += str_cat(",\"greedy_identical\":", same, ",\"greedy_compared\":", prompts.size());

  // Served load: a low Poisson rate (a quarter of what plain batch-1 decoding completes),
  // then every request at once.
  if (n_load > 0) {
    const double low_rate = a.given("low-rate") ? a.low_rate : 0.25 * plain_tps / double(olen);
    const auto load_prompts = make_prompts(workload, a.data, n_load, plen, mc.vocab_size, seed + 1000);
    std::printf(
        "\nserved load, %lld requests (continuous batching, max %lld sequences; speculation off above %lld "
        "running); low: Poisson arrivals at %.3g/s; saturation: all at once\n",
        (long long)n_load, (long long)plain.max_num_seqs, (long long)spec.config.max_batch, low_rate);
    std::printf("%-12s %-12s %12s %12s %12s %12s %12s\n", "load", "mode", "tokens/s", "p50 e2e ms", "p99 e2e ms",
                "p50 TPOT ms", "acceptance");
    for (const char* load : {"low", "high"}) {
      const bool low = std::string(load) == "low";
      std::mt19937_64 g(seed + (low ? 1 : 2));
      std::vector<WorkItem> work(load_prompts.size());
      double t = 0;
      for (size_t i = 0; i < work.size(); ++i) {
        if (low) t += std::exponential_distribution<double>(low_rate)(g);
        work[i].arrival = t;
        work[i].prompt = load_prompts[i];
        work[i].output_len = olen;
      }
      const auto rs2 =
          run_side_by_side(m, {plain, with},
                           {Flavour{BatchingMode::continuous, StaticPolicy::padded, "plain", "plain"},
                            Flavour{BatchingMode::continuous, StaticPolicy::padded, "speculative", "spec"}},
                           work, temperature, plen + olen);
      for (const ModeResult& r : rs2)
        std::printf("%-12s %-12s %12.2f %12.1f %12.1f %12.1f %12s\n", low ? "low" : "saturation", r.mode.c_str(),
                    r.tokens_per_s, percentile(r.e2e_ms, 50), percentile(r.e2e_ms, 99), percentile(r.tpot_ms, 50),
                    r.spec_proposed
                        ? str_cat(int(100.0 * double(r.spec_accepted) / double(r.spec_proposed)), "%").c_str()
                        : "-");
      for (const ModeResult& r : rs2)
        js += str_cat(",\"", load, "_", r.key, "_tokens_per_s\":", r.tokens_per_s, ",\"", load, "_", r.key,
                      "_p50_e2e_ms\":", percentile(r.e2e_ms, 50), ",\"", load, "_", r.key,
                      "_p99_e2e_ms\":", percentile(r.e2e_ms, 99));
      if (low) js += str_cat(",\"low_rate\":", low_rate);
    }
  }
  js += "}";
  std::printf("SUMMARY %s\n", js.c_str());
  return 0;
}

}  // namespace loom::cli

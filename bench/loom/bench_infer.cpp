// `loom bench infer`: serving throughput and latency of the inference engine under Poisson
// arrivals, static (padded or compact) against continuous batching at the same load (TTFT,
// time per output token, end-to-end latency percentiles, peak KV use and fragmentation,
// padding rows), and the batch-1 decode rate against the memory-bandwidth bound measured on
// this machine.
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <random>
#include <vector>

#include "bench/loom/bench.h"
#include "bench/loom/bench_infer.h"
#include "bench/loom/bench_serving_run.h"
#include "loom/core/error.h"
#include "loom/core/stats.h"
#include "loom/core/threads.h"
#include "loom/core/timer.h"
#include "loom/infer/engine.h"
#include "loom/infer/quant_checkpoint.h"
#include "loom/kernels/cpu/cpu_kernels.h"
#include "loom/model/checkpoint_reader.h"
#include "loom/model/model_source.h"
#include "tools/loom/inference_model.h"

namespace loom::cli {
namespace {

// A length distribution parsed from the command line.
struct LengthDist {
  enum Kind { fixed, uniform, exponential } kind = fixed;
  double a = 0, b = 0, c = 0;
  std::string text;
  static LengthDist parse(const std::string& opt, const std::string& s) {
    LengthDist d;
    d.text = s;
    std::vector<double> v;
    std::string head = s, rest;
    if (auto colon = s.find(':'); colon != std::string::npos) {
      head = s.substr(0, colon);
      rest = s.substr(colon + 1);
    }
    try {
      if (rest.empty()) {
        size_t used = 0;
        d.a = std::stod(s, &used);
        if (used == s.size() && d.a >= 1) return d;
      }
      size_t at = 0;
      while (!rest.empty()) {
        const size_t next = rest.find(':', at);
        v.push_back(std::stod(rest.substr(at, next == std::string::npos ? std::string::npos : next - at)));
        if (next == std::string::npos) break;
        at = next + 1;
      }
    } catch (...) {
      v.clear();
    }
    if (head == "uniform" && v.size() == 2 && v[0] >= 1 && v[1] >= v[0]) {
      d.kind = uniform;
      d.a = v[0];
      d.b = v[1];
      return d;
    }
    if (head == "exp" && v.size() == 3 && v[0] > 0 && v[1] >= 1 && v[2] >= v[1]) {
      d.kind = exponential;
      d.a = v[0];
      d.b = v[1];
      d.c = v[2];
      return d;
    }
    throw UsageError(
        str_cat("[bench infer] ", opt, " \"", s, "\": expected N, uniform:A:B or exp:MEAN:MIN:MAX with 1 <= A <= B"));
  }
  int64_t sample(std::mt19937_64& g) const {
    if (kind == fixed) return int64_t(a);
    if (kind == uniform) return std::uniform_int_distribution<int64_t>(int64_t(a), int64_t(b))(g);
    const double x = std::exponential_distribution<double>(1.0 / a)(g);
    return std::clamp<int64_t>(int64_t(std::llround(x)), int64_t(b), int64_t(c));
  }
  int64_t max() const { return kind == fixed ? int64_t(a) : kind == uniform ? int64_t(b) : int64_t(c); }
};

std::vector<WorkItem> make_workload(int64_t n, double rate, const LengthDist& plen, const LengthDist& olen,
                                    int64_t vocab, uint64_t seed) {
  std::mt19937_64 g(seed);
  std::vector<WorkItem> w(static_cast<size_t>(n));
  double t = 0;
  for (auto& item : w) {
    if (rate > 0) t += std::exponential_distribution<double>(rate)(g);
    item.arrival = t;
    item.prompt.resize(size_t(plen.sample(g)));
    for (auto& tok : item.prompt) tok = int32_t(g() % uint64_t(vocab));
    item.output_len = olen.sample(g);
  }
  return w;
}

double padding_pct(const ModeResult& r) {
  const double rows = double(r.decode_rows + r.padding_rows);
  return rows > 0 ? 100.0 * double(r.padding_rows) / rows : 0;
}

// One column per mode, then continuous/static for each static flavour.
void print_table(const std::vector<ModeResult>& rs) {
  const ModeResult* cont = nullptr;
  std::vector<const ModeResult*> statics;
  for (const auto& r : rs) {
    if (r.is_static)
      statics.push_back(&r);
    else
      cont = &r;
  }
  if (!cont) statics.clear();
  std::printf("\n%-28s", "metric");
  for (const auto& r : rs) std::printf("%16s", r.mode.c_str());
  for (const ModeResult* st : statics)
    std::printf("%16s", (statics.size() == 1 ? std::string("cont/static") : "cont/" + st->policy).c_str());
  std::printf("\n");
  auto row = [&](const char* name, auto get, const char* fmt, bool ratio = true) {
    std::printf("%-28s", name);
    for (const auto& r : rs) std::printf(fmt, get(r));
    for (const ModeResult* st : statics) {
      if (!ratio) break;
      if (get(*st) != 0)
        std::printf("%15.2fx", get(*cont) / get(*st));
      else
        std::printf("%16s", "-");
    }
    std::printf("\n");
  };
  const char* f1 = "%16.1f";
  row(
      "output tokens/s", [](const ModeResult& r) { return r.tokens_per_s; }, f1);
  row(
      "requests/s", [](const ModeResult& r) { return r.requests_per_s; }, "%16.3f");
  row(
      "makespan s", [](const ModeResult& r) { return r.makespan_s; }, f1);
  for (double p : {50.0, 90.0, 99.0}) {
    const std::string sp = str_cat(int(p));
    row(
        str_cat("TTFT p", sp, " ms").c_str(), [p](const ModeResult& r) { return percentile(r.ttft_ms, p); }, f1);
    row(
        str_cat("TPOT p", sp, " ms").c_str(), [p](const ModeResult& r) { return percentile(r.tpot_ms, p); }, f1);
    row(
        str_cat("end-to-end p", sp, " ms").c_str(), [p](const ModeResult& r) { return percentile(r.e2e_ms, p); }, f1);
  }
  row(
      "steps", [](const ModeResult& r) { return double(r.steps); }, "%16.0f");
  row(
      "decode rows computed", [](const ModeResult& r) { return double(r.decode_rows + r.padding_rows); }, "%16.0f");
  if (std::any_of(rs.begin(), rs.end(), [](const ModeResult& r) { return r.policy == "padded"; })) {
    row("padding rows computed %", padding_pct, "%16.2f", false);
  }
  row(
      "peak running sequences", [](const ModeResult& r) { return double(r.peak_seqs); }, "%16.0f");
  row(
      "preemptions", [](const ModeResult& r) { return double(r.preemptions); }, "%16.0f");
  row(
      "peak KV blocks", [](const ModeResult& r) { return double(r.peak_blocks); }, "%16.0f");
  row(
      "peak KV MiB", [](const ModeResult& r) { return r.peak_kv_bytes / 1048576.0; }, f1);
  row(
      "KV unused at peak %", [](const ModeResult& r) { return 100 * r.frag_at_peak; }, "%16.2f");
  row(
      "contiguous would waste %", [](const ModeResult& r) { return 100 * r.contiguous_waste; }, "%16.1f");
}

}  // namespace

InferenceModel bench_model(const std::string& ckpt, const model::ModelConfig& mc, uint64_t seed,
                           const std::optional<infer::QuantSpec>& quant, FILE* log, const comm::Group* tp) {
  return ckpt.empty() ? random_inference_model(mc, seed, quant, tp)
                      : load_inference_model(ckpt, quant, log, /*resolved=*/true, tp);
}

std::string weights_origin(const std::string& ckpt) { return ckpt.empty() ? " (random weights)" : " from " + ckpt; }

double measure_read_bandwidth(const float* buf, int64_t n) {
  double best = 0;
  volatile double sink = 0;
  for (int rep = 0; rep < 2; ++rep) {
    const double t = now_seconds();
    double total = 0;
#pragma omp parallel for schedule(dynamic, 16) reduction(+ : total)
    for (int64_t c = 0; c < n; c += 4096) {
      // 64 lanes: four independent vector chains, so the sum runs at the rate data arrives
      // rather than at the latency of one chain of adds.
      float acc[64] = {};
      const float* p = buf + c;
      const int64_t e = std::min<int64_t>(4096, n - c);
      int64_t j = 0;
      for (; j + 64 <= e; j += 64)
        for (int k = 0; k < 64; ++k) acc[k] += p[j + k];
      for (; j < e; ++j) acc[0] += p[j];
      for (float a : acc) total += a;
    }
    sink = sink + total;
    best = std::max(best, double(n) * 4 / (now_seconds() - t));
  }
  return best;
}

infer::EngineConfig batch1_config(infer::EngineConfig cfg) {
  cfg.max_num_seqs = 1;
  return cfg;
}

infer::EngineConfig prefill_config(infer::EngineConfig cfg, int64_t P) {
  cfg.max_num_seqs = 1;
  cfg.max_batched_tokens = std::max(cfg.max_batched_tokens, P);
  cfg.prefix_caching = false;
  return cfg;
}

Batch1 run_batch1(const model::Decoder& m, const infer::EngineConfig& cfg, int64_t n_tokens) {
  infer::Engine e(m, batch1_config(cfg));
  const int64_t rounds = 5, per_round = std::max<int64_t>(4, n_tokens / rounds);
  std::vector<int32_t> prompt(16);
  for (size_t i = 0; i < prompt.size(); ++i) prompt[i] = int32_t((i * 7 + 1) % size_t(m.config().vocab_size));
  infer::SamplingParams sp;
  sp.temperature = 0;
  sp.max_tokens = rounds * per_round + 2;
  e.add_request(prompt, sp);
  e.step();                                       // prefill
  std::vector<float> buf(size_t(1) << 28, 1.0f);  // 1 GiB
  const double bytes = double(e.weight_bytes_per_token());
  std::vector<Batch1> rs;
  for (int64_t r = 0; r < rounds; ++r) {
    std::vector<double> dt;
    for (int64_t k = 0; k < per_round; ++k) {
      const double t = now_seconds();
      e.step();
      dt.push_back(now_seconds() - t);
    }
    Batch1 b;
    b.tokens_per_s = 1.0 / percentile(dt, 50);
    b.bytes_per_token = bytes;
    b.bandwidth = measure_read_bandwidth(buf.data(), int64_t(buf.size()));
    b.bound = b.bandwidth / bytes;
    b.fraction = b.tokens_per_s / b.bound;
    b.weights_bandwidth =
        measure_read_bandwidth(buf.data(), std::min<int64_t>(int64_t(buf.size()), int64_t(bytes / 4)));
    b.weights_bound = b.weights_bandwidth / bytes;
    b.weights_fraction = b.tokens_per_s / b.weights_bound;
    rs.push_back(b);
  }
  while (e.has_unfinished()) e.step();
  std::sort(rs.begin(), rs.end(), [](const Batch1& x, const Batch1& y) { return x.fraction < y.fraction; });
  return rs[rs.size() / 2];
}

double time_prefill(infer::Engine& e, int64_t vocab, int64_t P, int rep) {
  std::vector<int32_t> prompt(static_cast<size_t>(P));
  for (size_t i = 0; i < prompt.size(); ++i) prompt[i] = int32_t((i * 13 + 7 * size_t(rep) + 1) % size_t(vocab));
  infer::SamplingParams sp;
  sp.temperature = 0;
  sp.max_tokens = 1;
  e.add_request(prompt, sp);
  const double t = now_seconds();
  e.step();  // the whole prompt, and its first token
  const double rate = double(P) / (now_seconds() - t);
  while (e.has_unfinished()) e.step();
  return rate;
}

double prefill_tokens_per_s(const model::Decoder& m, const infer::EngineConfig& cfg, int64_t P) {
  infer::Engine e(m, prefill_config(cfg, P));
  std::vector<double> rates;
  for (int rep = 0; rep < 3; ++rep) rates.push_back(time_prefill(e, m.config().vocab_size, P, rep));
  return percentile(rates, 50);
}

int bench_infer(const std::vector<std::string>& argv) {
  auto app = bench_app(
      "infer",
      "loom bench infer [--model PRESET|PATH | --checkpoint PATH] [options]: static vs continuous batching under "
      "Poisson load and batch-1 decode. --peer llama.cpp: batch-1 decode and prompt processing beside llama.cpp on "
      "the same weights, alternating: a GPT-2 preset or checkpoint written as GGUF F32, BF16, Q8_0, Q4_0 for fp32, "
      "bf16, int8, int4 (greedy tokens compared at F32), or a GGUF file (--model X.gguf) that llama.cpp runs as it "
      "is beside each of loom's precisions; --ppl-text FILE adds perplexity on both sides over the same token ids; "
      "the peer is PyPI's llama-cpp-python, built once into --peer-venv (the first run compiles llama.cpp, "
      "minutes; docs/PERFORMANCE.md). loom launch --nproc N -- bench infer --tp N: "
      "tensor-parallel decode speed. --speculative SPEC: speculative against plain decoding, alternating: batch-1 "
      "decode of --batch1-requests prompts, then --requests at a low Poisson rate (--low-rate) and all at once; "
      "prompts are windows of --data DIR/val.bin (text), such a window followed by its first quarter again "
      "(quote), or random tokens (random; the default without --data).");
  InferBenchOptions a;
  a.app = app.get();
  app->add_option("--model", a.model,
                  "a model preset (random weights), or a path as --checkpoint takes (a GGUF file, ...)")
      ->type_name("PRESET|PATH");
  app->add_option("--checkpoint", a.checkpoint,
                  "a training checkpoint or run directory, a quantized checkpoint (loom quantize), a GGUF file or a "
                  "Hugging Face directory")
      ->type_name("PATH");
  app->add_option("--mode", a.mode, "all: compact static, padded static and continuous, side by side")
      ->check(one_of({"static", "continuous", "both", "all"}));
  app->add_option("--static", a.static_policy,
                  "the static batching of static/both: padded (finished members stay in the batch as padding rows "
                  "until the longest is done) or compact (they leave at once)")
      ->check(one_of({"padded", "compact"}));
  add_run_default_option(*app, "--requests", a.requests,
                         "requests of the load (default 64; --speculative 16, 0: no load runs)", "N", non_negative());
  app->add_option("--rate", a.rate, "Poisson arrivals per second; 0: all at once")
      ->type_name("R")
      ->check(non_negative());
  app->add_option("--prompt-len", a.prompt_len,
                  "prompt tokens: N | uniform:A:B | exp:MEAN:MIN:MAX (exponential, clamped) (default "
                  "uniform:16:128; --speculative: a plain number, default 64)")
      ->type_name("DIST");
  app->add_option("--output-len", a.output_len,
                  "output tokens, as --prompt-len (default uniform:16:256; --speculative 96)")
      ->type_name("DIST");
  app->add_option("--max-num-seqs", a.max_num_seqs, "sequences stepped together")->type_name("N")->check(positive());
  app->add_option("--max-batched-tokens", a.max_batched_tokens, "tokens per engine step")
      ->type_name("N")
      ->check(positive());
  app->add_option("--block-size", a.block_size, "tokens per KV-cache block")->type_name("N")->check(positive());
  add_run_default_option(*app, "--kv-cache-mb", a.kv_cache_mb, "KV-cache size in MiB (default 1024; --tp 256)", "N",
                         positive());
  app->add_option("--temperature", a.temperature, "sampling temperature (0: greedy)")
      ->type_name("T")
      ->check(in_range(0, 2));
  add_run_default_option(*app, "--threads", a.threads, "compute threads (default 2; --tp 1)", "N", positive());
  app->add_option("--seed", a.seed, "seeds weights, arrivals and prompts")->type_name("S");
  app->add_flag("--no-prefix-caching", a.no_prefix_caching, "the engine without prefix caching");
  app->add_flag("--no-batch1", a.no_batch1, "skip the batch-1 decode measurement");
  app->add_option("--batch1-tokens", a.batch1_tokens, "tokens of the batch-1 decode")
      ->type_name("N")
      ->check(positive());
  app->add_option("--prefill-tokens", a.prefill_tokens, "time one N-token prompt's prefill (prompt processing; 0: off)")
      ->type_name("N")
      ->check(non_negative());
  add_quant_options(*app, a.quant);
  add_tensor_parallel_option(*app, a.tp);
  const std::string peer = "--peer llama.cpp";
  app->add_option("--peer", a.peer, "run beside llama.cpp")->check(one_of({"llama.cpp"}))->group(peer);
  std::string peer_isa = "native";
  app->add_option("--peer-isa", peer_isa,
                  "the instruction set llama.cpp is built for: native (this CPU's, -march=native) or avx2 (AVX2, "
                  "FMA, F16C; no AVX-512, AVX-VNNI or AMX: an AVX2-only CPU such as Zen 3; run loom with "
                  "LOOM_ISA=avx2 beside it)")
      ->check(one_of({"native", "avx2"}))
      ->group(peer);
  app->add_option("--peer-venv", a.peer_venv,
                  "where llama-cpp-python is built (default BUILD/peers/llama-venv, with --peer-isa avx2 "
                  "BUILD/peers/llama-venv-avx2)")
      ->type_name("DIR")
      ->group(peer);
  app->add_option("--rounds", a.rounds, "alternating rounds")->type_name("R")->check(positive())->group(peer);
  app->add_option("--precisions", a.precisions, "of fp32, bf16, int8, int4")->type_name("LIST")->group(peer);
  app->add_option("--compare-tokens", a.compare_tokens, "greedy tokens compared at F32")
      ->type_name("N")
      ->check(non_negative())
      ->group(peer);
  app->add_option("--compare-prompt", a.compare_prompt, "the prompt of the comparison (default: a fixed text)")
      ->type_name("TEXT")
      ->group(peer);
  app->add_option("--ppl-text", a.ppl_text,
                  "perplexity of this text on both sides (loom at each precision, llama.cpp on its GGUF), "
                  "tokenized by the model's tokenizer, in windows as loom eval --text")
      ->type_name("FILE")
      ->group(peer);
  app->add_option("--ppl-seq-len", a.ppl_seq_len, "tokens per perplexity window")
      ->type_name("T")
      ->check(positive())
      ->group(peer);
  app->add_option("--ppl-max-windows", a.ppl_max_windows, "score at most N windows (0: all)")
      ->type_name("N")
      ->check(non_negative())
      ->group(peer);
  const std::string spec = "--speculative SPEC";
  add_speculative_option(*app, a.speculative);
  app->get_option("--speculative")->group(spec);
  app->add_option("--data", a.data, "prompts from DIR/val.bin (a `loom prepare` output)")
      ->type_name("DIR")
      ->group(spec);
  app->add_option("--workload", a.workload, "prompts (default: text with --data, else random)")
      ->check(one_of({"text", "quote", "random"}))
      ->group(spec);
  app->add_option("--batch1-requests", a.batch1_requests, "prompts decoded one at a time")
      ->type_name("N")
      ->check(positive())
      ->group(spec);
  add_run_default_option(*app, "--low-rate", a.low_rate,
                         "arrivals per second of the low load (default: a quarter of plain "
                         "batch-1's)",
                         "R", positive())
      ->group(spec);
  if (auto rc = parse(*app, argv)) return *rc;
  a.peer_isa = peer_isa == "avx2" ? PeerIsa::avx2 : PeerIsa::native;
  if (!a.given("peer"))
    for (const char* k : {"peer-isa", "peer-venv", "rounds", "precisions", "compare-tokens", "compare-prompt",
                          "ppl-text", "ppl-seq-len", "ppl-max-windows"})
      if (a.given(k)) throw UsageError(str_cat("[bench infer] --", k, " goes with --peer llama.cpp"));
  if (!a.given("speculative"))
    for (const char* k : {"data", "workload", "batch1-requests", "low-rate"})
      if (a.given(k)) throw UsageError(str_cat("[bench infer] --", k, " goes with --speculative"));
  if (a.tp != 1) {
    if (a.given("peer") || a.given("speculative"))
      throw UsageError("[bench infer] --tp measures tensor-parallel decode alone; drop --peer and --speculative");
    const int threads = a.given("threads") ? int(a.threads) : 1;
    set_num_threads(threads);
    return bench_infer_tp(a, threads);
  }
  if (a.given("speculative")) {
    if (a.given("peer")) throw UsageError("[bench infer] --speculative and --peer are separate benchmarks; give one");
    const int threads = a.given("threads") ? int(a.threads) : 2;
    set_num_threads(threads);
    return bench_infer_speculative(a, threads);
  }
  const std::string& mode = a.mode;
  const std::string& static_name = a.static_policy;
  const StaticPolicy policy = static_name == "padded" ? StaticPolicy::padded : StaticPolicy::compact;
  const int64_t n_req = a.given("requests") ? a.requests : 64;
  const double rate = a.rate;
  if (n_req < 1) throw UsageError("[bench infer] --requests must be at least 1");
  const LengthDist plen = LengthDist::parse("--prompt-len", a.prompt_len.empty() ? "uniform:16:128" : a.prompt_len);
  const LengthDist olen = LengthDist::parse("--output-len", a.output_len.empty() ? "uniform:16:256" : a.output_len);
  const int threads = a.given("threads") ? int(a.threads) : 2;
  set_num_threads(threads);

  // Weights: a training checkpoint (DIR is one, or holds step_* ones: the newest valid is
  // used), a quantized checkpoint, a GGUF file or Hugging Face directory, or a preset with
  // random weights (serving cost does not depend on their values); --quant quantizes the f32
  // ones on load. --model takes a path too: a name that is no preset is one.
  // (--peer makes its own precisions from --precisions, --group and --zero-point.)
  const auto quant = a.given("peer") ? std::nullopt : quant_spec_from(a.quant);
  std::string path = a.checkpoint;
  if (!a.given("checkpoint")) {
    const auto presets = model::preset_names();
    if (std::find(presets.begin(), presets.end(), a.model) == presets.end() && std::filesystem::exists(a.model))
      path = a.model;
  }
  std::string ckpt;
  if (!path.empty()) ckpt = resolve_inference_checkpoint(path, stderr);
  const bool foreign =
      !ckpt.empty() && !infer::is_quantized_checkpoint(ckpt) && model::model_format(ckpt) != model::ModelFormat::loom;
  const model::ModelConfig mc = ckpt.empty() ? model::preset(a.model)
                                : foreign    ? model::read_model_card(ckpt).config
                                             : model::checkpoint_model_config(ckpt);
  if (!a.given("peer") && plen.max() + olen.max() > mc.n_ctx)
    throw UsageError(str_cat("[bench infer] the longest prompt (", plen.max(), ") plus the longest output (",
                             olen.max(), ") exceed the context of ", mc.n_ctx, " tokens"));
  const int64_t prefill = std::min(a.prefill_tokens, mc.n_ctx - 1);
  infer::EngineConfig cfg;
  cfg.block_size = a.block_size;
  cfg.kv_cache_bytes = (a.given("kv-cache-mb") ? a.kv_cache_mb : 1024) << 20;
  cfg.max_num_seqs = a.max_num_seqs;
  cfg.max_batched_tokens = a.max_batched_tokens;
  cfg.prefix_caching = !a.no_prefix_caching;
  if (a.given("peer")) {
    if (!ckpt.empty() && infer::is_quantized_checkpoint(ckpt))
      throw UsageError("[bench infer] --peer llama.cpp needs f32 weights to write as GGUF; " + ckpt +
                       " is a quantized checkpoint (give the checkpoint it was made from)");
    std::printf("bench infer --peer llama.cpp: %s%s, %d threads, kernels %s\n", mc.summary().c_str(),
                weights_origin(ckpt).c_str(), threads, cpu::hot_kernels_isa().c_str());
    return bench_infer_llama_cpp(a, mc, ckpt, cfg, threads, prefill);
  }
  const InferenceModel im = bench_model(ckpt, mc, uint64_t(a.seed), quant, stderr);
  const model::Decoder& m = *im.model;
  cfg.quant = im.quant_ptr();
  const double temperature = a.temperature;

  std::printf("bench infer: %s%s, %s, %d threads, kernels %s%s\n", mc.summary().c_str(), weights_origin(ckpt).c_str(),
              im.precision().c_str(), threads, cpu::hot_kernels_isa().c_str(),
              im.quant ? (", quantized linears " + cpu::quant_linear_path(im.quant->spec.format)).c_str() : "");
  std::printf("load: %ld requests, Poisson rate %.2f/s, prompt %s, output %s, temperature %.2f\n", long(n_req), rate,
              plen.text.c_str(), olen.text.c_str(), temperature);
  std::printf("engine: max_num_seqs %ld, max_batched_tokens %ld, block %ld, KV cache %s\n", long(cfg.max_num_seqs),
              long(cfg.max_batched_tokens), long(cfg.block_size), format_bytes(cfg.kv_cache_bytes).c_str());
  if (mode != "continuous")
    std::printf("static batching: %s%s\n", mode == "all" ? "compact and padded" : static_name.c_str(),
                mode == "all"                    ? ""
                : policy == StaticPolicy::padded ? " (finished members stay as padding rows until the longest is done)"
                                                 : " (finished members leave the batch at once)");
  std::fflush(stdout);

  const auto work = make_workload(n_req, rate, plen, olen, mc.vocab_size, uint64_t(a.seed));
  std::vector<Flavour> flavours;
  auto static_flavour = [](StaticPolicy p, bool both_policies) {
    const std::string name = static_policy_name(p);
    return Flavour{BatchingMode::static_batch, p, "static-" + name, both_policies ? "static_" + name : "static"};
  };
  if (mode == "all") {
    flavours.push_back(static_flavour(StaticPolicy::compact, true));
    flavours.push_back(static_flavour(StaticPolicy::padded, true));
  } else if (mode != "continuous") {
    flavours.push_back(static_flavour(policy, false));
  }
  if (mode != "static") flavours.push_back({BatchingMode::continuous, policy, "continuous", "continuous"});
  const std::vector<ModeResult> results = run_side_by_side(m, std::vector<infer::EngineConfig>(flavours.size(), cfg),
                                                           flavours, work, temperature, plen.max() + olen.max());
  print_table(results);

  Batch1 b1;
  if (!a.no_batch1) {
    b1 = run_batch1(m, cfg, a.batch1_tokens);
    std::printf(
        "\nbatch-1 decode: %.2f tokens/s; weights read per token %.1f MB; read bandwidth "
        "%.2f GB/s (1 GiB sum, %d threads) -> bound %.2f tokens/s; achieved %.1f%% "
        "(median of 5 rounds)\n",
        b1.tokens_per_s, b1.bytes_per_token / 1e6, b1.bandwidth / 1e9, threads, b1.bound, 100 * b1.fraction);
    std::printf(
        "  against a sum over %.1f MB (the weights' size; cache-resident if they are): %.2f GB/s "
        "-> bound %.2f tokens/s; achieved %.1f%% (same round)\n",
        b1.bytes_per_token / 1e6, b1.weights_bandwidth / 1e9, b1.weights_bound, 100 * b1.weights_fraction);
  }
  double prefill_rate = 0;
  if (prefill > 0) {
    prefill_rate = prefill_tokens_per_s(m, cfg, prefill);
    std::printf("prompt processing: %lld-token prompt at %.1f tokens/s (one step, median of 3)\n", (long long)prefill,
                prefill_rate);
  }

  // The static_* keys are the --static flavour's (with all, besides static_compact_* and
  // static_padded_*); output tokens count real tokens only, never padding.
  auto find = [&](const std::string& key) -> const ModeResult* {
    for (const auto& r : results)
      if (r.key == key) return &r;
    return nullptr;
  };
  const std::string chosen_key = mode == "all" ? "static_" + static_name : "static";
  std::string js =
      str_cat("{\"model\":\"", mc.name, "\",\"quant\":\"", im.precision(), "\",\"requests\":", n_req,
              ",\"rate\":", rate, ",\"prompt_len\":\"", plen.text, "\",\"output_len\":\"", olen.text, "\"");
  if (mode != "continuous") js += str_cat(",\"static_policy\":\"", static_name, "\"");
  std::vector<std::pair<std::string, const ModeResult*>> keyed;
  if (const ModeResult* r = find(chosen_key)) keyed.push_back({"static", r});
  for (const char* key : {"static_compact", "static_padded", "continuous"})
    if (const ModeResult* r = find(key)) keyed.push_back({key, r});
  for (const auto& [p, r] : keyed) {
    js += str_cat(",\"", p, "_tokens_per_s\":", r->tokens_per_s, ",\"", p, "_requests_per_s\":", r->requests_per_s,
                  ",\"", p, "_p50_e2e_ms\":", percentile(r->e2e_ms, 50), ",\"", p,
                  "_p99_e2e_ms\":", percentile(r->e2e_ms, 99), ",\"", p, "_p50_ttft_ms\":", percentile(r->ttft_ms, 50),
                  ",\"", p, "_p99_ttft_ms\":", percentile(r->ttft_ms, 99), ",\"", p,
                  "_p50_tpot_ms\":", percentile(r->tpot_ms, 50), ",\"", p, "_peak_kv_blocks\":", r->peak_blocks, ",\"",
                  p, "_kv_unused_at_peak_pct\":", 100 * r->frag_at_peak);
    if (r->is_static) js += str_cat(",\"", p, "_padding_rows_pct\":", padding_pct(*r));
  }
  if (const ModeResult* c = find("continuous")) {
    if (const ModeResult* st = find(chosen_key))
      js += str_cat(",\"throughput_ratio\":", c->tokens_per_s / st->tokens_per_s);
    for (const char* key : {"static_compact", "static_padded"})
      if (const ModeResult* st = find(key))
        js += str_cat(",\"throughput_ratio_", key + 7, "\":", c->tokens_per_s / st->tokens_per_s);
  }
  if (b1.tokens_per_s > 0)
    js += str_cat(",\"batch1_tokens_per_s\":", b1.tokens_per_s, ",\"read_bandwidth_gb_s\":", b1.bandwidth / 1e9,
                  ",\"batch1_bound_tokens_per_s\":", b1.bound, ",\"batch1_fraction_of_bound\":", b1.fraction,
                  ",\"weights_read_bandwidth_gb_s\":", b1.weights_bandwidth / 1e9,
                  ",\"batch1_fraction_of_weights_bound\":", b1.weights_fraction);
  if (prefill_rate > 0) js += str_cat(",\"prefill_tokens\":", prefill, ",\"prefill_tokens_per_s\":", prefill_rate);
  js += "}";
  std::printf("SUMMARY %s\n", js.c_str());
  return 0;
}

}  // namespace loom::cli

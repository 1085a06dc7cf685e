// `loom generate --checkpoint DIR --prompt TEXT`: streams a continuation of the prompt from a
// trained model, on the inference engine (paged KV cache). Same seed, same output. Outputs
// longer than the model's context continue over a sliding window: when the context is full,
// generation restarts from the last half-context of tokens (as nanoGPT-style samplers crop).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <optional>
#include <span>

#include "loom/core/allocator.h"
#include "loom/core/threads.h"
#include "loom/data/tokenizer.h"
#include "loom/infer/engine.h"
#include "tools/loom/commands.h"
#include "tools/loom/inference_model.h"

namespace loom::cli {

namespace {
const char* kHelp =
    "usage: loom generate --checkpoint DIR --prompt TEXT [--max-tokens N] [--temperature T]\n"
    "                     [--top-k K] [--top-p P] [--seed S] [--stop STRING]... [--tokenizer NAME]\n\n"
    "Streams a continuation of TEXT to stdout. DIR is a checkpoint (step_NNNNNN) or a run\n"
    "directory holding them (the newest valid one is used).\n"
    "  --max-tokens 200 (>= 1)  --temperature 0.8 (0 to 2; 0: greedy)  --top-k 0 (0 or -1: off)\n"
    "  --top-p 1.0 (0 < P <= 1)  --seed 0\n"
    "  --tokenizer       gpt2 or byte (default: the one recorded at training time)\n"
    "  --no-window       stop at the model's context instead of sliding the window\n"
    "  --kv-cache-mb M   the most KV cache to use; by default exactly what the prompt and\n"
    "                    --max-tokens need (at most the model's context)\n"
    "  --threads N       compute threads (default: OMP_NUM_THREADS or all cores)\n"
    "  --speculative SPEC  see below; the output is the same as without (greedy: the same tokens)\n"
    "DIR may also be a `loom quantize` output; an f32 checkpoint is quantized on load with:\n";

// The sampling options, refused with the ranges the server's requests have (infer/sampler.h).
infer::SamplingParams sampling_options(const Args& a) {
  infer::SamplingParams sp;
  sp.max_tokens = a.get_int("max-tokens", 200);
  sp.temperature = a.get_double("temperature", 0.8);
  const int64_t top_k = a.get_int("top-k", 0);
  sp.top_p = a.get_double("top-p", 1.0);
  for (const std::string& problem :
       {infer::max_tokens_problem(sp.max_tokens, "--max-tokens"),
        infer::temperature_problem(sp.temperature, "--temperature"),
        infer::top_k_problem(top_k, "--top-k"), infer::top_p_problem(sp.top_p, "--top-p")})
    if (!problem.empty()) throw UsageError("[generate] " + problem);
  sp.top_k = infer::user_top_k(top_k);
  sp.stop = a.get_all("stop");
  for (const auto& s : sp.stop)
    if (s.empty()) throw UsageError("[generate] --stop must not be empty");
  return sp;
}

int64_t positive_option(const Args& a, const char* name, const char* unit) {
  const int64_t v = a.get_int(name, 0);
  if (v < 1) throw UsageError(str_cat("[generate] --", name, " must be at least 1", unit, ", got ", v));
  return v;
}

// Where the non-finite values sit among the model's weights, for the error that follows
// non-finite logits.
std::string non_finite_weights(const model::Decoder& m, const std::string& checkpoint) {
  int64_t bad = 0;
  std::string first;
  const Tensor& flat = m.params();
  for (const auto& p : m.layout().params()) {
    int64_t n = 0;
    for (int64_t i = 0; i < p.numel(); ++i) {
      const double v = flat.dtype() == DType::f64 ? flat.data<double>()[p.offset + i]
                                                  : double(flat.data<float>()[p.offset + i]);
      n += std::isfinite(v) ? 0 : 1;
    }
    if (n > 0 && first.empty()) first = str_cat(n, " of the ", p.numel(), " values of ", p.name);
    bad += n;
  }
  if (bad == 0)
    return str_cat("every weight of checkpoint ", checkpoint, " is finite, so the forward pass overflowed; "
                   "the checkpoint is unstable: use an earlier one of its run");
  return str_cat("checkpoint ", checkpoint, " holds ", bad, " non-finite weight", bad == 1 ? "" : "s",
                 " (first: ", first, "); it was probably saved after its training diverged: use an earlier "
                 "checkpoint of the run");
}
}  // namespace

int cmd_generate(const std::vector<std::string>& argv) {
  std::map<std::string, OptionKind> spec = {
      {"checkpoint", true}, {"prompt", true}, {"max-tokens", true}, {"temperature", true},
      {"top-k", true}, {"top-p", true}, {"seed", true}, {"stop", Args::kRepeated}, {"tokenizer", true},
      {"threads", true}, {"no-window", false}, {"kv-cache-mb", true}, {"speculative", true}, {"tp", true},
      {"help", false}};
  add_quant_options(spec);
  Args a("generate", argv, spec);
  if (a.has("help")) {
    std::printf("%s%s%s%s", kHelp, kQuantHelp, kSpeculativeHelp, kTensorParallelHelp);
    return 0;
  }
  if (!a.has("checkpoint")) throw UsageError(std::string("[generate] --checkpoint is required\n\n") + kHelp);
  // Every option is checked before the checkpoint is read.
  infer::SamplingParams sp = sampling_options(a);
  const uint64_t seed = uint64_t(a.get_int("seed", 0));
  const bool window = !a.has("no-window");
  const int64_t kv_cap_mb = a.has("kv-cache-mb") ? positive_option(a, "kv-cache-mb", " (MiB)") : 0;
  if (a.has("threads")) set_num_threads(int(positive_option(a, "threads", "")));
  const auto quant = quant_spec_from(a);
  std::optional<SpeculativeSetup> speculative;
  if (a.has("speculative")) speculative = parse_speculative(a.get("speculative", ""), "generate");

  const TensorParallel tp = tensor_parallel_from(a, "generate", /*watchdog=*/true);
  FILE* log = tp.leader() ? stderr : nullptr;  // rank 0 prints; the others follow silently
  const InferenceModel im = load_inference_model(a.get("checkpoint", ""), quant, log, false, tp.group());
  if (speculative) load_speculative_draft(*speculative, im, log);
  const model::Decoder& m = *im.model;
  const model::ModelConfig& mc = m.config();
  const std::string& path = im.checkpoint;

  const std::string tok_name = a.get("tokenizer", im.tokenizer);
  auto tok = data::make_tokenizer(tok_name);
  const std::string prompt = a.get("prompt", "");
  std::vector<int32_t> ids = tok->encode(prompt);
  if (ids.empty() && tok->eot_id()) ids.push_back(*tok->eot_id());
  if (ids.empty()) throw UsageError("[generate] --prompt is empty and this tokenizer has no end-of-text token to start from");

  const int64_t ctx = mc.n_ctx;
  const int64_t n_prompt = int64_t(ids.size());
  LOOM_CHECK(n_prompt < ctx, "generate", "the prompt is ", n_prompt,
             " tokens but the model's context is ", ctx, " tokens; shorten the prompt");
  if (tok->eot_id()) sp.stop_token_ids.push_back(*tok->eot_id());
  sp.validate();

  // The KV cache holds the one sequence generated: the prompt and the tokens asked for, or the
  // whole context when the window will slide (every later window fits in it too).
  infer::EngineConfig ec;
  ec.max_num_seqs = 1;
  ec.max_seq_len = std::min(ctx, n_prompt + sp.max_tokens);
  ec.num_blocks = infer::KVCache::blocks_for_tokens(ec.max_seq_len, ec.block_size);
  const int64_t kv_bytes = ec.num_blocks * infer::KVCache::bytes_per_block(mc, ec.block_size, m.params().dtype());
  if (kv_cap_mb > 0 && kv_bytes > (kv_cap_mb << 20)) {
    const int64_t need_mb = (kv_bytes + (int64_t(1) << 20) - 1) >> 20;
    throw UsageError(str_cat("[generate] --kv-cache-mb ", kv_cap_mb, " is too small: ", ec.max_seq_len,
                             " tokens (the prompt's ", n_prompt, " + --max-tokens ", sp.max_tokens,
                             ", at most the model's context of ", ctx, ") need ", format_bytes(kv_bytes),
                             " of KV cache; give --kv-cache-mb ", need_mb, " or more, or lower --max-tokens"));
  }
  ec.detokenizer = [&](const std::vector<int32_t>& v) { return tok->decode(v); };
  ec.quant = im.quant_ptr();
  if (speculative) {
    ec.speculative = speculative->config;
    ec.speculative.max_batch = 0;  // one sequence
  }
  ec.tp = tp.group();
  infer::Engine engine(m, ec);
  if (!tp.leader()) {
    engine.follow();
    return 0;
  }
  std::fprintf(stderr, "[generate] %s from %s, %s, tokenizer %s, %zu prompt tokens, KV cache %s%s\n",
               mc.summary().c_str(), path.c_str(), im.precision().c_str(), tok_name.c_str(), ids.size(),
               format_bytes(kv_bytes).c_str(), tp.size > 1 ? str_cat(", tensor-parallel over ", tp.size, " ranks").c_str() : "");
  std::fwrite(prompt.data(), 1, prompt.size(), stdout);
  // Each token's bytes as it arrives: decoding is a concatenation of per-token bytes, so the
  // output equals the decoded whole (a character split across tokens completes on the terminal).
  std::vector<int32_t> context = ids;
  for (int64_t round = 0, remaining = sp.max_tokens; remaining > 0; ++round) {
    infer::SamplingParams rp = sp;
    rp.max_tokens = std::min<int64_t>(remaining, ctx - int64_t(context.size()));
    rp.seed = seed + uint64_t(round);  // each window its own, reproducible stream
    const infer::RequestOutput r = engine.run(context, rp, [&](const infer::TokenEvent& e) {
      if (e.token < 0) return;
      const std::string bytes = tok->decode(std::span<const int32_t>(&e.token, 1));
      std::fwrite(bytes.data(), 1, bytes.size(), stdout);
      std::fflush(stdout);
    });
    if (r.finish_reason == infer::FinishReason::error) {
      engine.close();
      std::printf("\n");
      std::fflush(stdout);
      fail("generate", r.error, "; ", non_finite_weights(m, path));
    }
    remaining -= int64_t(r.tokens.size());
    if (r.finish_reason != infer::FinishReason::length || !window) break;
    context.insert(context.end(), r.tokens.begin(), r.tokens.end());
    context.erase(context.begin(), context.end() - std::min<int64_t>(int64_t(context.size()), ctx / 2));
  }
  engine.close();
  std::printf("\n");
  if (speculative) {
    const infer::EngineMetrics mt = engine.metrics();
    const int64_t forwards = mt.decode_rows + mt.spec_verifications;  // decoding steps of the target
    std::fprintf(stderr, "[generate] speculative %s: %lld of %lld proposals accepted (%.1f%%), %.2f tokens per "
                 "target forward\n", ec.speculative.describe().c_str(), (long long)mt.spec_accepted,
                 (long long)mt.spec_proposed, mt.spec_proposed ? 100.0 * double(mt.spec_accepted) / double(mt.spec_proposed) : 0.0,
                 forwards ? double(forwards + mt.spec_accepted) / double(forwards) : 0.0);
  }
  return 0;
}

}  // namespace loom::cli

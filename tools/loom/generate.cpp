// `loom generate --model PATH --prompt TEXT [--chat]`: streams a continuation of the prompt (or,
// with --chat, the model's reply to it as a user message, through the model's chat template)
// from a trained checkpoint, a GGUF file or a Hugging Face directory, on the inference engine
// (paged KV cache). Same seed, same output. Outputs
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
#include "loom/serve/chat_template.h"
#include "loom/serve/text_stream.h"
#include "loom/serve/tokenizer.h"
#include "tools/loom/commands.h"
#include "tools/loom/inference_model.h"

namespace loom::cli {

namespace {
// The sampling options, refused with the ranges the server's requests have (infer/sampler.h).
struct SamplingOptions {
  int64_t max_tokens = 200, top_k = 0;
  double temperature = 0.8, top_p = 1.0;
  std::vector<std::string> stop;
};

void add_sampling_options(CLI::App& app, SamplingOptions& o) {
  // Ranges checked by sampling_params, in the words the server's requests get (infer/sampler.h).
  app.add_option("--max-tokens", o.max_tokens, "tokens to generate, at least 1");
  app.add_option("--temperature", o.temperature, "0 to 2; 0: greedy");
  app.add_option("--top-k", o.top_k, "sample from the K likeliest tokens (0 or -1: off)");
  app.add_option("--top-p", o.top_p, "nucleus sampling, 0 < P <= 1");
  app.add_option("--stop", o.stop, "stop before this text (repeatable)")->type_name("STRING");
}

infer::SamplingParams sampling_params(const SamplingOptions& o) {
  infer::SamplingParams sp;
  sp.max_tokens = o.max_tokens;
  sp.temperature = o.temperature;
  sp.top_p = o.top_p;
  for (const std::string& problem :
       {infer::max_tokens_problem(sp.max_tokens, "--max-tokens"),
        infer::temperature_problem(sp.temperature, "--temperature"), infer::top_k_problem(o.top_k, "--top-k"),
        infer::top_p_problem(sp.top_p, "--top-p")})
    if (!problem.empty()) throw UsageError("[generate] " + problem);
  sp.top_k = infer::user_top_k(o.top_k);
  sp.stop = o.stop;
  for (const auto& s : sp.stop)
    if (s.empty()) throw UsageError("[generate] --stop must not be empty");
  return sp;
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
      const double v =
          flat.dtype() == DType::f64 ? flat.data<double>()[p.offset + i] : double(flat.data<float>()[p.offset + i]);
      n += std::isfinite(v) ? 0 : 1;
    }
    if (n > 0 && first.empty()) first = str_cat(n, " of the ", p.numel(), " values of ", p.name);
    bad += n;
  }
  if (bad == 0)
    return str_cat("every weight of checkpoint ", checkpoint,
                   " is finite, so the forward pass overflowed; "
                   "the checkpoint is unstable: use an earlier one of its run");
  return str_cat("checkpoint ", checkpoint, " holds ", bad, " non-finite weight", bad == 1 ? "" : "s",
                 " (first: ", first,
                 "); it was probably saved after its training diverged: use an earlier "
                 "checkpoint of the run");
}
}  // namespace

int cmd_generate(const std::vector<std::string>& argv) {
  auto app = new_app("generate",
                     "Streams a continuation of the prompt to stdout (with --chat: the model's reply). PATH is a "
                     "GGUF file, a Hugging Face directory, a checkpoint (step_NNNNNN), a run directory holding them "
                     "(the newest valid one is used), or a `loom quantize` output; f32 weights are quantized on load "
                     "with --quant.");
  std::string checkpoint, prompt, tokenizer, speculative_text, system_prompt;
  bool chat = false;
  SamplingOptions sampling;
  int64_t seed = 0, kv_cap_mb = 0, threads = 0, tp_size = 1;
  bool no_window = false;
  QuantOptions quant_options;
  app->add_option("--model,--checkpoint", checkpoint, "the model")->type_name("PATH")->required();
  app->add_option("--prompt", prompt, "the text to continue (with --chat: the user's message)")->type_name("TEXT");
  app->add_flag("--chat", chat,
                "send the prompt as a user message through the model's chat template (ChatML for models without "
                "one) and print the reply");
  app->add_option("--system", system_prompt, "with --chat: a system message first")->type_name("TEXT");
  add_sampling_options(*app, sampling);
  app->add_option("--seed", seed, "sampling seed: same seed, same output");
  app->add_option("--tokenizer", tokenizer, "default: the model's own, or the one recorded at training time")
      ->check(one_of({"gpt2", "byte"}));
  app->add_flag("--no-window", no_window, "stop at the model's context instead of sliding the window");
  app->add_option("--kv-cache-mb", kv_cap_mb,
                  "the most KV cache to use (MiB); by default exactly what the prompt and --max-tokens need (at "
                  "most the model's context)")
      ->type_name("M")
      ->check(positive())
      ->default_str("");
  auto* threads_opt = app->add_option("--threads", threads, "compute threads (default: OMP_NUM_THREADS or all cores)")
                          ->check(positive())
                          ->default_str("");
  add_speculative_option(*app, speculative_text);
  add_quant_options(*app, quant_options);
  std::string lora;
  add_lora_option(*app, lora);
  add_tensor_parallel_option(*app, tp_size);
  if (auto rc = parse(*app, argv)) return *rc;
  // Every option is checked before the checkpoint is read.
  infer::SamplingParams sp = sampling_params(sampling);
  const bool window = !no_window;
  if (threads_opt->count()) set_num_threads(int(threads));
  const auto quant = quant_spec_from(quant_options);
  std::optional<SpeculativeSetup> speculative;
  if (!speculative_text.empty()) speculative = parse_speculative(speculative_text, "generate");

  const TensorParallel tp = tensor_parallel_from(tp_size, "generate", /*watchdog=*/true);
  FILE* log = tp.leader() ? stderr : nullptr;  // rank 0 prints; the others follow silently
  const InferenceModel im = load_inference_model(checkpoint, quant, log, false, tp.group(), lora);
  if (speculative) load_speculative_draft(*speculative, im, log);
  const model::Decoder& m = *im.model;
  const model::ModelConfig& mc = m.config();
  const std::string& path = im.checkpoint;

  const std::string tok_name = tokenizer.empty() ? im.tokenizer : tokenizer;
  const std::unique_ptr<serve::DataTokenizer> text_tok = serve::make_text_tokenizer(tok_name);
  const data::Tokenizer& tok = text_tok->tokenizer();
  if (!system_prompt.empty() && !chat) throw UsageError("[generate] --system goes with --chat");
  std::vector<int32_t> ids;
  std::shared_ptr<const serve::ChatFormat> format;
  if (chat) {
    format = serve::ChatFormat::for_model(im.chat_template, im.chat_template_source, im.bos_token, im.eos_token);
    std::vector<serve::ChatMessage> messages;
    if (!system_prompt.empty()) messages.push_back({"system", system_prompt});
    messages.push_back({"user", prompt});
    const std::string text = format->render(messages);
    ids = format->special_tokens() ? tok.encode_special(text) : tok.encode(text);
    for (const std::string& s : format->stop_strings()) sp.stop.push_back(s);
  } else {
    ids = tok.encode(prompt);
    if (tok.add_bos() && tok.bos_id()) ids.insert(ids.begin(), *tok.bos_id());
  }
  if (ids.empty() && tok.eot_id()) ids.push_back(*tok.eot_id());
  if (ids.empty())
    throw UsageError("[generate] --prompt is empty and this tokenizer has no end-of-text token to start from");

  const int64_t ctx = mc.n_ctx;
  const int64_t n_prompt = int64_t(ids.size());
  LOOM_CHECK(n_prompt < ctx, "generate", "the prompt is ", n_prompt, " tokens but the model's context is ", ctx,
             " tokens; shorten the prompt");
  sp.stop_token_ids = end_token_ids(im.end_ids, im.end_tokens, tok);
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
  ec.detokenizer = [&](const std::vector<int32_t>& v) { return tok.decode(v); };
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
  std::fprintf(stderr, "[generate] %s from %s, %s, tokenizer %s%s, %zu prompt tokens, KV cache %s%s\n",
               mc.summary().c_str(), path.c_str(), im.precision().c_str(), tok_name.c_str(),
               format ? (", chat format " + format->describe()).c_str() : "", ids.size(),
               format_bytes(kv_bytes).c_str(),
               tp.size > 1 ? str_cat(", tensor-parallel over ", tp.size, " ranks").c_str() : "");
  if (!chat) std::fwrite(prompt.data(), 1, prompt.size(), stdout);
  // The text as it grows, equal to decoding all the tokens at once: a continuation follows the
  // prompt, a reply reads on its own (serve/text_stream.h). Cut before a stop string, which ends
  // generation when the engine's own matching has not.
  serve::TextStream text(*text_tok, sp.stop, chat ? std::span<const int32_t>() : std::span<const int32_t>(ids));
  auto print = [](const std::string& s) {
    std::fwrite(s.data(), 1, s.size(), stdout);
    std::fflush(stdout);
  };
  std::vector<int32_t> context = ids;
  for (int64_t round = 0, remaining = sp.max_tokens; remaining > 0; ++round) {
    infer::SamplingParams rp = sp;
    rp.max_tokens = std::min<int64_t>(remaining, ctx - int64_t(context.size()));
    rp.seed = seed + uint64_t(round);  // each window its own, reproducible stream
    const infer::RequestOutput r = engine.run(context, rp, [&](const infer::TokenEvent& e) {
      if (e.token < 0 || text.stopped()) return;
      print(text.push_token(e.token));
      if (text.stopped()) engine.abort(e.request_id);
    });
    if (r.finish_reason == infer::FinishReason::error) {
      engine.close();
      print(text.finish());
      std::printf("\n");
      std::fflush(stdout);
      fail("generate", r.error, "; ", non_finite_weights(m, path));
    }
    remaining -= int64_t(r.tokens.size());
    if (r.finish_reason != infer::FinishReason::length || !window || text.stopped()) break;
    context.insert(context.end(), r.tokens.begin(), r.tokens.end());
    context.erase(context.begin(), context.end() - std::min<int64_t>(int64_t(context.size()), ctx / 2));
  }
  engine.close();
  print(text.finish());
  std::printf("\n");
  if (speculative) {
    const infer::EngineMetrics mt = engine.metrics();
    const int64_t forwards = mt.decode_rows + mt.spec_verifications;  // decoding steps of the target
    std::fprintf(stderr,
                 "[generate] speculative %s: %lld of %lld proposals accepted (%.1f%%), %.2f tokens per "
                 "target forward\n",
                 ec.speculative.describe().c_str(), (long long)mt.spec_accepted, (long long)mt.spec_proposed,
                 mt.spec_proposed ? 100.0 * double(mt.spec_accepted) / double(mt.spec_proposed) : 0.0,
                 forwards ? double(forwards + mt.spec_accepted) / double(forwards) : 0.0);
  }
  return 0;
}

}  // namespace loom::cli

// `loom generate --checkpoint DIR --prompt TEXT`: streams a continuation of the prompt from a
// trained model, on the inference engine (paged KV cache). Same seed, same output. Outputs
// longer than the model's context continue over a sliding window: when the context is full,
// generation restarts from the last half-context of tokens (as nanoGPT-style samplers crop).
#include <algorithm>
#include <cstdio>
#include <span>

#include "loom/core/threads.h"
#include "loom/data/tokenizer.h"
#include "loom/infer/engine.h"
#include "loom/train/checkpoint.h"
#include "tools/loom/commands.h"

namespace loom::cli {

namespace {
const char* kHelp =
    "usage: loom generate --checkpoint DIR --prompt TEXT [--max-tokens N] [--temperature T]\n"
    "                     [--top-k K] [--top-p P] [--seed S] [--stop STRING]... [--tokenizer NAME]\n\n"
    "Streams a continuation of TEXT to stdout. DIR is a checkpoint (step_NNNNNN) or a run\n"
    "directory holding them (the newest valid one is used).\n"
    "  --max-tokens 200  --temperature 0.8 (0: greedy)  --top-k 0 (off)  --top-p 1.0  --seed 0\n"
    "  --tokenizer       gpt2 or byte (default: the one recorded at training time)\n"
    "  --no-window       stop at the model's context instead of sliding the window\n";
}  // namespace

int cmd_generate(const std::vector<std::string>& argv) {
  Args a("generate", argv,
         {{"checkpoint", true}, {"prompt", true}, {"max-tokens", true}, {"temperature", true},
          {"top-k", true}, {"top-p", true}, {"seed", true}, {"stop", Args::kRepeated}, {"tokenizer", true},
          {"threads", true}, {"no-window", false}, {"help", false}});
  if (a.has("help")) {
    std::printf("%s", kHelp);
    return 0;
  }
  if (!a.has("checkpoint")) throw UsageError(std::string("[generate] --checkpoint is required\n\n") + kHelp);
  if (a.has("threads")) set_num_threads(int(a.get_int("threads", 0)));
  const std::string path = train::resolve_checkpoint(a.get("checkpoint", ""), stderr);
  const model::ModelConfig mc = train::checkpoint_model_config(path);
  model::DecoderOptions mopt;
  mopt.allocate_flat_grads = false;
  model::Decoder m(mc, mopt);
  train::load_checkpoint_weights(path, m, /*verified=*/true);  // by resolve_checkpoint

  const std::string tok_name = a.get("tokenizer", train::checkpoint_tokenizer(path));
  auto tok = data::make_tokenizer(tok_name);
  const std::string prompt = a.get("prompt", "");
  std::vector<int32_t> ids = tok->encode(prompt);
  if (ids.empty() && tok->eot_id()) ids.push_back(*tok->eot_id());
  if (ids.empty()) throw UsageError("[generate] --prompt is empty and this tokenizer has no end-of-text token to start from");

  const int64_t ctx = mc.n_ctx;
  LOOM_CHECK(int64_t(ids.size()) < ctx, "generate", "the prompt is ", ids.size(),
             " tokens but the model's context is ", ctx, " tokens; shorten the prompt");
  int64_t remaining = a.get_int("max-tokens", 200);
  const uint64_t seed = uint64_t(a.get_int("seed", 0));
  const bool window = !a.has("no-window");
  infer::SamplingParams sp;
  sp.temperature = a.get_double("temperature", 0.8);
  sp.top_k = a.get_int("top-k", 0);
  sp.top_p = a.get_double("top-p", 1.0);
  sp.stop = a.get_all("stop");
  if (tok->eot_id()) sp.stop_token_ids.push_back(*tok->eot_id());
  sp.max_tokens = std::max<int64_t>(1, remaining);
  sp.validate();

  infer::EngineConfig ec;
  ec.kv_cache_bytes = int64_t(64) << 20;
  ec.max_num_seqs = 1;
  ec.detokenizer = [&](const std::vector<int32_t>& v) { return tok->decode(v); };
  infer::Engine engine(m, ec);
  std::fprintf(stderr, "[generate] %s from %s, tokenizer %s, %zu prompt tokens\n", mc.summary().c_str(),
               path.c_str(), tok_name.c_str(), ids.size());
  std::fwrite(prompt.data(), 1, prompt.size(), stdout);
  // Each token's bytes as it arrives: decoding is a concatenation of per-token bytes, so the
  // output equals the decoded whole (a character split across tokens completes on the terminal).
  std::vector<int32_t> context = ids;
  for (int64_t round = 0; remaining > 0; ++round) {
    sp.max_tokens = std::min<int64_t>(remaining, ctx - int64_t(context.size()));
    sp.seed = seed + uint64_t(round);  // each window its own, reproducible stream
    const infer::RequestOutput r = engine.run(context, sp, [&](const infer::TokenEvent& e) {
      if (e.token < 0) return;
      const std::string bytes = tok->decode(std::span<const int32_t>(&e.token, 1));
      std::fwrite(bytes.data(), 1, bytes.size(), stdout);
      std::fflush(stdout);
    });
    remaining -= int64_t(r.tokens.size());
    if (r.finish_reason != infer::FinishReason::length || !window) break;
    context.insert(context.end(), r.tokens.begin(), r.tokens.end());
    context.erase(context.begin(), context.end() - std::min<int64_t>(int64_t(context.size()), ctx / 2));
  }
  std::printf("\n");
  return 0;
}

}  // namespace loom::cli

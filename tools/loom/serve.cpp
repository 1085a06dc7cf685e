// `loom serve`: the OpenAI-compatible HTTP server over the inference engine. Listens first
// (GET /health answers 503 while the model loads), then reports ready; SIGINT/SIGTERM stop
// it cleanly: new requests get 503, running ones may finish for --shutdown-grace seconds,
// the rest are aborted, and the process exits 0.
#include <algorithm>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <optional>

#include "loom/core/allocator.h"
#include "loom/core/error.h"
#include "loom/core/threads.h"
#include "loom/infer/engine.h"
#include "loom/model/decoder.h"
#include "loom/serve/api_server.h"
#include "loom/serve/infer_engine.h"
#include "loom/train/checkpoint.h"
#include "tools/loom/commands.h"
#include "tools/loom/inference_model.h"

namespace loom::cli {

namespace {

void print_help() {
  std::printf(
      "usage: loom serve (--checkpoint DIR | --model PRESET [--seed S]) [options]\n\n"
      "  --checkpoint DIR        a checkpoint (DIR/step_N), a run directory (its newest valid one), or\n"
      "                          a `loom quantize` output\n"
      "  --model PRESET          random weights of a preset (%s),\n"
      "                          vocabulary set to the tokenizer's (for tests and benchmarks)\n"
      "  --seed S                weight seed for --model; also seeds requests without one (default 0)\n"
      "  --tokenizer NAME        gpt2 or byte (default: byte for --model and 256-token vocabularies,\n"
      "                          else gpt2)\n"
      "  --data-dir DIR          where the gpt2 tokenizer files are (default: the data folder)\n"
      "  --n-ctx N               override the preset's context length\n"
      "  --host H                address to bind (default 127.0.0.1: loopback only)\n"
      "  --port P                port (default 8000; 0 picks a free one)\n"
      "  --api-key KEY           require 'Authorization: Bearer KEY' on /v1/*; the environment\n"
      "                          variable LOOM_API_KEY does the same without showing the key in ps\n"
      "  --max-queue N           requests allowed to wait beyond the running batch (default 256); then 429\n"
      "  --served-model-name S   the name clients pass as 'model' (default: the preset name)\n"
      "  --max-num-seqs N        sequences stepped together (default 32)\n"
      "  --kv-cache-mb M         KV-cache size (default 256, or one full-context request if that is more);\n"
      "                          must hold at least one full-context request\n"
      "  --max-body-bytes B      largest request body (default 1048576); then 413\n"
      "  --shutdown-grace S      seconds running requests may finish after SIGTERM (default 10)\n"
      "  --threads N             compute threads (default: OMP_NUM_THREADS or all cores)\n"
      "  --no-access-log         no per-request line on stderr (method, path, status, ms, tokens)\n"
      "%s%s%s",
      "e.g. gpt2-tiny, gpt2-shakespeare", kQuantHelp, kSpeculativeHelp, kTensorParallelHelp);
}

}  // namespace

int cmd_serve(const std::vector<std::string>& argv) {
  for (const auto& a : argv)
    if (a == "--help" || a == "-h") {
      print_help();
      return 0;
    }
  std::map<std::string, OptionKind> spec = {
      {"checkpoint", true}, {"model", true}, {"seed", true}, {"tokenizer", true}, {"data-dir", true},
      {"n-ctx", true}, {"host", true},
      {"port", true}, {"api-key", true}, {"max-queue", true}, {"served-model-name", true},
      {"max-num-seqs", true}, {"kv-cache-mb", true}, {"max-body-bytes", true},
      {"shutdown-grace", true}, {"threads", true}, {"no-access-log", false}, {"speculative", true},
      {"tp", true}};
  add_quant_options(spec);
  Args args("serve", argv, spec);
  const auto quant = quant_spec_from(args);
  std::optional<SpeculativeSetup> speculative;
  if (args.has("speculative")) speculative = parse_speculative(args.get("speculative", ""), "serve");
  if (args.has("checkpoint") == args.has("model"))
    throw UsageError("[serve] give exactly one of --checkpoint DIR or --model PRESET (see loom serve --help)");
  // The model: a verified checkpoint, or random weights of a preset.
  std::string checkpoint;
  model::ModelConfig mc;
  if (args.has("checkpoint")) {
    const std::string given = args.get("checkpoint", "");
    try {
      checkpoint = resolve_inference_checkpoint(given, stderr);
    } catch (const Error& e) {
      fail("serve", "--checkpoint ", given, ": ", e.what());
    }
    mc = train::checkpoint_model_config(checkpoint);
  } else {
    mc = model::preset(args.get("model", ""));
  }
  // The tokenizer: given, else the checkpoint's (train::checkpoint_tokenizer), else bytes.
  const std::string tok_name =
      args.get("tokenizer", checkpoint.empty() ? "byte" : train::checkpoint_tokenizer(checkpoint));
  std::unique_ptr<serve::DataTokenizer> tokenizer = serve::make_text_tokenizer(tok_name, args.get("data-dir", ""));
  if (checkpoint.empty()) mc.vocab_size = tokenizer->vocab_size();
  if (args.has("n-ctx")) {
    if (!checkpoint.empty()) throw UsageError("[serve] --n-ctx applies to --model only (a checkpoint keeps its context)");
    mc.n_ctx = args.get_int("n-ctx", mc.n_ctx);
  }
  mc.validate();
  serve::ServeOptions opt;
  opt.http.host = args.get("host", "127.0.0.1");
  opt.http.port = int(args.get_int("port", 8000));
  if (opt.http.port < 0 || opt.http.port > 65535) throw UsageError("[serve] --port must be in [0, 65535]");
  opt.http.limits.max_body_bytes = size_t(args.get_int("max-body-bytes", 1 << 20));
  const char* env_key = std::getenv("LOOM_API_KEY");
  if (args.has("api-key") && env_key && *env_key && args.get("api-key", "") != env_key)
    throw UsageError("[serve] --api-key and LOOM_API_KEY are both set and differ; give the key once");
  opt.api_key = args.get("api-key", env_key ? env_key : "");
  opt.http.access_log = !args.has("no-access-log");
  opt.max_queue = args.get_int("max-queue", 256);
  if (opt.max_queue < 0) throw UsageError("[serve] --max-queue must be >= 0");
  opt.served_model_name = args.get("served-model-name", mc.name);
  const double grace = args.get_double("shutdown-grace", 10);
  infer::EngineConfig ec;
  ec.max_num_seqs = args.get_int("max-num-seqs", 32);
  if (ec.max_num_seqs < 1) throw UsageError("[serve] --max-num-seqs must be at least 1");
  // The engine admits a request only if the cache can hold a full-context one (serve builds its
  // model in f32). By default the cache grows to that; a size given too small is refused here,
  // before anything is loaded.
  const int64_t full_context_bytes = infer::KVCache::blocks_for_tokens(mc.n_ctx, ec.block_size) *
                                     infer::KVCache::bytes_per_block(mc, ec.block_size, DType::f32);
  if (args.has("kv-cache-mb")) {
    const int64_t mb = args.get_int("kv-cache-mb", 0);
    if (mb < 1) throw UsageError(str_cat("[serve] --kv-cache-mb must be at least 1 (MiB), got ", mb));
    ec.kv_cache_bytes = mb << 20;
    if (ec.kv_cache_bytes < full_context_bytes)
      throw UsageError(str_cat("[serve] --kv-cache-mb ", mb, " is too small for one request of the model's full "
                               "context: ", mc.n_ctx, " tokens (model.n_ctx) need ", format_bytes(full_context_bytes),
                               " of KV cache; give --kv-cache-mb ", (full_context_bytes + (1 << 20) - 1) >> 20,
                               " or more"));
  } else {
    ec.kv_cache_bytes = std::max(int64_t(256) << 20, full_context_bytes);
  }
  ec.seed = uint64_t(args.get_int("seed", 0));
  opt.seed = ec.seed;
  if (args.has("threads")) set_num_threads(int(args.get_int("threads", 0)));

  // Signals are taken synchronously by this thread (sigwait), so every thread started from
  // here on inherits the blocked mask and no handler runs in the middle of anything.
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGINT);
  sigaddset(&stop_signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);
  std::signal(SIGPIPE, SIG_IGN);

  // Tensor parallel: the ranks other than 0 load their slice and step with rank 0 until it
  // stops; they bind no port, print nothing and leave the signals (blocked above) to rank 0.
  const TensorParallel tp = tensor_parallel_from(args, "serve", /*watchdog=*/false);
  ec.tp = tp.group();
  // Every rank loads its model (its slice) and the draft the same way; rank 0 logs it.
  auto load_model = [&](FILE* log) {
    return checkpoint.empty() ? random_inference_model(mc, ec.seed, quant, tp.group())
                              : load_inference_model(checkpoint, quant, log, /*resolved=*/true, tp.group());
  };
  auto configure = [&](const InferenceModel& im, FILE* log) {
    ec.quant = im.quant_ptr();
    if (speculative) {
      load_speculative_draft(*speculative, im, log);
      ec.speculative = speculative->config;
    }
  };
  if (!tp.leader()) {
    const InferenceModel im = load_model(nullptr);
    configure(im, nullptr);
    infer::Engine engine(*im.model, ec);
    engine.follow();
    return 0;
  }

  serve::ApiServer server(opt);
  server.start();
  std::printf("[serve] listening on http://%s:%d (loading %s from %s, tokenizer %s)\n", opt.http.host.c_str(),
              server.port(), mc.summary().c_str(), checkpoint.empty() ? "random weights" : checkpoint.c_str(),
              tok_name.c_str());
  std::fflush(stdout);

  const InferenceModel im = load_model(stderr);
  configure(im, stderr);
  infer::Engine engine(*im.model, ec);
  serve::InferEngineAdapter adapter(engine, *tokenizer);
  server.set_engine(&adapter);
  const int64_t full_context_blocks = infer::KVCache::blocks_for_tokens(mc.n_ctx, engine.kv_cache().block_size());
  std::printf("[serve] ready: model '%s' (%s), context %lld, KV cache %s (%lld blocks of %lld tokens: %.1f "
              "full-context requests), max %lld running + %lld queued%s%s%s\n",
              opt.served_model_name.c_str(), im.precision().c_str(), (long long)mc.n_ctx,
              format_bytes(engine.kv_cache().bytes()).c_str(),
              (long long)engine.kv_cache().num_blocks(), (long long)engine.kv_cache().block_size(),
              double(engine.kv_cache().num_blocks()) / double(full_context_blocks), (long long)ec.max_num_seqs,
              (long long)opt.max_queue, opt.api_key.empty() ? "" : ", API key required",
              speculative ? (", speculative " + ec.speculative.describe()).c_str() : "",
              tp.size > 1 ? str_cat(", tensor-parallel over ", tp.size, " ranks").c_str() : "");
  std::fflush(stdout);

  int sig = 0;
  sigwait(&stop_signals, &sig);
  std::printf("[serve] %s: stopping (running requests get up to %.0f s)\n", sig == SIGINT ? "SIGINT" : "SIGTERM",
              grace);
  std::fflush(stdout);
  server.stop(grace);
  infer::EngineMetrics m = engine.metrics();
  std::printf("[serve] stopped: %lld requests finished, %lld prompt + %lld generated tokens\n",
              (long long)m.requests_finished, (long long)m.prompt_tokens, (long long)m.generated_tokens);
  if (speculative)
    std::printf("[serve] speculative: %lld of %lld proposed tokens accepted\n", (long long)m.spec_accepted,
                (long long)m.spec_proposed);
  return 0;
}

}  // namespace loom::cli

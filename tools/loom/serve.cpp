// `loom serve`: the OpenAI-compatible HTTP server over the inference engine. Listens first
// (GET /health answers 503 while the model loads), then reports ready; SIGINT/SIGTERM stop
// it cleanly: new requests get 503, running ones may finish for --shutdown-grace seconds,
// the rest are aborted, and the process exits 0.
#include <algorithm>
#include <csignal>
#include <filesystem>
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
#include "loom/serve/cascade/center.h"
#include "loom/serve/cascade/edge.h"
#include "loom/serve/infer_engine.h"
#include "loom/model/checkpoint_reader.h"
#include "tools/loom/commands.h"
#include "tools/loom/inference_model.h"

namespace loom::cli {

namespace {

const char* const kCascadeHelp =
    "Edge/center cascade (docs/CASCADE.md):\n"
    "  --role center|edge      a cascade's center (publishes the edge models) or edge (answers what it is\n"
    "                          confident about, forwards the rest); default: neither\n"
    "  --model-version LABEL   the human version of the checkpoint (default: its VERSION file or step)\n"
    "  center: --edge-models int8=DIR,int4=DIR\n"
    "                          the small models edges download (`loom quantize` outputs); SIGHUP\n"
    "                          re-reads them, publishing a new version\n"
    "  edge:   --center URL    the center, e.g. http://198.18.0.11:8000 (required)\n"
    "          --confidence-threshold T\n"
    "                          answer when the mean probability of the first --window tokens is >= T\n"
    "                          (in [0, 1]; default 0.5), else forward to the center\n"
    "          --window N      tokens the confidence is measured over (default 16)\n"
    "          --center-down local|fail\n"
    "                          when the center cannot be reached: answer locally (default) or 503\n"
    "          --poll-interval S   seconds between manifest polls (default 10)\n"
    "          --cache-dir DIR     where downloaded models go (default: a temporary directory,\n"
    "                          removed at exit)\n"
    "          --edge-quant auto|int8|int4   weights to download (default auto: int4 on a slow link,\n"
    "                          --int4-below-mbps (50), --int4-above-rtt-ms (200), or when the int8\n"
    "                          model exceeds half of --memory-budget-mb (default: available memory))\n";

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
      "%s%s%s%s",
      "e.g. gpt2-tiny, gpt2-shakespeare", kQuantHelp, kSpeculativeHelp, kTensorParallelHelp, kCascadeHelp);
}

// A servable model: its weights, the engine stepping them and the server's adapter, owned
// together so that a cascade edge can replace all three between requests.
class ServedModel final : public serve::Engine {
 public:
  ServedModel(InferenceModel im, infer::EngineConfig ec, const serve::TextTokenizer& tok, std::string version)
      : im_(std::move(im)), ec_(with_quant(std::move(ec), im_)), engine_(*im_.model, ec_), adapter_(engine_, tok),
        version_(std::move(version)) {}
  const serve::TextTokenizer& tokenizer() const override { return adapter_.tokenizer(); }
  int64_t context_length() const override { return adapter_.context_length(); }
  int64_t max_running() const override { return adapter_.max_running(); }
  uint64_t submit(serve::GenerationRequest req, serve::TokenSink sink) override {
    return adapter_.submit(std::move(req), std::move(sink));
  }
  void abort(uint64_t id) override { adapter_.abort(id); }
  serve::EngineStats stats() const override { return adapter_.stats(); }
  std::string model_version() const override { return version_; }
  const InferenceModel& model() const { return im_; }
  infer::Engine& engine() { return engine_; }

 private:
  static infer::EngineConfig with_quant(infer::EngineConfig ec, const InferenceModel& im) {
    ec.quant = im.quant_ptr();
    return ec;
  }
  InferenceModel im_;
  infer::EngineConfig ec_;
  infer::Engine engine_;
  serve::InferEngineAdapter adapter_;
  std::string version_;
};

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
      {"tp", true}, {"role", true}, {"model-version", true}, {"edge-models", true}, {"center", true},
      {"confidence-threshold", true}, {"window", true}, {"center-down", true}, {"poll-interval", true},
      {"cache-dir", true}, {"edge-quant", true}, {"int4-below-mbps", true}, {"int4-above-rtt-ms", true},
      {"memory-budget-mb", true}};
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
    mc = model::checkpoint_model_config(checkpoint);
  } else {
    mc = model::preset(args.get("model", ""));
  }
  // The tokenizer: given, else the checkpoint's (model::checkpoint_tokenizer), else bytes.
  const std::string tok_name =
      args.get("tokenizer", checkpoint.empty() ? "byte" : model::checkpoint_tokenizer(checkpoint));
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

  // The cascade role's options, checked before anything loads.
  const std::string role = args.get("role", "");
  if (!role.empty() && role != "center" && role != "edge")
    throw UsageError(str_cat("[serve] --role ", role, ": expected center or edge"));
  opt.role = role;
  auto only_for = [&](const char* r, std::initializer_list<const char*> names) {
    for (const char* n : names)
      if (args.has(n) && role != r) throw UsageError(str_cat("[serve] --", n, " applies to --role ", r, " only"));
  };
  only_for("center", {"edge-models"});
  only_for("edge", {"center", "confidence-threshold", "window", "center-down", "poll-interval", "cache-dir",
                    "edge-quant", "int4-below-mbps", "int4-above-rtt-ms", "memory-budget-mb"});
  serve::cascade::EdgeOptions eo;
  if (role == "edge") {
    if (!args.has("center")) throw UsageError("[serve] --role edge needs --center URL (the center's http://host:port)");
    eo.center_url = args.get("center", "");
    serve::parse_url(eo.center_url);  // a bad URL fails now, naming it
    eo.threshold = args.get_double("confidence-threshold", 0.5);
    eo.window = args.get_int("window", 16);
    const std::string down = args.get("center-down", "local");
    if (down != "local" && down != "fail")
      throw UsageError(str_cat("[serve] --center-down ", down, ": expected local or fail"));
    eo.local_when_center_down = down == "local";
    eo.poll_interval_s = args.get_double("poll-interval", 10);
    eo.cache_dir = args.get("cache-dir", (std::filesystem::temp_directory_path() /
                                          str_cat("loom-edge-", ::getpid())).string());
    eo.api_key = opt.api_key;
    eo.quant = args.get("edge-quant", "auto");
    eo.int4_below_mbps = args.get_double("int4-below-mbps", 50);
    eo.int4_above_rtt_ms = args.get_double("int4-above-rtt-ms", 200);
    eo.memory_budget_bytes = args.get_int("memory-budget-mb", 0) << 20;
    eo.validate();
  }
  std::vector<serve::cascade::EdgeModelSource> edge_models;
  if (args.has("edge-models")) edge_models = serve::cascade::parse_edge_models(args.get("edge-models", ""));

  // Signals are taken synchronously by this thread (sigwait), so every thread started from
  // here on inherits the blocked mask and no handler runs in the middle of anything.
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGINT);
  sigaddset(&stop_signals, SIGTERM);
  if (role == "center") sigaddset(&stop_signals, SIGHUP);
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
  if (!role.empty() && tp.size > 1)
    throw UsageError("[serve] --role with --tp is not supported: a cascade's models are served by one process each");
  if (!tp.leader()) {
    const InferenceModel im = load_model(nullptr);
    configure(im, nullptr);
    infer::Engine engine(*im.model, ec);
    engine.follow();
    return 0;
  }

  // A cascade's versions: content hashes of the weights, config and tokenizer (docs/CASCADE.md).
  const std::string tok_hash = role.empty() ? "" : serve::cascade::tokenizer_hash(*tokenizer);
  serve::cascade::ModelVersion version;
  if (!role.empty())
    version = checkpoint.empty()
                  ? serve::cascade::ModelVersion{args.get("model-version", str_cat("random-seed", ec.seed)),
                                                 serve::cascade::version_hash(mc.summary(), std::to_string(ec.seed), tok_hash)}
                  : serve::cascade::checkpoint_version(checkpoint, tok_hash, args.get("model-version", ""));
  std::unique_ptr<serve::cascade::CenterPublisher> publisher;
  if (role == "center") {
    publisher = std::make_unique<serve::cascade::CenterPublisher>(opt.served_model_name, version, tok_name, tok_hash,
                                                                  edge_models);
    publisher->publish();
    for (auto& r : publisher->routes()) opt.routes.push_back(std::move(r));
  }

  serve::ApiServer server(opt);
  std::unique_ptr<serve::cascade::Edge> edge;
  if (role == "edge") {
    auto load_downloaded = [&](const std::string& dir, const serve::cascade::ModelVersion& v) {
      return std::make_shared<ServedModel>(load_inference_model(dir, std::nullopt, stderr, /*resolved=*/true), ec,
                                           *tokenizer, v.id());
    };
    edge = std::make_unique<serve::cascade::Edge>(eo, tok_hash, version, load_downloaded,
                                                  [&](std::shared_ptr<serve::Engine> e) { server.set_engine(std::move(e)); },
                                                  &server.metrics());
    server.set_edge(edge.get());
    server.add_route(edge->status_route());
  }
  server.start();
  std::printf("[serve] listening on http://%s:%d (loading %s from %s, tokenizer %s)\n", opt.http.host.c_str(),
              server.port(), mc.summary().c_str(), checkpoint.empty() ? "random weights" : checkpoint.c_str(),
              tok_name.c_str());
  std::fflush(stdout);

  InferenceModel loaded = load_model(stderr);
  configure(loaded, stderr);
  auto served = std::make_shared<ServedModel>(std::move(loaded), ec, *tokenizer, role.empty() ? "" : version.id());
  const InferenceModel& im = served->model();
  infer::Engine& engine = served->engine();
  server.set_engine(served);
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
  if (role == "center")
    std::printf("[serve] cascade center %s: manifest at /v1/cascade/manifest offers %zu edge model(s)\n",
                version.id().c_str(), edge_models.size());
  if (role == "edge")
    std::printf("[serve] cascade edge %s: center %s, confidence threshold %g over %lld tokens, center down: %s\n",
                version.id().c_str(), eo.center_url.c_str(), eo.threshold, (long long)eo.window,
                eo.local_when_center_down ? "answer locally" : "503");
  std::fflush(stdout);
  if (edge) edge->start();

  int sig = 0;
  while (true) {
    sigwait(&stop_signals, &sig);
    if (sig != SIGHUP) break;
    try {  // a center re-reads its edge models
      publisher->publish();
      std::printf("[serve] SIGHUP: republished the edge models: %s\n", publisher->manifest()["edge_models"].dump().c_str());
    } catch (const std::exception& e) {
      std::printf("[serve] SIGHUP: the edge models were not republished (the previous manifest stays): %s\n", e.what());
    }
    std::fflush(stdout);
  }
  std::printf("[serve] %s: stopping (running requests get up to %.0f s)\n", sig == SIGINT ? "SIGINT" : "SIGTERM",
              grace);
  std::fflush(stdout);
  if (edge) edge->stop();
  server.stop(grace);
  if (role == "edge" && !args.has("cache-dir")) {  // the default cache is this process's own
    std::error_code ec_rm;
    std::filesystem::remove_all(eo.cache_dir, ec_rm);
  }
  // An edge reports the model it ended on (requests served by models it replaced are not in it).
  const auto last = std::dynamic_pointer_cast<ServedModel>(server.engine());
  infer::EngineMetrics m = (last ? last->engine() : engine).metrics();
  std::printf("[serve] stopped: %lld requests finished, %lld prompt + %lld generated tokens\n",
              (long long)m.requests_finished, (long long)m.prompt_tokens, (long long)m.generated_tokens);
  if (speculative)
    std::printf("[serve] speculative: %lld of %lld proposed tokens accepted\n", (long long)m.spec_accepted,
                (long long)m.spec_proposed);
  return 0;
}

}  // namespace loom::cli

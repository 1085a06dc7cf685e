// `loom serve`: the OpenAI-compatible HTTP server over the inference engine. Listens first
// (GET /health answers 503 while the model loads), then reports ready; SIGINT/SIGTERM stop
// it cleanly: new requests get 503, running ones may finish for --shutdown-grace seconds,
// the rest are aborted, and the process exits 0.
#include <algorithm>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <optional>

#include "loom/core/allocator.h"
#include "loom/core/error.h"
#include "loom/core/threads.h"
#include "loom/data/tokenizer.h"
#include "loom/infer/engine.h"
#include "loom/infer/quant_checkpoint.h"
#include "loom/model/checkpoint_reader.h"
#include "loom/model/decoder.h"
#include "loom/serve/api_server.h"
#include "loom/serve/cascade/center.h"
#include "loom/serve/cascade/edge.h"
#include "loom/serve/chat_template.h"
#include "loom/serve/infer_engine.h"
#include "tools/loom/commands.h"
#include "tools/loom/inference_model.h"

namespace loom::cli {

namespace {

// A servable model: its weights, the engine stepping them and the server's adapter, owned
// together so that a cascade edge can replace all three between requests.
class ServedModel final : public serve::Engine {
 public:
  ServedModel(InferenceModel im, infer::EngineConfig ec, const serve::TextTokenizer& tok, std::string version,
              std::shared_ptr<const serve::ChatFormat> chat)
      : im_(std::move(im)),
        ec_(with_quant(std::move(ec), im_)),
        engine_(*im_.model, ec_),
        adapter_(engine_, tok),
        version_(std::move(version)),
        chat_(std::move(chat)) {}
  const serve::TextTokenizer& tokenizer() const override { return adapter_.tokenizer(); }
  int64_t context_length() const override { return adapter_.context_length(); }
  int64_t max_running() const override { return adapter_.max_running(); }
  uint64_t submit(serve::GenerationRequest req, serve::TokenEventSink sink) override {
    return adapter_.submit(std::move(req), std::move(sink));
  }
  void abort(uint64_t id) override { adapter_.abort(id); }
  serve::EngineStats stats() const override { return adapter_.stats(); }
  std::string model_version() const override { return version_; }
  std::shared_ptr<const serve::ChatFormat> chat_format() const override { return chat_; }
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
  std::shared_ptr<const serve::ChatFormat> chat_;
};

}  // namespace

int cmd_serve(const std::vector<std::string>& argv) {
  auto app = new_app("serve",
                     "OpenAI-compatible HTTP server (completions, chat, SSE, /metrics) of a checkpoint or of random "
                     "weights: loom serve (--checkpoint DIR | --model PRESET [--seed S]) [options].");
  std::string checkpoint_dir, preset, tokenizer_name, data_dir, api_key, served_model_name, speculative_text, role,
      model_version, edge_models_text, center, center_down = "local", cache_dir, edge_quant = "auto";
  int64_t seed = 0, n_ctx = 0, port = 8000, max_queue = 256, max_num_seqs = 32, kv_cache_mb = 256,
          max_body_bytes = 1 << 20, threads = 0, tp_size = 1, window = 16, memory_budget_mb = 0;
  double shutdown_grace = 10, confidence_threshold = 0.5, poll_interval = 10, int4_below_mbps = 50,
         int4_above_rtt_ms = 200;
  bool no_access_log = false;
  QuantOptions quant_options;
  serve::ServeOptions opt;
  opt.http.host = "127.0.0.1";
  app->add_option("--checkpoint", checkpoint_dir,
                  "a checkpoint (DIR/step_N), a run directory (its newest valid one), or a `loom quantize` output")
      ->type_name("DIR");
  app->add_option("--model", preset,
                  "a model on disk (a GGUF file, a Hugging Face directory, a checkpoint), or random weights of a "
                  "preset (e.g. gpt2-tiny, gpt2-shakespeare) with the vocabulary set to the tokenizer's (for tests "
                  "and benchmarks)")
      ->type_name("PATH|PRESET");
  app->add_option("--seed", seed, "weight seed for --model; also seeds requests without one");
  app->add_option("--tokenizer", tokenizer_name, "default: byte for --model and 256-token vocabularies, else gpt2")
      ->check(one_of({"gpt2", "byte"}));
  app->add_option("--data-dir", data_dir, "where the gpt2 tokenizer files are (default: the data folder)")
      ->type_name("DIR");
  app->add_option("--n-ctx", n_ctx, "override the preset's context length (--model only)")
      ->check(positive())
      ->default_str("");
  app->add_option("--host", opt.http.host, "address to bind (127.0.0.1: loopback only)")->type_name("H");
  app->add_option("--port", port, "port (0 picks a free one)")->check(in_range(0, 65535));
  app->add_option("--api-key", api_key,
                  "require 'Authorization: Bearer KEY' on /v1/*; the environment variable LOOM_API_KEY does the "
                  "same without showing the key in ps")
      ->type_name("KEY");
  app->add_option("--max-queue", max_queue, "requests allowed to wait beyond the running batch; then 429")
      ->check(non_negative());
  app->add_option("--served-model-name", served_model_name,
                  "the name clients pass as 'model' (default: the preset name)")
      ->type_name("S");
  app->add_option("--max-num-seqs", max_num_seqs, "sequences stepped together")->check(positive());
  app->add_option("--kv-cache-mb", kv_cache_mb,
                  "KV-cache size in MiB (default 256, or one full-context request if that is more); must hold at "
                  "least one full-context request")
      ->type_name("M")
      ->check(positive());
  app->add_option("--max-body-bytes", max_body_bytes, "largest request body; then 413")->check(positive());
  app->add_option("--shutdown-grace", shutdown_grace, "seconds running requests may finish after SIGTERM")
      ->check(non_negative());
  app->add_option("--threads", threads, "compute threads (default: OMP_NUM_THREADS or all cores)")
      ->check(positive())
      ->default_str("");
  app->add_flag("--no-access-log", no_access_log, "no per-request line on stderr (method, path, status, ms, tokens)");
  add_speculative_option(*app, speculative_text);
  add_quant_options(*app, quant_options);
  std::string lora;
  add_lora_option(*app, lora);
  add_tensor_parallel_option(*app, tp_size);
  const std::string cascade = "Edge/center cascade (docs/CASCADE.md)";
  app->add_option("--role", role,
                  "a cascade's center (publishes the edge models) or edge (answers what it is confident about, "
                  "forwards the rest); default: neither")
      ->check(one_of({"center", "edge"}))
      ->group(cascade);
  app->add_option("--model-version", model_version,
                  "the human version of the checkpoint (default: its VERSION file or step)")
      ->type_name("LABEL")
      ->group(cascade);
  app->add_option("--edge-models", edge_models_text,
                  "center: the small models edges download (`loom quantize` outputs); SIGHUP re-reads them, "
                  "publishing a new version")
      ->type_name("int8=DIR,int4=DIR")
      ->group(cascade);
  app->add_option("--center", center, "edge: the center, e.g. http://198.18.0.11:8000 (required)")
      ->type_name("URL")
      ->group(cascade);
  app->add_option("--confidence-threshold", confidence_threshold,
                  "edge: answer when the mean probability of the first --window tokens is >= T, else forward to "
                  "the center; in [0, 1], checked with the other edge options")
      ->type_name("T")
      ->group(cascade);
  app->add_option("--window", window, "edge: tokens the confidence is measured over")
      ->check(positive())
      ->group(cascade);
  app->add_option("--center-down", center_down, "edge: when the center cannot be reached, answer locally or 503")
      ->check(one_of({"local", "fail"}))
      ->group(cascade);
  app->add_option("--poll-interval", poll_interval, "edge: seconds between manifest polls")
      ->type_name("S")
      ->check(positive())
      ->group(cascade);
  app->add_option("--cache-dir", cache_dir,
                  "edge: where downloaded models go (default: a temporary directory, removed at exit)")
      ->type_name("DIR")
      ->group(cascade);
  app->add_option("--edge-quant", edge_quant,
                  "edge: weights to download (auto: int4 on a slow link, see --int4-below-mbps and "
                  "--int4-above-rtt-ms, or when the int8 model exceeds half of --memory-budget-mb)")
      ->check(one_of({"auto", "int8", "int4"}))
      ->group(cascade);
  app->add_option("--int4-below-mbps", int4_below_mbps, "edge: auto picks int4 below this bandwidth")
      ->check(non_negative())
      ->group(cascade);
  app->add_option("--int4-above-rtt-ms", int4_above_rtt_ms, "edge: auto picks int4 above this round trip")
      ->check(non_negative())
      ->group(cascade);
  app->add_option("--memory-budget-mb", memory_budget_mb, "edge: the memory models may take (0: available memory)")
      ->check(non_negative())
      ->group(cascade);
  if (auto rc = parse(*app, argv)) return *rc;
  if (!lora.empty() && checkpoint_dir.empty())
    throw UsageError(
        "[serve] --lora merges adapters into a model: give the model they were trained on as --checkpoint");
  auto given = [&](const std::string& name) { return app->count("--" + name) > 0; };
  const auto quant = quant_spec_from(quant_options);
  std::optional<SpeculativeSetup> speculative;
  if (given("speculative")) speculative = parse_speculative(speculative_text, "serve");
  if (given("checkpoint") == given("model"))
    throw UsageError("[serve] give exactly one of --checkpoint DIR or --model PATH|PRESET (see loom serve --help)");
  // --model names a model on disk (a GGUF file, a Hugging Face directory, a checkpoint) or a preset.
  const bool model_path = given("model") && std::filesystem::exists(preset);
  if (model_path) checkpoint_dir = preset;
  // The model: a verified checkpoint, a foreign model's card, or random weights of a preset.
  std::string checkpoint;
  model::ModelConfig mc;
  std::optional<model::ModelCard> card;
  if (given("checkpoint") || model_path) {
    const std::string& given_dir = checkpoint_dir;
    const char* flag = model_path ? "--model " : "--checkpoint ";
    try {
      checkpoint = resolve_inference_checkpoint(given_dir, stderr);
      if (!infer::is_quantized_checkpoint(checkpoint) && model::model_format(checkpoint) != model::ModelFormat::loom)
        card = model::read_model_card(checkpoint);
      mc = card ? card->config : model::checkpoint_model_config(checkpoint);
    } catch (const Error& e) {
      fail("serve", flag, given_dir, ": ", e.what());
    }
  } else {
    mc = model::preset(preset);
  }
  // The tokenizer: given, else the model's own or the one its checkpoint recorded, else bytes.
  const std::string tok_name = given("tokenizer")   ? tokenizer_name
                               : card               ? card->tokenizer
                               : checkpoint.empty() ? std::string("byte")
                                                    : model::checkpoint_tokenizer(checkpoint);
  std::unique_ptr<data::Tokenizer> data_tok = data::make_tokenizer(tok_name, data_dir);
  std::vector<int32_t> end_ids;
  // The chat files: the foreign model's, or those a converted checkpoint carries.
  model::ModelCard chat_card;
  if (card) {
    chat_card = *card;
  } else if (!checkpoint.empty()) {
    chat_card.config = mc;
    model::read_chat_files(checkpoint, chat_card);
  }
  end_ids = end_token_ids(chat_card.end_ids, chat_card.end_tokens, *data_tok);
  auto tokenizer = std::make_unique<serve::DataTokenizer>(std::move(data_tok), end_ids);
  // The chat template: the model's own, checked now so that a bad one fails before listening.
  const std::shared_ptr<const serve::ChatFormat> chat = serve::ChatFormat::for_model(
      chat_card.chat_template, chat_card.chat_template_source, chat_card.bos_token, chat_card.eos_token);
  if (checkpoint.empty()) mc.vocab_size = tokenizer->vocab_size();
  if (given("n-ctx")) {
    if (!checkpoint.empty())
      throw UsageError("[serve] --n-ctx applies to --model only (a checkpoint keeps its context)");
    mc.n_ctx = n_ctx;
  }
  mc.validate();
  opt.http.port = int(port);
  opt.http.limits.max_body_bytes = size_t(max_body_bytes);
  const char* env_key = std::getenv("LOOM_API_KEY");
  if (given("api-key") && env_key && *env_key && api_key != env_key)
    throw UsageError("[serve] --api-key and LOOM_API_KEY are both set and differ; give the key once");
  opt.api_key = given("api-key") ? api_key : env_key ? env_key : "";
  opt.http.access_log = !no_access_log;
  opt.max_queue = max_queue;
  opt.served_model_name = given("served-model-name") ? served_model_name : card ? card->name : mc.name;
  const double grace = shutdown_grace;
  infer::EngineConfig ec;
  ec.max_num_seqs = max_num_seqs;
  // The engine admits a request only if the cache can hold a full-context one (serve builds its
  // model in f32). By default the cache grows to that; a size given too small is refused here,
  // before anything is loaded.
  const int64_t full_context_bytes = infer::KVCache::blocks_for_tokens(mc.n_ctx, ec.block_size) *
                                     infer::KVCache::bytes_per_block(mc, ec.block_size, DType::f32);
  if (given("kv-cache-mb")) {
    const int64_t mb = kv_cache_mb;
    ec.kv_cache_bytes = mb << 20;
    if (ec.kv_cache_bytes < full_context_bytes)
      throw UsageError(str_cat("[serve] --kv-cache-mb ", mb,
                               " is too small for one request of the model's full "
                               "context: ",
                               mc.n_ctx, " tokens (model.n_ctx) need ", format_bytes(full_context_bytes),
                               " of KV cache; give --kv-cache-mb ", (full_context_bytes + (1 << 20) - 1) >> 20,
                               " or more"));
  } else {
    ec.kv_cache_bytes = std::max(int64_t(256) << 20, full_context_bytes);
  }
  ec.seed = uint64_t(seed);
  opt.seed = ec.seed;
  if (given("threads")) set_num_threads(int(threads));

  // The cascade role's options, checked before anything loads.
  opt.role = role;
  auto only_for = [&](const char* r, std::initializer_list<const char*> names) {
    for (const char* n : names)
      if (given(n) && role != r) throw UsageError(str_cat("[serve] --", n, " applies to --role ", r, " only"));
  };
  only_for("center", {"edge-models"});
  only_for("edge", {"center", "confidence-threshold", "window", "center-down", "poll-interval", "cache-dir",
                    "edge-quant", "int4-below-mbps", "int4-above-rtt-ms", "memory-budget-mb"});
  serve::cascade::EdgeOptions eo;
  if (role == "edge") {
    if (!given("center")) throw UsageError("[serve] --role edge needs --center URL (the center's http://host:port)");
    eo.center_url = center;
    serve::parse_url(eo.center_url);  // a bad URL fails now, naming it
    eo.threshold = confidence_threshold;
    eo.window = window;
    eo.local_when_center_down = center_down == "local";
    eo.poll_interval_s = poll_interval;
    eo.cache_dir = given("cache-dir")
                       ? cache_dir
                       : (std::filesystem::temp_directory_path() / str_cat("loom-edge-", ::getpid())).string();
    eo.api_key = opt.api_key;
    eo.quant = edge_quant;
    eo.int4_below_mbps = int4_below_mbps;
    eo.int4_above_rtt_ms = int4_above_rtt_ms;
    eo.memory_budget_bytes = memory_budget_mb << 20;
    eo.validate();
  }
  std::vector<serve::cascade::EdgeModelSource> edge_models;
  if (given("edge-models")) edge_models = serve::cascade::parse_edge_models(edge_models_text);

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
  const TensorParallel tp = tensor_parallel_from(tp_size, "serve", /*watchdog=*/false);
  ec.tp = tp.group();
  // Every rank loads its model (its slice) and the draft the same way; rank 0 logs it.
  auto load_model = [&](FILE* log) {
    return checkpoint.empty() ? random_inference_model(mc, ec.seed, quant, tp.group())
                              : load_inference_model(checkpoint, quant, log, /*resolved=*/true, tp.group(), lora);
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
    version =
        checkpoint.empty()
            ? serve::cascade::ModelVersion{given("model-version") ? model_version : str_cat("random-seed", ec.seed),
                                           serve::cascade::version_hash(mc.summary(), std::to_string(ec.seed),
                                                                        tok_hash)}
            : serve::cascade::checkpoint_version(checkpoint, tok_hash, model_version);
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
                                           *tokenizer, v.id(), chat);
    };
    edge = std::make_unique<serve::cascade::Edge>(
        eo, tok_hash, version, load_downloaded,
        [&](std::shared_ptr<serve::Engine> e) { server.set_engine(std::move(e)); }, &server.metrics());
    server.set_edge(edge.get());
    server.add_route(edge->status_route());
  }
  server.start();
  std::printf("[serve] listening on http://%s:%d (loading %s from %s, tokenizer %s, chat format %s)\n",
              opt.http.host.c_str(), server.port(), mc.summary().c_str(),
              checkpoint.empty() ? "random weights" : checkpoint.c_str(), tok_name.c_str(), chat->describe().c_str());
  std::fflush(stdout);

  InferenceModel loaded = load_model(stderr);
  configure(loaded, stderr);
  auto served =
      std::make_shared<ServedModel>(std::move(loaded), ec, *tokenizer, role.empty() ? "" : version.id(), chat);
  const InferenceModel& im = served->model();
  infer::Engine& engine = served->engine();
  server.set_engine(served);
  const int64_t full_context_blocks = infer::KVCache::blocks_for_tokens(mc.n_ctx, engine.kv_cache().block_size());
  std::printf(
      "[serve] ready: model '%s' (%s), context %lld, KV cache %s (%lld blocks of %lld tokens: %.1f "
      "full-context requests), max %lld running + %lld queued%s%s%s\n",
      opt.served_model_name.c_str(), im.precision().c_str(), (long long)mc.n_ctx,
      format_bytes(engine.kv_cache().bytes()).c_str(), (long long)engine.kv_cache().num_blocks(),
      (long long)engine.kv_cache().block_size(), double(engine.kv_cache().num_blocks()) / double(full_context_blocks),
      (long long)ec.max_num_seqs, (long long)opt.max_queue, opt.api_key.empty() ? "" : ", API key required",
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
      std::printf("[serve] SIGHUP: republished the edge models: %s\n",
                  publisher->manifest()["edge_models"].dump().c_str());
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
  if (role == "edge" && !given("cache-dir")) {  // the default cache is this process's own
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

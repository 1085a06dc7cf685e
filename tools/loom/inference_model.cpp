#include "tools/loom/inference_model.h"

#include <algorithm>
#include <filesystem>

#include "loom/core/error.h"
#include "loom/core/timer.h"
#include "loom/infer/quant_checkpoint.h"
#include "loom/model/checkpoint_reader.h"
#include "loom/model/lora_merge.h"
#include "tools/loom/model_card_files.h"

namespace loom::cli {

void add_quant_options(CLI::App& app, QuantOptions& o) {
  app.add_option("--quant", o.quant, "the block matrices and the head on load")
      ->check(one_of({"fp32", "bf16", "int8", "int4"}));
  app.add_option("--group", o.group, "weights per scale (default or 0: int8 one scale per row, int4 64)")
      ->check(non_negative())
      ->default_str("");
  app.add_option("--quant-head", o.head, "the LM head under --quant (int8: bf16 under --quant bf16)")
      ->check(one_of({"int8", "f32"}));
  app.add_flag("--zero-point", o.zero_point, "int4 with a zero point per group (asymmetric)");
}

std::optional<infer::QuantSpec> quant_spec_from(const QuantOptions& o) {
  return infer::parse_quant_spec(o.quant, o.group, o.head, o.zero_point);
}

std::string InferenceModel::precision() const { return quant ? quant->spec.describe() : "fp32"; }

namespace {
// gguf: the file the model was loaded from (whole, not a tensor-parallel slice), whose Q8_0,
// Q4_0 and Q4_1 blocks are kept as they are where the spec's format holds them.
void quantize_on_load(InferenceModel& m, const infer::QuantSpec& spec, FILE* log, const io::GgufFile* gguf = nullptr) {
  Stopwatch sw;
  std::string how;
  m.quant = gguf ? infer::QuantizedModel::from_gguf(*m.model, *gguf, spec, &how)
                 : infer::QuantizedModel::quantize(*m.model, spec);
  if (log)
    std::fprintf(log, "[quant] %s: %s, matrices %.1f MB, kernels %s (%.2f s)%s%s\n",
                 m.checkpoint.empty() ? "random weights" : m.checkpoint.c_str(), spec.describe().c_str(),
                 double(m.quant->bytes()) / 1e6, cpu::quant_linear_path(spec.format).c_str(), sw.seconds(),
                 how.empty() ? "" : "; ", how.c_str());
}

model::DecoderOptions inference_options(const comm::Group* tp = nullptr);
std::unique_ptr<model::Decoder> tp_slice(const model::ModelConfig& cfg, const comm::Group& tp);

// A GGUF file or a Hugging Face directory: its card, then its weights (whole, or this rank's
// tensor-parallel slice of them), quantized on load when asked.
// A checkpoint's own chat files (one `loom convert` wrote carries its model's template and end
// tokens); none for checkpoints loom trained.
void take_chat(InferenceModel& m, const model::ModelCard& c) {
  m.chat_template = c.chat_template;
  m.chat_template_source = c.chat_template_source;
  m.bos_token = c.bos_token;
  m.eos_token = c.eos_token;
  m.end_ids = c.end_ids;
  m.end_tokens = c.end_tokens;
}

void read_checkpoint_chat(InferenceModel& m) {
  model::ModelCard c;
  c.config = m.model->config();
  model::read_chat_files(m.checkpoint, c);
  take_chat(m, c);
}

InferenceModel load_foreign_model(const std::string& path, const std::optional<infer::QuantSpec>& quant, FILE* log,
                                  const comm::Group* tp) {
  InferenceModel m;
  const model::ModelCard card = model::read_model_card(path);
  m.checkpoint = path;
  m.format = card.format;
  m.name = card.name;
  m.tokenizer = card.tokenizer;
  take_chat(m, card);
  std::string how;
  if (tp) {
    m.model = tp_slice(card.config, *tp);
    model::Decoder whole(card.config, inference_options());
    how = model::load_model_weights(path, card, whole);
    model::slice_whole_params(whole.layout(), whole.params(), m.model->layout(), m.model->params());
  } else {
    m.model = std::make_unique<model::Decoder>(card.config, inference_options());
    how = model::load_model_weights(path, card, *m.model);
  }
  if (log)
    std::fprintf(log, "[model] %s (%s): %s, %.1fM parameters; weights %s\n", m.name.c_str(),
                 model::model_format_name(card.format), card.config.summary().c_str(),
                 double(m.model->num_params()) / 1e6, how.c_str());
  if (!quant) return m;
  infer::QuantSpec spec = *quant;
  if (card.format == model::ModelFormat::gguf && spec.default_group && spec.format != cpu::QuantFormat::bf16)
    spec.group = 32;  // GGUF's block: Q8_0, Q4_0 and Q4_1 weights stay as they are
  quantize_on_load(m, spec, log, card.format == model::ModelFormat::gguf && !tp ? card.gguf.get() : nullptr);
  return m;
}

model::DecoderOptions inference_options(const comm::Group* tp) {
  model::DecoderOptions opt;
  opt.allocate_flat_grads = false;  // inference only
  if (tp) {
    opt.slice.tp = tp->size();
    opt.slice.tp_rank = tp->rank();
  }
  return opt;
}

// The model's tensor-parallel slice for this rank, checked as the engine will check it.
std::unique_ptr<model::Decoder> tp_slice(const model::ModelConfig& cfg, const comm::Group& tp) {
  model::check_tensor_parallel(cfg, tp.size(), "--tp");
  auto m = std::make_unique<model::Decoder>(cfg, inference_options(&tp));
  infer::ModelRunner::kv_cache_config(*m);  // the kv-head split, MoE
  return m;
}
}  // namespace

std::vector<int32_t> end_token_ids(const std::vector<int32_t>& ids, const std::vector<std::string>& texts,
                                   const data::Tokenizer& tok) {
  std::vector<int32_t> out;
  auto add = [&](int32_t id) {
    if (id >= 0 && id < tok.vocab_size() && std::find(out.begin(), out.end(), id) == out.end()) out.push_back(id);
  };
  for (int32_t id : ids) add(id);
  for (const std::string& t : texts)
    if (const auto id = tok.token_id(t)) add(*id);
  if (const auto eos = tok.eos_id()) add(*eos);
  return out;
}

void add_tensor_parallel_option(CLI::App& app, int64_t& size) {
  app.add_option("--tp", size,
                 "tensor-parallel over N processes: run as loom launch --nproc N -- <command> --tp N (rank 0 "
                 "prints and serves; N must divide the attention and key/value heads)")
      ->type_name("N")
      ->check(positive());
}

TensorParallel tensor_parallel_from(int64_t size, const std::string& cmd, bool watchdog) {
  TensorParallel t;
  t.size = size;
  if (t.size < 1) throw UsageError(str_cat("[", cmd, "] --tp must be at least 1, got ", t.size));
  if (t.size == 1) return t;
  comm::WorldOptions wo;
  if (!watchdog) wo.watchdog_timeout_s = 0;
  t.world = std::make_unique<comm::World>(wo);
  if (t.world->size() != t.size)
    throw UsageError(str_cat("[", cmd, "] --tp ", t.size, " needs ", t.size, " processes, one per slice, but ",
                             t.world->size(), " ", t.world->size() == 1 ? "is" : "are",
                             " running; start it as "
                             "loom launch --nproc ",
                             t.size, " -- ", cmd, " ... --tp ", t.size));
  return t;
}

std::string resolve_inference_checkpoint(const std::string& dir, FILE* log) {
  if (infer::is_quantized_checkpoint(dir) || model::model_format(dir) != model::ModelFormat::loom) return dir;
  return model::resolve_checkpoint(dir, log);
}

InferenceModel random_inference_model(const model::ModelConfig& cfg, uint64_t seed,
                                      const std::optional<infer::QuantSpec>& quant, const comm::Group* tp) {
  InferenceModel m;
  m.model = tp ? tp_slice(cfg, *tp) : std::make_unique<model::Decoder>(cfg, inference_options());
  m.model->init_weights(seed);
  if (quant) quantize_on_load(m, *quant, stderr);
  return m;
}

// A LoRA checkpoint's adapters merged into their frozen model: `base` (--model beside --lora), or
// the model the checkpoint records; either must be the one they were trained on (SHA-256). The
// model is loaded whole in f32, merged, then sliced and quantized as any model.
static InferenceModel load_lora_model(const std::string& dir, std::string base,
                                      const std::optional<infer::QuantSpec>& quant, FILE* log, const comm::Group* tp) {
  const model::LoraCheckpoint c = model::read_lora_checkpoint(dir);
  if (base.empty()) {
    LOOM_CHECK(c.base_sha256.rfind("seed ", 0) != 0, "lora", dir, "'s adapters were trained on ", c.base,
               ", which no file holds: train them from a model (model.init_from) to run them");
    LOOM_CHECK(std::filesystem::exists(c.base), "lora", dir, "'s adapters belong to ", c.base,
               ", which is not there (trainer_state.json \"lora\" names it); put the model back at that path, or "
               "give it as --model PATH --lora ",
               dir);
    base = c.base;
  }
  // A loom base is resolved (and verified) once, here; load_inference_model takes it as resolved.
  const bool loom_base = model::model_format(base) == model::ModelFormat::loom;
  const std::string resolved = loom_base ? model::resolve_checkpoint(base, log) : base;
  const std::string sha = model::weights_sha256(resolved);
  LOOM_CHECK(sha == c.base_sha256, "lora", dir, "'s adapters were trained on ", c.base, " (sha256 ",
             c.base_sha256.substr(0, 12), "), but ", base, " has sha256 ", sha.substr(0, 12),
             ": it is another model; give the one they were trained on");
  InferenceModel m = load_inference_model(resolved, std::nullopt, log, /*resolved=*/loom_base);
  const std::string merged = model::merge_lora(c, *m.model);
  if (log) std::fprintf(log, "[model] LoRA adapters of %s merged (%s)\n", dir.c_str(), merged.c_str());
  m.checkpoint = dir;
  m.name = std::filesystem::path(dir).lexically_normal().filename().string();
  if (tp) {
    std::unique_ptr<model::Decoder> slice = tp_slice(m.model->config(), *tp);
    model::slice_whole_params(m.model->layout(), m.model->params(), slice->layout(), slice->params());
    m.model = std::move(slice);
  }
  if (quant) quantize_on_load(m, *quant, log);
  return m;
}

void add_lora_option(CLI::App& app, std::string& dir) {
  app.add_option("--lora", dir,
                 "LoRA adapters (a checkpoint or run directory of a model.lora run) merged into the model at load; "
                 "the model must be the one they were trained on (checked by SHA-256). A LoRA checkpoint given as "
                 "the model itself merges into the model it records")
      ->type_name("DIR");
}

InferenceModel load_inference_model(const std::string& dir, const std::optional<infer::QuantSpec>& quant, FILE* log,
                                    bool resolved, const comm::Group* tp, const std::string& lora) {
  if (!lora.empty()) {
    LOOM_CHECK(!infer::is_quantized_checkpoint(dir), "lora", dir,
               " is a quantized checkpoint; LoRA adapters merge into the f32 model they were trained on (add "
               "--quant to quantize the merged model on load)");
    const std::string adapters = model::resolve_checkpoint(lora, log);
    LOOM_CHECK(model::is_lora_checkpoint(adapters), "lora", "--lora ", lora, ": ", adapters,
               " holds no LoRA adapters (no adapter_config.json); give a checkpoint of a model.lora run");
    return load_lora_model(adapters, dir, quant, log, tp);
  }
  InferenceModel m;
  if (infer::is_quantized_checkpoint(dir)) {
    LOOM_CHECK(!tp, "infer", dir,
               " is a quantized checkpoint; tensor-parallel inference slices an f32 one: give "
               "the checkpoint it was made from, with --quant to quantize each slice on load");
    infer::QuantizedCheckpoint q = infer::load_quantized_checkpoint(dir);
    LOOM_CHECK(!quant || quant->describe() == q.quant.spec.describe(), "quant", dir, " is already quantized (",
               q.quant.spec.describe(), "); drop --quant ", quant ? quant->describe() : "",
               " or quantize the original checkpoint ", q.source);
    m.model = std::move(q.model);
    m.quant = std::move(q.quant);
    m.checkpoint = dir;
    m.name = std::filesystem::path(dir).lexically_normal().filename().string();
    m.tokenizer = model::checkpoint_tokenizer(dir);
    read_checkpoint_chat(m);
    return m;
  }
  if (model::model_format(dir) != model::ModelFormat::loom) return load_foreign_model(dir, quant, log, tp);
  m.checkpoint = resolved ? dir : model::resolve_checkpoint(dir, log);
  if (model::is_lora_checkpoint(m.checkpoint)) return load_lora_model(m.checkpoint, "", quant, log, tp);
  m.name = std::filesystem::path(m.checkpoint).lexically_normal().filename().string();
  const model::ModelConfig cfg = model::checkpoint_model_config(m.checkpoint);
  if (tp) {
    m.model = tp_slice(cfg, *tp);
    model::Decoder whole(cfg, inference_options());
    model::read_checkpoint_weights(m.checkpoint, whole, /*verified=*/true);  // by resolve_checkpoint
    model::slice_whole_params(whole.layout(), whole.params(), m.model->layout(), m.model->params());
  } else {
    m.model = std::make_unique<model::Decoder>(cfg, inference_options());
    model::read_checkpoint_weights(m.checkpoint, *m.model, /*verified=*/true);  // by resolve_checkpoint
  }
  m.tokenizer = model::checkpoint_tokenizer(m.checkpoint);
  read_checkpoint_chat(m);
  if (quant) quantize_on_load(m, *quant, log);
  return m;
}

InferenceModel write_quantized_checkpoint(const std::string& src, const infer::QuantSpec& spec, const std::string& out,
                                          FILE* log) {
  LOOM_CHECK(!infer::is_quantized_checkpoint(src), "quantize", src,
             " is already quantized; quantize the checkpoint or model it came from");
  // A loom checkpoint is resolved (and verified) once, here, to see whether it holds adapters.
  const bool loom_src = model::model_format(src) == model::ModelFormat::loom;
  const std::string resolved = loom_src ? model::resolve_checkpoint(src, log) : src;
  LOOM_CHECK(!loom_src || !model::is_lora_checkpoint(resolved), "quantize", src,
             " holds LoRA adapters; write the merged model first (loom export --merge-lora --format hf), then "
             "quantize that, or serve the adapters with --quant");
  InferenceModel m = load_inference_model(resolved, spec, log, /*resolved=*/loom_src);
  if (m.format == model::ModelFormat::loom) {
    infer::save_quantized_checkpoint(out, m.checkpoint, *m.model, *m.quant);
    return m;
  }
  // A foreign model has no checkpoint directory to copy config.json and the tokenizer from:
  // they are written to one beside `out` first, and removed after.
  const std::filesystem::path card_dir = std::filesystem::absolute(out).lexically_normal().string() + ".card";
  std::error_code ec;
  std::filesystem::remove_all(card_dir, ec);
  std::filesystem::create_directories(card_dir, ec);
  LOOM_CHECK(!ec, "quantize", "cannot create ", card_dir.string(), ": ", ec.message());
  try {
    write_card_files(src, model::read_model_card(src), card_dir);
    infer::save_quantized_checkpoint(out, card_dir.string(), *m.model, *m.quant);
  } catch (...) {
    std::filesystem::remove_all(card_dir, ec);
    throw;
  }
  std::filesystem::remove_all(card_dir, ec);
  return m;
}

void add_speculative_option(CLI::App& app, std::string& text) {
  app.add_option("--speculative", text,
                 "speculative decoding (docs/INFERENCE.md): draft=DIR (a smaller checkpoint with the same "
                 "tokenizer) or ngram (prompt lookup), then ,k=N (proposals per step, default 4), ,n=N (n-gram "
                 "size, default 3), ,adaptive=on|off (k follows each request's acceptance; default on), "
                 ",max_batch=N (no proposals above N running sequences, default 8; 0: always), "
                 ",quant=int8|int4|bf16 (the draft); the output is the same as without")
      ->type_name("SPEC");
}

SpeculativeSetup parse_speculative(const std::string& text, const std::string& cmd) {
  SpeculativeSetup s;
  s.text = text;
  infer::SpeculativeConfig& c = s.config;
  auto bad = [&](const std::string& why) {
    return UsageError(
        str_cat("[", cmd, "] --speculative ", text, ": ", why,
                "; expected draft=DIR or ngram, then ,k=N ,n=N ,adaptive=on|off ,max_batch=N ,quant=NAME"));
  };
  auto number = [&](const std::string& key, const std::string& v, int64_t lo) {
    size_t used = 0;
    int64_t x = 0;
    try {
      x = std::stoll(v, &used);
    } catch (...) {
      used = 0;
    }
    if (used != v.size() || v.empty()) throw bad(str_cat(key, "=", v, " is not a whole number"));
    if (x < lo) throw bad(str_cat(key, "=", v, " must be at least ", lo));
    return x;
  };
  size_t at = 0;
  for (int item = 0; at <= text.size(); ++item) {
    const size_t comma = text.find(',', at);
    const std::string part = text.substr(at, comma == std::string::npos ? std::string::npos : comma - at);
    at = comma == std::string::npos ? text.size() + 1 : comma + 1;
    const size_t eq = part.find('=');
    const std::string key = part.substr(0, eq), value = eq == std::string::npos ? "" : part.substr(eq + 1);
    if (item == 0) {
      if (part == "ngram") {
        c.method = infer::SpecMethod::ngram;
      } else if (key == "draft" && !value.empty()) {
        c.method = infer::SpecMethod::draft;
        s.draft_dir = value;
      } else {
        throw bad(str_cat("it must start with draft=DIR or ngram, not '", part, "'"));
      }
      continue;
    }
    if (eq == std::string::npos) throw bad(str_cat("'", part, "' is not KEY=VALUE"));
    if (key == "k") {
      c.k = number(key, value, 1);
    } else if (key == "n" && c.method == infer::SpecMethod::ngram) {
      c.ngram_max = number(key, value, 1);
    } else if (key == "max_batch") {
      c.max_batch = number(key, value, 0);
    } else if (key == "adaptive" && (value == "on" || value == "off")) {
      c.adaptive = value == "on";
    } else if (key == "quant" && c.method == infer::SpecMethod::draft) {
      try {
        s.draft_quant = infer::parse_quant_spec(value);
      } catch (const std::exception& e) {
        throw bad(e.what());
      }
    } else {
      throw bad(str_cat("'", part, "' is not an option", key == "n" ? " of draft" : key == "quant" ? " of ngram" : ""));
    }
  }
  return s;
}

void load_speculative_draft(SpeculativeSetup& s, const InferenceModel& target, FILE* log) {
  if (s.config.method != infer::SpecMethod::draft) return;
  try {
    s.draft = load_inference_model(s.draft_dir, s.draft_quant, log);
  } catch (const Error& e) {
    fail("speculative", "the draft (draft=", s.draft_dir, "): ", e.what());
  }
  const InferenceModel& d = *s.draft;
  LOOM_CHECK(d.tokenizer.empty() || target.tokenizer.empty() || d.tokenizer == target.tokenizer, "speculative",
             "the draft ", d.checkpoint, " was trained with the ", d.tokenizer, " tokenizer but the target with ",
             target.tokenizer, "; a draft must share the target's tokenizer");
  const int64_t dp = d.model->num_params(), tp = target.model->num_params();
  if (log && dp >= tp)
    std::fprintf(log,
                 "[speculative] warning: the draft %s has %lld parameters, not fewer than the target's %lld: "
                 "proposing will cost more than it saves\n",
                 d.checkpoint.c_str(), (long long)dp, (long long)tp);
  s.config.draft = d.model.get();
  s.config.draft_quant = d.quant_ptr();
  if (log)
    std::fprintf(log, "[speculative] %s, draft %s (%s, %.1fM parameters, %s) for a %.1fM-parameter target\n",
                 s.config.describe().c_str(), d.checkpoint.c_str(), d.model->config().summary().c_str(),
                 double(dp) / 1e6, d.precision().c_str(), double(tp) / 1e6);
}

}  // namespace loom::cli

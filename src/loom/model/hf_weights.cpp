// Mapping between loom's decoder and Hugging Face checkpoints: config.json fields and
// model.safetensors names/layouts. Errors start with "[hf] <file>:" and name the key or tensor.
#include "loom/model/hf_weights.h"

#include <algorithm>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <set>

#include "loom/core/error.h"
#include "loom/io/file.h"
#include "loom/io/safetensors.h"

namespace loom::model {

using nlohmann::json;

namespace {
json rope_scaling_json(const RopeScaling& s);
}

// ---- config.json -------------------------------------------------------------------------

std::string hf_config_json(const ModelConfig& cfg) {
  cfg.validate();
  json j;
  if (cfg.family == Family::gpt2) {
    j = {{"architectures", {"GPT2LMHeadModel"}},
         {"model_type", "gpt2"},
         {"vocab_size", cfg.vocab_size},
         {"n_positions", cfg.n_ctx},
         {"n_ctx", cfg.n_ctx},
         {"n_embd", cfg.d_model},
         {"n_layer", cfg.n_layer},
         {"n_head", cfg.n_head},
         // HF reads null as 4 * n_embd.
         {"n_inner", cfg.d_ff == 4 * cfg.d_model ? json(nullptr) : json(cfg.d_ff)},
         {"activation_function", "gelu_new"},  // the tanh approximation loom computes
         {"layer_norm_epsilon", cfg.norm_eps},
         {"tie_word_embeddings", cfg.tied_embeddings},
         {"torch_dtype", "float32"}};
  } else {
    j = {{"architectures", {"LlamaForCausalLM"}},
         {"model_type", "llama"},
         {"vocab_size", cfg.vocab_size},
         {"hidden_size", cfg.d_model},
         {"intermediate_size", cfg.d_ff},
         {"num_hidden_layers", cfg.n_layer},
         {"num_attention_heads", cfg.n_head},
         {"num_key_value_heads", cfg.n_kv_head},
         {"head_dim", cfg.head_dim()},
         {"max_position_embeddings", cfg.n_ctx},
         {"rms_norm_eps", cfg.norm_eps},
         {"rope_theta", cfg.rope_theta},
         {"rope_scaling", rope_scaling_json(cfg.rope_scaling)},
         {"hidden_act", "silu"},
         {"attention_bias", false},
         {"mlp_bias", false},
         {"tie_word_embeddings", cfg.tied_embeddings},
         {"torch_dtype", "float32"}};
    if (cfg.qkv_bias) {
      LOOM_CHECK(!cfg.moe.enabled(), "hf", "q/k/v biases with experts have no config.json form");
      j["architectures"] = {"Qwen2ForCausalLM"};
      j["model_type"] = "qwen2";
      j.erase("attention_bias");
      j.erase("mlp_bias");
      j.erase("head_dim");
      j["use_sliding_window"] = false;
    }
  }
  if (cfg.moe.enabled()) {
    const MoeConfig& m = cfg.moe;
    if (cfg.family == Family::llama) {
      // Mixtral's keys; intermediate_size is the experts' width there.
      j["architectures"] = {"MixtralForCausalLM"};
      j["model_type"] = "mixtral";
      j["intermediate_size"] = cfg.expert_d_ff();
      j["num_local_experts"] = m.num_experts;
      j["num_experts_per_tok"] = m.top_k;
      j["router_aux_loss_coef"] = m.router_aux_loss_coef;
      j["output_router_logits"] = false;
      j.erase("mlp_bias");
      j.erase("attention_bias");
    }
    // What Mixtral's config cannot say (and all of it for GPT-2): loom's own object. A file
    // with shared experts, dense blocks or sigmoid scores loads in loom, not in transformers.
    j["loom_moe"] = {{"num_experts", m.num_experts},
                     {"top_k", m.top_k},
                     {"expert_d_ff", cfg.expert_d_ff()},
                     {"dense_d_ff", cfg.d_ff},
                     {"num_shared_experts", m.num_shared_experts},
                     {"moe_every", m.moe_every},
                     {"first_dense", m.first_dense},
                     {"capacity_factor", m.capacity_factor},
                     {"router_aux_loss_coef", m.router_aux_loss_coef},
                     {"router_z_loss_coef", m.router_z_loss_coef},
                     {"score", router_score_name(m.score)},
                     {"bias_update_rate", m.bias_update_rate}};
  }
  return j.dump(2) + "\n";
}

namespace {

// Typed access to config.json keys with errors that name the file and the key.
class ConfigReader {
 public:
  ConfigReader(const json& j, std::string source, const char* cls) : j_(j), src_(std::move(source)), cls_(cls) {}

  bool has(const char* key) const { return j_.contains(key) && !j_[key].is_null(); }
  int64_t integer(const char* key) const {
    need(key);
    LOOM_CHECK(j_[key].is_number_integer(), "hf", src_, ": ", key, " should be an integer, got ", j_[key].dump());
    return j_[key].get<int64_t>();
  }
  int64_t integer(const char* key, int64_t dflt) const { return has(key) ? integer(key) : dflt; }
  double number(const char* key, double dflt) const {
    if (!has(key)) return dflt;
    LOOM_CHECK(j_[key].is_number(), "hf", src_, ": ", key, " should be a number, got ", j_[key].dump());
    return j_[key].get<double>();
  }
  bool boolean(const char* key, bool dflt) const {
    if (!has(key)) return dflt;
    LOOM_CHECK(j_[key].is_boolean(), "hf", src_, ": ", key, " should be true or false, got ", j_[key].dump());
    return j_[key].get<bool>();
  }
  std::string text(const char* key, const std::string& dflt) const {
    if (!has(key)) return dflt;
    LOOM_CHECK(j_[key].is_string(), "hf", src_, ": ", key, " should be a string, got ", j_[key].dump());
    return j_[key].get<std::string>();
  }
  // A setting loom does not implement must hold the value loom's math assumes.
  template <class V>
  void require(const char* key, const V& want, const V& got, const char* why) const {
    LOOM_CHECK(got == want, "hf", src_, ": ", key, "=", json(got).dump(), " is not supported (", why,
               "); loom computes ", key, "=", json(want).dump());
  }
  const std::string& source() const { return src_; }
  const json& raw(const char* key) const {
    need(key);
    return j_[key];
  }

 private:
  void need(const char* key) const { LOOM_CHECK(has(key), "hf", src_, ": missing key '", key, "' (", cls_, ")"); }
  const json& j_;
  std::string src_;
  const char* cls_;
};

ModelConfig parse_gpt2(const ConfigReader& r) {
  ModelConfig c;
  c.family = Family::gpt2;
  c.vocab_size = r.integer("vocab_size");
  c.d_model = r.integer("n_embd");
  c.n_layer = r.integer("n_layer");
  c.n_head = c.n_kv_head = r.integer("n_head");
  c.n_ctx = r.integer("n_positions", r.integer("n_ctx", 1024));
  c.d_ff = r.integer("n_inner", 4 * c.d_model);
  c.norm_eps = r.number("layer_norm_epsilon", 1e-5);
  c.tied_embeddings = r.boolean("tie_word_embeddings", true);
  const std::string act = r.text("activation_function", "gelu_new");
  // All three are the tanh approximation; "gelu" is the exact erf form, which loom lacks.
  LOOM_CHECK(act == "gelu_new" || act == "gelu_pytorch_tanh" || act == "gelu_fast", "hf", r.source(),
             ": activation_function \"", act,
             "\" is not supported; loom's GPT-2 uses the tanh approximation (\"gelu_new\")");
  r.require("scale_attn_weights", true, r.boolean("scale_attn_weights", true),
            "attention scores are always divided by sqrt(head_dim)");
  r.require("scale_attn_by_inverse_layer_idx", false, r.boolean("scale_attn_by_inverse_layer_idx", false),
            "no per-layer score scaling");
  r.require("reorder_and_upcast_attn", false, r.boolean("reorder_and_upcast_attn", false), "no reordered attention");
  return c;
}

// rope_scaling: null, or {"rope_type" (older files: "type"): "linear" | "llama3", "factor", ...}.
RopeScaling parse_rope_scaling(const ConfigReader& r) {
  RopeScaling s;
  if (!r.has("rope_scaling")) return s;
  const json& j = r.raw("rope_scaling");
  LOOM_CHECK(j.is_object(), "hf", r.source(), ": rope_scaling should be an object or null, got ", j.dump());
  const ConfigReader k(j, r.source() + " rope_scaling", "rope_scaling");
  const std::string type = k.text("rope_type", k.text("type", ""));
  if (type == "default") return s;
  if (type == "linear") {
    s.type = RopeScaling::Type::linear;
  } else if (type == "llama3") {
    s.type = RopeScaling::Type::llama3;
    s.low_freq_factor = k.number("low_freq_factor", 1.0);
    s.high_freq_factor = k.number("high_freq_factor", 4.0);
    s.original_max_position = k.integer("original_max_position_embeddings", 8192);
  } else {
    fail("hf", r.source(), ": rope_scaling type \"", type,
         "\" is not supported (loom applies \"linear\" and \"llama3\"); loom would compute a different model");
  }
  LOOM_CHECK(k.has("factor"), "hf", r.source(), ": rope_scaling has no factor");
  s.factor = k.number("factor", 1.0);
  return s;
}

json rope_scaling_json(const RopeScaling& s) {
  switch (s.type) {
    case RopeScaling::Type::none: return nullptr;
    case RopeScaling::Type::linear: return {{"rope_type", "linear"}, {"factor", s.factor}};
    case RopeScaling::Type::llama3:
      return {{"rope_type", "llama3"},
              {"factor", s.factor},
              {"low_freq_factor", s.low_freq_factor},
              {"high_freq_factor", s.high_freq_factor},
              {"original_max_position_embeddings", s.original_max_position}};
    case RopeScaling::Type::factors: break;
  }
  fail("hf",
       "per-frequency RoPE factors (a GGUF's rope_freqs) have no config.json form; convert the Hugging Face "
       "checkpoint instead");
}

ModelConfig parse_llama(const ConfigReader& r);

// Qwen2 (Qwen2ForCausalLM): LLaMA blocks with biases on q, k and v.
ModelConfig parse_qwen2(const ConfigReader& r) {
  ModelConfig c = parse_llama(r);
  c.qkv_bias = true;
  if (r.boolean("use_sliding_window", false))
    r.require("sliding_window", c.n_ctx, r.integer("sliding_window", c.n_ctx),
              "a sliding window shorter than the context; loom attends to the whole context");
  return c;
}

ModelConfig parse_llama(const ConfigReader& r) {
  ModelConfig c;
  c.family = Family::llama;
  c.vocab_size = r.integer("vocab_size");
  c.d_model = r.integer("hidden_size");
  c.d_ff = r.integer("intermediate_size");
  c.n_layer = r.integer("num_hidden_layers");
  c.n_head = r.integer("num_attention_heads");
  c.n_kv_head = r.integer("num_key_value_heads", c.n_head);
  c.n_ctx = r.integer("max_position_embeddings", 2048);
  c.norm_eps = r.number("rms_norm_eps", 1e-6);  // LlamaConfig's default
  c.rope_theta = r.number("rope_theta", 10000.0);
  c.tied_embeddings = r.boolean("tie_word_embeddings", false);
  r.require("hidden_act", std::string("silu"), r.text("hidden_act", "silu"), "SwiGLU uses SiLU");
  if (r.text("model_type", "llama") != "qwen2")
    r.require("attention_bias", false, r.boolean("attention_bias", false), "no biases");
  r.require("mlp_bias", false, r.boolean("mlp_bias", false), "no biases");
  c.rope_scaling = parse_rope_scaling(r);
  if (r.has("head_dim") && c.n_head > 0)
    r.require("head_dim", c.d_model / c.n_head, r.integer("head_dim"),
              "head_dim must be hidden_size / num_attention_heads");
  return c;
}

// Mixtral (Jiang et al. 2024): LLaMA blocks whose MLPs are softmax top-k MoE layers.
ModelConfig parse_mixtral(const ConfigReader& r) {
  ModelConfig c = parse_llama(r);
  c.moe.num_experts = r.integer("num_local_experts");
  c.moe.top_k = r.integer("num_experts_per_tok");
  c.moe.expert_d_ff = c.d_ff;
  c.moe.router_aux_loss_coef = r.number("router_aux_loss_coef", 0.001);  // MixtralConfig's default
  LOOM_CHECK(!r.has("sliding_window"), "hf", r.source(),
             ": sliding_window attention is not supported (loom attends to the whole context)");
  return c;
}

}  // namespace

ModelConfig parse_hf_config(const std::string& json_text, const std::string& source) {
  json j;
  try {
    j = json::parse(json_text);
  } catch (const json::exception& e) {
    fail("hf", source, ": not valid JSON: ", e.what());
  }
  LOOM_CHECK(j.is_object(), "hf", source, ": expected a JSON object");
  const ConfigReader any(j, source, "config.json");
  const std::string type = any.text("model_type", "");
  ModelConfig c;
  if (type == "gpt2")
    c = parse_gpt2(ConfigReader(j, source, "GPT2Config"));
  else if (type == "llama")
    c = parse_llama(ConfigReader(j, source, "LlamaConfig"));
  else if (type == "mixtral")
    c = parse_mixtral(ConfigReader(j, source, "MixtralConfig"));
  else if (type == "qwen2")
    c = parse_qwen2(ConfigReader(j, source, "Qwen2Config"));
  else
    fail("hf", source, ": model_type \"", type,
         "\" is not supported (loom reads \"gpt2\", "
         "\"llama\", \"qwen2\" and \"mixtral\")");
  if (j.contains("loom_moe")) {
    LOOM_CHECK(j["loom_moe"].is_object(), "hf", source, ": loom_moe should be an object");
    const ConfigReader r(j["loom_moe"], source + " loom_moe", "loom MoE");
    MoeConfig& m = c.moe;
    m.num_experts = r.integer("num_experts");
    m.top_k = r.integer("top_k");
    m.expert_d_ff = r.integer("expert_d_ff");
    c.d_ff = r.integer("dense_d_ff", c.d_ff);
    m.num_shared_experts = r.integer("num_shared_experts", 0);
    m.moe_every = r.integer("moe_every", 1);
    m.first_dense = r.integer("first_dense", 0);
    m.capacity_factor = r.number("capacity_factor", 0);
    m.router_aux_loss_coef = r.number("router_aux_loss_coef", m.router_aux_loss_coef);
    m.router_z_loss_coef = r.number("router_z_loss_coef", 0);
    m.score = router_score_from_name(r.text("score", "softmax"));
    m.bias_update_rate = r.number("bias_update_rate", 0);
  }
  c.name = any.text("_name_or_path", type);
  if (c.name.empty()) c.name = type;
  c.validate();
  return c;
}

void write_hf_config(const ModelConfig& cfg, const std::string& path) {
  io::write_file_atomic(path, hf_config_json(cfg));
}

ModelConfig read_hf_config(const std::string& path) { return parse_hf_config(io::read_file(path), path); }

// ---- model.safetensors -------------------------------------------------------------------

namespace {

template <class F>
void with_float_type(DType t, const char* what, F&& f) {
  switch (t) {
    case DType::f32: f(float{}); break;
    case DType::f64: f(double{}); break;
    case DType::bf16: f(bf16_t{}); break;
    case DType::f16: f(f16_t{}); break;
    default: fail("hf", what, " has dtype ", dtype_name(t), "; parameters must be floating point");
  }
}

// dst = src converted, transposing a [R, C] src into [C, R] when `transpose`.
void convert(const Tensor& src, const Tensor& dst, bool transpose, const std::string& what) {
  with_float_type(src.dtype(), what.c_str(), [&](auto s_tag) {
    with_float_type(dst.dtype(), what.c_str(), [&](auto d_tag) {
      using S = decltype(s_tag);
      using D = decltype(d_tag);
      const S* s = static_cast<const S*>(src.raw());
      D* d = static_cast<D*>(dst.raw());
      const int64_t n = src.numel();
      if (!transpose) {
        for (int64_t i = 0; i < n; ++i) d[i] = from_double<D>(to_double(s[i]));
        return;
      }
      const int64_t R = src.size(0), C = src.size(1);
      for (int64_t r = 0; r < R; ++r)
        for (int64_t c = 0; c < C; ++c) d[c * R + r] = from_double<D>(to_double(s[r * C + c]));
    });
  });
}

Shape hf_shape(const ParamInfo& p) { return p.hf_transposed ? Shape{p.shape[1], p.shape[0]} : p.shape; }

const char* token_table(const ModelConfig& c) {
  return c.family == Family::gpt2 ? "transformer.wte.weight" : "model.embed_tokens.weight";
}

// HF names that are buffers or duplicates, not parameters loom keeps.
bool ignorable(const ModelConfig& cfg, const std::string& name) {
  auto ends_with = [&](const char* suffix) {
    const std::string s = suffix;
    return name.size() >= s.size() && name.compare(name.size() - s.size(), s.size(), s) == 0;
  };
  if (cfg.family == Family::gpt2 && (ends_with(".attn.bias") || ends_with(".attn.masked_bias"))) return true;
  if (ends_with(".rotary_emb.inv_freq")) return true;
  return cfg.tied_embeddings && name == "lm_head.weight";
}

std::string name_list(const std::vector<std::string>& names) {
  std::string s;
  for (size_t i = 0; i < names.size() && i < 5; ++i) s += str_cat(i ? ", '" : "'", names[i], "'");
  if (names.size() > 5) s += str_cat(" and ", names.size() - 5, " more");
  return s;
}

}  // namespace

void save_hf_safetensors(const Decoder& m, const std::string& path, DType dtype) {
  save_hf_safetensors(m.layout(), m.params(), path, dtype);
}

void save_hf_safetensors(const ParamLayout& layout, const Tensor& flat, const std::string& path, DType dtype) {
  LOOM_CHECK(dtype == DType::f32 || dtype == DType::f64 || dtype == DType::bf16 || dtype == DType::f16, "hf",
             "cannot save parameters as ", dtype_name(dtype), " (use f32, f64, bf16, f16)");
  io::SafetensorsWriter w;
  for (const auto& p : layout.params()) {
    const Tensor src = flat.slice(p.offset, p.shape);
    if (!p.hf_transposed && src.dtype() == dtype) {
      w.add(p.name, src);
      continue;
    }
    Tensor t = Tensor::empty(hf_shape(p), dtype);
    convert(src, t, p.hf_transposed, p.name);
    w.add(p.name, t);
  }
  w.set_metadata("format", "pt");  // transformers refuses safetensors without a known format
  w.write(path);
}

void load_hf_safetensors(Decoder& m, const std::string& path) {
  load_hf_safetensors(m.config(), m.layout(), m.params(), path);
}

void load_hf_safetensors(const ModelConfig& cfg, const ParamLayout& layout, const Tensor& flat,
                         const std::string& path) {
  load_hf_safetensors(cfg, layout, flat, std::vector<std::string>{path});
}

void load_hf_safetensors(const ModelConfig& cfg, const ParamLayout& layout, const Tensor& flat,
                         const std::vector<std::string>& files) {
  LOOM_CHECK(!files.empty(), "hf", "no safetensors file to load");
  const std::string where = files.size() == 1 ? files[0] : str_cat(files[0], " and ", files.size() - 1, " more");
  std::set<std::string> seen;
  std::vector<std::string> unexpected;
  for (const std::string& path : files) {
    const io::SafetensorsFile f = io::SafetensorsFile::open(path);
    for (const auto& e : f.entries()) {
      std::string name = e.name;
      // GPT2Model checkpoints (e.g. the original "gpt2" upload) omit the "transformer." prefix.
      if (!layout.contains(name) && cfg.family == Family::gpt2 && layout.contains("transformer." + name))
        name = "transformer." + name;
      if (!layout.contains(name)) {
        if (!ignorable(cfg, e.name)) unexpected.push_back(e.name);
        continue;
      }
      const ParamInfo& p = layout.get(name);
      const Shape want = hf_shape(p);
      LOOM_CHECK(e.shape == want.to_vector(), "hf", path, ": tensor '", e.name, "' has shape ", e.shape_str(), " but ",
                 cfg.summary(), " expects ", want.str(),
                 p.hf_transposed ? " (Hugging Face's Conv1D layout [in, out])" : "");
      LOOM_CHECK(seen.insert(name).second, "hf", path, ": parameter '", name,
                 "' appears twice (in two shards, or with and without the 'transformer.' prefix)");
      convert(f.get(e.name), flat.slice(p.offset, p.shape), p.hf_transposed, str_cat(path, ": tensor '", e.name, "'"));
    }
  }
  LOOM_CHECK(unexpected.empty(), "hf", where, ": ", unexpected.size(), " unexpected tensor",
             unexpected.size() == 1 ? "" : "s", " for ", cfg.summary(), ": ", name_list(unexpected),
             " (wrong model family or config.json?)");
  std::vector<std::string> missing;
  for (const auto& p : layout.params())
    if (!seen.count(p.name)) missing.push_back(p.name);
  LOOM_CHECK(
      missing.empty(), "hf", where, ": missing ", missing.size(), " tensor", missing.size() == 1 ? "" : "s", " that ",
      cfg.summary(), " needs: ", name_list(missing),
      !cfg.tied_embeddings && std::count(missing.begin(), missing.end(), "lm_head.weight")
          ? str_cat(" (an untied head; if the checkpoint ties it to ", token_table(cfg), ", set tie_word_embeddings)")
          : std::string());
}

void save_hf_pretrained(const Decoder& m, const std::string& dir, DType dtype) {
  std::filesystem::create_directories(dir);
  write_hf_config(m.config(), (std::filesystem::path(dir) / "config.json").string());
  save_hf_safetensors(m, (std::filesystem::path(dir) / "model.safetensors").string(), dtype);
}

}  // namespace loom::model

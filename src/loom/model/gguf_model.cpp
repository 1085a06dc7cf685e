#include "loom/model/gguf_model.h"

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <set>
#include <span>
#include <vector>

#include "loom/core/error.h"
#include "loom/core/timer.h"
#include "loom/io/gguf_quants.h"
#include "loom/model/param_layout.h"

namespace loom::model {

namespace {

std::string key(const std::string& arch, const char* k) { return arch + "." + k; }

// llama.cpp's names of a block's tensors beside Hugging Face's (after "transformer.h.N." for
// GPT-2, "model.layers.N." for LLaMA), read one way by hf_name, the other by gguf_tensor_name.
using NamePair = std::pair<const char*, const char*>;
constexpr NamePair kGpt2Block[] = {
    {"attn_norm.weight", "ln_1.weight"},          {"attn_norm.bias", "ln_1.bias"},
    {"attn_qkv.weight", "attn.c_attn.weight"},    {"attn_qkv.bias", "attn.c_attn.bias"},
    {"attn_output.weight", "attn.c_proj.weight"}, {"attn_output.bias", "attn.c_proj.bias"},
    {"ffn_norm.weight", "ln_2.weight"},           {"ffn_norm.bias", "ln_2.bias"},
    {"ffn_up.weight", "mlp.c_fc.weight"},         {"ffn_up.bias", "mlp.c_fc.bias"},
    {"ffn_down.weight", "mlp.c_proj.weight"},     {"ffn_down.bias", "mlp.c_proj.bias"},
};
constexpr NamePair kLlamaBlock[] = {
    {"attn_norm.weight", "input_layernorm.weight"},
    {"attn_q.weight", "self_attn.q_proj.weight"},
    {"attn_k.weight", "self_attn.k_proj.weight"},
    {"attn_v.weight", "self_attn.v_proj.weight"},
    {"attn_q.bias", "self_attn.q_proj.bias"},
    {"attn_k.bias", "self_attn.k_proj.bias"},
    {"attn_v.bias", "self_attn.v_proj.bias"},
    {"attn_output.weight", "self_attn.o_proj.weight"},
    {"ffn_norm.weight", "post_attention_layernorm.weight"},
    {"ffn_gate.weight", "mlp.gate_proj.weight"},
    {"ffn_up.weight", "mlp.up_proj.weight"},
    {"ffn_down.weight", "mlp.down_proj.weight"},
};
constexpr NamePair kGpt2Top[] = {{"token_embd.weight", "transformer.wte.weight"},
                                 {"position_embd.weight", "transformer.wpe.weight"},
                                 {"output_norm.weight", "transformer.ln_f.weight"},
                                 {"output_norm.bias", "transformer.ln_f.bias"},
                                 {"output.weight", "lm_head.weight"}};
constexpr NamePair kLlamaTop[] = {{"token_embd.weight", "model.embed_tokens.weight"},
                                  {"output_norm.weight", "model.norm.weight"},
                                  {"output.weight", "lm_head.weight"}};

// The HF name of a llama.cpp tensor name, or "" when it has none.
std::string hf_name(const ModelConfig& cfg, const std::string& g) {
  const bool gpt2 = cfg.family == Family::gpt2;
  for (const auto& [from, to] : gpt2 ? std::span<const NamePair>(kGpt2Top) : std::span<const NamePair>(kLlamaTop))
    if (g == from) return to;
  if (g.rfind("blk.", 0) != 0) return "";
  const size_t dot = g.find('.', 4);
  if (dot == std::string::npos) return "";
  const std::string layer = g.substr(4, dot - 4), rest = g.substr(dot + 1);
  if (layer.empty() || layer.find_first_not_of("0123456789") != std::string::npos) return "";
  for (const auto& [from, to] : gpt2 ? std::span<const NamePair>(kGpt2Block) : std::span<const NamePair>(kLlamaBlock))
    if (rest == from) return str_cat(gpt2 ? "transformer.h." : "model.layers.", layer, ".", to);
  return "";
}

// RoPE's scaling from the metadata, or the per-frequency divisors of a rope_freqs tensor (what
// llama.cpp's converter writes for Llama 3.1's rule); what loom would compute differently is
// refused naming the key.
RopeScaling gguf_rope_scaling(const io::GgufFile& g, const std::string& arch, int64_t head_dim) {
  RopeScaling r;
  const std::string type = g.get_string(key(arch, "rope.scaling.type"), "none");
  if (type == "linear") {
    r.type = RopeScaling::Type::linear;
    r.factor = g.get_float(key(arch, "rope.scaling.factor"));
  } else {
    LOOM_CHECK(type == "none", "gguf", g.path(), ": ", key(arch, "rope.scaling.type"), " is '", type,
               "'; loom applies plain, linear and Llama 3 RoPE scaling and would compute a different model");
  }
  if (g.contains("rope_freqs.weight")) {
    const io::GgufTensor& t = g.tensor("rope_freqs.weight");
    LOOM_CHECK(t.type == io::GgmlType::f32 && t.numel() == head_dim / 2 && !r.enabled(), "gguf", g.path(),
               ": rope_freqs.weight is ", io::ggml_type_name(t.type), " ", t.shape_str(), "; expected F32 [",
               head_dim / 2, "] and no other scaling");
    std::vector<float> f(size_t(t.numel()));
    std::memcpy(f.data(), g.data(t), f.size() * sizeof(float));
    r.type = RopeScaling::Type::factors;
    r.freq_factors.assign(f.begin(), f.end());
  }
  return r;
}

void refuse_unsupported(const io::GgufFile& g, const std::string& arch, int64_t head_dim) {
  const int64_t rot = g.get_int(key(arch, "rope.dimension_count"), head_dim);
  LOOM_CHECK(rot == head_dim, "gguf", g.path(), ": ", key(arch, "rope.dimension_count"), "=", rot,
             " rotates part of each head of ", head_dim, "; loom rotates whole heads");
  const int64_t experts = g.get_int(key(arch, "expert_count"), 0);
  LOOM_CHECK(experts == 0, "gguf", g.path(), ": ", key(arch, "expert_count"), "=", experts,
             ": Mixture-of-Experts GGUF models are not supported yet; convert the Hugging Face checkpoint instead");
}

}  // namespace

bool is_gguf_file(const std::string& path) {
  std::error_code ec;
  if (!std::filesystem::is_regular_file(path, ec)) return false;
  FILE* f = std::fopen(path.c_str(), "rb");
  if (!f) return false;
  char magic[4] = {};
  const size_t n = std::fread(magic, 1, 4, f);
  std::fclose(f);
  return n == 4 && std::memcmp(magic, "GGUF", 4) == 0;
}

std::string gguf_model_name(const io::GgufFile& g) {
  const std::string name = g.get_string("general.name", "");
  return name.empty() ? std::filesystem::path(g.path()).stem().string() : name;
}

std::string gguf_tensor_name(const ModelConfig& cfg, const std::string& hf) {
  const bool gpt2 = cfg.family == Family::gpt2;
  for (const auto& [to, from] : gpt2 ? std::span<const NamePair>(kGpt2Top) : std::span<const NamePair>(kLlamaTop))
    if (hf == from) return to;
  const std::string prefix = gpt2 ? "transformer.h." : "model.layers.";
  if (hf.rfind(prefix, 0) != 0) return "";
  const size_t dot = hf.find('.', prefix.size());
  if (dot == std::string::npos) return "";
  const std::string layer = hf.substr(prefix.size(), dot - prefix.size()), rest = hf.substr(dot + 1);
  for (const auto& [to, from] : gpt2 ? std::span<const NamePair>(kGpt2Block) : std::span<const NamePair>(kLlamaBlock))
    if (rest == from) return str_cat("blk.", layer, ".", to);
  return "";
}

ModelConfig gguf_model_config(const io::GgufFile& g) {
  const std::string arch = g.get_string("general.architecture");
  ModelConfig c;
  if (arch == "llama" || arch == "qwen2") {
    c.family = Family::llama;
    c.qkv_bias = g.contains("blk.0.attn_q.bias");
  } else if (arch == "gpt2") {
    c.family = Family::gpt2;
  } else {
    fail("gguf", g.path(), ": general.architecture '", arch,
         "' is not supported (loom runs 'llama', 'qwen2' and 'gpt2' GGUF files); for other families convert the "
         "Hugging Face checkpoint where loom supports it");
  }
  c.name = gguf_model_name(g);
  c.d_model = g.get_int(key(arch, "embedding_length"));
  c.n_layer = g.get_int(key(arch, "block_count"));
  c.d_ff = g.get_int(key(arch, "feed_forward_length"));
  c.n_head = g.get_int(key(arch, "attention.head_count"));
  c.n_kv_head = g.get_int(key(arch, "attention.head_count_kv"), c.n_head);
  c.n_ctx = g.get_int(key(arch, "context_length"));
  if (c.family == Family::llama) {
    c.norm_eps = g.get_float(key(arch, "attention.layer_norm_rms_epsilon"));
    c.rope_theta = g.get_float(key(arch, "rope.freq_base"), 10000.0);
  } else {
    c.norm_eps = g.get_float(key(arch, "attention.layer_norm_epsilon"));
  }
  LOOM_CHECK(g.contains("token_embd.weight"), "gguf", g.path(), ": tensor token_embd.weight is missing");
  const io::GgufTensor& table = g.tensor("token_embd.weight");
  LOOM_CHECK(table.ne.size() == 2, "gguf", g.path(), ": token_embd.weight has shape ", table.shape_str(),
             ", expected [embedding_length, vocab]");
  c.vocab_size = g.get_int(key(arch, "vocab_size"), table.ne[1]);
  c.tied_embeddings = !g.contains("output.weight");
  LOOM_CHECK(c.n_head > 0 && c.d_model % c.n_head == 0, "gguf", g.path(), ": ", key(arch, "attention.head_count"), "=",
             c.n_head, " does not divide ", key(arch, "embedding_length"), "=", c.d_model);
  refuse_unsupported(g, arch, c.d_model / c.n_head);
  if (c.family == Family::llama) c.rope_scaling = gguf_rope_scaling(g, arch, c.d_model / c.n_head);
  c.validate();
  return c;
}

std::string GgufLoadReport::describe() const {
  std::string s;
  for (const auto& [type, n] : tensors_by_type) s += str_cat(s.empty() ? "" : ", ", type, " x", n);
  return str_cat(s, quantized_elements ? " (quantized tensors dequantized to f32)" : "");
}

// llama.cpp's converter reorders each head's rows of q and k so that its RoPE, which rotates
// adjacent pairs (2i, 2i+1), computes what Hugging Face's rotate-half RoPE computes on pairs
// (i, i + D/2): HF row h*D + s*D/2 + i is stored as row h*D + 2i + s.
int64_t GgufSource::source_row(int64_t r) const {
  if (rope_heads == 0) return r;
  const int64_t h = r / head_dim, within = r % head_dim, half = head_dim / 2;
  return h * head_dim + 2 * (within % half) + within / half;
}

GgufSource gguf_row_order(const ModelConfig& cfg, const std::string& arch, const std::string& hf_name) {
  // llama.cpp permutes q and k rows for its adjacent-pair RoPE only in the 'llama' architecture;
  // Qwen2 files keep Hugging Face's order (llama.cpp rotates halves there).
  GgufSource s;
  if (arch == "llama" &&
      (hf_name.ends_with("self_attn.q_proj.weight") || hf_name.ends_with("self_attn.k_proj.weight"))) {
    s.rope_heads = hf_name.ends_with("q_proj.weight") ? cfg.n_head : cfg.n_kv_head;
    s.head_dim = cfg.head_dim();
  }
  return s;
}

std::map<std::string, GgufSource> gguf_sources(const io::GgufFile& g, const ModelConfig& cfg) {
  const ParamLayout layout(cfg);
  std::map<std::string, GgufSource> out;
  std::vector<std::string> unexpected;
  const std::string arch = g.get_string("general.architecture");
  for (const io::GgufTensor& t : g.tensors()) {
    if (t.name == "rope_freqs.weight") continue;  // in the config (gguf_model_config)
    const std::string name = hf_name(cfg, t.name);
    if (name.empty() || !layout.contains(name)) {
      unexpected.push_back(t.name);
      continue;
    }
    const ParamInfo& p = layout.get(name);
    LOOM_CHECK(t.torch_shape() == p.shape.to_vector(), "gguf", g.path(), ": tensor '", t.name, "' has ggml shape ",
               t.shape_str(), " but ", cfg.summary(), " expects ", p.shape.str(), " (", name, ")");
    LOOM_CHECK(io::ggml_type_supported(t.type), "gguf", g.path(), ": tensor '", t.name, "' is ",
               io::ggml_type_name(t.type),
               ", a type loom cannot dequantize yet; re-quantize the model to Q8_0, Q4_K or F16");
    GgufSource src = gguf_row_order(cfg, arch, name);
    src.tensor = &t;
    out[name] = src;
  }
  auto list = [](const std::vector<std::string>& v) {
    std::string s;
    for (size_t i = 0; i < v.size() && i < 5; ++i) s += str_cat(i ? ", '" : "'", v[i], "'");
    return v.size() > 5 ? str_cat(s, " and ", v.size() - 5, " more") : s;
  };
  LOOM_CHECK(unexpected.empty(), "gguf", g.path(), ": ", unexpected.size(), " tensor",
             unexpected.size() == 1 ? "" : "s", " that ", cfg.summary(), " has no place for: ", list(unexpected),
             " (an architecture variant loom does not run)");
  std::vector<std::string> missing;
  for (const auto& p : layout.params())
    if (!out.count(p.name)) missing.push_back(p.name);
  LOOM_CHECK(missing.empty(), "gguf", g.path(), ": missing ", missing.size(), " tensor", missing.size() == 1 ? "" : "s",
             " that ", cfg.summary(), " needs: ", list(missing));
  return out;
}

GgufLoadReport load_gguf_weights(const io::GgufFile& g, Decoder& m) {
  Stopwatch sw;
  const ModelConfig& cfg = m.config();
  const ParamLayout& layout = m.layout();
  const Tensor& flat = m.params();
  LOOM_CHECK(flat.dtype() == DType::f32, "gguf", "the model's parameters must be f32 to load ", g.path());
  LOOM_CHECK(m.options().slice.tp == 1 && m.options().slice.ep == 1 && m.options().slice.first_layer == 0, "gguf",
             "load ", g.path(), " into the whole model, then take a slice of it");
  GgufLoadReport report;
  std::vector<float> buf;
  for (const auto& [name, src] : gguf_sources(g, cfg)) {
    const io::GgufTensor& t = *src.tensor;
    float* dst = flat.data<float>() + layout.get(name).offset;
    if (src.rope_heads > 0) {
      buf.resize(size_t(t.numel()));
      io::dequantize(t.type, g.data(t), buf.data(), t.numel());
      const int64_t cols = t.ne[0];
      for (int64_t r = 0; r < t.numel() / cols; ++r)
        std::memcpy(dst + r * cols, buf.data() + src.source_row(r) * cols, size_t(cols) * sizeof(float));
    } else {
      io::dequantize(t.type, g.data(t), dst, t.numel());
    }
    report.tensors_by_type[io::ggml_type_name(t.type)] += 1;
    report.elements += t.numel();
    if (t.type != io::GgmlType::f32) report.quantized_elements += t.numel();
  }
  report.seconds = sw.seconds();
  return report;
}

}  // namespace loom::model

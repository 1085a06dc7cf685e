// Decoder -> GGUF tensors and architecture keys (export_gguf.h). Names come from gguf_model's
// tables and the q/k row order from gguf_row_order, so the reader undoes exactly what is written.
#include "loom/model/export_gguf.h"

#include <cstring>

#include "loom/core/error.h"
#include "loom/io/gguf_quants.h"
#include "loom/model/gguf_model.h"

namespace loom::model {

namespace {

struct TypeInfo {
  GgufExportType type;
  const char* name;
  io::GgmlType matrix;  // what a block's matrices are stored as
  uint32_t file_type;   // general.file_type, llama.cpp's LLAMA_FTYPE numbering
};
constexpr TypeInfo kTypes[] = {
    {GgufExportType::f32, "f32", io::GgmlType::f32, 0},     {GgufExportType::f16, "f16", io::GgmlType::f16, 1},
    {GgufExportType::bf16, "bf16", io::GgmlType::bf16, 32}, {GgufExportType::q8_0, "q8_0", io::GgmlType::q8_0, 7},
    {GgufExportType::q5_1, "q5_1", io::GgmlType::q5_1, 9},  {GgufExportType::q5_0, "q5_0", io::GgmlType::q5_0, 8},
    {GgufExportType::q4_1, "q4_1", io::GgmlType::q4_1, 3},  {GgufExportType::q4_0, "q4_0", io::GgmlType::q4_0, 2},
};

const TypeInfo& info(GgufExportType t) {
  for (const TypeInfo& i : kTypes)
    if (i.type == t) return i;
  fail("export", "unknown GGUF export type");
}

bool quantized(GgufExportType t) { return int(t) >= int(GgufExportType::q8_0); }

// The ggml type of one tensor: F32 for vectors and GPT-2's position table, Q8_0 for the head of a
// quantized file, F16 for a matrix whose rows are not whole 32-element blocks (as llama.cpp's
// converter falls back), else the type asked for.
io::GgmlType tensor_type(GgufExportType t, const std::string& name, const std::vector<int64_t>& ne, bool head,
                         GgufExportReport& r) {
  if (ne.size() == 1 || name == "position_embd.weight") return io::GgmlType::f32;
  if (!quantized(t)) return info(t).matrix;
  if (ne[0] % 32 != 0) {
    r.notes.push_back(str_cat(name, " kept in F16: its rows of ", ne[0], " are not whole blocks of 32"));
    return io::GgmlType::f16;
  }
  return head ? io::GgmlType::q8_0 : info(t).matrix;
}

void set_architecture_keys(const ModelConfig& cfg, const std::string& arch, io::GgufWriter& w) {
  auto key = [&](const char* k) { return arch + "." + k; };
  auto u32 = [](int64_t v) { return io::gguf_uint(uint64_t(v)); };
  w.set(key("vocab_size"), u32(cfg.vocab_size));
  w.set(key("context_length"), u32(cfg.n_ctx));
  w.set(key("embedding_length"), u32(cfg.d_model));
  w.set(key("block_count"), u32(cfg.n_layer));
  w.set(key("feed_forward_length"), u32(cfg.d_ff));
  w.set(key("attention.head_count"), u32(cfg.n_head));
  if (cfg.family == Family::gpt2) {
    w.set(key("attention.layer_norm_epsilon"), io::gguf_float(cfg.norm_eps));
    return;
  }
  w.set(key("attention.head_count_kv"), u32(cfg.n_kv_head));
  w.set(key("rope.freq_base"), io::gguf_float(cfg.rope_theta));
  w.set(key("attention.layer_norm_rms_epsilon"), io::gguf_float(cfg.norm_eps));
  w.set(key("rope.dimension_count"), u32(cfg.head_dim()));
  if (cfg.rope_scaling.type == RopeScaling::Type::linear) {
    w.set(key("rope.scaling.type"), io::gguf_string("linear"));
    w.set(key("rope.scaling.factor"), io::gguf_float(cfg.rope_scaling.factor));
  }
}

// Llama 3's scaling (and per-frequency factors) as llama.cpp's converter writes it: each
// frequency's divisor in a rope_freqs tensor, which the reader turns back into factors.
void add_rope_freqs(const ModelConfig& cfg, io::GgufWriter& w, GgufExportReport& r) {
  const RopeScaling::Type t = cfg.rope_scaling.type;
  if (t != RopeScaling::Type::llama3 && t != RopeScaling::Type::factors) return;
  ModelConfig plain = cfg;
  plain.rope_scaling = RopeScaling{};
  const std::vector<double> base = plain.rope_inv_freq(), scaled = cfg.rope_inv_freq();
  std::vector<float> factors(base.size());
  for (size_t i = 0; i < base.size(); ++i) factors[i] = float(base[i] / scaled[i]);
  w.add_tensor("rope_freqs.weight", io::GgmlType::f32, {int64_t(factors.size())},
               io::quantize(io::GgmlType::f32, factors.data(), int64_t(factors.size())));
  r.tensors_by_type["F32"] += 1;
}

}  // namespace

std::optional<GgufExportType> gguf_export_type(const std::string& name) {
  for (const TypeInfo& i : kTypes)
    if (name == i.name) return i.type;
  return std::nullopt;
}

const char* gguf_export_type_name(GgufExportType t) { return info(t).name; }

const char* gguf_export_type_names() { return "f32, f16, bf16, q8_0, q5_1, q5_0, q4_1 or q4_0"; }

std::string GgufExportReport::describe() const {
  std::string s;
  for (const auto& [type, n] : tensors_by_type) s += str_cat(s.empty() ? "" : ", ", type, " x", n);
  return s;
}

GgufExportReport add_gguf_model(const Decoder& m, const std::string& name, GgufExportType type, io::GgufWriter& w) {
  const ModelConfig& cfg = m.config();
  LOOM_CHECK(!cfg.moe.enabled(), "export", name, " is a Mixture-of-Experts model (", cfg.moe.num_experts,
             " experts); GGUF export writes dense llama, qwen2 and gpt2 models: use --format hf");
  LOOM_CHECK(m.params().dtype() == DType::f32 && m.options().slice.tp == 1 && m.options().slice.first_layer == 0,
             "export", "write the whole model in f32 to GGUF, not a slice");
  GgufExportReport r;
  r.arch = cfg.family == Family::gpt2 ? "gpt2" : cfg.qkv_bias ? "qwen2" : "llama";
  w.set("general.architecture", io::gguf_string(r.arch));
  w.set("general.name", io::gguf_string(name));
  w.set("general.file_type", io::gguf_uint(info(type).file_type));
  if (quantized(type)) w.set("general.quantization_version", io::gguf_uint(2));
  set_architecture_keys(cfg, r.arch, w);
  std::vector<float> permuted;
  for (const ParamInfo& p : m.layout().params()) {
    const std::string gname = gguf_tensor_name(cfg, p.name);
    LOOM_CHECK(!gname.empty(), "export", "parameter ", p.name, " has no GGUF name in ", r.arch, " files");
    const std::vector<int64_t> shape = p.shape.to_vector();
    const std::vector<int64_t> ne(shape.rbegin(), shape.rend());
    const Tensor t = m.param(p.name);
    const float* data = t.data<float>();
    // Row r of the parameter is row source_row(r) of the tensor, as load_gguf_weights reads it.
    const GgufSource order = gguf_row_order(cfg, r.arch, p.name);
    if (order.rope_heads > 0) {
      const int64_t cols = ne[0], rows = t.numel() / cols;
      permuted.resize(size_t(t.numel()));
      for (int64_t row = 0; row < rows; ++row)
        std::memcpy(permuted.data() + order.source_row(row) * cols, data + row * cols, size_t(cols) * sizeof(float));
      data = permuted.data();
    }
    const bool head = gname == "output.weight" || (cfg.tied_embeddings && gname == "token_embd.weight");
    const io::GgmlType gt = tensor_type(type, gname, ne, head, r);
    w.add_tensor(gname, gt, ne, io::quantize(gt, data, t.numel()));
    r.tensors_by_type[io::ggml_type_name(gt)] += 1;
  }
  add_rope_freqs(cfg, w, r);
  return r;
}

}  // namespace loom::model

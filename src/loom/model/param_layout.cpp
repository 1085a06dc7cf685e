#include "loom/model/param_layout.h"

#include <cmath>

#include "loom/core/rng.h"

namespace loom::model {

ParamLayout::ParamLayout(const ModelConfig& cfg, int64_t unit_align)
    : cfg_(cfg), unit_align_(unit_align) {
  cfg.validate();
  LOOM_CHECK(unit_align >= 1, "params", "unit_align must be >= 1, got ", unit_align);
  const int64_t C = cfg.d_model, V = cfg.vocab_size, F = cfg.d_ff, D = cfg.head_dim();
  const int64_t H = cfg.n_head, KVH = cfg.n_kv_head;
  // GPT-2 scales the residual projections by 1/sqrt(2 L) (Radford et al. 2019, section 2.3).
  const float std = 0.02f, proj_std = float(0.02 / std::sqrt(2.0 * double(cfg.n_layer)));
  if (cfg.family == Family::gpt2) {
    add("transformer.wte.weight", {V, C}, -1, Init::normal, std, true);
    add("transformer.wpe.weight", {cfg.n_ctx, C}, -1, Init::normal, std, true);
    close_unit("embed", -1);
    for (int l = 0; l < int(cfg.n_layer); ++l) {
      std::string p = block_prefix(l);
      add(p + "ln_1.weight", {C}, l, Init::ones, 0, false);
      add(p + "ln_1.bias", {C}, l, Init::zeros, 0, false);
      add(p + "attn.c_attn.weight", {3 * C, C}, l, Init::normal, std, true, true);
      add(p + "attn.c_attn.bias", {3 * C}, l, Init::zeros, 0, false);
      add(p + "attn.c_proj.weight", {C, C}, l, Init::normal, proj_std, true, true);
      add(p + "attn.c_proj.bias", {C}, l, Init::zeros, 0, false);
      add(p + "ln_2.weight", {C}, l, Init::ones, 0, false);
      add(p + "ln_2.bias", {C}, l, Init::zeros, 0, false);
      add(p + "mlp.c_fc.weight", {F, C}, l, Init::normal, std, true, true);
      add(p + "mlp.c_fc.bias", {F}, l, Init::zeros, 0, false);
      add(p + "mlp.c_proj.weight", {C, F}, l, Init::normal, proj_std, true, true);
      add(p + "mlp.c_proj.bias", {C}, l, Init::zeros, 0, false);
      close_unit(str_cat("block.", l), l);
    }
    add("transformer.ln_f.weight", {C}, -1, Init::ones, 0, false);
    add("transformer.ln_f.bias", {C}, -1, Init::zeros, 0, false);
    if (!cfg.tied_embeddings) add("lm_head.weight", {V, C}, -1, Init::normal, std, true);
    close_unit("head", -1);
  } else {
    add("model.embed_tokens.weight", {V, C}, -1, Init::normal, std, true);
    close_unit("embed", -1);
    for (int l = 0; l < int(cfg.n_layer); ++l) {
      std::string p = block_prefix(l);
      add(p + "input_layernorm.weight", {C}, l, Init::ones, 0, false);
      // q, k, v adjacent: together they are the fused [(H + 2 KVH) D, C] projection.
      add(p + "self_attn.q_proj.weight", {H * D, C}, l, Init::normal, std, true);
      add(p + "self_attn.k_proj.weight", {KVH * D, C}, l, Init::normal, std, true);
      add(p + "self_attn.v_proj.weight", {KVH * D, C}, l, Init::normal, std, true);
      add(p + "self_attn.o_proj.weight", {C, H * D}, l, Init::normal, proj_std, true);
      add(p + "post_attention_layernorm.weight", {C}, l, Init::ones, 0, false);
      // gate, up adjacent: the fused [2 F, C] projection feeding SwiGLU.
      add(p + "mlp.gate_proj.weight", {F, C}, l, Init::normal, std, true);
      add(p + "mlp.up_proj.weight", {F, C}, l, Init::normal, std, true);
      add(p + "mlp.down_proj.weight", {C, F}, l, Init::normal, proj_std, true);
      close_unit(str_cat("block.", l), l);
    }
    add("model.norm.weight", {C}, -1, Init::ones, 0, false);
    if (!cfg.tied_embeddings) add("lm_head.weight", {V, C}, -1, Init::normal, std, true);
    close_unit("head", -1);
  }
}

void ParamLayout::add(const std::string& name, Shape shape, int layer, Init init, float std,
                      bool decay, bool transposed) {
  ParamInfo p;
  p.name = name;
  p.shape = shape;
  p.offset = total_;
  p.layer = layer;
  p.init = init;
  p.init_std = std;
  p.weight_decay = decay;
  p.hf_transposed = transposed;
  total_ += shape.numel();  // no padding inside a unit: fused views (q|k|v, gate|up) rely on it
  n_params_ += shape.numel();
  index_[name] = params_.size();
  params_.push_back(std::move(p));
}

void ParamLayout::close_unit(const std::string& name, int layer) {
  total_ = (total_ + unit_align_ - 1) / unit_align_ * unit_align_;
  units_.push_back({name, layer, unit_begin_, total_});
  unit_begin_ = total_;
}

const ParamInfo& ParamLayout::get(const std::string& name) const {
  auto it = index_.find(name);
  LOOM_CHECK(it != index_.end(), "params", "no parameter named '", name, "' in model ", cfg_.name);
  return params_[it->second];
}

std::pair<int64_t, int64_t> ParamLayout::block_range(int layer) const {
  int64_t b = -1, e = -1;
  for (const auto& p : params_)
    if (p.layer == layer) {
      if (b < 0) b = p.offset;
      e = p.offset + p.numel();
    }
  LOOM_CHECK(b >= 0, "params", "no block ", layer, " in model ", cfg_.name);
  return {b, e};
}

std::string ParamLayout::block_prefix(int l) const {
  return cfg_.family == Family::gpt2 ? str_cat("transformer.h.", l, ".")
                                     : str_cat("model.layers.", l, ".");
}

void init_params_range(const ParamLayout& layout, uint64_t seed, int64_t begin, int64_t end,
                       float* out) {
  std::fill(out, out + (end - begin), 0.0f);
  for (const auto& p : layout.params()) {
    const int64_t b = std::max(begin, p.offset), e = std::min(end, p.offset + p.numel());
    if (b >= e) continue;
    float* dst = out + (b - begin);
    switch (p.init) {
      case Init::zeros: std::fill(dst, dst + (e - b), 0.0f); break;
      case Init::ones: std::fill(dst, dst + (e - b), 1.0f); break;
      case Init::normal:
        fill_normal(dst, e - b, seed, hash_name(p.name), uint64_t(b - p.offset), 0.0f, p.init_std);
        break;
    }
  }
}

void init_params(const ParamLayout& layout, uint64_t seed, float* params) {
  for (const auto& p : layout.params()) {
    float* dst = params + p.offset;
    const int64_t n = p.numel();
    switch (p.init) {
      case Init::zeros: std::fill(dst, dst + n, 0.0f); break;
      case Init::ones: std::fill(dst, dst + n, 1.0f); break;
      case Init::normal: fill_normal(dst, n, seed, hash_name(p.name), 0, 0.0f, p.init_std); break;
    }
  }
}

}  // namespace loom::model

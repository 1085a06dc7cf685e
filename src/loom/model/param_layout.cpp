#include "loom/model/param_layout.h"

#include <cmath>

#include "loom/core/rng.h"

namespace loom::model {

const char* token_table_name(const ModelConfig& cfg) {
  return cfg.family == Family::gpt2 ? "transformer.wte.weight" : "model.embed_tokens.weight";
}
const char* lm_head_name(const ModelConfig& cfg) {
  return cfg.tied_embeddings ? token_table_name(cfg) : "lm_head.weight";
}

const char* position_table_name(const ModelConfig& cfg) {
  LOOM_CHECK(cfg.traits().position == PositionKind::learned, "params", cfg.name, " has no position table");
  return "transformer.wpe.weight";
}

std::string final_norm_name(const ModelConfig& cfg, const char* part) {
  return str_cat(cfg.family == Family::gpt2 ? "transformer.ln_f." : "model.norm.", part);
}

void check_tensor_parallel(const ModelConfig& cfg, int64_t tp, const char* setting) {
  LOOM_CHECK(tp >= 1, "config", setting, "=", tp, " must be at least 1");
  LOOM_CHECK(cfg.n_head % tp == 0, "config", setting, "=", tp, " does not divide model.n_head=", cfg.n_head,
             ": attention is split by heads; use a tp that divides ", cfg.n_head);
  LOOM_CHECK(cfg.d_ff % tp == 0, "config", setting, "=", tp, " does not divide model.d_ff=", cfg.d_ff,
             ": the MLP is split along its hidden dimension; use a tp that divides ", cfg.d_ff);
}

void check_expert_parallel(const ModelConfig& cfg, int64_t ep) {
  LOOM_CHECK(ep >= 1, "config", "parallel.ep=", ep, " must be at least 1");
  if (ep == 1) return;
  LOOM_CHECK(cfg.moe.enabled(), "config", "parallel.ep=", ep,
             " needs a Mixture-of-Experts model (model.moe.num_experts > 0); ", "model ", cfg.name,
             " is dense: use parallel.ep=1");
  LOOM_CHECK(cfg.moe.num_experts % ep == 0, "config", "parallel.ep=", ep,
             " does not divide model.moe.num_experts=", cfg.moe.num_experts,
             ": every ep rank holds the same number of experts; use an ep that divides ", cfg.moe.num_experts);
}

int64_t vocab_rows_per_rank(const ModelConfig& cfg, int64_t tp) { return (cfg.vocab_size + tp - 1) / tp; }

namespace {
constexpr int kRows = 0, kCols = 1, kNone = -1;

// The family's MLP of width F under `prefix` (GPT-2: c_fc, c_proj with biases; LLaMA:
// gate_proj, up_proj, down_proj, or Mixtral's w1, w3, w2 for experts), bound to the dense or
// shared slots or, with expert >= 0, to that expert's slots. split: Megatron's column/row
// split (the dense MLP); experts and shared experts are not split.
void add_mlp_specs(std::vector<BlockParamSpec>& out, const ModelConfig& cfg, const std::string& prefix, int64_t F,
                   bool split, int expert) {
  using S = BlockSlot;
  const int64_t C = cfg.d_model;
  const Init N = Init::normal, Z = Init::zeros;
  const bool e = expert >= 0;
  const int rows = split ? kRows : kNone, cols = split ? kCols : kNone;
  const S fc_w = e ? S::e_fc_w : S::fc_w, fc_b = e ? S::e_fc_b : S::fc_b;
  const S out_w = e ? S::e_out_w : S::out_w, out_b = e ? S::e_out_b : S::out_b;
  if (cfg.family == Family::gpt2) {
    out.push_back({prefix + "c_fc.weight", {F, C}, fc_w, N, false, true, true, rows, 1, false, expert});
    out.push_back({prefix + "c_fc.bias", {F}, fc_b, Z, false, false, false, rows, 1, false, expert});
    out.push_back({prefix + "c_proj.weight", {C, F}, out_w, N, true, true, true, cols, 1, false, expert});
    out.push_back({prefix + "c_proj.bias", {C}, out_b, Z, false, false, false, kNone, 1, false, expert});
    return;
  }
  // gate, up adjacent: the fused [2 F, C] projection feeding SwiGLU.
  const bool mixtral = e;  // Mixtral's experts: w1 gate, w3 up, w2 down
  const char* gate = mixtral ? "w1.weight" : "gate_proj.weight";
  const char* up = mixtral ? "w3.weight" : "up_proj.weight";
  const char* down = mixtral ? "w2.weight" : "down_proj.weight";
  out.push_back({prefix + gate, {F, C}, fc_w, N, false, true, false, rows, 1, false, expert});
  out.push_back({prefix + up, {F, C}, fc_w, N, false, true, false, rows, 1, false, expert});
  out.push_back({prefix + down, {C, F}, out_w, N, true, true, false, cols, 1, false, expert});
}
}  // namespace

std::vector<BlockParamSpec> block_param_specs(const ModelConfig& cfg, int layer) {
  const int64_t C = cfg.d_model, D = cfg.head_dim(), H = cfg.n_head, KVH = cfg.n_kv_head;
  // Megatron-LM's split (Shoeybi et al. 2019): column-parallel (rows, 0) for q|k|v, fc and
  // gate|up; row-parallel (columns, 1) for the output projections; the rest replicated.
  constexpr int rows = kRows, cols = kCols, none = kNone;
  using S = BlockSlot;
  const Init N = Init::normal, Z = Init::zeros, O = Init::ones;
  std::vector<BlockParamSpec> specs;
  std::string mlp;
  if (cfg.family == Family::gpt2) {
    specs = {
        {"ln_1.weight", {C}, S::ln1_w, O, false, false, false, none, 1, false},
        {"ln_1.bias", {C}, S::ln1_b, Z, false, false, false, none, 1, false},
        {"attn.c_attn.weight", {3 * C, C}, S::qkv_w, N, false, true, true, rows, 3, false},
        {"attn.c_attn.bias", {3 * C}, S::qkv_b, Z, false, false, false, rows, 3, false},
        {"attn.c_proj.weight", {C, C}, S::proj_w, N, true, true, true, cols, 1, false},
        {"attn.c_proj.bias", {C}, S::proj_b, Z, false, false, false, none, 1, false},
        {"ln_2.weight", {C}, S::ln2_w, O, false, false, false, none, 1, false},
        {"ln_2.bias", {C}, S::ln2_b, Z, false, false, false, none, 1, false},
    };
    mlp = "mlp.";
  } else {
    specs = {
        {"input_layernorm.weight", {C}, S::ln1_w, O, false, false, false, none, 1, false},
        // q, k, v adjacent: together the fused [(H + 2 KVH) D, C] projection.
        {"self_attn.q_proj.weight", {H * D, C}, S::qkv_w, N, false, true, false, rows, 1, false},
        {"self_attn.k_proj.weight", {KVH * D, C}, S::qkv_w, N, false, true, false, rows, 1, true},
        {"self_attn.v_proj.weight", {KVH * D, C}, S::qkv_w, N, false, true, false, rows, 1, true},
    };
    if (cfg.qkv_bias) {  // Qwen2: q, k, v biases, adjacent like their weights
      specs.push_back({"self_attn.q_proj.bias", {H * D}, S::qkv_b, Z, false, false, false, rows, 1, false});
      specs.push_back({"self_attn.k_proj.bias", {KVH * D}, S::qkv_b, Z, false, false, false, rows, 1, true});
      specs.push_back({"self_attn.v_proj.bias", {KVH * D}, S::qkv_b, Z, false, false, false, rows, 1, true});
    }
    specs.push_back({"self_attn.o_proj.weight", {C, H * D}, S::proj_w, N, true, true, false, cols, 1, false});
    specs.push_back({"post_attention_layernorm.weight", {C}, S::ln2_w, O, false, false, false, none, 1, false});
    mlp = cfg.is_moe_layer(layer) ? "block_sparse_moe." : "mlp.";
  }
  if (!cfg.is_moe_layer(layer)) {
    add_mlp_specs(specs, cfg, mlp, cfg.d_ff, true, -1);
    return specs;
  }
  const bool gpt2 = cfg.family == Family::gpt2;
  specs.push_back({mlp + (gpt2 ? "router.weight" : "gate.weight"),
                   {cfg.moe.num_experts, C},
                   S::router_w,
                   N,
                   false,
                   true,
                   false,
                   none,
                   1,
                   false});
  if (cfg.moe.num_shared_experts > 0) add_mlp_specs(specs, cfg, mlp + "shared_experts.", cfg.shared_d_ff(), false, -1);
  for (int64_t e = 0; e < cfg.moe.num_experts; ++e)
    add_mlp_specs(specs, cfg, str_cat(mlp, "experts.", e, "."), cfg.expert_d_ff(), false, int(e));
  return specs;
}

std::vector<LoraSpec> lora_specs(const ModelConfig& cfg) {
  const int64_t C = cfg.d_model, Q = cfg.n_head * cfg.head_dim(), KV = cfg.n_kv_head * cfg.head_dim(), F = cfg.d_ff;
  using T = LoraTarget;
  struct Geometry {
    T target;
    const char* module;  // "self_attn" or "mlp"
    int64_t in, out;
    bool column_parallel, kv;
  };
  const Geometry all[] = {{T::q, "self_attn", C, Q, true, false}, {T::k, "self_attn", C, KV, true, true},
                          {T::v, "self_attn", C, KV, true, true}, {T::o, "self_attn", Q, C, false, false},
                          {T::gate, "mlp", C, F, true, false},    {T::up, "mlp", C, F, true, false},
                          {T::down, "mlp", F, C, false, false}};
  std::vector<LoraSpec> out;
  for (const Geometry& g : all)
    if (cfg.lora.adapts(g.target))
      out.push_back(
          {g.target, str_cat(g.module, ".", lora_module_name(g.target)), g.in, g.out, g.column_parallel, g.kv});
  return out;
}

std::vector<std::string> lora_modules(const ModelConfig& cfg) {
  std::vector<std::string> out;
  for (const LoraSpec& s : lora_specs(cfg)) out.push_back(lora_module_name(s.target));
  return out;
}

void ParamLayout::add_lora_adapters() {
  LOOM_CHECK(cfg_.lora.enabled(), "params", "a LoRA adapter layout needs model.lora.rank > 0");
  const int64_t r = cfg_.lora.rank;
  const bool split_kv = cfg_.n_kv_head % slice_.tp == 0;
  close_unit("embed", -1);
  for (const int l : layers_) {
    for (const LoraSpec& s : lora_specs(cfg_)) {
      const std::string name = block_prefix(l) + s.proj;
      // A as PEFT initialises it (uniform, variance 1 / (3 in)), here normal with that variance;
      // B zero, so the adapted model starts as the model. Adapters do not decay.
      const float a_std = float(1.0 / std::sqrt(3.0 * double(s.in)));
      const int b_split = s.column_parallel && !(s.kv && !split_kv) ? 0 : -1;
      ParamInfo& a =
          add(name + ".lora_A.weight", {r, s.in}, l, Init::normal, a_std, false, false, s.column_parallel ? -1 : 1);
      a.tp_grad_partial = a.tp_replicated;
      ParamInfo& b = add(name + ".lora_B.weight", {s.out, r}, l, Init::zeros, 0.f, false, false, b_split);
      b.tp_grad_partial = b.tp_replicated;
    }
    close_unit(str_cat("block.", l), l);
    block_unit_.push_back(int(units_.size()) - 1);
    expert_unit_.push_back(-1);
  }
  close_unit("head", -1);
}

ParamLayout::ParamLayout(const ModelConfig& cfg, int64_t unit_align, const ModelSlice& slice)
    : cfg_(cfg), slice_(slice), unit_align_(unit_align) {
  cfg.validate();
  LOOM_CHECK(unit_align >= 1, "params", "unit_align must be >= 1, got ", unit_align);
  if (slice_.last_layer < 0) slice_.last_layer = int(cfg.n_layer);
  chunks_ = slice_.chunks(cfg.n_layer);
  local_of_.assign(size_t(cfg.n_layer), -1);
  for (size_t c = 0; c < chunks_.size(); ++c) {
    const LayerRange r = chunks_[c];
    LOOM_CHECK(r.first >= 0 && r.first <= r.last && r.last <= cfg.n_layer, "params", "blocks [", r.first, ", ", r.last,
               ") are not a range of the model's ", cfg.n_layer, " blocks");
    LOOM_CHECK(c == 0 || (r.first >= chunks_[c - 1].last && r.first < r.last), "params", "chunk ", c, "'s blocks [",
               r.first, ", ", r.last, ") do not follow the previous chunk's in model order");
    for (int l = r.first; l < r.last; ++l) {
      local_of_[size_t(l)] = int(layers_.size());
      layers_.push_back(l);
    }
  }
  LOOM_CHECK(slice_.tp_rank >= 0 && slice_.tp_rank < slice_.tp, "params", "tp rank ", slice_.tp_rank,
             " outside tp=", slice_.tp);
  check_tensor_parallel(cfg, slice_.tp);
  if (slice_.lora_adapters) {
    add_lora_adapters();
    return;
  }
  const int64_t C = cfg.d_model, V = cfg.vocab_size, KVH = cfg.n_kv_head;
  // GPT-2 scales the residual projections by 1/sqrt(2 L) (Radford et al. 2019, section 2.3).
  const float std = 0.02f, proj_std = float(0.02 / std::sqrt(2.0 * double(cfg.n_layer)));
  const bool gpt2 = cfg.family == Family::gpt2;
  const char* table = token_table_name(cfg);
  // Tensor parallel: vocabulary rows (split 0) for the token table and the head; the blocks'
  // splits are in block_param_specs.
  constexpr int rows = 0;
  if (slice_.has_embedding) {
    add(table, {V, C}, -1, Init::normal, std, true, false, rows);
    if (gpt2) add("transformer.wpe.weight", {cfg.n_ctx, C}, -1, Init::normal, std, true);
  }
  close_unit("embed", -1);
  const bool split_kv = KVH % slice_.tp == 0;
  LOOM_CHECK(slice_.ep >= 1 && slice_.ep_rank >= 0 && slice_.ep_rank < slice_.ep, "params", "ep rank ", slice_.ep_rank,
             " outside ep=", slice_.ep);
  check_expert_parallel(cfg, slice_.ep);
  const int64_t e0 = slice_.first_expert(cfg), e1 = e0 + slice_.local_experts(cfg);
  for (const int l : layers_) {
    const std::string p = block_prefix(l);
    const auto specs = block_param_specs(cfg, l);
    auto add_spec = [&](const BlockParamSpec& b) {
      const int split = b.kv && !split_kv ? -1 : b.split;
      const float init_std = b.init != Init::normal ? 0.f : b.residual_proj ? proj_std : std;
      ParamInfo& pi = add(p + b.suffix, b.shape, l, b.init, init_std, b.decay, b.hf_transposed, split, b.parts);
      if (b.kv) pi.tp_grad_partial = pi.tp_replicated;  // each rank's query heads see all kv heads
      pi.expert = b.expert;
      using S = BlockSlot;
      pi.product_operand = b.slot == S::qkv_w || b.slot == S::proj_w || b.slot == S::fc_w || b.slot == S::out_w ||
                           b.slot == S::e_fc_w || b.slot == S::e_out_w;
    };
    for (const BlockParamSpec& b : specs)
      if (b.expert < 0) add_spec(b);
    close_unit(str_cat("block.", l), l);
    block_unit_.push_back(int(units_.size()) - 1);
    expert_unit_.push_back(-1);
    if (!cfg.is_moe_layer(l)) continue;
    for (const BlockParamSpec& b : specs)  // this rank's routed experts, a unit of their own
      if (b.expert >= e0 && b.expert < e1) add_spec(b);
    close_unit(str_cat("experts.", l), l, true);
    expert_unit_.back() = int(units_.size()) - 1;
  }
  if (slice_.has_head) {
    if (gpt2) {
      add("transformer.ln_f.weight", {C}, -1, Init::ones, 0, false);
      add("transformer.ln_f.bias", {C}, -1, Init::zeros, 0, false);
    } else {
      add("model.norm.weight", {C}, -1, Init::ones, 0, false);
    }
    if (!cfg.tied_embeddings)
      add("lm_head.weight", {V, C}, -1, Init::normal, std, true, false, rows).product_operand = true;
    else if (!slice_.has_embedding) {
      ParamInfo& copy = add(table, {V, C}, -1, Init::normal, std, true, false, rows);
      copy.tied_copy = copy.product_operand = true;  // the head's operand only: no lookup here
    }
  }
  close_unit("head", -1);
}

std::vector<LayerRange> ModelSlice::chunks(int64_t n_layer) const {
  std::vector<LayerRange> out = {{first_layer, last_layer < 0 ? int(n_layer) : last_layer}};
  out.insert(out.end(), later_chunks.begin(), later_chunks.end());
  return out;
}

bool ParamLayout::whole_model() const {
  return num_layers() == cfg_.n_layer && slice_.has_embedding && slice_.has_head && slice_.tp == 1 && slice_.ep == 1;
}

int ParamLayout::local_index(int layer) const {
  if (!has_block(layer)) {
    std::string held;
    for (const LayerRange& r : chunks_) held += str_cat(held.empty() ? "" : ", ", r.first, "..", r.last - 1);
    fail("params", "block ", layer, " is not in this slice of ", cfg_.name, " (blocks ", held, ")");
  }
  return local_of_[size_t(layer)];
}

size_t ParamLayout::block_unit_index(int layer) const { return size_t(block_unit_[size_t(local_index(layer))]); }

int ParamLayout::expert_unit_index(int layer) const { return expert_unit_[size_t(local_index(layer))]; }

std::vector<ElementRun> ParamLayout::element_runs(const ParamInfo& p) const {
  if (p.split_dim < 0 || slice_.tp == 1) return {{0, 0, p.numel()}};
  std::vector<ElementRun> out;
  const int64_t r = slice_.tp_rank;
  if (p.split_dim == 0) {
    const int64_t row = p.numel() / p.shape[0], k = p.split_parts;
    const int64_t part_rows = p.full_shape[0] / k, local_rows = p.shape[0] / k;
    for (int64_t j = 0; j < k; ++j) {
      const int64_t first = r * local_rows;  // within the part
      const int64_t n = std::min(local_rows, part_rows - first);
      if (n > 0) out.push_back({j * local_rows * row, (j * part_rows + first) * row, n * row});
    }
  } else {
    const int64_t R = p.shape[0], local_cols = p.shape[1], full_cols = p.full_shape[1];
    for (int64_t i = 0; i < R; ++i) out.push_back({i * local_cols, i * full_cols + r * local_cols, local_cols});
  }
  return out;
}

ParamInfo& ParamLayout::add(const std::string& name, Shape full, int layer, Init init, float std, bool decay,
                            bool transposed, int split, int parts) {
  const int64_t tp = slice_.tp;
  if (tp == 1) split = -1;
  Shape shape = full;
  if (split == 0) {  // rows; the token table's last rank is padded to ceil(V / tp) rows
    const int64_t part_rows = full[0] / parts;
    shape[0] = parts * ((part_rows + tp - 1) / tp);
  } else if (split == 1) {
    shape[1] = full[1] / tp;
  }
  ParamInfo p;
  p.name = name;
  p.shape = shape;
  p.full_shape = full;
  p.split_dim = split;
  p.split_parts = parts;
  p.tp_replicated = tp > 1 && split < 0;
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
  return params_.back();
}

void ParamLayout::close_unit(const std::string& name, int layer, bool experts) {
  total_ = (total_ + unit_align_ - 1) / unit_align_ * unit_align_;
  units_.push_back({name, layer, experts, unit_begin_, total_});
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
  return cfg_.family == Family::gpt2 ? str_cat("transformer.h.", l, ".") : str_cat("model.layers.", l, ".");
}

void init_params_range(const ParamLayout& layout, uint64_t seed, int64_t begin, int64_t end, float* out) {
  std::fill(out, out + (end - begin), 0.0f);
  for (const auto& p : layout.params()) {
    if (p.offset >= end || p.offset + p.numel() <= begin) continue;
    for (const ElementRun& run : layout.element_runs(p)) {
      const int64_t lo = p.offset + run.local;
      const int64_t b = std::max(begin, lo), e = std::min(end, lo + run.n);
      if (b >= e) continue;
      float* dst = out + (b - begin);
      switch (p.init) {
        case Init::zeros: std::fill(dst, dst + (e - b), 0.0f); break;
        case Init::ones: std::fill(dst, dst + (e - b), 1.0f); break;
        case Init::normal:
          fill_normal(dst, e - b, seed, hash_name(p.name), uint64_t(run.global + (b - lo)), 0.0f, p.init_std);
          break;
      }
    }
  }
}

void init_params(const ParamLayout& layout, uint64_t seed, float* params) {
  init_params_range(layout, seed, 0, layout.total(), params);
}

}  // namespace loom::model

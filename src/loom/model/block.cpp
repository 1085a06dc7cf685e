#include "loom/model/block.h"

#include <algorithm>

#include "loom/kernels/ops.h"

namespace loom::model {

static Tensor& slot_of(BlockWeights& w, const BlockParamSpec& spec) {
  if (spec.expert >= 0) {
    const size_t local = size_t(spec.expert - w.expert0);
    if (w.experts.size() <= local) w.experts.resize(local + 1);
    ExpertWeights& e = w.experts[local];
    switch (spec.slot) {
      case BlockSlot::e_fc_w: return e.fc_w;
      case BlockSlot::e_fc_b: return e.fc_b;
      case BlockSlot::e_out_w: return e.out_w;
      case BlockSlot::e_out_b: return e.out_b;
      default: break;
    }
    fail("params", "expert parameter ", spec.suffix, " has a non-expert slot");
  }
  switch (spec.slot) {
    case BlockSlot::ln1_w: return w.ln1_w;
    case BlockSlot::ln1_b: return w.ln1_b;
    case BlockSlot::qkv_w: return w.qkv_w;
    case BlockSlot::qkv_b: return w.qkv_b;
    case BlockSlot::proj_w: return w.proj_w;
    case BlockSlot::proj_b: return w.proj_b;
    case BlockSlot::ln2_w: return w.ln2_w;
    case BlockSlot::ln2_b: return w.ln2_b;
    case BlockSlot::fc_w: return w.fc_w;
    case BlockSlot::fc_b: return w.fc_b;
    case BlockSlot::out_w: return w.out_w;
    case BlockSlot::out_b: return w.out_b;
    case BlockSlot::router_w: return w.router_w;
    default: break;
  }
  fail("params", "unknown block slot ", int(spec.slot), " of ", spec.suffix);
}

BlockWeights block_weights(const ModelConfig& cfg, const ParamLayout& layout, const Tensor& flat, int l, int64_t base,
                           const Tensor& expert_flat, int64_t expert_base) {
  // Each slot is one parameter, or consecutive adjacent ones bound as one fused view spanning
  // their rows (q|k|v, gate|up, w1|w3).
  const std::string p = layout.block_prefix(l);
  BlockWeights w;
  if (layout.slice().lora_adapters) {
    for (const LoraSpec& s : lora_specs(cfg)) {
      const ParamInfo& a = layout.get(p + s.proj + ".lora_A.weight");
      const ParamInfo& b = layout.get(p + s.proj + ".lora_B.weight");
      w.lora[size_t(s.target)] = {flat.slice(a.offset - base, a.shape), flat.slice(b.offset - base, b.shape)};
    }
    return w;
  }
  const auto specs = block_param_specs(cfg, l);
  const int64_t e0 = layout.slice().first_expert(cfg), e1 = e0 + layout.slice().local_experts(cfg);
  w.expert0 = e0;
  for (size_t i = 0; i < specs.size();) {
    if (specs[i].expert >= 0 && (specs[i].expert < e0 || specs[i].expert >= e1)) {  // another rank's
      ++i;
      continue;
    }
    const ParamInfo& first = layout.get(p + specs[i].suffix);
    int64_t rows = 0, end = first.offset;
    size_t j = i;
    for (; j < specs.size() && specs[j].slot == specs[i].slot && specs[j].expert == specs[i].expert; ++j) {
      const ParamInfo& part = layout.get(p + specs[j].suffix);
      LOOM_CHECK(part.offset == end, "params", part.name, " is not adjacent to the previous part");
      rows += part.shape[0];
      end += part.numel();
    }
    const Shape fused = first.shape.ndim() == 1 ? Shape{rows} : Shape{rows, first.shape[1]};
    const bool own_buffer = specs[i].expert >= 0 && expert_flat.defined();
    slot_of(w, specs[i]) =
        (own_buffer ? expert_flat : flat)
            .slice(first.offset - (own_buffer ? expert_base : base), j == i + 1 ? first.shape : fused);
    i = j;
  }
  return w;
}

BlockDims BlockDims::of(const ModelConfig& cfg, int64_t tp, int64_t rank) {
  BlockDims d;
  d.C = cfg.d_model;
  d.D = cfg.head_dim();
  if (cfg.traits().position == PositionKind::rope) d.rope_inv_freq = cfg.rope_inv_freq();
  d.H = cfg.n_head / tp;
  d.F = cfg.d_ff / tp;
  d.group = cfg.n_head / cfg.n_kv_head;
  d.q_head0 = rank * d.H;
  d.kv_expand = tp > 1 && cfg.n_kv_head % tp != 0;
  d.KVH = d.kv_expand ? cfg.n_kv_head : cfg.n_kv_head / tp;
  d.bias_owner = rank == 0;
  return d;
}

void norm_forward(const FamilyTraits& t, const Tensor& x, const Tensor& g, const Tensor& b, const Tensor& out,
                  const Tensor& mean, const Tensor& rstd, double eps) {
  if (t.norm == NormKind::layer_norm)
    ops::layernorm_forward(x, g, b, out, mean, rstd, eps);
  else
    ops::rmsnorm_forward(x, g, out, rstd, eps);
}

void norm_backward(const FamilyTraits& t, const Tensor& dy, const Tensor& x, const Tensor& g, const Tensor& mean,
                   const Tensor& rstd, const Tensor& dx, const Tensor& dg, const Tensor& db, bool accumulate_dx) {
  if (t.norm == NormKind::layer_norm)
    ops::layernorm_backward(dy, x, g, mean, rstd, dx, dg, db, accumulate_dx);
  else
    ops::rmsnorm_backward(dy, x, g, rstd, dx, dg, accumulate_dx);
}

void activation_forward(const FamilyTraits& t, const Tensor& fc, const Tensor& act) {
  if (t.mlp == MlpKind::gelu)
    ops::gelu_forward(fc, act);
  else
    ops::swiglu_forward(fc, act);
}

void activation_backward(const FamilyTraits& t, const Tensor& fc, const Tensor& dact, const Tensor& dfc) {
  if (t.mlp == MlpKind::gelu)
    ops::gelu_backward(fc, dact, dfc);
  else
    ops::swiglu_backward(fc, dact, dfc);
}

void rope_qk(const std::vector<double>& inv_freq, const Tensor& qkv, int64_t H, int64_t KVH, int64_t D,
             const Tensor& pos, bool inverse) {
  if (inv_freq.empty()) return;
  ops::rope_apply(qkv, 0, H, D, pos, inv_freq, inverse);
  ops::rope_apply(qkv, H * D, KVH, D, pos, inv_freq, inverse);
}

int64_t lora_widest_input(const ModelConfig& cfg, const BlockDims& d) {
  int64_t w = 0;
  for (const LoraSpec& s : lora_specs(cfg))
    w = std::max(w, s.target == LoraTarget::o ? d.H * d.D : s.target == LoraTarget::down ? d.F : d.C);
  return w;
}

namespace {
// `big`: the type of the fields the stored form keeps in 16 bits (ln1, qkv, att, ln2, fc, act);
// `dt` the rest's. qkv_compact only in a working set.
BlockActs allocate_acts(const ModelConfig& cfg, int64_t B, int64_t T, DType dt, DType big, bool working,
                        Allocator& alloc, const BlockDims& d) {
  const int64_t N = B * T, C = d.C, D = d.D, H = d.H, F = d.F;
  const auto cat = MemCategory::activations;
  const FamilyTraits t = cfg.traits();
  const bool layer_norm = t.norm == NormKind::layer_norm;
  BlockActs a;
  a.dims = d;
  a.ln1 = Tensor::empty({N, C}, big, cat, alloc);
  if (layer_norm) a.ln1_mean = Tensor::empty({N}, dt, cat, alloc);
  a.ln1_rstd = Tensor::empty({N}, dt, cat, alloc);
  a.qkv = Tensor::empty({B, T, d.attn_width()}, big, cat, alloc);
  if (d.kv_expand && working) a.qkv_compact = Tensor::empty({B, T, d.qkv_width()}, dt, cat, alloc);
  a.att = Tensor::empty({B, T, H * D}, big, cat, alloc);
  a.lse = Tensor::empty({B, H, T}, dt, cat, alloc);
  a.x_mid = Tensor::empty({N, C}, dt, cat, alloc);
  a.ln2 = Tensor::empty({N, C}, big, cat, alloc);
  if (layer_norm) a.ln2_mean = Tensor::empty({N}, dt, cat, alloc);
  a.ln2_rstd = Tensor::empty({N}, dt, cat, alloc);
  const int64_t mlp = cfg.dense_mlp_width(F);
  if (mlp > 0) {
    a.fc = Tensor::empty({N, t.mlp_fan_out() * mlp}, big, cat, alloc);
    a.act = Tensor::empty({N, mlp}, big, cat, alloc);
  }
  if (cfg.moe.enabled()) a.moe = MoeActs::allocate(cfg, N, dt, alloc);
  return a;
}
}  // namespace

BlockActs BlockActs::allocate(const ModelConfig& cfg, int64_t B, int64_t T, DType dt, Allocator& alloc,
                              const BlockDims& d) {
  return allocate_acts(cfg, B, T, dt, dt, true, alloc, d);
}

BlockActs BlockActs::allocate_stored(const ModelConfig& cfg, int64_t B, int64_t T, DType dt16, Allocator& alloc,
                                     const BlockDims& d) {
  LOOM_CHECK(dt16 == DType::bf16 || dt16 == DType::f16, "model", "stored activations are bf16 or f16, not ",
             dtype_name(dt16));
  return allocate_acts(cfg, B, T, DType::f32, dt16, false, alloc, d);
}

namespace {
// The fields stored in 16 bits, and those whose f32 buffers trade places.
template <class F>
void for_stored_fields(BlockActs& work, BlockActs& stored, F&& narrow_or_widen) {
  narrow_or_widen(work.ln1, stored.ln1);
  narrow_or_widen(work.qkv, stored.qkv);
  narrow_or_widen(work.att, stored.att);
  narrow_or_widen(work.ln2, stored.ln2);
  if (stored.fc.defined()) {
    narrow_or_widen(work.fc, stored.fc);
    narrow_or_widen(work.act, stored.act);
  }
  for (auto [w, s] : {std::pair{&work.ln1_mean, &stored.ln1_mean},
                      {&work.ln1_rstd, &stored.ln1_rstd},
                      {&work.lse, &stored.lse},
                      {&work.x_mid, &stored.x_mid},
                      {&work.ln2_mean, &stored.ln2_mean},
                      {&work.ln2_rstd, &stored.ln2_rstd}})
    std::swap(*w, *s);
  std::swap(work.moe, stored.moe);
}
}  // namespace

void stash_activations(BlockActs& work, BlockActs& stored) {
  for_stored_fields(work, stored, [](const Tensor& w, const Tensor& s) { ops::narrow_to_16(w, s); });
}

void unstash_activations(BlockActs& stored, BlockActs& work) {
  for_stored_fields(work, stored, [](const Tensor& w, const Tensor& s) { ops::widen_from_16(s, w); });
}

int64_t BlockActs::bytes() const {
  int64_t b = 0;
  for (const Tensor* t :
       {&ln1, &ln1_mean, &ln1_rstd, &qkv, &qkv_compact, &att, &lse, &x_mid, &ln2, &ln2_mean, &ln2_rstd, &fc, &act})
    if (t->defined()) b += int64_t(t->nbytes());
  return b + moe.bytes();
}

BlockScratch BlockScratch::allocate(const ModelConfig& cfg, int64_t B, int64_t T, DType dt, Allocator& alloc,
                                    const BlockDims& d) {
  const int64_t N = B * T, C = d.C, F = d.F;
  const auto cat = MemCategory::workspace;
  BlockScratch s;
  s.dln = Tensor::empty({N, C}, dt, cat, alloc);
  s.dqkv = Tensor::empty({B, T, d.qkv_width()}, dt, cat, alloc);
  if (d.kv_expand) s.dqkv_expanded = Tensor::empty({B, T, d.attn_width()}, dt, cat, alloc);
  s.datt = Tensor::empty({B, T, d.H * d.D}, dt, cat, alloc);
  const int64_t mlp = cfg.dense_mlp_width(F);
  if (mlp > 0) {
    s.dfc = Tensor::empty({N, cfg.traits().mlp_fan_out() * mlp}, dt, cat, alloc);
    s.dact = Tensor::empty({N, mlp}, dt, cat, alloc);
  }
  if (cfg.moe.enabled()) s.moe = MoeScratch::allocate(cfg, N, dt, alloc);
  if (cfg.lora.enabled()) {
    s.lora_u = Tensor::empty({N, cfg.lora.rank}, dt, cat, alloc);
    s.lora_du = Tensor::empty({N, cfg.lora.rank}, dt, cat, alloc);
    if (cfg.lora.dropout > 0) {
      s.lora_x = Tensor::empty({N * lora_widest_input(cfg, d)}, dt, cat, alloc);
      s.lora_dx = Tensor::empty({N * lora_widest_input(cfg, d)}, dt, cat, alloc);
    }
  }
  return s;
}

namespace {

// kv_expand: rows of [q (H heads) | k (KVH) | v (KVH)] <-> [q | k (H copies) | v (H copies)],
// local query head j reading kv head (q_head0 + j) / group. The reverse sums the copies.
template <class T>
void expand_kv_rows(const BlockDims& d, const T* compact, T* expanded, int64_t rows, bool reverse) {
  const int64_t D = d.D, H = d.H, KVH = d.KVH, wc = d.qkv_width(), we = d.attn_width();
  for (int64_t n = 0; n < rows; ++n) {
    const T* c = compact + n * wc;
    T* e = expanded + n * we;
    T* cw = const_cast<T*>(c);
    if (reverse) {
      std::copy(e, e + H * D, cw);
      std::fill(cw + H * D, cw + wc, T(0));
    } else {
      std::copy(c, c + H * D, e);
    }
    for (int64_t j = 0; j < H; ++j) {
      const int64_t kv = (d.q_head0 + j) / d.group;
      for (int64_t part = 1; part <= 2; ++part) {  // k, then v
        const int64_t co = H * D + (part - 1) * KVH * D + kv * D, eo = part * H * D + j * D;
        if (reverse)
          for (int64_t i = 0; i < D; ++i) cw[co + i] += e[eo + i];
        else
          std::copy(c + co, c + co + D, e + eo);
      }
    }
  }
}

void expand_kv(const BlockDims& d, const Tensor& compact, const Tensor& expanded, bool reverse) {
  const int64_t rows = compact.numel() / d.qkv_width();
  if (compact.dtype() == DType::f32)
    expand_kv_rows(d, compact.data<float>(), expanded.data<float>(), rows, reverse);
  else
    expand_kv_rows(d, compact.data<double>(), expanded.data<double>(), rows, reverse);
}

}  // namespace

void block_forward(const ModelConfig& cfg, int layer, const BlockWeights& w, const BlockDims& d, const Tensor& x_in,
                   const Tensor& pos, const BlockForwardBuffers& b, BlockForwardOps& parts, const Tensor& x_out) {
  using L = BlockForwardOps::Linear;
  const FamilyTraits t = cfg.traits();
  const int64_t G = t.mlp_fan_out();
  norm_forward(t, x_in, w.ln1_w, w.ln1_b, b.ln1, b.ln1_mean, b.ln1_rstd, cfg.norm_eps);
  parts.linear(L::qkv, b.ln1, w.qkv_w, w.qkv_b, b.qkv);
  rope_qk(d.rope_inv_freq, b.qkv, d.H, d.KVH, d.D, pos, false);
  parts.attention(layer, b.qkv, b.att);
  parts.linear(L::proj, b.att, w.proj_w, d.bias_owner ? w.proj_b : Tensor{}, b.x_mid);
  parts.row_parallel_output(b.x_mid);
  ops::add_inplace(b.x_mid, x_in);
  norm_forward(t, b.x_mid, w.ln2_w, w.ln2_b, b.ln2, b.ln2_mean, b.ln2_rstd, cfg.norm_eps);
  const int64_t N = b.ln2.size(0);
  // A MoE block's router and experts are whole on every tp rank: its MLP has no tp
  // communication, and its shared experts' bias is added on every rank.
  const bool moe = cfg.is_moe_layer(layer), shared = moe && w.fc_w.defined();
  if (moe) parts.moe_begin(layer, w, b.ln2);
  if (!moe || shared) {
    const int64_t F = moe ? cfg.shared_d_ff() : d.F;
    const Tensor fc = b.fc.slice(0, {N, G * F}), act = b.act.slice(0, {N, F});
    parts.linear(L::fc, b.ln2, w.fc_w, w.fc_b, fc);
    activation_forward(t, fc, act);
    parts.linear(L::out, act, w.out_w, moe || d.bias_owner ? w.out_b : Tensor{}, x_out);
    if (!moe) parts.row_parallel_output(x_out);
  }
  if (moe) parts.moe_end(layer, w, x_out, /*accumulate=*/shared);
  ops::add_inplace(x_out, b.x_mid);
}

namespace {

// Where the adapters of a block's linear `which` add into its output: each target and the first
// column of its projection in the (fused) output of this rank's share d.
// At most three (q, k, v), held in place: this runs for every linear of every block.
struct LoraSite {
  LoraTarget target;
  int64_t col0;
};
struct LoraSites {
  std::array<LoraSite, 3> at;
  size_t n = 0;
  const LoraSite* begin() const { return at.data(); }
  const LoraSite* end() const { return at.data() + n; }
};
LoraSites lora_sites(BlockForwardOps::Linear which, const BlockDims& d) {
  using L = BlockForwardOps::Linear;
  using T = LoraTarget;
  switch (which) {
    case L::qkv: return {{{{T::q, 0}, {T::k, d.H * d.D}, {T::v, (d.H + d.KVH) * d.D}}}, 3};
    case L::proj: return {{{{T::o, 0}}}, 1};
    case L::fc: return {{{{T::gate, 0}, {T::up, d.F}}}, 2};
    case L::out: return {{{{T::down, 0}}}, 1};
  }
  return {};
}

// The dropout key of one adapter of a block: the block's key mixed with the target.
uint64_t site_key(uint64_t block_key, LoraTarget t) { return block_key ^ (uint64_t(t) + 1) * 0xd1b54a32d192ed03ULL; }

// Training's parts: linears in the model's product precision; dense causal attention saving
// the log-sum-exp (on one copy of the kv heads per query head under kv_expand); tp and
// expert-parallel communication through the parallel layers' hooks.
class TrainingForwardOps : public BlockForwardOps {
 public:
  TrainingForwardOps(const ModelConfig& cfg, const BlockWeights& w, BlockActs& a, TensorParallelOps* tp,
                     ExpertParallelOps* ep)
      : cfg_(cfg), w_(w), a_(a), tp_(tp), ep_(ep), prec_(cfg.products()) {}
  void linear(Linear which, const Tensor& x, const Tensor& w, const Tensor& b, const Tensor& y) override {
    ops::linear_forward(x, w, b, y, prec_);
    if (!cfg_.lora.enabled()) return;
    const int64_t N = x.numel() / x.size(-1);
    for (const LoraSite& site : lora_sites(which, a_.dims)) {
      const LoraWeights& l = w_.lora[size_t(site.target)];
      if (!l.a.defined()) continue;
      Tensor in = x;
      if (a_.lora_dropout && cfg_.lora.dropout > 0) {  // the adapter sees a dropped-out copy of x
        in = a_.lora_x.slice(0, {N, x.numel() / N});
        ops::dropout(x, in, cfg_.lora.dropout, site_key(a_.lora_key, site.target));
      }
      ops::lora_forward(in, l.a, l.b, cfg_.lora.scale(), y.slice(0, {N, y.numel() / N}), site.col0, a_.lora_u);
    }
  }
  void attention(int, const Tensor&, const Tensor& att) override {
    const BlockDims& d = a_.dims;
    if (d.kv_expand) expand_kv(d, a_.qkv_compact, a_.qkv, false);
    ops::attention_forward(a_.qkv, att, a_.lse, d.H, d.kv_expand ? d.H : d.KVH, a_.attention_pos);
  }
  void row_parallel_output(const Tensor& y) override {
    if (tp_) tp_->row_parallel_output(y);
  }
  void moe_begin(int, const BlockWeights& w, const Tensor& ln2) override { moe_dispatch(cfg_, w, ln2, a_.moe, ep_); }
  void moe_end(int, const BlockWeights& w, const Tensor& x_out, bool accumulate) override {
    moe_combine(cfg_, w, a_.moe, x_out, accumulate, ep_);
  }

 private:
  const ModelConfig& cfg_;
  const BlockWeights& w_;
  BlockActs& a_;
  TensorParallelOps* tp_;
  ExpertParallelOps* ep_;
  ops::ProductPrecision prec_;
};

}  // namespace

void block_forward(const ModelConfig& cfg, int layer, const BlockWeights& w, const Tensor& x_in, const Tensor& pos,
                   BlockActs& a, const Tensor& x_out, TensorParallelOps* tp, ExpertParallelOps* ep) {
  const BlockDims& d = a.dims;
  BlockForwardBuffers b{a.ln1,      a.ln1_mean, a.ln1_rstd, d.kv_expand ? a.qkv_compact : a.qkv,
                        a.att,      a.x_mid,    a.ln2,      a.ln2_mean,
                        a.ln2_rstd, a.fc,       a.act};
  TrainingForwardOps parts(cfg, w, a, tp, ep);
  block_forward(cfg, layer, w, d, x_in, pos, b, parts, x_out);
}

BlockDeferredGrads BlockDeferredGrads::allocate(const ModelConfig& cfg, int64_t B, int64_t T, DType dt,
                                                Allocator& alloc, const BlockDims& d) {
  const int64_t N = B * T;
  const auto cat = MemCategory::activations;
  BlockDeferredGrads g;
  g.d_out = Tensor::empty({N, d.C}, dt, cat, alloc);
  g.d_fc = Tensor::empty({N, cfg.traits().mlp_fan_out() * d.F}, dt, cat, alloc);
  g.d_proj = Tensor::empty({N, d.C}, dt, cat, alloc);
  g.d_qkv = Tensor::empty({B, T, d.qkv_width()}, dt, cat, alloc);
  return g;
}

int64_t BlockDeferredGrads::bytes() const {
  return int64_t(d_out.nbytes() + d_fc.nbytes() + d_proj.nbytes() + d_qkv.nbytes());
}

void block_weight_backward(const ModelConfig& cfg, int layer, const BlockWeights& gw, const BlockActs& a,
                           const BlockDeferredGrads& g) {
  const ops::ProductPrecision prec = cfg.products();
  const int64_t N = a.ln2.size(0);
  // Without an input gradient linear_backward reads only the weight's shape, here its gradient's.
  auto weight_grad = [&](const Tensor& dy, const Tensor& x, const Tensor& dw, const Tensor& db) {
    if (dw.defined()) ops::linear_backward(dy, x, dw, {}, dw, db, false, prec);
  };
  if (!cfg.is_moe_layer(layer)) {
    weight_grad(g.d_out, a.act.slice(0, {N, g.d_fc.size(1) / cfg.traits().mlp_fan_out()}), gw.out_w, gw.out_b);
    weight_grad(g.d_fc, a.ln2, gw.fc_w, gw.fc_b);
  }
  weight_grad(g.d_proj, a.att, gw.proj_w, gw.proj_b);
  weight_grad(g.d_qkv, a.ln1, gw.qkv_w, gw.qkv_b);
}

void block_backward(const ModelConfig& cfg, int layer, const BlockWeights& w, const BlockWeights& gw,
                    const Tensor& x_in, const Tensor& pos, BlockActs& a, BlockScratch& s, const Tensor& dres,
                    TensorParallelOps* tp, ExpertParallelOps* ep, BlockDeferredGrads* deferred) {
  const FamilyTraits t = cfg.traits();
  const BlockDims& d = a.dims;
  const int64_t H = d.H, KVH = d.KVH, D = d.D;
  const ops::ProductPrecision prec = cfg.products();
  // LoRA: after the frozen linear's backward wrote dx (and no weight gradient: gw holds only
  // the adapters'), each adapter of it adds its part of dx and accumulates its gradients.
  auto lora_backward = [&](BlockForwardOps::Linear which, const Tensor& dy, const Tensor& x, const Tensor& dx) {
    if (!cfg.lora.enabled()) return;
    const int64_t N = s.lora_u.size(0);
    for (const LoraSite& site : lora_sites(which, d)) {
      const LoraWeights &l = w.lora[size_t(site.target)], &g = gw.lora[size_t(site.target)];
      if (!l.a.defined()) continue;
      const Tensor dy2 = dy.slice(0, {N, dy.numel() / N});
      if (!(a.lora_dropout && cfg.lora.dropout > 0)) {
        ops::lora_backward(dy2, site.col0, x, l.a, l.b, cfg.lora.scale(), s.lora_u, s.lora_du, dx, g.a, g.b);
        continue;
      }
      // Through the forward's mask, regenerated from its key: the adapter's input gradient lands
      // in lora_dx and reaches dx through the mask.
      const uint64_t key = site_key(a.lora_key, site.target);
      const Tensor in = s.lora_x.slice(0, {N, x.numel() / N}), din = s.lora_dx.slice(0, {N, x.numel() / N});
      ops::dropout(x, in, cfg.lora.dropout, key);
      din.zero();
      ops::lora_backward(dy2, site.col0, in, l.a, l.b, cfg.lora.scale(), s.lora_u, s.lora_du, din, g.a, g.b);
      ops::dropout_add(dx, din, cfg.lora.dropout, key);
    }
  };
  using L = BlockForwardOps::Linear;
  // MLP branch: x_out = x_mid + out(act(fc(norm2(x_mid)))), or in a MoE block x_mid + shared
  // experts + routed experts.
  const int64_t N = a.ln2.size(0);
  const bool moe = cfg.is_moe_layer(layer);
  // A linear's backward: dx, and its weight and bias gradients now, or, deferred (`keep`
  // defined), its output gradient kept for block_weight_backward instead.
  auto linear_back = [&](const Tensor& dy, const Tensor& x, const Tensor& wt, const Tensor& dx, const Tensor& dw,
                         const Tensor& db, const Tensor& keep) {
    if (keep.defined()) keep.copy_from(dy);
    ops::linear_backward(dy, x, wt, dx, keep.defined() ? Tensor{} : dw, keep.defined() ? Tensor{} : db, false, prec);
  };
  const Tensor none;
  const bool defer_mlp = deferred && !moe, defer_att = deferred != nullptr;
  if (moe) moe_backward_dispatch(cfg, a.moe, s.moe, dres, ep);  // in flight during the shared experts'
  if (!moe || w.fc_w.defined()) {
    const int64_t F = moe ? cfg.shared_d_ff() : d.F, G = t.mlp_fan_out();
    const Tensor fc = a.fc.slice(0, {N, G * F}), act = a.act.slice(0, {N, F});
    const Tensor dfc = s.dfc.slice(0, {N, G * F}), dact = s.dact.slice(0, {N, F});
    linear_back(dres, act, w.out_w, dact, gw.out_w, gw.out_b, defer_mlp ? deferred->d_out : none);
    lora_backward(L::out, dres, act, dact);
    activation_backward(t, fc, dact, dfc);
    linear_back(dfc, a.ln2, w.fc_w, s.dln, gw.fc_w, gw.fc_b, defer_mlp ? deferred->d_fc : none);
    lora_backward(L::fc, dfc, a.ln2, s.dln);
  }
  if (moe)
    moe_backward_combine(cfg, w, gw, a.ln2, a.moe, s.moe, s.dln, /*accumulate_dx=*/w.fc_w.defined(), ep);
  else if (tp)
    tp->column_parallel_input_grad(s.dln);
  norm_backward(t, s.dln, a.x_mid, w.ln2_w, a.ln2_mean, a.ln2_rstd, dres, gw.ln2_w, gw.ln2_b, /*accumulate_dx=*/true);
  // Attention branch: x_mid = x_in + proj(attention(qkv(norm1(x_in)))).
  linear_back(dres, a.att, w.proj_w, s.datt, gw.proj_w, gw.proj_b, defer_att ? deferred->d_proj : none);
  lora_backward(L::proj, dres, a.att, s.datt);
  ops::attention_backward(a.qkv, a.att, s.datt, a.lse, d.kv_expand ? s.dqkv_expanded : s.dqkv, H, d.kv_expand ? H : KVH,
                          a.attention_pos);
  if (d.kv_expand) expand_kv(d, s.dqkv, s.dqkv_expanded, true);
  rope_qk(d.rope_inv_freq, s.dqkv, H, KVH, D, pos, true);
  linear_back(s.dqkv, a.ln1, w.qkv_w, s.dln, gw.qkv_w, gw.qkv_b, defer_att ? deferred->d_qkv : none);
  lora_backward(L::qkv, s.dqkv, a.ln1, s.dln);
  if (tp) tp->column_parallel_input_grad(s.dln);
  norm_backward(t, s.dln, x_in, w.ln1_w, a.ln1_mean, a.ln1_rstd, dres, gw.ln1_w, gw.ln1_b, true);
}

}  // namespace loom::model

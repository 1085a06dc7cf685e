#include "loom/model/block.h"

#include "loom/kernels/ops.h"

namespace loom::model {

static Tensor maybe(const ParamLayout& layout, const Tensor& flat, const std::string& name,
                    int64_t base) {
  if (!layout.contains(name)) return {};
  const auto& p = layout.get(name);
  return flat.slice(p.offset - base, p.shape);
}

// A view spanning consecutive parameters (they must be adjacent in the layout).
static Tensor fused(const ParamLayout& layout, const Tensor& flat,
                    std::initializer_list<std::string> names, int64_t base) {
  int64_t rows = 0, cols = -1, expect = -1, first = -1;
  for (const auto& n : names) {
    const auto& p = layout.get(n);
    LOOM_CHECK(expect < 0 || p.offset == expect, "params", n, " is not adjacent to the previous part");
    if (first < 0) first = p.offset;
    rows += p.shape[0];
    cols = p.shape.ndim() > 1 ? p.shape[1] : 1;
    expect = p.offset + p.numel();
  }
  return flat.slice(first - base, cols == 1 ? Shape{rows} : Shape{rows, cols});
}

BlockWeights block_weights(const ModelConfig& cfg, const ParamLayout& layout, const Tensor& flat,
                           int l, int64_t base) {
  const std::string p = layout.block_prefix(l);
  BlockWeights w;
  if (cfg.family == Family::gpt2) {
    w.ln1_w = maybe(layout, flat, p + "ln_1.weight", base);
    w.ln1_b = maybe(layout, flat, p + "ln_1.bias", base);
    w.qkv_w = maybe(layout, flat, p + "attn.c_attn.weight", base);
    w.qkv_b = maybe(layout, flat, p + "attn.c_attn.bias", base);
    w.proj_w = maybe(layout, flat, p + "attn.c_proj.weight", base);
    w.proj_b = maybe(layout, flat, p + "attn.c_proj.bias", base);
    w.ln2_w = maybe(layout, flat, p + "ln_2.weight", base);
    w.ln2_b = maybe(layout, flat, p + "ln_2.bias", base);
    w.fc_w = maybe(layout, flat, p + "mlp.c_fc.weight", base);
    w.fc_b = maybe(layout, flat, p + "mlp.c_fc.bias", base);
    w.out_w = maybe(layout, flat, p + "mlp.c_proj.weight", base);
    w.out_b = maybe(layout, flat, p + "mlp.c_proj.bias", base);
  } else {
    w.ln1_w = maybe(layout, flat, p + "input_layernorm.weight", base);
    w.qkv_w = fused(layout, flat, {p + "self_attn.q_proj.weight", p + "self_attn.k_proj.weight",
                                   p + "self_attn.v_proj.weight"}, base);
    w.proj_w = maybe(layout, flat, p + "self_attn.o_proj.weight", base);
    w.ln2_w = maybe(layout, flat, p + "post_attention_layernorm.weight", base);
    w.fc_w = fused(layout, flat, {p + "mlp.gate_proj.weight", p + "mlp.up_proj.weight"}, base);
    w.out_w = maybe(layout, flat, p + "mlp.down_proj.weight", base);
  }
  return w;
}

BlockActs BlockActs::allocate(const ModelConfig& cfg, int64_t B, int64_t T, DType dt,
                              Allocator& alloc) {
  const int64_t N = B * T, C = cfg.d_model, D = cfg.head_dim(), H = cfg.n_head;
  const int64_t F = cfg.d_ff, W = (H + 2 * cfg.n_kv_head) * D;
  const auto cat = MemCategory::activations;
  const bool gpt2 = cfg.family == Family::gpt2;
  BlockActs a;
  a.ln1 = Tensor::empty({N, C}, dt, cat, alloc);
  if (gpt2) a.ln1_mean = Tensor::empty({N}, dt, cat, alloc);
  a.ln1_rstd = Tensor::empty({N}, dt, cat, alloc);
  a.qkv = Tensor::empty({B, T, W}, dt, cat, alloc);
  a.att = Tensor::empty({B, T, H * D}, dt, cat, alloc);
  a.lse = Tensor::empty({B, H, T}, dt, cat, alloc);
  a.x_mid = Tensor::empty({N, C}, dt, cat, alloc);
  a.ln2 = Tensor::empty({N, C}, dt, cat, alloc);
  if (gpt2) a.ln2_mean = Tensor::empty({N}, dt, cat, alloc);
  a.ln2_rstd = Tensor::empty({N}, dt, cat, alloc);
  a.fc = Tensor::empty({N, gpt2 ? F : 2 * F}, dt, cat, alloc);
  a.act = Tensor::empty({N, F}, dt, cat, alloc);
  return a;
}

int64_t BlockActs::bytes() const {
  int64_t b = 0;
  for (const Tensor* t : {&ln1, &ln1_mean, &ln1_rstd, &qkv, &att, &lse, &x_mid, &ln2, &ln2_mean,
                          &ln2_rstd, &fc, &act})
    if (t->defined()) b += int64_t(t->nbytes());
  return b;
}

BlockScratch BlockScratch::allocate(const ModelConfig& cfg, int64_t B, int64_t T, DType dt,
                                    Allocator& alloc) {
  const int64_t N = B * T, C = cfg.d_model, D = cfg.head_dim();
  const int64_t F = cfg.d_ff, W = (cfg.n_head + 2 * cfg.n_kv_head) * D;
  const auto cat = MemCategory::workspace;
  BlockScratch s;
  s.dln = Tensor::empty({N, C}, dt, cat, alloc);
  s.dqkv = Tensor::empty({B, T, W}, dt, cat, alloc);
  s.datt = Tensor::empty({B, T, cfg.n_head * D}, dt, cat, alloc);
  s.dfc = Tensor::empty({N, cfg.family == Family::gpt2 ? F : 2 * F}, dt, cat, alloc);
  s.dact = Tensor::empty({N, F}, dt, cat, alloc);
  return s;
}

void block_forward(const ModelConfig& cfg, const BlockWeights& w, const Tensor& x_in,
                   const Tensor& pos, BlockActs& a, const Tensor& x_out) {
  const bool gpt2 = cfg.family == Family::gpt2;
  const int64_t H = cfg.n_head, KVH = cfg.n_kv_head, D = cfg.head_dim();
  if (gpt2)
    ops::layernorm_forward(x_in, w.ln1_w, w.ln1_b, a.ln1, a.ln1_mean, a.ln1_rstd, cfg.norm_eps);
  else
    ops::rmsnorm_forward(x_in, w.ln1_w, a.ln1, a.ln1_rstd, cfg.norm_eps);
  ops::linear_forward(a.ln1, w.qkv_w, w.qkv_b, a.qkv);
  if (!gpt2) {
    ops::rope_apply(a.qkv, 0, H, D, pos, cfg.rope_theta, false);
    ops::rope_apply(a.qkv, H * D, KVH, D, pos, cfg.rope_theta, false);
  }
  ops::attention_forward(a.qkv, a.att, a.lse, H, KVH);
  ops::linear_forward(a.att, w.proj_w, w.proj_b, a.x_mid);
  ops::add_inplace(a.x_mid, x_in);
  if (gpt2)
    ops::layernorm_forward(a.x_mid, w.ln2_w, w.ln2_b, a.ln2, a.ln2_mean, a.ln2_rstd, cfg.norm_eps);
  else
    ops::rmsnorm_forward(a.x_mid, w.ln2_w, a.ln2, a.ln2_rstd, cfg.norm_eps);
  ops::linear_forward(a.ln2, w.fc_w, w.fc_b, a.fc);
  if (gpt2)
    ops::gelu_forward(a.fc, a.act);
  else
    ops::swiglu_forward(a.fc, a.act);
  ops::linear_forward(a.act, w.out_w, w.out_b, x_out);
  ops::add_inplace(x_out, a.x_mid);
}

void block_backward(const ModelConfig& cfg, const BlockWeights& w, const BlockWeights& gw,
                    const Tensor& x_in, const Tensor& pos, BlockActs& a, BlockScratch& s,
                    const Tensor& dres) {
  const bool gpt2 = cfg.family == Family::gpt2;
  const int64_t H = cfg.n_head, KVH = cfg.n_kv_head, D = cfg.head_dim();
  // MLP branch: x_out = x_mid + out(act(fc(norm2(x_mid)))).
  if (gpt2) {
    ops::linear_backward(dres, a.act, w.out_w, s.dact, gw.out_w, gw.out_b);
    ops::gelu_backward(a.fc, s.dact, s.dfc);
  } else {
    ops::linear_backward(dres, a.act, w.out_w, s.dact, gw.out_w, {});
    ops::swiglu_backward(a.fc, s.dact, s.dfc);
  }
  ops::linear_backward(s.dfc, a.ln2, w.fc_w, s.dln, gw.fc_w, gw.fc_b);
  if (gpt2)
    ops::layernorm_backward(s.dln, a.x_mid, w.ln2_w, a.ln2_mean, a.ln2_rstd, dres, gw.ln2_w,
                            gw.ln2_b, /*accumulate_dx=*/true);
  else
    ops::rmsnorm_backward(s.dln, a.x_mid, w.ln2_w, a.ln2_rstd, dres, gw.ln2_w, true);
  // Attention branch: x_mid = x_in + proj(attention(qkv(norm1(x_in)))).
  ops::linear_backward(dres, a.att, w.proj_w, s.datt, gw.proj_w, gw.proj_b);
  ops::attention_backward(a.qkv, a.att, s.datt, a.lse, s.dqkv, H, KVH);
  if (!gpt2) {
    ops::rope_apply(s.dqkv, 0, H, D, pos, cfg.rope_theta, true);
    ops::rope_apply(s.dqkv, H * D, KVH, D, pos, cfg.rope_theta, true);
  }
  ops::linear_backward(s.dqkv, a.ln1, w.qkv_w, s.dln, gw.qkv_w, gw.qkv_b);
  if (gpt2)
    ops::layernorm_backward(s.dln, x_in, w.ln1_w, a.ln1_mean, a.ln1_rstd, dres, gw.ln1_w,
                            gw.ln1_b, true);
  else
    ops::rmsnorm_backward(s.dln, x_in, w.ln1_w, a.ln1_rstd, dres, gw.ln1_w, true);
}

}  // namespace loom::model

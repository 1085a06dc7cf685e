// Op entry points on Tensors: check shapes and dtypes (errors start with "[op]" and print the
// shapes), then dispatch on device and dtype to kernels/cpu or kernels/cuda. Optional
// outputs are passed as undefined Tensors ({}). Float dtypes: f32, f64 (CPU). The matrix
// products of linear layers and the LM head take a ProductPrecision: bf16 (f16) rounds their
// operands to bf16 (fp16) and accumulates in f32 (f32 tensors, CPU; kernels/cpu/rounded_operands.h).
#pragma once
#include <vector>
#include "loom/core/tensor.h"
#include "loom/kernels/cpu/cpu_kernels.h"

namespace loom::ops {

using cpu::ProductPrecision;

// y[N,O] = x[N,I] w[O,I]^T + b[O]
void linear_forward(const Tensor& x, const Tensor& w, const Tensor& b, const Tensor& y,
                    ProductPrecision prec = ProductPrecision::f32);
void linear_backward(const Tensor& dy, const Tensor& x, const Tensor& w, const Tensor& dx, const Tensor& dw,
                     const Tensor& db, bool accumulate_dx = false, ProductPrecision prec = ProductPrecision::f32);

// LoRA beside a frozen linear: y[:, col0:col0+O] += scale * (x a^T) b^T for x[N,I], a[r,I],
// b[O,r] and y [N, W] (W >= col0 + O: a column range of a fused output); u: [N, r] scratch.
void lora_forward(const Tensor& x, const Tensor& a, const Tensor& b, double scale, const Tensor& y, int64_t col0,
                  const Tensor& u);
// Its backward from dy's columns [col0, col0 + O): db += scale dy^T (x a^T), da += du^T x and
// dx += du a with du = scale dy b (all accumulate; undefined outputs are skipped). u, du: [N, r]
// scratch.
void lora_backward(const Tensor& dy, int64_t col0, const Tensor& x, const Tensor& a, const Tensor& b, double scale,
                   const Tensor& u, const Tensor& du, const Tensor& dx, const Tensor& da, const Tensor& db);

// Inverted dropout with a mask that is a pure function of (key, element index), so that a
// backward or a recomputation regenerates it: out = x * keep / (1 - p), keep = 1 with probability
// 1 - p. dropout_add: acc += g * keep / (1 - p) (the backward through the same mask).
void dropout(const Tensor& x, const Tensor& out, double p, uint64_t key);
void dropout_add(const Tensor& acc, const Tensor& g, double p, uint64_t key);

// out[N,C] = wte[tok] + wpe[pos]; tok, pos: i32[N]; wpe may be undefined.
void embedding_forward(const Tensor& tok, const Tensor& pos, const Tensor& wte, const Tensor& wpe, const Tensor& out);
void embedding_backward(const Tensor& tok, const Tensor& pos, const Tensor& dout, const Tensor& dwte,
                        const Tensor& dwpe);

void layernorm_forward(const Tensor& x, const Tensor& w, const Tensor& b, const Tensor& y, const Tensor& mean,
                       const Tensor& rstd, double eps = 1e-5);
void layernorm_backward(const Tensor& dy, const Tensor& x, const Tensor& w, const Tensor& mean, const Tensor& rstd,
                        const Tensor& dx, const Tensor& dw, const Tensor& db, bool accumulate_dx = false);
void rmsnorm_forward(const Tensor& x, const Tensor& w, const Tensor& y, const Tensor& rstd, double eps = 1e-5);
void rmsnorm_backward(const Tensor& dy, const Tensor& x, const Tensor& w, const Tensor& rstd, const Tensor& dx,
                      const Tensor& dw, bool accumulate_dx = false);

void gelu_forward(const Tensor& x, const Tensor& y);
void gelu_backward(const Tensor& x, const Tensor& dy, const Tensor& dx);
// in[N, 2F] = [gate | up] -> out[N, F]
void swiglu_forward(const Tensor& in, const Tensor& out);
void swiglu_backward(const Tensor& in, const Tensor& dout, const Tensor& din);
void add_forward(const Tensor& a, const Tensor& b, const Tensor& out);
void add_inplace(const Tensor& acc, const Tensor& x);
// dst (bf16 or f16) = src (f32) rounded to nearest even; widen: dst (f32) = src exactly. CPU.
void narrow_to_16(const Tensor& src, const Tensor& dst);
void widen_from_16(const Tensor& src, const Tensor& dst);

// x[N, W] rows; heads [col0/D, col0/D + n_heads) rotated by pos[N] (i32).
void rope_apply(const Tensor& x, int64_t col0, int64_t n_heads, int64_t head_dim, const Tensor& pos, double theta,
                bool inverse);
// The same with each rotated pair's inverse frequency given (head_dim/2 of them).
void rope_apply(const Tensor& x, int64_t col0, int64_t n_heads, int64_t head_dim, const Tensor& pos,
                const std::vector<double>& inv_freq, bool inverse);

// qkv[B, T, (H + 2 KVH) D], out[B, T, H D], lse[B, H, T]; causal. pos (optional, i32[B*T]):
// rows that pack several documents, positions restarting at 0 where each starts; position t
// then attends to keys t - pos[t] .. t, its own document's.
void attention_forward(const Tensor& qkv, const Tensor& out, const Tensor& lse, int64_t n_head, int64_t n_kv_head,
                       const Tensor& pos = {});
void attention_backward(const Tensor& qkv, const Tensor& out, const Tensor& dout, const Tensor& lse, const Tensor& dqkv,
                        int64_t n_head, int64_t n_kv_head, const Tensor& pos = {});

// x[N, C], w[V, C], targets i32[N] (negative = ignored), loss[N]; dx/dw optional (fused
// backward with dlogits scaled by grad_scale). workspace holds at least chunk * V elements.
void lm_head_xent(const Tensor& x, const Tensor& w, const Tensor& targets, const Tensor& loss, const Tensor& dx,
                  const Tensor& dw, double grad_scale, int64_t chunk, const Tensor& workspace,
                  ProductPrecision prec = ProductPrecision::f32);

void adamw_update(const Tensor& p, const Tensor& g, const Tensor& m, const Tensor& v, const cpu::AdamWParams& h,
                  double weight_decay);

}  // namespace loom::ops

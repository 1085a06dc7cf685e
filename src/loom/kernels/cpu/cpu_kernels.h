// Pointer-level CPU kernels, templated on the element type (f32 for work, f64 for gradient
// checks). Each forward sits beside its backward; shapes use B (batch), T (time), C (channels),
// N = B*T rows, V (vocabulary), H (query heads), KVH (key/value heads), D (head dim).
// Callers are ops.cpp (shape checks) and tests; nothing here validates arguments.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "loom/kernels/cpu/rounded_operands.h"

namespace loom::cpu {

// ---- linear: y[N,O] = x[N,I] W[O,I]^T + b[O] -------------------------------------------
template <class T>
void linear_forward(const T* x, const T* w, const T* b, T* y, int64_t N, int64_t I, int64_t O,
                    ProductPrecision prec = ProductPrecision::f32);
// dx[N,I] (= or +=) dy W; dw[O,I] += dy^T x; db[O] += colsum(dy). Null outputs are skipped.
template <class T>
void linear_backward(const T* dy, const T* x, const T* w, T* dx, T* dw, T* db, int64_t N, int64_t I, int64_t O,
                     bool accumulate_dx, ProductPrecision prec = ProductPrecision::f32);

// ---- LoRA beside a frozen linear (Hu et al. 2021) ----------------------------------------
// x[N,I], A[r,I], B[O,r]; y, dy: N rows of ld elements whose columns [col0, col0 + O) are the
// linear's output. Forward: u = x A^T, y[:, col0:] += scale u B^T. Backward (u recomputed):
// dB += scale dy^T u, du = scale dy B, dA += du^T x, dx[N,I] += du A. Products in T (the
// adapters are small: no rounding policy).
template <class T>
void lora_forward(const T* x, const T* a, const T* b, T scale, T* y, int64_t ld, int64_t col0, T* u, int64_t N,
                  int64_t I, int64_t O, int64_t r);
template <class T>
void lora_backward(const T* dy, int64_t ld, int64_t col0, const T* x, const T* a, const T* b, T scale, T* u, T* du,
                   T* dx, T* da, T* db, int64_t N, int64_t I, int64_t O, int64_t r);

// Inverted dropout keyed by (key, element): out[i] = x[i] * keep_i / (1 - p); with add, out[i] +=.
template <class T>
void dropout(const T* x, T* out, int64_t n, double p, uint64_t key, bool add);

// ---- embedding: out[n] = wte[tok[n]] + wpe[pos[n]] (wpe may be null) --------------------
template <class T>
void embedding_forward(const int32_t* tok, const int32_t* pos, const T* wte, const T* wpe, T* out, int64_t N,
                       int64_t C);
template <class T>
void embedding_backward(const int32_t* tok, const int32_t* pos, const T* dout, T* dwte, T* dwpe, int64_t N, int64_t C,
                        int64_t V, int64_t P);

// ---- LayerNorm / RMSNorm over the last dimension ---------------------------------------
template <class T>
void layernorm_forward(const T* x, const T* w, const T* b, T* y, T* mean, T* rstd, int64_t N, int64_t C, double eps);
template <class T>
void layernorm_backward(const T* dy, const T* x, const T* w, const T* mean, const T* rstd, T* dx, T* dw, T* db,
                        int64_t N, int64_t C, bool accumulate_dx);
template <class T>
void rmsnorm_forward(const T* x, const T* w, T* y, T* rstd, int64_t N, int64_t C, double eps);
template <class T>
void rmsnorm_backward(const T* dy, const T* x, const T* w, const T* rstd, T* dx, T* dw, int64_t N, int64_t C,
                      bool accumulate_dx);

// ---- activations ------------------------------------------------------------------------
// GELU, tanh approximation (Hendrycks & Gimpel 2016, as in GPT-2).
template <class T>
void gelu_forward(const T* x, T* y, int64_t n);
template <class T>
void gelu_backward(const T* x, const T* dy, T* dx, int64_t n);
// SwiGLU (Shazeer 2020): in[N, 2F] = [gate | up], out[N, F] = silu(gate) * up.
template <class T>
void swiglu_forward(const T* in, T* out, int64_t N, int64_t F);
template <class T>
void swiglu_backward(const T* in, const T* dout, T* din, int64_t N, int64_t F);
// out = a + b (residual). Backward is the identity into both branches (callers add).
template <class T>
void add_forward(const T* a, const T* b, T* out, int64_t n);
template <class T>
void add_inplace(T* acc, const T* x, int64_t n);

// ---- RoPE (Su et al. 2021), rotate-half convention as in Hugging Face LLaMA ------------
// Rotates n_heads heads of size D starting at column col0 of each of `rows` rows (row stride
// `stride`) by position pos[row]. inverse=true applies the transpose (the backward).
// inv_freq: each pair's inverse frequency (D/2 of them; plain RoPE: theta^(-2i/D)).
template <class T>
void rope_apply(T* x, int64_t rows, int64_t stride, int64_t col0, int64_t n_heads, int64_t D, const int32_t* pos,
                const double* inv_freq, bool inverse);

// ---- causal self-attention, tiled with an online softmax (FlashAttention-2 style) ------
// qkv[B,T,(H+2KVH)*D] holds q | k | v heads; out[B,T,H*D]; lse[B,H,T] (log-sum-exp per row,
// the only softmax state backward keeps). pos (optional, [B,T]): rows that pack several
// documents, with positions restarting at 0 where each starts; row t then attends to keys
// t - pos[t] .. t only (its own document). Without it every row attends to keys 0..t.
template <class T>
void attention_forward(const T* qkv, T* out, T* lse, int64_t B, int64_t Tn, int64_t H, int64_t KVH, int64_t D,
                       const int32_t* pos = nullptr);
// dqkv is overwritten.
template <class T>
void attention_backward(const T* qkv, const T* out, const T* dout, const T* lse, T* dqkv, int64_t B, int64_t Tn,
                        int64_t H, int64_t KVH, int64_t D, const int32_t* pos = nullptr);

// ---- LM head + softmax cross-entropy, chunked over rows --------------------------------
// For row chunks of at most `chunk` rows: logits = x W^T (a [chunk, V] workspace), loss[n] =
// logsumexp - logit[target]; targets < 0 are ignored (loss 0). When dx/dw are non-null also
// dlogits = grad_scale * (softmax - onehot), dx = dlogits W (overwrite), dw += dlogits^T x.
template <class T>
void lm_head_xent(const T* x, const T* w, const int32_t* targets, T* loss, T* dx, T* dw, int64_t N, int64_t C,
                  int64_t V, double grad_scale, int64_t chunk, T* workspace,
                  ProductPrecision prec = ProductPrecision::f32);
// Softmax cross-entropy on given logits rows (no head): loss and (optional) dlogits in place.
template <class T>
void xent_rows(T* logits, const int32_t* targets, T* loss, int64_t rows, int64_t V, double grad_scale, bool want_grad);

// ---- AdamW (Loshchilov & Hutter 2019): decoupled weight decay, bias correction ---------
struct AdamWParams {
  double lr, beta1, beta2, eps, weight_decay;
  int64_t step;             // 1-based, after increment
  double grad_scale = 1.0;  // gradients are multiplied by this first (clipping, fused)
};
template <class T>
void adamw_update(T* p, const T* g, T* m, T* v, int64_t n, const AdamWParams& h, double wd);

// Name of the instruction set the f32 hot kernels dispatched to ("avx512", "avx2", "base").
std::string hot_kernels_isa();
// The instruction-set builds this CPU runs: "base", then "avx2" (AVX2 + FMA) and "avx512"
// (F, BW, VL, DQ) where present. Kernels with per-ISA builds test each of these.
std::vector<std::string> isas_here();
// Throws "[who] instruction set 'isa' does not run on this CPU" unless isa is one of isas_here().
void check_isa_runs_here(const std::string& isa, const char* who);

}  // namespace loom::cpu

#include "loom/parallel/tp_layers.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "loom/kernels/cpu/bf16_gemm.h"
#include "loom/parallel/tp_comm.h"

namespace loom::parallel {

TensorParallelLayers::TensorParallelLayers(const comm::Group& tp, const model::ModelConfig& cfg) : tp_(tp), cfg_(cfg) {
  model::check_tensor_parallel(cfg, tp.size());
  rows_ = model::vocab_rows_per_rank(cfg, tp.size());
  first_row_ = int64_t(tp.rank()) * rows_;
}

void TensorParallelLayers::column_parallel_input_grad(const Tensor& dx) { tp::copy_to_tp_backward(tp_, dx); }

void TensorParallelLayers::row_parallel_output(const Tensor& y) { tp::reduce_from_tp_forward(tp_, y); }

static void check_f32(const Tensor& t, const char* what) {
  LOOM_CHECK(!t.defined() || t.dtype() == DType::f32, "tp", what, " must be f32, got ", t.describe());
}

void TensorParallelLayers::embedding_forward(const Tensor& tok, const Tensor& pos, const Tensor& wte, const Tensor& wpe,
                                             const Tensor& out) {
  check_f32(out, "embedding output");
  const int64_t N = tok.numel(), C = cfg_.d_model;
  LOOM_CHECK(wte.numel() == rows_ * C && out.numel() == N * C, "tp", "embedding: table ", wte.describe(),
             " and output ", out.describe(), " do not fit ", rows_, " rows of ", C);
  const int32_t* t = tok.data<int32_t>();
  const int32_t* p = pos.data<int32_t>();
  const float* table = wte.data<float>();
  const float* ptable = wpe.defined() && tp_.rank() == 0 ? wpe.data<float>() : nullptr;
  float* o = out.data<float>();
  for (int64_t n = 0; n < N; ++n) {
    float* row = o + n * C;
    const int64_t r = int64_t(t[n]) - first_row_;
    if (r >= 0 && r < rows_)
      std::memcpy(row, table + r * C, size_t(C) * sizeof(float));
    else
      std::fill(row, row + C, 0.0f);
    // Position rows join on one rank only; the all-reduce adds the token row from its owner.
    if (ptable)
      for (int64_t c = 0; c < C; ++c) row[c] += ptable[int64_t(p[n]) * C + c];
  }
  tp::reduce_from_tp_forward(tp_, out);
}

void TensorParallelLayers::embedding_backward(const Tensor& tok, const Tensor& pos, const Tensor& dout,
                                              const Tensor& dwte, const Tensor& dwpe) {
  const int64_t N = tok.numel(), C = cfg_.d_model;
  const int32_t* t = tok.data<int32_t>();
  const int32_t* p = pos.data<int32_t>();
  const float* d = dout.data<float>();
  float* gt = dwte.data<float>();
  float* gp = dwpe.defined() ? dwpe.data<float>() : nullptr;  // replicated: every rank, same value
  for (int64_t n = 0; n < N; ++n) {
    const float* row = d + n * C;
    const int64_t r = int64_t(t[n]) - first_row_;
    if (r >= 0 && r < rows_)
      for (int64_t c = 0; c < C; ++c) gt[r * C + c] += row[c];
    if (gp)
      for (int64_t c = 0; c < C; ++c) gp[int64_t(p[n]) * C + c] += row[c];
  }
}

void TensorParallelLayers::head_xent(const Tensor& x, const Tensor& w, const Tensor& targets, const Tensor& loss,
                                     const Tensor& dx, const Tensor& dw, double grad_scale, int64_t chunk) {
  check_f32(x, "head input");
  const int64_t C = cfg_.d_model, N = x.numel() / C, V = rows_;
  LOOM_CHECK(w.numel() == V * C, "tp", "head weight ", w.describe(), " is not ", V, " rows of ", C);
  const int64_t valid = std::clamp<int64_t>(cfg_.vocab_size - first_row_, 0, V);  // padding after
  const int64_t R = std::min(chunk, N);
  if (!logits_.defined() || logits_.numel() < R * V)
    logits_ = Tensor::empty({R * V}, DType::f32, MemCategory::workspace);
  Tensor row_max = Tensor::empty({R}, DType::f32, MemCategory::workspace);
  Tensor row_sums = Tensor::empty({2 * R}, DType::f32, MemCategory::workspace);  // [sum exp | target logit] per chunk
  const bool want_grad = dx.defined() || dw.defined();
  const float gs = float(grad_scale);
  const cpu::ProductPrecision prec = cfg_.products();  // rounded as ops::lm_head_xent does
  const bool engine = cpu::on_bf16_gemm(prec);         // then bf16_gemm's packing rounds
  const float* xp = engine ? x.data<float>() : cpu::rounded_operand(prec, 0, x.data<float>(), N * C);
  const float* wp = engine ? w.data<float>() : cpu::rounded_operand(prec, 1, w.data<float>(), V * C);
  const int32_t* tg = targets.data<int32_t>();
  float* lp = loss.data<float>();
  float* L = logits_.data<float>();
  for (int64_t r0 = 0; r0 < N; r0 += chunk) {
    const int64_t nr = std::min(chunk, N - r0);
    cpu::product_gemm(engine, false, true, nr, V, C, xp + r0 * C, C, wp, C, 0.0f, L, V);
    float* mx = row_max.data<float>();
    for (int64_t r = 0; r < nr; ++r) {
      float m = std::numeric_limits<float>::lowest();
      for (int64_t j = 0; j < valid; ++j) m = std::max(m, L[r * V + j]);
      mx[r] = m;
    }
    tp::max_over_tp(tp_, row_max.slice(0, {nr}));
    float* se = row_sums.data<float>();
    for (int64_t r = 0; r < nr; ++r) {
      float* l = L + r * V;
      const int64_t t = int64_t(tg[r0 + r]) - first_row_;
      se[nr + r] = t >= 0 && t < valid ? l[t] : 0.0f;
      float s = 0;
      for (int64_t j = 0; j < valid; ++j) {
        l[j] = std::exp(l[j] - mx[r]);
        s += l[j];
      }
      std::fill(l + valid, l + V, 0.0f);  // padding rows of the table: not in the softmax
      se[r] = s;
    }
    // One reduction for both: every rank's sum of exponentials and the owner's target logit.
    tp::sum_over_tp(tp_, row_sums.slice(0, {2 * nr}));
    for (int64_t r = 0; r < nr; ++r) {
      float* l = L + r * V;
      const int32_t target = tg[r0 + r];
      if (target < 0) {
        lp[r0 + r] = 0;
        if (want_grad) std::fill(l, l + V, 0.0f);
        continue;
      }
      lp[r0 + r] = std::log(se[r]) + mx[r] - se[nr + r];
      if (want_grad) {
        const float inv = gs / se[r];
        for (int64_t j = 0; j < valid; ++j) l[j] *= inv;
        const int64_t t = int64_t(target) - first_row_;
        if (t >= 0 && t < valid) l[t] -= gs;
      }
    }
    if (want_grad && !engine) cpu::round_operand(prec, L, L, nr * V);
    if (dx.defined())
      cpu::product_gemm(engine, false, false, nr, C, V, L, V, wp, C, 0.0f, dx.data<float>() + r0 * C, C);
    if (dw.defined()) cpu::product_gemm(engine, true, false, V, C, nr, L, V, xp + r0 * C, C, 1.0f, dw.data<float>(), C);
  }
  // f before the head: the input gradient is the sum of every rank's vocabulary share.
  if (dx.defined()) tp::copy_to_tp_backward(tp_, dx);
}

void TensorParallelLayers::sum_partial_grads(const model::ParamLayout& layout, const DataParallel& engine) const {
  for (const auto& p : layout.params())
    if (p.tp_grad_partial)
      for (const Tensor& g : engine.held_grads(p.offset, p.offset + p.numel())) tp_.all_reduce(g);
}

}  // namespace loom::parallel

// OneBitAdam's two compressed steps (ZeRO-0 and ZeRO-1) and their accounting.
#include "loom/optim/onebit_adam.h"

#include <algorithm>
#include <utility>

namespace loom::optim {

OneBitAdam::OneBitAdam(comm::Group dp, const AdamWConfig& cfg, const std::vector<int64_t>& unit_sizes)
    : cfg_(cfg), n_(dp.size()) {
  for (int64_t n : unit_sizes) exchanges_.push_back(std::make_unique<comm::OneBitAllReduce>(dp, n));
}

void OneBitAdam::count(const comm::OneBitAllReduce& x, bool sent) {
  totals_.comm_s += x.last_comm_seconds();
  totals_.compute_s += x.last_compute_seconds();
  if (sent) totals_.wire_bytes += x.wire_bytes();
}

OneBitAdam::Totals OneBitAdam::take_totals() { return std::exchange(totals_, Totals{}); }

void OneBitAdam::step_replicated(size_t unit, AdamW& adam, float* params, const float* grads, float grad_scale,
                                 double lr) {
  const float b1 = float(cfg_.beta1), inv_n = 1.f / float(n_);
  float* m = adam.exp_avg().data<float>();
  const int64_t n = adam.end() - adam.begin();
#pragma omp parallel for schedule(static) if (n > 65536)
  for (int64_t j = 0; j < n; ++j) m[j] = b1 * m[j] * inv_n + (1.f - b1) * grads[j] * grad_scale;
  exchanges_[unit]->sum(m);
  count(*exchanges_[unit], true);
  // Bounded at 2 lr per element, as step_owner: a parameter whose gradients were tiny until the
  // freeze (the token-table rows of rare tokens) has a tiny v, and the sign noise of the
  // compressed momentum over sqrt(v) would step it far every step.
  adam.step_frozen_variance(params, lr, cfg_.freeze_step, 2.f);
}

void OneBitAdam::step_owner(size_t unit, AdamW& adam, int64_t unit_begin, float* unit_params, const float* unit_grads,
                            float grad_scale, double lr) {
  comm::OneBitAllReduce& x = *exchanges_[unit];
  const int64_t size = x.size(), c = adam.end() - adam.begin();
  // Working buffers for this unit only: kept between steps, the largest unit's (the embedding or
  // the head) would sit beside the model states for the whole run, unaccounted for.
  Tensor scaled_t = Tensor::empty({size}, DType::f32, MemCategory::comm);
  Tensor ghat_t = Tensor::empty({c}, DType::f32, MemCategory::comm);
  Tensor next_t = Tensor::empty({c}, DType::f32, MemCategory::comm);
  float* scaled = scaled_t.data<float>();
  float* ghat = ghat_t.data<float>();
  float* next = next_t.data<float>();
#pragma omp parallel for schedule(static) if (size > 65536)
  for (int64_t j = 0; j < size; ++j) scaled[j] = unit_grads[j] * grad_scale;
  x.reduce_to_owner(scaled, ghat);
  count(x, false);
  const float b1 = float(cfg_.beta1);
  float* m = adam.exp_avg().data<float>();
  for (int64_t j = 0; j < c; ++j) m[j] = b1 * m[j] + (1.f - b1) * ghat[j];
  const float* p = unit_params + (adam.begin() - unit_begin);
  std::copy_n(p, c, next);
  // A parameter whose gradient was ~0 until the freeze has v ~ 0, and the sign noise of its
  // compressed gradient divided by sqrt(v) makes a huge step; compressed with its block it would
  // set the whole block's scale. Bounding the step at 2 lr (Adam's own steps are about lr) keeps
  // one such element from wiping out its 1023 neighbours.
  adam.step_frozen_variance(next, lr, cfg_.freeze_step, 2.f);
  for (int64_t j = 0; j < c; ++j) next[j] -= p[j];  // the change this step
  x.all_gather_add(next, unit_params);
  count(x, true);
}

}  // namespace loom::optim

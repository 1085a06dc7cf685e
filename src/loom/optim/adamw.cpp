#include "loom/optim/adamw.h"

#include <algorithm>
#include <cmath>

#include "loom/core/trace.h"
#include "loom/kernels/cpu/cpu_kernels.h"

namespace loom::optim {

AdamW::AdamW(const AdamWConfig& cfg, int64_t begin, int64_t end, std::vector<DecaySpan> spans, Allocator& alloc,
             bool resident_moments)
    : cfg_(cfg), begin_(begin), end_(end) {
  LOOM_CHECK(begin >= 0 && end >= begin, "adamw", "bad range [", begin, ", ", end, ")");
  LOOM_CHECK(cfg.lr >= 0, "config", "optim.lr must be >= 0, got ", cfg.lr);
  LOOM_CHECK(cfg.beta1 >= 0 && cfg.beta1 < 1, "config", "optim.beta1 must be in [0, 1), got ", cfg.beta1);
  LOOM_CHECK(cfg.beta2 >= 0 && cfg.beta2 < 1, "config", "optim.beta2 must be in [0, 1), got ", cfg.beta2);
  LOOM_CHECK(cfg.eps > 0, "config", "optim.eps must be positive, got ", cfg.eps);
  LOOM_CHECK(cfg.weight_decay >= 0, "config", "optim.weight_decay must be >= 0, got ", cfg.weight_decay);
  std::sort(spans.begin(), spans.end(), [](auto& a, auto& b) { return a.begin < b.begin; });
  for (const auto& s : spans) {
    const int64_t b = std::max(s.begin, begin), e = std::min(s.end, end);
    if (b < e) spans_.push_back({b, e, s.decay});
  }
  if (!resident_moments) return;
  m_ = Tensor::zeros({end - begin}, DType::f32, MemCategory::optimizer, alloc);
  v_ = Tensor::zeros({end - begin}, DType::f32, MemCategory::optimizer, alloc);
}

void AdamW::step(float* p, const float* g, double lr, double grad_scale) {
  LOOM_CHECK(moments_resident(), "adamw", "the moments of [", begin_, ", ", end_, ") are offloaded: pass them");
  begin_step();
  update(p, g, m_.data<float>(), v_.data<float>(), begin_, end_, lr, grad_scale);
}

void AdamW::update(float* p, const float* g, float* m, float* v, int64_t lo, int64_t hi, double lr, double grad_scale) {
  trace::Span span("adamw", "compute", {{"elements", hi - lo}});
  LOOM_CHECK(begin_ <= lo && lo <= hi && hi <= end_, "adamw", "piece [", lo, ", ", hi, ") outside [", begin_, ", ",
             end_, ")");
  cpu::AdamWParams h{lr, cfg_.beta1, cfg_.beta2, cfg_.eps, cfg_.weight_decay, step_, grad_scale};
  // Each run of [lo, hi) with its decay (indices no span covers, which should not happen, get none).
  auto run = [&](int64_t b, int64_t e, double wd) {
    if (b < e) cpu::adamw_update<float>(p + (b - lo), g + (b - lo), m + (b - lo), v + (b - lo), e - b, h, wd);
  };
  int64_t covered = lo;
  for (const auto& s : spans_) {
    const int64_t b = std::max(s.begin, lo), e = std::min(s.end, hi);
    if (b >= e) continue;
    run(covered, b, 0.0);
    run(b, e, s.decay ? cfg_.weight_decay : 0.0);
    covered = e;
  }
  run(covered, hi, 0.0);
}

void AdamW::step_frozen_variance(float* p, double lr, int64_t freeze_step, float max_ratio) {
  trace::Span span("adamw frozen variance", "compute", {{"elements", end_ - begin_}});
  ++step_;
  const double bc1 = 1.0 - std::pow(cfg_.beta1, double(step_));
  const double bc2 = 1.0 - std::pow(cfg_.beta2, double(std::max<int64_t>(1, freeze_step)));
  const float step_size = float(lr / bc1), inv_sqrt_bc2 = float(1.0 / std::sqrt(bc2)), eps = float(cfg_.eps);
  const float* m = m_.data<float>();
  const float* v = v_.data<float>();
  auto update = [&](int64_t b, int64_t e, double wd) {
    const float decay = float(1.0 - lr * wd);
#pragma omp parallel for schedule(static) if (e - b > 65536)
    for (int64_t i = b - begin_; i < e - begin_; ++i) {
      // v == 0: no gradient ever reached this element before the freeze (the lookup rows of
      // tokens not yet seen). Its momentum now is the compression's sign noise, which
      // divided by eps alone would throw the weight arbitrarily far: it keeps still, as
      // under AdamW, apart from the decay.
      float r = v[i] > 0 ? m[i] / (std::sqrt(v[i]) * inv_sqrt_bc2 + eps) : 0.f;  // times lr / bc1
      if (max_ratio > 0) r = std::clamp(r, -max_ratio * float(bc1), max_ratio * float(bc1));
      p[i] = p[i] * decay - step_size * r;
    }
  };
  int64_t covered = begin_;
  for (const auto& s : spans_) {
    if (s.begin > covered) update(covered, s.begin, 0.0);
    update(s.begin, s.end, s.decay ? cfg_.weight_decay : 0.0);
    covered = s.end;
  }
  if (covered < end_) update(covered, end_, 0.0);
}

}  // namespace loom::optim

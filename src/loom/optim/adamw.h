// AdamW over a contiguous range of a flat parameter buffer: the whole model on one rank, or
// one rank's shard under ZeRO. Weight decay follows the parameter layout's decay mask.
// Owns the two moment buffers (category optimizer) unless they are offloaded (the caller then
// passes them to each step); knows nothing of communication.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "loom/core/tensor.h"
#include "loom/optim/optimizer_kind.h"

namespace loom::optim {

struct AdamWConfig {
  double lr = 6e-4;  // peak learning rate (the schedule scales it per step)
  double beta1 = 0.9;
  double beta2 = 0.95;
  double eps = 1e-8;
  double weight_decay = 0.1;
  OptimizerKind kind = OptimizerKind::adamw;
  int64_t freeze_step = 100;
};

// A run of parameters [begin, end) (flat indices) that does or does not decay.
struct DecaySpan {
  int64_t begin, end;
  bool decay;
};

class AdamW {
 public:
  // State for flat indices [begin, end); `spans` cover at least that range. Without
  // `resident_moments` the moments are never allocated: the caller keeps them (parallel.offload).
  AdamW(const AdamWConfig& cfg, int64_t begin, int64_t end, std::vector<DecaySpan> spans,
        Allocator& alloc = cpu_allocator(), bool resident_moments = true);

  // p and g point at flat index `begin` (i.e. the shard). lr is this step's learning rate;
  // the gradients are taken as g * grad_scale (clipping without a separate pass).
  void step(float* p, const float* g, double lr, double grad_scale = 1.0);
  // The same with the moments held elsewhere (parallel.offload), a piece at a time, after
  // release_moments(): begin_step() once per step, then update() for each piece [lo, hi) of
  // [begin, end) with p, g, m and v pointing at flat index lo.
  void begin_step() { ++step_; }
  void update(float* p, const float* g, float* m, float* v, int64_t lo, int64_t hi, double lr, double grad_scale = 1.0);
  // Frees the moment buffers: from now on the caller keeps them (parallel.offload).
  void release_moments() { m_ = v_ = {}; }
  bool moments_resident() const { return m_.defined(); }

  // 1-bit Adam after the freeze: the moment buffer already holds this step's (averaged)
  // momentum; the variance stays as it was at `freeze_step`, bias correction included.
  // max_ratio > 0 bounds each element's |m_hat / (sqrt(v_hat) + eps)|, the step in units of lr.
  // Elements whose frozen variance is 0 (never had a gradient) only decay.
  void step_frozen_variance(float* p, double lr, int64_t freeze_step, float max_ratio = 0);

  int64_t begin() const { return begin_; }
  int64_t end() const { return end_; }
  int64_t step_count() const { return step_; }
  void set_step_count(int64_t s) { step_ = s; }
  const Tensor& exp_avg() const { return m_; }
  const Tensor& exp_avg_sq() const { return v_; }
  const AdamWConfig& config() const { return cfg_; }

 private:
  AdamWConfig cfg_;
  int64_t begin_, end_, step_ = 0;
  std::vector<DecaySpan> spans_;  // clipped to [begin, end), sorted
  Tensor m_, v_;
};

}  // namespace loom::optim

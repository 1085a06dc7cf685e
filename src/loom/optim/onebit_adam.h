// 1-bit Adam past its warm-up (Tang et al. 2021, DeepSpeed's OnebitAdam): the variance frozen at
// `freeze_step` and the momentum averaged over the data-parallel ranks by a 1-bit compressed
// all-reduce with error feedback (comm/onebit.h), one exchange per unit of the flat buffer.
// Owns the exchanges and their error-feedback state; the moments stay in the AdamW of each unit.
#pragma once
#include <cstdint>
#include <memory>
#include <vector>

#include "loom/comm/onebit.h"
#include "loom/optim/adamw.h"

namespace loom::optim {

class OneBitAdam {
 public:
  // One exchange over `dp` per unit, of that unit's size.
  OneBitAdam(comm::Group dp, const AdamWConfig& cfg, const std::vector<int64_t>& unit_sizes);

  // After `optimizer_steps` steps: past the warm-up, gradients stay local and the step below
  // replaces AdamW's.
  bool compressing(int64_t optimizer_steps) const { return optimizer_steps >= cfg_.freeze_step; }

  // ZeRO-0 (every rank holds the whole unit, and `adam` the whole unit's moments): each rank's
  // momentum estimate b1 m / n + (1 - b1) g, summed over ranks compressed, is the new momentum;
  // the weights then step with the frozen variance. `params` and `grads` point at adam.begin().
  void step_replicated(size_t unit, AdamW& adam, float* params, const float* grads, float grad_scale, double lr);
  // ZeRO-1 (`adam` holds this rank's chunk of the unit): the chunk's owner gets the compressed
  // sum of the ranks' gradients for it, updates its momentum and weights, and sends the weight
  // change compressed to every rank, so every copy of the unit changes by the same values.
  // `unit_params` and `unit_grads` hold the whole unit, which starts at flat index `unit_begin`.
  void step_owner(size_t unit, AdamW& adam, int64_t unit_begin, float* unit_params, const float* unit_grads,
                  float grad_scale, double lr);

  // The exchanges, per unit (checkpoints save and load their error feedback).
  const std::vector<std::unique_ptr<comm::OneBitAllReduce>>& exchanges() const { return exchanges_; }
  // Since the last call: seconds in the exchanges' collectives, seconds compressing and
  // decoding, and bytes this rank sent.
  struct Totals {
    double comm_s = 0, compute_s = 0;
    int64_t wire_bytes = 0;
  };
  Totals take_totals();

 private:
  void count(const comm::OneBitAllReduce& x, bool sent);

  AdamWConfig cfg_;
  int n_;  // ranks
  std::vector<std::unique_ptr<comm::OneBitAllReduce>> exchanges_;
  Totals totals_;
};

}  // namespace loom::optim

// Dynamic loss scaling for fp16 training (Micikevicius et al. 2018, "Mixed Precision Training",
// section 3.2): the loss, and so every gradient, is multiplied by a scale S so that small
// gradients survive fp16's range; a step whose gradients overflowed (a non-finite global norm,
// the same value on every rank) is skipped and S halved; after `window` clean steps in a row S
// doubles. Pure state: the trainer applies it and checkpoints it.
#pragma once
#include <cstdint>

namespace loom::optim {

struct LossScaleConfig {
  bool dynamic = false;    // off: scale 1, nothing skipped
  double initial = 65536;  // 2^16
  int64_t window = 1000;   // clean steps before the scale doubles
};

class LossScaler {
 public:
  explicit LossScaler(const LossScaleConfig& cfg);
  double scale() const { return scale_; }
  int64_t clean_steps() const { return clean_; }
  bool enabled() const { return cfg_.dynamic; }
  // After a step's gradients: true when they are finite (apply the step, with gradients divided
  // by scale() first: the value before this call). false: skip the step; the scale is halved.
  // Throws "[train] loss scale ..." once it would fall below 1: fp16 cannot hold the gradients.
  bool update(bool finite);
  // Checkpointed state.
  void restore(double scale, int64_t clean_steps);

 private:
  LossScaleConfig cfg_;
  double scale_;
  int64_t clean_ = 0;
};

}  // namespace loom::optim

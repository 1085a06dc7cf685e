#include "loom/optim/loss_scale.h"

#include "loom/core/error.h"

namespace loom::optim {

LossScaler::LossScaler(const LossScaleConfig& cfg) : cfg_(cfg), scale_(cfg.dynamic ? cfg.initial : 1.0) {
  LOOM_CHECK(!cfg.dynamic || (cfg.initial >= 1 && cfg.window >= 1), "config",
             "optim.loss_scale_initial must be at least 1 and optim.loss_scale_window at least 1");
}

bool LossScaler::update(bool finite) {
  if (!cfg_.dynamic) return finite;
  if (!finite) {
    LOOM_CHECK(scale_ / 2 >= 1, "train", "loss scale would fall below 1 after an overflow at scale ", scale_,
               ": the fp16 gradients overflow even unscaled (lower optim.lr, or train in bf16)");
    scale_ /= 2;
    clean_ = 0;
    return false;
  }
  if (++clean_ >= cfg_.window) {
    scale_ *= 2;
    clean_ = 0;
  }
  return true;
}

void LossScaler::restore(double scale, int64_t clean_steps) {
  scale_ = scale;
  clean_ = clean_steps;
}

}  // namespace loom::optim

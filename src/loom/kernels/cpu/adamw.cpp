// AdamW update over a flat range (Loshchilov & Hutter 2019, Algorithm 2): decoupled weight
// decay p -= lr * wd * p, then the bias-corrected Adam step.
#include <cmath>

#include "loom/kernels/cpu/cpu_kernels.h"

namespace loom::cpu {

template <class T>
void adamw_update(T* p, const T* g, T* m, T* v, int64_t n, const AdamWParams& h, double wd) {
  const double bc1 = 1.0 - std::pow(h.beta1, double(h.step));
  const double bc2 = 1.0 - std::pow(h.beta2, double(h.step));
  const T b1 = T(h.beta1), b2 = T(h.beta2), eps = T(h.eps);
  const T step_size = T(h.lr / bc1);
  const T inv_sqrt_bc2 = T(1.0 / std::sqrt(bc2));
  const T decay = T(1.0 - h.lr * wd);
  const T gs = T(h.grad_scale);
#pragma omp parallel for schedule(static) if (n > 65536)
  for (int64_t i = 0; i < n; ++i) {
    const T gi = g[i] * gs;
    const T mi = b1 * m[i] + (T(1) - b1) * gi;
    const T vi = b2 * v[i] + (T(1) - b2) * gi * gi;
    m[i] = mi;
    v[i] = vi;
    p[i] = p[i] * decay - step_size * mi / (std::sqrt(vi) * inv_sqrt_bc2 + eps);
  }
}

template void adamw_update<float>(float*, const float*, float*, float*, int64_t, const AdamWParams&, double);
template void adamw_update<double>(double*, const double*, double*, double*, int64_t, const AdamWParams&, double);

}  // namespace loom::cpu

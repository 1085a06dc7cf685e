// LayerNorm (Ba et al. 2016) and RMSNorm (Zhang & Sennrich 2019) over the last dimension.
// Statistics are accumulated in f64 for f32 inputs; weight/bias gradients are reduced over
// rows in a fixed order per column block, so results do not depend on the thread count.
#include <algorithm>
#include <cmath>
#include <vector>

#include "loom/kernels/cpu/cpu_kernels.h"

namespace loom::cpu {

namespace {
// Row sums in f64 over eight interleaved partial sums combined in a fixed order: vectorisable
// (a single running sum is a chain of dependent adds) and independent of threads and of N.
template <class F>
inline double sum8(int64_t C, F term) {
  double acc[8] = {};
  int64_t c = 0;
  for (; c + 8 <= C; c += 8)
    for (int k = 0; k < 8; ++k) acc[k] += term(c + k);
  double tail = 0;
  for (; c < C; ++c) tail += term(c);
  return ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7])) + tail;
}
}  // namespace

template <class T>
void layernorm_forward(const T* x, const T* w, const T* b, T* y, T* mean, T* rstd, int64_t N, int64_t C, double eps) {
#pragma omp parallel for schedule(static) if (N * C > 16384)
  for (int64_t n = 0; n < N; ++n) {
    const T* xr = x + n * C;
    const double mu = sum8(C, [&](int64_t c) { return double(xr[c]); }) / double(C);
    const double v = sum8(C, [&](int64_t c) {
      const double d = double(xr[c]) - mu;
      return d * d;
    });
    const double rs = 1.0 / std::sqrt(v / double(C) + eps);
    const T m = T(mu), r = T(rs);
    T* yr = y + n * C;
    for (int64_t c = 0; c < C; ++c) yr[c] = (xr[c] - m) * r * w[c] + (b ? b[c] : T(0));
    mean[n] = m;
    rstd[n] = r;
  }
}

template <class T>
void layernorm_backward(const T* dy, const T* x, const T* w, const T* mean, const T* rstd, T* dx, T* dw, T* db,
                        int64_t N, int64_t C, bool accumulate_dx) {
  if (dx) {
#pragma omp parallel for schedule(static) if (N * C > 16384)
    for (int64_t n = 0; n < N; ++n) {
      const T* dyr = dy + n * C;
      const T* xr = x + n * C;
      const T m = mean[n], r = rstd[n];
      // g = dy * w, xhat = (x - m) r. Two passes over the row (it is in L1): one pass with
      // both sums' sixteen f64 accumulators spills on the baseline build and runs 45% slower.
      const double sum_g = sum8(C, [&](int64_t c) { return double(dyr[c]) * double(w[c]); });
      const double sum_gx = sum8(C, [&](int64_t c) { return double(dyr[c]) * double(w[c]) * double((xr[c] - m) * r); });
      const T mg = T(sum_g / double(C)), mgx = T(sum_gx / double(C));
      T* dxr = dx + n * C;
      for (int64_t c = 0; c < C; ++c) {
        const T xhat = (xr[c] - m) * r;
        const T v = r * (dyr[c] * w[c] - mg - xhat * mgx);
        dxr[c] = accumulate_dx ? dxr[c] + v : v;
      }
    }
  }
  if (dw || db) {
    constexpr int64_t kCols = 64;
#pragma omp parallel for schedule(static) if (N * C > 16384)
    for (int64_t c0 = 0; c0 < C; c0 += kCols) {
      const int64_t c1 = std::min(C, c0 + kCols);
      T aw[kCols] = {}, ab[kCols] = {};
      for (int64_t n = 0; n < N; ++n) {
        const T* dyr = dy + n * C;
        const T* xr = x + n * C;
        const T m = mean[n], r = rstd[n];
        for (int64_t c = c0; c < c1; ++c) {
          aw[c - c0] += dyr[c] * (xr[c] - m) * r;
          ab[c - c0] += dyr[c];
        }
      }
      for (int64_t c = c0; c < c1; ++c) {
        if (dw) dw[c] += aw[c - c0];
        if (db) db[c] += ab[c - c0];
      }
    }
  }
}

template <class T>
void rmsnorm_forward(const T* x, const T* w, T* y, T* rstd, int64_t N, int64_t C, double eps) {
#pragma omp parallel for schedule(static) if (N * C > 16384)
  for (int64_t n = 0; n < N; ++n) {
    const T* xr = x + n * C;
    const double ss = sum8(C, [&](int64_t c) { return double(xr[c]) * double(xr[c]); });
    const T r = T(1.0 / std::sqrt(ss / double(C) + eps));
    T* yr = y + n * C;
    for (int64_t c = 0; c < C; ++c) yr[c] = xr[c] * r * w[c];
    rstd[n] = r;
  }
}

template <class T>
void rmsnorm_backward(const T* dy, const T* x, const T* w, const T* rstd, T* dx, T* dw, int64_t N, int64_t C,
                      bool accumulate_dx) {
  if (dx) {
#pragma omp parallel for schedule(static) if (N * C > 16384)
    for (int64_t n = 0; n < N; ++n) {
      const T* dyr = dy + n * C;
      const T* xr = x + n * C;
      const T r = rstd[n];
      const double sum_gx = sum8(C, [&](int64_t c) { return double(dyr[c]) * double(w[c]) * double(xr[c]); });
      const T k = T(sum_gx / double(C)) * r * r;
      T* dxr = dx + n * C;
      for (int64_t c = 0; c < C; ++c) {
        const T v = r * (dyr[c] * w[c] - xr[c] * k);
        dxr[c] = accumulate_dx ? dxr[c] + v : v;
      }
    }
  }
  if (dw) {
    constexpr int64_t kCols = 64;
#pragma omp parallel for schedule(static) if (N * C > 16384)
    for (int64_t c0 = 0; c0 < C; c0 += kCols) {
      const int64_t c1 = std::min(C, c0 + kCols);
      T aw[kCols] = {};
      for (int64_t n = 0; n < N; ++n)
        for (int64_t c = c0; c < c1; ++c) aw[c - c0] += dy[n * C + c] * x[n * C + c] * rstd[n];
      for (int64_t c = c0; c < c1; ++c) dw[c] += aw[c - c0];
    }
  }
}

#define INSTANTIATE(T)                                                                                                \
  template void layernorm_forward<T>(const T*, const T*, const T*, T*, T*, T*, int64_t, int64_t, double);             \
  template void layernorm_backward<T>(const T*, const T*, const T*, const T*, const T*, T*, T*, T*, int64_t, int64_t, \
                                      bool);                                                                          \
  template void rmsnorm_forward<T>(const T*, const T*, T*, T*, int64_t, int64_t, double);                             \
  template void rmsnorm_backward<T>(const T*, const T*, const T*, const T*, T*, T*, int64_t, int64_t, bool);
INSTANTIATE(float)
INSTANTIATE(double)
#undef INSTANTIATE

}  // namespace loom::cpu

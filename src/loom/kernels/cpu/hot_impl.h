// The compute-bound f32 kernels (attention, GELU, SwiGLU, softmax rows), written once and
// compiled per instruction set by hot_{base,avx2,avx512}.cpp, each of which defines
// LOOM_ISA as its namespace. dispatch.cpp picks one at run time. Included nowhere else.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "loom/kernels/cpu/vec_math.h"

namespace loom::cpu::LOOM_ISA {

// Sixteen-way partial reductions so that the compiler vectorises them without -ffast-math.
template <class T>
inline T row_max(const T* x, int64_t n) {
  T acc[16];
  for (int k = 0; k < 16; ++k) acc[k] = T(-1e30);
  int64_t j = 0;
  for (; j + 16 <= n; j += 16)
    for (int k = 0; k < 16; ++k) acc[k] = x[j + k] > acc[k] ? x[j + k] : acc[k];
  T m = T(-1e30);
  for (int k = 0; k < 16; ++k) m = acc[k] > m ? acc[k] : m;
  for (; j < n; ++j) m = x[j] > m ? x[j] : m;
  return m;
}

// x[j] = exp(x[j] - shift); returns the sum.
template <class T>
inline T exp_shift_sum(T* x, int64_t n, T shift) {
  T acc[16] = {};
  int64_t j = 0;
  for (; j + 16 <= n; j += 16)
    for (int k = 0; k < 16; ++k) {
      T e = vexp<T>(x[j + k] - shift);
      x[j + k] = e;
      acc[k] += e;
    }
  T s = 0;
  for (int k = 0; k < 16; ++k) s += acc[k];
  for (; j < n; ++j) {
    x[j] = vexp<T>(x[j] - shift);
    s += x[j];
  }
  return s;
}

template <class T>
void gelu_forward(const T* x, T* y, int64_t n) {
  const T c = T(0.7978845608028654), k = T(0.044715);
#pragma omp parallel for schedule(static) if (n > 32768)
  for (int64_t i = 0; i < n; ++i) {
    T v = x[i];
    T t = vtanh<T>(c * (v + k * v * v * v));
    y[i] = T(0.5) * v * (T(1) + t);
  }
}

template <class T>
void gelu_backward(const T* x, const T* dy, T* dx, int64_t n) {
  const T c = T(0.7978845608028654), k = T(0.044715);
#pragma omp parallel for schedule(static) if (n > 32768)
  for (int64_t i = 0; i < n; ++i) {
    T v = x[i];
    T t = vtanh<T>(c * (v + k * v * v * v));
    T dt = c * (T(1) + T(3) * k * v * v) * (T(1) - t * t);
    dx[i] = dy[i] * (T(0.5) * (T(1) + t) + T(0.5) * v * dt);
  }
}

template <class T>
void swiglu_forward(const T* in, T* out, int64_t N, int64_t F) {
#pragma omp parallel for schedule(static) if (N * F > 32768)
  for (int64_t r = 0; r < N; ++r) {
    const T* g = in + r * 2 * F;
    const T* u = g + F;
    T* o = out + r * F;
    for (int64_t j = 0; j < F; ++j) o[j] = g[j] * vsigmoid<T>(g[j]) * u[j];
  }
}

template <class T>
void swiglu_backward(const T* in, const T* dout, T* din, int64_t N, int64_t F) {
#pragma omp parallel for schedule(static) if (N * F > 32768)
  for (int64_t r = 0; r < N; ++r) {
    const T* g = in + r * 2 * F;
    const T* u = g + F;
    const T* d = dout + r * F;
    T* dg = din + r * 2 * F;
    T* du = dg + F;
    for (int64_t j = 0; j < F; ++j) {
      T s = vsigmoid<T>(g[j]);
      T silu = g[j] * s;
      du[j] = d[j] * silu;
      dg[j] = d[j] * u[j] * (s + silu * (T(1) - s));
    }
  }
}

template <class T>
void xent_rows(T* logits, const int32_t* targets, T* loss, int64_t rows, int64_t V,
               double grad_scale, bool want_grad) {
  const T gs = T(grad_scale);
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < rows; ++r) {
    T* l = logits + r * V;
    const int32_t tgt = targets[r];
    if (tgt < 0) {
      loss[r] = 0;
      if (want_grad) std::fill(l, l + V, T(0));
      continue;
    }
    const T target_logit = l[tgt];
    const T mx = row_max(l, V);
    const T sum = exp_shift_sum(l, V, mx);
    loss[r] = T(std::log(sum)) + mx - target_logit;
    if (want_grad) {
      const T inv = gs / sum;
      for (int64_t j = 0; j < V; ++j) l[j] *= inv;
      l[tgt] -= gs;
    }
  }
}

// ---- attention -------------------------------------------------------------------------
// Tiles: Br query rows share one pass over each Bc-key tile held transposed in L1.
constexpr int64_t kBr = 32, kBc = 64;
constexpr double kNegBig = -1e30;

// s[0..kBc) = q . Kt[:, j] over a transposed key tile, accumulated in registers.
template <class T>
inline void scores_row(const T* q, const T* Kt, int64_t D, T* s) {
  T a[kBc] = {};
  for (int64_t d = 0; d < D; ++d) {
    const T qd = q[d];
    const T* kt = Kt + d * kBc;
    for (int64_t j = 0; j < kBc; ++j) a[j] += qd * kt[j];
  }
  for (int64_t j = 0; j < kBc; ++j) s[j] = a[j];
}

// Two score rows at once (q and dO against keys and values), as backward needs.
template <class T>
inline void scores_rows2(const T* q, const T* Kt, const T* o, const T* Vt, int64_t D, T* s,
                         T* t) {
  T a[kBc] = {}, b[kBc] = {};
  for (int64_t d = 0; d < D; ++d) {
    const T qd = q[d], od = o[d];
    const T* kt = Kt + d * kBc;
    const T* vt = Vt + d * kBc;
    for (int64_t j = 0; j < kBc; ++j) {
      a[j] += qd * kt[j];
      b[j] += od * vt[j];
    }
  }
  for (int64_t j = 0; j < kBc; ++j) {
    s[j] = a[j];
    t[j] = b[j];
  }
}

// out[0..D) = out * corr + sum_j w[j] V[j, :]; registers hold the row when D is known.
template <class T, int DC>
inline void weighted_rows(const T* w, const T* V, int64_t n, int64_t Dn, T corr, T* out) {
  if constexpr (DC > 0) {
    T a[DC];
    for (int d = 0; d < DC; ++d) a[d] = out[d] * corr;
    for (int64_t j = 0; j < n; ++j) {
      const T p = w[j];
      const T* vj = V + j * DC;
      for (int d = 0; d < DC; ++d) a[d] += p * vj[d];
    }
    for (int d = 0; d < DC; ++d) out[d] = a[d];
  } else {
    for (int64_t d = 0; d < Dn; ++d) out[d] *= corr;
    for (int64_t j = 0; j < n; ++j) {
      const T p = w[j];
      const T* vj = V + j * Dn;
      for (int64_t d = 0; d < Dn; ++d) out[d] += p * vj[d];
    }
  }
}

template <class T, int DC>
void attention_forward_impl(const T* qkv, T* out, T* lse, int64_t B, int64_t Tn, int64_t H,
                            int64_t KVH, int64_t D) {
  const int64_t stride = (H + 2 * KVH) * D, ostride = H * D, group = H / KVH;
  const T scale = T(1.0 / std::sqrt(double(D)));
  const int64_t n_qt = (Tn + kBr - 1) / kBr;
#pragma omp parallel
  {
    std::vector<T> Qs(static_cast<size_t>(kBr * D)), Kt(static_cast<size_t>(D * kBc)), Vs(static_cast<size_t>(kBc * D));
    std::vector<T> acc(static_cast<size_t>(kBr * D)), m(kBr), l(kBr), s(kBc);
#pragma omp for schedule(dynamic, 1)
    for (int64_t w = 0; w < B * H * n_qt; ++w) {
      const int64_t qt = n_qt - 1 - w % n_qt;  // heaviest (latest) tiles first
      const int64_t b = (w / n_qt) / H, h = (w / n_qt) % H, g = h / group;
      const int64_t q0 = qt * kBr, nq = std::min(kBr, Tn - q0);
      const T* base = qkv + b * Tn * stride;
      for (int64_t i = 0; i < nq; ++i) {
        const T* q = base + (q0 + i) * stride + h * D;
        for (int64_t d = 0; d < D; ++d) Qs[size_t(i * D + d)] = q[d] * scale;
        m[size_t(i)] = T(kNegBig);
        l[size_t(i)] = 0;
      }
      std::fill(acc.begin(), acc.end(), T(0));
      const int64_t k_end = q0 + nq;  // causal: keys < k_end
      for (int64_t k0 = 0; k0 < k_end; k0 += kBc) {
        const int64_t nk = std::min(kBc, k_end - k0);
        for (int64_t j = 0; j < nk; ++j) {
          const T* kr = base + (k0 + j) * stride + (H + g) * D;
          const T* vr = base + (k0 + j) * stride + (H + KVH + g) * D;
          for (int64_t d = 0; d < D; ++d) {
            Kt[size_t(d * kBc + j)] = kr[d];
            Vs[size_t(j * D + d)] = vr[d];
          }
        }
        for (int64_t j = nk; j < kBc; ++j)
          for (int64_t d = 0; d < D; ++d) Kt[size_t(d * kBc + j)] = 0;
        for (int64_t i = 0; i < nq; ++i) {
          const int64_t nj = std::min(nk, q0 + i - k0 + 1);
          if (nj <= 0) continue;
          const T* qi = &Qs[size_t(i * D)];
          T* sp = s.data();
          scores_row<T>(qi, Kt.data(), D, sp);
          const T mold = m[size_t(i)];
          T mx = mold;
          for (int64_t j = 0; j < nj; ++j) mx = sp[j] > mx ? sp[j] : mx;
          const T corr = vexp<T>(mold - mx);
          const T sum = exp_shift_sum(sp, nj, mx);
          l[size_t(i)] = l[size_t(i)] * corr + sum;
          m[size_t(i)] = mx;
          weighted_rows<T, DC>(sp, Vs.data(), nj, D, corr, &acc[size_t(i * D)]);
        }
      }
      for (int64_t i = 0; i < nq; ++i) {
        T* o = out + (b * Tn + q0 + i) * ostride + h * D;
        const T inv = T(1) / l[size_t(i)];
        for (int64_t d = 0; d < D; ++d) o[d] = acc[size_t(i * D + d)] * inv;
        lse[(b * H + h) * Tn + q0 + i] = m[size_t(i)] + T(std::log(double(l[size_t(i)])));
      }
    }
  }
}

template <class T>
void attention_forward(const T* qkv, T* out, T* lse, int64_t B, int64_t Tn, int64_t H,
                       int64_t KVH, int64_t D) {
  if (D == 64) return attention_forward_impl<T, 64>(qkv, out, lse, B, Tn, H, KVH, D);
  if (D == 128) return attention_forward_impl<T, 128>(qkv, out, lse, B, Tn, H, KVH, D);
  attention_forward_impl<T, 0>(qkv, out, lse, B, Tn, H, KVH, D);
}

// Backward, per (batch, kv head) so that dK/dV rows have a single writer. For each pair of
// tiles (Br queries x Bc keys): pass 1 walks query rows, recomputing scores from the saved
// log-sum-exp, forming P and dS = P (dP - D) into tile buffers and accumulating dQ_i in
// registers; pass 2 walks key columns, accumulating dK_j = sum_i dS_ij Q_i and dV_j = sum_i
// P_ij dO_i in registers. DC is the head dimension when known at compile time (0: any).
// dk += sum_i ds[i*kBc] Q[i, :], dv += sum_i p[i*kBc] dO[i, :] for rows i in [i0, n).
template <class T, int DC>
inline void key_grads(const T* ds, const T* p, const T* Q, const T* dO, int64_t i0, int64_t n,
                      int64_t Dn, T* dk, T* dv) {
  if constexpr (DC > 0) {
    T a[DC] = {}, b[DC] = {};
    for (int64_t i = i0; i < n; ++i) {
      const T x = ds[i * kBc], y = p[i * kBc];
      const T* qi = Q + i * DC;
      const T* oi = dO + i * DC;
      for (int d = 0; d < DC; ++d) {
        a[d] += x * qi[d];
        b[d] += y * oi[d];
      }
    }
    for (int d = 0; d < DC; ++d) {
      dk[d] += a[d];
      dv[d] += b[d];
    }
  } else {
    for (int64_t i = i0; i < n; ++i) {
      const T x = ds[i * kBc], y = p[i * kBc];
      for (int64_t d = 0; d < Dn; ++d) {
        dk[d] += x * Q[i * Dn + d];
        dv[d] += y * dO[i * Dn + d];
      }
    }
  }
}

template <class T, int DC>
void attention_backward_impl(const T* qkv, const T* out, const T* dout, const T* lse, T* dqkv,
                             int64_t B, int64_t Tn, int64_t H, int64_t KVH, int64_t Dn) {
  const int64_t D = DC > 0 ? DC : Dn;
  const int64_t stride = (H + 2 * KVH) * D, ostride = H * D, group = H / KVH;
  const T scale = T(1.0 / std::sqrt(double(D)));
  const int64_t n_qt = (Tn + kBr - 1) / kBr;
#pragma omp parallel
  {
    std::vector<T> Qs(static_cast<size_t>(kBr * D)), dOs(static_cast<size_t>(kBr * D)), dQ(static_cast<size_t>(kBr * D));
    std::vector<T> Kt(static_cast<size_t>(D * kBc)), Ks(static_cast<size_t>(kBc * D)), Vt(static_cast<size_t>(D * kBc));
    std::vector<T> Dv(static_cast<size_t>(Tn)), P(static_cast<size_t>(kBr * kBc)), dS(static_cast<size_t>(kBr * kBc));
#pragma omp for schedule(dynamic, 1)
    for (int64_t w = 0; w < B * KVH; ++w) {
      const int64_t b = w / KVH, g = w % KVH;
      const T* base = qkv + b * Tn * stride;
      T* dbase = dqkv + b * Tn * stride;
      for (int64_t t = 0; t < Tn; ++t) {
        std::fill(dbase + t * stride + (H + g) * D, dbase + t * stride + (H + g) * D + D, T(0));
        std::fill(dbase + t * stride + (H + KVH + g) * D,
                  dbase + t * stride + (H + KVH + g) * D + D, T(0));
      }
      for (int64_t h = g * group; h < (g + 1) * group; ++h) {
        for (int64_t t = 0; t < Tn; ++t) {
          const T* o = out + (b * Tn + t) * ostride + h * D;
          const T* dO = dout + (b * Tn + t) * ostride + h * D;
          T a = 0;
          for (int64_t d = 0; d < D; ++d) a += o[d] * dO[d];
          Dv[size_t(t)] = a;
        }
        const T* lrow = lse + (b * H + h) * Tn;
        for (int64_t qt = 0; qt < n_qt; ++qt) {
          const int64_t q0 = qt * kBr, nq = std::min(kBr, Tn - q0);
          for (int64_t i = 0; i < nq; ++i) {
            const T* q = base + (q0 + i) * stride + h * D;
            const T* dO = dout + (b * Tn + q0 + i) * ostride + h * D;
            for (int64_t d = 0; d < D; ++d) {
              Qs[size_t(i * D + d)] = q[d] * scale;
              dOs[size_t(i * D + d)] = dO[d];
            }
          }
          std::fill(dQ.begin(), dQ.end(), T(0));
          const int64_t k_end = q0 + nq;
          for (int64_t k0 = 0; k0 < k_end; k0 += kBc) {
            const int64_t nk = std::min(kBc, k_end - k0);
            for (int64_t j = 0; j < nk; ++j) {
              const T* kr = base + (k0 + j) * stride + (H + g) * D;
              const T* vr = base + (k0 + j) * stride + (H + KVH + g) * D;
              for (int64_t d = 0; d < D; ++d) {
                Kt[size_t(d * kBc + j)] = kr[d];
                Ks[size_t(j * D + d)] = kr[d];
                Vt[size_t(d * kBc + j)] = vr[d];
              }
            }
            for (int64_t j = nk; j < kBc; ++j)
              for (int64_t d = 0; d < D; ++d) Kt[size_t(d * kBc + j)] = Vt[size_t(d * kBc + j)] = 0;
            // Pass 1: query rows.
            for (int64_t i = 0; i < nq; ++i) {
              T* pi = &P[size_t(i * kBc)];
              T* dsi = &dS[size_t(i * kBc)];
              const int64_t nj = std::max<int64_t>(0, std::min(nk, q0 + i - k0 + 1));
              for (int64_t j = 0; j < kBc; ++j) pi[j] = dsi[j] = 0;
              if (nj == 0) continue;
              scores_rows2<T>(&Qs[size_t(i * D)], Kt.data(), &dOs[size_t(i * D)], Vt.data(), D, pi, dsi);
              const T li = lrow[q0 + i], Di = Dv[size_t(q0 + i)];
              for (int64_t j = 0; j < nj; ++j) {
                const T p = vexp<T>(pi[j] - li);
                pi[j] = p;
                dsi[j] = p * (dsi[j] - Di);
              }
              for (int64_t j = nj; j < kBc; ++j) pi[j] = dsi[j] = 0;
              weighted_rows<T, DC>(dsi, Ks.data(), nj, D, T(1), &dQ[size_t(i * D)]);
            }
            // Pass 2: key columns, accumulators held across the query rows.
            for (int64_t j = 0; j < nk; ++j) {
              const int64_t i0 = std::max<int64_t>(0, k0 + j - q0);  // rows that see key j
              T* dkj = dbase + (k0 + j) * stride + (H + g) * D;
              T* dvj = dbase + (k0 + j) * stride + (H + KVH + g) * D;
              key_grads<T, DC>(&dS[size_t(j)], &P[size_t(j)], Qs.data(), dOs.data(), i0, nq, D, dkj, dvj);
            }
          }
          for (int64_t i = 0; i < nq; ++i) {
            T* dq = dbase + (q0 + i) * stride + h * D;
            for (int64_t d = 0; d < D; ++d) dq[d] = dQ[size_t(i * D + d)] * scale;
          }
        }
      }
    }
  }
}

template <class T>
void attention_backward(const T* qkv, const T* out, const T* dout, const T* lse, T* dqkv,
                        int64_t B, int64_t Tn, int64_t H, int64_t KVH, int64_t D) {
  if (D == 64) return attention_backward_impl<T, 64>(qkv, out, dout, lse, dqkv, B, Tn, H, KVH, D);
  if (D == 128) return attention_backward_impl<T, 128>(qkv, out, dout, lse, dqkv, B, Tn, H, KVH, D);
  attention_backward_impl<T, 0>(qkv, out, dout, lse, dqkv, B, Tn, H, KVH, D);
}

}  // namespace loom::cpu::LOOM_ISA

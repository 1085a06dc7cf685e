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
void xent_rows(T* logits, const int32_t* targets, T* loss, int64_t rows, int64_t V, double grad_scale, bool want_grad) {
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
// FlashAttention-2 on the CPU. Work items are (batch, head) in forward and (batch, kv head) in
// backward, so each packs its keys (and values) transposed once, and dK/dV rows have a single
// writer. Every product inside a tile pair (Q K^T, dO V^T, P V, dS K, dS^T Q, P^T dO) is one
// register-blocked small GEMM, rows4 below: four output rows by four vector registers of
// columns, 16 accumulators that stay in registers while the inner dimension streams through.
constexpr int64_t kTile = 64;  // query rows and key columns per tile
constexpr double kNegBig = -1e30;

#if defined(__AVX512F__)
constexpr int kVecBytes = 64;
#elif defined(__AVX2__)
constexpr int kVecBytes = 32;
#else
constexpr int kVecBytes = 16;
#endif
// Elements of T per vector register.
template <class T>
constexpr int64_t kLanes = kVecBytes / int64_t(sizeof(T));
template <class T>
struct VecOf;
template <>
struct VecOf<float> {
  typedef float type __attribute__((vector_size(kVecBytes), aligned(4)));
};
template <>
struct VecOf<double> {
  typedef double type __attribute__((vector_size(kVecBytes), aligned(8)));
};

// Columns [c0, N) of rows4, one at a time (head sizes that are not a multiple of the chunk).
template <class T, bool Acc, bool TA>
[[gnu::noinline]] void rows4_tail(const T* A, int64_t lda, const T* B, int64_t ldb, int64_t K, T* C, int64_t ldc,
                                  int64_t c0, int64_t N) {
  for (int r = 0; r < 4; ++r)
    for (int64_t c = c0; c < N; ++c) {
      T a = Acc ? C[r * ldc + c] : T(0);
      for (int64_t k = 0; k < K; ++k) a += (TA ? A[k * lda + r] : A[r * lda + k]) * B[k * ldb + c];
      C[r * ldc + c] = a;
    }
}

// C[r, c0..c0 + NV*W) (+)= sum_{k<K} A(r, k) * B[k*ldb + c0..) for the four rows r < 4, with
// A(r, k) = A[r*lda + k], or A[k*lda + r] when TA (A stored transposed):
// 4 x NV accumulators stay in registers while k streams through.
template <class T, bool Acc, int NV, bool TA>
[[gnu::always_inline]] inline void rows4_chunk(const T* A, int64_t lda, const T* B, int64_t ldb, int64_t K, T* C,
                                               int64_t ldc, int64_t c0) {
  using V = typename VecOf<T>::type;
  constexpr int64_t W = kLanes<T>;
  V acc[4][NV];
#pragma GCC unroll 4
  for (int r = 0; r < 4; ++r)
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) {
      if constexpr (Acc)
        acc[r][v] = *reinterpret_cast<const V*>(C + r * ldc + c0 + v * W);
      else
        acc[r][v] = V{};
    }
  const int64_t rs = TA ? 1 : lda, ks = TA ? lda : 1;  // strides of A's rows and of k
  const T* a = A;
  const T* b = B + c0;
  for (int64_t k = 0; k < K; ++k, a += ks, b += ldb) {
    V bv[NV];
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) bv[v] = *reinterpret_cast<const V*>(b + v * W);
    const T x0 = a[0], x1 = a[rs], x2 = a[2 * rs], x3 = a[3 * rs];
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) {
      acc[0][v] += x0 * bv[v];
      acc[1][v] += x1 * bv[v];
      acc[2][v] += x2 * bv[v];
      acc[3][v] += x3 * bv[v];
    }
  }
#pragma GCC unroll 4
  for (int r = 0; r < 4; ++r)
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) *reinterpret_cast<V*>(C + r * ldc + c0 + v * W) = acc[r][v];
}

// C[r, 0..N) (+)= sum_{k<K} A(r, k) * B[k*ldb + 0..N) for the four rows r < 4 (A(r, k) as in
// rows4_chunk). Acc = false overwrites C. Columns go in chunks of NV vectors, then single
// vectors, then one at a time.
template <class T, bool Acc, bool TA = false>
inline void rows4(const T* A, int64_t lda, const T* B, int64_t ldb, int64_t K, T* C, int64_t ldc, int64_t N) {
  constexpr int64_t W = kLanes<T>;
  // 4 x 4 accumulators need AVX-512's 32 vector registers; with 16 (AVX2, SSE) 4 x 2 fit.
  constexpr int NV = kVecBytes == 64 ? 4 : 2;
  int64_t c0 = 0;
  for (; c0 + NV * W <= N; c0 += NV * W) rows4_chunk<T, Acc, NV, TA>(A, lda, B, ldb, K, C, ldc, c0);
  for (; c0 + W <= N; c0 += W) rows4_chunk<T, Acc, 1, TA>(A, lda, B, ldb, K, C, ldc, c0);
  if (c0 < N) rows4_tail<T, Acc, TA>(A, lda, B, ldb, K, C, ldc, c0, N);
}

// Columns of a tile that rows seeing kk keys need: kk rounded up to whole vectors.
template <class T>
inline int64_t tile_cols(int64_t kk) {
  constexpr int64_t W = kLanes<T>;
  return std::min(kTile, (kk + W - 1) / W * W);
}

// dst[c * Tp + t] = src[t * stride + c] for t < Tn, zero for t in [Tn, Tp): one head's keys
// or values, transposed so that a tile's columns are contiguous.
template <class T>
inline void pack_transposed(const T* src, int64_t stride, int64_t Tn, int64_t Tp, int64_t D, T* dst) {
  for (int64_t t0 = 0; t0 < Tp; t0 += 16)
    for (int64_t c = 0; c < D; ++c)
      for (int64_t t = t0; t < t0 + 16; ++t) dst[c * Tp + t] = t < Tn ? src[t * stride + c] : T(0);
}

inline int64_t round4(int64_t n) { return (n + 3) / 4 * 4; }

// The keys a query tile's rows see. Causal rows see keys 0..t; in a packed row (pos: the row's
// positions, restarting at 0 where each document starts) row t sees only its own document's
// keys, t - pos[t] .. t. Tiles of keys no row of the tile sees are skipped.
class KeyWindow {
 public:
  KeyWindow(const int32_t* pos, int64_t q0, int64_t nq) : pos_(pos), q0_(q0), nq_(nq) {
    first_ = q0;
    if (!pos_) {
      first_ = 0;
      return;
    }
    for (int64_t i = 0; i < nq; ++i) first_ = std::min(first_, lowest(q0 + i));
  }
  // The first key tile any row of the query tile sees.
  int64_t first_tile() const { return first_ / kTile * kTile; }
  // The first column of the key tile starting at k0 (nk keys) that row i sees: 0 when the
  // row's window starts before the tile, nk when after it (and for the tile's padding rows).
  int64_t first_key(int64_t i, int64_t k0, int64_t nk) const {
    if (!pos_) return 0;
    return i < nq_ ? std::clamp<int64_t>(lowest(q0_ + i) - k0, 0, nk) : nk;
  }

 private:
  // Row t's first key; positions past t (not a packed row's) clamp to the causal window.
  int64_t lowest(int64_t t) const { return std::max<int64_t>(0, t - pos_[t]); }
  const int32_t* pos_;
  int64_t q0_, nq_, first_ = 0;
};

template <class T>
void attention_forward(const T* qkv, T* out, T* lse, int64_t B, int64_t Tn, int64_t H, int64_t KVH, int64_t D,
                       const int32_t* pos) {
  const int64_t stride = (H + 2 * KVH) * D, ostride = H * D, group = H / KVH;
  const T scale = T(1.0 / std::sqrt(double(D)));
  const int64_t Tp = (Tn + kTile - 1) / kTile * kTile;
#pragma omp parallel
  {
    std::vector<T> Kt(size_t(D * Tp)), Qs(size_t(kTile * D)), S(size_t(kTile * kTile)), O(size_t(kTile * D)), m(kTile),
        l(kTile);
#pragma omp for schedule(dynamic, 1)
    for (int64_t w = 0; w < B * H; ++w) {
      const int64_t b = w / H, h = w % H, g = h / group;
      const T* base = qkv + b * Tn * stride;
      const T* Vrows = base + (H + KVH + g) * D;
      pack_transposed(base + (H + g) * D, stride, Tn, Tp, D, Kt.data());
      for (int64_t q0 = 0; q0 < Tn; q0 += kTile) {
        const int64_t nq = std::min(kTile, Tn - q0), nq4 = round4(nq);
        for (int64_t i = 0; i < nq4; ++i) {
          const T* q = base + (q0 + i) * stride + h * D;
          for (int64_t d = 0; d < D; ++d) Qs[size_t(i * D + d)] = i < nq ? q[d] * scale : T(0);
          m[size_t(i)] = T(kNegBig);
          l[size_t(i)] = 0;
        }
        std::fill(O.begin(), O.begin() + nq4 * D, T(0));
        const int64_t k_end = q0 + nq;  // causal: row i sees keys <= q0 + i
        const KeyWindow win(pos ? pos + b * Tn : nullptr, q0, nq);
        for (int64_t k0 = win.first_tile(); k0 < k_end; k0 += kTile) {
          const int64_t nk = std::min(kTile, k_end - k0);
          // Rows r0..r0+3 see min(nk, q0 + r0 + 4 - k0) keys of this tile.
          for (int64_t r0 = 0; r0 < nq4; r0 += 4) {
            const int64_t kk = std::min(nk, q0 + r0 + 4 - k0);
            if (kk > 0)
              rows4<T, false>(&Qs[size_t(r0 * D)], D, Kt.data() + k0, Tp, D, &S[size_t(r0 * kTile)], kTile,
                              tile_cols<T>(kk));
          }
          for (int64_t i = 0; i < nq4; ++i) {
            T* sp = &S[size_t(i * kTile)];
            const int64_t j0 = win.first_key(i, k0, nk);
            const int64_t nj = i < nq && j0 < nk ? std::clamp<int64_t>(q0 + i - k0 + 1, 0, nk) : 0;
            if (nj > 0) {
              // Whole 16-element blocks (row_max and exp_shift_sum's unit): the masked keys up to
              // the next multiple of 16 count as -inf (their exp underflows to at most 1e-38,
              // below half an ulp of l >= 1, and is zeroed below), so the diagonal tile's short
              // rows have no scalar tail. They are written here, so none needs computing.
              const int64_t njv = std::min<int64_t>(kTile, (nj + 15) / 16 * 16);
              std::fill(sp, sp + j0, T(kNegBig));  // keys before the row's document (packed rows)
              std::fill(sp + nj, sp + njv, T(kNegBig));
              const T mold = m[size_t(i)];
              const T mx = std::max(mold, row_max(sp, njv));
              const T corr = vexp<T>(mold - mx);
              const T sum = exp_shift_sum(sp, njv, mx);
              l[size_t(i)] = l[size_t(i)] * corr + sum;
              m[size_t(i)] = mx;
              std::fill(sp, sp + j0, T(0));
              if (corr != T(1))
                for (int64_t d = 0; d < D; ++d) O[size_t(i * D + d)] *= corr;
            }
            std::fill(sp + nj, sp + kTile, T(0));
          }
          for (int64_t r0 = 0; r0 < nq4; r0 += 4) {
            const int64_t kk = std::min(nk, q0 + r0 + 4 - k0);
            if (kk > 0)
              rows4<T, true>(&S[size_t(r0 * kTile)], kTile, Vrows + k0 * stride, stride, kk, &O[size_t(r0 * D)], D, D);
          }
        }
        for (int64_t i = 0; i < nq; ++i) {
          T* o = out + (b * Tn + q0 + i) * ostride + h * D;
          const T inv = T(1) / l[size_t(i)];
          for (int64_t d = 0; d < D; ++d) o[d] = O[size_t(i * D + d)] * inv;
          lse[(b * H + h) * Tn + q0 + i] = m[size_t(i)] + T(std::log(double(l[size_t(i)])));
        }
      }
    }
  }
}

// Backward per (batch, kv head): for each of the group's query heads and each tile pair,
// recompute S = Q K^T from the saved log-sum-exp, P = exp(S - lse), dP = dO V^T,
// dS = P (dP - rowsum(dO * O)); then dQ += dS K, dK += dS^T Q, dV += P^T dO.
template <class T>
void attention_backward(const T* qkv, const T* out, const T* dout, const T* lse, T* dqkv, int64_t B, int64_t Tn,
                        int64_t H, int64_t KVH, int64_t D, const int32_t* pos) {
  const int64_t stride = (H + 2 * KVH) * D, ostride = H * D, group = H / KVH;
  const T scale = T(1.0 / std::sqrt(double(D)));
  const int64_t Tp = (Tn + kTile - 1) / kTile * kTile;
#pragma omp parallel
  {
    std::vector<T> Kt(size_t(D * Tp)), Vt(size_t(D * Tp)), dK(size_t(Tp * D)), dV(size_t(Tp * D));
    std::vector<T> Qs(size_t(kTile * D)), dOs(size_t(kTile * D)), dQ(size_t(kTile * D));
    std::vector<T> P(size_t(kTile * kTile)), dS(size_t(kTile * kTile)), Dv(static_cast<size_t>(Tn));
#pragma omp for schedule(dynamic, 1)
    for (int64_t w = 0; w < B * KVH; ++w) {
      const int64_t b = w / KVH, g = w % KVH;
      const T* base = qkv + b * Tn * stride;
      const T* Krows = base + (H + g) * D;
      T* dbase = dqkv + b * Tn * stride;
      pack_transposed(Krows, stride, Tn, Tp, D, Kt.data());
      pack_transposed(base + (H + KVH + g) * D, stride, Tn, Tp, D, Vt.data());
      std::fill(dK.begin(), dK.end(), T(0));
      std::fill(dV.begin(), dV.end(), T(0));
      for (int64_t h = g * group; h < (g + 1) * group; ++h) {
        for (int64_t t = 0; t < Tn; ++t) {
          const T* o = out + (b * Tn + t) * ostride + h * D;
          const T* dO = dout + (b * Tn + t) * ostride + h * D;
          T a[8] = {};  // interleaved partial sums: a vector, not a chain of dependent adds
          int64_t d = 0;
          for (; d + 8 <= D; d += 8)
            for (int k = 0; k < 8; ++k) a[k] += o[d + k] * dO[d + k];
          for (; d < D; ++d) a[0] += o[d] * dO[d];
          Dv[size_t(t)] = ((a[0] + a[4]) + (a[1] + a[5])) + ((a[2] + a[6]) + (a[3] + a[7]));
        }
        const T* lrow = lse + (b * H + h) * Tn;
        for (int64_t q0 = 0; q0 < Tn; q0 += kTile) {
          const int64_t nq = std::min(kTile, Tn - q0), nq4 = round4(nq);
          for (int64_t i = 0; i < nq4; ++i) {
            const T* q = base + (q0 + i) * stride + h * D;
            const T* dO = dout + (b * Tn + q0 + i) * ostride + h * D;
            for (int64_t d = 0; d < D; ++d) {
              Qs[size_t(i * D + d)] = i < nq ? q[d] * scale : T(0);
              dOs[size_t(i * D + d)] = i < nq ? dO[d] : T(0);
            }
          }
          std::fill(dQ.begin(), dQ.begin() + nq4 * D, T(0));
          const int64_t k_end = q0 + nq;
          const KeyWindow win(pos ? pos + b * Tn : nullptr, q0, nq);
          for (int64_t k0 = win.first_tile(); k0 < k_end; k0 += kTile) {
            const int64_t nk = std::min(kTile, k_end - k0), nk4 = round4(nk);
            for (int64_t r0 = 0; r0 < nq4; r0 += 4) {
              const int64_t kk = std::min(nk, q0 + r0 + 4 - k0);
              if (kk <= 0) continue;
              rows4<T, false>(&Qs[size_t(r0 * D)], D, Kt.data() + k0, Tp, D, &P[size_t(r0 * kTile)], kTile,
                              tile_cols<T>(kk));
              rows4<T, false>(&dOs[size_t(r0 * D)], D, Vt.data() + k0, Tp, D, &dS[size_t(r0 * kTile)], kTile,
                              tile_cols<T>(kk));
            }
            for (int64_t i = 0; i < nq4; ++i) {
              T* pi = &P[size_t(i * kTile)];
              T* dsi = &dS[size_t(i * kTile)];
              const int64_t j0 = win.first_key(i, k0, nk);
              const int64_t nj = i < nq && j0 < nk ? std::clamp<int64_t>(q0 + i - k0 + 1, 0, nk) : 0;
              // Whole vectors up to tile_cols(nj): the masked keys' probabilities and score
              // gradients are set to exactly zero (a vectorised loop with no scalar tail).
              const int64_t njv = nj > 0 ? tile_cols<T>(nj) : 0;
              if (nj > 0) {
                const T li = lrow[q0 + i], Di = Dv[size_t(q0 + i)];
                for (int64_t j = 0; j < njv; ++j) {
                  const bool seen = j >= j0 && j < nj;
                  const T p = seen ? vexp<T>(pi[j] - li) : T(0);
                  pi[j] = p;
                  dsi[j] = seen ? p * (dsi[j] - Di) : T(0);
                }
              }
              std::fill(pi + njv, pi + kTile, T(0));
              std::fill(dsi + njv, dsi + kTile, T(0));
            }
            for (int64_t r0 = 0; r0 < nq4; r0 += 4) {
              const int64_t kk = std::min(nk, q0 + r0 + 4 - k0);
              if (kk > 0)
                rows4<T, true>(&dS[size_t(r0 * kTile)], kTile, Krows + k0 * stride, stride, kk, &dQ[size_t(r0 * D)], D,
                               D);
            }
            // dK and dV read dS and P transposed (column j0..j0+3 of the tile as rows). Keys
            // j0..j0+3 are seen by query rows from max(0, k0 + j0 - q0) on.
            for (int64_t j0 = 0; j0 < nk4; j0 += 4) {
              const int64_t i0 = std::min(nq4, std::max<int64_t>(0, k0 + j0 - q0) / 4 * 4);
              const int64_t kk = nq4 - i0;
              if (kk <= 0) continue;
              rows4<T, true, true>(&dS[size_t(i0 * kTile + j0)], kTile, &Qs[size_t(i0 * D)], D, kk,
                                   &dK[size_t((k0 + j0) * D)], D, D);
              rows4<T, true, true>(&P[size_t(i0 * kTile + j0)], kTile, &dOs[size_t(i0 * D)], D, kk,
                                   &dV[size_t((k0 + j0) * D)], D, D);
            }
          }
          for (int64_t i = 0; i < nq; ++i) {
            T* dq = dbase + (q0 + i) * stride + h * D;
            for (int64_t d = 0; d < D; ++d) dq[d] = dQ[size_t(i * D + d)] * scale;
          }
        }
      }
      for (int64_t t = 0; t < Tn; ++t) {
        std::copy(&dK[size_t(t * D)], &dK[size_t(t * D)] + D, dbase + t * stride + (H + g) * D);
        std::copy(&dV[size_t(t * D)], &dV[size_t(t * D)] + D, dbase + t * stride + (H + KVH + g) * D);
      }
    }
  }
}

}  // namespace loom::cpu::LOOM_ISA

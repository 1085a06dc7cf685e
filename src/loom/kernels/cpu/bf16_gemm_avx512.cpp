// bf16_gemm's kernels (bf16_gemm.h), compiled for AVX512-BF16 alone (src/CMakeLists.txt).
// Goto-style: both operands are packed whole once per call, rounded to bf16 with K in pairs
// as vdpbf16ps reads them (A: panels of 6 rows, B: panels of 64 columns, zero-padded), then
// the threads share tiles of C; within a tile, blocks of K keep a B micro-panel in L1 and the
// tile's A block in L2 while a 6 x 64 microkernel (24 zmm accumulators) sweeps them.
#include <immintrin.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <vector>

#include "loom/core/error.h"
#include "loom/core/tensor.h"
#include "loom/kernels/cpu/bf16_gemm.h"

// GCC 12 warns inside its own headers on masked loads and set-zero of zmm (false positives).
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

namespace loom::cpu::bf16_gemm_detail {
namespace {

constexpr int MR = 6;                // rows of C per microkernel call
constexpr int NR = 64;               // columns of C per microkernel call (4 zmm)
constexpr int64_t KCP = 128;         // K pairs per block: a B micro-panel is KCP x 256 B = 32 KiB
constexpr int64_t MC = 96;           // rows of C per tile (a multiple of MR): A block 48 KiB
constexpr int64_t NC = 256;          // columns of C per tile (a multiple of NR)
constexpr int64_t kChunkM = 8 * MR;  // rows of a transposed A packed per step (3 zmm)

// 16 floats rounded to bf16 exactly as round_to_bf16 (rounded_operands.cpp): nearest, ties to
// even, NaN kept quiet; the bf16 is each lane's high half, the low half is zero.
inline __m512i round16(__m512i u) {
  const __m512i hi = _mm512_set1_epi32(int(0xffff0000u));
  const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
  const __m512i r = _mm512_and_si512(_mm512_add_epi32(_mm512_add_epi32(u, _mm512_set1_epi32(0x7fff)), lsb), hi);
  const __mmask16 nan =
      _mm512_cmpgt_epu32_mask(_mm512_and_si512(u, _mm512_set1_epi32(0x7fffffff)), _mm512_set1_epi32(0x7f800000));
  const __m512i quiet = _mm512_and_si512(_mm512_or_si512(u, _mm512_set1_epi32(0x00400000)), hi);
  return _mm512_mask_mov_epi32(r, nan, quiet);
}

// p[0, n) as 16 lanes, zeros past n.
inline __m512i load16(const float* p, int64_t n) {
  if (n >= 16) return _mm512_loadu_si512(p);
  if (n <= 0) return _mm512_setzero_si512();
  return _mm512_maskz_loadu_epi32(__mmask16((1u << n) - 1), p);
}

// The bf16 pairs (src[2i], src[2i+1]) for i < 16 (low half first), zeros from src[n] on.
inline __m512i row_pairs16(const float* src, int64_t n) {
  // Word i of the result is word 2i+1 (a lane's high half) of a:b.
  static const __m512i odd_words = [] {
    alignas(64) uint16_t idx[32];
    for (int i = 0; i < 32; ++i) idx[i] = uint16_t(2 * i + 1);
    return _mm512_load_si512(idx);
  }();
  const __m512i a = round16(load16(src, n)), b = round16(load16(src + 16, n - 16));
  return _mm512_permutex2var_epi16(a, odd_words, b);
}

// out[kp] = the bf16 pair (src[2kp], src[2kp+1]), zeros past K; writes round_up(K, 32) / 2
// entries.
void row_pairs(const float* src, int64_t K, uint32_t* out) {
  for (int64_t k = 0; k < K; k += 32) _mm512_storeu_si512(out + k / 2, row_pairs16(src + k, K - k));
}

// r[i] lane j becomes r[j] lane i (16 x 16 of 32 bits): interleave pairs, then quads, within
// 128-bit lanes; then the 4 x 4 of 128-bit lanes.
inline void transpose16(__m512i r[16]) {
  __m512i t[16];
  for (int i = 0; i < 16; i += 2) {
    t[i] = _mm512_unpacklo_epi32(r[i], r[i + 1]);
    t[i + 1] = _mm512_unpackhi_epi32(r[i], r[i + 1]);
  }
  // u[4g+q], lane l: column 4l+q of rows 4g..4g+3
  __m512i u[16];
  for (int g = 0; g < 16; g += 4) {
    u[g] = _mm512_unpacklo_epi64(t[g], t[g + 2]);
    u[g + 1] = _mm512_unpackhi_epi64(t[g], t[g + 2]);
    u[g + 2] = _mm512_unpacklo_epi64(t[g + 1], t[g + 3]);
    u[g + 3] = _mm512_unpackhi_epi64(t[g + 1], t[g + 3]);
  }
  for (int q = 0; q < 4; ++q) {
    const __m512i v0 = _mm512_shuffle_i32x4(u[q], u[4 + q], 0x44), v1 = _mm512_shuffle_i32x4(u[q], u[4 + q], 0xee);
    const __m512i v2 = _mm512_shuffle_i32x4(u[8 + q], u[12 + q], 0x44),
                  v3 = _mm512_shuffle_i32x4(u[8 + q], u[12 + q], 0xee);
    r[q] = _mm512_shuffle_i32x4(v0, v2, 0x88);
    r[4 + q] = _mm512_shuffle_i32x4(v0, v2, 0xdd);
    r[8 + q] = _mm512_shuffle_i32x4(v1, v3, 0x88);
    r[12 + q] = _mm512_shuffle_i32x4(v1, v3, 0xdd);
  }
}

// out[i] = the bf16 pair (r0[i], r1[i]) for i < 16 (r1 null: zeros), zeros past n.
inline __m512i column_pairs(const float* r0, const float* r1, int64_t n) {
  const __m512i lo = _mm512_srli_epi32(round16(load16(r0, n)), 16);
  return r1 ? _mm512_or_si512(lo, round16(load16(r1, n))) : lo;
}

uint32_t* grown_row(std::vector<uint32_t>& v, int64_t K) {
  const size_t need = size_t((K + 31) / 32 * 16);
  if (v.size() < need) v.resize(need);
  return v.data();
}

// A [M,K] (A[m*lda+k], K contiguous) into panels of MR rows: Ap[ip][kp][r].
void pack_a_rows(const float* A, int64_t lda, int64_t M, int64_t K, int64_t KP, uint32_t* Ap) {
  thread_local std::vector<uint32_t> row;
  uint32_t* tmp = grown_row(row, K);
  const int64_t panels = (M + MR - 1) / MR;
#pragma omp for schedule(static)
  for (int64_t ip = 0; ip < panels; ++ip) {
    uint32_t* dst = Ap + ip * KP * MR;
    for (int r = 0; r < MR; ++r) {
      const int64_t m = ip * MR + r;
      if (m < M) {
        row_pairs(A + m * lda, K, tmp);
        for (int64_t kp = 0; kp < KP; ++kp) dst[kp * MR + r] = tmp[kp];
      } else {
        for (int64_t kp = 0; kp < KP; ++kp) dst[kp * MR + r] = 0;
      }
    }
  }
}

// A stored transposed (A[k*lda+m], M contiguous) into the same panels, kChunkM rows at a time.
void pack_a_cols(const float* A, int64_t lda, int64_t M, int64_t K, int64_t KP, uint32_t* Ap) {
  const int64_t panels = (M + MR - 1) / MR;
  const int64_t chunks = (M + kChunkM - 1) / kChunkM;
#pragma omp for schedule(static)
  for (int64_t c = 0; c < chunks; ++c) {
    const int64_t m0 = c * kChunkM;
    const int64_t np = std::min<int64_t>(kChunkM / MR, panels - m0 / MR);
    alignas(64) uint32_t pairs[kChunkM];
    for (int64_t kp = 0; kp < KP; ++kp) {
      const float* r0 = A + 2 * kp * lda + m0;
      const float* r1 = 2 * kp + 1 < K ? r0 + lda : nullptr;
      for (int v = 0; v < kChunkM / 16; ++v)
        _mm512_store_si512(pairs + 16 * v, column_pairs(r0 + 16 * v, r1 ? r1 + 16 * v : nullptr, M - m0 - 16 * v));
      for (int64_t q = 0; q < np; ++q)
        std::memcpy(Ap + (m0 / MR + q) * KP * MR + kp * MR, pairs + q * MR, MR * sizeof(uint32_t));
    }
  }
}

// B [K,N] (B[k*ldb+n], N contiguous) into panels of NR columns: Bp[jp][kp][j].
void pack_b_rows(const float* B, int64_t ldb, int64_t N, int64_t K, int64_t KP, uint32_t* Bp) {
  const int64_t panels = (N + NR - 1) / NR;
#pragma omp for schedule(static)
  for (int64_t jp = 0; jp < panels; ++jp) {
    const int64_t n0 = jp * NR;
    uint32_t* dst = Bp + jp * KP * NR;
    for (int64_t kp = 0; kp < KP; ++kp) {
      const float* r0 = B + 2 * kp * ldb + n0;
      const float* r1 = 2 * kp + 1 < K ? r0 + ldb : nullptr;
      for (int v = 0; v < NR / 16; ++v)
        _mm512_storeu_si512(dst + kp * NR + 16 * v,
                            column_pairs(r0 + 16 * v, r1 ? r1 + 16 * v : nullptr, N - n0 - 16 * v));
    }
  }
}

// B stored transposed (B[n*ldb+k], K contiguous, e.g. a weight W[N,K]) into the same panels:
// 16 rows x 16 pairs at a time, transposed in registers (a store per pair, each to another
// cache line, cost about a sixth of the product at K = 768).
void pack_b_cols(const float* B, int64_t ldb, int64_t N, int64_t K, int64_t KP, uint32_t* Bp) {
  const int64_t panels = (N + NR - 1) / NR;
#pragma omp for schedule(static)
  for (int64_t jp = 0; jp < panels; ++jp) {
    uint32_t* dst = Bp + jp * KP * NR;
    for (int j0 = 0; j0 < NR; j0 += 16) {
      const int64_t n0 = jp * NR + j0;
      for (int64_t kp0 = 0; kp0 < KP; kp0 += 16) {
        __m512i r[16];
        for (int j = 0; j < 16; ++j) {
          const float* src = B + (n0 + j) * ldb + 2 * kp0;
          // 16 rows at a time are more streams than the hardware prefetcher follows.
          __builtin_prefetch(src + 128);
          __builtin_prefetch(src + 144);
          r[j] = n0 + j < N ? row_pairs16(src, K - 2 * kp0) : _mm512_setzero_si512();
        }
        transpose16(r);
        const int64_t nq = std::min<int64_t>(16, KP - kp0);
        for (int q = 0; q < nq; ++q) _mm512_storeu_si512(dst + (kp0 + q) * NR + j0, r[q]);
      }
    }
  }
}

inline __mmask16 lanes(int64_t n) {
  return n >= 16 ? __mmask16(0xffff) : n <= 0 ? __mmask16(0) : __mmask16((1u << n) - 1);
}

// C[mr, nv] (+)= a[kps pairs][MR] * b[kps pairs][NR]; a and b zero-padded to MR and NR.
[[gnu::always_inline]] inline void microkernel(int64_t kps, const uint32_t* a, const uint32_t* b, float* c, int64_t ldc,
                                               int mr, int64_t nv, bool load_c) {
  __m512 acc[MR][4];
#pragma GCC unroll 6
  for (int r = 0; r < MR; ++r)
#pragma GCC unroll 4
    for (int j = 0; j < 4; ++j) acc[r][j] = _mm512_setzero_ps();
  for (int64_t kp = 0; kp < kps; ++kp) {
    const __m512bh b0 = (__m512bh)_mm512_loadu_si512(b), b1 = (__m512bh)_mm512_loadu_si512(b + 16),
                   b2 = (__m512bh)_mm512_loadu_si512(b + 32), b3 = (__m512bh)_mm512_loadu_si512(b + 48);
#pragma GCC unroll 6
    for (int r = 0; r < MR; ++r) {
      const __m512bh av = (__m512bh)_mm512_set1_epi32(int(a[r]));
      acc[r][0] = _mm512_dpbf16_ps(acc[r][0], av, b0);
      acc[r][1] = _mm512_dpbf16_ps(acc[r][1], av, b1);
      acc[r][2] = _mm512_dpbf16_ps(acc[r][2], av, b2);
      acc[r][3] = _mm512_dpbf16_ps(acc[r][3], av, b3);
    }
    a += MR;
    b += NR;
  }
  if (mr == MR && nv == NR) {
#pragma GCC unroll 6
    for (int r = 0; r < MR; ++r)
#pragma GCC unroll 4
      for (int j = 0; j < 4; ++j) {
        float* p = c + r * ldc + 16 * j;
        _mm512_storeu_ps(p, load_c ? _mm512_add_ps(acc[r][j], _mm512_loadu_ps(p)) : acc[r][j]);
      }
    return;
  }
  const __mmask16 mask[4] = {lanes(nv), lanes(nv - 16), lanes(nv - 32), lanes(nv - 48)};
#pragma GCC unroll 6
  for (int r = 0; r < MR; ++r) {
    if (r >= mr) break;
#pragma GCC unroll 4
    for (int j = 0; j < 4; ++j) {
      float* p = c + r * ldc + 16 * j;
      const __m512 v = load_c ? _mm512_add_ps(acc[r][j], _mm512_maskz_loadu_ps(mask[j], p)) : acc[r][j];
      _mm512_mask_storeu_ps(p, mask[j], v);
    }
  }
}

// The tiles of C, shared by the threads of the enclosing parallel region.
void multiply(const uint32_t* Ap, const uint32_t* Bp, int64_t M, int64_t N, int64_t KP, bool beta_one, float* C,
              int64_t ldc) {
  const int64_t tiles_m = (M + MC - 1) / MC, tiles_n = (N + NC - 1) / NC;
  // Consecutive tiles share a column block, so the threads read the same B panels together.
#pragma omp for schedule(dynamic, 1)
  for (int64_t t = 0; t < tiles_m * tiles_n; ++t) {
    const int64_t m0 = (t % tiles_m) * MC, m1 = std::min(M, m0 + MC);
    const int64_t n0 = (t / tiles_m) * NC, n1 = std::min(N, n0 + NC);
    for (int64_t kp0 = 0; kp0 < KP; kp0 += KCP) {
      const int64_t kps = std::min(KCP, KP - kp0);
      const bool load_c = beta_one || kp0 > 0;
      for (int64_t n = n0; n < n1; n += NR) {
        const uint32_t* bp = Bp + (n / NR) * KP * NR + kp0 * NR;
        for (int64_t m = m0; m < m1; m += MR)
          microkernel(kps, Ap + (m / MR) * KP * MR + kp0 * MR, bp, C + m * ldc + n, ldc,
                      int(std::min<int64_t>(MR, M - m)), std::min<int64_t>(NR, N - n), load_c);
      }
    }
    if (KP == 0 && !beta_one)  // K = 0: C = 0
      for (int64_t m = m0; m < m1; ++m) std::fill(C + m * ldc + n0, C + m * ldc + n1, 0.f);
  }
}

// Packed operands, grown to the largest call (MemCategory::workspace, so memory_stats shows them).
uint32_t* packed_buffer(int slot, int64_t n) {
  thread_local Tensor buf[2];
  Tensor& b = buf[slot];
  if (!b.defined() || b.numel() < n) {
    b = Tensor();
    b = Tensor::empty({std::max<int64_t>(n, 16)}, DType::f32, MemCategory::workspace);
  }
  return reinterpret_cast<uint32_t*>(b.data<float>());
}

}  // namespace

void gemm_avx512(bool ta, bool tb, int64_t M, int64_t N, int64_t K, const float* A, int64_t lda, const float* B,
                 int64_t ldb, float beta, float* C, int64_t ldc) {
  LOOM_CHECK(beta == 0.f || beta == 1.f, "bf16_gemm", "beta must be 0 or 1, got ", beta);
  if (M <= 0 || N <= 0) return;
  const int64_t KP = (K + 1) / 2;
  const int64_t panels_m = (M + MR - 1) / MR, panels_n = (N + NR - 1) / NR;
  uint32_t* Ap = packed_buffer(0, panels_m * MR * KP);
  uint32_t* Bp = packed_buffer(1, panels_n * NR * KP);
  // One parallel region: the packing loops end in barriers, then the tiles are shared.
#pragma omp parallel if (M * N * std::max <int64_t>(K, 1) > (int64_t(1) << 18))
  {
    if (ta)
      pack_a_cols(A, lda, M, K, KP, Ap);
    else
      pack_a_rows(A, lda, M, K, KP, Ap);
    if (tb)
      pack_b_cols(B, ldb, N, K, KP, Bp);
    else
      pack_b_rows(B, ldb, N, K, KP, Bp);
    multiply(Ap, Bp, M, N, KP, beta == 1.f, C, ldc);
  }
}

namespace {
template <class Step>
double loop_seconds(int64_t iters, Step step) {
  __m512 acc[10];
  for (int i = 0; i < 10; ++i) acc[i] = _mm512_set1_ps(float(i));
  const auto t0 = std::chrono::steady_clock::now();
  for (int64_t it = 0; it < iters; ++it)
#pragma GCC unroll 10
    for (int i = 0; i < 10; ++i) acc[i] = step(acc[i]);
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  __m512 sum = acc[0];
  for (int i = 1; i < 10; ++i) sum = _mm512_add_ps(sum, acc[i]);
  volatile float sink = _mm512_reduce_add_ps(sum);
  (void)sink;
  return s;
}
}  // namespace

double dpbf16_loop_seconds(int64_t iters) {
  const __m512bh x = (__m512bh)_mm512_set1_epi32(0x3c003c00);  // bf16 pairs of 2^-7
  return loop_seconds(iters, [x](__m512 a) { return _mm512_dpbf16_ps(a, x, x); });
}

double fma_loop_seconds(int64_t iters) {
  const __m512 x = _mm512_set1_ps(0x1p-7f);
  return loop_seconds(iters, [x](__m512 a) { return _mm512_fmadd_ps(x, x, a); });
}

}  // namespace loom::cpu::bf16_gemm_detail

// The integer-dot kernels of quant_linear, written once over a vector traits type V and
// compiled per instruction set by quant_vnni_avx512.cpp (zmm and ymm, AVX512-VNNI),
// quant_vnni_avx2.cpp (ymm, AVX-VNNI), quant_int_avx2.cpp (ymm, AVX2 without VNNI) and
// quant_int_neon.cpp (128-bit NEON registers, aarch64's sdot: signed x signed), each of
// which includes this file inside its `#pragma GCC target` region with LOOM_QUANT_ISA naming
// the namespace. Included nowhere else.
//
// vpdpbusd multiplies unsigned by signed bytes. The signed int8 activations are the signed
// operand and the weights are made unsigned: u = w + 128 for int8 (w ^ 0x80), u = v + 8 for
// symmetric int4 (nibble ^ 8). Then sum (u - z) x = sum u x - z sum x: each block's
// accumulator starts at -z * sum(x) in its first lane. AVX2's vpmaddubsw (V::signed_i8)
// saturates its 16-bit pair sums, which 255 * 127 * 2 would exceed, so there int8 weights stay
// signed (z = 0) and V::dot_s8 moves their signs onto the activations. Asymmetric int4 multiplies the nibbles
// as they are, and its group offset adds offset * sum(x) in f32 after the conversion (the
// block sums come with the quantized activations), so no weight sums are needed. Block
// results are converted to f32 and scaled by (activation scale x weight scale).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>

#include "loom/kernels/cpu/quant_linear_impl.h"

namespace loom::cpu::quant::LOOM_QUANT_ISA {

// ---- activations ------------------------------------------------------------------------

// Round to nearest even (vroundps). Not the mantissa trick (v + 1.5 * 2^23) - 1.5 * 2^23: GCC
// contracts x * inv + 1.5 * 2^23 into one FMA, which rounds the exact product instead of the
// f32 one, so near ties a value lands one step away from the many-rows kernel's
// (gemm_quantize_acts_avx512), and a row's result would depend on the batch around it.
[[gnu::always_inline]] inline int32_t round_i32(float v) { return int32_t(std::nearbyint(v)); }

template <bool Int4>
[[gnu::always_inline]] inline void quantize_block(const float* x, int64_t len, int64_t C, int8_t* dst, float* scale,
                                                  int32_t* sum) {
  float amax16[16] = {};
  int64_t i = 0;
  for (; i + 16 <= len; i += 16)
    for (int k = 0; k < 16; ++k) amax16[k] = std::max(amax16[k], std::fabs(x[i + k]));
  float amax = 0;
  for (int k = 0; k < 16; ++k) amax = std::max(amax, amax16[k]);
  for (; i < len; ++i) amax = std::max(amax, std::fabs(x[i]));
  *scale = amax / 127.f;
  const float inv = amax > 0 ? 127.f / amax : 0.f;
  std::memset(dst, 0, size_t((len + C - 1) / C * C));
  int32_t total = 0;
  if constexpr (!Int4) {
    for (int64_t j = 0; j < len; ++j) {
      const int32_t v = round_i32(x[j] * inv);
      dst[j] = int8_t(v);
      total += v;
    }
  } else {
    for (int64_t c0 = 0; c0 < len; c0 += C) {  // even columns, then odd ones, per chunk
      const int64_t half = std::min(C, len - c0) / 2;
      const float* xc = x + c0;
      int8_t* dc = dst + c0;
      for (int64_t j = 0; j < half; ++j) {
        const int32_t e = round_i32(xc[2 * j] * inv), o = round_i32(xc[2 * j + 1] * inv);
        dc[j] = int8_t(e);
        dc[C / 2 + j] = int8_t(o);
        total += e + o;
      }
    }
  }
  *sum = total;
}

template <bool Int4>
inline void quantize_acts_rows(const float* x, const QuantView& w, const ActLayout& lay, int8_t* q, float* scale,
                               int32_t* sum, int64_t m0, int64_t m1) {
  const int64_t I = w.cols, G = w.group, ng = I / G;
  for (int64_t m = m0; m < m1; ++m)
    for (int64_t g = 0; g < ng; ++g)
      for (int64_t kb = 0; kb < lay.blocks_per_group; ++kb) {
        const int64_t col0 = g * G + kb * lay.block, blk = m * lay.row_blocks + g * lay.blocks_per_group + kb;
        quantize_block<Int4>(x + m * I + col0, std::min(lay.block, G - kb * lay.block), lay.chunk,
                             q + m * lay.row_bytes + g * lay.group_bytes + kb * lay.block_bytes, scale + blk,
                             sum + blk);
      }
}

// The stepped layout of one row (see ActLayout).
template <bool Int4>
inline void quantize_steps_row(const float* x, const QuantView& w, const ActLayout& L, int32_t z8, int8_t* row) {
  const int64_t C = L.chunk, lanes = C / 4, chunk_cols = Int4 ? 2 * C : C;
  const int64_t nbs = L.blocks_per_step, per_block = lanes / nbs;
  const int32_t z = w.format == QuantFormat::int8 ? z8 : 8;
  for (int64_t s = 0; s < w.cols / L.step; ++s) {
    int8_t natural[128];
    float scales[16];
    int32_t corr[16] = {};
    for (int64_t b = 0; b < nbs; ++b) {
      float scale;
      int32_t sum;
      quantize_block<false>(x + s * L.step + b * L.block, L.block, L.block, natural + b * L.block, &scale, &sum);
      for (int64_t l = 0; l < per_block; ++l) scales[b * per_block + l] = scale;
      if (w.offsets) {
        const float f = float(sum);
        std::memcpy(&corr[b * per_block], &f, 4);
      } else {
        corr[b * per_block] = -z * sum;
      }
    }
    int8_t* d = row + s * L.step_bytes;
    if constexpr (Int4) {
      for (int64_t c = 0; c < L.step; c += chunk_cols)
        for (int64_t j = 0; j < C; ++j) {
          d[c + j] = natural[c + 2 * j];
          d[c + C + j] = natural[c + 2 * j + 1];
        }
    } else {
      std::memcpy(d, natural, size_t(L.step));
    }
    std::memcpy(d + L.step, scales, size_t(C));
    std::memcpy(d + L.step + C, corr, size_t(C));
  }
}

// The zero point of int8 weights as the dot product sees them (see the top of this file).
template <class V>
constexpr int32_t kZ8 = V::signed_i8 ? 0 : 128;

template <class V>
inline void quantize_acts(const float* x, const QuantView& w, const ActLayout& lay, int8_t* q, float* scale,
                          int32_t* sum, int64_t m0, int64_t m1) {
  const bool int4 = w.format == QuantFormat::int4;
  if (lay.stepped) {
    for (int64_t m = m0; m < m1; ++m) {
      if (int4)
        quantize_steps_row<true>(x + m * w.cols, w, lay, kZ8<V>, q + m * lay.row_bytes);
      else
        quantize_steps_row<false>(x + m * w.cols, w, lay, kZ8<V>, q + m * lay.row_bytes);
    }
  } else if (int4) {
    quantize_acts_rows<true>(x, w, lay, q, scale, sum, m0, m1);
  } else {
    quantize_acts_rows<false>(x, w, lay, q, scale, sum, m0, m1);
  }
}

// ---- products ---------------------------------------------------------------------------

enum class Kind { i8, i4_symmetric, i4_offset };

// The weights of columns [col, col + n) of a row (n == V::C unless Tail) as the dot product
// takes them: unsigned, or signed int8 where V::signed_i8.
template <class V, Kind K, bool Tail>
[[gnu::always_inline]] inline typename V::I load_weights(const uint8_t* row, int64_t col, int64_t n, typename V::I low,
                                                         typename V::I flip) {
  if constexpr (K == Kind::i8) {
    const typename V::I w = Tail ? V::load_part(row + col, n) : V::load(row + col);
    if constexpr (V::signed_i8)
      return w;
    else
      return V::xor_(w, flip);
  } else {
    const auto h = Tail ? V::load_half_part(row + col / 2, n / 2) : V::load_half(row + col / 2);
    if constexpr (K == Kind::i4_symmetric)
      return V::and_xor(V::spread(h), low, flip);
    else
      return V::and_(V::spread(h), low);
  }
}

// acc + the dot products of 4-byte groups of weights u (from load_weights) and activations x.
template <class V, Kind K>
[[gnu::always_inline]] inline typename V::I dot_w(typename V::I acc, typename V::I u, typename V::I x) {
  if constexpr (K == Kind::i8 && V::signed_i8)
    return V::dot_s8(acc, u, x);
  else
    return V::dot(acc, u, x);
}

// One chunk of MT activation rows x OT weight rows into the int32 accumulators.
template <class V, Kind K, int MT, int OT, bool Tail>
[[gnu::always_inline]] inline void dot_chunk(typename V::I (&d)[MT][OT], const int8_t* const (&xr)[MT],
                                             const uint8_t* const (&wr)[OT], int64_t xoff, int64_t col, int64_t n,
                                             typename V::I low, typename V::I flip) {
  typename V::I xv[MT];
  for (int m = 0; m < MT; ++m) xv[m] = V::load(xr[m] + xoff);
  for (int t = 0; t < OT; ++t) {
    const typename V::I u = load_weights<V, K, Tail>(wr[t], col, n, low, flip);
    for (int m = 0; m < MT; ++m) d[m][t] = dot_w<V, K>(d[m][t], u, xv[m]);
  }
}

// Outputs o..o+OT-1 of activation rows m0..m0+MT-1. Each output's arithmetic is the same
// whatever MT, OT or its position, so a row's result does not depend on M.
template <class V, Kind K, int MT, int OT>
[[gnu::always_inline]] inline void int_tile(const QuantActs& a, const QuantView& w, const float* b, float* y,
                                            int64_t m0, int64_t o) {
  using I = typename V::I;
  using F = typename V::F;
  constexpr int64_t C = V::C;
  constexpr int32_t z_const = K == Kind::i8 ? kZ8<V> : 8;
  const ActLayout& L = a.lay;
  const int64_t O = w.rows, G = w.group, ng = w.cols / G;
  const int64_t wrow = K == Kind::i8 ? w.cols : w.cols / 2;
  const I low = V::bytes(0x0F), flip = V::bytes(K == Kind::i8 ? int8_t(0x80) : int8_t(0x08));
  const int8_t* xr[MT];
  const float* sx[MT];
  const int32_t* sumx[MT];
  for (int m = 0; m < MT; ++m) {
    xr[m] = a.q + (m0 + m) * L.row_bytes;
    sx[m] = a.scale + (m0 + m) * L.row_blocks;
    sumx[m] = a.sum + (m0 + m) * L.row_blocks;
  }
  const uint8_t* wr[OT];
  for (int t = 0; t < OT; ++t) wr[t] = w.q + (o + t) * wrow;
  F acc[MT][OT];
  float offset_terms[MT][OT] = {};  // asymmetric int4: sum over blocks of offset * sum(x)
  for (int m = 0; m < MT; ++m)
    for (int t = 0; t < OT; ++t) acc[m][t] = V::fzero();
  for (int64_t g = 0; g < ng; ++g) {
    for (int64_t kb = 0; kb < L.blocks_per_group; ++kb) {
      const int64_t blk = g * L.blocks_per_group + kb, col0 = g * G + kb * L.block;
      const int64_t len = std::min(L.block, G - kb * L.block);
      const int64_t xoff = g * L.group_bytes + kb * L.block_bytes;
      I d[MT][OT];
      for (int m = 0; m < MT; ++m) {
        if constexpr (K == Kind::i4_offset) {
          for (int t = 0; t < OT; ++t) {
            d[m][t] = V::izero();
            offset_terms[m][t] += w.offsets[(o + t) * ng + g] * (sx[m][blk] * float(sumx[m][blk]));
          }
        } else {
          const I c = V::lane0(-z_const * sumx[m][blk]);
          for (int t = 0; t < OT; ++t) d[m][t] = c;
        }
      }
      int64_t c = 0;
      for (; c + C <= len; c += C) dot_chunk<V, K, MT, OT, false>(d, xr, wr, xoff + c, col0 + c, C, low, flip);
      if (c < len) dot_chunk<V, K, MT, OT, true>(d, xr, wr, xoff + c, col0 + c, len - c, low, flip);
      for (int m = 0; m < MT; ++m)
        for (int t = 0; t < OT; ++t)
          acc[m][t] = V::fma_i(d[m][t], V::set1(sx[m][blk] * w.scales[(o + t) * ng + g]), acc[m][t]);
    }
  }
  for (int m = 0; m < MT; ++m)
    for (int t = 0; t < OT; ++t)
      y[(m0 + m) * O + o + t] = V::hsum(acc[m][t]) + offset_terms[m][t] + (b ? b[o + t] : 0.f);
}

template <class V, Kind K, int MT>
[[gnu::always_inline]] inline void int_outs(const QuantActs& a, const QuantView& w, const float* b, float* y,
                                            int64_t m0, int64_t o0, int64_t o1) {
  constexpr int OT = V::out_tile(MT);
  int64_t o = o0;
  for (; o + OT <= o1; o += OT) int_tile<V, K, MT, OT>(a, w, b, y, m0, o);
  for (; o < o1; ++o) int_tile<V, K, MT, 1>(a, w, b, y, m0, o);
}

// Outputs [o0, o1) for all M rows, in row tiles of at most V::max_rows (the range's weight rows
// stay in cache between row tiles).
template <class V, Kind K>
void int_rows_kind(const QuantActs& a, const QuantView& w, const float* b, float* y, int64_t M, int64_t o0,
                   int64_t o1) {
  int64_t m = 0;
  if constexpr (V::max_rows >= 4)
    for (; m + 4 <= M; m += 4) int_outs<V, K, 4>(a, w, b, y, m, o0, o1);
  for (; m + 2 <= M; m += 2) int_outs<V, K, 2>(a, w, b, y, m, o0, o1);
  for (; m < M; ++m) int_outs<V, K, 1>(a, w, b, y, m, o0, o1);
}

// ---- stepped kernels: whole vectors per step, several small blocks per vector ----------------
//
// int8: a vector holds C columns, lane k columns 4k..4k+3; int4: a C-byte load holds 2C
// columns, its low nibbles (even columns) and high nibbles (odd columns) each feed one
// vpdpbusd, lane k covering columns 8k..8k+7. Lanes of one block share a scale, so a step's
// blocks (up to 4) are scaled together by per-lane scale vectors and converted to f32 once.

template <class V, Kind K, int CH, int MT, int OT, bool PerRow>
[[gnu::always_inline]] inline void step_tile(const QuantActs& a, const QuantView& w, const float* b, float* y,
                                             int64_t m0, int64_t o, typename V::I lane_block) {
  using I = typename V::I;
  using F = typename V::F;
  constexpr int64_t C = V::C;
  constexpr int64_t chunk_cols = K == Kind::i8 ? C : 2 * C;
  const ActLayout& L = a.lay;
  const int64_t O = w.rows, G = w.group, ng = w.cols / G, steps = w.cols / L.step;
  const int64_t wrow = K == Kind::i8 ? w.cols : w.cols / 2;
  const int nbs = int(L.blocks_per_step);
  const I low = V::bytes(0x0F), flip = V::bytes(K == Kind::i8 ? int8_t(0x80) : int8_t(0x08));
  const int8_t* xr[MT];
  for (int m = 0; m < MT; ++m) xr[m] = a.q + (m0 + m) * L.row_bytes;
  const uint8_t* wr[OT];
  for (int t = 0; t < OT; ++t) wr[t] = w.q + (o + t) * wrow;
  F acc[MT][OT];
  for (int m = 0; m < MT; ++m)
    for (int t = 0; t < OT; ++t) acc[m][t] = V::fzero();
  for (int64_t s = 0; s < steps; ++s) {
    const int64_t xs = s * L.step_bytes, col = s * L.step;
    I d[MT][OT];
    for (int m = 0; m < MT; ++m) {
      const I init = K == Kind::i4_offset ? V::izero() : V::load(xr[m] + xs + L.step + C);
      for (int t = 0; t < OT; ++t) d[m][t] = init;
    }
    // This step's share of the next tile's bytes (see prefetch_next_tile).
    constexpr int64_t bytes_per_col_x2 = K == Kind::i8 ? 2 : 1;
    prefetch_next_tile(wr[0], OT * wrow, OT * col * bytes_per_col_x2 / 2, OT * (col + L.step) * bytes_per_col_x2 / 2);
    for (int64_t c = 0; c < CH * chunk_cols; c += chunk_cols) {  // unrolled: CH is 1, 2, 4 or 8
      if constexpr (K == Kind::i8) {
        I xv[MT];
        for (int m = 0; m < MT; ++m) xv[m] = V::load(xr[m] + xs + c);
        for (int t = 0; t < OT; ++t) {
          const I u = load_weights<V, K, false>(wr[t], col + c, C, low, flip);
          for (int m = 0; m < MT; ++m) d[m][t] = dot_w<V, K>(d[m][t], u, xv[m]);
        }
      } else {
        I xe[MT], xo[MT];
        for (int m = 0; m < MT; ++m) xe[m] = V::load(xr[m] + xs + c), xo[m] = V::load(xr[m] + xs + c + C);
        for (int t = 0; t < OT; ++t) {
          const I p = V::load(wr[t] + (col + c) / 2);
          I lo, hi;
          if constexpr (K == Kind::i4_symmetric)
            lo = V::and_xor(p, low, flip), hi = V::and_xor(V::srli4(p), low, flip);
          else
            lo = V::and_(p, low), hi = V::and_(V::srli4(p), low);
          for (int m = 0; m < MT; ++m) d[m][t] = V::dot2(d[m][t], lo, xe[m], hi, xo[m]);
        }
      }
    }
    const int64_t g0 = col / G;  // the step's first group (its only one when blocks are 128)
    for (int t = 0; t < OT; ++t) {
      F sw, off;
      if constexpr (!PerRow) sw = V::expand(w.scales + (o + t) * ng + g0, nbs, lane_block);
      if constexpr (K == Kind::i4_offset) off = V::expand(w.offsets + (o + t) * ng + g0, nbs, lane_block);
      for (int m = 0; m < MT; ++m) {
        const F sx = V::loadf(xr[m] + xs + L.step);
        acc[m][t] = V::fma(V::cvt(d[m][t]), PerRow ? sx : V::mul(sx, sw), acc[m][t]);
        if constexpr (K == Kind::i4_offset)  // plus offset * sum(x): the block's sum is in its first lane
          acc[m][t] = V::fma(off, V::mul(sx, V::loadf(xr[m] + xs + L.step + C)), acc[m][t]);
      }
    }
  }
  for (int m = 0; m < MT; ++m)
    for (int t = 0; t < OT; ++t) {
      const float v = V::hsum(acc[m][t]);
      y[(m0 + m) * O + o + t] = (PerRow ? v * w.scales[o + t] : v) + (b ? b[o + t] : 0.f);
    }
}

template <class V, Kind K, int CH, bool PerRow, int MT>
[[gnu::always_inline]] inline void step_outs(const QuantActs& a, const QuantView& w, const float* b, float* y,
                                             int64_t m0, int64_t o0, int64_t o1, typename V::I lane_block) {
  constexpr int OT = V::out_tile(MT);
  int64_t o = o0;
  for (; o + OT <= o1; o += OT) step_tile<V, K, CH, MT, OT, PerRow>(a, w, b, y, m0, o, lane_block);
  for (; o < o1; ++o) step_tile<V, K, CH, MT, 1, PerRow>(a, w, b, y, m0, o, lane_block);
}

// CH: vectors per step (a block of 128 columns spans 2, 4 or 8 of them, smaller blocks share one).
template <class V, Kind K, int CH, bool PerRow>
void step_rows_kind(const QuantActs& a, const QuantView& w, const float* b, float* y, int64_t M, int64_t o0,
                    int64_t o1) {
  const typename V::I lane_block = V::lane_blocks(V::C / 4 / a.lay.blocks_per_step);
  int64_t m = 0;
  if constexpr (V::max_rows >= 4)
    for (; m + 4 <= M; m += 4) step_outs<V, K, CH, PerRow, 4>(a, w, b, y, m, o0, o1, lane_block);
  for (; m + 2 <= M; m += 2) step_outs<V, K, CH, PerRow, 2>(a, w, b, y, m, o0, o1, lane_block);
  for (; m < M; ++m) step_outs<V, K, CH, PerRow, 1>(a, w, b, y, m, o0, o1, lane_block);
}

template <class V, Kind K>
void step_rows(const QuantActs& a, const QuantView& w, const float* b, float* y, int64_t M, int64_t o0, int64_t o1) {
  constexpr int64_t chunk_cols = K == Kind::i8 ? V::C : 2 * V::C;
  // One scale per row: the scale multiplies the sum once at the end (not the offsets' terms).
  const bool per_row = w.group == w.cols && a.lay.blocks_per_step == 1 && K != Kind::i4_offset;
  switch (a.lay.step / chunk_cols) {
    case 1:
      return per_row ? step_rows_kind<V, K, 1, true>(a, w, b, y, M, o0, o1)
                     : step_rows_kind<V, K, 1, false>(a, w, b, y, M, o0, o1);
    case 2:
      return per_row ? step_rows_kind<V, K, 2, true>(a, w, b, y, M, o0, o1)
                     : step_rows_kind<V, K, 2, false>(a, w, b, y, M, o0, o1);
    case 4:
      return per_row ? step_rows_kind<V, K, 4, true>(a, w, b, y, M, o0, o1)
                     : step_rows_kind<V, K, 4, false>(a, w, b, y, M, o0, o1);
    default:  // 8: int8 blocks of 128 columns in 16-byte vectors (NEON), at most 4 elsewhere
      if constexpr (V::C == 16)
        return per_row ? step_rows_kind<V, K, 8, true>(a, w, b, y, M, o0, o1)
                       : step_rows_kind<V, K, 8, false>(a, w, b, y, M, o0, o1);
  }
}

template <class V>
void int_rows(const QuantActs& a, const QuantView& w, const float* b, float* y, int64_t M, int64_t o0, int64_t o1) {
  if (a.lay.stepped) {
    if (w.format == QuantFormat::int8)
      step_rows<V, Kind::i8>(a, w, b, y, M, o0, o1);
    else if (w.offsets)
      step_rows<V, Kind::i4_offset>(a, w, b, y, M, o0, o1);
    else
      step_rows<V, Kind::i4_symmetric>(a, w, b, y, M, o0, o1);
    return;
  }
  if (w.format == QuantFormat::int8)
    int_rows_kind<V, Kind::i8>(a, w, b, y, M, o0, o1);
  else if (w.offsets)
    int_rows_kind<V, Kind::i4_offset>(a, w, b, y, M, o0, o1);
  else
    int_rows_kind<V, Kind::i4_symmetric>(a, w, b, y, M, o0, o1);
}

}  // namespace loom::cpu::quant::LOOM_QUANT_ISA

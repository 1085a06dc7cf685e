// The many-rows (prompt) kernel of quant_linear on AVX512-VNNI: W is repacked per call into
// panels of 16 output rows whose int8 weights interleave in groups of 4 columns, so that one
// vpdpbusd multiplies 4 columns of one activation row (broadcast) with 16 outputs at once and
// no lane ever needs reducing. Repacking reads W once (it is amortised over the rows), and the
// per-block scaling is one conversion per 16 outputs and block instead of per output.
//
// vpdpbusd wants one unsigned operand: the activations are stored as x + 128 (u8) and each
// block's accumulator starts at -128 * (sum of the block's weights), counted while packing.
// Asymmetric int4 packs its nibbles as they are and adds offset * sum(x) per block in f32.
#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#include "loom/kernels/cpu/quant_linear_impl.h"

#pragma GCC push_options
// GCC 12 reports its own _mm512_undefined_* placeholders inside the intrinsics as maybe
// uninitialized once they are inlined here.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,bmi2,prefer-vector-width=512")

namespace loom::cpu::quant {
namespace {

constexpr int kLanes = 16;  // outputs per panel
constexpr int kMR = 4;      // activation rows per register tile
constexpr int kPanels = 3;  // panels per register tile (and per work item)

// One panel: for each group of 4 columns, 16 lanes x 4 int8 weights; then per block the 16
// outputs' scales, then their accumulator starts, then (asymmetric int4) their offsets.
struct PanelLayout {
  int64_t quads, blocks;
  int64_t bytes() const { return quads * 64 + blocks * 192; }
  int64_t scales_at() const { return quads * 64; }
  int64_t starts_at() const { return quads * 64 + blocks * 64; }
  int64_t offsets_at() const { return quads * 64 + blocks * 128; }
};

// Weights of 16 rows (lanes past `rows` are zero) for columns [k, k + 4) of every lane, as
// int8 (nibbles as they are for asymmetric int4), from a 32-bit gather of each row's bytes.
template <bool Int4, bool Offset>
[[gnu::always_inline]] inline __m512i gather_quad(const uint8_t* q, const __m512i row_off, __mmask16 valid, int64_t k,
                                                  bool high) {
  if constexpr (!Int4) {
    return _mm512_mask_i32gather_epi32(_mm512_setzero_si512(), valid, row_off, q + k, 1);
  } else {
    // 4 bytes = 8 columns; quad k/4 is the low or high half.
    const __m512i g = _mm512_mask_i32gather_epi32(_mm512_setzero_si512(), valid, row_off, q + (k & ~int64_t(7)) / 2, 1);
    const __m512i h = high ? _mm512_srli_epi32(g, 16) : g;
    // nibbles n0..n3 of the low 16 bits to bytes 0..3 (column order: low nibble first)
    const __m512i m = _mm512_set1_epi32(0x0F);
    __m512i v = _mm512_and_si512(h, m);
    v = _mm512_or_si512(v, _mm512_and_si512(_mm512_slli_epi32(h, 4), _mm512_set1_epi32(0x0F00)));
    v = _mm512_or_si512(v, _mm512_and_si512(_mm512_slli_epi32(h, 8), _mm512_set1_epi32(0x0F0000)));
    v = _mm512_or_si512(v, _mm512_and_si512(_mm512_slli_epi32(h, 12), _mm512_set1_epi32(0x0F000000)));
    if constexpr (Offset) return v;
    // symmetric: (nibble ^ 8) - 8
    const __m512i eight = _mm512_set1_epi8(8);
    return _mm512_sub_epi8(_mm512_xor_si512(v, eight), eight);
  }
}

// Packs panel rows [o0, o0 + 16) of W.
template <bool Int4, bool Offset>
void pack_panel(const QuantView& w, const ActLayout& L, int64_t o0, const PanelLayout& P, uint8_t* out) {
  const int64_t I = w.cols, G = w.group, ng = I / G, wrow = Int4 ? I / 2 : I;
  const int64_t rows = std::min<int64_t>(kLanes, w.rows - o0);
  const __mmask16 valid = _cvtu32_mask16((1u << rows) - 1);
  const __m512i row_off = _mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                                             _mm512_set1_epi32(int32_t(wrow)));
  const uint8_t* q = w.q + o0 * wrow;
  const __m512i ones = _mm512_set1_epi8(1);
  float* scales = reinterpret_cast<float*>(out + P.scales_at());
  int32_t* starts = reinterpret_cast<int32_t*>(out + P.starts_at());
  float* offsets = reinterpret_cast<float*>(out + P.offsets_at());
  for (int64_t blk = 0; blk < P.blocks; ++blk) {
    const int64_t k0 = blk * L.block, g = k0 / G;
    alignas(64) float s[kLanes] = {}, off[kLanes] = {};
    for (int64_t j = 0; j < rows; ++j) {
      s[j] = w.scales[(o0 + j) * ng + g];
      if constexpr (Offset) off[j] = w.offsets[(o0 + j) * ng + g];
    }
    __m512i sum = _mm512_setzero_si512();
    for (int64_t k = k0; k < k0 + L.block; k += 4) {
      const __m512i v = gather_quad<Int4, Offset>(q, row_off, valid, k, (k & 7) != 0);
      _mm512_storeu_si512(out + k / 4 * 64, v);
      sum = _mm512_dpbusd_epi32(sum, ones, v);
    }
    _mm512_storeu_ps(scales + blk * kLanes, _mm512_load_ps(s));
    if constexpr (Offset) _mm512_storeu_ps(offsets + blk * kLanes, _mm512_load_ps(off));
    _mm512_storeu_si512(starts + blk * kLanes, _mm512_mullo_epi32(sum, _mm512_set1_epi32(-128)));
  }
}

// Rows [m0, m0 + MR) x panels [0, NP) of one work item.
template <int MR, int NP, bool Offset>
[[gnu::always_inline]] inline void panel_tile(const uint8_t* xa, const float* sx, const float* sums, const ActLayout& L,
                                              int64_t I, const uint8_t* const* panels, const PanelLayout& P, float* y,
                                              int64_t O, int64_t o0, const float* b, int64_t m0) {
  __m512 acc[MR][NP];
  for (int m = 0; m < MR; ++m)
    for (int p = 0; p < NP; ++p) acc[m][p] = _mm512_setzero_ps();
  const int64_t per_block = L.block / 4;
  for (int64_t blk = 0; blk < P.blocks; ++blk) {
    __m512i d[MR][NP];
    for (int p = 0; p < NP; ++p) {
      const __m512i start = _mm512_loadu_si512(panels[p] + P.starts_at() + blk * 64);
      for (int m = 0; m < MR; ++m) d[m][p] = start;
    }
    for (int64_t kq = blk * per_block; kq < (blk + 1) * per_block; ++kq) {
      __m512i wv[NP];
      for (int p = 0; p < NP; ++p) wv[p] = _mm512_loadu_si512(panels[p] + kq * 64);
      for (int m = 0; m < MR; ++m) {
        int32_t xq;
        std::memcpy(&xq, xa + (m0 + m) * I + kq * 4, 4);
        const __m512i xb = _mm512_set1_epi32(xq);
        for (int p = 0; p < NP; ++p) d[m][p] = _mm512_dpbusd_epi32(d[m][p], xb, wv[p]);
      }
    }
    for (int p = 0; p < NP; ++p) {
      const __m512 sw = _mm512_loadu_ps(reinterpret_cast<const float*>(panels[p] + P.scales_at()) + blk * kLanes);
      for (int m = 0; m < MR; ++m) {
        const float sxm = sx[(m0 + m) * P.blocks + blk];
        acc[m][p] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(d[m][p]), _mm512_mul_ps(sw, _mm512_set1_ps(sxm)), acc[m][p]);
        if constexpr (Offset) {  // plus offset * sum(x)
          const __m512 off = _mm512_loadu_ps(reinterpret_cast<const float*>(panels[p] + P.offsets_at()) + blk * kLanes);
          acc[m][p] = _mm512_fmadd_ps(off, _mm512_set1_ps(sxm * sums[(m0 + m) * P.blocks + blk]), acc[m][p]);
        }
      }
    }
  }
  for (int p = 0; p < NP; ++p) {
    const int64_t o = o0 + p * kLanes, n = std::min<int64_t>(kLanes, O - o);
    const __mmask16 k = _cvtu32_mask16((1u << n) - 1);
    const __m512 bias = b ? _mm512_maskz_loadu_ps(k, b + o) : _mm512_setzero_ps();
    for (int m = 0; m < MR; ++m) _mm512_mask_storeu_ps(y + (m0 + m) * O + o, k, _mm512_add_ps(acc[m][p], bias));
  }
}

template <int NP, bool Offset>
void panel_rows(const uint8_t* xa, const float* sx, const float* sums, const ActLayout& L, int64_t I,
                const uint8_t* const* panels, const PanelLayout& P, float* y, int64_t O, int64_t o0, const float* b,
                int64_t M) {
  int64_t m = 0;
  for (; m + kMR <= M; m += kMR) panel_tile<kMR, NP, Offset>(xa, sx, sums, L, I, panels, P, y, O, o0, b, m);
  for (; m < M; ++m) panel_tile<1, NP, Offset>(xa, sx, sums, L, I, panels, P, y, O, o0, b, m);
}

template <bool Offset>
void panel_rows_any(int np, const uint8_t* xa, const float* sx, const float* sums, const ActLayout& L, int64_t I,
                    const uint8_t* const* panels, const PanelLayout& P, float* y, int64_t O, int64_t o0, const float* b,
                    int64_t M) {
  if (np == 3)
    panel_rows<3, Offset>(xa, sx, sums, L, I, panels, P, y, O, o0, b, M);
  else if (np == 2)
    panel_rows<2, Offset>(xa, sx, sums, L, I, panels, P, y, O, o0, b, M);
  else
    panel_rows<1, Offset>(xa, sx, sums, L, I, panels, P, y, O, o0, b, M);
}

}  // namespace

bool gemm_fits(const QuantView& w, const ActLayout& L) {
  return (L.block == 32 || L.block == 64 || L.block == 128) && w.group % L.block == 0;
}

void gemm_quantize_acts_avx512(const float* x, const QuantView& w, const ActLayout& L, uint8_t* xa, float* sx,
                               float* sums, int64_t m0, int64_t m1) {
  const int64_t I = w.cols, blocks = I / L.block;
  // Blocks are whole vectors (32, 64 or 128 floats; gemm_fits).
  const __m512 sign = _mm512_set1_ps(-0.0f);
  const __m512i offset = _mm512_set1_epi32(128);
  for (int64_t m = m0; m < m1; ++m)
    for (int64_t blk = 0; blk < blocks; ++blk) {
      const float* src = x + m * I + blk * L.block;
      __m512 vmax = _mm512_setzero_ps();
      for (int64_t i = 0; i < L.block; i += 16)
        vmax = _mm512_max_ps(vmax, _mm512_andnot_ps(sign, _mm512_loadu_ps(src + i)));
      const float amax = _mm512_reduce_max_ps(vmax);
      sx[m * blocks + blk] = amax / 127.f;
      const __m512 inv = _mm512_set1_ps(amax > 0 ? 127.f / amax : 0.f);
      uint8_t* dst = xa + m * I + blk * L.block;
      __m512i total = _mm512_setzero_si512();
      for (int64_t i = 0; i < L.block; i += 16) {  // round to nearest even (MXCSR default), then + 128
        const __m512i r = _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_loadu_ps(src + i), inv));
        total = _mm512_add_epi32(total, r);
        _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + i), _mm512_cvtepi32_epi8(_mm512_add_epi32(r, offset)));
      }
      sums[m * blocks + blk] = float(_mm512_reduce_add_epi32(total));
    }
}

void gemm_panels_avx512(const uint8_t* xa, const float* sx, const float* sums, const QuantView& w, const ActLayout& L,
                        const float* b, float* y, int64_t M, int64_t item) {
  const int64_t I = w.cols, O = w.rows;
  const PanelLayout P{I / 4, I / L.block};
  const int64_t o0 = item * kPanels * kLanes;
  const int np = int(std::min<int64_t>(kPanels, (O - o0 + kLanes - 1) / kLanes));
  thread_local std::vector<uint8_t> buf;
  if (int64_t(buf.size()) < kPanels * P.bytes()) buf.resize(size_t(kPanels * P.bytes()));
  const uint8_t* panels[kPanels];
  for (int p = 0; p < np; ++p) {
    uint8_t* out = buf.data() + p * P.bytes();
    const int64_t po = o0 + p * kLanes;
    if (w.format == QuantFormat::int8)
      pack_panel<false, false>(w, L, po, P, out);
    else if (w.offsets)
      pack_panel<true, true>(w, L, po, P, out);
    else
      pack_panel<true, false>(w, L, po, P, out);
    panels[p] = out;
  }
  if (w.offsets)
    panel_rows_any<true>(np, xa, sx, sums, L, I, panels, P, y, O, o0, b, M);
  else
    panel_rows_any<false>(np, xa, sx, sums, L, I, panels, P, y, O, o0, b, M);
}

int64_t gemm_items(const QuantView& w) { return (w.rows + kPanels * kLanes - 1) / (kPanels * kLanes); }

}  // namespace loom::cpu::quant

#pragma GCC diagnostic pop
#pragma GCC pop_options

// The many-rows (prompt) kernel of quant_linear on AVX2 machines, written once over a dot
// product policy D and included by quant_int_avx2.cpp (vpmaddubsw + vpmaddwd) and
// quant_vnni_avx2.cpp (AVX-VNNI's vpdpbusd), inside their namespace and target pragma.
//
// W is repacked per call into panels of 8 output rows whose weights interleave in groups of 4
// columns, so that one product takes 4 columns of one activation row (broadcast) against 8
// outputs at once and no lane needs reducing; repacking reads W once, amortised over the rows.
// Every 32 columns (a sub-block, inside one activation block and one weight group) the int32
// sums go to f32, times the activation block's scale and the 8 outputs' weight scales. int4
// weights are packed unsigned (the nibble, or v + 8 for symmetric int4) with the matching
// offset per output (the group's, or -8 * scale), added as offset * scale(x) * sum(x); int8
// weights stay signed and their signs move onto the activations (vpmaddubsw saturates).
//
// The activations are quantized exactly as the few-rows kernels quantize them (per block of
// min(group, 128) columns, scale max|x| / 127, round to nearest even), so a row's result
// differs from theirs by f32 rounding only.
#pragma once

namespace ymm_gemm {

constexpr int kLanes = 8;                   // outputs per panel
constexpr int kSub = 32;                    // columns per sub-block
constexpr int kPanelsPerItem = 4;           // panels per work item (32 outputs)
constexpr int64_t kWeightBytes = kSub * 8;  // one sub-block of one panel: 8 quads x 8 lanes x 4

// Bytes of one sub-block of a panel: weights, 8 scales, and (int4) 8 offsets.
constexpr int64_t sub_bytes(bool int4) { return kWeightBytes + 32 + (int4 ? 32 : 0); }

// Packs output rows [o0, o0 + 8) of W (rows past the end are zero).
template <bool Int4>
inline void pack_panel(const QuantView& w, int64_t o0, uint8_t* out) {
  const int64_t I = w.cols, G = w.group, ng = I / G, wrow = Int4 ? I / 2 : I, subs = I / kSub;
  const int64_t rows = std::min<int64_t>(kLanes, w.rows - o0);
  const uint32_t flip = Int4 && !w.offsets ? 0x08080808u : 0u;  // symmetric int4: v + 8
  for (int64_t s = 0; s < subs; ++s) {
    uint8_t* p = out + s * sub_bytes(Int4);
    float scales[kLanes] = {}, offsets[kLanes] = {};
    for (int64_t j = 0; j < kLanes; ++j) {
      if (j >= rows) {
        for (int q = 0; q < kSub / 4; ++q) std::memset(p + q * 32 + j * 4, 0, 4);
        continue;
      }
      const uint8_t* r = w.q + (o0 + j) * wrow;
      for (int q = 0; q < kSub / 4; ++q) {
        const int64_t col = s * kSub + q * 4;
        uint32_t v;
        if constexpr (Int4) {
          uint16_t packed;  // columns col..col+3, low nibble first
          std::memcpy(&packed, r + col / 2, 2);
          v = _pdep_u32(packed, 0x0F0F0F0Fu) ^ flip;
        } else {
          std::memcpy(&v, r + col, 4);
        }
        std::memcpy(p + q * 32 + j * 4, &v, 4);
      }
      const int64_t k = (o0 + j) * ng + s * kSub / G;
      scales[j] = w.scales[k];
      if constexpr (Int4) offsets[j] = w.offsets ? w.offsets[k] : -8.f * w.scales[k];
    }
    std::memcpy(p + kWeightBytes, scales, sizeof scales);
    if constexpr (Int4) std::memcpy(p + kWeightBytes + 32, offsets, sizeof offsets);
  }
}

// Rows [m0, m0 + MR) x panels [0, NP): x quantized [M, I] int8, sx the scale of each
// sub-block's activation block and sxsum that scale times the sub-block's sum [M, I / 32].
template <class D, bool Int4, int MR, int NP>
[[gnu::always_inline]] inline void tile(const int8_t* xq, const float* sx, const float* sxsum, int64_t I,
                                        const uint8_t* const* panels, float* y, int64_t O, int64_t o0, const float* b,
                                        int64_t m0) {
  const int64_t subs = I / kSub, sb = sub_bytes(Int4);
  __m256 acc[MR][NP];
  for (int m = 0; m < MR; ++m)
    for (int p = 0; p < NP; ++p) acc[m][p] = _mm256_setzero_ps();
  for (int64_t s = 0; s < subs; ++s) {
    typename D::Acc d[MR][NP];
    for (int m = 0; m < MR; ++m)
      for (int p = 0; p < NP; ++p) d[m][p] = _mm256_setzero_si256();
        // Not unrolled: fully unrolled, GCC computes every quad's products first and spills them.
#pragma GCC unroll 1
    for (int q = 0; q < kSub / 4; ++q) {
      __m256i wv[NP], aw[NP];
      for (int p = 0; p < NP; ++p) {
        wv[p] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(panels[p] + s * sb + q * 32));
        if constexpr (!Int4) aw[p] = _mm256_sign_epi8(wv[p], wv[p]);  // |w|
      }
      for (int m = 0; m < MR; ++m) {
        int32_t x4;
        std::memcpy(&x4, xq + (m0 + m) * I + s * kSub + q * 4, 4);
        const __m256i xb = _mm256_set1_epi32(x4);
        for (int p = 0; p < NP; ++p) {
          if constexpr (Int4)
            d[m][p] = D::u4(d[m][p], wv[p], xb);
          else
            d[m][p] = D::s8(d[m][p], aw[p], _mm256_sign_epi8(xb, wv[p]));
        }
      }
    }
    for (int p = 0; p < NP; ++p) {
      const __m256 sw = _mm256_loadu_ps(reinterpret_cast<const float*>(panels[p] + s * sb + kWeightBytes));
      __m256 off;
      if constexpr (Int4) off = _mm256_loadu_ps(reinterpret_cast<const float*>(panels[p] + s * sb + kWeightBytes + 32));
      for (int m = 0; m < MR; ++m) {
        const __m256 t = _mm256_mul_ps(_mm256_cvtepi32_ps(D::finish(d[m][p], Int4)), sw);
        acc[m][p] = _mm256_fmadd_ps(t, _mm256_set1_ps(sx[(m0 + m) * subs + s]), acc[m][p]);
        if constexpr (Int4) acc[m][p] = _mm256_fmadd_ps(off, _mm256_set1_ps(sxsum[(m0 + m) * subs + s]), acc[m][p]);
      }
    }
  }
  for (int p = 0; p < NP; ++p) {
    const int64_t o = o0 + p * kLanes, n = std::min<int64_t>(kLanes, O - o);
    for (int m = 0; m < MR; ++m) {
      alignas(32) float out[kLanes];
      _mm256_store_ps(out, acc[m][p]);
      float* dst = y + (m0 + m) * O + o;
      for (int64_t j = 0; j < n; ++j) dst[j] = out[j] + (b ? b[o + j] : 0.f);
    }
  }
}

// All M rows against panels [0, NP); MR rows at a time (the registers: MR x NP f32 and
// integer accumulators, NP weight vectors and their absolute values, one activation).
template <class D, bool Int4, int NP>
void panel_rows(const int8_t* xq, const float* sx, const float* sxsum, int64_t I, const uint8_t* const* panels,
                float* y, int64_t O, int64_t o0, const float* b, int64_t M) {
  constexpr int MR = Int4 ? 3 : 2;
  int64_t m = 0;
  for (; m + MR <= M; m += MR) tile<D, Int4, MR, NP>(xq, sx, sxsum, I, panels, y, O, o0, b, m);
  for (; m < M; ++m) tile<D, Int4, 1, NP>(xq, sx, sxsum, I, panels, y, O, o0, b, m);
}

// Outputs [item * 32, item * 32 + 32) for all M rows.
template <class D>
void item(const int8_t* xq, const float* sx, const float* sxsum, const QuantView& w, const float* b, float* y,
          int64_t M, int64_t it) {
  const bool int4 = w.format == QuantFormat::int4;
  const int64_t I = w.cols, O = w.rows, pb = I / kSub * sub_bytes(int4);
  const int64_t o0 = it * kPanelsPerItem * kLanes;
  const int np = int(std::min<int64_t>(kPanelsPerItem, (O - o0 + kLanes - 1) / kLanes));
  thread_local std::vector<uint8_t> buf;
  if (int64_t(buf.size()) < kPanelsPerItem * pb) buf.resize(size_t(kPanelsPerItem * pb));
  const uint8_t* panels[kPanelsPerItem];
  for (int p = 0; p < np; ++p) {
    uint8_t* out = buf.data() + p * pb;
    if (int4)
      pack_panel<true>(w, o0 + p * kLanes, out);
    else
      pack_panel<false>(w, o0 + p * kLanes, out);
    panels[p] = out;
  }
  // Pairs of panels, then a last single one.
  for (int p = 0; p < np; p += 2) {
    const int64_t po = o0 + p * kLanes;
    if (p + 1 < np) {
      if (int4)
        panel_rows<D, true, 2>(xq, sx, sxsum, I, panels + p, y, O, po, b, M);
      else
        panel_rows<D, false, 2>(xq, sx, sxsum, I, panels + p, y, O, po, b, M);
    } else {
      if (int4)
        panel_rows<D, true, 1>(xq, sx, sxsum, I, panels + p, y, O, po, b, M);
      else
        panel_rows<D, false, 1>(xq, sx, sxsum, I, panels + p, y, O, po, b, M);
    }
  }
}

}  // namespace ymm_gemm

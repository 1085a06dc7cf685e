// The f32 kernels of quant_linear, written once and compiled per instruction set:
// quant_linear_f32.cpp (the baseline) and quant_f32_avx2/avx512.cpp (in `#pragma GCC target`
// regions) include this file with LOOM_QUANT_ISA naming the namespace, and defined before it:
// vf, one vector register of floats (16 lanes under AVX-512, 8 under AVX2, 4 in the baseline:
// wider generic vectors than the registers made GCC keep them on the stack), load_bf16() (one
// vf of bf16 values widened to f32 in a register) and, on x86, to_f32() (16 int8 values times a
// scale, as f32, to a 64-byte aligned buffer). Included nowhere else.
//
// 64 columns of a few weight rows at a time are dequantized into a buffer in L1 and
// multiplied with the f32 activations in register tiles of rows x outputs, as decode_linear
// does for f32 weights. The dequantized values equal dequantize_weights', so only the
// summation order differs from the f32 product with the dequantized matrix.

namespace loom::cpu::quant::LOOM_QUANT_ISA {

enum class Kind { i8, i4_symmetric, i4_offset, bf16 };

// n (a multiple of 16) columns of a weight row from their packed bytes, dequantized into out.
// int4: the low and high nibbles of 16 bytes interleaved back into column order, then
// (nibble ^ 8) - 8 sign-extends (symmetric, in SSE2) or the group's offset is added to
// scale * nibble (asymmetric).
template <Kind K>
[[gnu::always_inline]] inline void dequantize_cols(const uint8_t* src, float s, float off, int64_t n, float* out) {
#if !defined(__x86_64__)
  // The same values in plain loops, which GCC vectorises for the target (NEON on aarch64).
  if constexpr (K == Kind::i8) {
    for (int64_t k = 0; k < n; ++k) out[k] = float(int8_t(src[k])) * s;
  } else {
    for (int64_t j = 0; j < n / 2; ++j) {
      const int lo = src[j] & 0x0F, hi = src[j] >> 4;
      out[2 * j] = float(K == Kind::i4_symmetric ? (lo ^ 8) - 8 : lo) * s;
      out[2 * j + 1] = float(K == Kind::i4_symmetric ? (hi ^ 8) - 8 : hi) * s;
    }
    if constexpr (K == Kind::i4_offset)
      for (int64_t i = 0; i < n; ++i) out[i] += off;
  }
#else
  if constexpr (K == Kind::i8) {
    for (int64_t k = 0; k < n; k += 16) to_f32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(src + k)), s, out + k);
  } else {
    const __m128i low = _mm_set1_epi8(0x0F);
    const __m128i flip = _mm_set1_epi8(K == Kind::i4_symmetric ? 8 : 0);
    const __m128i sub = _mm_set1_epi8(K == Kind::i4_symmetric ? 8 : 0);
    int64_t k = 0;
    for (; k + 32 <= n; k += 32) {
      const __m128i p = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + k / 2));
      const __m128i lo = _mm_and_si128(p, low), hi = _mm_and_si128(_mm_srli_epi16(p, 4), low);
      to_f32(_mm_sub_epi8(_mm_xor_si128(_mm_unpacklo_epi8(lo, hi), flip), sub), s, out + k);
      to_f32(_mm_sub_epi8(_mm_xor_si128(_mm_unpackhi_epi8(lo, hi), flip), sub), s, out + k + 16);
    }
    if (k < n) {
      const __m128i p = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(src + k / 2));
      const __m128i lo = _mm_and_si128(p, low), hi = _mm_and_si128(_mm_srli_epi16(p, 4), low);
      to_f32(_mm_sub_epi8(_mm_xor_si128(_mm_unpacklo_epi8(lo, hi), flip), sub), s, out + k);
    }
    if constexpr (K == Kind::i4_offset)
      for (int64_t i = 0; i < n; ++i) out[i] += off;
  }
#endif
}

constexpr int kL = int(sizeof(vf) / sizeof(float));  // lanes
typedef float vfu __attribute__((vector_size(sizeof(vf)), aligned(4), may_alias));

// A dereference, not memcpy: through memcpy into an array element GCC kept the AVX2 build's
// vectors on the stack.
[[gnu::always_inline]] inline void loadv(vf* v, const float* p) { *v = *reinterpret_cast<const vfu*>(p); }

// Outputs o..o+OT-1 of rows m0..m0+MT-1, kSpan columns at a time: OT rows of W dequantized
// into the buffer, then multiplied with MT rows of x. Whole spans keep the buffer's stores
// well ahead of its loads. The group must be a multiple of 16.
constexpr int64_t kSpan = 256;

template <Kind K, int MT, int OT>
[[gnu::always_inline]] inline void f32_tile(const float* x, const QuantView& w, const float* b, float* y, int64_t m0,
                                            int64_t o) {
  const int64_t I = w.cols, O = w.rows, G = w.group, ng = I / G;
  const int64_t wrow = K == Kind::i8 ? I : I / 2;
  alignas(64) float wb[OT][kSpan];
  vf acc[MT][OT];
  for (int m = 0; m < MT; ++m)
    for (int t = 0; t < OT; ++t) acc[m][t] = vf{};
  for (int64_t i0 = 0; i0 < I; i0 += kSpan) {
    const int64_t span = std::min(kSpan, I - i0);
    constexpr int64_t bytes_per_col_x2 = K == Kind::i8 ? 2 : 1;
    prefetch_next_tile(w.q + o * wrow, OT * wrow, OT * i0 * bytes_per_col_x2 / 2,
                       OT * (i0 + span) * bytes_per_col_x2 / 2);
    const int64_t g0 = i0 / G;
    for (int t = 0; t < OT; ++t)
      for (int64_t i = i0, g = g0; i < i0 + span; ++g) {
        const int64_t n = std::min((g + 1) * G, i0 + span) - i;
        const float s = w.scales[(o + t) * ng + g];
        const float off = K == Kind::i4_offset ? w.offsets[(o + t) * ng + g] : 0.f;
        dequantize_cols<K>(w.q + (o + t) * wrow + (K == Kind::i8 ? i : i / 2), s, off, n, wb[t] + (i - i0));
        i += n;
      }
    for (int64_t k = 0; k < span; k += kL)
      for (int t = 0; t < OT; ++t) {
        vf wv, xv;
        loadv(&wv, wb[t] + k);
        for (int m = 0; m < MT; ++m) {
          loadv(&xv, x + (m0 + m) * I + i0 + k);
          acc[m][t] += wv * xv;
        }
      }
  }
  for (int m = 0; m < MT; ++m)
    for (int t = 0; t < OT; ++t) {
      float sum = 0;
      for (int k = 0; k < kL; ++k) sum += acc[m][t][k];
      y[(m0 + m) * O + o + t] = sum + (b ? b[o + t] : 0.f);
    }
}

// bf16 weights need no buffer: a vector of them widens to f32 in registers (zero-extend, shift
// into the high half), so the tile streams W as decode_linear streams f32 rows: OT rows of 2I
// bytes, kL columns at a time. I must be a multiple of 16.
template <int MT, int OT>
[[gnu::always_inline]] inline void bf16_tile(const float* x, const QuantView& w, const float* b, float* y, int64_t m0,
                                             int64_t o) {
  const int64_t I = w.cols, O = w.rows, wrow = 2 * I;
  const uint8_t* wt = w.q + o * wrow;
  vf acc[MT][OT];
  for (int m = 0; m < MT; ++m)
    for (int t = 0; t < OT; ++t) acc[m][t] = vf{};
  for (int64_t i0 = 0; i0 < I; i0 += kSpan) {
    const int64_t span = std::min(kSpan, I - i0);
    prefetch_next_tile(wt, OT * wrow, OT * i0 * 2, OT * (i0 + span) * 2);
    for (int64_t i = i0; i < i0 + span; i += kL) {
      vf wv[OT], xv;
      for (int t = 0; t < OT; ++t) load_bf16(&wv[t], wt + t * wrow + 2 * i);
      for (int m = 0; m < MT; ++m) {
        loadv(&xv, x + (m0 + m) * I + i);
        for (int t = 0; t < OT; ++t) acc[m][t] += wv[t] * xv;
      }
    }
  }
  for (int m = 0; m < MT; ++m)
    for (int t = 0; t < OT; ++t) {
      float sum = 0;
      for (int k = 0; k < kL; ++k) sum += acc[m][t][k];
      y[(m0 + m) * O + o + t] = sum + (b ? b[o + t] : 0.f);
    }
}

template <Kind K, int MT, int OT>
[[gnu::always_inline]] inline void f32_outs(const float* x, const QuantView& w, const float* b, float* y, int64_t m0,
                                            int64_t o0, int64_t o1) {
  int64_t o = o0;
  if constexpr (K == Kind::bf16) {
    constexpr int BT = MT == 1 ? 2 * OT : OT;  // decode: more rows in flight, as decode_linear
    for (; o + BT <= o1; o += BT) bf16_tile<MT, BT>(x, w, b, y, m0, o);
    for (; o < o1; ++o) bf16_tile<MT, 1>(x, w, b, y, m0, o);
    return;
  }
  for (; o + OT <= o1; o += OT) f32_tile<K, MT, OT>(x, w, b, y, m0, o);
  for (; o < o1; ++o) f32_tile<K, MT, 1>(x, w, b, y, m0, o);
}

template <Kind K, int MaxMT, int OT>
void f32_rows_kind(const float* x, const QuantView& w, const float* b, float* y, int64_t M, int64_t o0, int64_t o1) {
  int64_t m = 0;
  if constexpr (MaxMT >= 4)
    for (; m + 4 <= M; m += 4) f32_outs<K, 4, OT>(x, w, b, y, m, o0, o1);
  for (; m + 2 <= M; m += 2) f32_outs<K, 2, OT>(x, w, b, y, m, o0, o1);
  for (; m < M; ++m) f32_outs<K, 1, OT>(x, w, b, y, m, o0, o1);
}

template <int MaxMT, int OT>
void f32_rows(const float* x, const QuantView& w, const float* b, float* y, int64_t M, int64_t o0, int64_t o1) {
  if (w.group % 16 != 0)
    f32_rows_any_group(x, w, b, y, M, o0, o1);
  else if (w.format == QuantFormat::bf16)
    f32_rows_kind<Kind::bf16, MaxMT, OT>(x, w, b, y, M, o0, o1);
  else if (w.format == QuantFormat::int8)
    f32_rows_kind<Kind::i8, MaxMT, OT>(x, w, b, y, M, o0, o1);
  else if (w.offsets)
    f32_rows_kind<Kind::i4_offset, MaxMT, OT>(x, w, b, y, M, o0, o1);
  else
    f32_rows_kind<Kind::i4_symmetric, MaxMT, OT>(x, w, b, y, M, o0, o1);
}

}  // namespace loom::cpu::quant::LOOM_QUANT_ISA

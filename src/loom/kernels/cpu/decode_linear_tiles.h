// The register tiles of decode_linear (decode_linear.cpp), written once and included inside
// one namespace per instruction set under its target pragma, so that GCC compiles the vector
// code of each copy for that set (a template shared by differently targeted callers is
// lowered once, without their target: the AVX2 build then ran on 128-bit halves). Included
// nowhere else.
// One vector register of floats: 16 lanes (zmm) or 8 (ymm), and the same at any float's
// alignment for loads. Loads are plain dereferences: through memcpy into an array element,
// GCC kept the AVX2 build's weight vectors and accumulators on the stack.
typedef float v16 __attribute__((vector_size(64)));
typedef float v8 __attribute__((vector_size(32)));
typedef float v16u __attribute__((vector_size(64), aligned(4), may_alias));
typedef float v8u __attribute__((vector_size(32), aligned(4), may_alias));

// (By reference: returning a vector by value trips -Wpsabi in the build without AVX.)
template <class V>
[[gnu::always_inline]] inline void load(V& v, const float* p) {
  if constexpr (sizeof(V) == 64)
    v = *reinterpret_cast<const v16u*>(p);
  else
    v = *reinterpret_cast<const v8u*>(p);
}

// One register tile: MT input rows x OT outputs, one accumulator of L lanes each, over the
// L-float chunks of I in order; then each accumulator's lanes are summed in a fixed order and
// the scalar tail of I is added. Every output's arithmetic is the same whatever MT, OT, M or
// the output's position, so a row's result does not depend on the batch around it.
template <class V, int MT, int OT>
[[gnu::always_inline]] inline void tile(const float* x, const float* w, const float* b, float* y, int64_t I, int64_t O,
                                        int64_t o) {
  constexpr int L = int(sizeof(V) / sizeof(float));
  V acc[MT][OT];
  for (int m = 0; m < MT; ++m)
    for (int t = 0; t < OT; ++t) acc[m][t] = V{};
  V wv[OT], xv;
  int64_t i = 0;
  for (; i + L <= I; i += L) {
    for (int t = 0; t < OT; ++t) load(wv[t], w + (o + t) * I + i);
    for (int m = 0; m < MT; ++m) {
      load(xv, x + m * I + i);
      for (int t = 0; t < OT; ++t) acc[m][t] += wv[t] * xv;
    }
  }
  for (int m = 0; m < MT; ++m)
    for (int t = 0; t < OT; ++t) {
      const V a = acc[m][t];
      float s = 0;
      for (int k = 0; k < L; ++k) s += a[k];
      const float* wr = w + (o + t) * I;
      for (int64_t j = i; j < I; ++j) s += wr[j] * x[m * I + j];
      y[m * O + o + t] = (b ? b[o + t] : 0.f) + s;
    }
}

// Outputs [o0, o1) for MT input rows: OT outputs at a time (enough independent accumulators to
// keep the FMA units busy when MT is small; with 16 registers, two rows take 4), then one.
template <class V, int Regs, int MT>
[[gnu::always_inline]] inline void rows_tile(const float* x, const float* w, const float* b, float* y, int64_t I,
                                             int64_t O, int64_t o0, int64_t o1) {
  constexpr int OT = MT >= 4 || (Regs <= 16 && MT >= 2) ? 4 : 8;
  int64_t o = o0;
  for (; o + OT <= o1; o += OT) tile<V, MT, OT>(x, w, b, y, I, O, o);
  for (; o < o1; ++o) tile<V, MT, 1>(x, w, b, y, I, O, o);
}

// Output rows [o0, o1) for all M input rows, in tiles of at most 4 (32 registers) or 2 rows
// (the W rows of the range stay in L2 between tiles).
template <class V, int Regs>
[[gnu::always_inline]] inline void run_rows(const float* x, const float* w, const float* b, float* y, int64_t M,
                                            int64_t I, int64_t O, int64_t o0, int64_t o1) {
  int64_t m = 0;
  if constexpr (Regs >= 32)
    for (; m + 4 <= M; m += 4) rows_tile<V, Regs, 4>(x + m * I, w, b, y + m * O, I, O, o0, o1);
  for (; m + 2 <= M; m += 2) rows_tile<V, Regs, 2>(x + m * I, w, b, y + m * O, I, O, o0, o1);
  for (; m < M; ++m) rows_tile<V, Regs, 1>(x + m * I, w, b, y + m * O, I, O, o0, o1);
}

// bf16_gemm (kernels/cpu/bf16_gemm.h): each of training's product forms equals the f64 product
// of the bf16-rounded operands up to f32 accumulation, on sizes off every block edge, with and
// without accumulation into C; its packing rounds as round_to_bf16 does. Tolerance: the
// products of two bf16 values are exact in f32, so the only error is summing K products (and
// C) in f32 in some order, at most K * 2^-24 * sum |a b| (+ |C|) to first order (Higham,
// Accuracy and Stability of Numerical Algorithms, 2nd ed., eq. 4.4); we allow (K + 2) * 2^-24.
// A benchmark (disabled; run with --gtest_also_run_disabled_tests) compares it with SGEMM on
// gpt2-124m's shapes.
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

#include "loom/core/dtype.h"
#include "loom/core/stats.h"
#include "loom/core/threads.h"
#include "loom/kernels/cpu/bf16_gemm.h"
#include "loom/kernels/cpu/gemm.h"
#include "loom/kernels/cpu/rounded_operands.h"

namespace loom::cpu {
namespace {

#define SKIP_WITHOUT_AVX512_BF16()                                                                \
  if (!bf16_gemm_runs_here()) {                                                                   \
    GTEST_SKIP() << "this CPU lacks AVX512-BF16 (CPUID.(EAX=7,ECX=1):EAX bit 5): bf16_gemm does " \
                    "not run here, and ProductPrecision::bf16 uses rounded operands and SGEMM";   \
  }

double rounded(float v) { return double(bf16_to_f32(f32_to_bf16(v))); }

std::vector<float> randn(size_t n, std::mt19937& g) {
  std::normal_distribution<float> d(0.f, 1.f);
  std::vector<float> v(n);
  for (float& x : v) x = d(g);
  return v;
}

struct Form {
  const char* name;
  bool ta, tb;
};
// linear.cpp's three calls: forward y = x W^T, dx = dy W, dW += dy^T x; and the fourth layout.
constexpr Form kForms[] = {
    {"forward x W^T", false, true}, {"dx = dy W", false, false}, {"dW = dy^T x", true, false}, {"A^T B^T", true, true}};

void check_form(const Form& f, int64_t M, int64_t N, int64_t K, bool accumulate) {
  SCOPED_TRACE(testing::Message() << f.name << " M=" << M << " N=" << N << " K=" << K << " accumulate=" << accumulate);
  std::mt19937 g(uint32_t(M * 7919 + N * 31 + K));
  // Stored shapes with leading dimensions wider than the rows, to catch ld mix-ups.
  const int64_t a_rows = f.ta ? K : M, a_cols = f.ta ? M : K, lda = a_cols + 3;
  const int64_t b_rows = f.tb ? N : K, b_cols = f.tb ? K : N, ldb = b_cols + 5;
  const int64_t ldc = N + 2;
  const std::vector<float> A = randn(size_t(a_rows * lda), g), B = randn(size_t(b_rows * ldb), g);
  const std::vector<float> C0 = randn(size_t(M * ldc), g);
  auto a = [&](int64_t m, int64_t k) { return rounded(f.ta ? A[size_t(k * lda + m)] : A[size_t(m * lda + k)]); };
  auto b = [&](int64_t k, int64_t n) { return rounded(f.tb ? B[size_t(n * ldb + k)] : B[size_t(k * ldb + n)]); };

  std::vector<float> C = C0;
  bf16_gemm(f.ta, f.tb, M, N, K, A.data(), lda, B.data(), ldb, accumulate ? 1.f : 0.f, C.data(), ldc);
  const double rel = double(K + 2) * 0x1p-24;
  for (int64_t m = 0; m < M; ++m) {
    for (int64_t n = 0; n < N; ++n) {
      const double c0 = accumulate ? double(C0[size_t(m * ldc + n)]) : 0.0;
      double want = c0, mag = std::fabs(c0);
      for (int64_t k = 0; k < K; ++k) {
        const double p = a(m, k) * b(k, n);
        want += p;
        mag += std::fabs(p);
      }
      ASSERT_LE(std::fabs(double(C[size_t(m * ldc + n)]) - want), rel * mag)
          << "C[" << m << "," << n << "] = " << C[size_t(m * ldc + n)] << ", want " << want;
    }
    // Padding between rows of C is left alone.
    for (int64_t n = N; n < ldc; ++n) ASSERT_EQ(C[size_t(m * ldc + n)], C0[size_t(m * ldc + n)]);
  }
}

TEST(Bf16Gemm, EachFormIsTheProductOfRoundedOperands) {
  SKIP_WITHOUT_AVX512_BF16();
  // Sizes off the blocks (MR 6, NR 64, tiles 96 x 256, K blocks of 256): single elements, K odd,
  // several tiles each way, and K over two blocks (the later blocks accumulate into C).
  const int64_t sizes[][3] = {{1, 1, 1}, {5, 63, 3}, {7, 65, 33}, {13, 130, 256}, {197, 300, 517}, {96, 256, 1}};
  for (const Form& f : kForms)
    for (const auto& s : sizes)
      for (bool accumulate : {false, true}) check_form(f, s[0], s[1], s[2], accumulate);
}

TEST(Bf16Gemm, ManyThreadsAgreeWithOne) {
  SKIP_WITHOUT_AVX512_BF16();
  const int64_t M = 301, N = 517, K = 771;
  std::mt19937 g(3);
  const std::vector<float> A = randn(size_t(M * K), g), B = randn(size_t(N * K), g);
  std::vector<float> one(size_t(M * N)), many(size_t(M * N));
  const int threads = num_threads();
  set_num_threads(1);
  bf16_gemm(false, true, M, N, K, A.data(), K, B.data(), K, 0.f, one.data(), N);
  set_num_threads(std::max(threads, 2));
  bf16_gemm(false, true, M, N, K, A.data(), K, B.data(), K, 0.f, many.data(), N);
  set_num_threads(threads);
  // Each element is summed in the same order whichever thread computes its tile.
  EXPECT_EQ(0, std::memcmp(one.data(), many.data(), one.size() * sizeof(float)));
}

TEST(Bf16Gemm, PackingRoundsAsRoundToBf16) {
  SKIP_WITHOUT_AVX512_BF16();
  // C[m, 0] = bf16(a[m]) * 1: ties both ways, carries into the exponent, the largest finite
  // values (rounding to infinity), infinities and NaNs. vdpbf16ps reads bf16 denormals as zero,
  // so none are included.
  std::mt19937 g(1);
  std::normal_distribution<float> d(0.f, 1.f);
  std::vector<float> a;
  for (int i = 0; i < 4000; ++i) a.push_back(d(g) * std::ldexp(1.f, i % 120 - 60));
  for (uint32_t bits :
       {0x3f808000u, 0x3f818000u, 0x3f80ffffu, 0x3fffffffu, 0x7f7fffffu, 0xff7fffffu, 0x7f7f7fffu, 0x7f800000u,
        0xff800000u, 0x7fc00001u, 0x7f800001u, 0xffa00000u, 0x00800000u, 0x00000000u, 0x80000000u}) {
    float f;
    std::memcpy(&f, &bits, 4);
    a.push_back(f);
  }
  const int64_t M = int64_t(a.size());
  std::vector<float> want(a.size()), got(a.size());
  round_to_bf16(a.data(), want.data(), M);
  const float one = 1.f;
  for (bool ta : {false, true}) {  // both packings of A (rows, and transposed columns)
    bf16_gemm(ta, false, M, 1, 1, a.data(), ta ? M : 1, &one, 1, 0.f, got.data(), 1);
    for (size_t i = 0; i < a.size(); ++i) {
      if (std::isnan(want[i])) {
        EXPECT_TRUE(std::isnan(got[i])) << "a[" << i << "] = " << a[i];
      } else {
        EXPECT_EQ(got[i], want[i]) << "a[" << i << "] = " << a[i] << " ta=" << ta;
      }
    }
  }
  // and of B, with A = 1
  for (bool tb : {false, true}) {
    bf16_gemm(false, tb, 1, M, 1, &one, 1, a.data(), tb ? 1 : M, 0.f, got.data(), M);
    for (size_t i = 0; i < a.size(); ++i) {
      if (!std::isnan(want[i])) {
        EXPECT_EQ(got[i], want[i]) << "b[" << i << "] = " << a[i] << " tb=" << tb;
      }
    }
  }
}

TEST(Bf16Gemm, ThePathIsNamed) {
  const std::string path = bf16_product_path();
  EXPECT_TRUE(path == "avx512-bf16 GEMM" || path == "bf16-rounded f32 x SGEMM") << path;
  if (!bf16_gemm_runs_here()) {
    EXPECT_FALSE(bf16_gemm_preferred());
  }
  std::printf("bf16 products here: %s (vdpbf16ps / vfmadd231ps products per second: %.2f)\n", path.c_str(),
              bf16_fma_rate_ratio());
}

// gpt2-124m's linear products at 1024 rows (batch 4 x 256 tokens), each form: SGEMM on f32
// operands (fp32 training), rounding + SGEMM (bf16 training without this engine) and bf16_gemm.
// Interleaved repetitions, medians.
TEST(Bf16GemmBench, DISABLED_Gpt2Products) {
  SKIP_WITHOUT_AVX512_BF16();
  struct Linear {
    const char* name;
    int64_t O, I;
  };
  // The LM head's products too (lm_head_xent with its default chunk of 1024 rows), apart.
  const Linear linears[] = {{"attn.qkv", 2304, 768},
                            {"attn.proj", 768, 768},
                            {"mlp.fc", 3072, 768},
                            {"mlp.proj", 768, 3072},
                            {"lm_head", 50257, 768}};
  const int64_t T = 1024, V = 50257;
  std::mt19937 g(7);
  const std::vector<float> x = randn(size_t(T * 3072), g), w = randn(size_t(V * 768), g), dy = randn(size_t(T * V), g);
  std::vector<float> out(size_t(T * V));
  const int reps = 7;
  std::printf("\n1024 rows, %d threads; GFLOP/s, medians of %d interleaved (the head: of 3)\n", num_threads(), reps);
  std::printf("%-10s %-14s %6s %6s %6s | %8s %8s %8s | %6s %6s\n", "linear", "form", "M", "N", "K", "SGEMM",
              "rnd+SGEMM", "bf16", "x SGEMM", "x rnd");
  double totals[3] = {};
  for (const Linear& l : linears) {
    for (const Form& f : {kForms[0], kForms[1], kForms[2]}) {
      // forward: [T,I] x [O,I]^T; dx: [T,O] x [O,I]; dW: [T,O]^T x [T,I]
      const bool fwd = !f.ta && f.tb, dx = !f.ta && !f.tb;
      const int64_t M = fwd || dx ? T : l.O, N = fwd ? l.O : l.I, K = fwd ? l.I : dx ? l.O : T;
      const float* A = fwd ? x.data() : dy.data();
      const float* B = fwd || dx ? w.data() : x.data();
      const int64_t lda = fwd ? l.I : l.O, ldb = fwd || dx ? l.I : l.I;
      const float beta = f.ta ? 1.f : 0.f;
      std::vector<double> t[3];
      for (int rep = 0; rep <= (l.O == V ? 3 : reps); ++rep)
        for (int path = 0; path < 3; ++path) {
          const auto t0 = std::chrono::steady_clock::now();
          if (path == 0) {
            gemm(f.ta, f.tb, M, N, K, 1.f, A, lda, B, ldb, beta, out.data(), N);
          } else if (path == 1) {
            const float* ra = rounded_operand(ProductPrecision::bf16, 0, A, (f.ta ? K : M) * lda);
            const float* rb = rounded_operand(ProductPrecision::bf16, 1, B, (f.tb ? N : K) * ldb);
            gemm(f.ta, f.tb, M, N, K, 1.f, ra, lda, rb, ldb, beta, out.data(), N);
          } else {
            bf16_gemm(f.ta, f.tb, M, N, K, A, lda, B, ldb, beta, out.data(), N);
          }
          if (rep > 0) t[path].push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
        }
      const double flop = 2.0 * double(M * N * K);
      double s[3];
      for (int p = 0; p < 3; ++p) s[p] = median(t[p]), totals[p] += l.O == V ? 0.0 : s[p];
      std::printf("%-10s %-14s %6lld %6lld %6lld | %8.1f %8.1f %8.1f | %5.2fx %5.2fx\n", l.name, f.name, (long long)M,
                  (long long)N, (long long)K, flop / s[0] / 1e9, flop / s[1] / 1e9, flop / s[2] / 1e9, s[0] / s[2],
                  s[1] / s[2]);
    }
  }
  std::printf(
      "a block's 12 products (not the head): SGEMM %.1f ms, rounding + SGEMM %.1f ms, bf16_gemm %.1f ms (%.2fx "
      "SGEMM)\n",
      totals[0] * 1e3, totals[1] * 1e3, totals[2] * 1e3, totals[0] / totals[2]);
}

}  // namespace
}  // namespace loom::cpu

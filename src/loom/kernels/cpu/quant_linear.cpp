// quant_linear: checks the view, picks the path for this CPU, quantizes the activations for
// the integer-dot paths, and spreads output rows over OpenMP threads. The kernels live in
// quant_vnni_avx512/avx2.cpp and quant_int_avx2.cpp (integer dot products, few rows), quant_vnni_gemm.cpp (AVX512-VNNI,
// many rows), quant_int_neon.cpp (aarch64's sdot, any rows) and quant_linear_f32.cpp (f32 dequantization); the formats
// in quant_format.cpp.

#include <algorithm>
#include <cstdlib>
#include <optional>
#include <vector>

#include "loom/core/cpu_features.h"
#include "loom/core/error.h"
#include "loom/kernels/cpu/cpu_kernels.h"
#include "loom/kernels/cpu/gemm.h"
#include "loom/kernels/cpu/quant_linear.h"
#include "loom/kernels/cpu/quant_linear_impl.h"

namespace loom::cpu {
namespace quant {
namespace {

// Output rows per work item, handed out dynamically (as decode_linear does): on a shared
// machine a thread that gets less CPU time then does less of the work.
constexpr int64_t kRowChunk = 64;
// Longest activation block of the integer paths: per-channel weights (group == I) still get
// an activation scale per 128 columns, so that one large activation does not flatten a row.
constexpr int64_t kMaxActBlock = 128;
// W rows dequantized per BLAS call on the f32 paths for many input rows.
constexpr int64_t kBlasRows = 128;

constexpr Path kAllPaths[] = {Path::base_f32, Path::avx2_f32,    Path::avx512_f32,  Path::avx2_int,
                              Path::avx_vnni, Path::avx512_vnni, Path::avx512_bf16, Path::neon_dot};

template <class T>
T* grown(std::vector<T>& v, int64_t n) {
  if (int64_t(v.size()) < n) v.resize(size_t(n));
  return v.data();
}

// Many rows on AVX512-VNNI: W repacked into panels of outputs (quant_vnni_gemm.cpp).
void int_gemm(const float* x, const QuantView& w, const ActLayout& lay, const float* b, float* y, int64_t M) {
  thread_local std::vector<uint8_t> xa;
  thread_local std::vector<float> sx, sums;
  const int64_t I = w.cols;
  uint8_t* xq = grown(xa, M * I);
  float* sq = grown(sx, M * (I / lay.block));
  float* su = grown(sums, M * (I / lay.block));
#pragma omp parallel for schedule(static)
  for (int64_t m = 0; m < M; ++m) gemm_quantize_acts_avx512(x, w, lay, xq, sq, su, m, m + 1);
#pragma omp parallel for schedule(dynamic, 1)
  for (int64_t item = 0; item < gemm_items(w); ++item) gemm_panels_avx512(xq, sq, su, w, lay, b, y, M, item);
}

// Many rows on AVX2 (with or without AVX-VNNI): W repacked into panels (quant_gemm_ymm.h).
void ymm_int_gemm(Path p, const float* x, const QuantView& w, const ActLayout& lay, const float* b, float* y,
                  int64_t M) {
  thread_local std::vector<int8_t> xa;
  thread_local std::vector<float> sx, sxsum;
  const int64_t I = w.cols;
  int8_t* xq = grown(xa, M * I);
  float* sq = grown(sx, M * (I / 32));
  float* ss = grown(sxsum, M * (I / 32));
#pragma omp parallel for schedule(static)
  for (int64_t m = 0; m < M; ++m) ymm_gemm_quantize_acts(x, w, lay, xq, sq, ss, m, m + 1);
  const auto item = p == Path::avx_vnni ? ymm_gemm_item_avx_vnni : ymm_gemm_item_avx2i;
#pragma omp parallel for schedule(dynamic, 1)
  for (int64_t it = 0; it < ymm_gemm_items(w); ++it) item(xq, sq, ss, w, b, y, M, it);
}

void int_linear(Path p, const float* x, const QuantView& w, const float* b, float* y, int64_t M) {
  if (p == Path::avx512_vnni && M >= kGemmMinRows) {
    const ActLayout lay = act_layout(w, 64);
    if (gemm_fits(w, lay)) return int_gemm(x, w, lay, b, y, M);
  }
  if ((p == Path::avx2_int || p == Path::avx_vnni) && M >= kYmmGemmMinRows) {
    const ActLayout lay = act_layout(w, 32);
    if (gemm_fits(w, lay)) return ymm_int_gemm(p, x, w, lay, b, y, M);
  }
  // zmm where the shape allows (AVX512-VNNI also has ymm kernels), stepped where it can; NEON
  // has one kernel for any M (its few-rows one: no repacked many-rows kernel yet).
  ActLayout lay = act_layout(w, p == Path::neon_dot ? 16 : 32);
  if (p == Path::avx512_vnni) {
    const ActLayout wide = act_layout(w, 64);
    if (wide.stepped || (!lay.stepped && wide.block >= 64)) lay = wide;
  }
  const QuantizeActsFn quantize = p == Path::avx512_vnni ? quantize_acts_avx512
                                  : p == Path::avx_vnni  ? quantize_acts_avx2
                                  : p == Path::neon_dot  ? quantize_acts_neon
                                                         : quantize_acts_avx2i;
  const IntRowsFn rows = p == Path::avx512_vnni ? int_rows_avx512
                         : p == Path::avx_vnni  ? int_rows_avx2
                         : p == Path::neon_dot  ? int_rows_neon
                                                : int_rows_avx2i;
  // The calling thread's buffers: the OpenMP threads below only read them.
  thread_local std::vector<int8_t> q;
  thread_local std::vector<float> scale;
  thread_local std::vector<int32_t> sum;
  QuantActs a;
  int8_t* qa = grown(q, M * lay.row_bytes);
  float* sa = grown(scale, std::max<int64_t>(1, M * lay.row_blocks));
  int32_t* ua = grown(sum, std::max<int64_t>(1, M * lay.row_blocks));
  a.q = qa, a.scale = sa, a.sum = ua, a.lay = lay;
  const int64_t I = w.cols, O = w.rows;
  if (M * I < (1 << 16)) {
    quantize(x, w, lay, qa, sa, ua, 0, M);
  } else {
#pragma omp parallel for schedule(static)
    for (int64_t m = 0; m < M; ++m) quantize(x, w, lay, qa, sa, ua, m, m + 1);
  }
#pragma omp parallel for schedule(dynamic, 1)
  for (int64_t c = 0; c < (O + kRowChunk - 1) / kRowChunk; ++c)
    rows(a, w, b, y, M, c * kRowChunk, std::min(O, c * kRowChunk + kRowChunk));
}

// Many rows: BLAS on blocks of W dequantized into each thread's scratch.
void blas_linear(const float* x, const QuantView& w, const float* b, float* y, int64_t M) {
  const int64_t I = w.cols, O = w.rows;
#pragma omp parallel for schedule(dynamic, 1)
  for (int64_t c = 0; c < (O + kBlasRows - 1) / kBlasRows; ++c) {
    thread_local std::vector<float> scratch;
    const int64_t o0 = c * kBlasRows, o1 = std::min(O, o0 + kBlasRows);
    float* wf = grown(scratch, kBlasRows * I);
    for (int64_t o = o0; o < o1; ++o) dequantize_row(w, o, wf + (o - o0) * I);
    if (b)
      for (int64_t m = 0; m < M; ++m) std::copy(b + o0, b + o1, y + m * O + o0);
    // Inside a parallel region OpenBLAS (OpenMP build) runs on the calling thread.
    gemm(false, true, M, o1 - o0, I, 1.f, x, I, wf, I, b ? 1.f : 0.f, y + o0, O);
  }
}

void bf16_dot_linear(const float* x, const QuantView& w, const float* b, float* y, int64_t M) {
  if (M > kQuantBlasMinRows) return blas_linear(x, w, b, y, M);
  thread_local std::vector<uint16_t> xb;
  const int64_t I = w.cols, O = w.rows;
  uint16_t* xr = grown(xb, M * I);
  bf16_acts_avx512(x, M * I, xr);
#pragma omp parallel for schedule(dynamic, 1)
  for (int64_t c = 0; c < (O + kRowChunk - 1) / kRowChunk; ++c)
    bf16_rows_avx512(xr, w, b, y, M, c * kRowChunk, std::min(O, c * kRowChunk + kRowChunk));
}

void f32_linear(Path p, const float* x, const QuantView& w, const float* b, float* y, int64_t M) {
  if (M > kQuantBlasMinRows) return blas_linear(x, w, b, y, M);
  const F32RowsFn rows = p == Path::avx512_f32 ? f32_rows_avx512 : p == Path::avx2_f32 ? f32_rows_avx2 : f32_rows_base;
  const int64_t O = w.rows;
#pragma omp parallel for schedule(dynamic, 1)
  for (int64_t c = 0; c < (O + kRowChunk - 1) / kRowChunk; ++c)
    rows(x, w, b, y, M, c * kRowChunk, std::min(O, c * kRowChunk + kRowChunk));
}

}  // namespace

const char* path_name(Path p) {
  switch (p) {
    case Path::base_f32: return "base-f32";
    case Path::avx2_f32: return "avx2-f32";
    case Path::avx512_f32: return "avx512-f32";
    case Path::avx2_int: return "avx2-int";
    case Path::avx_vnni: return "avx-vnni";
    case Path::avx512_vnni: return "avx512-vnni";
    case Path::avx512_bf16: return "avx512-bf16";
    case Path::neon_dot: return "neon-dot";
  }
  return "?";
}

bool path_runs_here(Path p) {
  const CpuFeatures& f = cpu_features();
  switch (p) {
    case Path::base_f32: return true;
    case Path::avx2_f32: return f.avx2;
    case Path::avx512_f32: return f.avx512;
    case Path::avx2_int: return f.avx2;
    case Path::avx_vnni: return f.avx_vnni;
    case Path::avx512_vnni: return f.avx512_vnni;
    case Path::avx512_bf16: return f.avx512_bf16;
    case Path::neon_dot: return f.neon_dot;
  }
  return false;
}

std::vector<Path> runnable_paths() {
  std::vector<Path> out;
  for (Path p : kAllPaths)
    if (path_runs_here(p)) out.push_back(p);
  return out;
}

namespace {

// LOOM_QUANT_PATH, checked once: a path for int8/int4 weights that this CPU runs.
std::optional<Path> forced_integer_path() {
  const char* want = std::getenv("LOOM_QUANT_PATH");
  if (!want || !*want) return std::nullopt;
  std::string names;
  for (Path p : kAllPaths) {
    if (p == Path::avx512_bf16) continue;
    if (want == std::string(path_name(p))) {
      LOOM_CHECK(path_runs_here(p), "quant", "LOOM_QUANT_PATH=", want, " needs instructions this CPU lacks");
      return p;
    }
    names += std::string(names.empty() ? "" : ", ") + path_name(p);
  }
  fail("quant", "LOOM_QUANT_PATH='", want, "': expected one of ", names);
}

}  // namespace

Path default_path(QuantFormat format) {
  // The instruction set the f32 kernels were given (CPU features, or LOOM_ISA). bf16 weights
  // take AVX512-BF16 dot products where the CPU has them (measured on gpt2-124m's decode step,
  // docs/PERFORMANCE.md: widening each weight to f32 first costs enough instructions that the
  // kernel no longer keeps up with memory); elsewhere they are widened.
  const std::string isa = hot_kernels_isa();
  const CpuFeatures& f = cpu_features();
  if (format == QuantFormat::bf16)
    return isa == "avx512" ? (f.avx512_bf16 ? Path::avx512_bf16 : Path::avx512_f32)
           : isa == "avx2" ? Path::avx2_f32
                           : Path::base_f32;
  static const std::optional<Path> forced = forced_integer_path();
  if (forced) return *forced;
  if (isa == "avx512") return f.avx512_vnni ? Path::avx512_vnni : Path::avx512_f32;
  if (isa == "avx2") return f.avx_vnni ? Path::avx_vnni : Path::avx2_int;
  // aarch64: LOOM_ISA names x86 builds only; LOOM_QUANT_PATH=base-f32 turns sdot off.
  return f.neon_dot ? Path::neon_dot : Path::base_f32;
}

ActLayout act_layout(const QuantView& w, int64_t chunk, bool stepped_ok) {
  ActLayout l;
  const int64_t G = w.group, I = w.cols;
  l.chunk = chunk;
  l.block = std::min(G, kMaxActBlock);
  // Stepped: a vector covers chunk bytes of int8 columns, or twice as many int4 columns.
  const int64_t chunk_cols = w.format == QuantFormat::int8 ? chunk : 2 * chunk;
  l.step = std::max(l.block, chunk_cols);
  l.blocks_per_step = l.step / l.block;
  l.stepped = stepped_ok && (l.block == 32 || l.block == 64 || l.block == 128) && G % l.block == 0 &&
              l.step % chunk_cols == 0 && I % l.step == 0;
  if (l.stepped) {
    l.step_bytes = l.step + 2 * chunk;
    l.row_bytes = I / l.step * l.step_bytes;
    return l;
  }
  l.step = l.blocks_per_step = 0;
  l.blocks_per_group = (G + l.block - 1) / l.block;
  l.block_bytes = (l.block + chunk - 1) / chunk * chunk;
  const int64_t last = G - (l.blocks_per_group - 1) * l.block;
  l.group_bytes = (l.blocks_per_group - 1) * l.block_bytes + (last + chunk - 1) / chunk * chunk;
  l.row_bytes = (I / G) * l.group_bytes;
  l.row_blocks = (I / G) * l.blocks_per_group;
  return l;
}

void quant_linear_with(Path p, const float* x, const QuantView& w, const float* b, float* y, int64_t M) {
  check_view(w);
  LOOM_CHECK(path_runs_here(p), "quant", "path ", path_name(p), " needs instructions this CPU lacks");
  LOOM_CHECK(!is_integer_path(p) || w.format != QuantFormat::bf16, "quant", "path ", path_name(p),
             " multiplies int8/int4 weights; bf16 weights take an f32 or the avx512-bf16 path");
  LOOM_CHECK(!is_bf16_dot_path(p) || w.format == QuantFormat::bf16, "quant", "path ", path_name(p),
             " multiplies bf16 weights; ", quant_format_name(w.format), " weights take an integer or f32 path");
  if (M <= 0 || w.rows == 0) return;
  if (is_integer_path(p))
    int_linear(p, x, w, b, y, M);
  else if (is_bf16_dot_path(p))
    bf16_dot_linear(x, w, b, y, M);
  else
    f32_linear(p, x, w, b, y, M);
}

}  // namespace quant

void quant_linear(const float* x, const QuantView& w, const float* b, float* y, int64_t M) {
  static const quant::Path paths[3] = {quant::default_path(QuantFormat::int8), quant::default_path(QuantFormat::int4),
                                       quant::default_path(QuantFormat::bf16)};
  quant::quant_linear_with(paths[size_t(w.format)], x, w, b, y, M);
}

std::string quant_linear_path(QuantFormat f) { return quant::path_name(quant::default_path(f)); }

}  // namespace loom::cpu

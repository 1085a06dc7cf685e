// 1-bit compression with error feedback and the two-collective compressed all-reduce.
#include "loom/comm/onebit.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#if defined(__SSE2__)
#include <immintrin.h>
#endif

#include "loom/core/error.h"
#include "loom/core/timer.h"

namespace loom::comm {

int64_t onebit_message_bytes(int64_t n) { return 4 * ((n + kOneBitBlock - 1) / kOneBitBlock) + n / 8; }

namespace {

// The eight +-1 values a byte of sign bits stands for: decoding is a table row times the
// scale, which vectorises (a bit test per element does not).
struct SignTable {
  float v[256][8];
  SignTable() {
    for (int b = 0; b < 256; ++b)
      for (int j = 0; j < 8; ++j) v[b][j] = (b >> j) & 1 ? 1.f : -1.f;
  }
};
const SignTable kSigns;

// Bit j set when v[j] >= 0 (-0 counts as positive, NaN as negative), for 8 floats.
inline uint8_t sign_byte(const float* v) {
#if defined(__SSE2__)
  const __m128 zero = _mm_setzero_ps();
  const int lo = _mm_movemask_ps(_mm_cmpge_ps(_mm_loadu_ps(v), zero));
  const int hi = _mm_movemask_ps(_mm_cmpge_ps(_mm_loadu_ps(v + 4), zero));
  return uint8_t(lo | (hi << 4));
#else
  unsigned byte = 0;
  for (int j = 0; j < 8; ++j) byte |= unsigned(v[j] >= 0) << j;
  return uint8_t(byte);
#endif
}

}  // namespace

void onebit_compress(const float* x, int64_t n, uint8_t* out, float* error) {
  const int64_t blocks = (n + kOneBitBlock - 1) / kOneBitBlock;
  uint8_t* bits = out + 4 * blocks;
#pragma omp parallel for schedule(static) if (n > (int64_t(1) << 18))
  for (int64_t b = 0; b < blocks; ++b) {
    const int64_t lo = b * kOneBitBlock, hi = std::min(n, lo + kOneBitBlock);  // multiples of 8
    float part[8] = {};  // independent partial sums, so the loop vectorises without -ffast-math
    for (int64_t i = lo; i < hi; i += 8)
      for (int j = 0; j < 8; ++j) part[j] += x[i + j] * x[i + j];
    float ss = 0;
    for (float p : part) ss += p;
    const float scale = std::sqrt(ss / float(hi - lo));
    std::memcpy(out + 4 * b, &scale, sizeof scale);
    for (int64_t i = lo; i < hi; ++i) error[i] = x[i] - (x[i] >= 0 ? scale : -scale);
    for (int64_t k = lo / 8; k < hi / 8; ++k) bits[k] = sign_byte(x + 8 * k);
  }
}

void onebit_accumulate(const uint8_t* in, int64_t n, float* acc) {
  const int64_t blocks = (n + kOneBitBlock - 1) / kOneBitBlock;
  const uint8_t* bits = in + 4 * blocks;
#pragma omp parallel for schedule(static) if (n > (int64_t(1) << 18))
  for (int64_t b = 0; b < blocks; ++b) {
    float scale;
    std::memcpy(&scale, in + 4 * b, sizeof scale);
    const int64_t lo = b * kOneBitBlock, hi = std::min(n, lo + kOneBitBlock);
    for (int64_t k = lo / 8; k < hi / 8; ++k) {
      const float* sign = kSigns.v[bits[k]];
      float* a = acc + 8 * k;
      for (int j = 0; j < 8; ++j) a[j] += scale * sign[j];
    }
  }
}

OneBitAllReduce::OneBitAllReduce(Group g, int64_t n) : g_(std::move(g)), n_(n) {
  LOOM_CHECK(n >= 0, "onebit", "tensor size ", n, " is negative");
  const int N = g_.size();
  c_ = std::max<int64_t>(1, (n + N - 1) / N);
  cb_ = (c_ + 7) / 8 * 8;
  msg_ = onebit_message_bytes(cb_);
  worker_error_ = Tensor::zeros({N * cb_}, DType::f32, MemCategory::optimizer);
  server_error_ = Tensor::zeros({cb_}, DType::f32, MemCategory::optimizer);
  work_ = Tensor::zeros({N * cb_}, DType::f32, MemCategory::comm);
  send_ = Tensor::zeros({msg_ * N}, DType::u8, MemCategory::comm);
  recv_ = Tensor::zeros({msg_ * N}, DType::u8, MemCategory::comm);
  gathered_ = Tensor::zeros({msg_ * N}, DType::u8, MemCategory::comm);
  chunk_ = Tensor::zeros({cb_}, DType::f32, MemCategory::comm);
}

int64_t OneBitAllReduce::valid(int q) const { return std::max<int64_t>(0, std::min(c_, n_ - q * c_)); }

int64_t OneBitAllReduce::wire_bytes() const {
  return 2 * msg_ * (g_.size() - 1);  // all-to-all: a chunk to each other rank; all-gather: ours to each
}

void OneBitAllReduce::compress_and_exchange(const float* x) {
  const int N = g_.size();
  float* w = work_.data<float>();
  if (!feedback_) worker_error_.zero();
  float* we = worker_error_.data<float>();
  // Chunk q of x (c elements) goes to row q of the work buffer (cb, zero-padded).
#pragma omp parallel for schedule(static) if (N * cb_ > (int64_t(1) << 18))
  for (int q = 0; q < N; ++q) {
    const int64_t v = valid(q);
    for (int64_t o = 0; o < cb_; ++o) w[q * cb_ + o] = o < v ? x[q * c_ + o] + we[q * cb_ + o] : 0.f;
  }
  uint8_t* send = send_.data<uint8_t>();
  for (int q = 0; q < N; ++q) {
    onebit_compress(w + q * cb_, cb_, send + q * msg_, we + q * cb_);
    for (int64_t o = valid(q); o < cb_; ++o) we[q * cb_ + o] = 0;  // padding carries no error
  }
  Stopwatch sw;
  g_.all_to_all(send_, recv_);
  comm_s_ = sw.seconds();
}

float* OneBitAllReduce::received_sum() {
  // Our chunk: the sum of every rank's compressed chunk, in rank order.
  float* s = chunk_.data<float>();
  std::memset(s, 0, size_t(cb_) * sizeof(float));
  for (int q = 0; q < g_.size(); ++q) onebit_accumulate(recv_.data<uint8_t>() + q * msg_, cb_, s);
  return s;
}

void OneBitAllReduce::gather_and_decode(float* s, float* y, bool add) {
  // Compress our chunk s (cb elements) with the server error, all-gather, decode every chunk.
  Tensor mine = gathered_.slice(int64_t(g_.rank()) * msg_, {msg_});
  if (!feedback_) server_error_.zero();
  float* se = server_error_.data<float>();
  for (int64_t o = 0; o < cb_; ++o) s[o] += se[o];
  onebit_compress(s, cb_, mine.data<uint8_t>(), se);
  for (int64_t o = valid(g_.rank()); o < cb_; ++o) se[o] = 0;
  Stopwatch sw;
  g_.all_gather(mine, gathered_);
  comm_s_ += sw.seconds();
  float* w = work_.data<float>();
  std::memset(w, 0, size_t(g_.size() * cb_) * sizeof(float));
  for (int q = 0; q < g_.size(); ++q) onebit_accumulate(gathered_.data<uint8_t>() + q * msg_, cb_, w + q * cb_);
#pragma omp parallel for schedule(static) if (g_.size() * cb_ > (int64_t(1) << 18))
  for (int q = 0; q < g_.size(); ++q) {
    const int64_t v = valid(q);
    for (int64_t o = 0; o < v; ++o) y[q * c_ + o] = add ? y[q * c_ + o] + w[q * cb_ + o] : w[q * cb_ + o];
  }
}

void OneBitAllReduce::sum(float* x) {
  const Stopwatch total;
  compress_and_exchange(x);
  gather_and_decode(received_sum(), x, /*add=*/false);
  compute_s_ = total.seconds() - comm_s_;
}

void OneBitAllReduce::reduce_to_owner(const float* x, float* out) {
  const Stopwatch total;
  compress_and_exchange(x);
  std::memcpy(out, received_sum(), size_t(valid(g_.rank())) * sizeof(float));
  compute_s_ = total.seconds() - comm_s_;
}

void OneBitAllReduce::all_gather_add(const float* delta, float* y) {
  const Stopwatch total;
  comm_s_ = 0;
  float* s = chunk_.data<float>();
  std::memset(s, 0, size_t(cb_) * sizeof(float));
  std::memcpy(s, delta, size_t(valid(g_.rank())) * sizeof(float));
  gather_and_decode(s, y, /*add=*/true);
  compute_s_ = total.seconds() - comm_s_;
}

}  // namespace loom::comm

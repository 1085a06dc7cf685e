// The compressed all-reduce of 1-bit Adam (Tang et al. 2021, DeepSpeed's OnebitAdam): each
// rank sends the signs of its tensor plus one scale per block of 1024 elements, with error feedback on the
// sending side (what compression dropped is added to the next call's input) and on the
// receiving side (each rank reduces one chunk and compresses the sum again). Two
// collectives carry it: an all-to-all of compressed chunks, then an all-gather of the
// compressed sums, so every rank ends with the same values at about 1/32 of an f32
// all-reduce's bytes.
#pragma once
#include <cstdint>

#include "loom/comm/group.h"

namespace loom::comm {

class OneBitAllReduce {
 public:
  // For tensors of `n` f32 elements over `g`; the error buffers start at zero.
  OneBitAllReduce(Group g, int64_t n);

  // In place: x becomes the (compressed) sum over ranks of x + this rank's error, identical
  // on every rank.
  void sum(float* x);

  int64_t size() const { return n_; }
  // Padded length (a multiple of 8 x ranks) and the chunk each rank reduces.
  int64_t padded() const { return padded_; }
  int64_t chunk() const { return padded_ / g_.size(); }
  // Bytes this rank puts on the wire per call (its all-to-all and all-gather payloads sent
  // to other ranks), and what an f32 ring all-reduce of the same tensor sends.
  int64_t wire_bytes() const;
  int64_t f32_ring_wire_bytes() const;

  // The error-feedback state (checkpointed, so a resumed run continues exactly):
  // worker: padded() elements; server: chunk() elements.
  const Tensor& worker_error() const { return worker_error_; }
  // Seconds the last sum() spent in its two collectives, and compressing and decoding.
  double last_comm_seconds() const { return comm_s_; }
  double last_compute_seconds() const { return compute_s_; }
  const Tensor& server_error() const { return server_error_; }

 private:
  Group g_;
  int64_t n_, padded_;
  Tensor worker_error_, server_error_;
  Tensor work_, send_, recv_, gathered_;
  double comm_s_ = 0, compute_s_ = 0;
};

// Elements per scale. One scale per chunk would make a LayerNorm gain's momentum (about 1)
// and a weight matrix's (about 1e-3) share one magnitude; blocks keep them apart for 4
// bytes per 1024 elements (3% on top of the 1 bit each).
inline constexpr int64_t kOneBitBlock = 1024;
// Bytes of a compressed run of n elements: a f32 scale per block, then n / 8 bytes of signs.
int64_t onebit_message_bytes(int64_t n);
// Compresses x[0, n) (n a multiple of 8): per block, scale = ||x_block||_2 / sqrt(len), and
// bit i is set when x[i] >= 0; error[i] = x[i] - (+-scale).
void onebit_compress(const float* x, int64_t n, uint8_t* out, float* error);
// Adds the decoded values (+-scale) to acc[0, n).
void onebit_accumulate(const uint8_t* in, int64_t n, float* acc);

}  // namespace loom::comm

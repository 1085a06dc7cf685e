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
  // For tensors of `n` f32 elements over `g`; the error buffers start at zero. Rank r
  // reduces chunk r: elements [r c, (r + 1) c) with c = ceil(n / ranks) (ZeRO's chunks when
  // n is a multiple of the ranks).
  OneBitAllReduce(Group g, int64_t n);

  // In place: x becomes the (compressed) sum over ranks of x + this rank's error, identical
  // on every rank.
  void sum(float* x);
  // ZeRO-1's halves. reduce_to_owner: out (chunk() elements) becomes the sum over ranks of
  // their compressed chunk rank() of x (with the worker error feedback). all_gather_add:
  // every rank adds every rank's compressed `delta` (its chunk, chunk() elements, with the
  // server error feedback) into y[0, n), so all copies of y change by the same bytes.
  void reduce_to_owner(const float* x, float* out);
  void all_gather_add(const float* delta, float* y);

  int64_t size() const { return n_; }
  int64_t chunk() const { return c_; }
  // Bytes this rank puts on the wire per sum() (its all-to-all and all-gather payloads sent
  // to other ranks; reduce_to_owner and all_gather_add send half each).
  int64_t wire_bytes() const;

  // The error-feedback state (checkpointed, so a resumed run continues exactly): worker:
  // ranks x chunk rows padded to 8; server: one such row.
  const Tensor& worker_error() const { return worker_error_; }
  // Seconds the last call spent in its collectives, and compressing and decoding.
  double last_comm_seconds() const { return comm_s_; }
  double last_compute_seconds() const { return compute_s_; }
  const Tensor& server_error() const { return server_error_; }
  // Tests: off drops what compression loses instead of carrying it into the next call, the
  // contrast that shows the feedback matters (onebit_adam_test.cpp).
  void set_error_feedback(bool on) { feedback_ = on; }

 private:
  int64_t valid(int q) const;  // elements of chunk q inside [0, n)
  void compress_and_exchange(const float* x);
  float* received_sum();  // after the all-to-all: our chunk summed over ranks (chunk_)
  void gather_and_decode(float* s, float* y, bool add);

  Group g_;
  int64_t n_, c_ = 1, cb_ = 8, msg_ = 0;
  Tensor worker_error_, server_error_;
  Tensor work_, send_, recv_, gathered_, chunk_;
  double comm_s_ = 0, compute_s_ = 0;
  bool feedback_ = true;
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

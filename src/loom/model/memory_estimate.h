// Closed-form byte counts for training one model on one rank: model states (fp32 weights,
// grads, two Adam moments) and the activation/workspace buffers the decoder keeps, derived
// from the config alone. Benchmarks and tests compare these with the allocator's figures.
#pragma once
#include <cstdint>

#include "loom/model/config.h"

namespace loom::model {

struct TrainingMemoryEstimate {
  int64_t params = 0, grads = 0, optimizer = 0;
  int64_t activations = 0;  // saved for backward (incl. residual stream and inputs)
  int64_t workspace = 0;    // backward scratch and the chunked-logits buffer
  int64_t total() const { return params + grads + optimizer + activations + workspace; }
};

// n_params: total parameter count; checkpoint_interval as in DecoderOptions.
TrainingMemoryEstimate estimate_training_memory(const ModelConfig& cfg, int64_t n_params,
                                                int64_t B, int64_t T, int checkpoint_interval,
                                                int64_t xent_chunk);

// The same estimate's total in double precision, for any micro-batch size B (a B*T that
// overflows int64 included): what a configuration would need before anything is allocated.
double estimate_training_bytes(const ModelConfig& cfg, int64_t n_params, double B, int64_t T,
                               int checkpoint_interval, int64_t xent_chunk);

// Model FLOPs of one training step on B*T tokens: 6 * (params that multiply) per token plus
// causal attention 6 * n_layer * T * d_model per token (forward 2x, backward 4x of the
// T/2-average score and value products). Recomputation is not counted (MFU convention).
double training_flops(const ModelConfig& cfg, int64_t n_params, int64_t B, int64_t T);

}  // namespace loom::model

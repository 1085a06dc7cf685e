// Closed-form byte counts for training one model on one rank: model states (fp32 weights,
// grads, two Adam moments) and the activation/workspace buffers the decoder keeps, derived
// from the config alone. Benchmarks and tests compare these with the allocator's figures.
#pragma once
#include <cstdint>

#include "loom/model/config.h"
#include "loom/model/param_layout.h"

namespace loom::model {

struct TrainingMemoryEstimate {
  int64_t params = 0, grads = 0, optimizer = 0;
  int64_t activations = 0;  // saved for backward (incl. residual stream and inputs)
  int64_t workspace = 0;    // backward scratch and the chunked-logits buffer
  int64_t total() const { return params + grads + optimizer + activations + workspace; }
};

// n_params: total parameter count; checkpoint_interval as in DecoderOptions.
TrainingMemoryEstimate estimate_training_memory(const ModelConfig& cfg, int64_t n_params, int64_t B, int64_t T,
                                                int checkpoint_interval, int64_t xent_chunk);

// The same estimate's total in double precision, for any micro-batch size B (a B*T that
// overflows int64 included): what a configuration would need before anything is allocated.
double estimate_training_bytes(const ModelConfig& cfg, int64_t n_params, double B, int64_t T, int checkpoint_interval,
                               int64_t xent_chunk);

// What one rank's decoder slice (a pipeline stage's blocks, a tensor-parallel share of heads
// and d_ff, embedding and head where the slice has them) allocates to train micro-batches of
// B x T tokens, mirroring Decoder::stage_begin / ensure_buffers and BlockActs/BlockScratch:
// each micro-batch in flight holds one slot; the rest is allocated once. fp32 activations.
struct SliceActivationBytes {
  int64_t per_slot = 0;            // activations: tokens, targets, residual stream, saved blocks, head
  int64_t per_slot_workspace = 0;  // the head's input gradient (last stage)
  int64_t shared = 0;              // activations: positions, checkpoint recomputation sets or the
                                   // 16-bit activations' working set
  int64_t workspace = 0;           // backward scratch, residual gradient, logits chunk
  int64_t activations(int64_t slots) const { return shared + slots * per_slot; }
  int64_t workspace_bytes(int64_t slots) const { return workspace + slots * per_slot_workspace; }
};
SliceActivationBytes estimate_slice_activations(const ModelConfig& cfg, const ModelSlice& slice, int64_t B, int64_t T,
                                                int checkpoint_interval, int64_t xent_chunk);

// Model FLOPs of one training step on B*T tokens: 6 * (params that multiply) per token plus
// causal attention 6 * n_layer * T * d_model per token (forward 2x, backward 4x of the
// T/2-average score and value products). Recomputation is not counted (MFU convention).
double training_flops(const ModelConfig& cfg, int64_t n_params, int64_t B, int64_t T);

}  // namespace loom::model

// One transformer block's forward and backward, side by side, over explicit buffers: the
// weights (views into the flat parameter buffer), the activations forward saves for
// backward, and backward's scratch. GPT-2: LN -> fused QKV -> attention -> proj -> +res ->
// LN -> fc -> GELU -> proj -> +res. LLaMA: RMSNorm, RoPE on q/k, GQA, SwiGLU, no biases.
#pragma once
#include "loom/core/tensor.h"
#include "loom/model/config.h"
#include "loom/model/param_layout.h"

namespace loom::model {

// Views of one block's parameters (or of their gradients) in a flat buffer. Biases and the
// LayerNorm shifts are undefined for LLaMA.
struct BlockWeights {
  Tensor ln1_w, ln1_b, qkv_w, qkv_b, proj_w, proj_b, ln2_w, ln2_b, fc_w, fc_b, out_w, out_b;
};
// `flat` holds the flat buffer's elements from index `base` on (0: the whole buffer; a unit's
// begin: a buffer holding just that unit, e.g. gathered weights or staged gradients).
BlockWeights block_weights(const ModelConfig& cfg, const ParamLayout& layout, const Tensor& flat,
                           int layer, int64_t base = 0);

// What forward keeps for backward, for N = B*T rows.
struct BlockActs {
  Tensor ln1, ln1_mean, ln1_rstd;  // normed input and its statistics (mean unused by RMSNorm)
  Tensor qkv;                      // [B, T, (H + 2 KVH) D], q/k after RoPE
  Tensor att, lse;                 // attention output [B, T, H D] and log-sum-exp [B, H, T]
  Tensor x_mid;                    // residual after attention
  Tensor ln2, ln2_mean, ln2_rstd;
  Tensor fc;                       // MLP pre-activation: [N, F] (GPT-2) or [N, 2F] gate|up
  Tensor act;                      // MLP activation [N, F]
  static BlockActs allocate(const ModelConfig& cfg, int64_t B, int64_t T, DType dt,
                            Allocator& alloc);
  int64_t bytes() const;
};

// Backward temporaries shared by all blocks.
struct BlockScratch {
  Tensor dln, dqkv, datt, dfc, dact;
  static BlockScratch allocate(const ModelConfig& cfg, int64_t B, int64_t T, DType dt,
                               Allocator& alloc);
};

// x_out = block(x_in). pos: i32[B*T] positions (RoPE).
void block_forward(const ModelConfig& cfg, const BlockWeights& w, const Tensor& x_in,
                   const Tensor& pos, BlockActs& a, const Tensor& x_out);

// On entry dres holds dLoss/d(x_out); on return dLoss/d(x_in). Parameter gradients
// accumulate into gw.
void block_backward(const ModelConfig& cfg, const BlockWeights& w, const BlockWeights& gw,
                    const Tensor& x_in, const Tensor& pos, BlockActs& a, BlockScratch& s,
                    const Tensor& dres);

}  // namespace loom::model

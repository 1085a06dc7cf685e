#include "loom/model/memory_estimate.h"

#include <algorithm>

#include "loom/model/block.h"

namespace loom::model {

namespace {
// Whether training stores block activations in 16 bits (Decoder::stores_16bit).
bool stored_16bit(const ModelConfig& cfg, int interval) { return interval <= 0 && cfg.activation_dtype != DType::f32; }
}  // namespace

TrainingMemoryEstimate estimate_training_memory(const ModelConfig& cfg, int64_t P, int64_t B, int64_t T, int interval,
                                                int64_t chunk) {
  const int64_t N = B * T, C = cfg.d_model, L = cfg.n_layer, H = cfg.n_head;
  const int64_t D = cfg.head_dim(), F = cfg.d_ff, W = (H + 2 * cfg.n_kv_head) * D;
  const FamilyTraits t = cfg.traits();
  const int64_t stats = t.norm_stats();  // mean+rstd or rstd per norm
  const int64_t G = t.mlp_fan_out();     // fc outputs per hidden unit (gate|up)
  // The dense MLP buffers serve dense blocks and shared experts (BlockActs::allocate).
  const int64_t mlp = (G + 1) * cfg.dense_mlp_width(F);  // fc (+gate) and activation
  // MoE buffers in every block's set: logits and scores, four per-choice index/weight arrays,
  // and per choice the expert's fc, activation and output rows.
  const int64_t E = cfg.moe.num_experts, k = cfg.moe.top_k, Fe = cfg.expert_d_ff();
  const int64_t moe = cfg.moe.enabled() ? 2 * E + 4 * k + k * ((G + 1) * Fe + C) : 0;
  const int64_t moe_scratch = cfg.moe.enabled() ? E + k * (2 * C + (G + 1) * Fe) : 0;
  // Per token: norm1 + stats, qkv, attention output + lse, x_mid, norm2 + stats, MLP.
  const int64_t per_block = C + stats + W + H * D + H + C + C + stats + mlp + moe;
  const int64_t sets = interval > 0 ? std::min<int64_t>(interval, L) : L;
  TrainingMemoryEstimate e;
  e.params = e.grads = 4 * P;
  e.optimizer = 8 * P;
  // 16-bit saved activations: ln1, qkv, att, ln2 and the MLP's in 16 bits per block, the rest in
  // f32, and one f32 working set the blocks run in.
  const int64_t big = C + W + H * D + C + mlp, small = per_block - big;
  const int64_t blocks =
      stored_16bit(cfg, interval) ? L * N * (2 * big + 4 * small) + 4 * N * per_block : 4 * N * sets * per_block;
  e.activations = blocks + 4 * N *
                               ((L + 1) * C                         // residual stream
                                + C + stats + 1                     // final norm and token losses
                                + 3);                               // tokens, targets, positions (i32)
  e.workspace = 4 * (std::min(chunk, N) * cfg.vocab_size            // logits chunk
                     + N * (2 * C                                   // dlnf, dres
                            + C + W + H * D + mlp + moe_scratch));  // block scratch
  return e;
}

double estimate_training_bytes(const ModelConfig& cfg, int64_t P, double B, int64_t T, int interval, int64_t chunk) {
  // Every term is linear in the tokens B*T except the logits chunk, min(chunk, B*T) rows.
  const TrainingMemoryEstimate one = estimate_training_memory(cfg, P, 1, T, interval, chunk);
  const double chunk_bytes = 4.0 * double(cfg.vocab_size);
  const double per_sequence = double(one.activations + one.workspace) - chunk_bytes * double(std::min(chunk, T));
  return double(one.params + one.grads + one.optimizer) + B * per_sequence +
         chunk_bytes * std::min(double(chunk), B * double(T));
}

SliceActivationBytes estimate_slice_activations(const ModelConfig& cfg, const ModelSlice& slice, int64_t B, int64_t T,
                                                int interval, int64_t chunk) {
  const int64_t N = B * T, C = cfg.d_model;
  // A slot holds one chunk's blocks (all of the slice's unless it is interleaved).
  const LayerRange first_chunk = slice.chunks(cfg.n_layer).front();
  const int64_t L = first_chunk.last - first_chunk.first;
  const BlockDims d = BlockDims::of(cfg, slice.tp, slice.tp_rank);
  const FamilyTraits t = cfg.traits();
  const int64_t stats = t.norm_stats(), G = t.mlp_fan_out();
  const int64_t mlp = cfg.dense_mlp_width(d.F);
  const int64_t E = cfg.moe.num_experts, k = cfg.moe.top_k, Fe = cfg.expert_d_ff();
  const bool moe = cfg.moe.enabled();
  // Per token of one block: BlockActs (ln1, qkv, compact qkv, attention out, lse, x_mid, ln2,
  // fc, act, MoE buffers) and BlockScratch (dln, dqkv, expanded dqkv, datt, dfc, dact, MoE).
  const int64_t block = C + stats + d.attn_width() + (d.kv_expand ? d.qkv_width() : 0) + d.H * d.D + d.H + C + C +
                        stats + (G + 1) * mlp + (moe ? 2 * E + 4 * k + k * ((G + 1) * Fe + C) : 0);
  const int64_t scratch = C + d.qkv_width() + (d.kv_expand ? d.attn_width() : 0) + d.H * d.D + (G + 1) * mlp +
                          (moe ? E + k * (2 * C + (G + 1) * Fe) : 0);
  const bool ckpt = interval > 0, stored16 = stored_16bit(cfg, interval);
  // 16-bit saved activations (BlockActs::allocate_stored): ln1, qkv, att, ln2 and the MLP's in
  // 16 bits, no compact q|k|v, the rest f32; the blocks run in one shared f32 working set.
  const int64_t big = C + d.attn_width() + d.H * d.D + C + (G + 1) * mlp;
  const int64_t small = block - big - (d.kv_expand ? d.qkv_width() : 0);
  const int64_t saved = ckpt ? 0 : stored16 ? L * N * (2 * big + 4 * small) : 4 * N * L * block;
  SliceActivationBytes b;
  b.per_slot = saved + 4 * N * (2 + (L + 1) * C + (slice.has_head ? C + stats + 1 : 0));
  b.per_slot_workspace = slice.has_head ? 4 * N * C : 0;
  const int64_t working = ckpt && L > 0 ? std::min<int64_t>(interval, L) : stored16 && L > 0 ? 1 : 0;
  b.shared = 4 * N * (1 + working * block);
  b.workspace = 4 * N * (C + scratch);
  if (slice.has_head) {
    const int64_t R = std::min(chunk, N);
    // One rank's logits chunk: the whole vocabulary, or under tp its rows and the vocab-parallel
    // loss's row maxima and sums.
    b.workspace += slice.tp == 1 ? 4 * R * cfg.vocab_size : 4 * R * (vocab_rows_per_rank(cfg, slice.tp) + 3);
  }
  return b;
}

double training_flops(const ModelConfig& cfg, int64_t P, int64_t B, int64_t T) {
  const double tokens = double(B * T);
  // Lookup tables do no multiplications: the position table, and the token table unless
  // it doubles as the (tied) head.
  double matmul_params = double(P);
  if (cfg.traits().position == PositionKind::learned) matmul_params -= double(cfg.n_ctx * cfg.d_model);
  if (!cfg.tied_embeddings) matmul_params -= double(cfg.vocab_size * cfg.d_model);
  // A MoE token multiplies by its top_k experts only (the router counts).
  if (cfg.moe.enabled()) {
    matmul_params -=
        double(cfg.num_moe_layers()) * double(cfg.moe.num_experts - cfg.moe.top_k) * double(cfg.expert_params());
  }
  return 6.0 * matmul_params * tokens + 6.0 * double(cfg.n_layer) * double(T) * double(cfg.d_model) * tokens;
}

}  // namespace loom::model

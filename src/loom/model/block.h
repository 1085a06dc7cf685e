// One transformer block's forward and backward, side by side, over explicit buffers: the
// weights (views into the flat parameter buffer), the activations forward saves for
// backward, and backward's scratch. GPT-2: LN -> fused QKV -> attention -> proj -> +res ->
// LN -> fc -> GELU -> proj -> +res. LLaMA: RMSNorm, RoPE on q/k, GQA, SwiGLU, no biases. In a
// Mixture-of-Experts block (ModelConfig::is_moe_layer) the MLP is the shared experts plus the
// routed ones (model/moe.h), whose exchange under expert parallelism goes through
// ExpertParallelOps.
// Under tensor parallelism the same code runs on a rank's slice (BlockDims: its heads and MLP
// columns) and calls TensorParallelOps at the two conjugate communication points.
#pragma once
#include <array>
#include <vector>

#include "loom/core/tensor.h"
#include "loom/model/config.h"
#include "loom/model/moe.h"
#include "loom/model/param_layout.h"

namespace loom::model {

// One routed expert's MLP (biases undefined for LLaMA).
struct ExpertWeights {
  Tensor fc_w, fc_b, out_w, out_b;
};

// A LoRA adapter's matrices (model.lora; ParamLayout's LoraSpec): A [rank, in], B [out, rank].
struct LoraWeights {
  Tensor a, b;
};

// Views of one block's parameters (or of their gradients) in a flat buffer. Biases and the
// LayerNorm shifts are undefined for LLaMA. A MoE block (ModelConfig::is_moe_layer) has a
// router and experts, and its fc_*/out_* are the shared experts (undefined without them).
struct BlockWeights {
  Tensor ln1_w, ln1_b, qkv_w, qkv_b, proj_w, proj_b, ln2_w, ln2_b, fc_w, fc_b, out_w, out_b;
  Tensor router_w;                     // [E, C]
  Tensor router_bias;                  // [E] selection bias (DeepSeek-V3); not a parameter
  std::vector<ExpertWeights> experts;  // the experts this rank holds, from expert0 on
  int64_t expert0 = 0;
  // LoRA training: the adapters, by LoraTarget (undefined where not adapted). Bound from an
  // adapter layout (ModelSlice::lora_adapters), which binds nothing else.
  std::array<LoraWeights, kLoraTargets> lora;
};
// `flat` holds the flat buffer's elements from index `base` on (0: the whole buffer; a unit's
// begin: a buffer holding just that unit, e.g. gathered weights or staged gradients). A MoE
// block's routed experts bind to `expert_flat` from `expert_base` on when it is given (their
// own unit's buffer), else to `flat`.
BlockWeights block_weights(const ModelConfig& cfg, const ParamLayout& layout, const Tensor& flat, int layer,
                           int64_t base = 0, const Tensor& expert_flat = {}, int64_t expert_base = 0);

// A rank's share of one block: its query heads, the kv heads in its fused projection and its
// MLP columns. One process: the whole block.
struct BlockDims {
  int64_t C = 0, H = 0, KVH = 0, D = 0, F = 0;
  int64_t q_head0 = 0;     // global index of the first local query head
  int64_t group = 1;       // global query heads per kv head
  bool kv_expand = false;  // all kv heads held (tp does not divide n_kv_head): attention runs
                           // on one copy of its kv head per local query head
  bool bias_owner = true;  // adds the row-parallel output biases (once across the tp group)
  // RoPE's inverse frequency per rotated pair (ModelConfig::rope_inv_freq), computed once here;
  // empty for families without RoPE.
  std::vector<double> rope_inv_freq;
  static BlockDims of(const ModelConfig& cfg, int64_t tp = 1, int64_t tp_rank = 0);
  int64_t qkv_width() const { return (H + 2 * KVH) * D; }                       // fused projection output
  int64_t attn_width() const { return (kv_expand ? 3 * H : H + 2 * KVH) * D; }  // attention input
};

// Tensor parallelism's hooks (Megatron-LM, Shoeybi et al. 2019), implemented over the tp group
// in parallel/tp_layers. The block calls the conjugate pair f/g; the decoder hands the
// vocabulary-parallel embedding and loss over entirely.
class TensorParallelOps {
 public:
  virtual ~TensorParallelOps() = default;
  // f, before a column-parallel linear: identity forward, all-reduce of the input gradient.
  virtual void column_parallel_input_grad(const Tensor& dx) = 0;
  // g, after a row-parallel linear: all-reduce of the partial outputs, identity backward.
  virtual void row_parallel_output(const Tensor& y) = 0;
  // out[N, C] = wte[tok] (+ wpe[pos]) with this rank's vocabulary rows of wte.
  virtual void embedding_forward(const Tensor& tok, const Tensor& pos, const Tensor& wte, const Tensor& wpe,
                                 const Tensor& out) = 0;
  virtual void embedding_backward(const Tensor& tok, const Tensor& pos, const Tensor& dout, const Tensor& dwte,
                                  const Tensor& dwpe) = 0;
  // ops::lm_head_xent's contract with w this rank's vocabulary rows of the head.
  virtual void head_xent(const Tensor& x, const Tensor& w, const Tensor& targets, const Tensor& loss, const Tensor& dx,
                         const Tensor& dw, double grad_scale, int64_t chunk) = 0;
};

// What forward keeps for backward, for N = B*T rows.
struct BlockActs {
  BlockDims dims;
  Tensor ln1, ln1_mean, ln1_rstd;  // normed input and its statistics (mean unused by RMSNorm)
  Tensor qkv;                      // [B, T, attn_width], q/k after RoPE
  Tensor qkv_compact;              // kv_expand only: the projection's output [B, T, qkv_width]
  Tensor att, lse;                 // attention output [B, T, H D] and log-sum-exp [B, H, T]
  Tensor x_mid;                    // residual after attention
  Tensor ln2, ln2_mean, ln2_rstd;
  Tensor fc;    // MLP pre-activation: [N, F] (GPT-2) or [N, 2F] gate|up
  Tensor act;   // MLP activation [N, F]
  MoeActs moe;  // MoE blocks' router and experts (MoE models only)
  // LoRA training: forward scratch the decoder shares between blocks (not owned by the set): an
  // adapter's x A^T [N, rank] and, with model.lora.dropout, its dropped-out input
  // [N * lora_widest_input].
  Tensor lora_u, lora_x;
  // Set by the decoder before each training forward, recomputation and backward of the block:
  // whether the adapters' dropout applies and the key its masks derive from.
  bool lora_dropout = false;
  uint64_t lora_key = 0;
  // Set by the decoder with each micro-batch: rows that pack several documents give their
  // positions (i32[B*T], restarting at 0 where each document starts), and attention keeps
  // inside each document. Undefined: every row is one document.
  Tensor attention_pos;
  static BlockActs allocate(const ModelConfig& cfg, int64_t B, int64_t T, DType dt, Allocator& alloc,
                            const BlockDims& dims);
  static BlockActs allocate(const ModelConfig& cfg, int64_t B, int64_t T, DType dt, Allocator& alloc) {
    return allocate(cfg, B, T, dt, alloc, BlockDims::of(cfg));
  }
  // The stored form of a block's activations under model.activation_dtype = `dt16` (bf16 or
  // f16): ln1, qkv, att, ln2, fc and act in dt16, no qkv_compact (backward reads qkv only), the
  // rest f32. Filled by stash_activations from a working set allocate() made.
  static BlockActs allocate_stored(const ModelConfig& cfg, int64_t B, int64_t T, DType dt16, Allocator& alloc,
                                   const BlockDims& dims);
  int64_t bytes() const;
};

// After block_forward into `work`: its 16-bit fields are narrowed into `stored`, and its f32
// ones (statistics, lse, x_mid, the MoE buffers) trade places with stored's, so nothing large
// is copied. unstash_activations is the way back, before block_backward from `work`.
void stash_activations(BlockActs& work, BlockActs& stored);
void unstash_activations(BlockActs& stored, BlockActs& work);

// The widest input of an adapted projection (cfg.lora) of a rank's share d: d_model (q, k, v,
// gate, up), the attention width (o) or the MLP width (down).
int64_t lora_widest_input(const ModelConfig& cfg, const BlockDims& d);

// Backward temporaries shared by all blocks.
struct BlockScratch {
  Tensor dln, dqkv, datt, dfc, dact;
  Tensor dqkv_expanded;    // kv_expand only
  MoeScratch moe;          // MoE models only
  Tensor lora_u, lora_du;  // LoRA training: [N, rank]
  Tensor lora_x, lora_dx;  // with model.lora.dropout: [N, widest adapted input]
  static BlockScratch allocate(const ModelConfig& cfg, int64_t B, int64_t T, DType dt, Allocator& alloc,
                               const BlockDims& dims);
  static BlockScratch allocate(const ModelConfig& cfg, int64_t B, int64_t T, DType dt, Allocator& alloc) {
    return allocate(cfg, B, T, dt, alloc, BlockDims::of(cfg));
  }
};

// The family's pieces (FamilyTraits), shared by the training block, the decoder's final norm and
// the inference runner so that each is written once. norm: LayerNorm (b and mean used) or RMSNorm;
// the backward writes or accumulates into dx. activation: GELU of fc, or SwiGLU of fc = gate|up.
void norm_forward(const FamilyTraits& t, const Tensor& x, const Tensor& g, const Tensor& b, const Tensor& out,
                  const Tensor& mean, const Tensor& rstd, double eps);
void norm_backward(const FamilyTraits& t, const Tensor& dy, const Tensor& x, const Tensor& g, const Tensor& mean,
                   const Tensor& rstd, const Tensor& dx, const Tensor& dg, const Tensor& db, bool accumulate_dx);
void activation_forward(const FamilyTraits& t, const Tensor& fc, const Tensor& act);
void activation_backward(const FamilyTraits& t, const Tensor& fc, const Tensor& dact, const Tensor& dfc);
// RoPE on the q and k heads of qkv rows ([N, (H + 2 KVH) D]) with the given inverse frequencies
// (BlockDims::rope_inv_freq); inverse: the backward. Nothing when inv_freq is empty (no RoPE).
void rope_qk(const std::vector<double>& inv_freq, const Tensor& qkv, int64_t H, int64_t KVH, int64_t D,
             const Tensor& pos, bool inverse);

// The parts of a block's forward that training and inference do differently; the sequence of
// steps around them (block_forward below) is written once. Training: linears in the model's
// product precision, dense causal attention over the batch (saving what backward needs), the
// tp group's all-reduce and expert-parallel exchanges. Inference (infer/model_runner): f32 or
// quantized linears, paged attention over the KV cache, the serving tp group's all-reduce.
class BlockForwardOps {
 public:
  enum class Linear { qkv, proj, fc, out };
  virtual ~BlockForwardOps() = default;
  // y = x w^T + b (b may be undefined) for the block's matrix `which`.
  virtual void linear(Linear which, const Tensor& x, const Tensor& w, const Tensor& b, const Tensor& y) = 0;
  // att = attention of the q rows of qkv (RoPE applied) over the keys and values in it.
  virtual void attention(int layer, const Tensor& qkv, const Tensor& att) = 0;
  // After a row-parallel linear of a tensor-parallel slice: the sum of the ranks' partial y.
  virtual void row_parallel_output(const Tensor& y) = 0;
  // A MoE block's routed experts: begun once ln2 is known (before the shared experts, so that
  // expert-parallel exchanges overlap them) and ended into x_out, adding to it when the shared
  // experts wrote it (accumulate).
  virtual void moe_begin(int layer, const BlockWeights& w, const Tensor& ln2) = 0;
  virtual void moe_end(int layer, const BlockWeights& w, const Tensor& x_out, bool accumulate) = 0;
};

// The tensors one block's forward writes, N rows each. ln1 and ln2 (and their statistics) may
// be the same tensors: the first norm's output is consumed before the second runs. qkv is the
// fused projection's output ([N, (H + 2 KVH) D]); fc and act are at least as wide as the dense
// MLP or the shared experts ([N, G F], [N, F]) and are sliced to it.
struct BlockForwardBuffers {
  Tensor ln1, ln1_mean, ln1_rstd, qkv, att, x_mid, ln2, ln2_mean, ln2_rstd, fc, act;
};

// x_out = block(x_in) for block `layer` (x_out may be x_in): norm, fused q|k|v, RoPE, attention,
// projection (+ bias on the bias owner), residual; norm, MLP (dense, or shared experts plus
// routed ones), residual. d: this rank's heads, MLP width, bias ownership and RoPE frequencies.
void block_forward(const ModelConfig& cfg, int layer, const BlockWeights& w, const BlockDims& d, const Tensor& x_in,
                   const Tensor& pos, const BlockForwardBuffers& b, BlockForwardOps& parts, const Tensor& x_out);

// Training's forward: x_out = block(x_in) for block `layer`, saving into `a` what
// block_backward needs. pos: i32[B*T] positions (RoPE). The shares come from a.dims; tp is
// needed when they are a tensor-parallel slice.
void block_forward(const ModelConfig& cfg, int layer, const BlockWeights& w, const Tensor& x_in, const Tensor& pos,
                   BlockActs& a, const Tensor& x_out, TensorParallelOps* tp = nullptr, ExpertParallelOps* ep = nullptr);

// A zero-bubble pipeline's deferred part of a block's backward (Qi et al. 2023, "Zero Bubble
// Pipeline Parallelism"): the output gradients of the attention's linear layers and of a dense
// MLP's, kept by the input-gradient pass for block_weight_backward (in buffers of their own, or
// in activation buffers the input pass is done with). A MoE block's MLP is not deferred (d_out
// and d_fc unused).
struct BlockDeferredGrads {
  Tensor d_out, d_fc, d_proj, d_qkv;
  int64_t bytes() const;
  static BlockDeferredGrads allocate(const ModelConfig& cfg, int64_t B, int64_t T, DType dt, Allocator& alloc,
                                     const BlockDims& dims);
};

// On entry dres holds dLoss/d(x_out); on return dLoss/d(x_in). Parameter gradients
// accumulate into gw; with `deferred`, all but those of the layers it keeps, whose output
// gradients it receives instead.
void block_backward(const ModelConfig& cfg, int layer, const BlockWeights& w, const BlockWeights& gw,
                    const Tensor& x_in, const Tensor& pos, BlockActs& a, BlockScratch& s, const Tensor& dres,
                    TensorParallelOps* tp = nullptr, ExpertParallelOps* ep = nullptr,
                    BlockDeferredGrads* deferred = nullptr);
// The weight and bias gradients block_backward deferred, from g and the activations saved in a;
// the same values block_backward would have accumulated into gw.
void block_weight_backward(const ModelConfig& cfg, int layer, const BlockWeights& gw, const BlockActs& a,
                           const BlockDeferredGrads& g);

}  // namespace loom::model

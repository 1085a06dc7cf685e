// Model hyper-parameters for the one decoder loom trains and serves, configurable as GPT-2
// (learned positions, LayerNorm, GELU, biases, tied embeddings) or LLaMA (RoPE, RMSNorm,
// SwiGLU, grouped-query attention, no biases, untied head), either with sparse
// Mixture-of-Experts MLPs (model.moe); presets by name.
#pragma once
#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "loom/core/dtype.h"
#include "loom/kernels/cpu/rounded_operands.h"

namespace loom::model {

enum class Family { gpt2, llama };
const char* family_name(Family f);
Family family_from_name(const std::string& s);  // throws "[config] model.family: ..."

// What a family computes, as data: the block, the decoder, the inference runner and the memory
// estimates read these, never the family's name, which only chooses parameter names and file
// formats (hf_weights, gguf_model, param_layout's names).
enum class NormKind { layer_norm, rms_norm };  // LayerNorm (gain and shift) or RMSNorm (gain)
enum class MlpKind { gelu, swiglu };           // GELU (tanh) of one projection, or SiLU(gate) * up
enum class PositionKind { learned, rope };     // a position table added to the embeddings, or RoPE
struct FamilyTraits {
  NormKind norm = NormKind::rms_norm;
  MlpKind mlp = MlpKind::swiglu;
  PositionKind position = PositionKind::rope;
  bool linear_biases = false;  // every linear and norm has a bias (GPT-2); Qwen2's q/k/v biases
                               // are ModelConfig::qkv_bias
  // fc outputs per hidden unit: 2 for SwiGLU's gate|up.
  int64_t mlp_fan_out() const { return mlp == MlpKind::swiglu ? 2 : 1; }
  // Per-row statistics a norm keeps for backward: LayerNorm's mean and rstd, RMSNorm's rstd.
  int64_t norm_stats() const { return norm == NormKind::layer_norm ? 2 : 1; }
};

// Training's compute precision (model.precision). bf16: the matrix products of every linear layer
// and of the LM head round their operands (weights, activations, output gradients) to bf16 and
// accumulate in f32; master weights, gradients, optimizer state, norms, softmax, attention and
// the loss stay f32. fp16 rounds the same operands to fp16, whose range ends at 65504 and whose
// small gradients underflow: it trains only with dynamic loss scaling (optim.loss_scale).
enum class Precision { fp32, bf16, fp16 };
const char* precision_name(Precision p);
Precision precision_from_name(const std::string& s);  // throws "[config] model.precision: ..."

// Router scores of a Mixture-of-Experts layer: softmax over the experts (Switch, Mixtral) or an
// independent sigmoid per expert (DeepSeek-V3).
enum class RouterScore { softmax, sigmoid };
const char* router_score_name(RouterScore s);
RouterScore router_score_from_name(const std::string& s);  // throws "[config] model.moe.score: ..."

// Sparse Mixture-of-Experts MLPs (Shazeer et al. 2017; GShard; Switch; Mixtral; DeepSeek-MoE).
// A MoE block replaces the dense MLP by a router and num_experts expert MLPs of width
// expert_d_ff (the family's MLP: GELU for GPT-2, SwiGLU for LLaMA); each token runs top_k of
// them, weighted by its normalised router scores, plus the num_shared_experts that every token
// runs (DeepSeek-MoE). The first first_dense blocks stay dense (DeepSeek-MoE/V3's
// first_k_dense_replace: the first block's routing balances slowest); after them moe_every = N
// makes every N-th block MoE, blocks first_dense + N-1, first_dense + 2N-1, ..., and leaves the
// others dense (Qwen2-MoE's decoder_sparse_step); 1: every block.
struct MoeConfig {
  int64_t num_experts = 0;  // 0: a dense model
  int64_t top_k = 2;
  int64_t num_shared_experts = 0;
  int64_t expert_d_ff = 0;  // 0: model.d_ff
  int64_t moe_every = 1;
  int64_t first_dense = 0;
  // Per expert and micro-batch, at most ceil(capacity_factor * tokens * top_k / num_experts)
  // tokens; later ones are dropped (their expert output is zero, the residual passes). 0: none
  // dropped (dropless).
  double capacity_factor = 0;
  double router_aux_loss_coef = 0.01;  // Switch/GShard balance loss E * sum_i f_i P_i
  double router_z_loss_coef = 0;       // ST-MoE: mean over tokens of logsumexp(logits)^2
  RouterScore score = RouterScore::softmax;
  // DeepSeek-V3's auxiliary-loss-free balancing: a per-expert bias added to the scores for
  // choosing experts only, moved by this rate against each expert's load after every step.
  // 0: off.
  double bias_update_rate = 0;
  bool enabled() const { return num_experts > 0; }
};

// LoRA (Hu et al. 2021; model.lora): low-rank adapters beside a block's linear layers, trained
// while the model's own weights stay frozen. Adapter t of a linear y = x W^T adds
// (alpha / rank) * (x A_t^T) B_t^T, A_t [rank, in] and B_t [out, rank], B starting at zero so
// that training starts from the model itself. Targets name the projections as Hugging Face's
// LLaMA does (q_proj ... down_proj); rank 0: off.
enum class LoraTarget : uint8_t { q, k, v, o, gate, up, down };
constexpr int kLoraTargets = 7;
const char* lora_target_name(LoraTarget t);  // "q" ... "down"
// Hugging Face's (and PEFT's target_modules') name of the projection: "q_proj" ... "down_proj".
std::string lora_module_name(LoraTarget t);
struct LoraConfig {
  int64_t rank = 0;
  double alpha = 16;
  double dropout = 0;
  std::vector<LoraTarget> targets = {LoraTarget::q, LoraTarget::v};
  // How the frozen model is held: f32, or bf16 for its blocks (half their memory; each block is
  // widened to f32 just before use, and the embeddings, final norm and head stay f32).
  DType base_dtype = DType::f32;
  bool enabled() const { return rank > 0; }
  bool adapts(LoraTarget t) const;
  double scale() const { return alpha / double(rank); }
  std::string describe() const;  // "rank 8, alpha 16 on q, v" (", dropout 0.1", ", bf16 base" when so)
};

// How RoPE's frequencies are stretched for contexts past the training length. none: plain RoPE
// (inverse frequency theta^(-2i/D)); linear: every frequency divided by `factor` (positions
// interpolated, Chen et al. 2023); llama3: Meta's Llama 3.1 rule, low frequencies divided by
// `factor`, high ones kept, a smooth blend between (wavelengths measured against
// original_max_position / low_freq_factor and / high_freq_factor); factors: each frequency
// divided by its own factor (a GGUF's rope_freqs tensor, which llama.cpp's converter computes
// from the llama3 rule).
struct RopeScaling {
  enum class Type { none, linear, llama3, factors };
  Type type = Type::none;
  double factor = 1.0;
  double low_freq_factor = 1.0, high_freq_factor = 4.0;
  int64_t original_max_position = 8192;
  std::vector<double> freq_factors;  // Type::factors: D/2 divisors
  bool enabled() const { return type != Type::none; }
  std::string describe() const;  // "llama3 (factor 32, low 1, high 4, original 8192)"
};

struct ModelConfig {
  std::string name = "custom";
  Family family = Family::gpt2;
  int64_t vocab_size = 50257;
  int64_t n_ctx = 1024;  // maximum sequence length
  int64_t n_layer = 12;
  int64_t n_head = 12;
  int64_t n_kv_head = 12;  // < n_head: grouped-query attention
  int64_t d_model = 768;
  int64_t d_ff = 3072;  // MLP hidden size
  double norm_eps = 1e-5;
  double rope_theta = 10000.0;
  RopeScaling rope_scaling;
  // Biases on the q, k and v projections of a LLaMA-family block (Qwen2); GPT-2 has biases on
  // every linear anyway.
  bool qkv_bias = false;
  bool tied_embeddings = true;
  Precision precision = Precision::fp32;  // a compute policy: not part of config.json
  // What training keeps for backward between a block's forward and its backward
  // (model.activation_dtype; a compute policy too): f32, or bf16/f16, which stores the normed
  // inputs, q|k|v, the attention output and the MLP's pre-activation and activation in 16 bits
  // (the statistics, the log-sum-exp, the residual stream and MoE buffers stay f32). Blocks run
  // in an f32 working set and backward reads the stored values widened. Not with activation
  // checkpointing, whose saved block inputs are the residual stream.
  DType activation_dtype = DType::f32;
  MoeConfig moe;
  LoraConfig lora;  // a training policy beside the architecture: not part of config.json

  // Whether block `layer` is a Mixture-of-Experts block.
  bool is_moe_layer(int64_t layer) const {
    return moe.enabled() && layer >= moe.first_dense && (layer - moe.first_dense + 1) % moe.moe_every == 0;
  }
  int64_t expert_d_ff() const { return moe.expert_d_ff > 0 ? moe.expert_d_ff : d_ff; }
  int64_t shared_d_ff() const { return moe.num_shared_experts * expert_d_ff(); }
  int64_t num_moe_layers() const { return moe.enabled() ? (n_layer - moe.first_dense) / moe.moe_every : 0; }
  // A MoE block's index among the MoE blocks, and back.
  int64_t moe_index(int64_t layer) const { return (layer - moe.first_dense + 1) / moe.moe_every - 1; }
  int moe_layer(int64_t index) const { return int(moe.first_dense + (index + 1) * moe.moe_every - 1); }
  // Parameters of one routed expert's MLP (GPT-2's with its biases).
  int64_t expert_params() const {
    const int64_t C = d_model, F = expert_d_ff();
    return family == Family::gpt2 ? 2 * C * F + F + C : 3 * C * F;
  }
  // Width of the buffers the dense MLP path needs: the dense blocks' (dense_f, a tp share of
  // d_ff) and the MoE blocks' shared experts'; 0 when neither exists.
  int64_t dense_mlp_width(int64_t dense_f) const {
    const bool dense_blocks = !moe.enabled() || moe.moe_every > 1 || moe.first_dense > 0;
    return std::max(dense_blocks ? dense_f : 0, moe.enabled() ? shared_d_ff() : 0);
  }

  int64_t head_dim() const { return d_model / n_head; }
  FamilyTraits traits() const;
  // RoPE's inverse frequency of each of the head_dim/2 rotated pairs, rope_scaling applied.
  std::vector<double> rope_inv_freq() const;
  bool has_bias() const { return traits().linear_biases; }
  cpu::ProductPrecision products() const {
    return precision == Precision::bf16   ? cpu::ProductPrecision::bf16
           : precision == Precision::fp16 ? cpu::ProductPrecision::f16
                                          : cpu::ProductPrecision::f32;
  }
  // Throws "[config] model.<field>: ..." naming the field and the fix.
  void validate() const;
  std::string summary() const;  // one line for logs

 private:
  void validate_lora() const;
};

// Known presets: gpt2-124m, gpt2-350m, gpt2-tiny, gpt2-shakespeare, llama-tiny, llama-60m,
// llama-moe-tiny, llama-moe-60m.
ModelConfig preset(const std::string& name);
std::vector<std::string> preset_names();

}  // namespace loom::model

// Model hyper-parameters for the one decoder loom trains and serves, configurable as GPT-2
// (learned positions, LayerNorm, GELU, biases, tied embeddings) or LLaMA (RoPE, RMSNorm,
// SwiGLU, grouped-query attention, no biases, untied head); presets by name.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "loom/kernels/cpu/rounded_operands.h"

namespace loom::model {

enum class Family { gpt2, llama };
const char* family_name(Family f);
Family family_from_name(const std::string& s);  // throws "[config] model.family: ..."

// Training's compute precision (model.precision). bf16: the matrix products of every linear layer
// and of the LM head round their operands (weights, activations, output gradients) to bf16 and
// accumulate in f32; master weights, gradients, optimizer state, norms, softmax, attention and
// the loss stay f32. fp16 rounds the same operands to fp16, whose range ends at 65504 and whose
// small gradients underflow: it trains only with dynamic loss scaling (optim.loss_scale).
enum class Precision { fp32, bf16, fp16 };
const char* precision_name(Precision p);
Precision precision_from_name(const std::string& s);  // throws "[config] model.precision: ..."

struct ModelConfig {
  std::string name = "custom";
  Family family = Family::gpt2;
  int64_t vocab_size = 50257;
  int64_t n_ctx = 1024;     // maximum sequence length
  int64_t n_layer = 12;
  int64_t n_head = 12;
  int64_t n_kv_head = 12;   // < n_head: grouped-query attention
  int64_t d_model = 768;
  int64_t d_ff = 3072;      // MLP hidden size
  double norm_eps = 1e-5;
  double rope_theta = 10000.0;
  bool tied_embeddings = true;
  Precision precision = Precision::fp32;  // a compute policy: not part of config.json

  int64_t head_dim() const { return d_model / n_head; }
  bool has_bias() const { return family == Family::gpt2; }
  cpu::ProductPrecision products() const {
    return precision == Precision::bf16   ? cpu::ProductPrecision::bf16
           : precision == Precision::fp16 ? cpu::ProductPrecision::f16
                                          : cpu::ProductPrecision::f32;
  }
  // Throws "[config] model.<field>: ..." naming the field and the fix.
  void validate() const;
  std::string summary() const;  // one line for logs
};

// Known presets: gpt2-124m, gpt2-350m, gpt2-tiny, gpt2-shakespeare, llama-tiny, llama-60m.
ModelConfig preset(const std::string& name);
std::vector<std::string> preset_names();

}  // namespace loom::model

// Model hyper-parameters for the one decoder loom trains and serves, configurable as GPT-2
// (learned positions, LayerNorm, GELU, biases, tied embeddings) or LLaMA (RoPE, RMSNorm,
// SwiGLU, grouped-query attention, no biases, untied head); presets by name.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace loom::model {

enum class Family { gpt2, llama };
const char* family_name(Family f);
Family family_from_name(const std::string& s);  // throws "[config] model.family: ..."

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

  int64_t head_dim() const { return d_model / n_head; }
  bool has_bias() const { return family == Family::gpt2; }
  // Throws "[config] model.<field>: ..." naming the field and the fix.
  void validate() const;
  std::string summary() const;  // one line for logs
};

// Known presets: gpt2-124m, gpt2-350m, gpt2-tiny, gpt2-shakespeare, llama-tiny, llama-60m.
ModelConfig preset(const std::string& name);
std::vector<std::string> preset_names();

}  // namespace loom::model

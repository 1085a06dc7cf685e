// A model written as a Hugging Face directory's model files: config.json as transformers reads it
// for the family (GPT2LMHeadModel, LlamaForCausalLM, Qwen2ForCausalLM, MixtralForCausalLM), with
// the dtype and special token ids, and model.safetensors under Hugging Face's names in that
// dtype (hf_weights.h's mapping, whose reader loads it back bit for bit at f32). The tokenizer
// files are data/'s (tokenizer_export.h).
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "loom/core/dtype.h"
#include "loom/model/decoder.h"

namespace loom::model {

struct HfExportOptions {
  DType dtype = DType::f32;  // f32, bf16 or f16
  std::optional<int32_t> bos_id, eos_id;
};

// config.json's text for `cfg` stored as `o.dtype`, naming the special token ids.
std::string hf_export_config_json(const ModelConfig& cfg, const HfExportOptions& o);

// Writes dir/config.json and dir/model.safetensors (dir must exist); returns what transformers
// will not read as loom does (a MoE layout Mixtral's config cannot say), for the caller to report.
std::vector<std::string> write_hf_model(const Decoder& m, const std::string& dir, const HfExportOptions& o);

}  // namespace loom::model

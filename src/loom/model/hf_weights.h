// Hugging Face interchange for the decoder: parameters to/from model.safetensors under HF's
// names and layouts (GPT2LMHeadModel, LlamaForCausalLM), and ModelConfig to/from config.json
// (GPT2Config, LlamaConfig). The safetensors format itself lives in io/; this file only maps.
#pragma once
#include <string>
#include <vector>

#include "loom/core/dtype.h"
#include "loom/model/config.h"
#include "loom/model/decoder.h"

namespace loom::model {

// The text of config.json for cfg (model_type "gpt2" or "llama").
std::string hf_config_json(const ModelConfig& cfg);
// Parses config.json text; `source` names it in errors ("[hf] <source>: missing key 'n_embd'").
// Settings loom cannot reproduce (another activation, rope_scaling, biases on LLaMA, ...) are
// errors rather than silently different models.
ModelConfig parse_hf_config(const std::string& json_text, const std::string& source);
void write_hf_config(const ModelConfig& cfg, const std::string& path);
ModelConfig read_hf_config(const std::string& path);

// Writes every parameter under its HF name in HF's layout (GPT-2's Conv1D weights transposed
// back to [in, out]); a tied head is not written, as save_pretrained does. dtype: f32, f64,
// bf16 or f16.
void save_hf_safetensors(const Decoder& m, const std::string& path, DType dtype = DType::f32);
// The inverse, converting from any float dtype in the file. Accepts GPT-2 files written from
// GPT2Model (names without "transformer.") and skips HF's non-parameter buffers (attn.bias,
// attn.masked_bias, rotary_emb.inv_freq) and a tied lm_head.weight. Missing or unexpected
// tensors and shape mismatches are errors naming the tensor and both shapes.
void load_hf_safetensors(Decoder& m, const std::string& path);
// The same over a flat buffer laid out by `layout` (e.g. weights gathered from ZeRO-3 shards).
void save_hf_safetensors(const ParamLayout& layout, const Tensor& flat, const std::string& path,
                         DType dtype = DType::f32);
void load_hf_safetensors(const ModelConfig& cfg, const ParamLayout& layout, const Tensor& flat,
                         const std::string& path);
// The same over the shards of one checkpoint (model-00001-of-00002.safetensors, ...): every
// parameter in exactly one of them.
void load_hf_safetensors(const ModelConfig& cfg, const ParamLayout& layout, const Tensor& flat,
                         const std::vector<std::string>& files);

// dir/config.json + dir/model.safetensors, what from_pretrained(dir) reads.
void save_hf_pretrained(const Decoder& m, const std::string& dir, DType dtype = DType::f32);

}  // namespace loom::model

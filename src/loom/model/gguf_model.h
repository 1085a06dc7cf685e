// A model from a GGUF file (llama.cpp's format): its architecture keys mapped onto ModelConfig,
// and its tensors, dequantized to f32 where they are quantized, copied into a Decoder under
// Hugging Face's names. The container is io/gguf.h and the block formats io/gguf_quants.h;
// this file knows the architectures (llama, qwen2, gpt2) and llama.cpp's tensor names and layouts.
// The tokenizer the file embeds is data/gguf_tokenizer.h's.
#pragma once
#include <cstdint>
#include <map>
#include <string>

#include "loom/io/gguf.h"
#include "loom/model/config.h"
#include "loom/model/decoder.h"

namespace loom::model {

// Whether `path` is a regular file that starts with the GGUF magic.
bool is_gguf_file(const std::string& path);

// The model config the file's metadata describes. Architectures: "llama" (LLaMA, Mistral-style,
// SmolLM, Llama 3.x with its rope_freqs), "qwen2" (q/k/v biases) and "gpt2". Anything loom would
// compute differently (yarn scaling, partial rotary dimensions, experts, an unknown
// architecture) is refused naming the key.
ModelConfig gguf_model_config(const io::GgufFile& g);

// What load_gguf_weights read: tensors per ggml type, for the start-up line.
struct GgufLoadReport {
  std::map<std::string, int64_t> tensors_by_type;  // "Q4_1" -> 210
  int64_t quantized_elements = 0, elements = 0;
  double seconds = 0;
  // "Q4_1 x210, Q8_0 x1, F32 x61 dequantized to f32"
  std::string describe() const;
};

// Where a parameter of the model comes from in the file: its GGUF tensor, and for the q and k
// projections of the 'llama' architecture the head layout whose rows llama.cpp permuted for
// its interleaved-pair RoPE (row r of the parameter is row source_row(r) of the tensor).
struct GgufSource {
  const io::GgufTensor* tensor = nullptr;
  int64_t rope_heads = 0;  // > 0: rows permuted per head of head_dim rows
  int64_t head_dim = 0;
  int64_t source_row(int64_t r) const;
};

// The row order llama.cpp gives parameter `hf_name` in architecture `arch` (no tensor): the
// head layout of the q and k projections in 'llama' files, plain rows for everything else.
// Reading un-permutes with it (load_gguf_weights); writing permutes with it (export_gguf.h).
GgufSource gguf_row_order(const ModelConfig& cfg, const std::string& arch, const std::string& hf_name);

// llama.cpp's name of a parameter of `cfg` ("blk.3.attn_q.weight" for
// "model.layers.3.self_attn.q_proj.weight"), the inverse of what gguf_sources reads; "" for none.
std::string gguf_tensor_name(const ModelConfig& cfg, const std::string& hf_name);

// The source of every parameter of `cfg` (the whole model) by its Hugging Face name, checked:
// a tensor with no place in the model, a missing one, a shape that differs or a type loom
// cannot dequantize is an error naming it.
std::map<std::string, GgufSource> gguf_sources(const io::GgufFile& g, const ModelConfig& cfg);

// Copies every tensor of `g` into `m` (the whole model, f32 parameters): quantized tensors
// dequantized exactly as llama.cpp's reference does, the q and k projections of llama
// permuted back from llama.cpp's interleaved-pair RoPE order to the rotate-half order loom (and
// Hugging Face) use. A missing, unexpected or misshapen tensor is an error naming it.
GgufLoadReport load_gguf_weights(const io::GgufFile& g, Decoder& m);

// The model's name for logs and the API: general.name, else the file's stem.
std::string gguf_model_name(const io::GgufFile& g);

}  // namespace loom::model

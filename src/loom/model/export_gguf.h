// A model written as a GGUF file that llama.cpp loads (and loom reads back with gguf_model.h):
// the llama.*, qwen2.* or gpt2.* keys llama.cpp's loader needs, its tensor names and ggml
// dims, llama's q and k rows permuted for its adjacent-pair RoPE (gguf_row_order, the order
// the reader undoes), RoPE scaling as keys or a rope_freqs tensor, and each matrix in the type
// asked for through io/gguf_quants.h's quantizers. The tokenizer keys are data/'s
// (tokenizer_export.h); the container is io/gguf.h. Dense models only.
#pragma once
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "loom/io/gguf.h"
#include "loom/model/decoder.h"

namespace loom::model {

// The tensor types `loom export --type` offers. 1-D tensors (norms, biases) and GPT-2's position
// table stay F32 in all of them; the quantized ones keep the head (output.weight, or the tied
// token table) in Q8_0, as llama.cpp keeps its head finer than the blocks.
enum class GgufExportType { f32, f16, bf16, q8_0, q5_1, q5_0, q4_1, q4_0 };
std::optional<GgufExportType> gguf_export_type(const std::string& name);  // "q8_0" -> q8_0
const char* gguf_export_type_name(GgufExportType t);
const char* gguf_export_type_names();  // "f32, f16, bf16, q8_0, q5_1, q5_0, q4_1 or q4_0", for errors

struct GgufExportReport {
  std::string arch;                                // "llama", "qwen2" or "gpt2"
  std::map<std::string, int64_t> tensors_by_type;  // "Q8_0" -> 211
  std::vector<std::string> notes;                  // tensors kept in another type, and why
  std::string describe() const;                    // "F32 x61, Q8_0 x211"
};

// Sets general.architecture, general.name (`name`), general.file_type and the architecture's
// keys on `w`, and adds every parameter of `m` (the whole model, f32) as a tensor of `type`. A
// Mixture-of-Experts model is refused naming --format hf.
GgufExportReport add_gguf_model(const Decoder& m, const std::string& name, GgufExportType type, io::GgufWriter& w);

}  // namespace loom::model

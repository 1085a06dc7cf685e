// The files that carry a GGUF file's or a Hugging Face directory's card into a loom checkpoint:
// config.json, the model's tokenizer (a GGUF's vocabulary as tokenizer.gguf), its chat template
// and end tokens, and trainer_state.json naming the tokenizer. `loom convert` writes them beside
// f32 weights, `loom quantize` beside quantized ones. The weights are not written here.
#pragma once
#include <filesystem>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "loom/model/model_source.h"

namespace loom::cli {

struct CardFiles {
  std::vector<std::string> files;  // the names written, for the directory's manifest
  std::string tokenizer;           // what trainer_state.json records (relative to the directory)
  nlohmann::json converted_from;   // {"path": the source, absolute; "format": model_format_name}
};

// Writes the card files of `source` (whose card is `card`) into `dir`, which must exist. Throws
// "[convert] ..." when the config has no config.json form (a GGUF's per-frequency RoPE factors).
CardFiles write_card_files(const std::string& source, const model::ModelCard& card, const std::filesystem::path& dir);

}  // namespace loom::cli

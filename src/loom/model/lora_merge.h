// LoRA checkpoints read back: what a checkpoint of a model.lora run records (its adapters, their
// configuration and the frozen model they belong to) and the merge that folds the adapters into
// that model's weights, W += (alpha / rank) B A, for inference and export.
#pragma once
#include <string>

#include "loom/model/config.h"
#include "loom/model/decoder.h"

namespace loom::model {

// The identity of a model's weights: the SHA-256 of a GGUF file or of a loom checkpoint's
// weights file, or over a Hugging Face directory's safetensors files (each file's digest, in name
// order). `path` names the file or the checkpoint itself (not a run directory).
std::string weights_sha256(const std::string& path);

struct LoraCheckpoint {
  std::string dir;
  LoraConfig lora;
  std::string base;         // the frozen model as the run named it: a path, or "random weights of ..."
  std::string base_sha256;  // weights_sha256 of it ("seed N" for random weights)
};
// Whether `dir` (a checkpoint directory) holds LoRA adapters (adapter_config.json).
bool is_lora_checkpoint(const std::string& dir);
// Throws naming the file when the record is missing or malformed.
LoraCheckpoint read_lora_checkpoint(const std::string& dir);

// Adds each adapter of `c` to the weights of `m`, a whole f32 model of the base's architecture
// (no adapters of its own, not a slice). Returns what it merged, for logs ("rank 8, alpha 16 on
// q, v: 60 matrices").
std::string merge_lora(const LoraCheckpoint& c, Decoder& m);

}  // namespace loom::model

// Training checkpoints: DIR/step_000123/ holds the weights under Hugging Face names
// (model.safetensors + config.json), the optimizer moments, the trainer state (step, data
// position), the resolved config, and manifest.json with a CRC32C per file. Written under a
// temporary name, fsynced, renamed; DIR/latest moves last; the last K are kept. A loader
// verifies every checksum before it trusts a checkpoint.
#pragma once
#include <cstdint>
#include <cstdio>
#include <optional>
#include <string>

#include "loom/model/decoder.h"
#include "loom/optim/adamw.h"

namespace loom::train {

struct CheckpointMeta {
  int64_t step = 0;
  std::string path;
};

// Returns the final directory.
std::string save_checkpoint(const std::string& dir, int64_t step, const model::Decoder& model,
                            const optim::AdamW& adam, const std::string& config_yaml,
                            int64_t keep_last);

// Checks the manifest, sizes and checksums. On failure returns false and says why.
bool verify_checkpoint(const std::string& path, std::string* why);

// Newest checkpoint under dir that verifies; corrupt ones are reported to `log` and skipped.
std::optional<std::string> find_latest_valid_checkpoint(const std::string& dir, FILE* log);

// Verifies, then loads weights (and optimizer state when adam is non-null).
CheckpointMeta load_checkpoint(const std::string& path, model::Decoder& model, optim::AdamW* adam);
inline CheckpointMeta load_checkpoint(const std::string& path, model::Decoder& model,
                                      optim::AdamW& adam) {
  return load_checkpoint(path, model, &adam);
}

// Reads the model config stored in a checkpoint (for generate/serve) and builds the model.
model::ModelConfig checkpoint_model_config(const std::string& path);

// Step number of a checkpoint directory name ("…/step_000123" -> 123), -1 if not one.
int64_t checkpoint_step_of(const std::string& path);

}  // namespace loom::train

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
#include "loom/parallel/data_parallel.h"

namespace loom::train {

struct CheckpointMeta {
  int64_t step = 0;
  std::string path;
};

// Collective over the engine's dp group: rank 0 writes the weights (full_params: the flat
// weights, gathered under ZeRO-3), config and manifest; every rank writes its optimizer shard
// (optimizer.rank<r>.safetensors, with the unit ranges it covers). Returns the final directory.
std::string save_checkpoint(const std::string& dir, int64_t step, const model::Decoder& model,
                            const parallel::DataParallel& engine, const Tensor& full_params,
                            const std::string& config_yaml, int64_t keep_last);

// Checks the manifest, sizes and checksums. On failure returns false and says why.
bool verify_checkpoint(const std::string& path, std::string* why);

// Newest checkpoint under dir that verifies; corrupt ones are reported to `log` and skipped.
std::optional<std::string> find_latest_valid_checkpoint(const std::string& dir, FILE* log);

// Verifies, then loads weights and this rank's optimizer shard into the engine. The layout
// (dp size, ZeRO stage) must be the one saved; resharding is refused with both layouts named.
CheckpointMeta load_checkpoint(const std::string& path, model::Decoder& model,
                               parallel::DataParallel& engine);
// Weights only, into a model with a flat parameter buffer (generate, serve, convert).
CheckpointMeta load_checkpoint_weights(const std::string& path, model::Decoder& model);

// Reads the model config stored in a checkpoint (for generate/serve) and builds the model.
model::ModelConfig checkpoint_model_config(const std::string& path);

// Step number of a checkpoint directory name ("…/step_000123" -> 123), -1 if not one.
int64_t checkpoint_step_of(const std::string& path);

}  // namespace loom::train

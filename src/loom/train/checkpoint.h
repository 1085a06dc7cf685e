// Training checkpoints: DIR/step_000123/ holds the weights under Hugging Face names
// (model.safetensors + config.json), the optimizer moments, the trainer state (step, data
// position), the resolved config, and manifest.json with a CRC32C per file. Written under a
// temporary name, fsynced, renamed; DIR/latest moves last; the run's last K are kept
// (checkpoint_dir.h). A loader verifies every checksum before it trusts a checkpoint.
#pragma once
#include <cstdint>
#include <cstdio>
#include <functional>
#include <optional>
#include <string>

#include "loom/model/decoder.h"
#include "loom/parallel/data_parallel.h"

namespace loom::train {

struct CheckpointMeta {
  int64_t step = 0;
  std::string path;
  std::string resharded_from;  // "dp=2 zero_stage=1" when the optimizer state was re-cut, else ""
  std::string run_id;          // the run that saved it; "" for checkpoints saved before run ids
  double loss_scale = 0;       // fp16's dynamic loss scale when saved; 0: none recorded
  int64_t loss_scale_clean_steps = 0;
};

// What a save records beside the model and optimizer state, and how many of its run's
// checkpoints the directory keeps.
struct SaveOptions {
  std::string config_yaml;  // the resolved config
  int64_t keep_last = 3;
  std::string tokenizer;
  std::string run_id;  // the run this checkpoint continues; pruning touches only its checkpoints
  double loss_scale = 0;  // fp16's dynamic loss scaler (0: none), so a resume continues it exactly
  int64_t loss_scale_clean_steps = 0;
};

// Where a rank's state sits when the model itself is split (tensor or pipeline parallelism).
// Defaults: data parallelism only (the engine's dp group is every rank; the weights are laid
// out by the model's layout).
struct ModelParallelInfo {
  const comm::Group* world = nullptr;                // every rank of the run
  const model::ParamLayout* whole_layout = nullptr;  // the layout of full_params
  std::string layout;  // mesh and stages, e.g. "pp=2 x dp=1 x ep=1 x tp=2, stages [0,1) [1,2)"
  bool data_parallel_only = false;  // pp = tp = ep = 1: every rank holds the whole model
};

// Collective over every rank (mp.world, else the engine's dp group): rank 0 writes the weights
// (full_params: the whole model's flat weights, gathered under ZeRO-3 and across model-
// parallel ranks), config and manifest; every rank writes its optimizer shard
// (optimizer.rank<r>.safetensors, with the unit ranges it covers). Returns the final directory.
std::string save_checkpoint(const std::string& dir, int64_t step, const model::Decoder& model,
                            const parallel::DataParallel& engine, const Tensor& full_params,
                            const SaveOptions& save, const ModelParallelInfo& mp = {});

// Which files' checksums a verification computes. Every listed file's presence and size are
// always checked; the checksum pass reads the file, so a reader checks only what it will load:
// the weights and metadata, plus (for a resuming rank) its own optimizer shard. A run of N ranks
// thus reads each shard once instead of N times.
struct VerifyScope {
  bool all = true;                  // every file's checksum
  std::vector<int> optimizer_ranks; // otherwise: the non-optimizer files and these ranks' shards
  static VerifyScope everything() { return {}; }
  static VerifyScope weights() { return {false, {}}; }
  static VerifyScope rank(int r) { return {false, {r}}; }
};

// Checks the manifest, sizes and checksums (io::verify_manifest). On failure returns false and
// says why; never throws, so no rank leaves a collective its peers are in.
bool verify_checkpoint(const std::string& path, std::string* why,
                       const VerifyScope& scope = VerifyScope::everything());

// The first checkpoint under dir that verifies, in resume_candidates order (the one `latest`
// names, then highest step first); corrupt ones are reported to `log` and skipped.
// With `agree`, a collective over that group: a candidate counts as valid only when it verifies
// on every rank (each checking its own scope), so all ranks pick the same one.
std::optional<std::string> find_latest_valid_checkpoint(
    const std::string& dir, FILE* log, const VerifyScope& scope = VerifyScope::everything(),
    const comm::Group* agree = nullptr);
// The same with a scope per candidate (checkpoint_load_scope: the files a resume would read).
std::optional<std::string> find_latest_valid_checkpoint(
    const std::string& dir, FILE* log, const std::function<VerifyScope(const std::string&)>& scope_of,
    const comm::Group* agree = nullptr);

// Verifies (unless `verified`: the caller just did, e.g. with find_latest_valid_checkpoint),
// then loads weights and this rank's optimizer state into the engine. A purely data-parallel
// checkpoint loads into a purely data-parallel run of any dp size and ZeRO stage: each rank
// takes its new chunk of every unit's Adam moments from whichever saved shards hold it
// (verifying those). Otherwise the layout (dp size, ZeRO stage, mesh and stages) must be the
// one saved; resharding across pipeline or tensor parallelism is refused with both layouts
// named.
CheckpointMeta load_checkpoint(const std::string& path, model::Decoder& model,
                               parallel::DataParallel& engine, const ModelParallelInfo& mp = {},
                               bool verified = false);
// The files load_checkpoint reads on this rank: the weights, the metadata and the optimizer
// shards it takes its state from (its own, or under resharding those holding its new chunks).
VerifyScope checkpoint_load_scope(const std::string& path, const model::Decoder& model,
                                  const parallel::DataParallel& engine, const ModelParallelInfo& mp = {});
// Weights only, into a model with a flat parameter buffer (generate, serve, convert); optimizer
// shards are neither read nor checksummed. `verified`: resolve_checkpoint already did.
CheckpointMeta load_checkpoint_weights(const std::string& path, model::Decoder& model,
                                       bool verified = false);

// Reads the model config stored in a checkpoint (for generate/serve) and builds the model.
model::ModelConfig checkpoint_model_config(const std::string& path);

// The tokenizer recorded at training time; for checkpoints that do not say, "byte" for a
// 256-entry vocabulary, else "gpt2".
std::string checkpoint_tokenizer(const std::string& path);
// A checkpoint directory itself, or the newest valid one inside a run directory, verified for
// loading its weights (load_checkpoint_weights(path, model, /*verified=*/true) then); throws
// naming the directory when there is none, or the failure when the one given is corrupt.
std::string resolve_checkpoint(const std::string& dir_or_run, FILE* log = nullptr);

// Step number of a checkpoint directory name ("…/step_000123" -> 123), -1 if not one.
int64_t checkpoint_step_of(const std::string& path);

}  // namespace loom::train

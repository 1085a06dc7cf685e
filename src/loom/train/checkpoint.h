// Training checkpoints: DIR/step_000123/ holds the weights under Hugging Face names
// (model.safetensors + config.json), the Adam moments under the same names
// (optimizer.exp_avg.safetensors, optimizer.exp_avg_sq.safetensors), the trainer state (step,
// data position), the resolved config, and manifest.json with a CRC32C per file. Weights and
// moments are the whole model's whatever the layout that saved them (dp, tp, pp, ep, ZeRO stage),
// so any layout loads any checkpoint: each rank takes its slice and its optimizer chunk of them.
// Written under a temporary name, fsynced, renamed; DIR/latest moves last; the run's last K are
// kept (checkpoint_dir.h). A loader verifies every checksum before it trusts a checkpoint.
// Format 1 (before 2026-12-02: per-rank optimizer shards) still resumes on the layout that saved it.
// Files: checkpoint_save.cpp, checkpoint_load.cpp (load, reshard), checkpoint_agreement.cpp
// (ranks failing and choosing together); what needs no trainer is io/checkpoint_files.h
// (names, verification, newest valid) and model/checkpoint_reader.h (weights for inference).
#pragma once
#include <cstdint>
#include <cstdio>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "loom/io/checkpoint_files.h"
#include "loom/model/checkpoint_reader.h"
#include "loom/model/decoder.h"
#include "loom/model/model_source.h"
#include "loom/parallel/data_parallel.h"
#include "loom/parallel/mesh.h"

namespace loom::train {

struct CheckpointMeta {
  int64_t step = 0;
  std::string path;
  std::string resharded_from;  // the saving layout when it was not this run's (state re-cut), else ""
  std::string run_id;          // the run that saved it; "" for checkpoints saved before run ids
  double loss_scale = 0;       // fp16's dynamic loss scale when saved; 0: none recorded
  int64_t loss_scale_clean_steps = 0;
  std::vector<std::pair<int64_t, int64_t>> skipped_windows;  // SaveOptions::skipped_windows
};

// What a save records beside the model and optimizer state, and how many of its run's
// checkpoints the directory keeps.
struct SaveOptions {
  std::string config_yaml;  // the resolved config
  int64_t keep_last = 3;
  std::string tokenizer;
  std::string run_id;     // the run this checkpoint continues; pruning touches only its checkpoints
  double loss_scale = 0;  // fp16's dynamic loss scaler (0: none), so a resume continues it exactly
  int64_t loss_scale_clean_steps = 0;
  // Batches a loss-spike rollback skipped: (from step, count) pairs; step s trains on batch s plus
  // the counts of every pair with from <= s (the data position beside the step).
  std::vector<std::pair<int64_t, int64_t>> skipped_windows;
  // Files written beside the weights: model.init_from's tokenizer and chat files.
  std::vector<model::CardFile> card_files;
  // prune_checkpoints keeps the newest checkpoint at or below this step (-1: none): while the
  // loss is diverging, the one the run falls back to.
  int64_t protect_upto = -1;
  // LoRA runs: the frozen model the adapters belong to (model.init_from as an absolute path, or
  // the random weights of a seed) and its weights' SHA-256 ("seed N" for random ones). Written to
  // trainer_state.json ("lora") and adapter_config.json (PEFT's file, which names the base).
  std::string lora_base, lora_base_sha256;
};

// Where a rank's state sits when the model itself is split (tensor or pipeline parallelism).
// Defaults: data parallelism only (the data-parallel group is every rank; the weights are laid
// out by the model's layout).
struct ModelParallelInfo {
  const parallel::Mesh* mesh = nullptr;              // the run's rank grid (required)
  const model::ParamLayout* whole_layout = nullptr;  // ParamLayout(cfg, 1) under tp, pp or ep
  std::string layout;               // mesh and stages, e.g. "pp=2 x dp=1 x ep=1 x tp=2, stages [0,1) [1,2)"
  bool data_parallel_only = false;  // pp = tp = ep = 1: every rank holds the whole model
};

// A step's state as a checkpoint holds it, assembled on rank 0 (weights and moments in the
// whole model's layout; undefined tensors elsewhere): what a synchronous save writes at once and
// an asynchronous one (checkpoint_writer.h) writes in the background while training goes on.
struct CheckpointSnapshot {
  int64_t step = 0;
  std::shared_ptr<const model::ParamLayout> layout;  // of weights / exp_avg / exp_avg_sq
  Tensor weights, exp_avg, exp_avg_sq;
  std::string config_json, config_yaml, trainer_state_json, model_name;
  int64_t keep_last = 3, protect_upto = -1;
  std::string run_id;
  int onebit_files = 0;  // ranks whose 1-bit Adam error files the directory holds (0: none)
  std::vector<model::CardFile> card_files;
};

// Collective over mp.mesh->world(): gathers the weights (from ZeRO-3 chunks, tp slices, pipeline
// stages, ep ranks) and the Adam moments (from ZeRO chunks likewise) into the whole model's
// layout on rank 0. `reuse`: a previous snapshot whose rank-0 buffers are filled again when the
// sizes match (no fresh pages per checkpoint).
CheckpointSnapshot snapshot_checkpoint(int64_t step, const model::Decoder& model,
                                       const parallel::DataParallel& data_parallel, const SaveOptions& save,
                                       const ModelParallelInfo& mp, CheckpointSnapshot* reuse = nullptr);
// Rank 0 only: writes a snapshot as DIR/step_N (temporary name, fsync, manifest, rename, latest,
// pruning). Throws on failure after removing the partial directory; the previous checkpoints,
// latest included, are untouched. `tmp_ready`: the temporary directory exists already (other
// ranks wrote their files into it).
std::string write_checkpoint(const std::string& dir, const CheckpointSnapshot& snap, bool tmp_ready = false);

// Collective: snapshot, then rank 0 writes it (every rank its 1-bit Adam error feedback). A
// failure on any rank (disk full, permissions) fails every rank with one message and leaves the
// previous checkpoints intact. Returns the final directory.
std::string save_checkpoint(const std::string& dir, int64_t step, const model::Decoder& model,
                            const parallel::DataParallel& data_parallel, const SaveOptions& save,
                            const ModelParallelInfo& mp);

// Throws on every rank of g when `ok` is false on any (collective), so that none goes on into
// collectives its peers never reach: the first failing rank with its own reason `why`, the
// others naming it. `what` says what failed, `fix` what to do.
void throw_unless_ok_everywhere(const comm::Group& g, bool ok, const std::string& why, const std::string& what,
                                const std::string& fix = "");

// File names, verification and the newest valid checkpoint of a directory are io's (no ranks).
using io::checkpoint_path;
using io::checkpoint_step_of;
using io::verify_checkpoint;
using io::VerifyScope;

// io::find_latest_valid_checkpoint (the one `latest` names, then highest step first; corrupt
// ones are reported to `log` and skipped). With `agree`, a collective over that group: a
// candidate counts as valid only when it verifies on every rank (each checking its own scope),
// so all ranks pick the same one.
// With max_step >= 0, only checkpoints of steps up to it are candidates (a rollback's target).
std::optional<std::string> find_latest_valid_checkpoint(const std::string& dir, FILE* log,
                                                        const VerifyScope& scope = VerifyScope::everything(),
                                                        const comm::Group* agree = nullptr, int64_t max_step = -1);
// The same with a scope per candidate (checkpoint_load_scope: the files a resume would read).
std::optional<std::string> find_latest_valid_checkpoint(const std::string& dir, FILE* log,
                                                        const std::function<VerifyScope(const std::string&)>& scope_of,
                                                        const comm::Group* agree = nullptr, int64_t max_step = -1);

// Verifies (unless `verified`: the caller just did, e.g. with find_latest_valid_checkpoint),
// then loads this rank's slice of the weights and its chunk of the Adam moments into the data-parallel object,
// whatever layout saved them (CheckpointMeta::resharded_from then names it). 1-bit Adam's error
// feedback comes back only on the layout that saved it (elsewhere it restarts at zero). A format-1
// checkpoint resumes only on the layout that saved it.
CheckpointMeta load_checkpoint(const std::string& path, model::Decoder& model, parallel::DataParallel& data_parallel,
                               const ModelParallelInfo& mp, bool verified = false);
// The files load_checkpoint checksums on this rank: everything but other ranks' own files.
VerifyScope checkpoint_load_scope(const comm::Group& world);
// Weights only (model::read_checkpoint_weights), into a model with a flat parameter buffer;
// optimizer files are neither read nor checksummed. `verified`: resolve_checkpoint already did.
CheckpointMeta load_checkpoint_weights(const std::string& path, model::Decoder& model, bool verified = false);

// What inference reads of a checkpoint is in model/checkpoint_reader.h, which needs no train.

}  // namespace loom::train

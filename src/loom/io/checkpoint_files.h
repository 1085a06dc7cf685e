// A training checkpoint's files as any reader sees them (train/checkpoint.h writes them): their
// names and format version, verification against manifest.json, and which checkpoint of a run
// directory is the newest valid one. Nothing here knows the model or other ranks: reading the
// weights is model/checkpoint_reader.h, ranks agreeing on a checkpoint is train's.
#pragma once
#include <cstdint>
#include <cstdio>
#include <functional>
#include <optional>
#include <string>
#include <vector>

namespace loom::io {

// manifest.json's version: 2, layout-independent Adam moments (optimizer.exp_avg*.safetensors);
// 1 (before 2026-12-02), per-rank optimizer shards.
inline constexpr int kTrainingCheckpointVersion = 2;
inline constexpr int kOldestTrainingCheckpointVersion = 1;

// The files of DIR/step_NNNNNN.
inline constexpr const char* kWeightsFile = "model.safetensors";  // the whole model, HF names
inline constexpr const char* kHfConfigFile = "config.json";       // the model's exact sizes
inline constexpr const char* kTrainerStateFile = "trainer_state.json";
// A model's own tokenizer and chat files, which `loom convert` copies into a checkpoint (a GGUF's
// vocabulary as tokenizer.gguf) and `loom quantize` copies along; absent ones are skipped.
inline constexpr const char* kTokenizerFiles[] = {"tokenizer.json",
                                                  "tokenizer.gguf",
                                                  "tokenizer_config.json",
                                                  "special_tokens_map.json",
                                                  "generation_config.json",
                                                  "chat_template.jinja",
                                                  "vocab.json",
                                                  "merges.txt",
                                                  "tokenizer.model"};
inline constexpr const char* kRunConfigFile = "config.yaml";  // the resolved run config
// A LoRA run's checkpoint: PEFT's description of the adapters (model.safetensors then holds the
// adapters alone, config.json the frozen model's sizes).
inline constexpr const char* kAdapterConfigFile = "adapter_config.json";
inline constexpr const char* kExpAvgFile = "optimizer.exp_avg.safetensors";
inline constexpr const char* kExpAvgSqFile = "optimizer.exp_avg_sq.safetensors";
// Format 1's per-rank optimizer shards; format 2's per-rank 1-bit Adam error feedback.
std::string optimizer_rank_file(int rank);
std::string onebit_rank_file(int rank);

// "step_000123": the directory name of a checkpoint of `step`.
std::string checkpoint_dir_name(int64_t step);
// DIR/step_000123: where a checkpoint of `step` goes.
std::string checkpoint_path(const std::string& dir, int64_t step);
// Step number of a checkpoint directory name ("…/step_000123" -> 123), -1 if not one.
int64_t checkpoint_step_of(const std::string& path);

struct CheckpointEntry {
  int64_t step = 0;
  std::string path;
};
// The step_NNNNNN directories under dir, highest step first (none when dir does not exist).
std::vector<CheckpointEntry> list_checkpoints(const std::string& dir);
// The order a resume tries them in: the one DIR/latest names first (the most recent save, even
// when a directory resumed from an earlier step still holds higher steps of the abandoned
// continuation), then the others, highest step first.
std::vector<CheckpointEntry> resume_candidates(const std::string& dir);

// Which files' checksums a verification computes. Every listed file's presence and size are
// always checked; the checksum pass reads the file, so a reader checks only what it will load:
// the weights and metadata, for a resuming rank the Adam moments and its own files.
struct VerifyScope {
  bool all = true;         // every file's checksum
  bool optimizer = true;   // otherwise: the Adam moments (optimizer.exp_avg*.safetensors) too
  std::vector<int> ranks;  // and these ranks' own files (1-bit Adam errors, format-1 shards)
  static VerifyScope everything() { return {}; }
  static VerifyScope weights() { return {false, false, {}}; }
  static VerifyScope rank(int r) { return {false, true, {r}}; }
};

// Checks the manifest, sizes and checksums (verify_manifest). On failure returns false and
// says why; never throws, so no rank leaves a collective its peers are in.
bool verify_checkpoint(const std::string& path, std::string* why, const VerifyScope& scope = VerifyScope::everything());

// How ranks searching one directory together agree on each candidate (train supplies it over
// a process group; without it the search is this process's alone).
struct CandidateAgreement {
  // Before each candidate is verified, with its step (-1: none left); throws when the ranks
  // look at different ones.
  std::function<void(int64_t step)> same_candidate;
  // This rank's verdict on `path` in, everyone's out (valid only when valid everywhere); may
  // replace *why with the failing rank's.
  std::function<bool(bool ok, const std::string& path, std::string* why)> valid_everywhere;
};

// The first checkpoint under dir that verifies, in resume_candidates order, each with
// scope_of(its path); damaged ones are reported to `log` ("[resume] skipping ...") and skipped.
// With max_step >= 0, only checkpoints of steps up to it are candidates (a rollback's target).
std::optional<std::string> find_latest_valid_checkpoint(const std::string& dir, FILE* log,
                                                        const std::function<VerifyScope(const std::string&)>& scope_of,
                                                        int64_t max_step = -1,
                                                        const CandidateAgreement* agree = nullptr);

}  // namespace loom::io

// Reading a loom training checkpoint for inference: its model config, tokenizer name and whole
// weights (saved by any layout: dp/ZeRO, tp, pp, ep all write the whole model), and a run
// directory resolved to its newest valid checkpoint. It lives in `model` (core, kernels, io, and
// yaml-cpp privately for config.yaml's preset name) beside hf_weights.h, whose mapping it reads
// with, so `loom generate`, `serve`, `eval` and `quantize` load checkpoints without linking
// train, parallel or MPI; the trainer's own loader (train/checkpoint.h) reads through it too.
// File names and verification are io/checkpoint_files.h.
#pragma once
#include <cstdint>
#include <cstdio>
#include <string>

#include <nlohmann/json_fwd.hpp>

#include "loom/core/tensor.h"
#include "loom/model/config.h"
#include "loom/model/decoder.h"
#include "loom/model/param_layout.h"

namespace loom::model {

// The model config a checkpoint records (config.json's exact sizes), named after the preset it
// was trained from when config.yaml names one, else "custom".
ModelConfig checkpoint_model_config(const std::string& path);

// The tokenizer recorded at training time ("gpt2", "byte", or a path: one relative to the
// checkpoint, as `loom convert` records the model's own tokenizer files, comes back joined to
// it); for checkpoints that do not say, "byte" for a 256-entry vocabulary, else "gpt2".
std::string checkpoint_tokenizer(const std::string& path);

// A checkpoint directory itself, or the newest valid one inside a run directory (damaged ones
// are reported to `log` and skipped), verified for loading its weights; throws naming the
// directory when there is none, or the failure when the one given is damaged.
std::string resolve_checkpoint(const std::string& dir_or_run, FILE* log = nullptr);

struct CheckpointWeights {
  int64_t step = 0;
  std::string run_id;  // "" for checkpoints saved before run ids
};
// Verifies the weights' files (unless `verified`: resolve_checkpoint just did), then loads the
// whole model's weights into `model`, which has a flat parameter buffer and the whole model
// (ParamLayout(cfg, n) for any unit alignment n), and its MoE balancing biases. Optimizer files
// are neither read nor checksummed.
CheckpointWeights read_checkpoint_weights(const std::string& path, Decoder& model, bool verified = false);

// A checkpoint file holding whole-model tensors under HF names (the weights, or Adam moments
// laid out like them) into a rank's flat buffer laid out by `local`: directly when `whole` is
// null (local holds every parameter whole), else read in `whole` = ParamLayout(cfg, 1) and
// this rank's slice (tp, pp, ep) taken out of it.
void read_whole_into_local(const std::string& file, const ModelConfig& cfg, const ParamLayout& local,
                           const Tensor& local_flat, const ParamLayout* whole = nullptr);

// Fills local_flat (laid out by `local`) with its elements of `whole` (laid out by whole_layout);
// padding is zero. f32, or f64 (both buffers the same type).
void slice_whole_params(const ParamLayout& whole_layout, const Tensor& whole, const ParamLayout& local,
                        const Tensor& local_flat);

// MoE selection biases (model.moe.bias_update_rate) from a parsed trainer_state.json; a
// checkpoint without them leaves them as they are.
void restore_router_bias(const nlohmann::json& trainer_state, Decoder& model);

}  // namespace loom::model

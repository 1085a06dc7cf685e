// Reading a loom training checkpoint's model for inference (checkpoint_reader.h): config,
// tokenizer, whole weights, and the newest valid checkpoint of a run directory.
#include "loom/model/checkpoint_reader.h"

#include <algorithm>
#include <filesystem>

#include <yaml-cpp/yaml.h>
#include <nlohmann/json.hpp>

#include "loom/core/error.h"
#include "loom/io/checkpoint_files.h"
#include "loom/io/file.h"
#include "loom/model/hf_weights.h"

namespace loom::model {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {
json read_trainer_state(const std::string& path) {
  return json::parse(io::read_file((fs::path(path) / io::kTrainerStateFile).string()));
}
}  // namespace

ModelConfig checkpoint_model_config(const std::string& path) {
  // config.json records the exact sizes (a preset named in config.yaml could change later).
  ModelConfig c = read_hf_config((fs::path(path) / io::kHfConfigFile).string());
  // The name users know the model by: the preset it was trained from, when there was one.
  c.name = "custom";
  try {
    const YAML::Node y = YAML::LoadFile((fs::path(path) / io::kRunConfigFile).string());
    if (y["model"] && y["model"]["preset"]) c.name = y["model"]["preset"].as<std::string>();
  } catch (const YAML::Exception&) {
  }
  return c;
}

std::string checkpoint_tokenizer(const std::string& path) {
  const json state = read_trainer_state(path);
  const std::string recorded = state.value("tokenizer", "");
  // A name (gpt2, byte), an absolute path, or a path relative to the checkpoint (a converted
  // model's own tokenizer files, which travel with it).
  if (!recorded.empty() && recorded != "gpt2" && recorded != "byte" && fs::path(recorded).is_relative())
    return (fs::path(path) / recorded).lexically_normal().string();
  if (!recorded.empty()) return recorded;
  return checkpoint_model_config(path).vocab_size == 256 ? "byte" : "gpt2";
}

std::string resolve_checkpoint(const std::string& dir, FILE* log) {
  if (fs::exists(fs::path(dir) / "manifest.json")) {
    std::string why;
    LOOM_CHECK(io::verify_checkpoint(dir, &why, io::VerifyScope::weights()), "checkpoint", dir,
               " failed verification: ", why);
    return dir;
  }
  LOOM_CHECK(fs::is_directory(dir), "checkpoint", dir, " does not exist");
  auto found =
      io::find_latest_valid_checkpoint(dir, log, [](const std::string&) { return io::VerifyScope::weights(); });
  LOOM_CHECK(found.has_value(), "checkpoint", "no valid checkpoint in ", dir,
             " (expected a step_NNNNNN directory with a manifest.json, or a run directory holding them)");
  return *found;
}

void restore_router_bias(const json& state, Decoder& model) {
  if (model.router_bias().defined() && state.contains("router_bias"))
    model.set_router_bias(state.at("router_bias").get<std::vector<float>>());
}

CheckpointWeights read_checkpoint_weights(const std::string& path, Decoder& model, bool verified) {
  std::string why;
  LOOM_CHECK(verified || io::verify_checkpoint(path, &why, io::VerifyScope::weights()), "checkpoint", path,
             " failed verification: ", why);
  load_hf_safetensors(model, (fs::path(path) / io::kWeightsFile).string());
  const json state = read_trainer_state(path);
  restore_router_bias(state, model);
  return {state.at("step").get<int64_t>(), state.value("run_id", "")};
}

void read_whole_into_local(const std::string& file, const ModelConfig& cfg, const ParamLayout& local,
                           const Tensor& local_flat, const ParamLayout* whole) {
  if (!whole) {
    load_hf_safetensors(cfg, local, local_flat, file);
    return;
  }
  Tensor w = Tensor::zeros({whole->total()}, DType::f32, MemCategory::workspace);
  load_hf_safetensors(cfg, *whole, w, file);
  slice_whole_params(*whole, w, local, local_flat);
}

namespace {
template <class T>
void slice_runs(const ParamLayout& whole_layout, const Tensor& whole, const ParamLayout& local,
                const Tensor& local_flat) {
  const T* src = whole.data<T>();
  T* dst = local_flat.data<T>();
  for (const auto& p : local.params()) {
    const int64_t base = whole_layout.get(p.name).offset;
    for (const auto& run : local.element_runs(p))
      std::copy(src + base + run.global, src + base + run.global + run.n, dst + p.offset + run.local);
  }
}
}  // namespace

void slice_whole_params(const ParamLayout& whole_layout, const Tensor& whole, const ParamLayout& local,
                        const Tensor& local_flat) {
  LOOM_CHECK(whole.numel() == whole_layout.total() && local_flat.numel() == local.total(), "parallel",
             "slice_whole_params: buffers of ", whole.numel(), " and ", local_flat.numel(), " elements for layouts of ",
             whole_layout.total(), " and ", local.total());
  local_flat.zero();
  if (whole.dtype() == DType::f64)
    slice_runs<double>(whole_layout, whole, local, local_flat);
  else
    slice_runs<float>(whole_layout, whole, local, local_flat);
}

}  // namespace loom::model

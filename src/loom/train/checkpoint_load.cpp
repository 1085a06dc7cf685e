// Loading a training checkpoint into a run of any layout: each rank verifies its files, takes
// its slice of the whole model's weights and its chunk of the Adam moments (resharding when
// another layout saved them), 1-bit Adam's errors on the same layout, and format-1 shards.
#include <algorithm>
#include <filesystem>

#include <nlohmann/json.hpp>

#include "loom/io/checkpoint_files.h"
#include "loom/io/file.h"
#include "loom/io/manifest.h"
#include "loom/io/safetensors.h"
#include "loom/model/checkpoint_reader.h"
#include "loom/train/checkpoint.h"
#include "loom/train/checkpoint_agreement.h"

namespace loom::train {

namespace fs = std::filesystem;
using nlohmann::json;

CheckpointMeta load_checkpoint_weights(const std::string& path, model::Decoder& model, bool verified) {
  const model::CheckpointWeights w = model::read_checkpoint_weights(path, model, verified);
  return {w.step, path, "", w.run_id, 0, 0, {}};
}

// Format 1: each rank's optimizer shard, on the layout that saved it.
static void load_format1_optimizer(const std::string& path, const model::Decoder& model,
                                   parallel::DataParallel& data_parallel, int rank, int64_t optimizer_steps) {
  LOOM_CHECK(!data_parallel.optimizer_offload(), "checkpoint", path,
             " keeps its optimizer state in the old per-rank format, which does not load into offloaded moments; "
             "resume it once with parallel.offload.optimizer=none and save again");
  auto f = io::SafetensorsFile::open((fs::path(path) / io::optimizer_rank_file(rank)).string());
  const auto& units = model.layout().units();
  for (size_t i = 0; i < units.size(); ++i) {
    auto& a = *data_parallel.optimizers()[i];
    Tensor m = f.get(str_cat(units[i].name, ".exp_avg")), v = f.get(str_cat(units[i].name, ".exp_avg_sq"));
    LOOM_CHECK(m.numel() == a.exp_avg().numel(), "checkpoint", path, ": ", units[i].name, " optimizer state has ",
               m.numel(), " elements, this run expects ", a.exp_avg().numel());
    a.exp_avg().copy_from(m);
    a.exp_avg_sq().copy_from(v);
    a.set_step_count(optimizer_steps);
  }
}

// 1-bit Adam's error feedback of this rank, when the file exists (a run that was AdamW has none:
// the errors start at zero).
static void load_onebit_errors(const std::string& path, const std::string& file, const model::Decoder& model,
                               parallel::DataParallel& data_parallel) {
  if (data_parallel.onebit().empty() || !fs::exists(fs::path(path) / file)) return;
  auto f = io::SafetensorsFile::open((fs::path(path) / file).string());
  const std::vector<std::string> names = f.names();
  auto load = [&](const std::string& name, const Tensor& into) {
    if (std::find(names.begin(), names.end(), name) == names.end()) return;
    Tensor t = f.get(name);
    LOOM_CHECK(t.numel() == into.numel(), "checkpoint", path, ": ", name, " has ", t.numel(),
               " elements, this run expects ", into.numel());
    into.copy_from(t);
  };
  const auto& units = model.layout().units();
  for (size_t i = 0; i < units.size(); ++i) {
    load(str_cat(units[i].name, ".onebit_worker_error"), data_parallel.onebit()[i]->worker_error());
    load(str_cat(units[i].name, ".onebit_server_error"), data_parallel.onebit()[i]->server_error());
  }
}

// "pp=1 x dp=2 x ep=1 x tp=2, stages [0,4) zero_stage=1": what resharding compares.
static std::string layout_with_stage(const std::string& layout, int dp, int stage) {
  return str_cat(layout.empty() ? str_cat("dp=", dp) : layout, " zero_stage=", stage);
}

CheckpointMeta load_checkpoint(const std::string& path, model::Decoder& model, parallel::DataParallel& data_parallel,
                               const ModelParallelInfo& mp, bool verified) {
  LOOM_CHECK(mp.mesh, "checkpoint", "load_checkpoint needs the run's mesh");
  const comm::Group& g = mp.mesh->world();
  LOOM_CHECK(io::manifest_format(path) != io::kQuantizedCheckpointFormat, "checkpoint", path,
             " is a quantized inference checkpoint (loom quantize): it holds no optimizer state, so --resume "
             "cannot continue from it; resume from the training checkpoint it was made from (its manifest.json "
             "names it as \"source\")");
  if (!verified) {  // each rank its files; all fail together when one does
    std::string why;
    const bool ok = verify_checkpoint(path, &why, checkpoint_load_scope(g));
    throw_unless_ok_everywhere(g, ok, why, path + " failed verification",
                               "; resume from an earlier checkpoint (--resume auto takes the newest valid one)");
  }
  json state;
  std::string state_error;
  try {
    state = json::parse(io::read_file((fs::path(path) / io::kTrainerStateFile).string()));
  } catch (const std::exception& e) {
    state_error = e.what();
  }
  throw_unless_ok_everywhere(g, state_error.empty(), state_error, path + ": trainer_state.json is unreadable");
  const int saved_dp = state.value("dp_size", 1), saved_stage = state.value("zero_stage", 0);
  const std::string saved = layout_with_stage(state.value("layout", ""), saved_dp, saved_stage);
  const std::string mine = layout_with_stage(mp.layout, data_parallel.group().size(), data_parallel.zero_stage());
  const bool same_layout = saved == mine;
  const int version = io::manifest_version(path);
  LOOM_CHECK(version >= 2 || same_layout, "checkpoint", path,
             " is a format-1 checkpoint (per-rank optimizer shards) saved with ", saved, "; this run has ", mine,
             ". Format 1 resumes only on the layout that saved it: resume there once "
             "and save again (format 2 loads into any layout)");
  const int64_t optimizer_steps = state.at("optimizer_steps").get<int64_t>();
  // Weights and moments alike: the whole model on disk, this rank's slice and chunk of it.
  auto load_whole = [&](const char* file, const Tensor& local_flat) {
    model::read_whole_into_local((fs::path(path) / file).string(), model.config(), model.layout(), local_flat,
                                 mp.whole_layout);
  };
  on_every_rank_or_none(g, str_cat("loading ", path, " failed"), [&] {
    Tensor flat = Tensor::zeros({model.flat_size()}, DType::f32, MemCategory::workspace);
    load_whole(io::kWeightsFile, flat);
    data_parallel.load_full_params(flat);
    if (version < 2) {
      load_format1_optimizer(path, model, data_parallel, g.rank(), optimizer_steps);
      load_onebit_errors(path, io::optimizer_rank_file(g.rank()), model, data_parallel);
      return;
    }
    Tensor v = Tensor::zeros({model.flat_size()}, DType::f32, MemCategory::workspace);
    load_whole(io::kExpAvgFile, flat);
    load_whole(io::kExpAvgSqFile, v);
    data_parallel.load_full_moments(flat, v, optimizer_steps);
    if (same_layout) load_onebit_errors(path, io::onebit_rank_file(g.rank()), model, data_parallel);
  });
  model::restore_router_bias(state, model);
  CheckpointMeta meta{state.at("step").get<int64_t>(),
                      path,
                      same_layout ? "" : saved,
                      state.value("run_id", ""),
                      state.value("loss_scale", 0.0),
                      state.value("loss_scale_clean_steps", int64_t(0)),
                      {}};
  if (state.contains("data_position") && state["data_position"].contains("skipped_windows"))
    meta.skipped_windows = state["data_position"]["skipped_windows"].get<std::vector<std::pair<int64_t, int64_t>>>();
  return meta;
}

}  // namespace loom::train

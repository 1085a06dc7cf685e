// Saving a training checkpoint: the snapshot (the whole model's weights and Adam moments
// gathered onto rank 0 from whatever layout trains), writing it under a temporary name with a
// manifest, then rename, `latest` and pruning. Reading it back is checkpoint_load.cpp.
#include <filesystem>

#include <nlohmann/json.hpp>

#include "loom/io/checkpoint_files.h"
#include "loom/io/file.h"
#include "loom/io/manifest.h"
#include "loom/io/safetensors.h"
#include "loom/model/hf_weights.h"
#include "loom/parallel/model_gather.h"
#include "loom/train/checkpoint.h"
#include "loom/train/checkpoint_agreement.h"
#include "loom/train/checkpoint_dir.h"

namespace loom::train {

namespace fs = std::filesystem;
using nlohmann::json;

static fs::path tmp_dir_of(const std::string& dir, int64_t step) {
  return fs::path(dir) / str_cat(".tmp.", io::checkpoint_dir_name(step));
}

// DIR and an empty DIR/.tmp.step_N (a leftover of an interrupted save of that step is removed).
static void make_tmp_dir(const std::string& dir, const fs::path& tmp) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  LOOM_CHECK(!ec, "checkpoint", "cannot create ", dir, ": ", ec.message());
  fs::remove_all(tmp, ec);
  fs::create_directories(tmp, ec);
  LOOM_CHECK(!ec, "checkpoint", "cannot create ", tmp.string(), ": ", ec.message());
}

// `t` when it is a defined f32 buffer of n elements, else a new one.
static Tensor reuse_or_new(const Tensor& t, int64_t n) {
  if (t.defined() && t.numel() == n && t.dtype() == DType::f32) return t;
  return Tensor::zeros({n}, DType::f32, MemCategory::workspace);
}

CheckpointSnapshot snapshot_checkpoint(int64_t step, const model::Decoder& model,
                                       const parallel::DataParallel& data_parallel, const SaveOptions& save,
                                       const ModelParallelInfo& mp, CheckpointSnapshot* reuse) {
  LOOM_CHECK(mp.mesh, "checkpoint", "snapshot_checkpoint needs the run's mesh");
  const parallel::Mesh& mesh = *mp.mesh;
  const bool main = mesh.world().rank() == 0;
  const model::ParamLayout& local = model.layout();
  CheckpointSnapshot s;
  s.step = step;
  if (reuse && reuse->layout)
    s.layout = reuse->layout;
  else
    s.layout =
        std::make_shared<const model::ParamLayout>(model.config(), 1, model::ModelSlice{.lora_adapters = model.lora()});
  const int64_t n = s.layout->total();
  // This rank's full slice: weights (the owners' fp32 chunks under ZeRO-3 or 16-bit gathers) and moments (from ZeRO
  // chunks).
  Tensor w = model.params();
  if (!data_parallel.params_are_masters()) {
    w = Tensor::zeros({model.flat_size()}, DType::f32, MemCategory::workspace);
    data_parallel.gather_full_params(w);
  }
  // Every rank holds its whole moments under ZeRO-0, so rank 0 copies them straight from the
  // optimizer (no flat intermediate: the copy is what an asynchronous save stalls training for).
  const bool direct = data_parallel.zero_stage() == 0 && !mp.whole_layout && !data_parallel.optimizer_offload();
  Tensor m, v;
  if (!direct) {
    m = Tensor::zeros({model.flat_size()}, DType::f32, MemCategory::workspace);
    v = Tensor::zeros({model.flat_size()}, DType::f32, MemCategory::workspace);
    data_parallel.gather_full_moments(m, v);
  }
  if (mp.whole_layout) {  // model-parallel slices: summed into the whole on every rank
    s.weights = parallel::gather_whole_params(mesh, local, w);
    s.exp_avg = parallel::gather_whole_params(mesh, local, m);
    s.exp_avg_sq = parallel::gather_whole_params(mesh, local, v);
    if (!main) s.weights = s.exp_avg = s.exp_avg_sq = Tensor();
  } else if (main) {  // data parallelism only: rank 0 holds everything; drop the units' padding
    s.weights = reuse_or_new(reuse ? reuse->weights : Tensor(), n);
    s.exp_avg = reuse_or_new(reuse ? reuse->exp_avg : Tensor(), n);
    s.exp_avg_sq = reuse_or_new(reuse ? reuse->exp_avg_sq : Tensor(), n);
    const parallel::MeshCoord origin;
    parallel::copy_local_to_whole(origin, local, w, *s.layout, s.weights);
    if (direct) {
      for (const auto& a : data_parallel.optimizers()) {
        parallel::copy_local_range_to_whole(origin, local, a->exp_avg().data<float>(), a->begin(), a->end(), *s.layout,
                                            s.exp_avg);
        parallel::copy_local_range_to_whole(origin, local, a->exp_avg_sq().data<float>(), a->begin(), a->end(),
                                            *s.layout, s.exp_avg_sq);
      }
    } else {
      parallel::copy_local_to_whole(origin, local, m, *s.layout, s.exp_avg);
      parallel::copy_local_to_whole(origin, local, v, *s.layout, s.exp_avg_sq);
    }
  }
  if (!main) return s;
  s.config_json = model::hf_config_json(model.config());
  s.config_yaml = save.config_yaml;
  s.model_name = model.config().name;
  s.keep_last = save.keep_last;
  s.protect_upto = save.protect_upto;
  s.run_id = save.run_id;
  s.onebit_files = data_parallel.onebit().empty() ? 0 : mesh.world().size();
  s.card_files = save.card_files;
  json state = {{"step", step},
                {"optimizer_steps", data_parallel.optimizer_steps()},
                {"dp_size", data_parallel.group().size()},
                {"zero_stage", data_parallel.zero_stage()},
                {"layout", mp.layout},
                {"data_parallel_only", mp.data_parallel_only},
                {"tokenizer", save.tokenizer},
                {"run_id", save.run_id},
                // Batches are a pure function of (data.seed, step): the step is the position.
                {"data_position", {{"step", step}, {"skipped_windows", save.skipped_windows}}}};
  if (save.loss_scale > 0) {
    state["loss_scale"] = save.loss_scale;
    state["loss_scale_clean_steps"] = save.loss_scale_clean_steps;
  }
  if (model.router_bias().defined()) {  // MoE balancing biases: what an exact resume needs
    const Tensor& b = model.router_bias();
    state["router_bias"] = std::vector<float>(b.data<float>(), b.data<float>() + b.numel());
  }
  if (model.lora()) {
    const model::LoraConfig& l = model.config().lora;
    const std::vector<std::string> modules = model::lora_modules(model.config());
    state["lora"] = {{"rank", l.rank},
                     {"alpha", l.alpha},
                     {"target_modules", modules},
                     {"base", save.lora_base},
                     {"base_sha256", save.lora_base_sha256}};
    const json adapter = {{"peft_type", "LORA"},
                          {"task_type", "CAUSAL_LM"},
                          {"r", l.rank},
                          {"lora_alpha", l.alpha},
                          {"lora_dropout", l.dropout},
                          {"target_modules", modules},
                          {"bias", "none"},
                          {"fan_in_fan_out", false},
                          {"inference_mode", true},
                          {"base_model_name_or_path", save.lora_base}};
    s.card_files.push_back({io::kAdapterConfigFile, adapter.dump(2)});
  }
  s.trainer_state_json = state.dump(2);
  return s;
}

std::string write_checkpoint(const std::string& dir, const CheckpointSnapshot& s, bool tmp_ready) {
  const fs::path final_dir = fs::path(dir) / io::checkpoint_dir_name(s.step);
  const fs::path tmp = tmp_dir_of(dir, s.step);
  try {
    std::error_code ec;
    if (!tmp_ready) make_tmp_dir(dir, tmp);
    io::ManifestWriter manifest(tmp.string());
    auto record = [&](const std::string& name) { manifest.record(name); };
    model::save_hf_safetensors(*s.layout, s.weights, (tmp / io::kWeightsFile).string());
    record(io::kWeightsFile);
    // The moments under the weights' names: layout-independent, like the weights.
    model::save_hf_safetensors(*s.layout, s.exp_avg, (tmp / io::kExpAvgFile).string());
    record(io::kExpAvgFile);
    model::save_hf_safetensors(*s.layout, s.exp_avg_sq, (tmp / io::kExpAvgSqFile).string());
    record(io::kExpAvgSqFile);
    io::write_file_atomic((tmp / io::kHfConfigFile).string(), s.config_json);
    record(io::kHfConfigFile);
    for (int r = 0; r < s.onebit_files; ++r) record(io::onebit_rank_file(r));
    io::write_file_atomic((tmp / io::kTrainerStateFile).string(), s.trainer_state_json);
    record(io::kTrainerStateFile);
    io::write_file_atomic((tmp / io::kRunConfigFile).string(), s.config_yaml);
    record(io::kRunConfigFile);
    for (const model::CardFile& f : s.card_files) {
      io::write_file_atomic((tmp / f.name).string(), f.bytes);
      record(f.name);
    }
    manifest.write(io::kTrainingCheckpointFormat, io::kTrainingCheckpointVersion,
                   {{"step", s.step}, {"model", s.model_name}});
    io::fsync_dir(tmp.string());
    fs::remove_all(final_dir, ec);  // an older save of the same step (e.g. after a crash)
    fs::rename(tmp, final_dir, ec);
    LOOM_CHECK(!ec, "checkpoint", "cannot rename ", tmp.string(), " to ", final_dir.string(), ": ", ec.message());
    io::fsync_dir(dir);
    io::write_file_atomic((fs::path(dir) / "latest").string(), io::checkpoint_dir_name(s.step) + "\n");
  } catch (...) {
    std::error_code ignored;
    fs::remove_all(tmp, ignored);
    throw;
  }
  prune_checkpoints(dir, s.run_id, s.step, s.keep_last, s.protect_upto);
  return final_dir.string();
}

std::string save_checkpoint(const std::string& dir, int64_t step, const model::Decoder& model,
                            const parallel::DataParallel& data_parallel, const SaveOptions& save,
                            const ModelParallelInfo& mp) {
  LOOM_CHECK(mp.mesh, "checkpoint", "save_checkpoint needs the run's mesh");
  const comm::Group& g = mp.mesh->world();
  const bool main = g.rank() == 0;
  const fs::path final_dir = fs::path(dir) / io::checkpoint_dir_name(step);
  const fs::path tmp = tmp_dir_of(dir, step);
  const CheckpointSnapshot snap = snapshot_checkpoint(step, model, data_parallel, save, mp);
  // Each phase ends with every rank learning whether all of them succeeded (where a barrier
  // would leave the others waiting for a rank that failed): a failure anywhere (disk full,
  // permissions) fails every rank at once, the partial save is removed, and the previous
  // checkpoints, `latest` included, stay as they were.
  const std::string what = str_cat("saving step ", step, " to ", final_dir.string(), " failed");
  const std::string fix = str_cat("; the earlier checkpoints in ", dir,
                                  " are untouched: free space there or set another checkpoint.dir, then --resume auto");
  auto phase = [&](auto&& f) {
    try {
      on_every_rank_or_none(g, what, f, fix);
    } catch (...) {
      std::error_code ignored;
      if (main) fs::remove_all(tmp, ignored);
      throw;
    }
  };
  const bool onebit = !data_parallel.onebit().empty();
  if (onebit) {  // every rank writes its own error feedback into the temporary directory
    phase([&] {
      if (main) make_tmp_dir(dir, tmp);
    });
    phase([&] {
      io::SafetensorsWriter w;
      const auto& units = model.layout().units();
      for (size_t i = 0; i < units.size(); ++i) {
        w.add(str_cat(units[i].name, ".onebit_worker_error"), data_parallel.onebit()[i]->worker_error());
        w.add(str_cat(units[i].name, ".onebit_server_error"), data_parallel.onebit()[i]->server_error());
      }
      w.write((tmp / io::onebit_rank_file(g.rank())).string());
    });
  }
  phase([&] {
    if (main) write_checkpoint(dir, snap, onebit);
  });
  return final_dir.string();
}

}  // namespace loom::train

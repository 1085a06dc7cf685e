#include "loom/train/checkpoint.h"

#include <algorithm>
#include <filesystem>
#include <vector>

#include <nlohmann/json.hpp>

#include "loom/comm/group.h"
#include "loom/io/checkpoint_files.h"
#include "loom/io/file.h"
#include "loom/io/manifest.h"
#include "loom/io/safetensors.h"
#include "loom/model/checkpoint_reader.h"
#include "loom/model/hf_weights.h"
#include "loom/parallel/model_gather.h"
#include "loom/train/checkpoint_dir.h"

namespace loom::train {

namespace fs = std::filesystem;
using nlohmann::json;

static int first_failing_rank(const comm::Group& g, bool ok) {
  if (g.size() == 1) return ok ? -1 : 0;
  Tensor r = Tensor::zeros({1}, DType::f64, MemCategory::comm);
  r.data<double>()[0] = ok ? double(g.size()) : double(g.rank());
  g.all_reduce(r, comm::ReduceOp::min);
  const int first = int(r.data<double>()[0]);
  return first < g.size() ? first : -1;
}

void throw_unless_ok_everywhere(const comm::Group& g, bool ok, const std::string& why, const std::string& what,
                                const std::string& fix) {
  const int bad = first_failing_rank(g, ok);
  LOOM_CHECK(bad < 0, "checkpoint", what,
             bad == g.rank() ? ": " + why : str_cat(" on rank ", bad, " (its reason is in its log)"), fix);
}

// Runs `f` on every rank; if it throws on any, every rank throws (throw_unless_ok_everywhere).
template <class F>
static void on_every_rank_or_none(const comm::Group& g, const std::string& what, F&& f,
                                  const std::string& fix = "") {
  std::string why;
  bool ok = true;
  try {
    f();
  } catch (const std::exception& e) {
    ok = false;
    why = e.what();
  }
  throw_unless_ok_everywhere(g, ok, why, what, fix);
}

std::optional<std::string> find_latest_valid_checkpoint(const std::string& dir, FILE* log, const VerifyScope& scope,
                                                        const comm::Group* agree, int64_t max_step) {
  return find_latest_valid_checkpoint(dir, log, [&](const std::string&) { return scope; }, agree, max_step);
}

std::optional<std::string> find_latest_valid_checkpoint(
    const std::string& dir, FILE* log, const std::function<VerifyScope(const std::string&)>& scope_of,
    const comm::Group* agree, int64_t max_step) {
  if (!agree || agree->size() == 1) return io::find_latest_valid_checkpoint(dir, log, scope_of, max_step);
  io::CandidateAgreement a;
  a.same_candidate = [&](int64_t step) {  // every rank must be looking at the same one (or all at none)
    Tensor s = Tensor::zeros({2}, DType::f64, MemCategory::comm);
    s.data<double>()[0] = double(step);
    s.data<double>()[1] = -double(step);
    agree->all_reduce(s, comm::ReduceOp::min);
    const int64_t lo = int64_t(s.data<double>()[0]), hi = -int64_t(s.data<double>()[1]);
    LOOM_CHECK(lo == hi, "resume", "ranks see different checkpoints in ", dir, " (step ", hi, " on one, ",
               lo < 0 ? std::string("none") : std::to_string(lo),
               " on another); checkpoint.dir must be a directory every rank shares");
  };
  a.valid_everywhere = [&](bool ok, const std::string& p, std::string* why) {
    const int bad = first_failing_rank(*agree, ok);
    if (bad == agree->rank() && bad != 0)  // only rank 0 logs; only this rank knows why
      std::fprintf(stderr, "[resume] rank %d: %s failed verification: %s\n", bad, p.c_str(), why->c_str());
    if (bad > 0 && agree->rank() != bad)
      *why = str_cat("rank ", bad, "'s files failed verification (its reason is in its log)");
    return bad < 0;
  };
  return io::find_latest_valid_checkpoint(dir, log, scope_of, max_step, &a);
}

VerifyScope checkpoint_load_scope(const comm::Group& world) { return VerifyScope::rank(world.rank()); }

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
                                       const parallel::DataParallel& engine, const SaveOptions& save,
                                       const ModelParallelInfo& mp, CheckpointSnapshot* reuse) {
  LOOM_CHECK(mp.mesh, "checkpoint", "snapshot_checkpoint needs the run's mesh");
  const parallel::Mesh& mesh = *mp.mesh;
  const bool main = mesh.world().rank() == 0;
  const model::ParamLayout& local = model.layout();
  CheckpointSnapshot s;
  s.step = step;
  if (reuse && reuse->layout) s.layout = reuse->layout;
  else s.layout = std::make_shared<const model::ParamLayout>(model.config(), 1);
  const int64_t n = s.layout->total();
  // This rank's full slice: weights (gathered from ZeRO-3 chunks) and moments (from ZeRO chunks).
  Tensor w = model.params();
  if (engine.zero_stage() >= 3) {
    w = Tensor::zeros({model.flat_size()}, DType::f32, MemCategory::workspace);
    engine.gather_full_params(w);
  }
  // Every rank holds its whole moments under ZeRO-0, so rank 0 copies them straight from the
  // optimizer (no flat intermediate: the copy is what an asynchronous save stalls training for).
  const bool direct = engine.zero_stage() == 0 && !mp.whole_layout;
  Tensor m, v;
  if (!direct) {
    m = Tensor::zeros({model.flat_size()}, DType::f32, MemCategory::workspace);
    v = Tensor::zeros({model.flat_size()}, DType::f32, MemCategory::workspace);
    engine.gather_full_moments(m, v);
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
      for (const auto& a : engine.optimizers()) {
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
  s.run_id = save.run_id;
  s.onebit_files = engine.onebit().empty() ? 0 : mesh.world().size();
  json state = {{"step", step}, {"optimizer_steps", engine.optimizer_steps()},
                {"dp_size", engine.group().size()}, {"zero_stage", engine.zero_stage()},
                {"layout", mp.layout}, {"data_parallel_only", mp.data_parallel_only},
                {"tokenizer", save.tokenizer}, {"run_id", save.run_id},
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
    manifest.write(io::kTrainingCheckpointFormat, io::kTrainingCheckpointVersion, {{"step", s.step}, {"model", s.model_name}});
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
  prune_checkpoints(dir, s.run_id, s.step, s.keep_last);
  return final_dir.string();
}

std::string save_checkpoint(const std::string& dir, int64_t step, const model::Decoder& model,
                            const parallel::DataParallel& engine, const SaveOptions& save,
                            const ModelParallelInfo& mp) {
  LOOM_CHECK(mp.mesh, "checkpoint", "save_checkpoint needs the run's mesh");
  const comm::Group& g = mp.mesh->world();
  const bool main = g.rank() == 0;
  const fs::path final_dir = fs::path(dir) / io::checkpoint_dir_name(step);
  const fs::path tmp = tmp_dir_of(dir, step);
  const CheckpointSnapshot snap = snapshot_checkpoint(step, model, engine, save, mp);
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
  const bool onebit = !engine.onebit().empty();
  if (onebit) {  // every rank writes its own error feedback into the temporary directory
    phase([&] {
      if (main) make_tmp_dir(dir, tmp);
    });
    phase([&] {
      io::SafetensorsWriter w;
      const auto& units = model.layout().units();
      for (size_t i = 0; i < units.size(); ++i) {
        w.add(str_cat(units[i].name, ".onebit_worker_error"), engine.onebit()[i]->worker_error());
        w.add(str_cat(units[i].name, ".onebit_server_error"), engine.onebit()[i]->server_error());
      }
      w.write((tmp / io::onebit_rank_file(g.rank())).string());
    });
  }
  phase([&] {
    if (main) write_checkpoint(dir, snap, onebit);
  });
  return final_dir.string();
}

CheckpointMeta load_checkpoint_weights(const std::string& path, model::Decoder& model, bool verified) {
  const model::CheckpointWeights w = model::read_checkpoint_weights(path, model, verified);
  return {w.step, path, "", w.run_id, 0, 0, {}};
}

// Format 1: each rank's optimizer shard, on the layout that saved it.
static void load_format1_optimizer(const std::string& path, const model::Decoder& model,
                                   parallel::DataParallel& engine, int rank, int64_t optimizer_steps) {
  auto f = io::SafetensorsFile::open((fs::path(path) / io::optimizer_rank_file(rank)).string());
  const auto& units = model.layout().units();
  for (size_t i = 0; i < units.size(); ++i) {
    auto& a = *engine.optimizers()[i];
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
                               parallel::DataParallel& engine) {
  if (engine.onebit().empty() || !fs::exists(fs::path(path) / file)) return;
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
    load(str_cat(units[i].name, ".onebit_worker_error"), engine.onebit()[i]->worker_error());
    load(str_cat(units[i].name, ".onebit_server_error"), engine.onebit()[i]->server_error());
  }
}

// "pp=1 x dp=2 x ep=1 x tp=2, stages [0,4) zero_stage=1": what resharding compares.
static std::string layout_with_stage(const std::string& layout, int dp, int stage) {
  return str_cat(layout.empty() ? str_cat("dp=", dp) : layout, " zero_stage=", stage);
}

CheckpointMeta load_checkpoint(const std::string& path, model::Decoder& model, parallel::DataParallel& engine,
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
  const std::string mine = layout_with_stage(mp.layout, engine.group().size(), engine.zero_stage());
  const bool same_layout = saved == mine;
  const int version = io::manifest_version(path);
  LOOM_CHECK(version >= 2 || same_layout, "checkpoint", path, " is a format-1 checkpoint (per-rank optimizer shards) saved with ",
             saved, "; this run has ", mine, ". Format 1 resumes only on the layout that saved it: resume there once "
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
    engine.load_full_params(flat);
    if (version < 2) {
      load_format1_optimizer(path, model, engine, g.rank(), optimizer_steps);
      load_onebit_errors(path, io::optimizer_rank_file(g.rank()), model, engine);
      return;
    }
    Tensor v = Tensor::zeros({model.flat_size()}, DType::f32, MemCategory::workspace);
    load_whole(io::kExpAvgFile, flat);
    load_whole(io::kExpAvgSqFile, v);
    engine.load_full_moments(flat, v, optimizer_steps);
    if (same_layout) load_onebit_errors(path, io::onebit_rank_file(g.rank()), model, engine);
  });
  model::restore_router_bias(state, model);
  CheckpointMeta meta{state.at("step").get<int64_t>(), path, same_layout ? "" : saved, state.value("run_id", ""),
                      state.value("loss_scale", 0.0), state.value("loss_scale_clean_steps", int64_t(0)), {}};
  if (state.contains("data_position") && state["data_position"].contains("skipped_windows"))
    meta.skipped_windows =
        state["data_position"]["skipped_windows"].get<std::vector<std::pair<int64_t, int64_t>>>();
  return meta;
}

}  // namespace loom::train

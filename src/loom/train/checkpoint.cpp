#include "loom/train/checkpoint.h"

#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <map>
#include <optional>
#include <vector>

#include <nlohmann/json.hpp>
#include <yaml-cpp/yaml.h>

#include "loom/io/checksum.h"
#include "loom/io/file.h"
#include "loom/io/manifest.h"
#include "loom/io/safetensors.h"
#include "loom/model/hf_weights.h"
#include "loom/comm/group.h"
#include "loom/parallel/model_gather.h"
#include "loom/train/checkpoint_dir.h"
#include "loom/train/train_config.h"

namespace loom::train {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

constexpr int kFormatVersion = 1;

std::string rank_str(int r) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "%05d", r);
  return buf;
}

std::string step_name(int64_t step) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "step_%06lld", (long long)step);
  return buf;
}

}  // namespace

int64_t checkpoint_step_of(const std::string& path) {
  const std::string name = fs::path(path).filename().string();
  if (name.rfind("step_", 0) != 0 || name.size() <= 5) return -1;
  for (size_t i = 5; i < name.size(); ++i)
    if (name[i] < '0' || name[i] > '9') return -1;
  return std::stoll(name.substr(5));
}

static int first_failing_rank(const comm::Group& g, bool ok) {
  if (g.size() == 1) return ok ? -1 : 0;
  Tensor r = Tensor::zeros({1}, DType::f64, MemCategory::comm);
  r.data<double>()[0] = ok ? double(g.size()) : double(g.rank());
  g.all_reduce(r, comm::ReduceOp::min);
  const int first = int(r.data<double>()[0]);
  return first < g.size() ? first : -1;
}

// Throws on every rank when `ok` is false on any, so that none goes on into collectives its
// peers never reach: the first failing rank with its own reason, the others naming it.
static void throw_unless_ok_everywhere(const comm::Group& g, bool ok, const std::string& why,
                                       const std::string& what, const std::string& fix = "") {
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

static std::string optimizer_file(int rank) { return str_cat("optimizer.rank", rank_str(rank), ".safetensors"); }

std::string save_checkpoint(const std::string& dir, int64_t step, const model::Decoder& model,
                            const parallel::DataParallel& engine, const Tensor& full_params,
                            const SaveOptions& save, const ModelParallelInfo& mp) {
  const comm::Group& g = mp.world ? *mp.world : engine.group();
  const bool main = g.rank() == 0;
  const fs::path final_dir = fs::path(dir) / step_name(step);
  const fs::path tmp = fs::path(dir) / str_cat(".tmp.", step_name(step));
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
  phase([&] {
    if (!main) return;
    std::error_code ec;
    fs::create_directories(dir, ec);
    LOOM_CHECK(!ec, "checkpoint", "cannot create ", dir, ": ", ec.message());
    fs::remove_all(tmp, ec);
    fs::create_directories(tmp, ec);
    LOOM_CHECK(!ec, "checkpoint", "cannot create ", tmp.string(), ": ", ec.message());
  });
  phase([&] {  // every rank: its optimizer chunks, one pair of moments per unit
    io::SafetensorsWriter w;
    const auto& units = model.layout().units();
    for (size_t i = 0; i < units.size(); ++i) {
      const auto& a = *engine.optimizers()[i];
      w.add(str_cat(units[i].name, ".exp_avg"), a.exp_avg());
      w.add(str_cat(units[i].name, ".exp_avg_sq"), a.exp_avg_sq());
      w.set_metadata(str_cat(units[i].name, ".range"), str_cat(a.begin(), ":", a.end()));
      if (!engine.onebit().empty()) {  // 1-bit Adam's error feedback, this rank's own
        w.add(str_cat(units[i].name, ".onebit_worker_error"), engine.onebit()[i]->worker_error());
        w.add(str_cat(units[i].name, ".onebit_server_error"), engine.onebit()[i]->server_error());
      }
    }
    w.set_metadata("optimizer_steps", std::to_string(engine.optimizer_steps()));
    w.set_metadata("dp_size", std::to_string(engine.group().size()));
    w.set_metadata("zero_stage", std::to_string(engine.zero_stage()));
    w.write((tmp / optimizer_file(g.rank())).string());
  });
  phase([&] {
    if (!main) return;
    io::ManifestWriter manifest(tmp.string());
    auto record = [&](const std::string& name) { manifest.record(name); };
    model::save_hf_safetensors(mp.whole_layout ? *mp.whole_layout : model.layout(), full_params,
                               (tmp / "model.safetensors").string());
    record("model.safetensors");
    io::write_file_atomic((tmp / "config.json").string(), model::hf_config_json(model.config()));
    record("config.json");
    for (int r = 0; r < g.size(); ++r) record(optimizer_file(r));
    json state = {{"step", step}, {"optimizer_steps", engine.optimizer_steps()},
                  {"dp_size", engine.group().size()}, {"zero_stage", engine.zero_stage()},
                  {"layout", mp.layout}, {"data_parallel_only", mp.data_parallel_only},
                  {"tokenizer", save.tokenizer}, {"run_id", save.run_id},
                  // Batches are a pure function of (data.seed, step): the step is the position.
                  {"data_position", {{"step", step}}}};
    if (save.loss_scale > 0) {
      state["loss_scale"] = save.loss_scale;
      state["loss_scale_clean_steps"] = save.loss_scale_clean_steps;
    }
    if (model.router_bias().defined()) {  // MoE balancing biases: what an exact resume needs
      const Tensor& b = model.router_bias();
      state["router_bias"] = std::vector<float>(b.data<float>(), b.data<float>() + b.numel());
    }
    io::write_file_atomic((tmp / "trainer_state.json").string(), state.dump(2));
    record("trainer_state.json");
    io::write_file_atomic((tmp / "config.yaml").string(), save.config_yaml);
    record("config.yaml");
    manifest.write(io::kTrainingCheckpointFormat, kFormatVersion, {{"step", step}, {"model", model.config().name}});
    io::fsync_dir(tmp.string());
    std::error_code ec;
    fs::remove_all(final_dir, ec);  // an older save of the same step (e.g. after a crash)
    fs::rename(tmp, final_dir, ec);
    LOOM_CHECK(!ec, "checkpoint", "cannot rename ", tmp.string(), " to ", final_dir.string(), ": ",
               ec.message());
    io::fsync_dir(dir);
    io::write_file_atomic((fs::path(dir) / "latest").string(), step_name(step) + "\n");
    prune_checkpoints(dir, save.run_id, step, save.keep_last);
  });
  return final_dir.string();
}

static bool in_scope(const std::string& file, const VerifyScope& scope) {
  if (scope.all) return true;
  if (!file.starts_with("optimizer.rank")) return true;
  for (int r : scope.optimizer_ranks)
    if (file == optimizer_file(r)) return true;
  return false;
}

bool verify_checkpoint(const std::string& path, std::string* why, const VerifyScope& scope) {
  return io::verify_manifest(path, io::kTrainingCheckpointFormat, kFormatVersion, why,
                             [&](const std::string& name) { return in_scope(name, scope); });
}

std::optional<std::string> find_latest_valid_checkpoint(const std::string& dir, FILE* log,
                                                        const VerifyScope& scope,
                                                        const comm::Group* agree) {
  return find_latest_valid_checkpoint(dir, log, [&](const std::string&) { return scope; }, agree);
}

std::optional<std::string> find_latest_valid_checkpoint(
    const std::string& dir, FILE* log, const std::function<VerifyScope(const std::string&)>& scope_of,
    const comm::Group* agree) {
  const bool collective = agree && agree->size() > 1;  // ranks agree on each candidate
  const auto candidates = resume_candidates(dir);
  for (size_t i = 0;; ++i) {
    const int64_t step = i < candidates.size() ? candidates[i].step : -1;
    if (collective) {  // every rank must be looking at the same candidate (or all at none)
      Tensor s = Tensor::zeros({2}, DType::f64, MemCategory::comm);
      s.data<double>()[0] = double(step);
      s.data<double>()[1] = -double(step);
      agree->all_reduce(s, comm::ReduceOp::min);
      const int64_t lo = int64_t(s.data<double>()[0]), hi = -int64_t(s.data<double>()[1]);
      LOOM_CHECK(lo == hi, "resume", "ranks see different checkpoints in ", dir, " (step ", hi, " on one, ",
                 lo < 0 ? std::string("none") : std::to_string(lo),
                 " on another); checkpoint.dir must be a directory every rank shares");
    }
    if (step < 0) return std::nullopt;
    const std::string p = candidates[i].path;
    std::string why;
    bool ok = verify_checkpoint(p, &why, scope_of(p));
    if (collective) {
      const int bad = first_failing_rank(*agree, ok);
      if (bad == agree->rank() && bad != 0)  // only rank 0 logs; only this rank knows why
        std::fprintf(stderr, "[resume] rank %d: %s failed verification: %s\n", bad, p.c_str(), why.c_str());
      if (bad > 0 && agree->rank() != bad) why = str_cat("rank ", bad, "'s files failed verification (its reason is in its log)");
      ok = bad < 0;
    }
    if (ok) return p;
    if (log) std::fprintf(log, "[resume] skipping %s: %s\n", p.c_str(), why.c_str());
  }
}

// MoE selection biases (model.moe.bias_update_rate): a checkpoint without them starts them at 0.
static void restore_router_bias(const json& state, model::Decoder& model) {
  if (model.router_bias().defined() && state.contains("router_bias"))
    model.set_router_bias(state.at("router_bias").get<std::vector<float>>());
}

CheckpointMeta load_checkpoint_weights(const std::string& path, model::Decoder& model, bool verified) {
  std::string why;
  LOOM_CHECK(verified || verify_checkpoint(path, &why, VerifyScope::weights()), "checkpoint", path,
             " failed verification: ", why);
  model::load_hf_safetensors(model, (fs::path(path) / "model.safetensors").string());
  const json state = json::parse(io::read_file((fs::path(path) / "trainer_state.json").string()));
  restore_router_bias(state, model);
  return {state.at("step").get<int64_t>(), path, "", state.value("run_id", "")};
}

namespace {

// Where one unit's Adam moments lie in the saved shards: the unit-local element ranges each
// saved rank holds (ZeRO-0: every rank the whole unit, so one reader per new rank suffices).
struct SavedChunk {
  int rank;
  int64_t local_begin, local_end;
};

// The saved ranks whose chunks of unit `u` overlap unit-local [a, b), with their ranges.
std::vector<SavedChunk> saved_chunks(const model::ParamUnit& old_unit, int saved_dp, int saved_stage,
                                     int64_t a, int64_t b, int my_rank) {
  std::vector<SavedChunk> out;
  const int64_t size = old_unit.size();
  if (saved_stage == 0) {
    out.push_back({my_rank % saved_dp, 0, size});  // spread the reads over the saved files
    return out;
  }
  const int64_t chunk = size / saved_dp;
  for (int r = 0; r < saved_dp; ++r) {
    const int64_t lo = r * chunk, hi = lo + chunk;
    if (lo < b && a < hi) out.push_back({r, lo, hi});
  }
  return out;
}

// A layout string of a purely data-parallel run ("pp=1 x dp=4 x ep=1 x tp=1, stages ..."), for
// checkpoints saved before trainer_state.json recorded data_parallel_only.
bool layout_is_data_parallel_only(const std::string& layout) {
  return layout.starts_with("pp=1 x dp=") && layout.find(" x ep=1 x tp=1") != std::string::npos;
}

// What loading a checkpoint means on this rank: the saved state, whether the optimizer state is
// resharded (and from which saved layout), the optimizer shards read, or why it is refused.
struct LoadPlan {
  json state;
  int saved_dp = 1, saved_stage = 0;
  bool reshard = false;
  std::optional<model::ParamLayout> saved_units;  // the saved flat geometry, when resharding
  std::vector<int> shards;
  std::string refusal;  // non-empty: this run cannot load it
};

LoadPlan plan_load(const std::string& path, const model::Decoder& model, const parallel::DataParallel& engine,
                   const ModelParallelInfo& mp) {
  const comm::Group& g = mp.world ? *mp.world : engine.group();
  LoadPlan p;
  p.state = json::parse(io::read_file((fs::path(path) / "trainer_state.json").string()));
  p.saved_dp = p.state.value("dp_size", 1);
  p.saved_stage = p.state.value("zero_stage", 0);
  const int dp = engine.group().size(), stage = engine.zero_stage();
  const std::string saved_layout = p.state.value("layout", "");
  const bool same = p.saved_dp == dp && p.saved_stage == stage &&
                    (saved_layout.empty() || mp.layout.empty() || saved_layout == mp.layout);
  // Resharding: both runs purely data parallel (the world is the dp group, every rank holds
  // the whole model and its flat layout differs only in the units' padding).
  const bool saved_dp_only = p.state.contains("data_parallel_only") ? p.state["data_parallel_only"].get<bool>()
                                                                     : layout_is_data_parallel_only(saved_layout);
  p.reshard = !same && saved_dp_only && mp.data_parallel_only && p.saved_dp >= 1;
  p.shards = {g.rank()};
  if (!same && !p.reshard) {
    p.refusal = str_cat(path, " was saved with ", saved_layout.empty() ? "an unrecorded layout" : saved_layout,
                        " (dp=", p.saved_dp, " zero_stage=", p.saved_stage, "); this run has ",
                        mp.layout.empty() ? "an unrecorded layout" : mp.layout, " (dp=", dp, " zero_stage=", stage,
                        "). Resharding on load covers the dp size and the ZeRO stage of purely data-parallel "
                        "runs; resume with the saved pipeline and tensor-parallel layout");
    return p;
  }
  if (!p.reshard) return p;
  p.saved_units.emplace(model.config(), p.saved_dp);
  const auto& units = model.layout().units();
  p.shards.clear();
  for (size_t i = 0; i < units.size(); ++i) {
    const auto& a = *engine.optimizers()[i];
    for (const SavedChunk& c : saved_chunks(p.saved_units->units()[i], p.saved_dp, p.saved_stage,
                                            a.begin() - units[i].begin, a.end() - units[i].begin, g.rank()))
      if (std::find(p.shards.begin(), p.shards.end(), c.rank) == p.shards.end()) p.shards.push_back(c.rank);
  }
  return p;
}

}  // namespace

VerifyScope checkpoint_load_scope(const std::string& path, const model::Decoder& model,
                                  const parallel::DataParallel& engine, const ModelParallelInfo& mp) {
  const comm::Group& g = mp.world ? *mp.world : engine.group();
  try {
    return {false, plan_load(path, model, engine, mp).shards};
  } catch (const std::exception&) {
    return VerifyScope::rank(g.rank());  // an unreadable state: its checksum will say so
  }
}

CheckpointMeta load_checkpoint(const std::string& path, model::Decoder& model,
                               parallel::DataParallel& engine, const ModelParallelInfo& mp,
                               bool verified) {
  const comm::Group& g = mp.world ? *mp.world : engine.group();
  LOOM_CHECK(io::manifest_format(path) != io::kQuantizedCheckpointFormat, "checkpoint", path,
             " is a quantized inference checkpoint (loom quantize): it holds no optimizer state, so --resume "
             "cannot continue from it; resume from the training checkpoint it was made from (its manifest.json "
             "names it as \"source\")");
  LoadPlan plan;
  std::string plan_error;
  try {
    plan = plan_load(path, model, engine, mp);
  } catch (const std::exception& e) {
    plan_error = e.what();  // a damaged trainer_state.json: verification below names the file
  }
  if (!plan_error.empty() || !verified) {  // each rank its files; all fail together when one does
    std::string why;
    const bool ok = verify_checkpoint(path, &why, {false, plan_error.empty() ? plan.shards : std::vector<int>{g.rank()}});
    throw_unless_ok_everywhere(g, ok, why, path + " failed verification",
                               "; resume from an earlier checkpoint (--resume auto takes the newest valid one)");
    LOOM_CHECK(plan_error.empty(), "checkpoint", path, ": trainer_state.json: ", plan_error);
  }
  LOOM_CHECK(plan.refusal.empty(), "checkpoint", plan.refusal);
  const json& state = plan.state;
  Tensor flat = Tensor::zeros({model.flat_size()}, DType::f32, MemCategory::workspace);
  const std::string weights = (fs::path(path) / "model.safetensors").string();
  if (mp.whole_layout) {  // the whole model on disk; this rank takes its slice
    Tensor whole = Tensor::zeros({mp.whole_layout->total()}, DType::f32, MemCategory::workspace);
    model::load_hf_safetensors(model.config(), *mp.whole_layout, whole, weights);
    parallel::slice_whole_params(*mp.whole_layout, whole, model.layout(), flat);
  } else {
    model::load_hf_safetensors(model.config(), model.layout(), flat, weights);
  }
  engine.load_full_params(flat);
  restore_router_bias(state, model);
  const int64_t optimizer_steps = state.at("optimizer_steps").get<int64_t>();
  const auto& units = model.layout().units();
  on_every_rank_or_none(g, str_cat("loading the optimizer state of ", path, " failed"), [&] {
    if (!plan.reshard) {
      auto f = io::SafetensorsFile::open((fs::path(path) / optimizer_file(g.rank())).string());
      for (size_t i = 0; i < units.size(); ++i) {
        auto& a = *engine.optimizers()[i];
        Tensor m = f.get(str_cat(units[i].name, ".exp_avg")), v = f.get(str_cat(units[i].name, ".exp_avg_sq"));
        LOOM_CHECK(m.numel() == a.exp_avg().numel(), "checkpoint", path, ": ", units[i].name,
                   " optimizer state has ", m.numel(), " elements, this run expects ", a.exp_avg().numel());
        a.exp_avg().copy_from(m);
        a.exp_avg_sq().copy_from(v);
        a.set_step_count(optimizer_steps);
      }
      if (!engine.onebit().empty()) {  // absent when the run was AdamW: the errors start at zero
        std::vector<std::string> names = f.names();
        auto load = [&](const std::string& name, const Tensor& into) {
          if (std::find(names.begin(), names.end(), name) == names.end()) return;
          Tensor t = f.get(name);
          LOOM_CHECK(t.numel() == into.numel(), "checkpoint", path, ": ", name, " has ", t.numel(),
                     " elements, this run expects ", into.numel());
          into.copy_from(t);
        };
        for (size_t i = 0; i < units.size(); ++i) {
          load(str_cat(units[i].name, ".onebit_worker_error"), engine.onebit()[i]->worker_error());
          load(str_cat(units[i].name, ".onebit_server_error"), engine.onebit()[i]->server_error());
        }
      }
      return;
    }
    // Unit-local element j is the same parameter element in both layouts (padding sits at each
    // unit's end); this rank's new chunk of unit i is filled from the saved chunks overlapping it.
    std::map<int, io::SafetensorsFile> files;
    for (int r : plan.shards)
      files.emplace(r, io::SafetensorsFile::open((fs::path(path) / optimizer_file(r)).string()));
    for (size_t i = 0; i < units.size(); ++i) {
      auto& a = *engine.optimizers()[i];
      const int64_t lo = a.begin() - units[i].begin, hi = a.end() - units[i].begin;
      const model::ParamUnit& old_unit = plan.saved_units->units()[i];
      LOOM_CHECK(old_unit.name == units[i].name, "checkpoint", path, ": unit ", i, " is ", old_unit.name,
                 " there and ", units[i].name, " here");
      a.exp_avg().zero();
      a.exp_avg_sq().zero();
      for (const SavedChunk& c : saved_chunks(old_unit, plan.saved_dp, plan.saved_stage, lo, hi, g.rank())) {
        const io::SafetensorsFile& f = files.at(c.rank);
        Tensor m = f.get(str_cat(units[i].name, ".exp_avg")), v = f.get(str_cat(units[i].name, ".exp_avg_sq"));
        LOOM_CHECK(m.numel() == c.local_end - c.local_begin, "checkpoint", path, ": ", optimizer_file(c.rank),
                   " holds ", m.numel(), " elements of ", units[i].name, ", dp=", plan.saved_dp, " zero_stage=",
                   plan.saved_stage, " means ", c.local_end - c.local_begin);
        const int64_t from = std::max(lo, c.local_begin), to = std::min(hi, c.local_end);
        if (to <= from) continue;  // a saved unit shorter than where this chunk starts
        std::copy_n(m.data<float>() + (from - c.local_begin), to - from, a.exp_avg().data<float>() + (from - lo));
        std::copy_n(v.data<float>() + (from - c.local_begin), to - from, a.exp_avg_sq().data<float>() + (from - lo));
      }
      a.set_step_count(optimizer_steps);
    }
  });
  return {state.at("step").get<int64_t>(), path,
          plan.reshard ? str_cat("dp=", plan.saved_dp, " zero_stage=", plan.saved_stage) : "",
          state.value("run_id", ""), state.value("loss_scale", 0.0), state.value("loss_scale_clean_steps", int64_t(0))};
}

std::string checkpoint_tokenizer(const std::string& path) {
  const json state = json::parse(io::read_file((fs::path(path) / "trainer_state.json").string()));
  const std::string recorded = state.value("tokenizer", "");
  if (!recorded.empty()) return recorded;
  return checkpoint_model_config(path).vocab_size == 256 ? "byte" : "gpt2";
}

std::string resolve_checkpoint(const std::string& dir, FILE* log) {
  if (fs::exists(fs::path(dir) / "manifest.json")) {
    std::string why;
    LOOM_CHECK(verify_checkpoint(dir, &why, VerifyScope::weights()), "checkpoint", dir,
               " failed verification: ", why);
    return dir;
  }
  LOOM_CHECK(fs::is_directory(dir), "checkpoint", dir, " does not exist");
  auto found = find_latest_valid_checkpoint(dir, log, VerifyScope::weights());
  LOOM_CHECK(found.has_value(), "checkpoint", "no valid checkpoint in ", dir,
             " (expected a step_NNNNNN directory with a manifest.json, or a run directory holding them)");
  return *found;
}

model::ModelConfig checkpoint_model_config(const std::string& path) {
  // config.json records the exact sizes (a preset named in config.yaml could change later).
  model::ModelConfig c = model::read_hf_config((fs::path(path) / "config.json").string());
  // The name users know the model by: the preset it was trained from, when there was one.
  c.name = "custom";
  try {
    const YAML::Node y = YAML::LoadFile((fs::path(path) / "config.yaml").string());
    if (y["model"] && y["model"]["preset"]) c.name = y["model"]["preset"].as<std::string>();
  } catch (const YAML::Exception&) {
  }
  return c;
}

}  // namespace loom::train

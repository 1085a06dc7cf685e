// `loom train CONFIG.yaml [--set key=value]... [--resume auto|DIR] [--metrics FILE]
// [--overwrite-checkpoints]`.
#include <algorithm>
#include <cstdio>

#include <nlohmann/json.hpp>

#include "loom/comm/launch.h"
#include "loom/comm/world.h"
#include "loom/parallel/mesh.h"
#include "loom/train/dataset_source.h"
#include "loom/train/trainer.h"
#include "tools/loom/commands.h"

namespace loom::cli {

namespace {

const char* kHelp =
    "usage: loom train CONFIG.yaml [--set key=value]... [--resume auto|DIR] [--metrics FILE]\n"
    "                  [--overwrite-checkpoints]\n\n"
    "Trains a model as the YAML config says (see docs/CONFIG.md and configs/).\n"
    "  --set key=value   override a config key, e.g. --set optim.lr=3e-4 (repeatable)\n"
    "  --resume auto     continue from the latest valid checkpoint in checkpoint.dir\n"
    "  --resume DIR      continue from that checkpoint directory\n"
    "  --metrics FILE    JSONL metrics, one object per logged step (= log.metrics_path)\n"
    "  --overwrite-checkpoints  a run from step 0 deletes the checkpoints already in\n"
    "                    checkpoint.dir (without it, such a run refuses to start)\n"
    "The last line is SUMMARY {json}.\n";

}  // namespace

int cmd_train(const std::vector<std::string>& argv) {
  Args a("train", argv, {{"set", Args::kRepeated}, {"resume", true}, {"metrics", true}, {"overwrite-checkpoints", false},
                          {"help", false}});
  if (a.has("help")) {
    std::printf("%s", kHelp);
    return 0;
  }
  if (a.positional().size() != 1) throw UsageError(std::string("[train] expected one CONFIG.yaml\n\n") + kHelp);
  std::vector<std::string> sets = a.get_all("set");
  if (a.has("metrics")) sets.push_back("log.metrics_path=" + a.get("metrics", ""));
  // parallel.dp=auto (what `loom launch --min-nproc` passes once it runs on fewer ranks): the
  // launched ranks over pp x ep x tp. data.batch_size is global, so each rank's share grows and
  // gradient accumulation keeps the batch (and the loss curve) as it was.
  if (auto it = std::find(sets.begin(), sets.end(), "parallel.dp=auto"); it != sets.end()) {
    sets.erase(it);
    const train::TrainConfig probe = train::load_train_config(a.positional()[0], sets);
    const int64_t per = probe.parallel.pp * probe.parallel.ep * probe.parallel.tp;
    const int ranks = comm::launch_env().world_size;
    LOOM_CHECK(ranks % per == 0, "config", "parallel.dp=auto: ", ranks, " ranks are not a multiple of pp x ep x tp = ",
               per, "; launch a multiple of ", per, " ranks");
    sets.push_back(str_cat("parallel.dp=", ranks / per));
  }
  train::TrainConfig cfg = train::load_train_config(a.positional()[0], sets);
  // One process, or one rank of an MPI job (mpirun / loom launch): the World decides.
  comm::WorldOptions wo;
  // The watchdog timeout: --set over LOOM_COMM_TIMEOUT (what `loom launch --timeout` sets)
  // over the YAML. cfg already holds a --set value, since --set overrides the file.
  const double config_timeout = cfg.parallel.collective_timeout_s;
  std::optional<double> set_timeout;
  for (const auto& s : sets)
    if (s.rfind("parallel.collective_timeout_s=", 0) == 0) set_timeout = config_timeout;
  const comm::TimeoutChoice timeout =
      comm::resolve_watchdog_timeout(set_timeout, std::getenv("LOOM_COMM_TIMEOUT"), config_timeout);
  wo.watchdog_timeout_s = timeout.seconds;
  wo.algorithm = cfg.comm.algorithm;
  wo.calibration = cfg.comm.calibration;
  comm::World world(wo);
  if (world.rank() == 0) {
    std::string from = timeout.source == "command line" ? "--set parallel.collective_timeout_s"
                       : timeout.source == "config"     ? "parallel.collective_timeout_s in the config"
                                                        : timeout.source;
    std::string value = timeout.seconds > 0 ? str_cat(timeout.seconds, " s") : std::string("off");
    std::printf("[train] collective timeout %s (from %s)\n", value.c_str(), from.c_str());
    if (world.size() > 1)
      std::printf("[train] %d ranks on %d host%s; collectives: %s (cost model: %s)\n", world.size(),
                  world.group().hosts(), world.group().hosts() > 1 ? "s" : "", comm::algorithm_name(world.group().algorithm()),
                  world.cost_model().source.c_str());
    std::fflush(stdout);
  }
  const auto& p = cfg.parallel;
  parallel::Mesh mesh(world.group(), parallel::MeshShape(p.pp, p.dp, p.ep, p.tp, parallel::parse_mesh_order(p.order)));
  if (world.rank() == 0 && world.group().hosts() > 1)
    for (parallel::Dim d : {parallel::Dim::tp, parallel::Dim::ep})
      if (mesh.group(d).hosts() > 1)
        std::printf("[train] warning: the %s group of rank 0 spans %d hosts, so its per-layer collectives cross the "
                    "link between hosts; put %s innermost in parallel.order (%s) and keep parallel.%s within one "
                    "host's ranks\n",
                    parallel::dim_name(d), mesh.group(d).hosts(), parallel::dim_name(d), p.order.c_str(),
                    parallel::dim_name(d));
  const bool main_rank = world.rank() == 0;
  train::DatasetSource data(cfg, main_rank ? stdout : nullptr);  // one rank reports slow shard checks
  train::TrainerOptions opt;
  opt.resume = a.get("resume", "");
  opt.overwrite_checkpoints = a.has("overwrite-checkpoints");
  opt.mesh = &mesh;
  FILE* devnull = main_rank ? nullptr : std::fopen("/dev/null", "w");
  if (!main_rank) opt.log = devnull;
  train::TrainResult r;
  {
    train::Trainer trainer(cfg, data, opt);
    r = trainer.run();
  }
  if (devnull) std::fclose(devnull);
  if (!main_rank) return 0;
  nlohmann::json s = {{"steps", r.steps}, {"final_train_loss", r.final_train_loss},
                      {"final_val_loss", r.final_val_loss < 0 ? nlohmann::json(nullptr) : nlohmann::json(r.final_val_loss)},
                      {"tokens_per_s", r.tokens_per_s}, {"peak_bytes", r.peak_bytes},
                      {"checkpoint", r.last_checkpoint}, {"skipped_steps", r.skipped_steps},
                      {"nonfinite_steps", r.nonfinite_steps}, {"rollbacks", r.rollbacks},
                      {"checkpoint_stall_s", r.checkpoint_stall_s}};
  std::printf("SUMMARY %s\n", s.dump().c_str());
  return 0;
}

}  // namespace loom::cli

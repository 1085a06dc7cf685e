// `loom train CONFIG.yaml [--set key=value]... [--resume auto|DIR] [--metrics FILE]
// [--metrics-port P [--metrics-host ADDR]] [--overwrite-checkpoints]`; options in cmd_train.
#include <algorithm>
#include <cstdio>
#include <memory>

#include <nlohmann/json.hpp>

#include "loom/comm/launch.h"
#include "loom/comm/world.h"
#include "loom/core/exit_status.h"
#include "loom/net/http_server.h"
#include "loom/net/metrics.h"
#include "loom/parallel/mesh.h"
#include "loom/train/dataset_source.h"
#include "loom/train/init_from.h"
#include "loom/train/trainer.h"
#include "tools/loom/commands.h"

namespace loom::cli {

namespace {

// `--metrics-port`: the trainer's logged figures as Prometheus series on an HTTP endpoint that
// lives as long as the process. Gauges hold the last logged step's figures; counters only grow.
class TrainMetricsEndpoint {
 public:
  TrainMetricsEndpoint(const std::string& host, int port) {
    net::HttpServerOptions o;
    o.host = host;
    o.port = port;
    o.max_connections = 16;
    o.access_log = false;  // a line per scrape would drown the training log
    registry_.gauge("loom_train_step", "the last logged training step").set(0);  // before the first step
    server_ = std::make_unique<net::HttpServer>(o, [this](net::HttpExchange& ex) { handle(ex); });
    try {
      server_->start();
    } catch (const Error& e) {
      fail("train", "--metrics-port ", port, " is not available (", e.what(),
           "); pick another --metrics-port, or 0 for a free one");
    }
  }
  ~TrainMetricsEndpoint() { server_->stop(); }
  int port() const { return server_->port(); }

  train::TrainObserver observer() {
    return {[this](const train::LoggedStep& s) { on_step(s); },
            [this](int64_t, double v) { registry_.gauge("loom_train_val_loss", "the last validation loss").set(v); }};
  }

 private:
  void handle(net::HttpExchange& ex) {
    net::HttpResponse r;
    if (ex.request().path == "/metrics" && ex.request().method == "GET") {
      r.content_type = "text/plain; version=0.0.4; charset=utf-8";
      r.body = registry_.render();
    } else {
      r.status = 404;
      r.content_type = "text/plain";
      r.body = "loom train serves GET /metrics only\n";
    }
    ex.respond(r);
  }

  // Counters move by what a cumulative count grew since the last logged step.
  void advance(const char* name, const char* help, int64_t total, int64_t& last) {
    registry_.counter(name, help).inc(double(std::max<int64_t>(0, total - last)));
    last = std::max(last, total);
  }

  void on_step(const train::LoggedStep& s) {
    auto& r = registry_;
    r.gauge("loom_train_step", "the last logged training step").set(double(s.step));
    r.gauge("loom_train_total_steps", "schedule.steps of the run").set(double(s.total_steps));
    r.gauge("loom_train_loss", "train loss of the last logged step").set(s.loss);
    r.gauge("loom_train_learning_rate", "learning rate of the last logged step").set(s.lr);
    r.gauge("loom_train_grad_norm", "global gradient norm before clipping").set(s.grad_norm);
    r.gauge("loom_train_tokens_per_second", "training throughput over the logging window").set(s.tokens_per_s);
    r.gauge("loom_train_mfu", "model FLOPs utilisation (0-1) over the logging window").set(s.mfu);
    r.gauge("loom_train_step_seconds", "mean step time over the logging window").set(s.ms_per_step / 1e3);
    r.gauge("loom_train_exposed_comm_seconds",
            "per step, time the training thread waited on communication (mean over the logging window)")
        .set(s.exposed_comm_ms / 1e3);
    for (const train::CategoryBytes& c : s.memory) {
      r.gauge("loom_train_memory_bytes", "rank 0's allocated bytes by category", {{"category", c.category}})
          .set(double(c.current));
      r.gauge("loom_train_memory_peak_bytes", "rank 0's peak allocated bytes by category", {{"category", c.category}})
          .set(double(c.peak));
    }
    r.counter("loom_train_tokens_total", "tokens trained by this process").inc(double(s.window_tokens));
    advance("loom_train_skipped_steps_total", "steps whose update was skipped (overflow, non-finite)",
            std::max(s.skipped_steps, s.nonfinite_steps), skipped_);
    advance("loom_train_nonfinite_steps_total", "steps skipped by the non-finite guard", s.nonfinite_steps, nonfinite_);
    advance("loom_train_rollbacks_total", "loss-spike rollbacks to a checkpoint", s.rollbacks, rollbacks_);
    advance("loom_train_spikes_total", "loss spikes detected (guard.spike_z), rolled back or not", s.spikes, spikes_);
  }

  net::MetricsRegistry registry_;
  std::unique_ptr<net::HttpServer> server_;
  int64_t skipped_ = 0, nonfinite_ = 0, rollbacks_ = 0, spikes_ = 0;
};

}  // namespace

int cmd_train(const std::vector<std::string>& argv) {
  auto app = new_app("train",
                     "Trains a model as the YAML config says (see docs/CONFIG.md and configs/). "
                     "The last line is SUMMARY {json}.");
  std::string config, resume, metrics, metrics_host = "127.0.0.1";
  std::vector<std::string> sets;
  int64_t metrics_port = 0;
  bool overwrite_checkpoints = false;
  app->add_option("CONFIG", config, "the YAML config")->required()->type_name("FILE");
  app->add_option("--set", sets, "override a config key, e.g. --set optim.lr=3e-4 (repeatable)")
      ->type_name("KEY=VALUE");
  app->add_option("--resume", resume,
                  "auto: continue from the latest valid checkpoint in checkpoint.dir; "
                  "DIR: from that checkpoint directory")
      ->type_name("auto|DIR");
  app->add_option("--metrics", metrics, "JSONL metrics, one object per logged step (= log.metrics_path)")
      ->type_name("FILE");
  auto* port_opt = app->add_option("--metrics-port", metrics_port,
                                   "rank 0 serves the logged figures as Prometheus gauges and counters "
                                   "(loom_train_*) at http://ADDR:P/metrics; 0 picks a free port")
                       ->check(in_range(0, 65535));
  auto* host_opt =
      app->add_option("--metrics-host", metrics_host, "the address --metrics-port listens on")->type_name("ADDR");
  app->add_flag("--overwrite-checkpoints", overwrite_checkpoints,
                "a run from step 0 deletes the checkpoints already in checkpoint.dir (without it, such a run "
                "refuses to start)");
  if (auto rc = parse(*app, argv)) return *rc;
  if (host_opt->count() && !port_opt->count())
    throw UsageError("[train] --metrics-host needs --metrics-port P (0: a free port)");
  if (!metrics.empty()) sets.push_back("log.metrics_path=" + metrics);
  // parallel.dp=auto (what `loom launch --min-nproc` passes once it runs on fewer ranks): the
  // launched ranks over pp x ep x tp. data.batch_size is global, so each rank's share grows and
  // gradient accumulation keeps the batch (and the loss curve) as it was.
  if (auto it = std::find(sets.begin(), sets.end(), "parallel.dp=auto"); it != sets.end()) {
    sets.erase(it);
    const train::TrainConfig probe = train::load_train_config(config, sets, train::init_source_config);
    const int64_t per = probe.parallel.pp * probe.parallel.ep * probe.parallel.tp;
    const int ranks = comm::launch_env().world_size;
    LOOM_CHECK(ranks % per == 0, "config", "parallel.dp=auto: ", ranks,
               " ranks are not a multiple of pp x ep x tp = ", per, "; launch a multiple of ", per, " ranks");
    sets.push_back(str_cat("parallel.dp=", ranks / per));
  }
  train::TrainConfig cfg = train::load_train_config(config, sets, train::init_source_config);
  // A job step srun started in a way it cannot run: every task fails here alike, before MPI
  // starts, so srun --kill-on-bad-exit leaves nothing running, and with the usage status, which
  // an sbatch script does not requeue (examples/slurm/train.sbatch). The mesh's own check would
  // name mpirun's fix, not sbatch's.
  if (const comm::LaunchEnv env = comm::launch_env(); env.under_srun()) {
    if (std::string problem = comm::srun_mpi_problem(env); !problem.empty()) throw UsageError("[launch] " + problem);
    const parallel::MeshShape shape = cfg.parallel.mesh();
    if (env.world_size != shape.world_size())
      throw UsageError(str_cat("[launch] srun started ", env.world_size, " tasks but ", shape.describe(), " = ",
                               shape.world_size(), " ranks; submit with sbatch --ntasks=", shape.world_size(),
                               " (or --nodes and --ntasks-per-node that multiply to it), or set parallel.* to ",
                               env.world_size, " ranks (--set parallel.dp=auto takes dp from the task count)"));
  }
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
  if (cfg.comm.algorithm) wo.algorithm = comm::algorithm_name(*cfg.comm.algorithm);
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
                  world.group().hosts(), world.group().hosts() > 1 ? "s" : "",
                  comm::algorithm_name(world.group().algorithm()), world.cost_model().source.c_str());
    std::fflush(stdout);
  }
  const auto& p = cfg.parallel;
  parallel::Mesh mesh(world.group(), p.mesh());
  if (world.rank() == 0 && world.group().hosts() > 1)
    for (parallel::Dim d : {parallel::Dim::tp, parallel::Dim::ep})
      if (mesh.group(d).hosts() > 1)
        std::printf(
            "[train] warning: the %s group of rank 0 spans %d hosts, so its per-layer collectives cross the "
            "link between hosts; put %s innermost in parallel.order (%s) and keep parallel.%s within one "
            "host's ranks\n",
            parallel::dim_name(d), mesh.group(d).hosts(), parallel::dim_name(d),
            parallel::mesh_order_name(p.order).c_str(), parallel::dim_name(d));
  const bool main_rank = world.rank() == 0;
  train::TrainerOptions opt;
  std::unique_ptr<TrainMetricsEndpoint> endpoint;
  if (main_rank && port_opt->count()) {
    const std::string& host = metrics_host;
    endpoint = std::make_unique<TrainMetricsEndpoint>(host, int(metrics_port));
    opt.observer = endpoint->observer();
    std::printf("[train] Prometheus metrics on http://%s:%d/metrics\n", host.c_str(), endpoint->port());
    std::fflush(stdout);
  }
  train::DatasetSource data(cfg, main_rank ? stdout : nullptr);  // one rank reports slow shard checks
  opt.resume = resume;
  opt.overwrite_checkpoints = overwrite_checkpoints;
  opt.mesh = &mesh;
  FILE* devnull = main_rank ? nullptr : std::fopen("/dev/null", "w");
  if (!main_rank) opt.log = devnull;
  train::TrainResult r;
  {
    train::Trainer trainer(cfg, data, opt);
    r = trainer.run();
  }
  if (devnull) std::fclose(devnull);
  // Every rank took the same decision from the same reduced losses: all exit alike, so mpirun
  // and `loom launch` see the divergence status (docs/TROUBLESHOOTING.md).
  const int status = r.ended == train::RunEnd::finished ? kExitOk : kExitDiverged;
  if (!main_rank) return status;
  nlohmann::json s = {
      {"ended", train::run_end_name(r.ended)},
      {"steps", r.steps},
      {"final_train_loss", r.final_train_loss},
      {"final_val_loss", r.final_val_loss < 0 ? nlohmann::json(nullptr) : nlohmann::json(r.final_val_loss)},
      {"tokens_per_s", r.tokens_per_s},
      {"peak_bytes", r.peak_bytes},
      {"checkpoint", r.last_checkpoint},
      {"skipped_steps", r.skipped_steps},
      {"nonfinite_steps", r.nonfinite_steps},
      {"rollbacks", r.rollbacks},
      {"spikes", r.spikes},
      {"checkpoint_stall_s", r.checkpoint_stall_s}};
  if (r.ended != train::RunEnd::finished) {
    s["last_healthy_step"] = r.last_healthy_step;
    s["reason"] = r.end_reason;
  }
  if (r.divergence_warnings > 0) s["divergence_warnings"] = r.divergence_warnings;
  std::printf("SUMMARY %s\n", s.dump().c_str());
  if (status != kExitOk)
    std::fprintf(stderr, "error: [train] %s (exit status %d: diverged)\n", r.end_reason.c_str(), status);
  return status;
}

}  // namespace loom::cli

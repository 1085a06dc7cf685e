// `loom bench pipeline`: what pipeline parallelism costs on this machine.
//   --nproc P: P stages run GPipe, 1F1B, interleaved 1F1B (v chunks per stage) and zero-bubble
//     ZB-H1 and ZB-V steps for several micro-batch counts m; per stage the idle fraction (1 - busy
//     / step time, busy: the passes and their transfer copies, PipelineStepStats) against the
//     schedule's formula ((p - 1) / (m + p - 1), interleaved (p - 1) / (v m + p - 1), ZB-H1
//     (p - 1) / (3 m + p - 1) for equal F, B and W passes, ZB-V its schedule replayed with equal
//     passes); "simulated": the schedule replayed with the mean measured F, B and W times and the
//     measured transfer time; "replayed": each step replayed with its own actions' times (what is
//     left between it and the measurement is the executor's, not the passes' unevenness); the
//     peak activation memory (GPipe keeps m micro-batches, 1F1B at most p - s on stage s) and the
//     step time. --rounds R runs each (schedule, m) R times, the schedules alternating at each m,
//     and takes medians over all timed steps.
//   --show-schedule: prints each schedule's per-stage action list (no ranks needed).
//   --balance: one process; stage balance max/mean of the uniform, parameters and profile
//     partitions, each judged by a second, independent timing of every piece.
#include <algorithm>
#include <cstdio>
#include <map>
#include <random>
#include <sstream>

#include <nlohmann/json.hpp>

#include "bench/loom/bench.h"
#include "loom/comm/launch.h"
#include "loom/comm/world.h"
#include "loom/core/stats.h"
#include "loom/core/threads.h"
#include "loom/model/decoder.h"
#include "loom/parallel/partition.h"
#include "loom/parallel/partition_profile.h"
#include "loom/parallel/pipeline.h"

namespace loom::cli {

namespace {

// The options of both modes; --batch and --seq default differently under --balance.
struct PipelineOptions {
  int64_t nproc = 0, layers = 8, d_model = 256, vocab = 512, batch = 0, seq = 0, steps = 5, warmup = 1, threads = 1,
          reps = 3, rounds = 1;
  int64_t virtual_stages = 2;
  std::string micro_batches = "1,2,4,8,16", schedules = "gpipe,1f1b,interleaved,zb1p,zbv", model = "gpt2-124m",
              stages = "2,4";
  bool balance = false, show_schedule = false;
};

std::vector<int> int_list(const std::string& s) {
  std::vector<int> out;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ','))
    if (!item.empty()) out.push_back(std::stoi(item));
  return out;
}

std::vector<std::string> str_list(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ','))
    if (!item.empty()) out.push_back(item);
  return out;
}

// A schedule of the --schedules list: gpipe, 1f1b, interleaved (1F1B over v chunks per stage), zb1p
// or zbv (2 chunks per stage in a V).
struct ScheduleChoice {
  parallel::PipeSchedule kind;
  int v;
};
ScheduleChoice schedule_choice(const std::string& name, int virtual_stages) {
  if (name == "interleaved") return {parallel::PipeSchedule::one_f_one_b, virtual_stages};
  LOOM_CHECK(name == "gpipe" || name == "1f1b" || name == "zb1p" || name == "zbv", "bench",
             "--schedules: expected gpipe, 1f1b, interleaved, zb1p or zbv, got \"", name, "\"");
  const parallel::PipeSchedule kind = parallel::pipe_schedule_from_name(name);
  return {kind, parallel::schedule_chunk_count(kind, 1)};
}

// Why this machine's run skips a (schedule, m), or "" when it can run.
std::string cannot_run(const ScheduleChoice& c, int p, int m, int64_t layers) {
  if (c.v == 1) return "";
  if (c.kind == parallel::PipeSchedule::zero_bubble_v && p < 2) return "it needs at least 2 stages";
  if (c.kind != parallel::PipeSchedule::zero_bubble_v && m % p != 0)
    return str_cat("m=", m, " is not a multiple of p=", p);
  if (layers % (p * c.v) != 0) return str_cat("--layers ", layers, " does not split into ", p * c.v, " chunks");
  return "";
}

std::string describe_actions(const parallel::StageActions& st) {
  std::string out;
  for (const auto& a : st)
    out += str_cat(out.empty() ? "" : " ",
                   a.kind == parallel::PipeAction::Kind::forward    ? "F"
                   : a.kind == parallel::PipeAction::Kind::backward ? "B"
                                                                    : "W",
                   a.micro, a.chunk ? str_cat(".", a.chunk) : "");
  return out;
}

// --show-schedule: the schedules as data, with what they predict for equal stages.
int show_schedules(const PipelineOptions& a) {
  const int p = a.nproc > 0 ? int(a.nproc) : 2;
  std::printf(
      "pipeline schedules for p=%d (F3.1: forward of micro-batch 3 in the stage's chunk 1; zb1p, zbv: B is "
      "the input-gradient pass, W the weight-gradient pass; zbv: stage s holds the model's chunks s and 2p-1-s)\n",
      p);
  for (const std::string& name : str_list(a.schedules)) {
    const ScheduleChoice c = schedule_choice(name, int(a.virtual_stages));
    for (int m : int_list(a.micro_batches)) {
      if (const std::string why = cannot_run(c, p, m, a.layers); !why.empty()) {
        std::printf("\n%s m=%d: not run (%s)\n", name.c_str(), m, why.c_str());
        continue;
      }
      const auto sched = parallel::make_schedule(c.kind, p, m, c.v);
      const double bubble = 100 * parallel::predicted_bubble(c.kind, p, m, c.v);
      const char* formula = parallel::bubble_formula(c.kind, c.v);
      if (c.kind == parallel::PipeSchedule::zero_bubble_v)
        std::printf("\n%s m=%d: bubble %.1f%% (%s)\n", name.c_str(), m, bubble, formula);
      else
        std::printf("\n%s m=%d%s: bubble %s = %.1f%%%s\n", name.c_str(), m, c.v > 1 ? str_cat(" v=", c.v).c_str() : "",
                    formula, bubble,
                    c.kind == parallel::PipeSchedule::zero_bubble_h1 ? " (equal F, B and W passes)" : "");
      for (int s = 0; s < p; ++s)
        std::printf("  stage %d (%d in flight%s): %s\n", s, parallel::max_in_flight(sched[size_t(s)]),
                    c.v > 1 ? str_cat(", each 1/", c.v, " of its blocks").c_str() : "",
                    describe_actions(sched[size_t(s)]).c_str());
    }
  }
  return 0;
}

std::vector<double> ms(std::vector<double> seconds) {
  for (double& x : seconds) x *= 1e3;
  return seconds;
}

int bench_balance(const PipelineOptions& a, const CLI::App& app) {
  const model::ModelConfig cfg = model::preset(a.model);
  const std::vector<int> stage_counts = int_list(a.stages);
  const int64_t B = app.count("--batch") ? a.batch : 1, T = app.count("--seq") ? a.seq : 256;
  const int reps = int(a.reps);
  std::printf("bench pipeline --balance: %s, micro-batch %lld x %lld, %d thread(s)\n", cfg.summary().c_str(),
              (long long)B, (long long)T, num_threads());
  const parallel::PartitionCosts params = parallel::parameter_costs(cfg);
  std::printf("profiling (for the partition) ...\n");
  std::fflush(stdout);
  const parallel::PartitionCosts timed = parallel::profile_costs(cfg, B, T, reps);
  std::printf("profiling (to judge the partitions, independently) ...\n");
  std::fflush(stdout);
  const parallel::PartitionCosts judge = parallel::profile_costs(cfg, B, T, reps);
  double block_mean = 0, total = judge.embedding + judge.head;
  for (double b : judge.block) {
    block_mean += b / double(judge.block.size());
    total += b;
  }
  std::printf("timed forward+backward: embedding %.1f ms, block %.1f ms (mean), head+loss %.1f ms = %.2f blocks\n",
              judge.embedding * 1e3, block_mean * 1e3, judge.head * 1e3, judge.head / block_mean);
  nlohmann::json runs = nlohmann::json::array();
  for (int p : stage_counts) {
    std::printf("\n%d stages\n%-11s %-32s %-30s %9s %11s\n", p, "partition", "blocks per stage", "stage time ms",
                "max/mean", "params m/m");
    nlohmann::json methods = nlohmann::json::object();
    for (const char* name : {"uniform", "parameters", "profile"}) {
      std::vector<parallel::StageRange> r;
      if (std::string(name) == "uniform") r = parallel::partition_uniform(int(cfg.n_layer), p);
      if (std::string(name) == "parameters") r = parallel::partition_balanced(params, p);
      if (std::string(name) == "profile") r = parallel::partition_balanced(timed, p);
      const auto t = parallel::stage_costs(r, judge);
      std::string ts;
      for (double x : t) ts += str_cat(ts.empty() ? "" : " ", int(x * 1e3 + 0.5));
      const double bal = parallel::max_over_mean(t);
      const double pbal = parallel::max_over_mean(parallel::stage_costs(r, params));
      std::printf("%-11s %-32s %-30s %9.3f %11.3f\n", name, parallel::describe_partition(r).c_str(), ts.c_str(), bal,
                  pbal);
      methods[name] = {{"stages", parallel::describe_partition(r)},
                       {"stage_ms", ms(t)},
                       {"max_over_mean", bal},
                       {"param_max_over_mean", pbal}};
    }
    // No partition does better than the last stage holding the head and one block.
    const double floor =
        std::max(1.0, (judge.head + *std::min_element(judge.block.begin(), judge.block.end())) / (total / p));
    std::printf("lower bound for any partition (last stage = head + one block): max/mean >= %.3f\n", floor);
    runs.push_back({{"stages", p}, {"partitions", methods}, {"lower_bound", floor}});
  }
  nlohmann::json s = {{"model", cfg.name},
                      {"batch", B},
                      {"seq", T},
                      {"threads", num_threads()},
                      {"embedding_ms", judge.embedding * 1e3},
                      {"block_ms", block_mean * 1e3},
                      {"head_ms", judge.head * 1e3},
                      {"runs", runs}};
  std::printf("SUMMARY %s\n", s.dump().c_str());
  return 0;
}

}  // namespace

int bench_pipeline(const std::vector<std::string>& argv) {
  auto app = bench_app("pipeline",
                       "loom bench pipeline --nproc P: pipeline bubble and activation memory per stage (P ranks via "
                       "loom launch; a GPT-2-style model of --layers blocks, untied head, small vocabulary, so that "
                       "equal blocks make equal stages; idle is the median step's). loom bench pipeline --balance: "
                       "stage balance of the partitioners. The last line is SUMMARY {json}.");
  PipelineOptions a;
  add_run_default_option(*app, "--nproc", a.nproc, "stages, one rank each (via loom launch)", "P", positive());
  app->add_option("--micro-batches", a.micro_batches, "micro-batch counts to run")->type_name("LIST");
  app->add_option("--schedules", a.schedules, "schedules to run: gpipe, 1f1b, interleaved, zb1p, zbv")
      ->type_name("LIST");
  app->add_option("--virtual-stages", a.virtual_stages, "chunks per stage of the interleaved schedule")
      ->type_name("V")
      ->check(positive());
  app->add_flag("--show-schedule", a.show_schedule, "print each schedule's actions per stage (for --nproc stages)");
  app->add_option("--layers", a.layers, "blocks of the model")->type_name("L")->check(positive());
  app->add_option("--d-model", a.d_model, "model width")->type_name("C")->check(positive());
  app->add_option("--vocab", a.vocab, "vocabulary size")->type_name("V")->check(positive());
  add_run_default_option(*app, "--batch", a.batch, "sequences per micro-batch (default 4; --balance 1)", "B",
                         positive());
  add_run_default_option(*app, "--seq", a.seq, "tokens per sequence (default 64; --balance 256)", "T", positive());
  app->add_option("--steps", a.steps, "timed steps")->type_name("N")->check(positive());
  app->add_option("--warmup", a.warmup, "untimed steps first")->check(non_negative());
  app->add_option("--rounds", a.rounds, "times each (schedule, m) runs, the schedules alternating at each m")
      ->type_name("R")
      ->check(positive());
  app->add_option("--threads", a.threads, "OpenMP threads per rank")->type_name("K")->check(positive());
  app->add_flag("--balance", a.balance, "stage balance of the uniform, parameter and profile partitioners");
  app->add_option("--model", a.model, "--balance: the model preset")->type_name("PRESET");
  app->add_option("--stages", a.stages, "--balance: stage counts")->type_name("LIST");
  app->add_option("--reps", a.reps, "--balance: profiling repetitions")->check(positive());
  if (auto rc = parse(*app, argv)) return *rc;
  set_num_threads(int(a.threads));
  if (a.balance) return bench_balance(a, *app);
  if (a.show_schedule) return show_schedules(a);
  if (app->count("--nproc") && !comm::launch_env().under_mpi) return relaunch_bench("pipeline", argv);
  comm::World world;
  const int p = world.size();
  const bool main = world.rank() == 0;
  model::ModelConfig cfg = model::preset("gpt2-tiny");
  cfg.name = "pipeline-bench";
  cfg.n_layer = a.layers;
  cfg.d_model = a.d_model;
  cfg.n_head = cfg.n_kv_head = 4;
  cfg.d_ff = 4 * cfg.d_model;
  cfg.vocab_size = a.vocab;
  cfg.tied_embeddings = false;
  const int64_t B = app->count("--batch") ? a.batch : 4, T = app->count("--seq") ? a.seq : 64;
  cfg.n_ctx = T;
  const int64_t steps = a.steps, warmup = a.warmup;
  parallel::check_stage_count(int(cfg.n_layer), p);
  const auto ranges = parallel::partition_uniform(int(cfg.n_layer), p);
  std::vector<ScheduleChoice> choices;
  for (const std::string& sched : str_list(a.schedules))
    choices.push_back(schedule_choice(sched, int(a.virtual_stages)));
  parallel::Mesh mesh(world.group(), parallel::MeshShape(p, 1, 1, 1));
  const int s = int(mesh.coord().pp);
  // One micro-batch's activations from stage 0 to stage 1, which the simulated column counts.
  const int64_t activation_bytes = B * T * cfg.d_model * int64_t(sizeof(float));
  const double transfer_s = p > 1 ? one_way_seconds(mesh.pp(), 1, activation_bytes, 20) : 0.0;
  if (main) {
    std::printf("bench pipeline: %s, %d stages %s, micro-batch %lld x %lld, %d thread(s)/rank\n", cfg.summary().c_str(),
                p, parallel::describe_partition(ranges).c_str(), (long long)B, (long long)T, num_threads());
    std::printf("a micro-batch's activations (%s) take %.3f ms from one stage to the next (\"simulated\" counts it)\n",
                format_bytes(activation_bytes).c_str(), 1e3 * transfer_s);
  }
  std::mt19937 g(7);
  std::vector<int32_t> tok(size_t(B * T)), tgt(size_t(B * T));
  for (auto& t : tok) t = int32_t(g() % cfg.vocab_size);
  for (auto& t : tgt) t = int32_t(g() % cfg.vocab_size);
  nlohmann::json rows = nlohmann::json::array();
  if (main)
    std::printf("\n%-11s %4s %8s %10s %10s %10s %10s %9s %9s   %s\n", "sched", "m", "formula", "idle mean", "idle max",
                "simulated", "replayed", "idle ms", "step ms", "per stage: idle% / peak activations");
  // Each (schedule, m) runs `rounds` times; within a round the schedules alternate at each m, so
  // that load from other jobs on a shared machine falls on all of them alike.
  struct Measured {
    // Per timed step: this stage's idle, in the run and in the replay of the step's own actions.
    std::vector<double> idle, replayed, step_s;
    double fwd = 0, bwd = 0, wgt = 0, peak = 0;  // per action, summed over every timed step
  };
  const std::vector<std::string> names = str_list(a.schedules);
  const std::vector<int> ms_list = int_list(a.micro_batches);
  std::map<std::pair<size_t, int>, Measured> measured;
  auto run = [&](size_t k, int m) {
    const ScheduleChoice c = choices[k];
    Measured& out = measured[{k, m}];
    CpuAllocator alloc;  // this configuration's activations alone
    model::DecoderOptions o;
    // v chunks per stage: model chunks s, s + p, ... (Megatron's layout), or zbv's V.
    const parallel::ChunkPlacement place = parallel::chunk_placement(c.kind);
    o.slice = parallel::stage_slice(parallel::partition_uniform(int(cfg.n_layer), p * c.v), s, p, c.v, place);
    model::Decoder d(cfg, o, DType::f32, alloc);
    d.init_weights(1);
    parallel::PipelineStage stage(d, mesh, {c.kind, m, c.v});
    const auto schedule = parallel::make_schedule(c.kind, p, m, c.v);
    for (int64_t i = 0; i < warmup + steps; ++i) {
      world.group().barrier();  // every stage starts the step together
      d.zero_grads();
      const auto st = stage.train_step(
          [&](int, int32_t* t, int32_t* y, int32_t*) {
            std::copy(tok.begin(), tok.end(), t);
            std::copy(tgt.begin(), tgt.end(), y);
          },
          B, T, 1.0 / double(B * T * m));
      // The step ends when the slowest stage ends: idle = 1 - busy / that.
      Tensor wall = Tensor::from_vector<double>({st.wall_s}, {1});
      world.group().all_reduce(wall, comm::ReduceOp::max);
      if (i >= warmup) {
        // Every stage runs as many actions (each chunk's F and B, or F, B and W, per micro-batch).
        const int64_t n = int64_t(st.action_s.size());
        Tensor mine = Tensor::from_vector<double>(st.action_s, {n});
        Tensor all = Tensor::zeros({n * p}, DType::f64, MemCategory::workspace);
        world.group().all_gather(mine, all);
        std::vector<std::vector<double>> times(static_cast<size_t>(p));
        for (int j = 0; j < p; ++j)
          times[size_t(j)].assign(all.data<double>() + j * n, all.data<double>() + (j + 1) * n);
        out.replayed.push_back(
            parallel::replay_schedule(schedule, times, place, transfer_s).idle_fraction()[size_t(s)]);
        out.idle.push_back(1 - st.busy_s / wall.data<double>()[0]);
        out.step_s.push_back(wall.data<double>()[0]);
        // Per action: one chunk's forward, backward (zb1p: input-gradient pass) or weight pass.
        out.fwd += st.forward_s / double(m * c.v);
        out.bwd += st.backward_s / double(m * c.v);
        out.wgt += st.weight_s / double(m * c.v);
      }
    }
    out.peak = std::max(out.peak, double(alloc.snapshot()[MemCategory::activations].peak));
  };
  for (int64_t round = 0; round < a.rounds; ++round)
    for (int m : ms_list)
      for (size_t k = 0; k < choices.size(); ++k)
        if (cannot_run(choices[k], p, m, cfg.n_layer).empty()) run(k, m);
  for (size_t k = 0; k < choices.size(); ++k)
    for (int m : ms_list) {
      const std::string& sched = names[k];
      const ScheduleChoice c = choices[k];
      if (const std::string why = cannot_run(c, p, m, cfg.n_layer); !why.empty()) {
        if (main) std::printf("%-11s %4d   not run: %s\n", sched.c_str(), m, why.c_str());
        continue;
      }
      const Measured& me = measured.at({k, m});
      const double timed = double(me.idle.size());
      // Per stage: idle, forward, backward and weight-pass time per action, activation peak.
      constexpr int kCols = 6;
      Tensor t = Tensor::zeros({kCols * p}, DType::f64, MemCategory::workspace);
      double* row = t.data<double>() + kCols * s;
      row[0] = median(me.idle);  // median step: the machine is shared
      row[1] = me.fwd / timed;
      row[2] = me.bwd / timed;
      row[3] = me.wgt / timed;
      row[4] = me.peak;
      row[5] = median(me.replayed);
      world.group().all_reduce(t);
      if (!main) continue;
      const double* v = t.data<double>();
      std::vector<double> tf, tb, tw, idles, peaks, replayed;
      for (int j = 0; j < p; ++j) {
        idles.push_back(v[kCols * j]);
        tf.push_back(v[kCols * j + 1]);
        tb.push_back(v[kCols * j + 2]);
        tw.push_back(v[kCols * j + 3]);
        peaks.push_back(v[kCols * j + 4]);
        replayed.push_back(v[kCols * j + 5]);
      }
      const auto sim = parallel::simulate_schedule(parallel::make_schedule(c.kind, p, m, c.v), tf, tb, tw,
                                                   parallel::chunk_placement(c.kind), transfer_s);
      double sim_mean = 0, mean = 0, replay_mean = 0;
      for (double x : sim.idle_fraction()) sim_mean += x / p;
      for (double x : replayed) replay_mean += x / p;
      for (double x : idles) mean += x / p;
      const double formula = parallel::predicted_bubble(c.kind, p, m, c.v);
      const double step_ms = 1e3 * median(me.step_s), idle_ms = mean * step_ms;
      std::string per;
      for (int j = 0; j < p; ++j)
        per +=
            str_cat(j ? "  " : "", int(100 * idles[size_t(j)] + 0.5), "% / ", format_bytes(int64_t(peaks[size_t(j)])));
      std::printf("%-11s %4d %7.1f%% %9.1f%% %9.1f%% %9.1f%% %9.1f%% %9.1f %9.1f   %s\n", sched.c_str(), m,
                  100 * formula, 100 * mean, 100 * *std::max_element(idles.begin(), idles.end()), 100 * sim_mean,
                  100 * replay_mean, idle_ms, step_ms, per.c_str());
      std::fflush(stdout);
      rows.push_back({{"schedule", sched},
                      {"virtual_stages", c.v},
                      {"step_ms", step_ms},
                      {"idle_ms", idle_ms},
                      {"stages", p},
                      {"micro_batches", m},
                      {"formula", formula},
                      {"idle", idles},
                      {"idle_mean", mean},
                      {"simulated_idle_mean", sim_mean},
                      {"replayed_idle_mean", replay_mean},
                      {"forward_ms", ms(tf)},
                      {"backward_ms", ms(tb)},
                      {"weight_ms", ms(tw)},
                      {"activation_peak_bytes", peaks}});
    }
  if (main) {
    nlohmann::json s = {
        {"model", cfg.summary()},          {"stages", p}, {"batch", B}, {"seq", T}, {"threads_per_rank", num_threads()},
        {"transfer_ms", 1e3 * transfer_s}, {"runs", rows}};
    std::printf("SUMMARY %s\n", s.dump().c_str());
  }
  return 0;
}

}  // namespace loom::cli

// `loom plan`: the planner's command line. Ranks the layouts of a model on a cluster
// (`--top`), predicts one (`--layout`), explains the pick term by term (`--explain`),
// measures this machine into a cluster file (`--calibrate FILE`), and checks its predictions
// against training runs of this machine (`--validate [--quick]`).
#include <unistd.h>
#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>
#include <thread>

#include <nlohmann/json.hpp>

#include "loom/core/allocator.h"
#include "loom/core/cpu_features.h"
#include "loom/core/error.h"
#include "loom/core/stats.h"
#include "loom/core/threads.h"
#include "loom/core/timer.h"
#include "loom/io/file.h"
#include "loom/kernels/cpu/blas_core.h"
#include "loom/kernels/cpu/gemm.h"
#include "loom/model/decoder.h"
#include "loom/plan/planner.h"
#include "loom/train/init_from.h"
#include "loom/train/train_config.h"
#include "tools/loom/commands.h"

namespace loom::cli {
namespace {

namespace fs = std::filesystem;

// The options of all three modes (plan, --calibrate, --validate).
struct PlanOptions {
  std::string model, cluster, precision = "fp32", layout, calibrate, comm_calibration, out, grad_dtype,
                              algorithm = "auto", only;
  int64_t nodes = 1, global_batch = 8, seq = 256, top = 10, threads = 1, devices = 0, repeat = 2;
  double inter_gbps = 0;
  bool explain = false, gpipe = false, json = false, validate = false, quick = false, no_overlap = false;
};

model::ModelConfig model_of(const std::string& spec) {
  if (spec.size() > 5 && (spec.ends_with(".yaml") || spec.ends_with(".yml"))) {
    const train::TrainConfig cfg = train::load_train_config(spec, {"data.dir=unused"}, train::init_source_config);
    return cfg.model;
  }
  return model::preset(spec);
}

plan::Layout parse_layout(const std::string& spec) {
  plan::Layout l;
  std::istringstream in(spec);
  for (std::string item; std::getline(in, item, ',');) {
    const auto eq = item.find('=');
    if (eq == std::string::npos) throw UsageError("[plan] --layout: expected key=value, got '" + item + "'");
    const std::string k = item.substr(0, eq), v = item.substr(eq + 1);
    if (k == "schedule") {
      try {
        l.pp_schedule = parallel::pipe_schedule_from_name(v);
      } catch (const Error&) {
        throw UsageError("[plan] --layout: schedule=" + v + " is not 1f1b, gpipe, zb1p or zbv");
      }
      l.virtual_stages = parallel::schedule_chunk_count(l.pp_schedule, int(l.virtual_stages));  // zbv: its two
      continue;
    }
    // The optimizer state of the stages auto picks (parallel.offload.stages=auto), and at ZeRO-3
    // their parameter shards (parallel.offload.params).
    if (k == "offload" || k == "offload_params") {
      const optim::OffloadTarget t = v == "host"   ? optim::OffloadTarget::host
                                     : v == "disk" ? optim::OffloadTarget::disk
                                                   : optim::OffloadTarget::none;
      if (t == optim::OffloadTarget::none && v != "none")
        throw UsageError("[plan] --layout: " + k + "=" + v + " is not none, host or disk");
      (k == "offload" ? l.offload : l.offload_params) = t;
      continue;
    }
    int64_t n = 0;
    try {
      n = std::stoll(v);
    } catch (...) {
      throw UsageError("[plan] --layout: " + k + "=" + v + " is not a number");
    }
    if (k == "dp")
      l.dp = n;
    else if (k == "tp")
      l.tp = n;
    else if (k == "pp")
      l.pp = n;
    else if (k == "ep")
      l.ep = n;
    else if (k == "zero")
      l.zero_stage = int(n);
    else if (k == "mb")
      l.micro_batch = n;
    else if (k == "m")
      l.micro_batches = n;
    else if (k == "ckpt")
      l.checkpoint = int(n);
    else if (k == "v")
      l.virtual_stages = n;
    else
      throw UsageError("[plan] --layout: unknown key '" + k +
                       "' (dp, tp, pp, ep, zero, mb, m, ckpt, v, schedule, offload, offload_params)");
  }
  return l;
}

// ---- calibration --------------------------------------------------------------------------

// Median seconds of `fn` over enough repetitions to take ~`budget_s`.
template <class F>
double time_median(F&& fn, double budget_s) {
  fn();
  std::vector<double> t;
  const double start = now_seconds();
  while (t.size() < 3 || (now_seconds() - start < budget_s && t.size() < 200)) {
    const double t0 = now_seconds();
    fn();
    t.push_back(now_seconds() - t0);
  }
  return median(t);
}

// comm_file: a `loom bench comm --calibrate` file to take the links from; when empty (and the
// machine has 2 devices or more) one is measured now and written to comm_out, which training
// runs should load (comm.calibration) so that `auto` runs the collectives the plan assumes.
// quick: collectives under compute are not timed (the gpt2-124m run is most of calibration's
// time, and a smaller model's collectives are too short to time against its compute), so they
// run at their idle rate, and collectives are timed up to 16 MiB instead of 64 (the validation
// models' buckets are smaller).
plan::Cluster calibrate(int threads, int devices, const std::string& comm_file, const std::string& comm_out,
                        bool verbose, bool quick = false) {
  set_num_threads(threads);
  plan::Cluster c;
  const unsigned cores = std::max(1u, std::thread::hardware_concurrency());
  c.devices_per_node = devices > 0 ? devices : int(std::max(1u, cores / unsigned(threads)));
  c.max_nodes = 1;
  c.name = "this-machine";
  const std::string cpu = cpu_model_name().empty() ? "CPU" : cpu_model_name();
  c.device.name = str_cat(cpu, ", ", threads, " thread", threads > 1 ? "s" : "", " per rank");
  c.device.threads = threads;
  c.device.memory_bytes = double(physical_memory_bytes()) / double(c.devices_per_node);
  // Matrix products of transformer shapes ([tokens, in] x [in, out]) at growing sizes; the
  // rate of the largest is the peak the curve is a fraction of.
  struct Shape {
    int64_t m, k, n;
  };
  const std::vector<Shape> shapes = {{64, 32, 96},      {128, 64, 192},    {256, 64, 256},   {512, 192, 192},
                                     {1024, 192, 576},  {1024, 192, 768},  {1024, 768, 768}, {2048, 768, 2304},
                                     {2048, 768, 3072}, {4096, 1024, 4096}};
  std::vector<std::pair<double, double>> rates;  // flops, flop/s
  std::mt19937 g(1);
  std::uniform_real_distribution<float> u(-1, 1);
  for (const Shape& s : shapes) {
    std::vector<float> a(size_t(s.m * s.k)), b(size_t(s.k * s.n)), out(size_t(s.m * s.n));
    for (auto& x : a) x = u(g);
    for (auto& x : b) x = u(g);
    const double flops = 2.0 * double(s.m * s.k * s.n);
    // Forward (x W^T as the linears run) and the two backward products, as training does.
    const double sec = time_median(
        [&] { cpu::gemm(false, true, s.m, s.n, s.k, 1.0f, a.data(), s.k, b.data(), s.k, 0.0f, out.data(), s.n); }, 0.3);
    rates.emplace_back(flops, flops / sec);
    if (verbose)
      std::printf("  product %5lld x %4lld x %4lld: %8.1f GFLOP/s\n", (long long)s.m, (long long)s.k, (long long)s.n,
                  flops / sec / 1e9);
  }
  double peak = 0;
  for (const auto& r : rates) peak = std::max(peak, r.second);
  c.device.peak_fp32_flops = peak;
  for (const auto& [f, r] : rates) c.device.gemm_efficiency.points.emplace_back(f, r / peak);
  // Memory bandwidth of an elementwise kernel: y = a x + y over 64 MiB vectors.
  double stream = 0;
  {
    const size_t n = size_t(16) << 20;
    std::vector<float> x(n, 1.0f), y(n, 2.0f);
    const double sec = time_median(
        [&] {
          float* yp = y.data();
          const float* xp = x.data();
#pragma omp parallel for schedule(static)
          for (int64_t i = 0; i < int64_t(n); ++i) yp[i] = 0.5f * xp[i] + yp[i];
        },
        0.5);
    stream = 3.0 * 4.0 * double(n) / sec;
    c.device.memory_bytes_per_s = c.device.stream_bytes_per_s = stream;
  }
  // loom's own attention and elementwise kernels: a reference model's forward and backward at
  // two sequence lengths of the same token count, minus its matrix products, solved for the
  // attention rate and the elementwise bandwidth that the planner's counts imply.
  {
    const model::ModelConfig ref = model::preset("gpt2-shakespeare");
    std::vector<std::array<double, 3>> rows;  // attention FLOPs, elementwise bytes, seconds
    for (auto [B, T] : {std::pair<int64_t, int64_t>{32, 16}, {4, 128}}) {
      CpuAllocator alloc;
      model::DecoderOptions opt;
      model::Decoder m(ref, opt, DType::f32, alloc);
      m.init_weights(1);
      std::vector<int32_t> tok(size_t(B * T)), tgt(size_t(B * T));
      for (size_t i = 0; i < tok.size(); ++i) tok[i] = int32_t(g() % 256), tgt[i] = int32_t(g() % 256);
      cpu::gemm_clock().on = true;
      std::vector<double> rest;
      for (int i = 0; i < 16; ++i) {
        cpu::gemm_clock().ns = 0;
        m.zero_grads();
        const double t0 = now_seconds();
        m.forward_backward(tok.data(), tgt.data(), B, T, 1.0 / double(B * T));
        const double total = now_seconds() - t0;
        if (i > 0) rest.push_back(total - double(cpu::gemm_clock().ns.load()) / 1e9);
      }
      cpu::gemm_clock().on = false;
      plan::Job job;
      job.model = ref;
      job.seq = T;
      job.global_batch = B;
      plan::Layout l;
      l.micro_batch = B;
      const plan::StageCounts k = plan::count_stage(job, l, model::ModelSlice{});
      rows.push_back({3 * k.attention_fwd_flops, k.elem_fwd_bytes + k.elem_bwd_bytes, median(rest)});
    }
    const auto& [a1, e1, n1] = rows[0];
    const auto& [a2, e2, n2] = rows[1];
    const double det = a1 * e2 - a2 * e1;
    const double x = det != 0 ? (n1 * e2 - n2 * e1) / det : -1;  // seconds per attention FLOP
    const double y = det != 0 ? (a1 * n2 - a2 * n1) / det : -1;  // seconds per elementwise byte
    // Attention kernels do not outrun the products; a faster solution is timing noise.
    if (x > 0 && y > 0 && 1 / x <= peak) {
      c.device.attention_flops = 1 / x;
      c.device.memory_bytes_per_s = 1 / y;
    } else {  // not separable on this machine: attention at the product rate
      c.device.memory_bytes_per_s = (e1 + e2) / std::max(1e-9, n1 + n2 - (a1 + a2) / peak);
    }
    if (verbose)
      std::printf("  outside matrix products: %.1f ms at T=16, %.1f ms at T=128 (gpt2-shakespeare, 512 tokens)\n",
                  n1 * 1e3, n2 * 1e3);
  }
  if (verbose)
    std::printf("  peak %.1f GFLOP/s per rank (%d thread%s), attention %.1f GFLOP/s, elementwise %.1f GB/s\n",
                peak / 1e9, threads, threads > 1 ? "s" : "", c.device.attention_flops / 1e9,
                c.device.memory_bytes_per_s / 1e9);
  // Links: the comm calibration file of `loom bench comm --calibrate` when given; else, with two
  // devices or more, one made now on 2 ranks; else the built-in shared-memory estimate (two
  // copies through a shared segment).
  std::string comm_cal = comm_file;
  if (comm_cal.empty() && c.devices_per_node >= 2) {
    const std::string path = comm_out;
    const std::string log = path + ".log";
    const std::string cmd =
        str_cat("OMP_NUM_THREADS=", threads, " ", launch_exe(), " bench comm --nproc 2 --calibrate ", path,
                quick ? " --max-bytes 16M" : "", " > ", log, " 2>&1");
    if (verbose) std::printf("  timing collectives on 2 ranks (loom bench comm --calibrate)\n");
    if (std::system(cmd.c_str()) == 0)
      comm_cal = path;
    else
      std::printf("  loom bench comm --calibrate failed (see %s); links from the built-in estimate\n", log.c_str());
  }
  if (!comm_cal.empty()) {
    const comm::CostModel m = comm::load_cost_model(comm_cal);
    c.links.measured = m.measured;
    c.links.intra = m.intra;
    c.links.inter = m.inter;
    c.links.reduce_s_per_byte = m.reduce_s_per_byte;
    c.sources.push_back(
        comm_file.empty() ? std::string("links and collective times measured on 2 ranks by loom bench comm --calibrate")
                          : "links from " + comm_file + " (loom bench comm --calibrate)");
    if (comm_file.empty()) {
      std::error_code ec;
      fs::remove(comm_cal + ".log", ec);
      if (verbose)
        std::printf(
            "  collective times in %s (comm.calibration for loom train: auto then also weighs loom's\n"
            "  own algorithms against MPI's)\n",
            comm_cal.c_str());
    }
  } else {
    c.links.intra = {5e-6, 2.0 / stream * 3.0};
    c.links.reduce_s_per_byte = 3.0 / stream;
    c.sources.push_back("intra link: shared memory, two copies at the measured bandwidth, 5 us latency");
  }
  c.links.inter = comm::CostModel{}.inter;
  // CPU ranks copy through shared memory with the cores that compute: communication that
  // overlaps the backward pass still takes its time from it.
  c.overlap_fraction = 0;
  c.sources.push_back("overlap_fraction 0: collectives copy with the cores that compute");
  // Collectives while the ranks compute: a data-parallel step of gpt2-124m on 2 ranks against
  // the same work without communication (loom bench train), over what the links above predict.
  if (c.devices_per_node >= 2 && quick) {
    if (verbose) std::printf("  --quick: collectives under compute not timed (x1, their idle rate)\n");
    c.sources.push_back("comm_under_compute 1: not timed (loom plan --validate --quick)");
  } else if (c.devices_per_node >= 2) {
    const std::string log = (fs::temp_directory_path() / str_cat("loom-plan-dp-", getpid(), ".log")).string();
    const std::string cmd =
        str_cat("OMP_NUM_THREADS=", threads, " OMPI_MCA_mpi_yield_when_idle=1 ", launch_exe(),
                " bench train --nproc 2 --dp 2 --zero 0 --model gpt2-124m --batch 1 --seq 64 --steps 3 --warmup 1",
                " --threads ", threads, " > ", log, " 2>&1");
    if (verbose) std::printf("  timing a data-parallel step on 2 ranks (loom bench train --dp 2, gpt2-124m)\n");
    double step = 0, alone = 0;
    if (std::system(cmd.c_str()) == 0) {
      std::ifstream f(log);
      for (std::string line; std::getline(f, line);)
        if (auto at = line.find("SUMMARY "); at != std::string::npos) {
          const auto j = nlohmann::json::parse(line.substr(at + 8), nullptr, false);
          if (j.is_object() && j.contains("step_ms"))
            step = j["step_ms"].get<double>(), alone = j["dp1_step_ms"].get<double>();
        }
    }
    plan::Job job;
    job.model = model::preset("gpt2-124m");
    job.seq = 64;
    job.global_batch = 2;
    plan::Layout l;
    l.dp = 2;
    const double quiet = plan::predict(job, c, l).time.dp_comm * 1e3;
    if (step > 0 && quiet > 0) {
      c.comm_under_compute = std::max(1.0, (step - alone) / quiet);
      if (verbose)
        std::printf(
            "  dp=2 step %.0f ms, same work alone %.0f ms, collectives predicted %.0f ms on idle cores: x%.2f "
            "while computing\n",
            step, alone, quiet, c.comm_under_compute);
      c.sources.push_back(str_cat("comm_under_compute from loom bench train --nproc 2 --dp 2 (gpt2-124m): ", step,
                                  " ms vs ", alone, " ms alone"));
      std::error_code ec;
      fs::remove(log, ec);
    } else {
      std::printf("  the data-parallel timing failed (see %s); collectives at their idle rate\n", log.c_str());
    }
  }
  c.description = str_cat("measured by loom plan --calibrate: ", cpu);
  c.sources.push_back(str_cat("products and bandwidth measured by loom plan --calibrate with ", threads,
                              " thread(s) per rank, OpenBLAS ", cpu::blas_core(), " kernels"));
  return c;
}

// ---- validation ---------------------------------------------------------------------------

struct Case {
  std::string model;
  plan::Layout layout;
  int64_t seq = 128;
  int steps = 12;
};

std::vector<Case> validation_cases(bool quick) {
  using L = plan::Layout;
  const std::string S = "gpt2-shakespeare";
  std::vector<Case> all = {
      {S, L::of(1, 1, 1, 1, 0, 8, 1)},                                    // one process
      {S, L::of(2, 1, 1, 1, 0, 8, 1)},                                    // dp2 ZeRO-0
      {S, L::of(1, 1, 2, 1, 0, 2, 4)},                                    // pp2 1F1B, 4 micro-batches
      {S, L::of(1, 2, 1, 1, 0, 8, 1)},                                    // tp2
      {S, L::of(1, 1, 1, 1, 0, 2, 4)},                                    // gradient accumulation
      {S, L::of(1, 1, 1, 1, 0, 8, 1, 1)},                                 // activation checkpointing
      {S, L::of(2, 1, 1, 1, 1, 8, 1)},                                    // ZeRO-1
      {S, L::of(2, 1, 1, 1, 2, 8, 1)},                                    // ZeRO-2
      {S, L::of(2, 1, 1, 1, 3, 8, 1)},                                    // ZeRO-3
      {S, L::of(1, 1, 2, 1, 0, 2, 4, 0, parallel::PipeSchedule::gpipe)},  // pp2 GPipe
      {S, L::of(2, 1, 1, 1, 1, 4, 2, 1)},                                 // ZeRO-1, micro-batches, checkpointing
      {S, L::of(1, 2, 1, 1, 0, 4, 2, 1)},                                 // tp2, micro-batches, checkpointing
      {"gpt2-124m", L::of(1, 1, 1, 1, 0, 1, 1), 128, 4},
      {"gpt2-124m", L::of(2, 1, 1, 1, 0, 1, 1), 128, 4},
      {"gpt2-124m", L::of(2, 1, 1, 1, 2, 1, 1), 128, 4},
  };
  if (!quick) return all;
  // Eight steps: the median of six after the two warm-up steps, enough for the test suite's 50%.
  std::vector<Case> first{all[0], all[1], all[2], all[3]};
  for (Case& k : first) k.steps = 8;
  return first;
}

struct Measured {
  double ms = 0;
  double peak_bytes = 0;
  bool ok = false;
  std::string log;
};

Measured run_case(const Case& k, const std::string& data_dir, const std::string& dir, int threads) {
  const plan::Layout& l = k.layout;
  const std::string tag =
      str_cat(k.model, "-", l.dp, "-", l.tp, "-", l.pp, "-z", l.zero_stage, "-", l.micro_batch, "x", l.micro_batches,
              "-c", l.checkpoint, "-", parallel::pipe_schedule_name(l.pp_schedule));
  const std::string metrics = dir + "/" + tag + ".jsonl", log = dir + "/" + tag + ".log";
  std::ostringstream cmd;
  // Waiting ranks yield their core (the ranks, their comm workers and MPI's progress share the
  // cores), as the test suite runs them.
  cmd << "OMP_NUM_THREADS=" << threads << " OMP_WAIT_POLICY=passive OMPI_MCA_mpi_yield_when_idle=1 ";
  const std::string exe = launch_exe();
  if (l.ranks() > 1)
    cmd << exe << " launch --nproc " << l.ranks() << " -- ";
  else
    cmd << exe << " ";
  cmd << "train " << LOOM_SOURCE_DIR << "/configs/shakespeare.yaml --set model.preset=" << k.model
      << " --set data.dir=" << data_dir << " --set data.seq_len=" << k.seq
      << " --set data.batch_size=" << l.dp * l.micro_batch * l.micro_batches
      << " --set data.micro_batch_size=" << l.micro_batch << " --set schedule.steps=" << k.steps
      << " --set schedule.eval_interval=0 --set checkpoint.dir= --set checkpoint.every_steps=0 --set log.every=1 --set "
         "log.progress=off"
      << " --set log.metrics_path=" << metrics << " --set parallel.dp=" << l.dp << " --set parallel.tp=" << l.tp
      << " --set parallel.pp=" << l.pp << " --set parallel.zero_stage=" << l.zero_stage
      << " --set parallel.pp_schedule=" << parallel::pipe_schedule_name(l.pp_schedule)
      << " --set model.activation_checkpoint_interval=" << l.checkpoint << " --set threads=" << threads;
  cmd << " > " << log << " 2>&1";
  Measured m;
  m.log = log;
  const int rc = std::system(cmd.str().c_str());
  if (rc != 0) return m;
  std::ifstream f(metrics);
  std::vector<double> ms;
  for (std::string line; std::getline(f, line);) {
    const auto j = nlohmann::json::parse(line, nullptr, false);
    if (!j.is_object() || !j.contains("ms_per_step")) continue;
    // The first two steps allocate and warm caches.
    if (j["step"].get<int64_t>() > 2) ms.push_back(j["ms_per_step"].get<double>());
    m.peak_bytes = j["peak_bytes"].get<double>();
  }
  if (ms.empty()) return m;
  m.ms = median(ms);
  m.ok = true;
  return m;
}

int validate(const PlanOptions& a, const CLI::App& app) {
  const bool quick = a.quick;
  const int threads = int(a.threads);
  const std::string out =
      a.out.empty() ? (fs::temp_directory_path() / str_cat("loom-plan-validate-", getpid())).string() : a.out;
  fs::create_directories(out);
  plan::Cluster cluster;
  if (!a.cluster.empty()) {
    cluster = plan::load_cluster(a.cluster);
  } else {
    std::printf("calibrating this machine (%d thread%s per rank):\n", threads, threads > 1 ? "s" : "");
    cluster = calibrate(threads, 0, a.comm_calibration, out + "/comm.cal", true, quick);
    io::write_file_atomic(out + "/this-machine.yaml", plan::cluster_yaml(cluster));
    std::printf("  cluster file: %s/this-machine.yaml\n", out.c_str());
  }
  // Tiny Shakespeare as bytes (the byte-vocabulary model) and as GPT-2 tokens (gpt2-124m).
  auto prepared = [&](const std::string& tokenizer) {
    const std::string dir = out + "/data-" + tokenizer;
    if (!fs::exists(dir + "/meta.json")) {
      const std::string cmd =
          str_cat(launch_exe(), " prepare --input ", LOOM_SOURCE_DIR, "/data/tinyshakespeare/input.txt --tokenizer ",
                  tokenizer, " --out ", dir, " > ", out, "/prepare-", tokenizer, ".log 2>&1");
      LOOM_CHECK(std::system(cmd.c_str()) == 0, "plan", "preparing the validation data failed; see ", out, "/prepare-",
                 tokenizer, ".log");
    }
    return dir;
  };
  auto cases = validation_cases(quick);
  if (!a.only.empty()) {  // layouts whose model or description contains the text
    const std::string& only = a.only;
    std::erase_if(cases,
                  [&](const Case& k) { return (k.model + " " + k.layout.describe()).find(only) == std::string::npos; });
    if (cases.empty()) throw UsageError("[plan] --only " + only + ": no validation layout matches");
  }
  // Shared machines have slow spells of a minute or more: every layout runs `repeat` times,
  // round after round, and the faster run counts (slowness is never the model's to explain).
  const int repeat = app.count("--repeat") ? int(a.repeat) : quick ? 1 : 2;
  std::vector<Measured> measured(cases.size());
  for (int r = 0; r < repeat; ++r)
    for (size_t i = 0; i < cases.size(); ++i) {
      const Case& k = cases[i];
      if (k.layout.ranks() > cluster.devices_per_node) continue;
      const Measured m = run_case(k, prepared(k.model == "gpt2-shakespeare" ? "byte" : "gpt2"), out, threads);
      std::printf("  round %d/%d %-18s %-34s %s\n", r + 1, repeat, k.model.c_str(), k.layout.describe().c_str(),
                  m.ok ? str_cat(int64_t(m.ms), " ms").c_str() : "failed");
      std::fflush(stdout);
      if (!measured[i].ok || (m.ok && m.ms < measured[i].ms)) measured[i] = m;
    }
  std::printf(
      "\nvalidating %zu layouts on %s (%d device%s per node); step times are medians after 2 warm-up steps\n"
      "(the faster of %d runs), memory is rank 0's peak (pipeline stage 0) against the planner's stage 0\n\n",
      cases.size(), cluster.device.name.c_str(), cluster.devices_per_node, cluster.devices_per_node > 1 ? "s" : "",
      repeat);
  std::printf("%-18s %-34s %10s %10s %7s %11s %11s %7s\n", "model", "layout", "ms pred", "ms meas", "err", "mem pred",
              "mem meas", "err");
  nlohmann::json rows = nlohmann::json::array();
  double max_mem = 0, max_time = 0;
  int failed = 0;
  for (size_t i = 0; i < cases.size(); ++i) {
    const Case& k = cases[i];
    plan::Job job;
    job.model = model::preset(k.model);
    job.seq = k.seq;
    job.global_batch = k.layout.dp * k.layout.micro_batch * k.layout.micro_batches;
    job.nodes = 1;
    if (k.layout.ranks() > cluster.devices_per_node) {
      std::printf("%-18s %-34s skipped: needs %lld devices, this node has %d\n", k.model.c_str(),
                  k.layout.describe().c_str(), (long long)k.layout.ranks(), cluster.devices_per_node);
      continue;
    }
    const plan::Prediction p = plan::predict(job, cluster, k.layout);
    LOOM_CHECK(p.why_not.empty() || p.fits, "plan", "validation layout ", k.layout.describe(), ": ", p.why_not);
    const Measured& m = measured[i];
    if (!m.ok) {
      ++failed;
      std::printf("%-18s %-34s run failed; see %s\n", k.model.c_str(), k.layout.describe().c_str(), m.log.c_str());
      continue;
    }
    const double pred_ms = p.time.step * 1e3, pred_mem = p.stage_memory.front().total();
    const double time_err = std::abs(pred_ms - m.ms) / m.ms, mem_err = std::abs(pred_mem - m.peak_bytes) / m.peak_bytes;
    max_time = std::max(max_time, time_err);
    max_mem = std::max(max_mem, mem_err);
    std::printf("%-18s %-34s %10.1f %10.1f %6.1f%% %11s %11s %6.1f%%\n", k.model.c_str(), k.layout.describe().c_str(),
                pred_ms, m.ms, 100 * time_err, format_bytes(int64_t(pred_mem)).c_str(),
                format_bytes(int64_t(m.peak_bytes)).c_str(), 100 * mem_err);
    std::fflush(stdout);
    rows.push_back({{"model", k.model},
                    {"layout", k.layout.describe()},
                    {"predicted_ms", pred_ms},
                    {"measured_ms", m.ms},
                    {"time_error", time_err},
                    {"predicted_bytes", pred_mem},
                    {"measured_bytes", m.peak_bytes},
                    {"memory_error", mem_err}});
  }
  nlohmann::json s = {{"layouts", rows.size()},         {"failed", failed},
                      {"max_memory_error", max_mem},    {"max_time_error", max_time},
                      {"cluster", cluster.device.name}, {"rows", rows}};
  std::printf("\nmax memory error %.1f%% (target 5%%), max step-time error %.1f%% (target 15%%) over %zu layouts\n",
              100 * max_mem, 100 * max_time, rows.size());
  std::printf("SUMMARY %s\n", s.dump().c_str());
  return failed ? 1 : 0;
}

void print_prediction_row(const plan::Prediction& p) {
  std::printf("%-36s %10.1f %12.0f %6.1f%% %11s %s\n", p.layout.describe().c_str(), p.time.step * 1e3, p.tokens_per_s,
              100 * p.mfu, format_bytes(int64_t(p.memory.total())).c_str(),
              p.fits ? "" : ("does not fit: " + p.why_not).c_str());
}

nlohmann::json prediction_json(const plan::Prediction& p) {
  const auto& t = p.time;
  const auto& m = p.memory;
  return {{"layout", p.layout.describe()},
          {"fits", p.fits},
          {"why_not", p.why_not},
          {"step_ms", t.step * 1e3},
          {"tokens_per_s", p.tokens_per_s},
          {"mfu", p.mfu},
          {"memory_bytes", m.total()},
          {"memory_stage", p.memory_stage},
          {"terms_ms",
           {{"gemm", t.gemm * 1e3},
            {"attention", t.attention * 1e3},
            {"elementwise", t.elementwise * 1e3},
            {"recompute", t.recompute * 1e3},
            {"tp_comm", t.tp_comm * 1e3},
            {"ep_a2a", t.ep_a2a * 1e3},
            {"pp_p2p", t.pp_p2p * 1e3},
            {"bubble", t.bubble * 1e3},
            {"dp_comm", t.dp_comm * 1e3},
            {"dp_exposed", t.dp_exposed * 1e3},
            {"optimizer", t.optimizer * 1e3}}},
          {"memory",
           {{"params", m.params},
            {"grads", m.grads},
            {"optimizer", m.optimizer},
            {"activations", m.activations},
            {"workspace", m.workspace},
            {"comm", m.comm},
            {"offloaded", m.offloaded}}}};
}

}  // namespace

int cmd_plan(const std::vector<std::string>& argv) {
  auto app = new_app("plan",
                     "Predicts memory per rank and step time of training layouts (dp, tp, pp, ep, ZeRO stage, "
                     "micro-batches, activation checkpointing, pipeline schedule) without running anything:\n"
                     "  loom plan --model PRESET|CONFIG.yaml --cluster CLUSTER.yaml --global-batch B --seq T\n"
                     "  loom plan --calibrate CLUSTER.yaml [--threads K] [--devices D]\n"
                     "  loom plan --validate [--quick] [--cluster CLUSTER.yaml] [--out DIR]\n"
                     "The last line is SUMMARY {json}.");
  PlanOptions a;
  app->add_option("--model", a.model, "a preset (loom's model presets) or a training config whose model: it uses")
      ->type_name("PRESET|CONFIG.yaml");
  app->add_option("--cluster", a.cluster,
                  "cluster file (configs/clusters/*.yaml; --calibrate writes one for this machine)")
      ->type_name("CLUSTER.yaml");
  app->add_option("--nodes", a.nodes, "nodes to use; every device of them gets a rank")->check(positive());
  app->add_option("--global-batch", a.global_batch, "sequences per step (required)")
      ->check(positive())
      ->default_str("");
  app->add_option("--seq", a.seq, "tokens per sequence (required)")->check(positive())->default_str("");
  app->add_option("--top", a.top, "print the K fastest layouts that fit")->type_name("K")->check(non_negative());
  app->add_flag("--explain", a.explain, "the top pick (or --layout) term by term");
  app->add_option("--precision", a.precision, "model precision")->check(one_of({"fp32", "bf16"}));
  app->add_option("--layout", a.layout,
                  "predict one layout: dp=2,tp=1,pp=2,ep=1,zero=1,mb=2,m=4,ckpt=0,schedule=1f1b[,offload=disk]"
                  "[,offload_params=disk]")
      ->type_name("SPEC");
  app->add_flag("--gpipe", a.gpipe, "also consider the GPipe schedule");
  app->add_flag("--json", a.json, "accepted for scripts; the last line is always SUMMARY {json}");
  app->add_option("--grad-dtype", a.grad_dtype,
                  "data-parallel gradients on the wire (default: bf16 under bf16, else fp32; 1bit: 1-bit Adam after "
                  "its warm-up)")
      ->check(one_of({"fp32", "bf16", "1bit"}));
  app->add_option("--inter-gbps", a.inter_gbps, "override the cluster's inter-node bandwidth (GB/s per node)")
      ->type_name("G")
      ->check(positive())
      ->default_str("");
  app->add_flag("--no-overlap", a.no_overlap, "data-parallel communication does not overlap the backward pass");
  app->add_option("--algorithm", a.algorithm, "collectives: auto (fastest of ring, tree, hierarchical) or one of them")
      ->check(one_of({"auto", "ring", "tree", "hierarchical"}));
  app->add_option("--calibrate", a.calibrate,
                  "time matrix products, memory bandwidth, loom's kernels and collectives with --threads K per rank "
                  "and write a cluster file of --devices D devices (0: cores / K) to F, the collective times to "
                  "F.comm.cal")
      ->type_name("F");
  app->add_option("--threads", a.threads, "threads per rank (--calibrate, --validate)")
      ->type_name("K")
      ->check(positive());
  app->add_option("--devices", a.devices, "devices of the calibrated cluster file (0: cores / K)")
      ->type_name("D")
      ->check(non_negative());
  app->add_option("--comm-calibration", a.comm_calibration, "reuse these collective times instead of measuring")
      ->type_name("FILE");
  app->add_flag("--validate", a.validate,
                "train a set of layouts here (loom train, loom launch) and compare predicted memory and step time "
                "with the measured ones; calibrates first unless --cluster is given");
  app->add_flag("--quick", a.quick, "--validate: four layouts");
  app->add_option("--out", a.out, "--validate: the working folder (default: a temporary one)")->type_name("DIR");
  app->add_option("--only", a.only, "--validate: the layouts whose model or description (as printed) contains TEXT")
      ->type_name("TEXT");
  app->add_option("--repeat", a.repeat,
                  "--validate: runs of each layout, round after round, keeping the faster (default 2, --quick 1)")
      ->type_name("N")
      ->check(positive());
  if (auto rc = parse(*app, argv)) return *rc;
  if (!a.calibrate.empty()) {
    const std::string& path = a.calibrate;
    const int threads = int(a.threads);
    std::printf("calibrating with %d thread%s per rank:\n", threads, threads > 1 ? "s" : "");
    const plan::Cluster c = calibrate(threads, int(a.devices), a.comm_calibration, path + ".comm.cal", true);
    io::write_file_atomic(path, plan::cluster_yaml(c));
    std::printf("wrote %s (%d devices per node)\n", path.c_str(), c.devices_per_node);
    return 0;
  }
  if (a.validate) return validate(a, *app);
  for (const char* k : {"model", "cluster", "global-batch", "seq"})
    if (!app->count(str_cat("--", k))) throw UsageError(str_cat("[plan] --", k, " is required (see loom plan --help)"));
  plan::Job job;
  job.model = model_of(a.model);
  job.global_batch = a.global_batch;
  job.seq = a.seq;
  job.nodes = int(a.nodes);
  job.bf16 = a.precision == "bf16";
  if (job.bf16) job.model.activation_dtype = DType::bf16;  // model.activation_dtype's default, as loom train
  job.algorithm = comm::parse_algorithm(a.algorithm);
  if (!a.grad_dtype.empty()) {
    const std::string& g = a.grad_dtype;
    if (g == "fp32")
      job.grad_wire_bytes = 4;
    else if (g == "bf16")
      job.grad_wire_bytes = 2;
    else if (g == "1bit")
      job.grad_wire_bytes = 1.0 / 8;
    else
      throw UsageError("[plan] --grad-dtype " + g + ": expected fp32, bf16 or 1bit");
  }
  if (job.global_batch < 1 || job.seq < 1 || job.nodes < 1)
    throw UsageError("[plan] --global-batch, --seq and --nodes must be positive");
  plan::Cluster cluster = plan::load_cluster(a.cluster);
  if (app->count("--inter-gbps")) {
    const double g = a.inter_gbps;
    cluster.links.inter.beta_s_per_byte = 1e-9 / g;
    cluster.name += str_cat(" (inter-node ", g, " GB/s)");
  }
  if (a.no_overlap) cluster.overlap_fraction = 0;
  if (cluster.max_nodes > 0 && job.nodes > cluster.max_nodes)
    throw UsageError(str_cat("[plan] --nodes ", job.nodes, ": ", cluster.path, " describes at most ", cluster.max_nodes,
                             " node(s)"));
  const int64_t n_params = model::ParamLayout(job.model).num_params();
  std::printf("plan: %s, %.3g B parameters, global batch %lld x %lld tokens, %d node%s of %s (%d x %s)\n",
              job.model.summary().c_str(), double(n_params) / 1e9, (long long)job.global_batch, (long long)job.seq,
              job.nodes, job.nodes > 1 ? "s" : "", cluster.name.c_str(), cluster.devices_per_node,
              cluster.device.name.c_str());
  std::vector<plan::Prediction> ranked;
  if (!a.layout.empty()) {
    ranked.push_back(plan::predict(job, cluster, parse_layout(a.layout)));
    if (!ranked.front().fits && ranked.front().time.step == 0)
      throw UsageError("[plan] --layout " + a.layout + ": " + ranked.front().why_not);
  } else {
    plan::SearchOptions so;
    if (a.gpipe) so.schedules = {parallel::PipeSchedule::one_f_one_b, parallel::PipeSchedule::gpipe};
    ranked = plan::search(job, cluster, so);
    if (ranked.empty())
      throw UsageError(str_cat("[plan] no valid layout of ", job.nodes * cluster.devices_per_node,
                               " devices for global batch ", job.global_batch));
  }
  const int64_t top = a.top;
  int64_t fitting = 0;
  for (const auto& p : ranked) fitting += p.fits;
  std::printf("%zu layouts considered, %lld fit\n\n%-36s %10s %12s %7s %11s\n", ranked.size(), (long long)fitting,
              "layout", "ms/step", "tokens/s", "MFU", "memory/rank");
  for (int64_t i = 0; i < int64_t(ranked.size()) && i < top; ++i) print_prediction_row(ranked[size_t(i)]);
  if (fitting == 0 && a.layout.empty()) {
    std::printf("\nno layout fits: the smallest needs %s per device; add nodes or use a smaller global batch\n",
                format_bytes(int64_t(ranked.front().memory.total())).c_str());
  }
  if (a.explain && !ranked.empty()) std::printf("\n%s", plan::explain(job, cluster, ranked.front()).c_str());
  nlohmann::json s = {{"model", job.model.name},
                      {"params", n_params},
                      {"cluster", cluster.name},
                      {"nodes", job.nodes},
                      {"devices", job.nodes * cluster.devices_per_node},
                      {"considered", ranked.size()},
                      {"fit", fitting}};
  s["top"] = nlohmann::json::array();
  for (int64_t i = 0; i < int64_t(ranked.size()) && i < top; ++i)
    s["top"].push_back(prediction_json(ranked[size_t(i)]));
  std::printf("SUMMARY %s\n", s.dump().c_str());
  return 0;
}

}  // namespace loom::cli

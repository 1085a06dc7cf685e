// `loom bench finetune`: tokens/s and peak resident memory per rank of fine-tuning a real model
// (SmolLM2-135M by default) on one rank and under data parallelism, loom beside PyTorch
// (bench/peers/torch_finetune.py: transformers' model on Debian's python3-torch, DDP over gloo)
// in the same invocation. Both sides load the same f32 weights (a Hugging Face directory this
// command writes) and train on the same tokens with the same batch, AdamW, clipping and threads.
// The work directory is bench_finetune_work.cpp's, the ranks bench_finetune_rank.cpp's.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <sstream>

#include <nlohmann/json.hpp>

#include "bench/loom/bench_finetune.h"
#include "bench/loom/peer_process.h"
#include "loom/comm/launch.h"
#include "loom/core/stats.h"
#include "loom/core/threads.h"
#include "loom/io/file.h"

namespace loom::cli {

namespace fs = std::filesystem;
using nlohmann::json;

FinetuneMode finetune_mode_from_name(const std::string& name) {
  if (name == "full") return FinetuneMode::full;
  if (name == "lora") return FinetuneMode::lora;
  throw UsageError(str_cat("[bench finetune] --mode ", name, ": expected full or lora"));
}

const char* finetune_mode_name(FinetuneMode mode) {
  switch (mode) {
    case FinetuneMode::full: return "full";
    case FinetuneMode::lora: return "lora";
  }
  return "?";
}

namespace {

std::vector<int64_t> dp_degrees(const std::string& list) {
  std::vector<int64_t> out;
  std::stringstream ss(list);
  for (std::string item; std::getline(ss, item, ',');) {
    char* end = nullptr;
    const long v = std::strtol(item.c_str(), &end, 10);
    if (item.empty() || *end || v < 1)
      throw UsageError(str_cat("[bench finetune] --dp ", list, ": expected data-parallel degrees such as 1,2"));
    out.push_back(v);
  }
  return out;
}

// One side's figures at one dp degree, per rank.
struct RunFigures {
  std::vector<json> ranks;
  bool ran() const { return !ranks.empty(); }
  // The median over steps of the slowest rank's time.
  double step_ms() const {
    std::vector<double> slowest;
    for (const json& r : ranks)
      for (size_t i = 0; i < r["step_ms"].size(); ++i) {
        if (slowest.size() <= i) slowest.push_back(0);
        slowest[i] = std::max(slowest[i], r["step_ms"][i].get<double>());
      }
    return median(slowest);
  }
  int64_t max_of(const char* key) const {
    int64_t v = 0;
    for (const json& r : ranks) v = std::max(v, r[key].get<int64_t>());
    return v;
  }
  std::vector<int64_t> each(const char* key) const {
    std::vector<int64_t> v;
    for (const json& r : ranks) v.push_back(r[key].get<int64_t>());
    return v;
  }
  double first_loss() const { return ranks.empty() ? 0.0 : ranks[0]["loss"][0].get<double>(); }
  // Pools another round's steps into these (ranks in the same order): the steps' times are
  // appended, the peaks are the larger, the losses stay the first round's.
  void add(const RunFigures& round) {
    if (ranks.empty()) {
      ranks = round.ranks;
      return;
    }
    for (size_t i = 0; i < ranks.size(); ++i) {
      json& r = ranks[i];
      const json& n = round.ranks[i];
      for (const json& ms : n["step_ms"]) r["step_ms"].push_back(ms);
      for (const char* k : {"rss_peak_bytes", "rss_start_bytes", "alloc_peak_bytes"})  // the last: loom's only
        if (r.contains(k)) r[k] = std::max(r[k].get<int64_t>(), n[k].get<int64_t>());
      r["rss_peak_is_steps_only"] = r["rss_peak_is_steps_only"].get<bool>() && n["rss_peak_is_steps_only"].get<bool>();
    }
  }
  // Whether every rank could reset its resident high-water mark after loading.
  bool peaks_of_steps_only() const {
    for (const json& r : ranks)
      if (!r["rss_peak_is_steps_only"].get<bool>()) return false;
    return true;
  }
};

// The step's shape as both loom's ranks and the peer take it: --batch, --micro-batch, --seq,
// --steps, --warmup and --threads (in all).
std::vector<std::string> step_args(const FinetuneBenchOptions& o, int64_t threads) {
  return {"--batch",       std::to_string(o.batch),
          "--micro-batch", std::to_string(o.micro_batch > 0 ? o.micro_batch : o.batch),
          "--seq",         std::to_string(o.seq),
          "--steps",       std::to_string(o.steps),
          "--warmup",      std::to_string(o.warmup),
          "--threads",     std::to_string(threads)};
}

RunFigures run_loom(const FinetuneBenchOptions& o, const std::string& work, int64_t dp, int64_t threads,
                    int64_t round) {
  // Under --trace (LOOM_TRACE_DIR, which loom launch forwards) each launch's ranks write to a
  // directory of their own, DIR/dp<N>[-round<R>], so that no run overwrites another's files.
  static const std::string trace_root = [] {
    const char* e = std::getenv("LOOM_TRACE_DIR");
    return std::string(e ? e : "");
  }();
  if (!trace_root.empty()) {
    const std::string dir = str_cat(trace_root, "/dp", dp, o.rounds > 1 ? str_cat("-round", round) : std::string());
    setenv("LOOM_TRACE_DIR", dir.c_str(), 1);
  }
  std::vector<std::string> args = {"--nproc", std::to_string(dp), "--", "bench", "finetune"};
  args.insert(args.end(), {"--mode", o.mode, "--work-dir", work});
  for (const std::string& a : step_args(o, threads)) args.push_back(a);
  const int rc = cmd_launch(args);
  if (rc != 0)
    throw Error(
        str_cat("[bench finetune] loom's ranks at dp=", dp, " failed (exit ", rc, "); their messages are above"));
  RunFigures f;
  for (int r = 0; r < dp; ++r) f.ranks.push_back(json::parse(io::read_file(finetune_rank_file(work, r))));
  return f;
}

// The peer's venv, built once (bench/peers/setup_transformers.sh); false, after its message on
// stderr, when it cannot be.
bool setup_peer(const std::string& venv) {
  const std::string setup = std::string(LOOM_SOURCE_DIR) + "/bench/peers/setup_transformers.sh";
  const int rc = std::system(str_cat("bash ", shell_quoted(setup), " ", shell_quoted(venv)).c_str());
  return rc == 0;
}

RunFigures run_peer(const FinetuneBenchOptions& o, const std::string& venv, const std::string& work, int64_t dp,
                    int64_t threads) {
  std::vector<std::string> argv = {venv + "/bin/python",
                                   std::string(LOOM_SOURCE_DIR) + "/bench/peers/torch_finetune.py",
                                   "--model",
                                   (fs::path(work) / kFinetuneModelDir).string(),
                                   "--tokens",
                                   (fs::path(work) / kFinetuneTokensFile).string(),
                                   "--nproc",
                                   std::to_string(dp)};
  for (const std::string& a : step_args(o, threads)) argv.push_back(a);
  if (o.mode == "lora") argv.push_back("--lora");
  PeerProcess peer(argv);
  RunFigures f;
  while (f.ranks.size() < size_t(dp)) {  // the peer's step lines pass through
    const std::string line = peer.read_line();
    if (line.rfind("RESULT ", 0) == 0) {
      f.ranks.push_back(json::parse(line.substr(7)));
    } else {
      std::printf("%s\n", line.c_str());
      std::fflush(stdout);
    }
  }
  std::sort(f.ranks.begin(), f.ranks.end(), [](const json& a, const json& b) { return a["rank"] < b["rank"]; });
  return f;
}

std::string mib(int64_t bytes) { return str_cat(std::llround(double(bytes) / (1 << 20)), " MiB"); }

// One row of the comparison at dp degree `dp` (`tokens` a step's, all ranks): loom's figures, the
// peer's when it ran (null otherwise), and their ratios.
json compare(int64_t tokens, int64_t dp, const RunFigures& l, const RunFigures& t) {
  const double lms = l.step_ms(), lrate = double(tokens) / lms * 1e3;
  json r = {{"dp", dp},
            {"threads_per_rank", l.ranks[0]["threads"]},
            {"loom_ms_median", lms},
            {"loom_tokens_per_s", lrate},
            {"loom_peak_rss_bytes", l.max_of("rss_peak_bytes")},
            {"loom_peak_rss_bytes_per_rank", l.each("rss_peak_bytes")},
            {"loom_rss_start_bytes", l.max_of("rss_start_bytes")},
            {"loom_alloc_peak_bytes", l.max_of("alloc_peak_bytes")},
            {"loom_model_state_bytes", l.max_of("model_state_bytes")},
            {"loom_first_loss", l.first_loss()}};
  if (!t.ran()) {
    for (const char* k : {"peer_ms_median", "peer_tokens_per_s", "peer_peak_rss_bytes", "peer_peak_rss_bytes_per_rank",
                          "peer_rss_start_bytes", "peer_first_loss", "peer_trained_params", "speedup", "memory_ratio"})
      r[k] = nullptr;
    return r;
  }
  const double tms = t.step_ms(), trate = double(tokens) / tms * 1e3;
  r.update({{"peer_ms_median", tms},
            {"peer_tokens_per_s", trate},
            {"peer_peak_rss_bytes", t.max_of("rss_peak_bytes")},
            {"peer_peak_rss_bytes_per_rank", t.each("rss_peak_bytes")},
            {"peer_rss_start_bytes", t.max_of("rss_start_bytes")},
            {"peer_first_loss", t.first_loss()},
            {"peer_trained_params", t.ranks[0]["trained_params"]},
            {"speedup", lrate / trate},
            {"memory_ratio", double(l.max_of("rss_peak_bytes")) / double(t.max_of("rss_peak_bytes"))}});
  return r;
}

void print_row(const json& r) {
  std::printf("%-4lld | %9.1f %10.1f %14s | ", (long long)r["dp"].get<int64_t>(), r["loom_ms_median"].get<double>(),
              r["loom_tokens_per_s"].get<double>(), mib(r["loom_peak_rss_bytes"].get<int64_t>()).c_str());
  if (r["peer_ms_median"].is_null()) {
    std::printf("%9s %10s %14s | %8s %8s\n", "-", "-", "-", "-", "-");
    return;
  }
  std::printf("%9.1f %10.1f %14s | %7.2fx %7.2fx\n", r["peer_ms_median"].get<double>(),
              r["peer_tokens_per_s"].get<double>(), mib(r["peer_peak_rss_bytes"].get<int64_t>()).c_str(),
              r["speedup"].get<double>(), r["memory_ratio"].get<double>());
}

// Where the peaks come from, and whether both sides started from the same loss (same weights
// and tokens).
void print_memory_notes(const json& r) {
  std::printf("dp=%lld: loom's allocator peak %s (model states %s), resident at the first step %s",
              (long long)r["dp"].get<int64_t>(), mib(r["loom_alloc_peak_bytes"].get<int64_t>()).c_str(),
              mib(r["loom_model_state_bytes"].get<int64_t>()).c_str(),
              mib(r["loom_rss_start_bytes"].get<int64_t>()).c_str());
  if (!r["peer_first_loss"].is_null())
    std::printf("; PyTorch resident at the first step %s; first-step loss (rank 0) loom %.5f, PyTorch %.5f",
                mib(r["peer_rss_start_bytes"].get<int64_t>()).c_str(), r["loom_first_loss"].get<double>(),
                r["peer_first_loss"].get<double>());
  std::printf("\n");
}

}  // namespace

int bench_finetune(const std::vector<std::string>& argv) {
  auto app = bench_app(
      "finetune",
      "Fine-tunes a real model (default: SmolLM2-135M-Instruct from scripts/fetch-test-model.sh) for --warmup + "
      "--steps steps on each data-parallel degree of --dp (loom's ranks via loom launch), and, alternating with "
      "them for --rounds rounds, the PyTorch peer (bench/peers/torch_finetune.py: transformers on Debian's "
      "python3-torch, DDP over gloo) on the same f32 weights, tokens, batch, AdamW (lr 3e-5, betas "
      "0.9/0.99, no weight decay), clipping at norm 1 and threads. Reports the median step, tokens/s "
      "and peak resident memory per rank during the steps, and loom/PyTorch ratios. The last line "
      "is SUMMARY {json}.");
  FinetuneBenchOptions o;
  app->add_option("--model", o.model, "a GGUF file, a Hugging Face directory, or a preset (random weights and ids)")
      ->type_name("PATH|PRESET")
      ->default_str("~/.cache/loom/models/SmolLM2-135M-Instruct.Q4_1.gguf");
  app->add_option("--mode", o.mode,
                  "what is trained: full (every weight) or lora (rank-8 adapters, alpha 16, on q_proj and v_proj, "
                  "the model frozen; the peer's written out the same way)")
      ->type_name("MODE");
  app->add_option("--dp", o.dp, "data-parallel degrees to run, one after the other")->type_name("LIST");
  app->add_option("--batch", o.batch, "sequences per step and rank")->type_name("B")->check(positive());
  add_run_default_option(*app, "--micro-batch", o.micro_batch, "sequences per forward/backward (default: --batch)", "M",
                         positive());
  app->add_option("--seq", o.seq, "tokens per sequence")->type_name("T")->check(positive());
  app->add_option("--steps", o.steps, "timed steps (each round)")->type_name("N")->check(positive());
  app->add_option("--warmup", o.warmup, "untimed steps first (each round)")->type_name("W")->check(non_negative());
  app->add_option("--rounds", o.rounds,
                  "rounds per degree, loom and PyTorch alternating; the medians pool every round's steps")
      ->type_name("R")
      ->check(positive());
  add_run_default_option(*app, "--threads", o.threads,
                         "compute threads in all (default: all cores); dp=N gives each rank 1/N of them", "K",
                         positive());
  app->add_option("--peer", o.peer, "torch: also run the PyTorch peer; none: loom alone")
      ->check(one_of({"torch", "none"}));
  app->add_option("--peer-venv", o.peer_venv, "the peer's venv (default: BUILD/peers/transformers-venv, made once)")
      ->type_name("DIR");
  app->add_option("--work-dir", o.work_dir, "(set by the command for its ranks) the directory it prepared")
      ->type_name("DIR");
  if (auto rc = parse(*app, argv)) return *rc;
  const FinetuneMode mode = finetune_mode_from_name(o.mode);
  const bool is_rank = comm::launch_env().under_mpi;
  if (is_rank != !o.work_dir.empty())
    throw UsageError(is_rank ? "[bench finetune] starts its own ranks; run it without loom launch (--dp 1,2)"
                             : "[bench finetune] --work-dir is for the ranks the command starts itself");
  if (is_rank) return bench_finetune_rank(o, mode);
  const int64_t B = o.batch, T = o.seq, M = o.micro_batch > 0 ? o.micro_batch : B;
  if (B % M != 0) throw UsageError(str_cat("[bench finetune] --micro-batch ", M, " does not divide --batch ", B));
  const std::vector<int64_t> degrees = dp_degrees(o.dp);
  const int64_t threads = o.threads > 0 ? o.threads : num_threads();
  if (o.model.empty()) o.model = default_finetune_model();

  const std::string work = new_temp_dir("loom-bench-finetune");
  struct RemoveOnExit {
    std::string dir;
    ~RemoveOnExit() {
      std::error_code ec;
      fs::remove_all(dir, ec);
    }
  } remove_work{work};
  const int64_t max_dp = *std::max_element(degrees.begin(), degrees.end());
  const FinetuneWork p = prepare_finetune_work(o.model, work, size_t(max_dp * B * T + 1));
  if (T > p.config.n_ctx)
    throw UsageError(str_cat("[bench finetune] --seq ", T, " exceeds the model's context of ", p.config.n_ctx));
  std::printf("bench finetune: %s fine-tuning of %s, %lld parameters, f32\n", finetune_mode_name(mode),
              p.config.summary().c_str(), (long long)p.params);
  std::printf("per rank and step: %lld x %lld tokens (micro-batches of %lld); %lld thread%s in all; tokens: %s\n",
              (long long)B, (long long)T, (long long)M, (long long)threads, threads == 1 ? "" : "s", p.tokens.c_str());
  std::fflush(stdout);

  const std::string venv = o.peer_venv.empty() ? peer_venv_dir("transformers-venv") : o.peer_venv;
  std::string peer_state = o.peer == "torch" ? "" : "not asked for (--peer none)";
  if (peer_state.empty() && !setup_peer(venv)) peer_state = "not run: its venv could not be made (the reason is above)";
  std::vector<RunFigures> loom_runs, peer_runs;
  for (int64_t dp : degrees) {
    const int64_t per_rank = std::max<int64_t>(1, threads / dp);
    loom_runs.emplace_back();
    peer_runs.emplace_back();
    for (int64_t round = 1; round <= o.rounds; ++round) {
      const std::string which = o.rounds > 1 ? str_cat(", round ", round, " of ", o.rounds) : "";
      std::printf("\n== dp=%lld%s: loom (%lld thread%s per rank)\n", (long long)dp, which.c_str(), (long long)per_rank,
                  per_rank == 1 ? "" : "s");
      std::fflush(stdout);
      loom_runs.back().add(run_loom(o, work, dp, threads, round));
      if (!peer_state.empty()) continue;
      std::printf("== dp=%lld%s: PyTorch\n", (long long)dp, which.c_str());
      std::fflush(stdout);
      try {
        peer_runs.back().add(run_peer(o, venv, work, dp, threads));
      } catch (const std::exception& e) {
        peer_state = str_cat("failed at dp=", dp, ": ", e.what());
        peer_runs.back() = {};
        std::printf("[bench finetune] the PyTorch peer %s; loom's figures only from here\n", peer_state.c_str());
      }
    }
  }
  if (!peer_state.empty()) std::printf("\nPyTorch peer: %s\n", peer_state.c_str());

  std::printf("\n%-4s | %-35s | %-35s | %s\n", "", "loom", "PyTorch", "loom/PyTorch");
  std::printf("%-4s | %9s %10s %14s | %9s %10s %14s | %8s %8s\n", "dp", "ms/step", "tokens/s", "peak RSS/rank",
              "ms/step", "tokens/s", "peak RSS/rank", "tok/s", "memory");
  json runs = json::array();
  bool peer_ran = false, steps_only = true;
  for (size_t i = 0; i < degrees.size(); ++i) {
    runs.push_back(compare(degrees[i] * B * T, degrees[i], loom_runs[i], peer_runs[i]));
    print_row(runs.back());
    peer_ran = peer_ran || peer_runs[i].ran();
    steps_only = steps_only && loom_runs[i].peaks_of_steps_only() && peer_runs[i].peaks_of_steps_only();
  }
  std::printf(
      "\nms/step: the median over the timed steps of the slowest rank; tokens/s: all ranks' tokens per step over "
      "it.\npeak RSS/rank: the largest rank's resident-set high-water mark over the steps (weights, gradients, Adam "
      "moments, activations, libraries), %s.\n",
      steps_only ? "reset after loading the model"
                 : "NOT reset after loading here (no /proc/self/clear_refs): loading counts");
  for (const json& r : runs) print_memory_notes(r);
  const json s = {{"model", p.name},
                  {"mode", finetune_mode_name(mode)},
                  {"params", p.params},
                  {"batch_per_rank", B},
                  {"micro_batch", M},
                  {"seq", T},
                  {"steps", o.steps},
                  {"warmup", o.warmup},
                  {"rounds", o.rounds},
                  {"threads", threads},
                  {"tokens", p.tokens},
                  {"peer", peer_ran ? json("torch") : json(nullptr)},
                  {"rss_peak_of_steps_only", steps_only},
                  {"peer_state", peer_state.empty() ? "ran" : peer_state},
                  {"runs", runs}};
  std::printf("SUMMARY %s\n", s.dump().c_str());
  return 0;
}

}  // namespace loom::cli

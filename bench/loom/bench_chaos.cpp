// `loom bench chaos [--trials N] [--nproc P] [--interval S] -- train CONFIG ...`: fault injection
// against elastic training. First the run uninterrupted (`loom launch`), then the same run under
// `loom launch --max-restarts` while this process strikes it, the kinds in turn, each time at a
// random rank: SIGKILL, SIGSTOP (a hang, which the watchdog must find and name), or corrupting
// the newest checkpoint and then SIGKILL (the resume must skip it, unless a newer checkpoint was
// completed between the two). Each trial waits for the job to train
// again before the next. Batches are a pure function of (seed, step), so the final weights and
// Adam moments must equal the uninterrupted run's bitwise. Reports recoveries, time lost per
// failure (the launcher's accounting), hang detection latency and goodput (uninterrupted wall
// time over the struck run's).
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <regex>
#include <sstream>

#include <nlohmann/json.hpp>

#include "bench/loom/bench.h"
#include "bench/loom/peer_process.h"
#include "loom/core/stats.h"
#include "loom/core/timer.h"
#include "loom/io/file.h"

namespace loom::cli {
namespace {

namespace fs = std::filesystem;

// Starts argv with stdout and stderr into one pipe (returned in *out_fd), `tag` in LOOM_CHAOS_TAG.
pid_t spawn(const std::vector<std::string>& argv, const std::string& tag, int* out_fd) {
  int p[2];
  LOOM_CHECK(pipe(p) == 0, "bench", "pipe failed");
  const pid_t pid = fork();
  LOOM_CHECK(pid >= 0, "bench", "fork failed");
  if (pid == 0) {
    setpgid(0, 0);  // its own process group: the cleanup can end everything it started
    dup2(p[1], 1);
    dup2(p[1], 2);
    close(p[0]);
    close(p[1]);
    setenv("LOOM_CHAOS_TAG", tag.c_str(), 1);
    exec_or_exit(argv, "bench", /*search_path=*/false);
  }
  close(p[1]);
  *out_fd = p[0];
  return pid;
}

// The processes whose environment holds LOOM_CHAOS_TAG=tag, each with its MPI rank (-1: the
// launcher or mpirun), from one pass over /proc.
std::vector<std::pair<pid_t, int>> tagged_processes(const std::string& tag) {
  const std::string want_tag = "LOOM_CHAOS_TAG=" + tag, rank_key = "OMPI_COMM_WORLD_RANK=";
  std::vector<std::pair<pid_t, int>> out;
  for (const auto& e : fs::directory_iterator("/proc")) {
    const std::string name = e.path().filename().string();
    if (name.empty() || !std::all_of(name.begin(), name.end(), ::isdigit)) continue;
    std::ifstream in(e.path() / "environ", std::ios::binary);
    if (!in) continue;
    bool has_tag = false;
    int rank = -1;
    for (std::string kv; std::getline(in, kv, '\0');) {
      has_tag = has_tag || kv == want_tag;
      if (kv.rfind(rank_key, 0) == 0) rank = std::atoi(kv.c_str() + rank_key.size());
    }
    if (has_tag) out.push_back({pid_t(std::stol(name)), rank});
  }
  return out;
}

// The pid of rank r of the job tagged `tag`, or -1 (between attempts).
pid_t find_rank(const std::string& tag, int rank) {
  for (const auto& [pid, r] : tagged_processes(tag))
    if (r == rank) return pid;
  return -1;
}

// Every process of the job (ranks included), for the cleanup.
void kill_tagged(const std::string& tag) {
  for (const auto& [pid, r] : tagged_processes(tag)) kill(pid, SIGKILL);
}

bool flip_middle_byte(const std::string& path) {
  std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
  if (!f) return false;
  f.seekg(0, std::ios::end);
  const auto size = f.tellg();
  if (size < 16) return false;
  const std::streamoff at = std::streamoff(size) / 2;
  f.seekg(at);
  char c = 0;
  f.read(&c, 1);
  c = char(c ^ 0x5a);
  f.seekp(at);
  f.write(&c, 1);
  return bool(f);
}

bool same_bytes(const std::string& a, const std::string& b) {
  try {
    return io::read_file(a) == io::read_file(b);
  } catch (const std::exception&) {
    return false;
  }
}

std::string last_value_of(const std::vector<std::string>& args, const std::string& key) {
  std::string v;
  for (size_t i = 0; i + 1 < args.size(); ++i)
    if (args[i] == "--set" && args[i + 1].rfind(key + "=", 0) == 0) v = args[i + 1].substr(key.size() + 1);
  return v;
}

}  // namespace

int bench_chaos(const std::vector<std::string>& args) {
  auto app = bench_app("chaos",
                       "loom bench chaos [options] -- train CONFIG [--set k=v]...: runs the training uninterrupted, "
                       "then again under loom launch --max-restarts while striking it --trials times, the --kinds "
                       "in turn: SIGKILL of a random rank, SIGSTOP of one (a hang), or a corrupted newest checkpoint "
                       "followed by a kill. Strikes are spread over the run's steps, or come every S seconds with "
                       "--interval. The run needs checkpoint.every_steps (or every_minutes) and enough steps to host "
                       "the trials. The last line is SUMMARY {json} with trials, recovered, bitwise_equal and "
                       "goodput.");
  int trials = 20, nproc = 4;
  int64_t seed = 1;
  double interval = 0, timeout = 5;
  std::string kinds_text = "kill,stop,corrupt", work;
  bool keep = false;
  std::vector<std::string> train;
  app->add_option("--trials", trials, "strikes")->type_name("N")->check(positive());
  app->add_option("--nproc", nproc, "ranks of the training")->type_name("P")->check(in_range(2, 1 << 20));
  app->add_option("--interval", interval, "seconds between strikes (0: spread over the run's steps)")
      ->type_name("S")
      ->check(non_negative());
  app->add_option("--kinds", kinds_text, "strikes to take turns, of kill, stop, corrupt")->type_name("LIST");
  app->add_option("--timeout", timeout, "the ranks' collective timeout in seconds")->type_name("S")->check(positive());
  app->add_option("--seed", seed, "seeds the strikes")->type_name("K");
  app->add_option("--work", work, "working directory (default: a new one under /tmp)")->type_name("DIR");
  app->add_flag("--keep", keep, "keep the runs' checkpoints in the working directory");
  app->add_option("TRAINING", train, "the training to strike, after --: train CONFIG.yaml [--set k=v]...")
      ->type_name("ARGS");
  if (auto rc = parse(*app, args)) return *rc;
  auto sep = std::find(args.begin(), args.end(), "--");
  if (sep == args.end() || train.size() != size_t(args.end() - sep - 1) || train.empty() || train[0] != "train")
    throw UsageError("[bench] give the training after --, e.g. loom bench chaos --trials 3 -- train CONFIG.yaml");
  std::vector<std::string> kinds;
  {
    std::stringstream ss(kinds_text);
    for (std::string k; std::getline(ss, k, ',');) {
      LOOM_CHECK(k == "kill" || k == "stop" || k == "corrupt", "bench", "--kinds: unknown kind '", k,
                 "' (kill, stop, corrupt)");
      kinds.push_back(k);
    }
  }
  LOOM_CHECK(last_value_of(train, "checkpoint.dir").empty(), "bench",
             "leave checkpoint.dir out: the benchmark puts each run's checkpoints in its --work directory");
  LOOM_CHECK(trials >= 1 && nproc >= 2 && !kinds.empty(), "bench", "--trials >= 1, --nproc >= 2 and some --kinds");
  LOOM_CHECK(
      last_value_of(train, "checkpoint.every_steps").size() || last_value_of(train, "checkpoint.every_minutes").size(),
      "bench",
      "the training needs --set checkpoint.every_steps=K (or every_minutes): without checkpoints "
      "every restart begins at step 0");
  std::mt19937_64 rng{uint64_t(seed)};
  if (work.empty()) work = new_temp_dir("loom-chaos");
  fs::create_directories(work);
  const std::string exe = launch_exe();
  const std::string tag = str_cat(getpid(), "-", rng() % 1000000);
  auto job_args = [&](const std::string& ckdir, bool elastic) {
    std::vector<std::string> v = {exe, "launch", "--nproc", std::to_string(nproc), "--timeout", str_cat(timeout)};
    if (elastic) v.insert(v.end(), {"--max-restarts", std::to_string(trials + 5), "--restart-delay", "0.5"});
    v.push_back("--");
    v.insert(v.end(), train.begin(), train.end());
    // Progress lines every step (the strikes and recoveries are timed by them), unless set.
    for (const std::string& s :
         {"checkpoint.dir=" + ckdir, std::string("log.every=1"), std::string("log.progress=off")}) {
      if (s.rfind("checkpoint.dir=", 0) != 0 && !last_value_of(train, s.substr(0, s.find('='))).empty()) continue;
      v.push_back("--set");
      v.push_back(s);
    }
    v.push_back("--overwrite-checkpoints");
    return v;
  };
  // 1. Uninterrupted.
  std::fprintf(stderr, "[chaos] %d ranks; uninterrupted run first (work directory %s)\n", nproc, work.c_str());
  int ref_fd = -1;
  Stopwatch ref_sw;
  const pid_t ref_pid = spawn(job_args(work + "/ref", false), tag + "-ref", &ref_fd);
  {
    std::ofstream log(work + "/ref.log");
    char buf[65536];
    for (ssize_t n; (n = read(ref_fd, buf, sizeof buf)) > 0;) log.write(buf, n);
  }
  close(ref_fd);
  int status = 0;
  waitpid(ref_pid, &status, 0);
  const double ref_s = ref_sw.seconds();
  LOOM_CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0, "bench", "the uninterrupted run failed; see ", work,
             "/ref.log");
  std::fprintf(stderr, "[chaos] uninterrupted: %.1f s\n", ref_s);

  // 2. Struck.
  int fd = -1;
  Stopwatch sw;
  const pid_t pid = spawn(job_args(work + "/chaos", true), tag, &fd);
  std::ofstream log(work + "/chaos.log");
  std::string pending;
  int64_t step = -1, total = -1;
  int recovered_lines = 0, done = 0, recovered = 0, corrupt_skipped = 0;
  bool finished = false, waiting = false, hang_named_all = true;
  double struck_at = -1, next_at = interval > 0 ? interval : -1;
  std::string kind, corrupted;
  int waiting_for = 0;
  std::vector<double> hang_latency, lost;
  std::map<std::string, int> kind_count;
  std::vector<nlohmann::json> trial_log;
  const std::regex step_re(R"(^\[rank 0\] step +(\d+)/(\d+))"), lost_re(R"(time lost to it ([0-9.]+) s)");
  auto target_step = [&](int i) {  // spread over the run, a little jitter
    const double slot = double(total) / double(trials + 1);
    std::uniform_real_distribution<double> jit(-0.25 * slot, 0.25 * slot);
    return int64_t(slot * (i + 1) + jit(rng));
  };
  int64_t next_step = -1;
  auto on_line = [&](const std::string& line) {
    log << line << "\n";
    std::smatch m;
    if (std::regex_search(line, m, step_re)) {
      step = std::stoll(m[1]);
      total = std::stoll(m[2]);
      if (next_step < 0 && interval <= 0) next_step = target_step(0);
    }
    if (line.find("[launch] ") == 0) std::fprintf(stderr, "%s\n", line.c_str());
    if (line.find("was training again") != std::string::npos) {
      ++recovered_lines;
      if (std::regex_search(line, m, lost_re)) lost.push_back(std::stod(m[1]));
    }
    if (line.find("[launch] job finished") == 0) finished = true;
    if (line.find("[watchdog] rank") != std::string::npos && kind == "stop" && waiting &&
        hang_latency.size() < size_t(kind_count["stop"])) {
      hang_latency.push_back(sw.seconds() - struck_at);
      const bool named = std::regex_search(line, std::regex(R"(\[watchdog\] rank \d+: \S+ #\d+ on group)"));
      hang_named_all = hang_named_all && named;
    }
    if (!corrupted.empty() && line.find("[resume] skipping " + corrupted) != std::string::npos) ++corrupt_skipped;
  };
  auto strike = [&]() {
    kind = kinds[size_t(done) % kinds.size()];  // in turn, so that every kind is exercised
    const int victim = int(rng() % uint64_t(nproc));
    std::uniform_int_distribution<int> delay_ms(0, 200);
    usleep(useconds_t(delay_ms(rng)) * 1000);
    std::string what = kind;
    if (kind == "corrupt") {
      std::string latest;
      try {
        latest = io::read_file(work + "/chaos/latest");
      } catch (const std::exception&) {
      }
      while (!latest.empty() && (latest.back() == '\n' || latest.back() == ' ')) latest.pop_back();
      const std::string path = work + "/chaos/" + latest;
      if (!latest.empty() && flip_middle_byte(path + "/model.safetensors")) {
        corrupted = path;
        what = str_cat("corrupt ", latest, "/model.safetensors, then kill");
      } else {
        kind = "kill";
        what = "kill (no checkpoint to corrupt yet)";
      }
    }
    pid_t p = -1;
    for (int tries = 0; tries < 100 && (p = find_rank(tag, victim)) < 0; ++tries) usleep(100000);
    if (p < 0) return false;
    kill(p, kind == "stop" ? SIGSTOP : SIGKILL);
    struck_at = sw.seconds();
    ++kind_count[kind];
    waiting = true;
    waiting_for = recovered_lines + 1;
    std::fprintf(stderr, "[chaos] trial %d/%d at step %lld: %s rank %d (pid %d)\n", done + 1, trials, (long long)step,
                 what.c_str(), victim, int(p));
    trial_log.push_back({{"trial", done + 1}, {"step", step}, {"kind", kind}, {"rank", victim}, {"at_s", struck_at}});
    ++done;
    return true;
  };
  char buf[65536];
  bool open = true;
  while (open) {
    pollfd pf{fd, POLLIN, 0};
    const int pr = poll(&pf, 1, 50);
    if (pr > 0) {
      const ssize_t n = read(fd, buf, sizeof buf);
      if (n <= 0) {
        open = false;
      } else {
        pending.append(buf, size_t(n));
        for (size_t nl; (nl = pending.find('\n')) != std::string::npos;) {
          on_line(pending.substr(0, nl));
          pending.erase(0, nl + 1);
        }
      }
    }
    if (waiting && recovered_lines >= waiting_for) {
      waiting = false;
      ++recovered;
      trial_log.back()["recovered_after_s"] = sw.seconds() - struck_at;
      if (interval > 0)
        next_at = struck_at + interval;
      else
        next_step = done < trials ? std::max(step + 1, target_step(done)) : -1;
    }
    if (waiting && sw.seconds() - struck_at > timeout + 180) {
      std::fprintf(stderr, "[chaos] trial %d did not recover within %.0f s; ending the job\n", done, timeout + 180);
      kill(-pid, SIGKILL);
      kill_tagged(tag);
      break;
    }
    if (!waiting && !finished && done < trials && step >= 0) {
      const bool due = interval > 0 ? sw.seconds() >= next_at : (next_step >= 0 && step >= next_step);
      if (due && !strike()) std::fprintf(stderr, "[chaos] no rank to strike (between attempts?); trying again\n");
    }
  }
  close(fd);
  waitpid(pid, &status, 0);
  const double chaos_s = sw.seconds();
  kill_tagged(tag);  // nothing of the job may outlive the benchmark (a stopped rank included)
  const bool ok_exit = WIFEXITED(status) && WEXITSTATUS(status) == 0;
  // 3. Compare the final state.
  std::string last;
  for (const auto& e : fs::directory_iterator(work + "/ref"))
    if (e.path().filename().string().rfind("step_", 0) == 0) last = std::max(last, e.path().filename().string());
  bool equal = ok_exit && !last.empty();
  for (const char* f : {"model.safetensors", "optimizer.exp_avg.safetensors", "optimizer.exp_avg_sq.safetensors"})
    equal = equal && same_bytes(work + "/ref/" + last + "/" + f, work + "/chaos/" + last + "/" + f);
  const double goodput = ref_s / chaos_s;
  std::sort(lost.begin(), lost.end());
  std::printf("chaos: %d trials (%d kill, %d stop, %d corrupt), %d recovered; job %s\n", done, kind_count["kill"],
              kind_count["stop"], kind_count["corrupt"], recovered, ok_exit ? "finished" : "FAILED");
  std::printf("final weights and moments (%s) bitwise equal to the uninterrupted run: %s\n", last.c_str(),
              equal ? "yes" : "NO");
  std::printf("uninterrupted %.1f s, struck %.1f s: goodput %.1f%%\n", ref_s, chaos_s, 100 * goodput);
  if (!lost.empty())
    std::printf("time lost per failure (launcher): median %.1f s, max %.1f s\n", lost[lost.size() / 2], lost.back());
  if (!hang_latency.empty())
    std::printf("hangs detected after %.1f s at most (collective timeout %.1f s), named: %s\n",
                *std::max_element(hang_latency.begin(), hang_latency.end()), timeout, hang_named_all ? "yes" : "NO");
  if (kind_count["corrupt"])
    std::printf("corrupted checkpoints skipped on resume: %d of %d\n", corrupt_skipped, kind_count["corrupt"]);
  nlohmann::json s = {{"trials", done},
                      {"recovered", recovered},
                      {"bitwise_equal", equal},
                      {"goodput", goodput},
                      {"finished", ok_exit},
                      {"kills", kind_count["kill"]},
                      {"stops", kind_count["stop"]},
                      {"corrupts", kind_count["corrupt"]},
                      {"corrupt_skipped", corrupt_skipped},
                      {"uninterrupted_s", ref_s},
                      {"struck_s", chaos_s},
                      {"lost_s", lost},
                      {"hang_detect_s", hang_latency},
                      {"hangs_named", hang_named_all},
                      {"collective_timeout_s", timeout},
                      {"work", work},
                      {"log", trial_log}};
  if (!keep) {
    std::error_code ec;
    fs::remove_all(work + "/ref", ec);
    fs::remove_all(work + "/chaos", ec);
  }
  std::printf("SUMMARY %s\n", s.dump().c_str());
  return ok_exit && equal && recovered == done ? 0 : 1;
}

}  // namespace loom::cli

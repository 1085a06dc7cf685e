// `loom bench cascade`: an edge/center cascade over an emulated WAN (docs/CASCADE.md). One
// center and two edges run as `loom serve` processes, on test hosts (scripts/testhosts.sh:
// network namespaces) when root, else on loopback; the WAN between them is a delay-and-rate
// relay (bench/loom/wan_relay.h). Replays a workload (chat questions through the model's own
// template, or Tiny Shakespeare and modern text) against the center alone, then against the
// edges for each confidence threshold, scores every answer with the center model, optionally
// rolls out a new edge model mid-run, and prints SUMMARY {json} last.
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <set>
#include <thread>

#include "bench/loom/bench.h"
#include "bench/loom/bench_cascade_run.h"
#include "bench/loom/load_client.h"
#include "bench/loom/peer_process.h"
#include "bench/loom/wan_relay.h"
#include "loom/core/error.h"
#include "loom/core/stats.h"
#include "loom/core/timer.h"
#include "loom/infer/quant_checkpoint.h"
#include "loom/io/file.h"
#include "loom/io/svg_plot.h"
#include "loom/model/checkpoint_reader.h"
#include "loom/serve/chat_template.h"
#include "loom/serve/client/http_client.h"
#include "tools/loom/inference_model.h"

namespace loom::cli {

namespace {

namespace fs = std::filesystem;
using nlohmann::json;

double parse_seconds(const std::string& s) {
  if (s.size() > 2 && s.substr(s.size() - 2) == "ms") return std::stod(s.substr(0, s.size() - 2)) / 1e3;
  if (s.size() > 2 && s.substr(s.size() - 2) == "us") return std::stod(s.substr(0, s.size() - 2)) / 1e6;
  if (!s.empty() && s.back() == 's') return std::stod(s.substr(0, s.size() - 1));
  return std::stod(s);
}

double parse_rate(std::string s) {
  for (auto& c : s) c = char(std::tolower(c));
  const std::pair<const char*, double> units[] = {{"gbit", 1e9}, {"mbit", 1e6}, {"kbit", 1e3}, {"bit", 1}};
  for (const auto& [u, f] : units)
    if (s.size() > std::strlen(u) && s.substr(s.size() - std::strlen(u)) == u)
      return std::stod(s.substr(0, s.size() - std::strlen(u))) * f;
  return std::stod(s);
}

// Test hosts for the run: `testhosts.sh up 3` when asked (or root, for auto); down at the end.
class Hosts {
 public:
  Hosts(const std::string& mode) {
    if (mode == "off") return;
    const std::string script = std::string(LOOM_SOURCE_DIR) + "/scripts/testhosts.sh";
    if (mode == "auto" && geteuid() != 0) return;
    const int rc = std::system((script + " up 3 >&2").c_str());
    if (rc == 0) {
      script_ = script;
      return;
    }
    if (mode == "on")
      fail("bench cascade", "--hosts on: `", script, " up 3` failed (exit ", rc, "); run as root or give --hosts off");
    std::fprintf(stderr, "[bench cascade] test hosts unavailable (testhosts.sh exit %d): running on loopback\n", rc);
  }
  ~Hosts() {
    if (!script_.empty()) std::system((script_ + " down >&2").c_str());
  }
  bool up() const { return !script_.empty(); }
  // Host i (1: center, 2 and 3: edges): its address and the command prefix that runs in it.
  std::string addr(int i) const { return up() ? str_cat("198.18.0.", 10 + i) : "127.0.0.1"; }
  std::vector<std::string> prefix(int i) const {
    return up() ? std::vector<std::string>{"ip", "netns", "exec", str_cat("loomh", i)} : std::vector<std::string>{};
  }
  std::string router() const { return up() ? "198.18.0.1" : "127.0.0.1"; }

 private:
  std::string script_;
};

struct Server {
  std::unique_ptr<PeerProcess> proc;
  std::string url;
};

Server start_server(std::vector<std::string> argv, const std::string& host) {
  Server s;
  argv.insert(argv.end(), {"--host", host, "--port", "0", "--no-access-log"});
  s.proc = std::make_unique<PeerProcess>(argv);
  const std::string listening = s.proc->read_until("[serve] listening on http://");
  const size_t colon = listening.find(':'), space = listening.find(' ');
  s.url = "http://" + host + ":" + listening.substr(colon + 1, space - colon - 1);
  s.proc->read_until("[serve] ready");
  return s;
}

json get_json(const std::string& url, const std::string& path) {
  const serve::Url u = serve::parse_url(url);
  serve::HttpClient c(u.host, u.port, 30);
  serve::ClientResponse r = c.request("GET", path);
  LOOM_CHECK(r.status == 200, "bench cascade", "GET ", url, path, " answered ", r.status);
  return json::parse(r.body);
}

// Waits until the edge has read the manifest and runs the version its weight choice names.
void wait_settled(const std::string& edge_url, const std::string& center_url, double timeout_s) {
  const double deadline = now_seconds() + timeout_s;
  while (true) {
    const json st = get_json(edge_url, "/v1/cascade/status");
    const json m = get_json(center_url, "/v1/cascade/manifest");
    const std::string choice = st.value("choice", "");
    if (st.value("polled", false) && !choice.empty() && m["edge_models"].contains(choice) &&
        m["edge_models"][choice].value("version", "") == st.value("version", ""))
      return;
    LOOM_CHECK(now_seconds() < deadline, "bench cascade", "edge ", edge_url, " did not settle on its model within ",
               timeout_s, " s: ", st.dump());
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
}

struct Row {
  std::string name;
  double threshold = std::nan("");
  int64_t ok = 0, failed = 0, at_edge = 0;
  double mean = 0, p50 = 0, p99 = 0, duration = 0, center_rps = 0, loglik = 0, quality = 0, agreement = 0;
  double latency_speedup = 1, load_reduction = 0, quality_ratio = 1;
};

// The row of one run; its answers are scored (score_answers).
Row summarize(const std::string& name, double threshold, const std::vector<CascadeAnswer>& answers,
              const std::vector<CascadeAnswer>* reference, double duration) {
  Row r;
  r.name = name;
  r.threshold = threshold;
  std::vector<double> lat;
  double logprob = 0;
  int64_t tokens = 0, agree = 0;
  for (size_t i = 0; i < answers.size(); ++i) {
    const CascadeAnswer& a = answers[i];
    if (!a.ok) {
      ++r.failed;
      continue;
    }
    ++r.ok;
    lat.push_back(a.latency_s);
    if (a.answered_by == "edge") ++r.at_edge;
    logprob += a.score.logprob;
    tokens += a.score.tokens;
    if (reference && (*reference)[i].ok && (*reference)[i].text == a.text) ++agree;
  }
  const bench::LatencyStats l = bench::latency_stats(std::move(lat));
  r.mean = l.mean;
  r.p50 = l.p50;
  r.p99 = l.p99;
  r.duration = duration;
  r.center_rps = double(r.ok - r.at_edge) / std::max(duration, 1e-9);
  r.loglik = tokens > 0 ? logprob / double(tokens) : 0;
  r.quality = tokens > 0 ? std::exp(r.loglik) : 0;
  r.agreement = r.ok > 0 ? double(agree) / double(r.ok) : 0;
  return r;
}

// An edge model as the edges download it: a quantized checkpoint as given, or a model path (a
// GGUF file, a Hugging Face directory, a loom checkpoint) quantized to `variant` into out/name
// the way `loom quantize` does it.
std::string edge_model_dir(const std::string& option, const std::string& given, const std::string& variant,
                           int64_t group, const fs::path& out, const std::string& name) {
  if (infer::is_quantized_checkpoint(given)) return given;
  const fs::path dir = out / name;
  try {
    const InferenceModel m =
        write_quantized_checkpoint(given, *infer::parse_quant_spec(variant, group), dir.string(), stderr);
    std::fprintf(stderr, "[bench cascade] %s %s: quantized to %s into %s\n", option.c_str(), given.c_str(),
                 m.precision().c_str(), dir.c_str());
  } catch (const Error& e) {
    fail("bench cascade", option, " ", given, ": ", e.what(),
         "; give a `loom quantize` output or a model path (a GGUF file, a Hugging Face directory, a loom "
         "checkpoint) to quantize to ",
         variant);
  }
  return dir.string();
}

}  // namespace

int bench_cascade(const std::vector<std::string>& argv) {
  auto app = bench_app("cascade",
                       "An edge/center cascade over an emulated WAN: the center alone, then two edges for each "
                       "confidence threshold; latency, center load and answer quality (the center model's "
                       "log-likelihood of the answers, and agreement with its own greedy answers). Writes "
                       "OUT/cascade_sweep.csv and OUT/cascade_sweep.svg; the last line is SUMMARY {json}.");
  std::string center_checkpoint, edge_int8, edge_int4, update_int8, update_int4, thresholds_text,
      wan = "40ms,20mbit", hosts_mode = "auto", out_dir = "runs/bench-cascade", workload = "auto", edge_quant = "auto";
  int64_t requests = 0, max_tokens_opt = 0, edge_group = -1, window = 16, center_threads_n = 2, edge_threads_n = 1,
          seed_opt = 0;
  double rate_opt = 0;
  bool quick = false;
  app->add_option("--center", center_checkpoint,
                  "the center's model, in f32: a checkpoint or run directory, a GGUF file or a Hugging Face "
                  "directory")
      ->type_name("PATH")
      ->required();
  auto edge_help = [](const char* variant) {
    return str_cat("the edge model in ", variant, ": a `loom quantize` output, or a model path (as --center) that the ",
                   "bench quantizes to ", variant, " into OUT/edge-", variant,
                   " as `loom quantize` does (a GGUF's Q8_0/Q4_1 blocks kept)");
  };
  app->add_option("--edge-int8", edge_int8, edge_help("int8") + "; the edges start on it")
      ->type_name("PATH")
      ->required();
  app->add_option("--edge-int4", edge_int4, edge_help("int4"))->type_name("PATH")->required();
  app->add_option("--update-int8", update_int8,
                  "a newer int8 edge model (as --edge-int8), published mid-run at the recommended threshold")
      ->type_name("PATH");
  app->add_option("--update-int4", update_int4,
                  "a newer int4 edge model (as --edge-int4), published mid-run at the recommended threshold")
      ->type_name("PATH");
  add_run_default_option(
      *app, "--edge-group", edge_group,
      "weights per scale of the edge models the bench quantizes (default: the format's; a GGUF's 32, "
      "which keeps its blocks)",
      "N", non_negative());
  app->add_option("--edge-quant", edge_quant,
                  "the weights the edges download (loom serve --edge-quant; auto: int4 on a slow link)")
      ->check(one_of({"auto", "int8", "int4"}));
  app->add_option("--workload", workload,
                  "chat: data/chat/questions.txt through the center model's chat template; text: Tiny Shakespeare "
                  "and modern text to continue; auto: chat when the model has a template")
      ->check(one_of({"auto", "chat", "text"}));
  app->add_option("--thresholds", thresholds_text,
                  "confidence thresholds, each in [0, 1] (default 0,0.2,0.3,0.4,0.5,0.6,1; --quick 0,0.5,1)")
      ->type_name("LIST");
  add_run_default_option(*app, "--requests", requests, "requests per run (default 60; --quick 12)", "N",
                         in_range(2, 1e9));
  add_run_default_option(*app, "--rate", rate_opt, "Poisson arrivals per second (default 1; --quick 8)", "R",
                         positive());
  add_run_default_option(*app, "--max-tokens", max_tokens_opt, "tokens per answer (default 32; --quick 12)", "M",
                         positive());
  app->add_option("--window", window, "tokens the edge's confidence is measured over")
      ->type_name("W")
      ->check(positive());
  app->add_option("--wan", wan, "the WAN link, one-way delay and rate")->type_name("DELAY,RATE");
  app->add_option("--hosts", hosts_mode, "test hosts in network namespaces (auto: when root)")
      ->check(one_of({"auto", "on", "off"}));
  app->add_option("--center-threads", center_threads_n, "the center's compute threads")
      ->type_name("N")
      ->check(positive());
  app->add_option("--edge-threads", edge_threads_n, "each edge's compute threads")->type_name("N")->check(positive());
  app->add_option("--out", out_dir, "where the CSV, SVG and edge caches go")->type_name("DIR");
  app->add_flag("--quick", quick, "a CI-sized run");
  app->add_option("--seed", seed_opt, "workload and arrivals")->type_name("S");
  if (auto rc = parse(*app, argv)) return *rc;
  auto given = [&](const char* name) { return app->count(name) > 0; };
  std::string center_dir;
  try {
    center_dir = resolve_inference_checkpoint(center_checkpoint, nullptr);
  } catch (const Error& e) {
    fail("bench cascade", "--center ", center_checkpoint, ": ", e.what());
  }
  std::vector<double> thresholds;
  {
    const std::string list = !thresholds_text.empty() ? thresholds_text : quick ? "0,0.5,1" : "0,0.2,0.3,0.4,0.5,0.6,1";
    size_t at = 0;
    while (at <= list.size()) {
      size_t comma = std::min(list.find(',', at), list.size());
      double t = -1;
      try {
        t = std::stod(list.substr(at, comma - at));
      } catch (const std::exception&) {
      }
      if (!(t >= 0 && t <= 1))
        throw UsageError(str_cat("[bench cascade] --thresholds ", list, ": each must be a number in [0, 1]"));
      thresholds.push_back(t);
      at = comma + 1;
    }
  }
  const int64_t n_requests = given("--requests") ? requests : quick ? 12 : 60;
  const double rate = given("--rate") ? rate_opt : quick ? 8 : 1;
  const int64_t max_tokens = given("--max-tokens") ? max_tokens_opt : quick ? 12 : 32;
  bench::WanLinkOptions link;
  {
    const size_t comma = wan.find(',');
    try {
      link.delay_s = parse_seconds(wan.substr(0, comma));
      link.rate_bps = comma == std::string::npos ? 0 : parse_rate(wan.substr(comma + 1));
    } catch (const std::exception&) {
      throw UsageError(str_cat("[bench cascade] --wan ", wan, ": expected DELAY[,RATE], e.g. 40ms,20mbit"));
    }
  }
  const fs::path out = fs::absolute(out_dir);
  fs::create_directories(out);
  const uint64_t seed = uint64_t(seed_opt);
  edge_int8 = edge_model_dir("--edge-int8", edge_int8, "int8", edge_group, out, "edge-int8");
  edge_int4 = edge_model_dir("--edge-int4", edge_int4, "int4", edge_group, out, "edge-int4");
  if (!update_int8.empty())
    update_int8 = edge_model_dir("--update-int8", update_int8, "int8", edge_group, out, "update-int8");
  if (!update_int4.empty())
    update_int4 = edge_model_dir("--update-int4", update_int4, "int4", edge_group, out, "update-int4");
  // The center model, in this process: its tokenizer and chat template shape the workload, and
  // after the runs it scores every answer.
  InferenceModel cm = load_inference_model(center_dir, std::nullopt, nullptr, /*resolved=*/true);
  const bool chat = workload == "chat" || (workload == "auto" && !cm.chat_template.empty());
  const std::string loom = fs::read_symlink("/proc/self/exe").string();
  const std::string center_threads = std::to_string(center_threads_n);
  const std::string edge_threads = std::to_string(edge_threads_n);

  // The published edge models are links the rollout re-points (then SIGHUP to the center).
  auto publish = [&](const std::string& variant, const std::string& dir) {
    const fs::path at = out / ("publish-" + variant);
    fs::remove(at);
    fs::create_directory_symlink(fs::absolute(dir), at);
  };
  publish("int8", edge_int8);
  publish("int4", edge_int4);

  Hosts hosts(hosts_mode);
  std::printf(
      "bench cascade: center %s, edges int8 %s / int4 %s; WAN %.0f ms one-way, %.1f Mbit/s (%s); %lld "
      "requests at %.2f/s, at most %lld tokens each, %s\n",
      center_dir.c_str(), edge_int8.c_str(), edge_int4.c_str(), link.delay_s * 1e3, link.rate_bps / 1e6,
      hosts.up() ? "test hosts loomh1 (center), loomh2 and loomh3 (edges), relay on the bridge" : "loopback",
      (long long)n_requests, rate, (long long)max_tokens,
      chat ? "chat questions (data/chat/questions.txt) through /v1/chat/completions"
           : "Tiny Shakespeare and modern text through /v1/completions");
  std::fflush(stdout);

  std::vector<std::string> center_argv = hosts.prefix(1);
  center_argv.insert(center_argv.end(),
                     {loom, "serve", "--checkpoint", center_dir, "--role", "center", "--edge-models",
                      str_cat("int8=", (out / "publish-int8").string(), ",int4=", (out / "publish-int4").string()),
                      "--served-model-name", "cascade", "--threads", center_threads});
  Server center = start_server(center_argv, hosts.addr(1));
  const serve::Url cu = serve::parse_url(center.url);
  bench::WanRelay relay(hosts.router(), 0, cu.host, cu.port, link);
  relay.start();
  const std::string wan_center = str_cat("http://", hosts.router(), ":", relay.port());

  const std::string data = std::string(LOOM_SOURCE_DIR) + "/data/";
  std::vector<CascadePrompt> prompts = chat ? chat_workload(data + "chat/questions.txt", n_requests, seed)
                                            : cascade_workload(data + "tinyshakespeare/input.txt", n_requests, seed);
  auto tok = serve::make_text_tokenizer(cm.tokenizer);
  {
    int64_t n_ctx = cm.model->config().n_ctx;
    for (const std::string* e : {&edge_int8, &edge_int4, &update_int8, &update_int4})
      if (!e->empty()) n_ctx = std::min(n_ctx, model::checkpoint_model_config(*e).n_ctx);
    LOOM_CHECK(n_ctx > max_tokens + 8, "bench cascade", "--max-tokens ", max_tokens, " leaves no room for a prompt in ",
               "the models' context of ", n_ctx, " tokens");
    // As the center renders a chat request: the model's own template, or ChatML.
    const auto format =
        serve::ChatFormat::for_model(cm.chat_template, cm.chat_template_source, cm.bos_token, cm.eos_token);
    prepare_prompts(prompts, *tok, *format, n_ctx - max_tokens);
  }
  ReplayOptions ro;
  ro.model = "cascade";
  ro.max_tokens = max_tokens;
  ro.rate = rate;
  ro.seed = seed;

  auto start_edges = [&](double t) {
    std::vector<Server> edges;
    for (int h = 2; h <= 3; ++h) {
      std::vector<std::string> a = hosts.prefix(h);
      a.insert(a.end(), {loom,
                         "serve",
                         "--checkpoint",
                         edge_int8,
                         "--role",
                         "edge",
                         "--center",
                         wan_center,
                         "--confidence-threshold",
                         str_cat(t),
                         "--window",
                         std::to_string(window),
                         "--poll-interval",
                         "1",
                         "--cache-dir",
                         (out / str_cat("cache-edge", h)).string(),
                         "--served-model-name",
                         "cascade",
                         "--edge-quant",
                         edge_quant,
                         "--threads",
                         edge_threads});
      edges.push_back(start_server(a, hosts.addr(h)));
    }
    for (const Server& e : edges) wait_settled(e.url, center.url, 600);
    return edges;
  };
  auto run = [&](const std::vector<std::string>& urls, const std::function<void()>& midway = {}) {
    ReplayOptions o = ro;
    o.urls = urls;
    const double t0 = now_seconds();
    std::vector<CascadeAnswer> a = replay_cascade(prompts, o, midway);
    return std::pair{a, now_seconds() - t0};
  };

  std::printf("center only (over the WAN)...\n");
  std::fflush(stdout);
  auto [center_answers, center_s] = run({wan_center});
  std::vector<std::pair<double, std::pair<std::vector<CascadeAnswer>, double>>> sweep;
  for (double t : thresholds) {
    std::printf("cascade at threshold %.2f...\n", t);
    std::fflush(stdout);
    std::vector<Server> edges = start_edges(t);
    sweep.push_back({t, run({edges[0].url, edges[1].url})});
    for (Server& e : edges) e.proc->terminate();
  }

  // Score everything with the center model (after the runs: no process competes with them).
  std::vector<Row> rows;
  ScoreCache scored;
  score_answers(center_answers, prompts, *cm.model, "center only", scored);
  for (auto& [t, res] : sweep) score_answers(res.first, prompts, *cm.model, str_cat("threshold ", t), scored);
  Row base = summarize("center only", std::nan(""), center_answers, &center_answers, center_s);
  for (auto& [t, res] : sweep) {
    Row r = summarize("cascade", t, res.first, &center_answers, res.second);
    r.latency_speedup = r.mean > 0 ? base.mean / r.mean : 0;
    r.load_reduction = base.center_rps > 0 ? 1 - r.center_rps / base.center_rps : 0;
    r.quality_ratio = base.quality > 0 ? r.quality / base.quality : 0;
    rows.push_back(r);
  }
  // Calibration, from the threshold-0 run (every answer the edge's, with its confidence): the
  // quality the cascade would keep if the edge answered only its most confident share, ranking by
  // the window's mean probability or by its minimum.
  json calibration = json::array();
  for (auto& [t, res] : sweep) {
    if (t != 0) continue;
    std::vector<size_t> idx;
    for (size_t i = 0; i < prompts.size(); ++i)
      if (res.first[i].ok && center_answers[i].ok && std::isfinite(res.first[i].confidence)) idx.push_back(i);
    auto edge_s = [&](size_t i) -> const AnswerScore& { return res.first[i].score; };
    auto center_score = [&](size_t i) -> const AnswerScore& { return center_answers[i].score; };
    if (idx.empty()) break;
    std::printf(
        "\nconfidence calibration (the threshold-0 answers): quality ratio if the edge answered only its most "
        "confident share\n%-10s %24s %24s %16s\n",
        "at edge", "ranked by mean (T)", "ranked by min (T)", "best possible");
    for (double share : {0.25, 0.5, 0.67, 0.75, 0.9}) {
      json entry = {{"edge_fraction", share}};
      std::string line = str_cat(int(share * 100), "%");
      // "oracle": ranked by what each edge answer actually costs (its per-token log-likelihood
      // under the center less the center's own answer's), the bound any confidence rule meets.
      for (const std::string rule : {"mean", "min", "oracle"}) {
        std::vector<size_t> order = idx;
        auto per_token = [](const AnswerScore& a) { return a.tokens ? a.logprob / double(a.tokens) : 0.0; };
        auto conf = [&](size_t i) {
          if (rule == "oracle") return per_token(edge_s(i)) - per_token(center_score(i));
          return rule == "mean" ? res.first[i].confidence : res.first[i].confidence_min;
        };
        std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return conf(a) > conf(b); });
        const size_t k = size_t(std::lround(share * double(order.size())));
        double lp = 0, n = 0, base_lp = 0, base_n = 0;
        for (size_t j = 0; j < order.size(); ++j) {
          const AnswerScore& s = j < k ? edge_s(order[j]) : center_score(order[j]);
          lp += s.logprob;
          n += double(s.tokens);
          base_lp += center_score(order[j]).logprob;
          base_n += double(center_score(order[j]).tokens);
        }
        const double ratio = n > 0 && base_n > 0 ? std::exp(lp / n - base_lp / base_n) : 0;
        const double cut = k > 0 ? conf(order[k - 1]) : 1.0;
        if (rule == "oracle") {
          line += str_cat("   ", ratio);
          entry["oracle"] = {{"quality_ratio", ratio}};
        } else {
          line += str_cat("   ", ratio, " (T ", cut, ")");
          entry["by_" + rule] = {{"quality_ratio", ratio}, {"threshold", cut}};
        }
      }
      std::printf("%s\n", line.c_str());
      calibration.push_back(entry);
    }
  }

  // The recommendation: the fastest threshold whose quality is within 5% of the center's;
  // failing that, the one of best quality.
  const Row* best = nullptr;
  for (const Row& r : rows)
    if (r.failed == 0 && r.quality_ratio >= 0.95 && (!best || r.latency_speedup > best->latency_speedup)) best = &r;
  for (const Row& r : rows)
    if (!best || (best->quality_ratio < 0.95 && r.quality_ratio > best->quality_ratio)) best = &r;

  // A model update during a run at that threshold.
  json rollout = nullptr;
  if (!update_int8.empty() || !update_int4.empty()) {
    std::printf("rollout at threshold %.2f: a new edge model published after half the requests...\n", best->threshold);
    std::fflush(stdout);
    std::vector<Server> edges = start_edges(best->threshold);
    const std::string before = get_json(edges[0].url, "/v1/cascade/status").value("version", "");
    auto [answers, secs] = run({edges[0].url, edges[1].url}, [&] {
      if (!update_int8.empty()) publish("int8", update_int8);
      if (!update_int4.empty()) publish("int4", update_int4);
      center.proc->signal(SIGHUP);
    });
    // The switch must land: the edges settle on the new version.
    for (const Server& e : edges) wait_settled(e.url, center.url, 600);
    const std::string after = get_json(edges[0].url, "/v1/cascade/status").value("version", "");
    std::map<std::string, int64_t> by_version;
    int64_t failed = 0, inconsistent = 0;
    for (const CascadeAnswer& a : answers) {
      if (!a.ok) {
        ++failed;
        continue;
      }
      const std::string edge_v = a.answered_by == "edge" ? a.version : a.edge_version;
      ++by_version[edge_v];
      if (edge_v != before && edge_v != after) ++inconsistent;
    }
    for (Server& e : edges) e.proc->terminate();
    rollout = {{"threshold", best->threshold},
               {"failed", failed},
               {"requests", int64_t(answers.size())},
               {"before", before},
               {"after", after},
               {"answers_by_edge_version", by_version},
               {"answers_with_other_versions", inconsistent},
               {"seconds", secs}};
    std::printf("rollout: %lld failed of %zu; edge versions answered: %s; switched %s -> %s\n", (long long)failed,
                answers.size(), json(by_version).dump().c_str(), before.c_str(), after.c_str());
  }
  center.proc->terminate();
  relay.stop();

  std::printf("\n%-12s %6s %8s %9s %9s %9s %10s %9s %9s %9s %8s\n", "run", "T", "at edge", "mean ms", "p50 ms",
              "p99 ms", "center/s", "log p/tok", "quality", "q ratio", "agree");
  auto print_row = [](const Row& r) {
    std::printf("%-12s %6s %7.0f%% %9.1f %9.1f %9.1f %10.3f %9.3f %9.4f %9.3f %7.0f%%%s\n", r.name.c_str(),
                std::isnan(r.threshold) ? "-" : str_cat(r.threshold).c_str(),
                r.ok ? 100.0 * double(r.at_edge) / double(r.ok) : 0.0, r.mean * 1e3, r.p50 * 1e3, r.p99 * 1e3,
                r.center_rps, r.loglik, r.quality, r.quality_ratio, 100 * r.agreement,
                r.failed ? str_cat("  (", r.failed, " failed)").c_str() : "");
  };
  print_row(base);
  for (const Row& r : rows) print_row(r);
  std::set<std::string> reasons;  // each distinct failure once
  auto note_failures = [&](const std::vector<CascadeAnswer>& answers) {
    for (const CascadeAnswer& a : answers)
      if (!a.ok && reasons.insert(a.error).second) std::printf("failure: %s\n", a.error.c_str());
  };
  note_failures(center_answers);
  for (auto& [t, res] : sweep) note_failures(res.first);

  std::string csv =
      "threshold,edge_fraction,mean_s,p50_s,p99_s,center_rps,loglik_per_token,quality,quality_ratio,agreement,failed\n";
  auto csv_row = [&](const Row& r) {
    csv +=
        str_cat(std::isnan(r.threshold) ? std::string("center_only") : str_cat(r.threshold), ",",
                r.ok ? double(r.at_edge) / double(r.ok) : 0.0, ",", r.mean, ",", r.p50, ",", r.p99, ",", r.center_rps,
                ",", r.loglik, ",", r.quality, ",", r.quality_ratio, ",", r.agreement, ",", r.failed, "\n");
  };
  csv_row(base);
  for (const Row& r : rows) csv_row(r);
  io::write_file_atomic((out / "cascade_sweep.csv").string(), csv);
  io::PlotSeries mean_s{"cascade mean", {}, {}, {}, true}, p99_s{"cascade P99", {}, {}, {}, true},
      load_s{"cascade", {}, {}, {}, true};
  for (const Row& r : rows) {
    const std::string label = str_cat("T=", r.threshold);
    mean_s.x.push_back(r.quality_ratio);
    mean_s.y.push_back(r.mean * 1e3);
    mean_s.labels.push_back(label);
    p99_s.x.push_back(r.quality_ratio);
    p99_s.y.push_back(r.p99 * 1e3);
    p99_s.labels.push_back("");
    load_s.x.push_back(r.quality_ratio);
    load_s.y.push_back(r.center_rps);
    load_s.labels.push_back(label);
  }
  io::PlotPanel latency{"latency against quality",
                        "quality (center log-likelihood, cascade / center only)",
                        "latency (ms)",
                        {mean_s, p99_s},
                        {{"center only mean", base.mean * 1e3}, {"center only P99", base.p99 * 1e3}}};
  io::PlotPanel load{"center load against quality",
                     "quality (center log-likelihood, cascade / center only)",
                     "center requests per second",
                     {load_s},
                     {{"center only", base.center_rps}}};
  io::write_svg_plot((out / "cascade_sweep.svg").string(),
                     str_cat("edge/center cascade: WAN ", link.delay_s * 1e3, " ms, ", link.rate_bps / 1e6, " Mbit/s"),
                     {latency, load});
  std::printf(
      "\nrecommended threshold %.2f: mean latency %.2fx lower, center load %.0f%% lower, quality ratio "
      "%.3f, answers equal to the center's %.0f%%\nwrote %s and %s\n",
      best->threshold, best->latency_speedup, 100 * best->load_reduction, best->quality_ratio, 100 * best->agreement,
      (out / "cascade_sweep.csv").c_str(), (out / "cascade_sweep.svg").c_str());

  json sweep_json = json::array();
  for (const Row& r : rows)
    sweep_json.push_back({{"threshold", r.threshold},
                          {"edge_fraction", r.ok ? double(r.at_edge) / double(r.ok) : 0.0},
                          {"mean_s", r.mean},
                          {"p50_s", r.p50},
                          {"p99_s", r.p99},
                          {"center_rps", r.center_rps},
                          {"loglik_per_token", r.loglik},
                          {"quality_ratio", r.quality_ratio},
                          {"agreement", r.agreement},
                          {"failed", r.failed}});
  int64_t failed = base.failed;
  for (const Row& r : rows) failed += r.failed;
  json s = {{"threshold", best->threshold},
            {"latency_speedup", best->latency_speedup},
            {"center_load_reduction", best->load_reduction},
            {"quality_ratio", best->quality_ratio},
            {"agreement", best->agreement},
            {"edge_fraction", best->ok ? double(best->at_edge) / double(best->ok) : 0.0},
            {"center_only",
             {{"mean_s", base.mean},
              {"p50_s", base.p50},
              {"p99_s", base.p99},
              {"center_rps", base.center_rps},
              {"loglik_per_token", base.loglik}}},
            {"failed", failed},
            {"hosts", hosts.up() ? "namespaces" : "loopback"},
            {"workload", chat ? "chat" : "text"},
            {"wan", {{"delay_s", link.delay_s}, {"rate_bps", link.rate_bps}}},
            {"requests", n_requests},
            {"rate", rate},
            {"sweep", sweep_json},
            {"calibration", calibration},
            {"rollout", rollout}};
  std::printf("SUMMARY %s\n", s.dump().c_str());
  return failed == 0 && (rollout.is_null() || rollout["failed"] == 0) ? 0 : 1;
}

}  // namespace loom::cli

// The run report's pure parts (train/run_metrics.h, run_report.h): JSONL lines into series,
// resumes and rollbacks rewinding them, malformed lines named by number, one tagged <svg> per
// chart with its series count and nothing fetched, MoE loads pooled over windows; and the
// trainer's side: run_start, memory by category, exposed communication and every step's expert
// load in the JSONL, the observer called per logged step.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <numeric>
#include <regex>
#include <sstream>

#include <nlohmann/json.hpp>

#include "loom/core/cpu_features.h"
#include "loom/io/file.h"
#include "loom/train/dataset_source.h"
#include "loom/train/run_environment.h"
#include "loom/train/run_metrics.h"
#include "loom/train/run_report.h"
#include "loom/train/trainer.h"
#include "train/train_testing.h"

using namespace loom;
using namespace loom::train;

namespace {

std::string step_line(int step, double loss, const std::string& extra = "") {
  return "{\"step\":" + std::to_string(step) + ",\"loss\":" + std::to_string(loss) +
         ",\"lr\":0.001,\"grad_norm\":1.5,\"tokens_per_s\":1000,\"mfu\":0.1,\"exposed_comm_ms\":0.5,"
         "\"memory\":{\"params\":{\"current\":100,\"peak\":100},\"activations\":{\"current\":0,\"peak\":50}}" +
         extra + "}\n";
}

const std::string kRunStart =
    R"({"event":"run_start","step":0,"run_id":"r1","resumed":false,"world_size":2,"layout":"dp=2",)"
    R"("config":"model:\n  preset: gpt2-tiny\n","environment":{"hostname":"h","cpu_model":"X <1>"}})"
    "\n";

int count(const std::string& s, const std::string& what) {
  int n = 0;
  for (size_t at = s.find(what); at != std::string::npos; at = s.find(what, at + 1)) ++n;
  return n;
}

}  // namespace

TEST(RunMetrics, StepAndValidationLinesBecomeSeries) {
  const RunMetrics m = parse_run_metrics(kRunStart + step_line(1, 5.0) + step_line(2, 4.0) +
                                         "{\"step\":2,\"val_loss\":4.5}\n" + step_line(3, 3.0));
  EXPECT_EQ(m.step_lines, 3);
  EXPECT_EQ(m.loss.value, (std::vector<double>{5, 4, 3}));
  EXPECT_EQ(m.loss.step, (std::vector<double>{1, 2, 3}));
  EXPECT_EQ(m.val_loss.value, (std::vector<double>{4.5}));
  EXPECT_EQ(m.exposed_comm_ms.value.size(), 3u);
  ASSERT_EQ(m.memory_peak.size(), 2u);
  EXPECT_EQ(m.memory_peak[0].name, "params");
  EXPECT_EQ(m.memory_peak[1].name, "activations");
  EXPECT_EQ(m.memory_current[1].value, (std::vector<double>{0, 0, 0}));
  ASSERT_EQ(m.starts.size(), 1u);
  EXPECT_EQ(m.starts[0].run_id, "r1");
  EXPECT_EQ(m.starts[0].world_size, 2);
  EXPECT_EQ(m.starts[0].config, "model:\n  preset: gpt2-tiny\n");
  ASSERT_EQ(m.starts[0].environment.size(), 2u);
  EXPECT_TRUE(m.warnings.empty());
}

TEST(RunMetrics, AResumeRewindsEverySeriesToItsStep) {
  // As if a file from an older loom kept the replayed steps: the resume at 2 discards 3 and 4.
  const RunMetrics m = parse_run_metrics(
      step_line(1, 5.0) + step_line(2, 4.0) + step_line(3, 3.0) + "{\"step\":3,\"val_loss\":3.5}\n" +
      step_line(4, 2.0) + R"({"event":"resume","step":2,"run_id":"r1","checkpoint":"ck/step_2","dropped_lines":0})" +
      "\n" + step_line(3, 3.1) + step_line(4, 2.1));
  EXPECT_EQ(m.loss.step, (std::vector<double>{1, 2, 3, 4}));
  EXPECT_EQ(m.loss.value, (std::vector<double>{5, 4, 3.1, 2.1}));
  EXPECT_TRUE(m.val_loss.empty());
  EXPECT_EQ(m.memory_peak[0].step.size(), 4u);
  EXPECT_TRUE(m.rolled_back_loss.empty());
  ASSERT_EQ(m.events.size(), 1u);
  EXPECT_EQ(m.events[0].kind, "resume");
  EXPECT_EQ(m.events[0].step, 2);
  EXPECT_NE(m.events[0].detail.find("ck/step_2"), std::string::npos);
}

TEST(RunMetrics, ARollbackKeepsTheDiscardedLossesApart) {
  const RunMetrics m = parse_run_metrics(
      step_line(1, 5.0) + step_line(2, 4.0) + step_line(3, 40.0) + step_line(4, 45.0, ",\"rollbacks\":0") +
      R"({"event":"rollback","step":2,"checkpoint":"ck/step_2","skipped_from_step":3,"skipped_steps":2})" + "\n" +
      step_line(3, 3.0, ",\"rollbacks\":1,\"nonfinite_steps\":2"));
  EXPECT_EQ(m.loss.value, (std::vector<double>{5, 4, 3}));
  EXPECT_EQ(m.rolled_back_loss.step, (std::vector<double>{3, 4}));
  EXPECT_EQ(m.rolled_back_loss.value, (std::vector<double>{40, 45}));
  EXPECT_EQ(m.rollbacks, 1);
  EXPECT_EQ(m.nonfinite_steps, 2);
  ASSERT_EQ(m.events.size(), 1u);
  EXPECT_EQ(m.events[0].kind, "rollback");
  EXPECT_NE(m.events[0].detail.find("2 logged steps discarded"), std::string::npos) << m.events[0].detail;
  // The report shows the rolled-back losses as a series of their own in the loss chart.
  const std::vector<ReportChart> charts = report_charts(m);
  const auto& loss_chart = charts[0].panel.series;
  ASSERT_EQ(loss_chart.size(), 2u);
  EXPECT_EQ(loss_chart[0].name, "train loss");
  EXPECT_EQ(loss_chart[1].name, "rolled back");
}

TEST(RunMetrics, MalformedLinesAreSkippedAndNamedByLineNumber) {
  const RunMetrics m = parse_run_metrics(step_line(1, 5.0) + "{\"step\":2,\"loss\":\n" +  // cut short
                                         "[1,2]\n" + "{\"loss\":3}\n" + "{\"step\":3,\"loss\":\"high\"}\n" +
                                         "{\"step\":4,\"loss\":1,\"memory\":{\"params\":7}}\n" + "\n" +
                                         "{\"step\":5,\"something\":1}\n" + step_line(6, 2.0) +
                                         "{\"step\":6,\"event\":\"future_event\"}\n" + "{\"step\":7,\"loss\":null}\n");
  ASSERT_EQ(m.warnings.size(), 6u);
  EXPECT_EQ(m.warnings[0].rfind("line 2: not a JSON object", 0), 0u) << m.warnings[0];
  EXPECT_EQ(m.warnings[1].rfind("line 3: not a JSON object", 0), 0u) << m.warnings[1];
  EXPECT_EQ(m.warnings[2], "line 4: no integer \"step\"");
  EXPECT_EQ(m.warnings[3], "line 5: \"loss\" is not a number");
  EXPECT_EQ(m.warnings[4].rfind("line 6: \"memory\".params is not", 0), 0u) << m.warnings[4];
  EXPECT_EQ(m.warnings[5].rfind("line 8: neither", 0), 0u) << m.warnings[5];
  // A bad line adds nothing; a null loss (non-finite) is a point with no value.
  EXPECT_EQ(m.loss.step, (std::vector<double>{1, 6, 7}));
  EXPECT_TRUE(std::isnan(m.loss.value[2]));
  EXPECT_EQ(m.memory_peak[0].step.size(), 2u);
}

TEST(RunReport, EveryChartIsATaggedSvgWithItsSeriesCount) {
  const RunMetrics m =
      parse_run_metrics(kRunStart + step_line(1, 5.0) + step_line(2, 4.0) + "{\"step\":2,\"val_loss\":4.5}\n" +
                        step_line(3, 3.0) + "{\"step\":3,\"val_loss\":3.5}\n");
  const std::string html = render_run_report(m, "run/metrics.jsonl");
  const std::map<std::string, int> want = {{"loss", 2}, {"lr", 1},     {"grad_norm", 1},   {"tokens_per_s", 1},
                                           {"mfu", 1},  {"memory", 2}, {"exposed_comm", 1}};
  const std::regex tag("<svg class=\"chart\" data-chart=\"([a-z_]+)\" data-series=\"([0-9]+)\"");
  std::map<std::string, int> got;
  for (auto it = std::sregex_iterator(html.begin(), html.end(), tag); it != std::sregex_iterator(); ++it)
    got[(*it)[1]] = std::stoi((*it)[2]);
  EXPECT_EQ(got, want);
  // One line per series (every series here has at least two points).
  EXPECT_EQ(count(html, "<polyline"), 9);
  // Self-contained: no scripts, no links, nothing to fetch.
  for (const char* bad : {"<script", "<link", " src=", " href=", "url(", "@import", "http://", "https://"})
    EXPECT_EQ(html.find(bad), std::string::npos) << bad;
  // Text from the run is escaped.
  EXPECT_NE(html.find("X &lt;1&gt;"), std::string::npos);
  EXPECT_NE(html.find("<pre>model:\n  preset: gpt2-tiny\n</pre>"), std::string::npos);
  EXPECT_EQ(run_report_summary(m),
            "3 steps, loss 5 -> 3, val loss 3.5, 0 resumes, 0 rollbacks, no end recorded (still running, or it "
            "crashed)");
}

// Spikes are marks on the loss chart (no line); the end line says how the run ended, and a
// diverged run's verdict is an event with its reason.
TEST(RunReport, SpikesAreMarkedAndADivergedRunSaysSo) {
  const std::string diverged =
      R"({"event":"end","step":4,"ended":"diverged","last_healthy_step":2,"reason":"training diverged: x"})"
      "\n";
  const RunMetrics m =
      parse_run_metrics(kRunStart + step_line(1, 5.0) + step_line(2, 4.0) + step_line(3, 9.0) +
                        R"({"event":"spike","step":3,"loss":9.0,"z":12.5})" + "\n" + step_line(4, 12.0) + diverged);
  EXPECT_TRUE(m.warnings.empty());
  EXPECT_EQ(m.spikes.step, (std::vector<double>{3}));
  EXPECT_EQ(m.spikes.value, (std::vector<double>{9}));
  EXPECT_EQ(m.ended, "diverged");
  EXPECT_EQ(m.end_step, 4);
  EXPECT_EQ(m.last_healthy_step, 2);
  ASSERT_EQ(m.events.size(), 1u);
  EXPECT_EQ(m.events[0].kind, "diverged");
  EXPECT_EQ(m.events[0].detail, "training diverged: x");
  EXPECT_EQ(run_ending(m), "DIVERGED at step 4 (began after step 2)");
  EXPECT_EQ(run_report_summary(m),
            "4 steps, loss 5 -> 12, 0 resumes, 0 rollbacks, 1 spike, DIVERGED at step 4 (began after step 2)");
  const std::string html = render_run_report(m, "run/metrics.jsonl");
  EXPECT_NE(html.find("data-chart=\"loss\" data-series=\"2\""), std::string::npos) << "no spike series";
  // One line each: loss, lr, grad norm, tokens/s, MFU, two memory categories, exposed comm.
  EXPECT_EQ(count(html, "<polyline"), 8) << "the spikes were joined by a line";
  EXPECT_NE(html.find("training diverged: x"), std::string::npos);
  const RunMetrics ok = parse_run_metrics(kRunStart + step_line(1, 5.0) +
                                          R"({"event":"end","step":1,"ended":"finished","spikes":0})" + "\n");
  EXPECT_EQ(run_ending(ok), "finished");
  EXPECT_TRUE(ok.events.empty());
}

TEST(RunMetrics, MoeLoadsPoolOverAWindowAndRewindOnResume) {
  // Two MoE blocks; block 3's tokens split 30/10 then 10/30: each step is 1.5, pooled 1.0.
  const auto moe = [](int64_t a0, int64_t a1, int64_t b0, int64_t b1) {
    const auto block = [](int layer, int64_t x, int64_t y) {
      const double load = double(std::max(x, y)) * 2 / double(x + y);
      return "{\"layer\":" + std::to_string(layer) + ",\"load_max_over_mean\":" + std::to_string(load) +
             ",\"dropped_fraction\":0.01,\"tokens_per_expert\":[" + std::to_string(x) + "," + std::to_string(y) + "]}";
    };
    return ",\"moe\":[" + block(3, b0, b1) + "," + block(1, a0, a1) + "]";
  };
  const std::string lines = step_line(10, 5.0, moe(20, 20, 30, 10)) + step_line(20, 4.0, moe(20, 20, 10, 30)) +
                            step_line(30, 3.0, moe(40, 0, 40, 0)) +
                            R"({"event":"resume","step":20,"run_id":"r2","checkpoint":"c/step_20"})"
                            "\n" +
                            step_line(30, 3.5, moe(24, 16, 20, 20));
  const RunMetrics m = parse_run_metrics(lines);
  EXPECT_TRUE(m.warnings.empty());
  ASSERT_EQ(m.moe.size(), 2u);
  EXPECT_EQ(m.moe[0].layer, 1);  // layer order, whatever the line's order
  EXPECT_EQ(m.moe[1].layer, 3);
  EXPECT_EQ(m.moe_worst_load.value, (std::vector<double>{1.5, 1.5, 1.2}));  // step 30 re-logged after the resume
  EXPECT_NEAR(m.moe_mean_load.value[2], 1.1, 1e-9);
  const std::vector<MoeWindowLoad> all = moe_window_loads(m, 0);
  ASSERT_EQ(all.size(), 2u);
  EXPECT_EQ(all[1].steps, 3);
  EXPECT_DOUBLE_EQ(all[1].median_step_load, 1.5);
  EXPECT_DOUBLE_EQ(all[1].worst_step_load, 1.5);
  EXPECT_DOUBLE_EQ(all[1].pooled_load, 60.0 * 2 / 120);  // experts 60 and 60
  EXPECT_NEAR(all[0].pooled_load, 64.0 * 2 / 120, 1e-12);
  EXPECT_NEAR(all[0].dropped, 0.01, 1e-12);
  const std::vector<MoeWindowLoad> late = moe_window_loads(m, 15);
  EXPECT_EQ(late[1].steps, 2);
  EXPECT_DOUBLE_EQ(late[1].pooled_load, 50.0 * 2 / 80);
  // The report has the two MoE charts and the table; a malformed "moe" skips the line.
  const std::string html = render_run_report(m, "x");
  EXPECT_NE(html.find("data-chart=\"moe_load\" data-series=\"2\""), std::string::npos);
  EXPECT_NE(html.find("data-chart=\"moe_dropped\" data-series=\"2\""), std::string::npos);
  EXPECT_NE(html.find("<h2>Expert load after step 15</h2>"), std::string::npos);
  EXPECT_NE(render_run_report(m, "x", 0).find("<h2>Expert load after step 0</h2>"), std::string::npos);
  const RunMetrics bad = parse_run_metrics(step_line(1, 2.0, ",\"moe\":[{\"layer\":\"x\"}]"));
  EXPECT_EQ(bad.step_lines, 0);
  EXPECT_EQ(bad.warnings.size(), 1u);
}

TEST(RunReport, ChartsWithoutDataSayZeroSeries) {
  const RunMetrics m = parse_run_metrics("{\"step\":1,\"loss\":2}\n");  // an old file: loss only
  for (const ReportChart& c : report_charts(m)) EXPECT_EQ(c.panel.series.size(), c.id == "loss" ? 1u : 0u) << c.id;
  EXPECT_NE(render_run_report(m, "x").find("data-chart=\"memory\" data-series=\"0\""), std::string::npos);
}

TEST(RunEnvironment, CpuModelComesFromProcCpuinfo) {
  EXPECT_EQ(cpu_model_from_cpuinfo("processor\t: 0\nvendor_id\t: GenuineIntel\nmodel name\t: Intel(R) Xeon(R) 8480\n"
                                   "processor\t: 1\nmodel name\t: other\n"),
            "Intel(R) Xeon(R) 8480");
  EXPECT_EQ(cpu_model_from_cpuinfo("processor : 0\n"), "");
  std::map<std::string, std::string> env;
  for (const auto& [k, v] : describe_run_environment()) env[k] = v;
  for (const char* k : {"hostname", "cpu_model", "isa", "blas", "threads", "loom_version", "start_time"})
    EXPECT_FALSE(env[k].empty()) << k;
}

TEST(RunReport, TheTrainerLogsRunStartMemoryAndExposedCommAndCallsTheObserver) {
  const std::string dir = loom::testing::temp_dir("run_report_trainer");
  const std::string data = loom::testing::prepare_shakespeare(dir, 20000);
  const std::string metrics = dir + "/metrics.jsonl";
  const TrainConfig cfg = parse_train_config(
      loom::testing::tiny_config_yaml(data, ""),
      {"schedule.steps=4", "schedule.eval_interval=2", "log.every=1", "log.metrics_path=" + metrics});
  DatasetSource src(cfg);
  TrainerOptions opt = loom::testing::quiet();
  std::vector<LoggedStep> seen;
  std::vector<std::pair<int64_t, double>> vals;
  opt.observer.on_step = [&](const LoggedStep& s) { seen.push_back(s); };
  opt.observer.on_val_loss = [&](int64_t step, double v) { vals.emplace_back(step, v); };
  const TrainResult r = Trainer(cfg, src, opt).run();
  ASSERT_EQ(seen.size(), 4u);
  EXPECT_EQ(seen[3].step, 4);
  EXPECT_EQ(seen[0].exposed_comm_ms, 0);  // one rank: nothing to wait for
  EXPECT_GT(seen[0].window_tokens, 0);
  bool has_params = false;
  for (const CategoryBytes& c : seen[0].memory) has_params |= c.category == "params" && c.current > 0;
  EXPECT_TRUE(has_params);
  // Step 2's evaluation, then the final one after step 4 (what SUMMARY reports), marked final.
  ASSERT_EQ(vals.size(), 2u);
  EXPECT_EQ(vals[0].first, 2);
  EXPECT_EQ(vals[1], std::make_pair(int64_t(4), r.final_val_loss));

  std::istringstream in(io::read_file(metrics));
  std::string first;
  std::getline(in, first);
  const auto j = nlohmann::json::parse(first);
  EXPECT_EQ(j["event"], "run_start");
  EXPECT_EQ(j["resumed"], false);
  EXPECT_EQ(j["config"], cfg.resolved_yaml);
  EXPECT_EQ(j["world_size"], 1);
  EXPECT_FALSE(j["environment"]["cpu_model"].get<std::string>().empty());
  const RunMetrics m = parse_run_metrics(io::read_file(metrics));
  EXPECT_TRUE(m.warnings.empty());
  EXPECT_EQ(m.step_lines, 4);
  EXPECT_EQ(m.val_loss.step, (std::vector<double>{2, 4}));
  EXPECT_EQ(m.val_loss.value.back(), r.final_val_loss);
  bool final_marked = false;
  for (std::string line; std::getline(in, line);) {
    const auto v = nlohmann::json::parse(line);
    if (v.contains("val_loss") && v.value("final", false)) final_marked = v["step"] == 4;
  }
  EXPECT_TRUE(final_marked) << "the final evaluation's line is not marked final";
  EXPECT_EQ(m.exposed_comm_ms.value, (std::vector<double>{0, 0, 0, 0}));
  EXPECT_EQ(m.memory_peak.size(), seen[3].memory.size());
}

// A MoE run logs each block's tokens per expert for the logged step and summed over the steps
// since the previous log, which the report pools.
TEST(RunReport, TheTrainerLogsEveryStepsExpertLoadBetweenLogs) {
  const std::string dir = loom::testing::temp_dir("run_report_moe");
  const std::string data = loom::testing::prepare_shakespeare(dir, 20000);
  const std::string metrics = dir + "/metrics.jsonl";
  const TrainConfig cfg = parse_train_config(loom::testing::tiny_config_yaml(data, ""),
                                             {"model.preset=llama-moe-tiny", "model.vocab_size=256", "model.n_ctx=32",
                                              "schedule.steps=5", "log.every=2", "log.metrics_path=" + metrics});
  DatasetSource src(cfg);
  Trainer(cfg, src, loom::testing::quiet()).run();
  std::istringstream in(io::read_file(metrics));
  const int64_t per_step = cfg.data.batch_size * cfg.data.seq_len * cfg.model.moe.top_k;
  std::vector<int64_t> window_steps;
  std::map<int64_t, std::vector<int64_t>> pooled;  // by layer, over the whole run
  for (std::string line; std::getline(in, line);) {
    const auto j = nlohmann::json::parse(line);
    if (!j.contains("moe")) continue;
    const int64_t n = j["moe_window_steps"].get<int64_t>();
    window_steps.push_back(n);
    for (const auto& b : j["moe"]) {
      const auto step = b["tokens_per_expert"].get<std::vector<int64_t>>();
      const auto window = b["tokens_per_expert_window"].get<std::vector<int64_t>>();
      EXPECT_EQ(std::accumulate(step.begin(), step.end(), int64_t(0)), per_step);
      EXPECT_EQ(std::accumulate(window.begin(), window.end(), int64_t(0)), n * per_step);
      for (size_t e = 0; e < window.size(); ++e) EXPECT_GE(window[e], step[e]);  // the window ends with the step
      auto& p = pooled[b["layer"].get<int64_t>()];
      p.resize(window.size(), 0);
      for (size_t e = 0; e < window.size(); ++e) p[e] += window[e];
    }
  }
  EXPECT_EQ(window_steps, (std::vector<int64_t>{2, 2, 1}));  // steps 1-2, 3-4, 5
  const RunMetrics m = parse_run_metrics(io::read_file(metrics));
  ASSERT_EQ(m.moe.size(), pooled.size());
  for (const MoeWindowLoad& w : moe_window_loads(m, 0)) {
    const std::vector<int64_t>& p = pooled[w.layer];
    const int64_t mx = *std::max_element(p.begin(), p.end());
    EXPECT_DOUBLE_EQ(w.pooled_load, double(mx) * double(p.size()) / (5.0 * double(per_step)));
  }
}

// `loom eval --checkpoint DIR --data DIR [--split val] [--seq-len T] [--max-windows N]
// [--quant ...]`: the model's mean next-token loss and perplexity on prepared token shards,
// through the inference runner (so quantized weights are judged as they are served); for MoE
// models also the routers' load over the split.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <numeric>

#include <nlohmann/json.hpp>

#include "loom/core/error.h"
#include "loom/core/threads.h"
#include "loom/core/timer.h"
#include "loom/data/dataset.h"
#include "loom/infer/kv_cache.h"
#include "loom/infer/model_runner.h"
#include "loom/model/moe.h"
#include "tools/loom/commands.h"
#include "tools/loom/inference_model.h"

namespace loom::cli {

namespace {
// -log softmax(row)[target], in double.
double nll(const float* row, int64_t V, int32_t target) {
  double mx = row[0];
  for (int64_t v = 1; v < V; ++v) mx = std::max(mx, double(row[v]));
  double sum = 0;
  for (int64_t v = 0; v < V; ++v) sum += std::exp(double(row[v]) - mx);
  return mx + std::log(sum) - double(row[target]);
}
}  // namespace

int cmd_eval(const std::vector<std::string>& argv) {
  auto app = new_app("eval",
                     "Mean next-token cross-entropy (nats/token) and perplexity of a checkpoint on the split's "
                     "consecutive windows of T tokens, computed by the inference engine's forward. The last line is "
                     "SUMMARY {json}. For MoE models also each MoE block's expert load (max/mean of the tokens "
                     "routed to each expert) over the split.");
  std::string checkpoint, data_dir, split = "val";
  int64_t seq_len = 0, max_windows = 0, threads = 0;
  QuantOptions quant;
  app->add_option("--checkpoint", checkpoint, "a training checkpoint, a run directory, or a `loom quantize` output")
      ->type_name("DIR")
      ->required();
  app->add_option("--data", data_dir, "the output of loom prepare (DIR/<split>.bin)")->type_name("DIR")->required();
  app->add_option("--split", split, "the split")->check(one_of({"val", "train"}));
  auto* seq_len_opt = app->add_option("--seq-len", seq_len, "window length (default: the model's context)")
                          ->type_name("T")
                          ->check(positive())
                          ->default_str("");
  app->add_option("--max-windows", max_windows, "evaluate at most N windows (0: all)")->check(non_negative());
  auto* threads_opt = app->add_option("--threads", threads, "compute threads (default: OMP_NUM_THREADS or all cores)")
                          ->check(positive())
                          ->default_str("");
  add_quant_options(*app, quant);
  if (auto rc = parse(*app, argv)) return *rc;
  if (threads_opt->count()) set_num_threads(int(threads));
  InferenceModel m = load_inference_model(checkpoint, quant_spec_from(quant), stderr);
  const model::ModelConfig& cfg = m.model->config();
  const int64_t T = seq_len_opt->count() ? seq_len : cfg.n_ctx;
  if (T < 1 || T > cfg.n_ctx)
    throw UsageError(str_cat("[eval] --seq-len ", T, ": expected 1 to the model's context of ", cfg.n_ctx));
  data::DatasetOptions dopt;
  dopt.model_vocab = cfg.vocab_size;
  const data::TokenDataset ds = data::TokenDataset::open_split(data_dir, split, dopt);
  int64_t windows = ds.eval_windows(T);
  if (max_windows > 0) windows = std::min(windows, max_windows);

  const int64_t bs = 16, nb = infer::KVCache::blocks_for_tokens(T, bs);
  infer::KVCache cache(cfg, nb, bs, DType::f32);
  infer::ModelRunner runner(*m.model, cache, T, 1, m.quant_ptr());
  std::vector<int32_t> tok(static_cast<size_t>(T)), tgt(static_cast<size_t>(T)), table(static_cast<size_t>(nb));
  std::iota(table.begin(), table.end(), 0);
  std::fprintf(stderr, "[eval] %s (%s) on %s: %lld windows of %lld tokens\n", m.checkpoint.c_str(),
               m.precision().c_str(), (data_dir + "/" + split + ".bin").c_str(), (long long)windows, (long long)T);
  Stopwatch sw;
  double sum = 0;
  int64_t count = 0;
  for (int64_t w = 0; w < windows; ++w) {
    ds.fill_eval_batch(w, 1, T, tok.data(), tgt.data());
    infer::StepPlan plan;
    infer::ScheduledSeq s;
    s.seq_id = 0;
    s.num_tokens = T;
    s.tokens = tok;
    s.block_table = table;
    plan.seqs.push_back(s);
    const Tensor logits = runner.execute_all_rows(plan);
    for (int64_t i = 0; i < T; ++i) {
      sum += nll(logits.data<float>() + i * cfg.vocab_size, cfg.vocab_size, tgt[size_t(i)]);
      ++count;
    }
    LOOM_CHECK(std::isfinite(sum), "eval", "the loss is not finite after window ", w,
               ": the checkpoint's weights hold non-finite values");
  }
  const double loss = sum / double(std::max<int64_t>(count, 1)), secs = sw.seconds();
  std::printf("[eval] loss %.4f nats/token, perplexity %.3f over %lld tokens (%.1f s, %.0f tokens/s)\n", loss,
              std::exp(loss), (long long)count, secs, double(count) / secs);
  nlohmann::json j = {{"checkpoint", m.checkpoint},
                      {"quant", m.precision()},
                      {"split", split},
                      {"loss", loss},
                      {"perplexity", std::exp(loss)},
                      {"tokens", count},
                      {"windows", windows},
                      {"seq_len", T},
                      {"seconds", secs}};
  if (cfg.moe.enabled()) {
    // The router's load over the whole split: per MoE block, max/mean of the tokens per expert.
    std::string line;
    double worst = 0;
    nlohmann::json blocks = nlohmann::json::array();
    for (size_t i = 0; i < runner.expert_load().size(); ++i) {
      const std::vector<int64_t>& load = runner.expert_load()[i];
      const double r = model::load_max_over_mean(load);
      worst = std::max(worst, r);
      line += str_cat(i ? ", " : "", cfg.moe_layer(int64_t(i)), ": ", std::round(r * 100) / 100);
      blocks.push_back({{"layer", cfg.moe_layer(int64_t(i))}, {"load_max_over_mean", r}, {"tokens_per_expert", load}});
    }
    std::printf("[eval] expert load max/mean over the split by MoE block: %s (worst %.2f)\n", line.c_str(), worst);
    j["moe"] = blocks;
    j["moe_worst_load"] = worst;
  }
  std::printf("SUMMARY %s\n", j.dump().c_str());
  return 0;
}

}  // namespace loom::cli

// `loom eval --model PATH (--data DIR [--split val] | --text FILE | --ids FILE) [--seq-len T]
// [--max-windows N] [--quant ...] [--logits-out FILE]`: the model's mean next-token loss and
// perplexity on prepared token shards or on a text tokenized with the model's own tokenizer,
// through the inference runner (so quantized weights are judged as they are served); for MoE
// models also the routers' load over the split. --logits-out writes the logits of the first
// window (the reference checks of docs/MODELS.md compare them).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <numeric>
#include <optional>

#include <nlohmann/json.hpp>

#include "loom/core/error.h"
#include "loom/core/threads.h"
#include "loom/core/timer.h"
#include "loom/data/dataset.h"
#include "loom/data/tokenizer.h"
#include "loom/infer/kv_cache.h"
#include "loom/infer/model_runner.h"
#include "loom/io/file.h"
#include "loom/model/moe.h"
#include "tools/loom/commands.h"
#include "tools/loom/inference_model.h"
#include "tools/loom/token_nll.h"

namespace loom::cli {

double token_nll(const float* row, int64_t V, int32_t target) {
  double mx = row[0];
  for (int64_t v = 1; v < V; ++v) mx = std::max(mx, double(row[v]));
  double sum = 0;
  for (int64_t v = 0; v < V; ++v) sum += std::exp(double(row[v]) - mx);
  return mx + std::log(sum) - double(row[target]);
}

namespace {
// Consecutive windows of up to T inputs over a token list; each input's target is the next
// token, and the list's last token (which has none) is an input of the last window when it
// fits, so that --logits-out covers every token of a short list.
struct TokenWindows {
  std::vector<int32_t> ids;
  int64_t T = 0;
  int64_t size() const { return int64_t(ids.size()); }
  int64_t count() const { return size() < 2 ? 0 : (size() - 2) / T + 1; }
  int64_t length(int64_t w) const { return std::min<int64_t>(T, size() - w * T); }
  void fill(int64_t w, int32_t* tok, int32_t* tgt) const {
    for (int64_t i = 0; i < length(w); ++i) {
      const int64_t at = w * T + i;
      tok[i] = ids[size_t(at)];
      tgt[i] = at + 1 < size() ? ids[size_t(at + 1)] : -1;
    }
  }
};

std::vector<int32_t> read_ids(const std::string& path, int64_t vocab) {
  std::vector<int32_t> ids;
  const std::string text = io::read_file(path);
  size_t at = 0;
  while (at < text.size()) {
    const size_t begin = text.find_first_not_of(" \t\r\n", at);
    if (begin == std::string::npos) break;
    const size_t end = std::min(text.find_first_of(" \t\r\n", begin), text.size());
    const std::string word = text.substr(begin, end - begin);
    char* stop = nullptr;
    const long long id = std::strtoll(word.c_str(), &stop, 10);
    if (stop != word.c_str() + word.size() || id < 0 || id >= vocab)
      throw UsageError(
          str_cat("[eval] --ids ", path, ": '", word, "' is not a token id below the vocabulary size ", vocab));
    ids.push_back(int32_t(id));
    at = end;
  }
  return ids;
}
}  // namespace

int cmd_eval(const std::vector<std::string>& argv) {
  auto app = new_app("eval",
                     "Mean next-token cross-entropy (nats/token) and perplexity of a model on consecutive windows of T "
                     "tokens (of a prepared split, a text or a list of ids), computed by the inference engine's "
                     "forward. The last line is "
                     "SUMMARY {json}. For MoE models also each MoE block's expert load (max/mean of the tokens "
                     "routed to each expert) over the split.");
  std::string checkpoint, data_dir, split = "val", text_file, ids_file, logits_out;
  int64_t seq_len = 0, max_windows = 0, threads = 0;
  QuantOptions quant;
  app->add_option("--model,--checkpoint", checkpoint,
                  "a GGUF file, a Hugging Face directory, a training checkpoint, a run directory, or a `loom "
                  "quantize` output")
      ->type_name("PATH")
      ->required();
  auto* data_opt =
      app->add_option("--data", data_dir, "the output of loom prepare (DIR/<split>.bin)")->type_name("DIR");
  auto* text_opt = app->add_option("--text", text_file, "a text file, tokenized with the model's tokenizer")
                       ->type_name("FILE")
                       ->excludes(data_opt);
  app->add_option("--ids", ids_file, "token ids, whitespace-separated")
      ->type_name("FILE")
      ->excludes(data_opt)
      ->excludes(text_opt);
  app->add_option("--logits-out", logits_out, "write the first window's logits as raw little-endian float32 [T, vocab]")
      ->type_name("FILE");
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
  std::string lora;
  add_lora_option(*app, lora);
  if (auto rc = parse(*app, argv)) return *rc;
  if (threads_opt->count()) set_num_threads(int(threads));
  if (data_dir.empty() && text_file.empty() && ids_file.empty())
    throw UsageError("[eval] give the tokens to score: --data DIR (loom prepare's output), --text FILE or --ids FILE");
  InferenceModel m = load_inference_model(checkpoint, quant_spec_from(quant), stderr, false, nullptr, lora);
  const model::ModelConfig& cfg = m.model->config();
  const int64_t T = seq_len_opt->count() ? seq_len : cfg.n_ctx;
  if (T < 1 || T > cfg.n_ctx)
    throw UsageError(str_cat("[eval] --seq-len ", T, ": expected 1 to the model's context of ", cfg.n_ctx));
  std::optional<data::TokenDataset> ds;
  TokenWindows list;
  std::string source;
  if (!data_dir.empty()) {
    data::DatasetOptions dopt;
    dopt.model_vocab = cfg.vocab_size;
    ds = data::TokenDataset::open_split(data_dir, split, dopt);
    source = data_dir + "/" + split + ".bin";
    if (ds->has_mask()) {  // conversations: each scored alone, from its first token (data.chat_layout=pad)
      dopt.layout = data::ChatLayout::pad;
      dopt.verify = false;
      ds = data::TokenDataset::open_split(data_dir, split, dopt);
      source += " (one conversation per window)";
    }
  } else {
    list.T = T;
    if (!ids_file.empty()) {
      list.ids = read_ids(ids_file, cfg.vocab_size);
      source = ids_file;
    } else {
      const auto tok = data::make_tokenizer(m.tokenizer);
      list.ids = tok->encode(io::read_file(text_file));
      source = str_cat(text_file, " (", list.ids.size(), " tokens, ", tok->name(), " tokenizer)");
    }
    if (list.ids.size() < 2) throw UsageError(str_cat("[eval] ", source, " holds fewer than 2 tokens"));
  }
  int64_t windows = ds ? ds->eval_windows(T) : list.count();
  if (max_windows > 0) windows = std::min(windows, max_windows);

  const int64_t bs = 16, nb = infer::KVCache::blocks_for_tokens(T, bs);
  infer::KVCache cache(cfg, nb, bs, DType::f32);
  infer::ModelRunner runner(*m.model, cache, T, 1, m.quant_ptr());
  std::vector<int32_t> tok(static_cast<size_t>(T)), tgt(static_cast<size_t>(T)), table(static_cast<size_t>(nb));
  std::iota(table.begin(), table.end(), 0);
  std::fprintf(stderr, "[eval] %s (%s) on %s: %lld windows of %lld tokens\n", m.checkpoint.c_str(),
               m.precision().c_str(), source.c_str(), (long long)windows, (long long)T);
  Stopwatch sw;
  double sum = 0;
  int64_t count = 0;
  for (int64_t w = 0; w < windows; ++w) {
    const int64_t n = ds ? T : list.length(w);
    if (ds)
      ds->fill_eval_batch(w, 1, T, tok.data(), tgt.data());
    else
      list.fill(w, tok.data(), tgt.data());
    infer::StepPlan plan;
    infer::ScheduledSeq s;
    s.seq_id = 0;
    s.num_tokens = n;
    s.tokens = std::span<const int32_t>(tok.data(), size_t(n));
    s.block_table = table;
    plan.seqs.push_back(s);
    const Tensor logits = runner.execute_all_rows(plan);
    if (w == 0 && !logits_out.empty())
      io::write_file_atomic(logits_out, std::string_view(reinterpret_cast<const char*>(logits.data<float>()),
                                                         size_t(n * cfg.vocab_size) * sizeof(float)));
    for (int64_t i = 0; i < n; ++i) {
      if (tgt[size_t(i)] < 0) continue;  // the list's last token: no next one to score
      sum += token_nll(logits.data<float>() + i * cfg.vocab_size, cfg.vocab_size, tgt[size_t(i)]);
      ++count;
    }
    LOOM_CHECK(std::isfinite(sum), "eval", "the loss is not finite after window ", w,
               ": the checkpoint's weights hold non-finite values");
  }
  const double loss = sum / double(std::max<int64_t>(count, 1)), secs = sw.seconds();
  std::printf("[eval] loss %.4f nats/token, perplexity %.3f over %lld tokens (%.1f s, %.0f tokens/s)\n", loss,
              std::exp(loss), (long long)count, secs, double(count) / secs);
  nlohmann::json j = {{"checkpoint", m.checkpoint},
                      {"source", source},
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

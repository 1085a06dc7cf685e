// Perplexity of `loom bench infer --peer llama.cpp --ppl-text FILE`: loom and llama.cpp score
// the same token ids in the same windows, each side's negative log-likelihoods summed in
// float64 from its own logits. The windows and the loss are those of `loom eval --text`, so
// loom's figure here equals `loom eval --seq-len T --max-windows N` on the same model.
#include <algorithm>
#include <cmath>
#include <numeric>
#include <span>
#include <sstream>

#include "bench/loom/bench_infer.h"
#include "loom/core/error.h"
#include "loom/infer/kv_cache.h"
#include "loom/infer/model_runner.h"
#include "tools/loom/token_nll.h"

namespace loom::cli {

PplWindows::PplWindows(std::vector<int32_t> ids_in, int64_t T_in, int64_t max_windows)
    : ids(std::move(ids_in)), T(T_in) {
  LOOM_CHECK(T >= 1, "bench infer", "--ppl-seq-len must be at least 1, got ", T);
  LOOM_CHECK(ids.size() >= 2, "bench infer", "--ppl-text holds ", ids.size(), " tokens; perplexity needs at least 2");
  windows = (int64_t(ids.size()) - 2) / T + 1;
  if (max_windows > 0) windows = std::min(windows, max_windows);
}

int64_t PplWindows::length(int64_t w) const { return std::min<int64_t>(T, int64_t(ids.size()) - w * T); }

int64_t PplWindows::scored() const {
  int64_t n = 0;
  for (int64_t w = 0; w < windows; ++w) n += std::min<int64_t>(length(w), int64_t(ids.size()) - 1 - w * T);
  return n;
}

double Perplexity::ppl() const { return std::exp(loss()); }

Perplexity loom_perplexity(const InferenceModel& im, const PplWindows& w) {
  const model::ModelConfig& cfg = im.model->config();
  LOOM_CHECK(w.T <= cfg.n_ctx, "bench infer", "--ppl-seq-len ", w.T, " exceeds the model's context of ", cfg.n_ctx);
  const int64_t bs = 16, nb = infer::KVCache::blocks_for_tokens(w.T, bs);
  infer::KVCache cache(cfg, nb, bs, DType::f32);
  infer::ModelRunner runner(*im.model, cache, w.T, 1, im.quant_ptr());
  std::vector<int32_t> table(static_cast<size_t>(nb));
  std::iota(table.begin(), table.end(), 0);
  Perplexity p;
  const int64_t V = cfg.vocab_size, size = int64_t(w.ids.size());
  for (int64_t k = 0; k < w.windows; ++k) {
    const int64_t n = w.length(k), at = k * w.T;
    infer::StepPlan plan;
    infer::ScheduledSeq s;
    s.seq_id = 0;
    s.num_tokens = n;
    s.tokens = std::span<const int32_t>(w.ids.data() + at, size_t(n));
    s.block_table = table;
    plan.seqs.push_back(s);
    const Tensor logits = runner.execute_all_rows(plan);
    for (int64_t i = 0; i < n && at + i + 1 < size; ++i) {
      p.nll_sum += token_nll(logits.data<float>() + i * V, V, w.ids[size_t(at + i + 1)]);
      ++p.tokens;
    }
  }
  LOOM_CHECK(std::isfinite(p.nll_sum), "bench infer", "loom's loss on --ppl-text is not finite (", im.checkpoint, ", ",
             im.precision(), ")");
  return p;
}

Perplexity peer_perplexity(PeerProcess& peer, const PplWindows& w) {
  Perplexity p;
  const int64_t size = int64_t(w.ids.size());
  for (int64_t k = 0; k < w.windows; ++k) {
    // `nll N t0 .. t(N-1) [tN]`: N inputs, then the last one's target when the text has it.
    const int64_t n = w.length(k), at = k * w.T, end = std::min(at + n + 1, size);
    std::string cmd = str_cat("nll ", n);
    for (int64_t i = at; i < end; ++i) cmd += str_cat(" ", w.ids[size_t(i)]);
    peer.send_line(cmd);
    std::istringstream is(peer.read_until("NLL "));
    double sum = 0;
    int64_t count = 0;
    if (!(is >> sum >> count) || count != end - at - 1)
      throw Error(str_cat("[bench infer] llama.cpp peer: window ", k, " came back as \"", is.str(), "\"; expected ",
                          end - at - 1, " scored tokens"));
    p.nll_sum += sum;
    p.tokens += count;
  }
  LOOM_CHECK(std::isfinite(p.nll_sum), "bench infer", "llama.cpp's loss on --ppl-text is not finite");
  return p;
}

}  // namespace loom::cli

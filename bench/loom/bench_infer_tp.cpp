// `loom launch --nproc N -- bench infer --tp N`: tensor-parallel decode speed. Rank 0 leads
// an engine over its slice, the others follow; batch-1 decode (median of 5 rounds, the
// bandwidth bound of this rank's share of the weights) and one prompt's prefill, as the
// one-process `bench infer` measures them, so the two runs compare directly.
#include <cstdio>

#include "bench/loom/bench_infer.h"
#include "loom/core/threads.h"
#include "loom/kernels/cpu/cpu_kernels.h"
#include "loom/model/checkpoint_reader.h"
#include "tools/loom/inference_model.h"

namespace loom::cli {

int bench_infer_tp(const InferBenchOptions& a, int threads) {
  const TensorParallel tp = tensor_parallel_from(a.tp, "bench infer", /*watchdog=*/true);
  const auto quant = quant_spec_from(a.quant);
  std::string ckpt;
  FILE* log = tp.leader() ? stderr : nullptr;
  if (a.given("checkpoint")) ckpt = resolve_inference_checkpoint(a.checkpoint, log);
  const model::ModelConfig mc = ckpt.empty() ? model::preset(a.model) : model::checkpoint_model_config(ckpt);
  const InferenceModel im = bench_model(ckpt, mc, uint64_t(a.seed), quant, log, tp.group());
  infer::EngineConfig cfg;
  cfg.block_size = a.block_size;
  cfg.kv_cache_bytes = (a.given("kv-cache-mb") ? a.kv_cache_mb : 256) << 20;
  cfg.quant = im.quant_ptr();
  cfg.tp = tp.group();
  const int64_t n_tokens = a.batch1_tokens;
  const int64_t prefill = std::min(a.prefill_tokens, mc.n_ctx - 1);
  if (!tp.leader()) {
    // The leader's engines, one after the other: batch 1, then the prefill's.
    for (int i = 0; i < (prefill > 0 ? 2 : 1); ++i) {
      infer::Engine e(*im.model, i == 0 ? batch1_config(cfg) : prefill_config(cfg, prefill));
      e.follow();
    }
    return 0;
  }
  std::printf("bench infer --tp %lld: %s%s, %s, %d threads per rank, kernels %s\n", (long long)tp.size,
              mc.summary().c_str(), weights_origin(ckpt).c_str(), im.precision().c_str(), threads,
              cpu::hot_kernels_isa().c_str());
  const Batch1 b1 = run_batch1(*im.model, cfg, n_tokens);
  std::printf(
      "batch-1 decode: %.2f tokens/s; this rank's weights read per token %.1f MB (bound %.2f tokens/s at "
      "%.2f GB/s, achieved %.1f%%)\n",
      b1.tokens_per_s, b1.bytes_per_token / 1e6, b1.bound, b1.bandwidth / 1e9, 100 * b1.fraction);
  double prefill_rate = 0;
  if (prefill > 0) {
    prefill_rate = prefill_tokens_per_s(*im.model, cfg, prefill);
    std::printf("prompt processing: %lld-token prompt at %.1f tokens/s (one step, median of 3)\n", (long long)prefill,
                prefill_rate);
  }
  std::printf(
      "SUMMARY {\"model\":\"%s\",\"quant\":\"%s\",\"tp\":%lld,\"threads_per_rank\":%d,\"batch1_tokens_per_s\":%g,"
      "\"batch1_bytes_per_token_per_rank\":%g,\"prefill_tokens_per_s\":%g}\n",
      mc.name.c_str(), im.precision().c_str(), (long long)tp.size, threads, b1.tokens_per_s, b1.bytes_per_token,
      prefill_rate);
  return 0;
}

}  // namespace loom::cli

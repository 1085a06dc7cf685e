// Batch-1 decode and prompt-processing timings of `loom bench infer`, shared by its serving
// benchmark (bench_infer.cpp) and its llama.cpp side-by-side run (bench_infer_peer.cpp).
#pragma once
#include <cstdint>
#include <cstdio>
#include <optional>
#include <string>
#include <vector>

#include "bench/loom/bench.h"
#include "bench/loom/peer_process.h"
#include "loom/infer/engine.h"
#include "loom/model/decoder.h"
#include "tools/loom/inference_model.h"

namespace loom::cli {

// The instruction set the llama.cpp peer is compiled for (bench/peers/setup_llama_cpp.sh's
// second argument): this CPU's own (-march=native), or AVX2 only as on a Zen 3 even where this
// CPU has more, to compare with loom under LOOM_ISA=avx2.
enum class PeerIsa { native, avx2 };

// `loom bench infer`'s options (declared in bench_infer.cpp). Its modes (serving, --peer,
// --tp, --speculative) default some of them differently; `given` says which were given.
struct InferBenchOptions {
  std::string model = "gpt2-124m", checkpoint, mode = "both", static_policy = "padded", prompt_len, output_len;
  int64_t requests = 0, max_num_seqs = 32, max_batched_tokens = 2048, block_size = 16, kv_cache_mb = 0, threads = 0,
          seed = 1, batch1_tokens = 64, prefill_tokens = 512, tp = 1;
  double rate = 8.0, temperature = 0.0;
  bool no_prefix_caching = false, no_batch1 = false;
  QuantOptions quant;
  // --peer llama.cpp
  std::string peer, peer_venv, precisions = "fp32,int8,int4", compare_prompt, ppl_text;
  int64_t rounds = 3, compare_tokens = 32, ppl_seq_len = 512, ppl_max_windows = 0;
  PeerIsa peer_isa = PeerIsa::native;
  // --speculative
  std::string speculative, data, workload;
  int64_t batch1_requests = 6;
  double low_rate = 0;
  const CLI::App* app = nullptr;
  bool given(const std::string& name) const { return app && app->count("--" + name) > 0; }
};

// The model a run measures: the resolved checkpoint `ckpt` (loaded as load_inference_model loads
// it), or when empty `mc` with random weights from `seed`; quantized as `quant` asks, and this
// rank's slice when `tp` is given.
InferenceModel bench_model(const std::string& ckpt, const model::ModelConfig& mc, uint64_t seed,
                           const std::optional<infer::QuantSpec>& quant, FILE* log, const comm::Group* tp = nullptr);
// Where bench_model's weights come from, for a run's first line: " from CKPT" or " (random weights)".
std::string weights_origin(const std::string& ckpt);

// Sustained read bandwidth in bytes/s: the best of two sums over n floats with the
// benchmark's threads (weights are read-only while decoding, so reading is the bound).
double measure_read_bandwidth(const float* buf, int64_t n);

struct Batch1 {
  double tokens_per_s = 0, bandwidth = 0, bound = 0, bytes_per_token = 0, fraction = 0;
  // The same against a sum over a buffer the size of the weights read per token: the bound
  // when they stay in the last-level cache (a quantized gpt2-124m fits a large L3).
  double weights_bandwidth = 0, weights_bound = 0, weights_fraction = 0;
};

// Decodes one sequence in rounds, each followed by the bandwidth measurements, so that rate and
// bound are taken under the same conditions; the round with the median fraction is returned.
Batch1 run_batch1(const model::Decoder& m, const infer::EngineConfig& cfg, int64_t n_tokens);
// The engine settings run_batch1 and prefill_tokens_per_s run with (tensor-parallel followers
// build the same engines).
infer::EngineConfig batch1_config(infer::EngineConfig cfg);
infer::EngineConfig prefill_config(infer::EngineConfig cfg, int64_t P);

// One P-token prompt prefilled in a single step (and its first token) on `e`, in prompt
// tokens per second; `rep` varies the token ids, so an engine with prefix caching off sees a
// fresh prompt each time.
double time_prefill(infer::Engine& e, int64_t vocab, int64_t P, int rep);
// The median of 3 such prompts on an engine of its own (one sequence, no prefix caching).
double prefill_tokens_per_s(const model::Decoder& m, const infer::EngineConfig& cfg, int64_t P);

// `bench infer --peer llama.cpp`: loom and llama.cpp on the same weights, alternating runs.
// `checkpoint` is a resolved f32 checkpoint or a Hugging Face directory (exported as GGUF at
// fp32/F32, bf16/BF16, int8/Q8_0 and int4/Q4_0; greedy tokens must match at F32), a GGUF file
// (llama.cpp runs the file itself at every precision of loom's), or empty for the preset `mc`
// with random weights. --ppl-text adds perplexity on both sides (bench_infer_ppl.cpp).
int bench_infer_llama_cpp(const InferBenchOptions& a, const model::ModelConfig& mc, const std::string& checkpoint,
                          const infer::EngineConfig& cfg, int threads, int64_t prefill);

// Perplexity beside llama.cpp: consecutive windows of T tokens over `ids`, as `loom eval`
// scores a text (each input's target is the next token; the last window may be shorter), the
// first `max_windows` of them (0: all).
struct PplWindows {
  std::vector<int32_t> ids;
  int64_t T = 0, windows = 0;
  PplWindows(std::vector<int32_t> ids, int64_t T, int64_t max_windows);
  int64_t length(int64_t w) const;  // inputs of window w
  int64_t scored() const;           // tokens with a target, over all windows
};
struct Perplexity {
  double nll_sum = 0;  // nats, float64
  int64_t tokens = 0;
  double loss() const { return tokens ? nll_sum / double(tokens) : 0; }
  double ppl() const;
};
Perplexity loom_perplexity(const InferenceModel& im, const PplWindows& w);
// The peer (llama_cpp_peer.py --logits-all) scores the same windows, in float64 as loom does.
Perplexity peer_perplexity(PeerProcess& peer, const PplWindows& w);

// `bench infer --tp N` under `loom launch --nproc N`: tensor-parallel decode speed.
int bench_infer_tp(const InferBenchOptions& a, int threads);
// `bench infer --speculative SPEC`: speculative against plain decoding (bench_spec.cpp).
int bench_infer_speculative(const InferBenchOptions& a, int threads);

}  // namespace loom::cli

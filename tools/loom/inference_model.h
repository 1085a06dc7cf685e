// The model an inference command runs: a training checkpoint (or run directory) in f32,
// optionally quantized on load (--quant), or a quantized checkpoint from `loom quantize`.
// Shared by generate, serve, eval and bench infer, so all four accept the same options.
#pragma once
#include <cstdio>
#include <memory>
#include <optional>
#include <string>

#include "loom/comm/world.h"
#include "loom/data/tokenizer.h"
#include "loom/infer/quant_weights.h"
#include "loom/infer/speculative.h"
#include "loom/model/decoder.h"
#include "loom/model/model_source.h"
#include "tools/loom/commands.h"

namespace loom::cli {

// --quant fp32|bf16|int8|int4, --group N, --quant-head int8|bf16|f32, --zero-point.
struct QuantOptions {
  std::string quant = "fp32", head = "int8";
  int64_t group = -1;  // -1: the format's default
  bool zero_point = false;
};
void add_quant_options(CLI::App& app, QuantOptions& o);
std::optional<infer::QuantSpec> quant_spec_from(const QuantOptions& o);

struct InferenceModel {
  std::unique_ptr<model::Decoder> model;
  std::optional<infer::QuantizedModel> quant;
  std::string checkpoint;  // the checkpoint directory, GGUF file or Hugging Face directory
  // What data::make_tokenizer opens: the name recorded at training time ("gpt2", "byte"), or
  // the GGUF file or Hugging Face directory the model came from.
  std::string tokenizer;
  // Of a GGUF file or Hugging Face directory: where it came from, its name, chat template and
  // end tokens (model::ModelCard); a loom checkpoint has the checkpoint's name and none.
  model::ModelFormat format = model::ModelFormat::loom;
  std::string name;
  std::string chat_template, chat_template_source, bos_token, eos_token;
  std::vector<int32_t> end_ids;
  std::vector<std::string> end_tokens;
  const infer::QuantizedModel* quant_ptr() const { return quant ? &*quant : nullptr; }
  std::string precision() const;  // "fp32", or QuantSpec::describe()
};

// The ids that end a reply: `ids`, the ids of `texts` in `tok`'s vocabulary (texts it lacks are
// skipped), and the tokenizer's own eos.
std::vector<int32_t> end_token_ids(const std::vector<int32_t>& ids, const std::vector<std::string>& texts,
                                   const data::Tokenizer& tok);

// --tp N: tensor-parallel inference over the N processes of `loom launch --nproc N`.
struct TensorParallel {
  std::unique_ptr<comm::World> world;  // null: one process
  int64_t size = 1;
  const comm::Group* group() const { return world ? &world->group() : nullptr; }
  bool leader() const { return !world || world->rank() == 0; }
  int rank() const { return world ? world->rank() : 0; }
};
// Declares --tp N (default 1) into `size`.
void add_tensor_parallel_option(CLI::App& app, int64_t& size);
// Above 1, joins the job (which must have exactly `size` processes); `watchdog` off for a
// server, whose followers wait as long as it idles.
TensorParallel tensor_parallel_from(int64_t size, const std::string& cmd, bool watchdog);

// Resolves `dir` (a checkpoint, a run directory, a quantized checkpoint, a GGUF file or a
// Hugging Face directory), verifies and loads it (foreign weights dequantized to f32); `quant` quantizes an f32
// checkpoint on load. A quantized checkpoint with a --quant other than its own is refused, naming both. `resolved`: dir
// is a checkpoint that model::resolve_checkpoint already verified. `tp`: this rank keeps its tensor-parallel slice (f32
// checkpoints only; quantized on load after slicing).
// A LoRA checkpoint (model.lora) loads as the model it records with the adapters merged; `lora`
// (--lora DIR) merges the adapters of DIR into `dir` instead, which must be the model they were
// trained on.
InferenceModel load_inference_model(const std::string& dir, const std::optional<infer::QuantSpec>& quant, FILE* log,
                                    bool resolved = false, const comm::Group* tp = nullptr,
                                    const std::string& lora = "");
// --lora DIR, for the commands that load a model.
void add_lora_option(CLI::App& app, std::string& dir);
// Writes `out` (replacing it), a quantized checkpoint of `src` (a training checkpoint or run
// directory, a GGUF file or a Hugging Face directory) as load_inference_model loads it under
// `spec`: a GGUF's Q8_0/Q4_0/Q4_1 blocks stay as they are where the format holds them. A foreign
// model's config, tokenizer and chat files go along (model_card_files.h), so the checkpoint
// stands alone, as a cascade's edges need it. Returns the model as loaded.
InferenceModel write_quantized_checkpoint(const std::string& src, const infer::QuantSpec& spec, const std::string& out,
                                          FILE* log);
// Random weights of `cfg` (benchmarks, tests), quantized when asked; `tp` as above (every
// slice initialised as the whole model would be).
InferenceModel random_inference_model(const model::ModelConfig& cfg, uint64_t seed,
                                      const std::optional<infer::QuantSpec>& quant, const comm::Group* tp = nullptr);
// What serve checks before it listens: the checkpoint to load (resolved and verified, or a
// quantized checkpoint as given) and its model config.
std::string resolve_inference_checkpoint(const std::string& dir, FILE* log);

// --speculative SPEC, shared by generate, serve and bench infer (docs/INFERENCE.md): declared
// into `text` ("" when not given).
void add_speculative_option(CLI::App& app, std::string& text);
struct SpeculativeSetup {
  infer::SpeculativeConfig config;              // config.draft points into `draft` once it is loaded
  std::string draft_dir;                        // draft=DIR
  std::optional<infer::QuantSpec> draft_quant;  // quant=NAME
  std::optional<InferenceModel> draft;
  std::string text;  // as given
};
// Parses SPEC: "draft=DIR" or "ngram", then comma-separated k=N, n=N (n-gram size; matches
// fall back to shorter ones down to 1), adaptive=on|off, max_batch=N (0: no limit),
// quant=NAME (the draft's weights). Loads nothing; a bad item is a UsageError naming it.
SpeculativeSetup parse_speculative(const std::string& text, const std::string& cmd);
// Loads the draft of method draft (no-op for ngram): its tokenizer must be the target's (the
// engine checks the vocabulary); a draft not smaller than the target is warned about on log.
void load_speculative_draft(SpeculativeSetup& s, const InferenceModel& target, FILE* log);

}  // namespace loom::cli

// The model an inference command runs: a training checkpoint (or run directory) in f32,
// optionally quantized on load (--quant), or a quantized checkpoint from `loom quantize`.
// Shared by generate, serve, eval and bench infer, so all four accept the same options.
#pragma once
#include <cstdio>
#include <memory>
#include <optional>
#include <string>

#include "loom/infer/quant_weights.h"
#include "loom/model/decoder.h"
#include "tools/loom/commands.h"

namespace loom::cli {

// --quant fp32|int8|int4, --group N, --quant-head int8|f32, --zero-point: the Args spec
// entries and the help text.
void add_quant_options(std::map<std::string, OptionKind>& spec);
extern const char* const kQuantHelp;
std::optional<infer::QuantSpec> quant_spec_from(const Args& a);

struct InferenceModel {
  std::unique_ptr<model::Decoder> model;
  std::optional<infer::QuantizedModel> quant;
  std::string checkpoint;  // the directory the weights came from
  std::string tokenizer;   // as recorded at training time
  const infer::QuantizedModel* quant_ptr() const { return quant ? &*quant : nullptr; }
  std::string precision() const;  // "fp32", or QuantSpec::describe()
};

// Resolves `dir` (a checkpoint, a run directory, or a quantized checkpoint), verifies and
// loads it; `quant` quantizes an f32 checkpoint on load. A quantized checkpoint with a --quant
// other than its own is refused, naming both. `resolved`: dir is a checkpoint that
// train::resolve_checkpoint already verified.
InferenceModel load_inference_model(const std::string& dir, const std::optional<infer::QuantSpec>& quant,
                                    FILE* log, bool resolved = false);
// Random weights of `cfg` (benchmarks, tests), quantized when asked.
InferenceModel random_inference_model(const model::ModelConfig& cfg, uint64_t seed,
                                      const std::optional<infer::QuantSpec>& quant);
// What serve checks before it listens: the checkpoint to load (resolved and verified, or a
// quantized checkpoint as given) and its model config.
std::string resolve_inference_checkpoint(const std::string& dir, FILE* log);

}  // namespace loom::cli

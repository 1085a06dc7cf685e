#include "tools/loom/inference_model.h"

#include "loom/core/error.h"
#include "loom/core/timer.h"
#include "loom/infer/quant_checkpoint.h"
#include "loom/train/checkpoint.h"

namespace loom::cli {

const char* const kQuantHelp =
    "  --quant NAME      fp32 (default), bf16, int8 or int4: the block matrices and the head on load\n"
    "  --group N         weights per scale (int8 default: one scale per row; int4 default: 64)\n"
    "  --quant-head H    int8 (default; bf16 under --quant bf16) or f32: the LM head under --quant\n"
    "  --zero-point      int4 with a zero point per group (asymmetric)\n";

void add_quant_options(std::map<std::string, OptionKind>& spec) {
  spec.insert({{"quant", true}, {"group", true}, {"quant-head", true}, {"zero-point", false}});
}

std::optional<infer::QuantSpec> quant_spec_from(const Args& a) {
  return infer::parse_quant_spec(a.get("quant", "fp32"), a.get_int("group", -1), a.get("quant-head", "int8"),
                                 a.has("zero-point"));
}

std::string InferenceModel::precision() const { return quant ? quant->spec.describe() : "fp32"; }

namespace {
void quantize_on_load(InferenceModel& m, const infer::QuantSpec& spec, FILE* log) {
  Stopwatch sw;
  m.quant = infer::QuantizedModel::quantize(*m.model, spec);
  if (log)
    std::fprintf(log, "[quant] %s: %s, matrices %.1f MB, kernels %s (%.2f s)\n",
                 m.checkpoint.empty() ? "random weights" : m.checkpoint.c_str(), spec.describe().c_str(),
                 double(m.quant->bytes()) / 1e6, cpu::quant_linear_path(spec.format).c_str(), sw.seconds());
}

model::DecoderOptions inference_options() {
  model::DecoderOptions opt;
  opt.allocate_flat_grads = false;  // inference only
  return opt;
}
}  // namespace

std::string resolve_inference_checkpoint(const std::string& dir, FILE* log) {
  return infer::is_quantized_checkpoint(dir) ? dir : train::resolve_checkpoint(dir, log);
}

InferenceModel random_inference_model(const model::ModelConfig& cfg, uint64_t seed,
                                      const std::optional<infer::QuantSpec>& quant) {
  InferenceModel m;
  m.model = std::make_unique<model::Decoder>(cfg, inference_options());
  m.model->init_weights(seed);
  if (quant) quantize_on_load(m, *quant, stderr);
  return m;
}

InferenceModel load_inference_model(const std::string& dir, const std::optional<infer::QuantSpec>& quant, FILE* log,
                                    bool resolved) {
  InferenceModel m;
  if (infer::is_quantized_checkpoint(dir)) {
    infer::QuantizedCheckpoint q = infer::load_quantized_checkpoint(dir);
    LOOM_CHECK(!quant || quant->describe() == q.quant.spec.describe(), "quant", dir, " is already quantized (",
               q.quant.spec.describe(), "); drop --quant ", quant ? quant->describe() : "",
               " or quantize the original checkpoint ", q.source);
    m.model = std::move(q.model);
    m.quant = std::move(q.quant);
    m.checkpoint = dir;
    m.tokenizer = train::checkpoint_tokenizer(dir);
    return m;
  }
  m.checkpoint = resolved ? dir : train::resolve_checkpoint(dir, log);
  m.model = std::make_unique<model::Decoder>(train::checkpoint_model_config(m.checkpoint), inference_options());
  train::load_checkpoint_weights(m.checkpoint, *m.model, /*verified=*/true);  // by resolve_checkpoint
  m.tokenizer = train::checkpoint_tokenizer(m.checkpoint);
  if (quant) quantize_on_load(m, *quant, log);
  return m;
}

}  // namespace loom::cli

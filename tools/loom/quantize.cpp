// `loom quantize --checkpoint DIR --to int8|int4|bf16 [--group N] [--quant-head int8|f32]
// [--zero-point] --out DIR2`: writes a quantized checkpoint (infer/quant_checkpoint.h).
#include <cstdio>
#include <filesystem>

#include <nlohmann/json.hpp>

#include "loom/core/error.h"
#include "loom/core/timer.h"
#include "loom/infer/quant_checkpoint.h"
#include "tools/loom/commands.h"
#include "tools/loom/inference_model.h"

namespace loom::cli {

namespace {
const char* kHelp =
    "usage: loom quantize --checkpoint DIR --to int8|int4|bf16 [--group N] [--quant-head int8|f32]\n"
    "                     [--zero-point] --out DIR2\n\n"
    "Writes DIR2, a checkpoint whose block matrices (and LM head) are int8 or int4 with one f32\n"
    "scale per group of weights, or bf16; loom generate, serve, eval and bench infer load it with\n"
    "--checkpoint DIR2. Embeddings, norms and biases stay f32. Layout: docs/INFERENCE.md.\n"
    "  --checkpoint DIR  a training checkpoint, or a run directory (its newest valid one)\n"
    "  --to NAME         int8, int4 or bf16\n"
    "  --group N         weights per scale (int8 default: one scale per row; int4 default: 64)\n"
    "  --quant-head H    int8 (default; bf16 under --to bf16) or f32\n"
    "  --zero-point      int4 with a zero point per group (asymmetric)\n"
    "  --out DIR2        the quantized checkpoint (replaced if it exists)\n"
    "The last line is SUMMARY {json}.\n";
}  // namespace

int cmd_quantize(const std::vector<std::string>& argv) {
  Args a("quantize", argv,
         {{"checkpoint", true}, {"to", true}, {"group", true}, {"quant-head", true}, {"zero-point", false},
          {"out", true}, {"help", false}});
  if (a.has("help")) {
    std::printf("%s", kHelp);
    return 0;
  }
  if (!a.has("checkpoint") || !a.has("to") || !a.has("out"))
    throw UsageError(std::string("[quantize] --checkpoint, --to and --out are required\n\n") + kHelp);
  const std::string to = a.get("to", "");
  if (to != "int8" && to != "int4" && to != "bf16")
    throw UsageError(str_cat("[quantize] --to ", to, ": expected int8, int4 or bf16"));
  const auto spec = infer::parse_quant_spec(to, a.get_int("group", -1), a.get("quant-head", "int8"), a.has("zero-point"));
  const std::string src = a.get("checkpoint", ""), out = a.get("out", "");
  LOOM_CHECK(!infer::is_quantized_checkpoint(src), "quantize", src,
             " is already quantized; quantize the training checkpoint it came from");
  Stopwatch sw;
  InferenceModel m = load_inference_model(src, std::nullopt, stderr);
  const int64_t f32_bytes = m.model->num_params() * 4;
  const infer::QuantizedModel q = infer::QuantizedModel::quantize(*m.model, *spec);
  infer::save_quantized_checkpoint(out, m.checkpoint, *m.model, q);
  int64_t out_bytes = 0;
  for (const auto& e : std::filesystem::directory_iterator(out))
    if (e.is_regular_file()) out_bytes += int64_t(e.file_size());
  std::printf("[quantize] %s -> %s: %s; matrices %.1f MB, checkpoint %.1f MB (f32 weights %.1f MB), %.1f s\n",
              m.checkpoint.c_str(), out.c_str(), spec->describe().c_str(), double(q.bytes()) / 1e6,
              double(out_bytes) / 1e6, double(f32_bytes) / 1e6, sw.seconds());
  nlohmann::json s = {{"source", m.checkpoint}, {"out", out}, {"quant", spec->describe()},
                      {"matrix_bytes", q.bytes()}, {"checkpoint_bytes", out_bytes}, {"f32_weight_bytes", f32_bytes}};
  std::printf("SUMMARY %s\n", s.dump().c_str());
  return 0;
}

}  // namespace loom::cli

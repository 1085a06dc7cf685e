// `loom quantize --checkpoint DIR|--model PATH --to int8|int4|bf16 [--group N] [--quant-head
// int8|f32] [--zero-point] --out DIR2`: writes a quantized checkpoint (infer/quant_checkpoint.h)
// of a loom checkpoint, a GGUF file (its Q8_0/Q4_0/Q4_1 blocks kept) or a Hugging Face directory.
#include <cstdio>
#include <filesystem>

#include <nlohmann/json.hpp>

#include "loom/core/error.h"
#include "loom/core/timer.h"
#include "loom/infer/quant_checkpoint.h"
#include "loom/model/model_source.h"
#include "tools/loom/commands.h"
#include "tools/loom/inference_model.h"

namespace loom::cli {

int cmd_quantize(const std::vector<std::string>& argv) {
  auto app = new_app("quantize",
                     "Writes DIR2, a checkpoint whose block matrices (and LM head) are int8 or int4 with one f32 "
                     "scale per group of weights, or bf16; loom generate, serve, eval and bench infer load it with "
                     "--checkpoint DIR2. Embeddings, norms and biases stay f32. A GGUF file's Q8_0/Q4_0/Q4_1 blocks "
                     "stay as they are (group 32), and a GGUF's or Hugging Face directory's tokenizer and chat "
                     "template go along. Layout: docs/INFERENCE.md. The last line is SUMMARY {json}.");
  std::string src, out;
  QuantOptions q;
  q.quant.clear();
  app->add_option("--checkpoint,--model", src,
                  "a training checkpoint, a run directory (its newest valid one), a GGUF file or a Hugging Face "
                  "directory")
      ->type_name("PATH")
      ->required();
  app->add_option("--to", q.quant, "the format")->check(one_of({"int8", "int4", "bf16"}))->required();
  app->add_option("--group", q.group, "weights per scale (default or 0: int8 one scale per row, int4 64)")
      ->check(non_negative())
      ->default_str("");
  app->add_option("--quant-head", q.head, "the LM head (int8: bf16 under --to bf16)")->check(one_of({"int8", "f32"}));
  app->add_flag("--zero-point", q.zero_point, "int4 with a zero point per group (asymmetric)");
  app->add_option("--out", out, "the quantized checkpoint (replaced if it exists)")->type_name("DIR2")->required();
  if (auto rc = parse(*app, argv)) return *rc;
  const auto spec = quant_spec_from(q);
  Stopwatch sw;
  const InferenceModel m = write_quantized_checkpoint(src, *spec, out, stderr);
  const int64_t f32_bytes = m.model->num_params() * 4;
  const infer::QuantizedModel& qm = *m.quant;
  int64_t out_bytes = 0;
  for (const auto& e : std::filesystem::directory_iterator(out))
    if (e.is_regular_file()) out_bytes += int64_t(e.file_size());
  std::printf("[quantize] %s -> %s: %s; matrices %.1f MB, checkpoint %.1f MB (f32 weights %.1f MB), %.1f s\n",
              m.checkpoint.c_str(), out.c_str(), qm.spec.describe().c_str(), double(qm.bytes()) / 1e6,
              double(out_bytes) / 1e6, double(f32_bytes) / 1e6, sw.seconds());
  nlohmann::json s = {{"source", m.checkpoint},        {"out", out},
                      {"quant", qm.spec.describe()},   {"matrix_bytes", qm.bytes()},
                      {"checkpoint_bytes", out_bytes}, {"f32_weight_bytes", f32_bytes}};
  std::printf("SUMMARY %s\n", s.dump().c_str());
  return 0;
}

}  // namespace loom::cli

#include "tools/loom/commands.h"

#include <cstdio>

#include "loom/core/cpu_features.h"
#include "loom/core/error.h"
#include "loom/io/checksum.h"
#include "loom/kernels/cpu/bf16_gemm.h"
#include "loom/kernels/cpu/blas_core.h"
#include "loom/kernels/cpu/cpu_kernels.h"
#include "loom/kernels/cpu/decode_linear.h"
#include "loom/kernels/cpu/paged_attention.h"
#include "loom/kernels/cpu/quant_linear.h"
#include "loom/kernels/cuda/cuda_ops.h"
#include "loom/train/run_environment.h"

namespace loom::cli {

const std::vector<Command>& commands() {
  static const std::vector<Command> cmds = {
      {"train", "train a model from a YAML config: loom train CONFIG.yaml", cmd_train},
      {"prepare", "tokenize text files into token shards for training", cmd_prepare},
      {"tokenize", "encode stdin to token ids (or --decode ids to text)", cmd_tokenize},
      {"chat-template", "print the prompt a chat template makes of messages (or its ids)", cmd_chat_template},
      {"launch", "run N ranks through mpirun: loom launch --nproc N -- train CONFIG.yaml", cmd_launch},
      {"generate", "sample text from a model: a GGUF file, a Hugging Face directory or a checkpoint", cmd_generate},
      {"chat", "interactive chat with a model in the terminal: loom chat --model PATH", cmd_chat},
      {"quantize", "write a bf16/int8/int4 copy of a checkpoint for inference", cmd_quantize},
      {"convert", "write a GGUF file or a Hugging Face directory as a loom checkpoint", cmd_convert},
      {"export", "write a checkpoint as a Hugging Face directory or a GGUF file", cmd_export},
      {"eval", "loss and perplexity of a model on prepared tokens or a text (any precision)", cmd_eval},
      {"report", "one HTML page of a training run's metrics: loom report RUN_DIR", cmd_report},
      {"plan", "predict memory and step time of training layouts", cmd_plan},
      {"bench", "benchmarks: loom bench --help lists them", cmd_bench},
      {"serve", "OpenAI-compatible HTTP server (completions, chat, SSE, /metrics)", cmd_serve},
      {"trace", "merge the per-rank step traces of --trace DIR: loom trace merge DIR", cmd_trace},
      {"version", "print the build's version and capabilities", cmd_version},
  };
  return cmds;
}

int cmd_version(const std::vector<std::string>& args) {
  auto app = new_app("version",
                     "Prints the build's version, the CPU and its features, the kernel each operation runs here "
                     "(LOOM_ISA and LOOM_QUANT_PATH change them), BLAS and CUDA devices.");
  if (auto rc = parse(*app, args)) return *rc;
  const std::string& model = cpu_model_name();
  std::printf("loom %s\ncpu: %s\ncpu features: %s\ncpu kernels: %s\nBLAS: OpenBLAS, %s kernels\n", train::kLoomVersion,
              model.empty() ? "unknown" : model.c_str(), cpu_feature_names(cpu_features()).c_str(),
              cpu::hot_kernels_isa().c_str(), cpu::blas_core().c_str());
  // Each from the selection function the operation itself calls.
  const std::pair<const char*, std::string> kernels[] = {
      {"f32 GEMM", "OpenBLAS " + cpu::blas_core()},
      {"bf16 GEMM", cpu::bf16_product_path()},
      {"int8 linear", cpu::quant_linear_path(cpu::QuantFormat::int8)},
      {"int4 linear", cpu::quant_linear_path(cpu::QuantFormat::int4)},
      {"bf16 linear", cpu::quant_linear_path(cpu::QuantFormat::bf16)},
      {"decode_linear", cpu::decode_linear_isa()},
      {"paged attention", cpu::paged_attention_isa()},
      {"checksum", std::string("crc32c ") + io::crc32c_impl()},
  };
  for (const auto& [op, kernel] : kernels)
    std::printf("kernel %-16s %s\n", (std::string(op) + ":").c_str(), kernel.c_str());
  std::printf("%s\n", cuda::describe().c_str());
  return 0;
}

}  // namespace loom::cli

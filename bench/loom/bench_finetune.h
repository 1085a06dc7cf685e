// `loom bench finetune`'s options and its two halves: the command (bench_finetune.cpp) prepares
// the model's f32 weights and the tokens once, then for each data-parallel degree runs loom's
// ranks and the PyTorch peer and compares them; the ranks (bench_finetune_rank.cpp) time the
// steps, for full fine-tuning or LoRA.
#pragma once
#include <cstdint>
#include <string>

#include "bench/loom/bench.h"
#include "loom/model/config.h"

namespace loom::cli {

// What is trained: every weight, or rank-8 LoRA adapters (alpha 16) on q_proj and v_proj beside
// the frozen model (the peer's bench/peers/torch_finetune.py --lora the same way).
enum class FinetuneMode { full, lora };
// "full" or "lora"; anything else throws UsageError saying why.
FinetuneMode finetune_mode_from_name(const std::string& name);
const char* finetune_mode_name(FinetuneMode mode);

struct FinetuneBenchOptions {
  std::string model, mode = "full", dp = "1,2", peer = "torch", peer_venv;
  int64_t batch = 4, micro_batch = 0, seq = 256, steps = 3, warmup = 1, threads = 0, rounds = 1;
  // micro_batch 0: --batch; threads 0: every core
  std::string work_dir;  // the ranks': what the command prepared, and where they write their figures
};

// SmolLM2-135M-Instruct's GGUF where scripts/fetch-test-model.sh keeps it: $LOOM_MODEL_CACHE,
// else ~/.cache/loom/models.
std::string default_finetune_model();

// What both sides train: the model's name and config, and where its tokens came from.
struct FinetuneWork {
  std::string name, tokens;
  model::ModelConfig config;
  int64_t params = 0;
};
// Writes the work directory both sides read (bench_finetune_work.cpp): `model`'s f32 weights as
// a Hugging Face directory (a preset's from seed 1234, a GGUF's dequantized) and `tokens` ids:
// the start of Tiny Shakespeare in the model's tokenizer, or random ids for a preset. Throws
// UsageError naming `model` when it is none of a preset, a GGUF file, a Hugging Face directory.
FinetuneWork prepare_finetune_work(const std::string& model, const std::string& work, size_t tokens);

// What the command prepares in the work directory for both sides.
inline constexpr const char* kFinetuneModelDir = "model";         // config.json + model.safetensors, f32
inline constexpr const char* kFinetuneTokensFile = "tokens.i32";  // int32 little-endian token ids
// Rank r's figures: rank<r>.json.
std::string finetune_rank_file(const std::string& work_dir, int rank);

// One rank of `loom launch --nproc N -- bench finetune --work-dir DIR ...`: loads DIR's model,
// times --warmup + --steps data-parallel steps on its share of DIR's tokens, writes its figures.
int bench_finetune_rank(const FinetuneBenchOptions& o, FinetuneMode mode);

}  // namespace loom::cli

// Decoder -> config.json and model.safetensors (export_hf.h).
#include "loom/model/export_hf.h"

#include <filesystem>
#include <nlohmann/json.hpp>

#include "loom/core/error.h"
#include "loom/io/file.h"
#include "loom/model/hf_weights.h"

namespace loom::model {

namespace {
const char* torch_dtype(DType t) {
  switch (t) {
    case DType::f32: return "float32";
    case DType::bf16: return "bfloat16";
    case DType::f16: return "float16";
    default: break;
  }
  fail("export", "--dtype ", dtype_name(t), " is not supported; use f32, bf16 or f16");
}
}  // namespace

std::string hf_export_config_json(const ModelConfig& cfg, const HfExportOptions& o) {
  nlohmann::ordered_json j = nlohmann::ordered_json::parse(hf_config_json(cfg));
  j["torch_dtype"] = torch_dtype(o.dtype);
  if (o.bos_id) j["bos_token_id"] = *o.bos_id;
  if (o.eos_id) j["eos_token_id"] = *o.eos_id;
  return j.dump(2) + "\n";
}

std::vector<std::string> write_hf_model(const Decoder& m, const std::string& dir, const HfExportOptions& o) {
  const std::filesystem::path d(dir);
  io::write_file_atomic((d / "config.json").string(), hf_export_config_json(m.config(), o));
  save_hf_safetensors(m, (d / "model.safetensors").string(), o.dtype);
  std::vector<std::string> notes;
  const MoeConfig& moe = m.config().moe;
  const bool mixtral_says_all = m.config().family == Family::llama && moe.num_shared_experts == 0 &&
                                moe.moe_every == 1 && moe.first_dense == 0 && moe.score == RouterScore::softmax &&
                                moe.bias_update_rate == 0;
  if (moe.enabled() && !mixtral_says_all)
    notes.push_back(
        "config.json's loom_moe says what Mixtral's config cannot (GPT-2 experts, shared experts, dense blocks, "
        "sigmoid scores or bias balancing): loom loads the directory, transformers does not");
  if (moe.enabled() && moe.bias_update_rate > 0)
    notes.push_back(
        "the experts' balancing biases (trainer_state.json's router_bias) have no place in model.safetensors: the "
        "exported model chooses experts without them");
  return notes;
}

}  // namespace loom::model

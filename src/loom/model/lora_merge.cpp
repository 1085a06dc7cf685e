#include "loom/model/lora_merge.h"

#include <algorithm>
#include <filesystem>
#include <vector>

#include <nlohmann/json.hpp>

#include "loom/io/checkpoint_files.h"
#include "loom/io/file.h"
#include "loom/io/sha256.h"
#include "loom/kernels/cpu/gemm.h"
#include "loom/model/hf_weights.h"
#include "loom/model/model_source.h"
#include "loom/model/param_layout.h"

namespace loom::model {

namespace fs = std::filesystem;
using nlohmann::json;

std::string weights_sha256(const std::string& path) {
  if (fs::is_regular_file(path)) return io::sha256_file(path);  // GGUF
  if (fs::exists(fs::path(path) / io::kWeightsFile) && fs::exists(fs::path(path) / io::kTrainerStateFile))
    return io::sha256_file((fs::path(path) / io::kWeightsFile).string());
  std::vector<std::string> files;
  for (const auto& e : fs::directory_iterator(path))
    if (e.path().extension() == ".safetensors") files.push_back(e.path().string());
  LOOM_CHECK(!files.empty(), "lora", path, " holds no weights (no .safetensors file)");
  std::sort(files.begin(), files.end());
  std::string digests;
  for (const std::string& f : files) digests += io::sha256_file(f);
  return io::sha256_hex(digests);
}

bool is_lora_checkpoint(const std::string& dir) { return fs::exists(fs::path(dir) / io::kAdapterConfigFile); }

LoraCheckpoint read_lora_checkpoint(const std::string& dir) {
  const std::string file = (fs::path(dir) / io::kTrainerStateFile).string();
  const json state = json::parse(io::read_file(file), nullptr, false);
  LOOM_CHECK(state.is_object() && state.contains("lora") && state["lora"].is_object(), "lora", file,
             " records no LoRA adapters (no \"lora\" entry): ", dir, " is not a checkpoint of a model.lora run");
  const json& l = state["lora"];
  LoraCheckpoint c;
  c.dir = dir;
  try {
    c.lora.rank = l.at("rank").get<int64_t>();
    c.lora.alpha = l.at("alpha").get<double>();
    c.base = l.at("base").get<std::string>();
    c.base_sha256 = l.at("base_sha256").get<std::string>();
    c.lora.targets.clear();
    for (const auto& m : l.at("target_modules")) {
      const std::string name = m.get<std::string>();  // "q_proj" ... "down_proj"
      bool found = false;
      for (int t = 0; t < kLoraTargets && !found; ++t)
        if (name == lora_module_name(LoraTarget(t))) {
          c.lora.targets.push_back(LoraTarget(t));
          found = true;
        }
      LOOM_CHECK(found, "lora", file, ": unknown target module \"", name, "\"");
    }
  } catch (const json::exception& e) {
    fail("lora", file, ": the \"lora\" entry is malformed (", e.what(), ")");
  }
  return c;
}

std::string merge_lora(const LoraCheckpoint& c, Decoder& m) {
  ModelConfig cfg = m.config();
  LOOM_CHECK(!m.lora() && m.layout().whole_model() && m.params().dtype() == DType::f32, "lora",
             "adapters merge into a whole f32 model");
  cfg.lora = c.lora;
  cfg.validate();
  const ParamLayout adapters(cfg, 1, ModelSlice{.lora_adapters = true});
  Tensor flat = Tensor::zeros({adapters.total()}, DType::f32, MemCategory::workspace);
  load_hf_safetensors(cfg, adapters, flat, (fs::path(c.dir) / io::kWeightsFile).string());
  const int64_t r = cfg.lora.rank;
  int64_t matrices = 0;
  for (int l = 0; l < cfg.n_layer; ++l)
    for (const LoraSpec& s : lora_specs(cfg)) {
      const std::string n = adapters.block_prefix(l) + s.proj;
      const ParamInfo& a = adapters.get(n + ".lora_A.weight");
      const ParamInfo& b = adapters.get(n + ".lora_B.weight");
      const Tensor w = m.param(n + ".weight");
      cpu::gemm(false, false, s.out, s.in, r, float(cfg.lora.scale()), flat.data<float>() + b.offset, r,
                flat.data<float>() + a.offset, s.in, 1.0f, w.data<float>(), s.in);
      ++matrices;
    }
  return str_cat(c.lora.describe(), ": ", matrices, " matrices");
}

}  // namespace loom::model

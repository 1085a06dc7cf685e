#include "loom/serve/cascade/version.h"

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>

#include "loom/core/error.h"
#include "loom/io/file.h"
#include "loom/io/sha256.h"

namespace loom::serve::cascade {

namespace fs = std::filesystem;

std::string tokenizer_hash(const TextTokenizer& tok) {
  std::string bytes = str_cat("vocab ", tok.vocab_size(), " eos ", tok.eos_token(), "\n");
  for (int64_t id = 0; id < tok.vocab_size(); ++id) {
    const std::string t = tok.token_bytes(int32_t(id));
    bytes += std::to_string(t.size());
    bytes += ':';
    bytes += t;
  }
  return io::sha256_hex(bytes);
}

std::string weights_file(const std::string& dir) {
  for (const char* name : {"quant.safetensors", "model.safetensors"})
    if (fs::is_regular_file(fs::path(dir) / name)) return name;
  fail("cascade", dir,
       " has neither quant.safetensors nor model.safetensors; give a checkpoint directory "
       "(DIR/step_N) or a `loom quantize` output");
}

std::string version_hash(const std::string& weights_sha256, const std::string& config_sha256,
                         const std::string& tokenizer_sha256) {
  return io::sha256_hex(str_cat("loom-model-version 1\nweights ", weights_sha256, "\nconfig ", config_sha256,
                                "\ntokenizer ", tokenizer_sha256, "\n"));
}

namespace {

std::string label_of(const std::string& dir) {
  std::ifstream version(fs::path(dir) / "VERSION");
  std::string line;
  if (version && std::getline(version, line) && !line.empty()) return line;
  try {
    auto state = nlohmann::json::parse(io::read_file((fs::path(dir) / "trainer_state.json").string()));
    if (state.contains("step")) return str_cat("step", state["step"].get<int64_t>());
  } catch (const std::exception&) {
  }
  return "unversioned";
}

}  // namespace

ModelVersion checkpoint_version(const std::string& path, const std::string& tokenizer_sha256,
                                const std::string& label) {
  if (fs::is_regular_file(path)) {  // a GGUF file: weights, config and vocabulary in one
    const std::string file = io::sha256_file(path);
    return {label.empty() ? fs::path(path).stem().string() : label, version_hash(file, file, tokenizer_sha256)};
  }
  const fs::path dir(path);
  std::string weights;
  if (fs::is_regular_file(dir / "model.safetensors.index.json") && !fs::exists(dir / "model.safetensors")) {
    // Hugging Face shards: the index and each shard it names, in name order.
    const auto index = nlohmann::json::parse(io::read_file((dir / "model.safetensors.index.json").string()));
    std::set<std::string> shards;
    for (const auto& [tensor, shard] : index.at("weight_map").items()) shards.insert(shard.get<std::string>());
    std::string digests = io::sha256_file((dir / "model.safetensors.index.json").string());
    for (const std::string& s : shards) digests += "\n" + s + " " + io::sha256_file((dir / s).string());
    weights = io::sha256_hex(digests);
  } else {
    weights = io::sha256_file((dir / weights_file(path)).string());
  }
  const std::string config = io::sha256_file((dir / "config.json").string());
  return {label.empty() ? label_of(path) : label, version_hash(weights, config, tokenizer_sha256)};
}

}  // namespace loom::serve::cascade

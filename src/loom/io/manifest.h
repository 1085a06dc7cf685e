// manifest.json of a checkpoint directory: what format it is, and each file's size and CRC32C,
// so a reader can verify before it trusts. Training checkpoints (train/checkpoint.h) and
// quantized inference checkpoints (infer/quant_checkpoint.h) both use it.
#pragma once
#include <functional>
#include <string>

#include <nlohmann/json.hpp>

namespace loom::io {

// The formats manifests name: a training checkpoint and a quantized inference checkpoint.
inline constexpr const char* kTrainingCheckpointFormat = "loom-checkpoint";
inline constexpr const char* kQuantizedCheckpointFormat = "loom-quantized-checkpoint";
// DIR/manifest.json's "format", or "" when there is none or it cannot be read.
std::string manifest_format(const std::string& dir);

// Records files of one directory, then writes DIR/manifest.json atomically.
class ManifestWriter {
 public:
  explicit ManifestWriter(std::string dir) : dir_(std::move(dir)) {}
  // Size and checksum of DIR/name as it is now.
  void record(const std::string& name);
  // {"format": format, "version": version, ...extra, "files": {...}}.
  void write(const std::string& format, int version, const nlohmann::json& extra = nlohmann::json::object()) const;

 private:
  std::string dir_;
  nlohmann::json files_ = nlohmann::json::object();
};

// Checks DIR/manifest.json's format and version, then every listed file's presence and size,
// and the checksum of those `checksum_this(name)` accepts (all when it is empty). On failure
// returns false with the reason in *why ("model.safetensors checksum ... differs from the
// manifest's ... (corrupted)"). Throws nothing for a damaged directory.
// Versions from oldest_version (0: only `version`) to `version` are accepted.
bool verify_manifest(const std::string& dir, const std::string& format, int version, std::string* why,
                     const std::function<bool(const std::string&)>& checksum_this = {}, int oldest_version = 0);
// DIR/manifest.json's "version", or 0 when there is none or it cannot be read.
int manifest_version(const std::string& dir);

}  // namespace loom::io

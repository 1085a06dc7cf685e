// Model versions of an edge/center cascade (docs/CASCADE.md): a content hash of a checkpoint's
// weights, its config and the tokenizer, and a human label. Edge and center compare these to
// agree on what answers a request; an edge checks every download against them.
#pragma once
#include <string>

#include "loom/serve/tokenizer.h"

namespace loom::serve::cascade {

struct ModelVersion {
  std::string label;  // human: the checkpoint's VERSION file, else "step<N>" from trainer_state.json
  std::string hash;   // SHA-256 (hex) over the weights', the config's and the tokenizer's hashes
  // "step700+1a2b3c4d5e6f": what responses and metrics carry.
  std::string id() const { return label + "+" + hash.substr(0, 12); }
};

// SHA-256 over the vocabulary (size, end-of-text id, every token's bytes): two tokenizers with
// the same hash turn the same ids into the same text.
std::string tokenizer_hash(const TextTokenizer& tok);

// The file holding a checkpoint's weights: quant.safetensors for a `loom quantize` output,
// model.safetensors for a training checkpoint. Throws "[cascade] DIR ..." when neither exists.
std::string weights_file(const std::string& dir);

// The version hash from its parts' SHA-256 digests (what an edge recomputes after a download).
std::string version_hash(const std::string& weights_sha256, const std::string& config_sha256,
                         const std::string& tokenizer_sha256);

// Hashes the weights and config.json of a checkpoint (or a Hugging Face directory, its shards
// too), or a GGUF file whole. label "" reads it from the checkpoint (a GGUF: the file's stem).
ModelVersion checkpoint_version(const std::string& path, const std::string& tokenizer_sha256,
                                const std::string& label = "");

}  // namespace loom::serve::cascade

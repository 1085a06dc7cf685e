// The tokenizer interface's shared pieces: default methods, the byte tokenizer, data-folder
// lookup and the factory. GPT-2's BPE lives in gpt2_tokenizer.cpp, tokenizer.json and GGUF
// tokenizers in hf_tokenizer.cpp and gguf_tokenizer.cpp.
#include "loom/data/tokenizer.h"

#include <cstdlib>
#include <filesystem>

#include "loom/core/error.h"
#include "loom/data/gguf_tokenizer.h"
#include "loom/data/gpt2_tokenizer.h"
#include "loom/data/hf_tokenizer.h"

#ifndef LOOM_SOURCE_DIR
#define LOOM_SOURCE_DIR "."
#endif

namespace loom::data {

void Tokenizer::encode_stream(std::string_view bytes, const TokenSink& sink, size_t flush_tokens) const {
  (void)flush_tokens;
  std::vector<int32_t> ids = encode(bytes);
  sink(ids, bytes.size());
}

std::string Tokenizer::token_text(int32_t id) const {
  const int32_t one[1] = {id};
  return decode(one);
}

std::optional<int32_t> Tokenizer::token_id(const std::string& text) const {
  const std::vector<int32_t> ids = encode(text);
  if (ids.size() == 1 && token_text(ids[0]) == text) return ids[0];
  return std::nullopt;
}

std::string Tokenizer::decode_skip_special(std::span<const int32_t> ids) const {
  std::vector<int32_t> kept;
  kept.reserve(ids.size());
  for (int32_t id : ids)
    if (!is_special(id)) kept.push_back(id);
  return decode(kept);
}

void ByteTokenizer::encode_append(std::string_view bytes, std::vector<int32_t>& out) const {
  const size_t base = out.size();
  out.resize(base + bytes.size());
  for (size_t i = 0; i < bytes.size(); ++i) out[base + i] = int32_t(static_cast<unsigned char>(bytes[i]));
}

void ByteTokenizer::encode_stream(std::string_view bytes, const TokenSink& sink, size_t flush_tokens) const {
  const size_t step = flush_tokens == 0 ? bytes.size() : flush_tokens;
  std::vector<int32_t> ids;
  size_t done = 0;
  do {
    const size_t n = std::min(step, bytes.size() - done);
    ids.clear();
    encode_append(bytes.substr(done, n), ids);
    done += n;
    sink(ids, done);
  } while (done < bytes.size());
}

std::string ByteTokenizer::decode(std::span<const int32_t> ids) const {
  std::string out(ids.size(), '\0');
  for (size_t i = 0; i < ids.size(); ++i) {
    LOOM_CHECK(ids[i] >= 0 && ids[i] < 256, "tokenizer", "id ", ids[i], " at position ", i,
               " is outside the byte tokenizer's vocabulary (0..255)");
    out[i] = char(uint8_t(ids[i]));
  }
  return out;
}

std::string default_data_dir() {
  if (const char* env = std::getenv("LOOM_DATA_DIR"); env && *env) return env;
  return std::string(LOOM_SOURCE_DIR) + "/data";
}

const std::vector<std::string>& tokenizer_names() {
  static const std::vector<std::string> names = {
      "gpt2", "byte", "PATH (a .gguf model, a tokenizer.json, or a folder holding tokenizer.json)"};
  return names;
}

std::unique_ptr<Tokenizer> make_tokenizer(std::string_view spec, const std::string& data_dir) {
  namespace fs = std::filesystem;
  if (spec == "byte") return std::make_unique<ByteTokenizer>();
  if (spec == "gpt2") {
    const std::string root = data_dir.empty() ? default_data_dir() : data_dir;
    const fs::path dir = fs::exists(fs::path(root) / "encoder.json") ? fs::path(root) : fs::path(root) / "gpt2";
    return std::make_unique<Gpt2Tokenizer>(dir.string());
  }
  // By its absolute path, which the tokenizer's name() then is: what `loom prepare` records and
  // runs on its data record in their checkpoints, wherever they are started from.
  std::error_code ec;
  const fs::path path = fs::absolute(fs::path(std::string(spec)), ec).lexically_normal();
  if (fs::is_directory(path, ec)) {
    LOOM_CHECK(fs::exists(path / "tokenizer.json"), "tokenizer", path.string(),
               ": folder holds no tokenizer.json; point at a model folder from the Hugging Face Hub or a .gguf file");
    return load_hf_tokenizer(path.string());
  }
  if (fs::is_regular_file(path, ec)) {
    if (path.extension() == ".gguf") return load_gguf_tokenizer(path.string());
    if (path.extension() == ".json") return load_hf_tokenizer(path.string());
    fail("tokenizer", path.string(), ": not a tokenizer file; give a .gguf model, a tokenizer.json or its folder");
  }
  fail("tokenizer", "unknown tokenizer '", spec,
       "'; choose gpt2, byte, or a path to a .gguf model, a tokenizer.json, or a folder holding tokenizer.json");
}

}  // namespace loom::data

// The tokenizer interface's shared pieces: the byte tokenizer, data-folder lookup and the
// factory. GPT-2's BPE lives in gpt2_tokenizer.cpp.
#include "loom/data/tokenizer.h"

#include <cstdlib>
#include <filesystem>

#include "loom/core/error.h"
#include "loom/data/gpt2_tokenizer.h"

#ifndef LOOM_SOURCE_DIR
#define LOOM_SOURCE_DIR "."
#endif

namespace loom::data {

void Tokenizer::encode_stream(std::string_view bytes, const TokenSink& sink, size_t flush_tokens) const {
  (void)flush_tokens;
  std::vector<int32_t> ids = encode(bytes);
  sink(ids, bytes.size());
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
  static const std::vector<std::string> names = {"gpt2", "byte"};
  return names;
}

std::unique_ptr<Tokenizer> make_tokenizer(std::string_view name, const std::string& data_dir) {
  if (name == "byte") return std::make_unique<ByteTokenizer>();
  if (name == "gpt2") {
    namespace fs = std::filesystem;
    const std::string root = data_dir.empty() ? default_data_dir() : data_dir;
    const fs::path dir = fs::exists(fs::path(root) / "encoder.json") ? fs::path(root) : fs::path(root) / "gpt2";
    return std::make_unique<Gpt2Tokenizer>(dir.string());
  }
  fail("tokenizer", "unknown tokenizer '", name, "'; choose gpt2 or byte");
}

}  // namespace loom::data

// Tokenizers: text bytes <-> token ids. GPT-2's byte-level BPE (gpt2_tokenizer.h) and a
// byte tokenizer (id = byte value). Both round-trip any byte string exactly:
// decode(encode(x)) == x, ill-formed UTF-8 included.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace loom::data {

// Receives encoded tokens in order, with the number of input bytes consumed so far.
using TokenSink = std::function<void(std::span<const int32_t> tokens, size_t bytes_done)>;

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;
  virtual std::string name() const = 0;
  virtual int32_t vocab_size() const = 0;
  // The end-of-text id that separates documents, where the vocabulary has one.
  virtual std::optional<int32_t> eot_id() const { return std::nullopt; }

  // Appends the ids of `bytes` to `out`. Any byte string is valid input. Special-token text
  // such as "<|endoftext|>" is encoded as ordinary text, as GPT-2's own encoder does.
  virtual void encode_append(std::string_view bytes, std::vector<int32_t>& out) const = 0;
  std::vector<int32_t> encode(std::string_view bytes) const {
    std::vector<int32_t> out;
    encode_append(bytes, out);
    return out;
  }
  // Encodes a long text piecewise, calling `sink` every `flush_tokens` tokens or so (and once
  // at the end), so callers can write and report progress without holding all ids.
  virtual void encode_stream(std::string_view bytes, const TokenSink& sink,
                             size_t flush_tokens = size_t(1) << 16) const;

  // The bytes of `ids`; throws naming the first id outside the vocabulary.
  virtual std::string decode(std::span<const int32_t> ids) const = 0;
};

// Byte tokenizer: 256 ids, id = byte value, no end-of-text token.
class ByteTokenizer final : public Tokenizer {
 public:
  std::string name() const override { return "byte"; }
  int32_t vocab_size() const override { return 256; }
  void encode_append(std::string_view bytes, std::vector<int32_t>& out) const override;
  void encode_stream(std::string_view bytes, const TokenSink& sink, size_t flush_tokens) const override;
  std::string decode(std::span<const int32_t> ids) const override;
};

// The data folder: $LOOM_DATA_DIR when set, else the source tree's data/ (compile time).
std::string default_data_dir();

// "gpt2" (files from <data_dir>/gpt2/, or data_dir itself if it holds encoder.json) or
// "byte". An empty data_dir means default_data_dir().
std::unique_ptr<Tokenizer> make_tokenizer(std::string_view name, const std::string& data_dir = "");

// Names make_tokenizer accepts, for help texts.
const std::vector<std::string>& tokenizer_names();

}  // namespace loom::data

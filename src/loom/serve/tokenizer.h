// Text <-> token ids as the server sees them (TextTokenizer: per-token bytes for streaming),
// implemented over loom::data's tokenizers (GPT-2 BPE, byte), and the incremental UTF-8
// assembly that turns a stream of token bytes into valid text deltas.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace loom::data {
class Tokenizer;
}

namespace loom::serve {

class TextTokenizer {
 public:
  virtual ~TextTokenizer() = default;
  virtual std::vector<int32_t> encode(std::string_view text) const = 0;
  // The raw bytes one token stands for (possibly part of a UTF-8 character).
  virtual std::string token_bytes(int32_t id) const = 0;
  virtual int64_t vocab_size() const = 0;
  // The end-of-text token that ends generation with finish_reason "stop"; -1: none.
  virtual int32_t eos_token() const { return -1; }
};

// Any loom::data tokenizer; its end-of-text id (GPT-2's <|endoftext|>) ends generation.
class DataTokenizer : public TextTokenizer {
 public:
  explicit DataTokenizer(std::unique_ptr<data::Tokenizer> tok);
  ~DataTokenizer() override;
  std::vector<int32_t> encode(std::string_view text) const override;
  std::string token_bytes(int32_t id) const override;
  int64_t vocab_size() const override;
  int32_t eos_token() const override;
  std::string name() const;

 private:
  std::unique_ptr<data::Tokenizer> tok_;
};

// ids = bytes, vocabulary 256, no end-of-text token (for models with random weights).
class ByteTokenizer final : public DataTokenizer {
 public:
  ByteTokenizer();
};

// "gpt2" or "byte" (see data::make_tokenizer); data_dir empty: the default data folder.
std::unique_ptr<DataTokenizer> make_text_tokenizer(const std::string& name, const std::string& data_dir = "");

// Accepts arbitrary bytes, returns only complete, valid UTF-8; malformed sequences become
// U+FFFD so the JSON we emit is always valid. Bytes of an unfinished character wait for
// the next push (or become U+FFFD at flush()).
class Utf8Assembler {
 public:
  std::string push(std::string_view bytes);
  std::string flush();

 private:
  std::string pending_;
};

}  // namespace loom::serve

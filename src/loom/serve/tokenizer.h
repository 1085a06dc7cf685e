// Text <-> token ids as the server sees them (TextTokenizer), a byte-level tokenizer
// (ids = bytes, vocab 256) for models without a trained vocabulary, and the incremental
// UTF-8 assembly that turns a stream of token bytes into valid text deltas.
#pragma once
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

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

class ByteTokenizer final : public TextTokenizer {
 public:
  std::vector<int32_t> encode(std::string_view text) const override;
  std::string token_bytes(int32_t id) const override;
  int64_t vocab_size() const override { return 256; }
};

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

// Token ids to text the way the server renders a completion (without stop handling).
std::string decode_tokens(const TextTokenizer& tok, const std::vector<int32_t>& ids);

}  // namespace loom::serve

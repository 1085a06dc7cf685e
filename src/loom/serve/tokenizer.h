// Text <-> token ids as the server sees them (TextTokenizer: the text of a reply's ids),
// implemented over loom::data's tokenizers (GPT-2 BPE, byte, models' own), and the incremental
// UTF-8 assembly that turns a stream of decoded bytes into valid text deltas.
#pragma once
#include <cstdint>
#include <memory>
#include <span>
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
  // The bytes of `ids` decoded together, as a reply shows them (control tokens print nothing).
  // Not always the concatenation of their token_bytes: SentencePiece-style decoders drop the
  // first token's leading space, so streams decode windows (serve/text_stream.h).
  virtual std::string decode(std::span<const int32_t> ids) const = 0;
  virtual int64_t vocab_size() const = 0;
  // The end-of-text token that ends generation with finish_reason "stop"; -1: none.
  virtual int32_t eos_token() const { return -1; }
  // Every token that ends generation with finish_reason "stop": eos_token() and the model's other
  // end tokens (a GGUF's end-of-turn, generation_config.json's list).
  virtual std::vector<int32_t> end_tokens() const {
    return eos_token() >= 0 ? std::vector<int32_t>{eos_token()} : std::vector<int32_t>{};
  }
  // Like encode, but the texts of added and special tokens ("<|im_start|>") become their ids:
  // for prompts rendered by a model's own chat template.
  virtual std::vector<int32_t> encode_special(std::string_view text) const { return encode(text); }
};

// Any loom::data tokenizer; its end-of-text id (GPT-2's <|endoftext|>, a model's eos) and the
// `end_ids` given end generation. Control tokens (is_special) stand for no text: their bytes are
// empty, so a reply never shows them.
class DataTokenizer : public TextTokenizer {
 public:
  explicit DataTokenizer(std::unique_ptr<data::Tokenizer> tok, std::vector<int32_t> end_ids = {});
  ~DataTokenizer() override;
  std::vector<int32_t> encode(std::string_view text) const override;
  std::vector<int32_t> encode_special(std::string_view text) const override;
  std::string token_bytes(int32_t id) const override;
  std::string decode(std::span<const int32_t> ids) const override;
  int64_t vocab_size() const override;
  int32_t eos_token() const override;
  std::vector<int32_t> end_tokens() const override { return end_ids_; }
  std::string name() const;
  const data::Tokenizer& tokenizer() const { return *tok_; }

 private:
  std::unique_ptr<data::Tokenizer> tok_;
  std::vector<int32_t> end_ids_;
};

// data::ByteTokenizer as a TextTokenizer: ids = bytes, vocabulary 256, no end-of-text token
// (for models with random weights).
class ByteTextTokenizer final : public DataTokenizer {
 public:
  ByteTextTokenizer();
};

// "gpt2", "byte", or a model's tokenizer path (see data::make_tokenizer); data_dir empty: the
// default data folder. `end_ids`: the model's end tokens besides the tokenizer's eos.
std::unique_ptr<DataTokenizer> make_text_tokenizer(const std::string& name, const std::string& data_dir = "",
                                                   const std::vector<int32_t>& end_ids = {});

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

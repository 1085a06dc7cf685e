// Tokenizers: text bytes <-> token ids. GPT-2's byte-level BPE (gpt2_tokenizer.h), a byte
// tokenizer (id = byte value), and the tokenizers of downloaded models: Hugging Face
// tokenizer.json (hf_tokenizer.h) and GGUF metadata (gguf_tokenizer.h), exact against HF
// `tokenizers`, or against llama.cpp for SentencePiece-style GGUF vocabularies
// (spm_tokenizer.h). GPT-2 and byte round-trip any byte string: decode(encode(x)) == x.
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

  // Like encode_append, but added and special tokens written in the text ("<|im_start|>" in a
  // rendered chat prompt) map to their ids (longest match first); the rest encodes as usual.
  virtual void encode_special_append(std::string_view text, std::vector<int32_t>& out) const {
    encode_append(text, out);
  }
  std::vector<int32_t> encode_special(std::string_view text) const {
    std::vector<int32_t> out;
    encode_special_append(text, out);
    return out;
  }

  // Neither encode adds BOS or EOS: a caller prepends bos_id() when add_bos() says the model
  // expects it (tokenizer.json's post-processor, GGUF's add_bos_token), and likewise for EOS.
  virtual std::optional<int32_t> bos_id() const { return std::nullopt; }
  virtual std::optional<int32_t> eos_id() const { return eot_id(); }
  virtual bool add_bos() const { return false; }
  virtual bool add_eos() const { return false; }
  // Control tokens (<|im_end|>, <s>): a server never prints them.
  virtual bool is_special(int32_t id) const {
    (void)id;
    return false;
  }
  // The vocabulary's string for `id` as written there ("<|im_end|>", "Ġthe"); throws naming
  // an id outside the vocabulary. Default: the decoded bytes.
  virtual std::string token_text(int32_t id) const;
  // The id whose vocabulary string is `text`, if any.
  virtual std::optional<int32_t> token_id(const std::string& text) const;

  // The bytes of `ids`; throws naming the first id outside the vocabulary.
  virtual std::string decode(std::span<const int32_t> ids) const = 0;
  // decode without the ids is_special() names.
  virtual std::string decode_skip_special(std::span<const int32_t> ids) const;
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

// `spec` is "gpt2" (files from <data_dir>/gpt2/, or data_dir itself if it holds
// encoder.json), "byte", or a path: a .gguf file (its tokenizer metadata), a tokenizer.json,
// or a folder holding tokenizer.json (and perhaps tokenizer_config.json), opened by its absolute
// path (its name()). An empty data_dir means default_data_dir().
std::unique_ptr<Tokenizer> make_tokenizer(std::string_view spec, const std::string& data_dir = "");

// Names make_tokenizer accepts, for help texts (the last entry describes the path forms).
const std::vector<std::string>& tokenizer_names();

}  // namespace loom::data

// GPT-2's byte-level BPE (Radford et al. 2019), from the released encoder.json and
// vocab.bpe. Ids match OpenAI's reference encoder exactly: same pre-tokenisation (see
// pretokenize.h), same merge order. Not a SentencePiece or tiktoken-special-token encoder.
#pragma once
#include <memory>
#include <string>

#include "loom/data/tokenizer.h"

namespace loom::data {

class Gpt2Tokenizer final : public Tokenizer {
 public:
  // Reads dir/encoder.json and dir/vocab.bpe; errors name the missing or malformed file.
  explicit Gpt2Tokenizer(const std::string& dir);
  ~Gpt2Tokenizer() override;

  std::string name() const override { return "gpt2"; }
  int32_t vocab_size() const override;
  std::optional<int32_t> eot_id() const override;
  void encode_append(std::string_view bytes, std::vector<int32_t>& out) const override;
  void encode_stream(std::string_view bytes, const TokenSink& sink, size_t flush_tokens) const override;
  std::string decode(std::span<const int32_t> ids) const override;

  // The bytes one id stands for.
  const std::string& token_bytes(int32_t id) const;
  int64_t merge_count() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace loom::data

// The tokenizer pipeline of Hugging Face `tokenizers`, as data: added tokens, normalizer,
// pre-tokenizer, BPE model, post-processor ids and decoder steps. hf_tokenizer.cpp fills it
// from a tokenizer.json and gguf_tokenizer.cpp from GGUF metadata; this file only runs it.
#pragma once
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "loom/data/added_tokens.h"
#include "loom/data/bpe_tokenizer.h"
#include "loom/data/normalizers.h"
#include "loom/data/pretokenizers.h"
#include "loom/data/tokenizer.h"

namespace loom::data {

// One decoder of tokenizers' decoders/ module; they run in order over the token strings.
struct DecodeStep {
  enum class Kind { kByteLevel, kByteFallback, kReplace, kMetaspace, kStrip, kFuse };
  Kind kind = Kind::kFuse;
  std::string pattern, content;  // kReplace: literal -> content; kMetaspace/kStrip: the character
  size_t start = 0, stop = 0;    // kStrip: characters to cut at each end
  bool prepend = true;           // kMetaspace: prepend_scheme is not "never"
};

struct PipelineSpec {
  std::string name;  // for messages and name()
  Normalizer normalizer;
  std::unique_ptr<PreTokenizer> pre_tokenizer;  // null: each piece is one word
  std::unique_ptr<BpeModel> model;
  std::vector<AddedToken> added;
  std::vector<int32_t> prefix_ids, suffix_ids;  // what the post-processor puts around a text
  std::vector<DecodeStep> decoder;
  std::optional<int32_t> bos, eos;
  std::vector<int32_t> control_ids;  // special beyond the special added tokens
};

class PipelineTokenizer final : public Tokenizer {
 public:
  explicit PipelineTokenizer(PipelineSpec spec);
  ~PipelineTokenizer() override;

  std::string name() const override { return spec_.name; }
  int32_t vocab_size() const override { return vocab_size_; }
  std::optional<int32_t> eot_id() const override { return spec_.eos; }
  void encode_append(std::string_view bytes, std::vector<int32_t>& out) const override;
  void encode_special_append(std::string_view text, std::vector<int32_t>& out) const override;
  std::optional<int32_t> bos_id() const override { return spec_.bos; }
  std::optional<int32_t> eos_id() const override { return spec_.eos; }
  bool add_bos() const override;
  bool add_eos() const override;
  bool is_special(int32_t id) const override;
  std::string token_text(int32_t id) const override;
  std::optional<int32_t> token_id(const std::string& text) const override;
  std::string decode(std::span<const int32_t> ids) const override;
  std::string decode_skip_special(std::span<const int32_t> ids) const override;

  const PipelineSpec& spec() const { return spec_; }

 private:
  void encode_impl(std::string_view text, bool with_special, std::vector<int32_t>& out) const;
  std::string decode_impl(std::span<const int32_t> ids, bool skip_special) const;
  void check_id(int32_t id, size_t position) const;

  PipelineSpec spec_;
  int32_t vocab_size_ = 0;
  AddedTokenMatcher raw_matcher_, normalized_matcher_;
  std::vector<std::string> added_text_;     // per id: added token content, or empty
  std::vector<std::string> decoder_input_;  // per added id: what the decoder sees
  std::vector<bool> is_added_, special_;
  std::vector<std::string> pure_bytes_;  // per id: the output of decoder_[0, pure_steps_)
  size_t pure_steps_ = 0;                // leading decoder steps that act on each token alone
};

}  // namespace loom::data

// SentencePiece-style vocabularies (pieces with scores, "▁" for a space, <0xNN> byte tokens)
// run exactly as llama.cpp runs a GGUF whose tokenizer.ggml.model is "llama": its SPM session
// for encoding and its detokenizer for decoding. Reading the GGUF is gguf_tokenizer.cpp's job;
// SentencePiece's own .model files and its unigram algorithm are not handled here.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "loom/data/added_tokens.h"
#include "loom/data/string_map.h"
#include "loom/data/tokenizer.h"

namespace loom::data {

// tokenizer.ggml.token_type's numbering (llama.cpp's llama_token_type).
enum class GgufTokenType : int32_t {
  kUndefined = 0,
  kNormal = 1,
  kUnknown = 2,
  kControl = 3,
  kUserDefined = 4,
  kUnused = 5,
  kByte = 6,
};

struct SpmVocab {
  std::string name;                  // for messages and name()
  std::vector<std::string> pieces;   // distinct and non-empty
  std::vector<float> scores;         // per piece; the merge whose result scores highest goes first
  std::vector<GgufTokenType> types;  // per piece
  std::optional<int32_t> bos, eos, unk;
  bool add_bos = true, add_eos = false;
  bool add_space_prefix = true;  // a "▁" starts the text and the text after each added token
};

class SpmTokenizer final : public Tokenizer {
 public:
  // Throws naming vocab.name where the vocabulary is inconsistent (sizes, duplicate or empty
  // pieces, a byte token that is not <0xNN>, an id outside it).
  explicit SpmTokenizer(SpmVocab vocab);

  std::string name() const override { return vocab_.name; }
  int32_t vocab_size() const override { return int32_t(vocab_.pieces.size()); }
  std::optional<int32_t> eot_id() const override { return vocab_.eos; }
  // Control and user-defined tokens written in the text are cut out first (user-defined ones
  // by encode too, as llama.cpp does); each piece of text between them is then escaped and
  // merged on its own.
  void encode_append(std::string_view bytes, std::vector<int32_t>& out) const override;
  void encode_special_append(std::string_view text, std::vector<int32_t>& out) const override;
  std::optional<int32_t> bos_id() const override { return vocab_.bos; }
  std::optional<int32_t> eos_id() const override { return vocab_.eos; }
  bool add_bos() const override { return vocab_.add_bos && vocab_.bos; }
  bool add_eos() const override { return vocab_.add_eos && vocab_.eos; }
  // Control and unknown tokens, the ones llama.cpp prints only when asked to.
  bool is_special(int32_t id) const override;
  std::string token_text(int32_t id) const override;
  std::optional<int32_t> token_id(const std::string& text) const override;
  // llama_detokenize(ids, remove_special = false, unparse_special = true): control and unknown
  // tokens as their text, and with add_space_prefix one space cut from the first token's bytes.
  std::string decode(std::span<const int32_t> ids) const override;
  // The same with unparse_special = false: control and unknown tokens print nothing, yet a
  // leading one still takes the place of the first token, so " Hello" after <s> keeps its space.
  std::string decode_skip_special(std::span<const int32_t> ids) const override;

 private:
  void encode_impl(std::string_view text, bool with_special, std::vector<int32_t>& out) const;
  // The SPM bigram merge over one escaped piece of text.
  void encode_escaped(std::string_view text, std::vector<int32_t>& out) const;
  std::string decode_impl(std::span<const int32_t> ids, bool render_special) const;

  SpmVocab vocab_;
  StringMap<int32_t> id_of_;
  std::vector<std::string> bytes_of_;  // per id: what decoding prints for it
  std::vector<bool> special_;          // per id: control or unknown
  int32_t byte_token_[256];            // <0xNN>, else the one-byte piece, else the unknown id, else -1
  AddedTokenMatcher matcher_;
};

}  // namespace loom::data

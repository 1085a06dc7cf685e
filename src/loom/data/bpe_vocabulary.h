// A byte-level BPE vocabulary as GGUF's tokenizer.ggml.* keys and a Hugging Face tokenizer.json
// both describe it (GPT-2's scheme: every byte a token of its own alphabet, merges in priority
// order, added tokens split out first), so that either can be written from the other, or from
// loom's own GPT-2 and byte tokenizers; `loom export` (docs/FINETUNING.md) writes them this way.
// Each writer is the inverse of loom's reader of that form (gguf_tokenizer.cpp, hf_tokenizer.cpp):
// what loom reads back encodes every text to the same ids. SentencePiece-style vocabularies
// (GGUF "llama", Metaspace and byte-fallback tokenizer.json) are refused, naming the fix.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "loom/data/spm_tokenizer.h"

namespace loom::io {
class GgufFile;
class GgufWriter;
}  // namespace loom::io

namespace loom::data {

// The pre-tokenizers a byte-level vocabulary comes with, by what llama.cpp calls them
// (tokenizer.ggml.pre) and what tokenizer.json writes for them:
//   gpt2:   ByteLevel with GPT-2's regex                          ("gpt-2")
//   smollm: Digits (individual digits), then ByteLevel with GPT-2's regex ("smollm")
//   llama3: Split with Llama 3's regex, ByteLevel; merges ignored for whole words ("llama-bpe")
//   qwen2:  Split with Qwen2's regex, ByteLevel                   ("qwen2")
enum class BytePreTokenizer { gpt2, smollm, llama3, qwen2 };
const char* gguf_pre_name(BytePreTokenizer p);

struct ByteLevelVocabulary {
  std::vector<std::string> tokens;   // by id, in the byte alphabet ("Ġthe"); added tokens as their text
  std::vector<GgufTokenType> types;  // kNormal; kControl (special added), kUserDefined (added), kUnused
  std::vector<std::string> merges;   // "left right", highest priority first
  BytePreTokenizer pre = BytePreTokenizer::gpt2;
  std::optional<int32_t> bos, eos, unk, pad;
  bool add_bos = false, add_eos = false;
  // What the source says that the other form cannot (an added token's lstrip, a normalizer),
  // for the caller to report.
  std::vector<std::string> notes;
};

// tokenizer.ggml.* of a GGUF whose tokenizer.ggml.model is "gpt2". A "llama" (SentencePiece)
// vocabulary, or a pre-tokenizer loom does not run, is refused naming the key.
ByteLevelVocabulary vocabulary_from_gguf(const io::GgufFile& g);
// A tokenizer.json (its text; `where` names it in errors) and the bos_token / eos_token /
// unk_token / pad_token of the tokenizer_config.json beside it ("" when there is none). Anything
// but a byte-level BPE with one of the pre-tokenizers above is refused, naming the component.
ByteLevelVocabulary vocabulary_from_tokenizer_json(const std::string& json_text, const std::string& config_text,
                                                   const std::string& where);
// GPT-2's released files (encoder.json and vocab.bpe in `dir`), <|endoftext|> a control token.
ByteLevelVocabulary gpt2_vocabulary(const std::string& dir);
// loom's byte tokenizer (id = byte value) as a byte-level BPE with no merges: 256 tokens.
ByteLevelVocabulary byte_vocabulary();

// Fills ids from the vocabulary's end up to vocab_size with unused "[PAD<id>]" tokens (GGUF
// needs one token per row of the model's embedding, as llama.cpp's converter pads); a
// vocabulary larger than the model's is refused.
void pad_vocabulary(ByteLevelVocabulary& v, int64_t vocab_size);

// The tokenizer.json text `tokenizers` (and loom) reads as this vocabulary.
std::string tokenizer_json(const ByteLevelVocabulary& v);
// Sets tokenizer.ggml.model "gpt2" and the other tokenizer.ggml.* keys on `w`.
void set_gguf_vocabulary(const ByteLevelVocabulary& v, io::GgufWriter& w);

}  // namespace loom::data

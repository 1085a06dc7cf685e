// A checkpoint's tokenizer, chat template and end tokens written for another program: as the
// Hugging Face files (tokenizer.json, tokenizer_config.json, generation_config.json) that
// transformers loads beside the weights, or as the tokenizer.* keys of a GGUF that llama.cpp
// reads. `loom export` (docs/FINETUNING.md) calls these; the weights are model/'s.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace loom::io {
class GgufWriter;
}

namespace loom::data {

// What the checkpoint says about chatting (tokenizer_config.json, generation_config.json):
// empty where it says nothing.
struct ChatCard {
  std::string chat_template;
  std::string bos_token, eos_token;  // token texts
  std::vector<int32_t> end_ids;      // ids that end a reply
};

struct ExportedTokenizer {
  struct File {
    std::string name, bytes;
  };
  std::vector<File> files;  // Hugging Face form only
  std::string how;          // for the command's line: "tokenizer.json written from tokenizer.gguf (smollm, ...)"
  std::optional<int32_t> bos_id, eos_id;
  std::vector<std::string> notes;  // what the conversion could not carry
};

// The tokenizer files of `spec` (what a checkpoint records and make_tokenizer opens: "gpt2",
// "byte", a GGUF file, a tokenizer.json, or a folder holding one) for a Hugging Face directory
// of a model with `vocab_size` ids and context `n_ctx`. A folder's tokenizer files are copied as
// they are; the others become a tokenizer.json with a tokenizer_config.json (chat template,
// special tokens) and a generation_config.json (end ids). A vocabulary without a tokenizer.json
// form (GGUF "llama") is refused naming the fix.
ExportedTokenizer hf_tokenizer_files(const std::string& spec, const ChatCard& card, int64_t vocab_size, int64_t n_ctx);

// Sets the tokenizer.* keys of `spec`'s tokenizer on `w`, padded to `vocab_size` tokens: a
// GGUF's keys as they are, the others written from their vocabulary; the chat template and end
// ids of `card` where it has them.
ExportedTokenizer set_gguf_tokenizer(const std::string& spec, const ChatCard& card, int64_t vocab_size,
                                     io::GgufWriter& w);

}  // namespace loom::data

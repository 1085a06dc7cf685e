// Tokenizers from a GGUF model's metadata (llama.cpp's tokenizer.ggml.* keys): a "gpt2"
// byte-level BPE vocabulary with its merges, token types and the pre-tokenizer named by
// tokenizer.ggml.pre, which encodes as the model's Hugging Face tokenizer.json does; and a
// "llama" SentencePiece-style vocabulary with scores, which encodes and decodes as llama.cpp
// does (spm_tokenizer.h). Other tokenizer.ggml.model values are refused, naming the value.
#pragma once
#include <memory>
#include <string>

#include "loom/data/tokenizer.h"

namespace loom::io {
class GgufFile;
}

namespace loom::data {

std::unique_ptr<Tokenizer> load_gguf_tokenizer(const std::string& path);
std::unique_ptr<Tokenizer> gguf_tokenizer_from(const io::GgufFile& file);

}  // namespace loom::data

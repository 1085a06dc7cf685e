// Tokenizers from a GGUF model's metadata (llama.cpp's tokenizer.ggml.* keys): a "gpt2"
// byte-level BPE vocabulary with its merges, token types and the pre-tokenizer named by
// tokenizer.ggml.pre. Encodes as the model's Hugging Face tokenizer.json does. SentencePiece
// ("llama") vocabularies are refused for now.
#pragma once
#include <memory>
#include <string>

#include "loom/data/pipeline_tokenizer.h"

namespace loom::io {
class GgufFile;
}

namespace loom::data {

std::unique_ptr<PipelineTokenizer> load_gguf_tokenizer(const std::string& path);
std::unique_ptr<PipelineTokenizer> gguf_tokenizer_from(const io::GgufFile& file);

}  // namespace loom::data

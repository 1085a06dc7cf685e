// Tokenizers from Hugging Face `tokenizer.json` files, exact against the `tokenizers` library
// for what loom supports: a BPE model; normalizers NFC, Prepend, Replace (literal), Sequence;
// pre-tokenizers Split (GPT-2, Llama 3, Qwen2 regexes), Digits, ByteLevel, Metaspace,
// Sequence; added tokens; post-processors TemplateProcessing, ByteLevel, Sequence; decoders
// ByteLevel, Metaspace, ByteFallback, Fuse, Strip, Replace, Sequence. Anything else is refused
// at load, naming the component and what loom runs instead.
#pragma once
#include <memory>
#include <string>

#include "loom/data/pipeline_tokenizer.h"

namespace loom::data {

// `path` is a tokenizer.json or a folder holding one; tokenizer_config.json beside it
// supplies bos_token, eos_token, add_bos_token and add_eos_token where tokenizer.json's
// post-processor does not say.
std::unique_ptr<PipelineTokenizer> load_hf_tokenizer(const std::string& path);

// The pipeline of one tokenizer.json's text; `where` names it in errors.
PipelineSpec parse_hf_tokenizer_json(const std::string& json_text, const std::string& where);

}  // namespace loom::data

// What a model path names and what comes with it: a loom checkpoint (or run directory), a GGUF
// file, or a Hugging Face directory (config.json, safetensors, tokenizer files). For the two
// foreign formats, the model card (config, name, chat template, end tokens, where the tokenizer
// is) and the weights. Tokenizers and templates are data/'s to run; this file only says where
// they are and what they hold, so model/ stays below data/.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "loom/io/gguf.h"
#include "loom/model/config.h"
#include "loom/model/decoder.h"

namespace loom::model {

enum class ModelFormat { loom, gguf, hf };
const char* model_format_name(ModelFormat f);  // "loom checkpoint", "GGUF", "Hugging Face"

// A GGUF file (by its magic), a directory with manifest.json or holding step_* checkpoints
// (loom), or a directory with config.json and no manifest (Hugging Face). Throws naming the
// path and what was expected when it is none of them.
ModelFormat model_format(const std::string& path);

struct ModelCard {
  ModelFormat format = ModelFormat::loom;
  ModelConfig config;
  std::string name;       // the GGUF file's stem or the directory's name: what /v1/models serves
  std::string tokenizer;  // what data::make_tokenizer opens: the GGUF file or the directory
  std::string chat_template;
  std::string chat_template_source;  // where the template came from, for errors
  std::string bos_token, eos_token;  // token texts, as templates read them
  // Token ids that end a reply: the GGUF's eos/eot/eom ids, generation_config.json's
  // eos_token_id (one or a list), the tokenizer config's eos token.
  std::vector<int32_t> end_ids;
  std::vector<std::string> end_tokens;  // texts of end tokens whose id only the tokenizer knows
  // The GGUF file the card was read from, already validated: load_model_weights reads its
  // tensors without opening and parsing the file again.
  std::shared_ptr<const io::GgufFile> gguf;
};

// The card of a GGUF file or a Hugging Face directory (not of a loom checkpoint).
ModelCard read_model_card(const std::string& path);

// The chat files a directory may hold (a Hugging Face directory, or a checkpoint `loom convert`
// wrote): tokenizer_config.json's chat template, bos and eos tokens, chat_template.jinja,
// generation_config.json's end ids; what is absent stays as it is in `c`.
void read_chat_files(const std::string& dir, ModelCard& c);

// A file that carries part of a model's card into a checkpoint directory: its name there and
// its bytes.
struct CardFile {
  std::string name, bytes;
};
struct TokenizerFiles {
  std::vector<CardFile> files;
  // What the checkpoint records as its tokenizer: "tokenizer.gguf" or "." (the checkpoint
  // itself), relative so that it moves with the directory; the source's absolute path when the
  // source carries no tokenizer.
  std::string tokenizer;
};
// The tokenizer, chat template and end tokens of a GGUF file or a Hugging Face directory as files
// of a checkpoint directory: a GGUF's vocabulary as tokenizer.gguf (its tokenizer.* metadata and
// no tensors, which make_tokenizer reads exactly as it reads the source), with
// tokenizer_config.json and generation_config.json where a Hugging Face directory keeps them; a
// Hugging Face directory's tokenizer files (io::kTokenizerFiles) as they are.
TokenizerFiles tokenizer_files(const std::string& source, const ModelCard& card);
// The files of io::kTokenizerFiles that `dir` holds, as they are.
std::vector<CardFile> read_tokenizer_files(const std::string& dir);

// Loads the weights of a GGUF file or a Hugging Face directory (model.safetensors, or the
// shards model.safetensors.index.json lists) into `m`, the whole model in f32; returns a
// phrase for the start-up line ("Q4_1 x210, Q8_0 x1, F32 x61 dequantized to f32 in 1.2 s").
std::string load_model_weights(const std::string& path, const ModelCard& card, Decoder& m);

}  // namespace loom::model

#include "tools/loom/model_card_files.h"

#include <cstdio>

#include "loom/io/checkpoint_files.h"
#include "loom/io/file.h"
#include "loom/io/gguf.h"
#include "loom/model/hf_weights.h"

namespace loom::cli {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

// A GGUF's vocabulary: a GGUF file with the source's tokenizer.* metadata and no tensors, which
// make_tokenizer reads exactly as it reads the source.
constexpr const char* kGgufTokenizerFile = "tokenizer.gguf";

// Puts the tokenizer of `source` into `dir`, appending the files written to `files`; returns
// what the checkpoint records as its tokenizer.
std::string carry_tokenizer(const std::string& source, const model::ModelCard& card, const fs::path& dir,
                            std::vector<std::string>& files) {
  if (card.format == model::ModelFormat::hf) {
    // Copied as they are: make_tokenizer opens the directory (tokenizer.json and its config), and
    // the chat template and end tokens stay where readers of Hugging Face directories look.
    for (const char* f : io::kTokenizerFiles) {
      if (!fs::exists(fs::path(source) / f)) continue;
      fs::copy_file(fs::path(source) / f, dir / f, fs::copy_options::overwrite_existing);
      files.push_back(f);
    }
    if (!fs::exists(dir / "tokenizer.json"))
      std::fprintf(stderr,
                   "[convert] warning: %s has no tokenizer.json; the checkpoint names itself as its tokenizer, "
                   "so loading a tokenizer from it fails until one is added\n",
                   source.c_str());
    return ".";  // the checkpoint itself (checkpoint_tokenizer joins it to the directory)
  }
  const io::GgufFile& g = *card.gguf;  // read_model_card opened and checked it
  if (!g.has("tokenizer.ggml.model")) {
    std::fprintf(stderr, "[convert] warning: %s carries no tokenizer; the checkpoint names the GGUF file instead\n",
                 source.c_str());
    return fs::absolute(source).string();
  }
  io::GgufWriter w;
  w.set("general.architecture", g.value("general.architecture"));
  w.set("general.name", io::gguf_string(card.name));
  for (const auto& [key, value] : g.metadata())
    if (key.rfind("tokenizer.", 0) == 0) w.set(key, value);
  w.write((dir / kGgufTokenizerFile).string());
  files.push_back(kGgufTokenizerFile);
  // The chat template and end tokens also where a Hugging Face directory keeps them.
  json tc = json::object();
  if (!card.chat_template.empty()) tc["chat_template"] = card.chat_template;
  if (!card.bos_token.empty()) tc["bos_token"] = card.bos_token;
  if (!card.eos_token.empty()) tc["eos_token"] = card.eos_token;
  io::write_file_atomic((dir / "tokenizer_config.json").string(), tc.dump(2));
  files.push_back("tokenizer_config.json");
  if (!card.end_ids.empty()) {
    io::write_file_atomic((dir / "generation_config.json").string(), json({{"eos_token_id", card.end_ids}}).dump(2));
    files.push_back("generation_config.json");
  }
  return kGgufTokenizerFile;  // relative to the checkpoint, so that it moves with it
}

}  // namespace

CardFiles write_card_files(const std::string& source, const model::ModelCard& card, const fs::path& dir) {
  CardFiles out;
  io::write_file_atomic((dir / io::kHfConfigFile).string(), model::hf_config_json(card.config));
  out.files.push_back(io::kHfConfigFile);
  out.tokenizer = carry_tokenizer(source, card, dir, out.files);
  out.converted_from = {{"path", fs::absolute(source).lexically_normal().string()},
                        {"format", model::model_format_name(card.format)}};
  // What checkpoint_reader.h reads: the step and the tokenizer (relative to the checkpoint, whose
  // files `loom quantize` copies along).
  const json state = {
      {"step", 0}, {"tokenizer", out.tokenizer}, {"run_id", ""}, {"converted_from", out.converted_from}};
  io::write_file_atomic((dir / io::kTrainerStateFile).string(), state.dump(2));
  out.files.push_back(io::kTrainerStateFile);
  return out;
}

}  // namespace loom::cli

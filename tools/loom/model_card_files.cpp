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

// Puts the tokenizer of `source` into `dir` (model::tokenizer_files), appending the files written
// to `files`; returns what the checkpoint records as its tokenizer.
std::string carry_tokenizer(const std::string& source, const model::ModelCard& card, const fs::path& dir,
                            std::vector<std::string>& files) {
  const model::TokenizerFiles t = model::tokenizer_files(source, card);
  for (const model::CardFile& f : t.files) {
    io::write_file_atomic((dir / f.name).string(), f.bytes);
    files.push_back(f.name);
  }
  if (card.format == model::ModelFormat::hf && !fs::exists(dir / "tokenizer.json"))
    std::fprintf(stderr,
                 "[convert] warning: %s has no tokenizer.json; the checkpoint names itself as its tokenizer, "
                 "so loading a tokenizer from it fails until one is added\n",
                 source.c_str());
  if (card.format == model::ModelFormat::gguf && t.files.empty())
    std::fprintf(stderr, "[convert] warning: %s carries no tokenizer; the checkpoint names the GGUF file instead\n",
                 source.c_str());
  return t.tokenizer;
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

// The work directory of `loom bench finetune`: the model both sides train, as f32 weights in a
// Hugging Face directory, and the token stream their ranks read. Not the timing (the ranks') nor
// the comparison (bench_finetune.cpp).
#include <algorithm>
#include <filesystem>
#include <optional>
#include <random>

#include "bench/loom/bench_finetune.h"
#include "loom/data/tokenizer.h"
#include "loom/io/file.h"
#include "loom/model/decoder.h"
#include "loom/model/export_hf.h"
#include "loom/model/model_source.h"

namespace loom::cli {

namespace fs = std::filesystem;

// scripts/fetch-test-model.sh's file: $LOOM_MODEL_CACHE, else ~/.cache/loom/models.
std::string default_finetune_model() {
  const char* cache = std::getenv("LOOM_MODEL_CACHE");
  const char* home = std::getenv("HOME");
  const fs::path dir = cache && *cache ? fs::path(cache) : fs::path(home ? home : "") / ".cache/loom/models";
  return (dir / "SmolLM2-135M-Instruct.Q4_1.gguf").string();
}

namespace {

// `count` ids: the start of Tiny Shakespeare in the model's tokenizer (repeated if it is
// shorter), or, for a preset without one, uniform random ids.
std::vector<int32_t> bench_tokens(const model::ModelCard* card, int32_t vocab, size_t count, std::string& what) {
  std::vector<int32_t> ids;
  if (!card) {
    what = "random ids";
    std::mt19937 g(1);
    for (size_t i = 0; i < count; ++i) ids.push_back(int32_t(g() % uint32_t(vocab)));
    return ids;
  }
  const std::string text = io::read_file(std::string(LOOM_SOURCE_DIR) + "/data/tinyshakespeare/input.txt");
  const auto tok = data::make_tokenizer(card->tokenizer);
  what = "Tiny Shakespeare in the model's tokenizer";
  for (size_t bytes = std::min(text.size(), count * 8);; bytes = text.size()) {
    ids = tok->encode(std::string_view(text).substr(0, bytes));
    if (ids.size() >= count || bytes == text.size()) break;
  }
  LOOM_CHECK(!ids.empty(), "bench finetune", "Tiny Shakespeare encodes to no tokens");
  for (size_t i = ids.size(); i < count; ++i) ids.push_back(ids[i % ids.size()]);
  ids.resize(count);
  return ids;
}

}  // namespace

FinetuneWork prepare_finetune_work(const std::string& model_arg, const std::string& work, size_t count) {
  const std::vector<std::string> presets = model::preset_names();
  const bool preset = std::find(presets.begin(), presets.end(), model_arg) != presets.end();
  std::optional<model::ModelCard> card;
  FinetuneWork p;
  if (preset) {
    p.config = model::preset(model_arg);
    p.name = model_arg;
  } else {
    if (!fs::exists(model_arg))
      throw UsageError(str_cat("[bench finetune] --model ", model_arg,
                               " does not exist; scripts/fetch-test-model.sh fetches SmolLM2-135M-Instruct, or name "
                               "a GGUF file, a Hugging Face directory or a preset such as llama-tiny"));
    if (model::model_format(model_arg) == model::ModelFormat::loom)
      throw UsageError(str_cat("[bench finetune] --model ", model_arg,
                               " is a loom checkpoint; loom export --format hf --checkpoint ", model_arg,
                               " --out DIR makes the Hugging Face directory both sides read"));
    card = model::read_model_card(model_arg);
    p.config = card->config;
    p.config.name = p.name = card->name;
  }
  model::DecoderOptions opt;
  opt.allocate_flat_grads = false;
  model::Decoder m(p.config, opt);
  if (card)
    model::load_model_weights(model_arg, *card, m);
  else
    m.init_weights(1234);
  p.params = m.num_params();
  const fs::path dir = fs::path(work) / kFinetuneModelDir;
  fs::create_directories(dir);
  model::write_hf_model(m, dir.string(), {});
  const std::vector<int32_t> ids = bench_tokens(card ? &*card : nullptr, p.config.vocab_size, count, p.tokens);
  io::write_file_atomic((fs::path(work) / kFinetuneTokensFile).string(),
                        std::string_view(reinterpret_cast<const char*>(ids.data()), ids.size() * sizeof(int32_t)));
  return p;
}

}  // namespace loom::cli

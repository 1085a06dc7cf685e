#include "loom/train/init_from.h"

#include <cmath>
#include <filesystem>

#include <nlohmann/json.hpp>

#include "loom/core/timer.h"
#include "loom/data/tokenizer.h"
#include "loom/io/checkpoint_files.h"
#include "loom/io/file.h"
#include "loom/model/checkpoint_reader.h"
#include "loom/model/decoder.h"
#include "loom/model/model_source.h"
#include "loom/train/checkpoint.h"
#include "loom/train/checkpoint_agreement.h"
#include "loom/train/checkpoint_dir.h"

namespace loom::train {

namespace fs = std::filesystem;

// The checkpoint a loom source names: itself when it is one, else its run's newest valid one.
std::string loom_checkpoint_of(const std::string& path) {
  return fs::exists(fs::path(path) / "manifest.json") ? path : model::resolve_checkpoint(path);
}

model::ModelConfig init_source_config(const std::string& path) {
  if (model::model_format(path) == model::ModelFormat::loom)
    return model::checkpoint_model_config(loom_checkpoint_of(path));
  const model::ModelCard card = model::read_model_card(path);
  model::ModelConfig c = card.config;
  c.name = card.name;
  return c;
}

std::string resolve_init_source(const std::string& path, const comm::Group& g) {
  if (model::model_format(path) != model::ModelFormat::loom || fs::exists(fs::path(path) / "manifest.json"))
    return path;
  Tensor step = Tensor::zeros({1}, DType::i64, MemCategory::comm);
  std::string found;
  on_every_rank_or_none(g, str_cat("finding a checkpoint in model.init_from=", path), [&] {
    if (g.rank() != 0) return;
    found = model::resolve_checkpoint(path);
    step.data<int64_t>()[0] = checkpoint_step_of(found);
  });
  if (g.size() > 1) g.broadcast(step, 0);
  return g.rank() == 0 ? found : (fs::path(path) / io::checkpoint_dir_name(step.data<int64_t>()[0])).string();
}

std::string init_source_tokenizer(const std::string& path) {
  if (model::model_format(path) == model::ModelFormat::loom)
    return model::checkpoint_tokenizer(loom_checkpoint_of(path));
  return model::read_model_card(path).tokenizer;
}

void check_init_source_data(const std::string& path, int64_t data_vocab, const std::string& data_dir) {
  const std::string spec = init_source_tokenizer(path);
  const int64_t vocab = data::make_tokenizer(spec)->vocab_size();
  LOOM_CHECK(vocab == data_vocab, "train", "data.dir=", data_dir, " holds tokens of a ", data_vocab,
             "-token vocabulary, but model.init_from=", path, " comes with a tokenizer of ", vocab, " tokens (", spec,
             "); tokenize the text with it: loom prepare --tokenizer ", spec);
}

model::TokenizerFiles init_source_tokenizer_files(const std::string& path) {
  if (model::model_format(path) != model::ModelFormat::loom)
    return model::tokenizer_files(path, model::read_model_card(path));
  const std::string ckpt = loom_checkpoint_of(path);
  model::TokenizerFiles t;
  t.tokenizer = model::checkpoint_tokenizer(ckpt);
  t.files = model::read_tokenizer_files(ckpt);
  // A tokenizer the checkpoint holds is recorded relative to it ("tokenizer.gguf", "."), as the
  // source recorded it, so that it names the copies.
  const fs::path rel = fs::path(t.tokenizer).lexically_relative(fs::path(ckpt));
  if (!t.files.empty() && !rel.empty() && *rel.begin() != "..") t.tokenizer = rel.lexically_normal().string();
  return t;
}

void restore_init_router_bias(const std::string& path, model::Decoder& m) {
  if (model::model_format(path) != model::ModelFormat::loom) return;
  const std::string ckpt = loom_checkpoint_of(path);
  model::restore_router_bias(nlohmann::json::parse(io::read_file((fs::path(ckpt) / io::kTrainerStateFile).string())),
                             m);
}

std::string load_init_weights(const std::string& path, const model::ModelConfig& cfg, const model::ParamLayout& local,
                              const Tensor& local_flat, const model::ParamLayout* whole) {
  const model::ModelFormat format = model::model_format(path);
  if (format == model::ModelFormat::loom) {
    Stopwatch sw;
    const std::string ckpt = loom_checkpoint_of(path);
    model::read_whole_into_local((fs::path(ckpt) / io::kWeightsFile).string(), cfg, local, local_flat, whole);
    return str_cat("loom checkpoint ", ckpt, " in ", std::round(sw.seconds() * 100) / 100, " s");
  }
  // The whole model in f32 as the readers fill it, then this rank's slice of it.
  const model::ModelCard card = model::read_model_card(path);
  model::DecoderOptions opt;
  opt.allocate_flat_grads = false;
  model::Decoder m(cfg, opt);
  const std::string what = model::load_model_weights(path, card, m);
  model::slice_whole_params(m.layout(), m.params(), local, local_flat);
  return str_cat(model::model_format_name(format), ": ", what);
}

}  // namespace loom::train

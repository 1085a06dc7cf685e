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
#include "loom/model/lora_merge.h"
#include "loom/model/model_source.h"
#include "loom/train/checkpoint.h"
#include "loom/train/checkpoint_agreement.h"
#include "loom/train/checkpoint_dir.h"

namespace loom::train {

namespace fs = std::filesystem;

namespace {

// The checkpoint a loom source names: itself when it is one, else its run's newest valid one.
bool is_checkpoint_dir(const std::string& path) { return fs::exists(fs::path(path) / "manifest.json"); }

// The tokenizer that comes with the source, as data::make_tokenizer opens it.
std::string source_tokenizer(const InitSource& src) {
  return src.card ? src.card->tokenizer : model::checkpoint_tokenizer(src.checkpoint);
}

}  // namespace

model::ModelConfig init_source_config(const std::string& path) {
  if (model::model_format(path) == model::ModelFormat::loom)
    return model::checkpoint_model_config(is_checkpoint_dir(path) ? path : model::resolve_checkpoint(path));
  const model::ModelCard card = model::read_model_card(path);
  model::ModelConfig c = card.config;
  c.name = card.name;
  return c;
}

InitSource resolve_init_source(const std::string& path, const comm::Group& g) {
  InitSource src;
  src.path = path;
  src.format = model::model_format(path);
  if (src.format != model::ModelFormat::loom) {
    src.card = std::make_shared<const model::ModelCard>(model::read_model_card(path));
    return src;
  }
  if (is_checkpoint_dir(path)) {
    src.checkpoint = path;
    return src;
  }
  Tensor step = Tensor::zeros({1}, DType::i64, MemCategory::comm);
  on_every_rank_or_none(g, str_cat("finding a checkpoint in model.init_from=", path), [&] {
    if (g.rank() != 0) return;
    src.checkpoint = model::resolve_checkpoint(path);
    step.data<int64_t>()[0] = checkpoint_step_of(src.checkpoint);
  });
  if (g.size() > 1) g.broadcast(step, 0);
  if (g.rank() != 0) src.checkpoint = (fs::path(path) / io::checkpoint_dir_name(step.data<int64_t>()[0])).string();
  return src;
}

void check_init_source_data(const InitSource& src, int64_t data_vocab, const std::string& data_dir) {
  const std::string spec = source_tokenizer(src);
  const int64_t vocab = data::make_tokenizer(spec)->vocab_size();
  LOOM_CHECK(vocab == data_vocab, "train", "data.dir=", data_dir, " holds tokens of a ", data_vocab,
             "-token vocabulary, but model.init_from=", src.path, " comes with a tokenizer of ", vocab, " tokens (",
             spec, "); tokenize the text with it: loom prepare --tokenizer ", spec);
}

model::TokenizerFiles init_source_tokenizer_files(const InitSource& src) {
  if (src.card) return model::tokenizer_files(src.path, *src.card);
  model::TokenizerFiles t;
  t.tokenizer = source_tokenizer(src);
  t.files = model::read_tokenizer_files(src.checkpoint);
  // A tokenizer the checkpoint holds is recorded relative to it ("tokenizer.gguf", "."), as the
  // source recorded it, so that it names the copies.
  const fs::path rel = fs::path(t.tokenizer).lexically_relative(fs::path(src.checkpoint));
  if (!t.files.empty() && !rel.empty() && *rel.begin() != "..") t.tokenizer = rel.lexically_normal().string();
  return t;
}

std::string init_source_sha256(const InitSource& src) {
  return model::weights_sha256(src.card ? src.path : src.checkpoint);
}

std::string load_init_weights(const InitSource& src, model::Decoder& m, const Tensor& local_flat,
                              const model::ParamLayout* whole) {
  if (!src.card) {
    Stopwatch sw;
    model::read_whole_into_local((fs::path(src.checkpoint) / io::kWeightsFile).string(), m.config(), m.base_layout(),
                                 local_flat, whole);
    model::restore_router_bias(
        nlohmann::json::parse(io::read_file((fs::path(src.checkpoint) / io::kTrainerStateFile).string())), m);
    return str_cat("loom checkpoint ", src.checkpoint, " in ", std::round(sw.seconds() * 100) / 100, " s");
  }
  // The whole model in f32 as the readers fill it, then this rank's slice of it.
  model::DecoderOptions opt;
  opt.allocate_flat_grads = false;
  model::Decoder whole_model(m.config(), opt);
  const std::string what = model::load_model_weights(src.path, *src.card, whole_model);
  model::slice_whole_params(whole_model.layout(), whole_model.params(), m.base_layout(), local_flat);
  return str_cat(model::model_format_name(src.format), ": ", what);
}

}  // namespace loom::train

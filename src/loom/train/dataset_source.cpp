// Opens train.bin and val.bin of data.dir with the model's vocabulary and checks that the two
// belong together; batches come straight from data::TokenDataset.
#include "loom/train/dataset_source.h"

#include <algorithm>
#include <filesystem>

#include <nlohmann/json.hpp>

#include "loom/io/file.h"

namespace loom::train {

DatasetSource::DatasetSource(const TrainConfig& cfg, std::FILE* log) {
  data::DatasetOptions o;
  // With model.init_from the trainer checks the data against the source's own tokenizer and
  // names the `loom prepare --tokenizer` that fixes a mismatch (train/init_from.h).
  o.model_vocab = cfg.init_from.empty() ? cfg.model.vocab_size : -1;
  o.seed = cfg.data.seed;
  o.log = log;
  o.layout = cfg.data.chat_layout;
  LOOM_CHECK(std::filesystem::exists(std::filesystem::path(cfg.data.dir) / "train.bin"), "data",
             "data.dir=", cfg.data.dir, " has no train.bin; run `loom prepare --input FILE --out ", cfg.data.dir,
             "` first");
  train_ = std::make_unique<data::TokenDataset>(data::TokenDataset::open_split(cfg.data.dir, "train", o));
  if (std::filesystem::exists(std::filesystem::path(cfg.data.dir) / "val.bin"))
    val_ = std::make_unique<data::TokenDataset>(data::TokenDataset::open_split(cfg.data.dir, "val", o));
  tokenizer_ = train_->header().tokenizer;
  try {  // meta.json is optional (shards may be written by other means); the header then names it
    const auto meta =
        nlohmann::json::parse(io::read_file((std::filesystem::path(cfg.data.dir) / "meta.json").string()));
    if (meta.contains("tokenizer") && meta["tokenizer"].is_string()) tokenizer_ = meta["tokenizer"].get<std::string>();
  } catch (const std::exception&) {
  }
  if (train_->packs_documents() && log) {
    const int64_t T = cfg.data.seq_len, rows = int64_t(train_->bins(T).size()) - 1;
    std::fprintf(log, "[data] %zu conversations in %s packed into %lld rows of %lld tokens (%.0f%% of them filled)\n",
                 train_->conversation_starts().size(), train_->path().c_str(), (long long)rows, (long long)T,
                 100.0 * double(std::min(train_->size(), rows * T)) / double(std::max<int64_t>(1, rows * T)));
  }
  if (train_->has_mask() && log) {
    // Both layouts keep a conversation in one row: its first seq_len targets are trained.
    const int64_t n = cfg.data.seq_len + 1, cut = train_->conversations_longer_than(n);
    if (cut > 0)
      std::fprintf(log,
                   "[data] %lld of %zu conversations in %s are longer than data.seq_len + 1 = %lld tokens; the %s "
                   "layout trains their first %lld targets only (raise data.seq_len)\n",
                   (long long)cut, train_->conversation_starts().size(), train_->path().c_str(), (long long)n,
                   cfg.data.chat_layout == data::ChatLayout::pad ? "pad" : "pack", (long long)cfg.data.seq_len);
  }
  if (val_) {
    const data::ShardHeader &t = train_->header(), &v = val_->header();
    LOOM_CHECK(t.vocab_size == v.vocab_size && t.tokenizer == v.tokenizer, "data", val_->path(), " has vocab_size ",
               v.vocab_size, " (tokenizer ", v.tokenizer, ") but ", train_->path(), " has ", t.vocab_size,
               " (tokenizer ", t.tokenizer, "); both must come from one loom prepare run; re-run loom prepare");
  }
}

void DatasetSource::fill_train(int64_t step, int64_t first, int64_t n, int64_t global, int64_t T, int32_t* tok,
                               int32_t* tgt, int32_t* pos) {
  train_->fill_batch(step, first, n, global, T, tok, tgt, pos);
}

void DatasetSource::fill_val(int64_t index, int64_t B, int64_t T, int32_t* tok, int32_t* tgt, int32_t* pos) {
  val_->fill_eval_batch(index, B, T, tok, tgt, pos);
}

int64_t DatasetSource::vocab_size() const { return int64_t(train_->header().vocab_size); }

}  // namespace loom::train

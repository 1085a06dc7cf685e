// The trainer's view of a directory written by `loom prepare`: train.bin for training
// windows and, when present, val.bin for validation. Both are verified when opened (payload
// checksum, every id within the vocabulary, the vocabulary within the model's), so a bad shard
// stops the run before step 0 rather than mid-run or at the final evaluation.
#pragma once
#include <cstdio>
#include <memory>

#include "loom/data/dataset.h"
#include "loom/train/batch_source.h"
#include "loom/train/train_config.h"

namespace loom::train {

class DatasetSource final : public BatchSource {
 public:
  // `log` gets a line for each shard whose verification takes a second or more (nullptr: none).
  explicit DatasetSource(const TrainConfig& cfg, std::FILE* log = stdout);
  void fill_train(int64_t step, int64_t first, int64_t n, int64_t global, int64_t T, int32_t* tok, int32_t* tgt,
                  int32_t* pos) override;
  void fill_val(int64_t index, int64_t B, int64_t T, int32_t* tok, int32_t* tgt, int32_t* pos) override;
  bool packs_documents() const override { return train_->packs_documents(); }
  int64_t vocab_size() const override;
  bool has_val() const override { return val_ != nullptr; }
  // meta.json's tokenizer (a model's tokenizer by its whole path), else the shard header's.
  std::string tokenizer_name() const override { return tokenizer_; }

 private:
  std::unique_ptr<data::TokenDataset> train_, val_;
  std::string tokenizer_;
};

}  // namespace loom::train

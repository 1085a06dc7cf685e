// What the trainer needs from a dataset: training windows that are a pure function of
// (step, sequence index) and validation windows in order. data::TokenDataset provides it.
#pragma once
#include <cstdint>
#include <string>

namespace loom::train {

class BatchSource {
 public:
  virtual ~BatchSource() = default;
  // Rows [first_seq, first_seq + n_seqs) of the global batch of `global_batch` sequences
  // at `step`: T inputs and T targets (inputs shifted by one) per row. positions: null unless
  // packs_documents(); then each token's position in its document (model::Decoder).
  virtual void fill_train(int64_t step, int64_t first_seq, int64_t n_seqs, int64_t global_batch, int64_t T,
                          int32_t* tokens, int32_t* targets, int32_t* positions) = 0;
  // Validation batch `index` (deterministic walk over the validation split).
  virtual void fill_val(int64_t index, int64_t B, int64_t T, int32_t* tokens, int32_t* targets, int32_t* positions) = 0;
  // Whether a row may hold several documents that must not attend to one another (packed
  // conversations): the trainer then asks for their positions.
  virtual bool packs_documents() const { return false; }
  virtual int64_t vocab_size() const = 0;
  virtual bool has_val() const = 0;
  // The tokenizer that produced the ids ("gpt2", "byte"), recorded in checkpoints so that
  // generate and serve decode with the same one; empty when unknown.
  virtual std::string tokenizer_name() const { return ""; }
};

}  // namespace loom::train

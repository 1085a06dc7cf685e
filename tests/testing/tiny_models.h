// The smallest models the model tests build: a few hundred parameters, so that gradient checks in
// f64 over every element take milliseconds.
#pragma once
#include "loom/model/config.h"

namespace loom::testing {

// llama-tiny cut to 2 blocks of width 16, 4 query and 2 kv heads (GQA), an MLP of 24, 23 words
// and a context of 16; untied head.
inline model::ModelConfig tiny_llama() {
  model::ModelConfig c = model::preset("llama-tiny");
  c.n_layer = 2;
  c.d_model = 16;
  c.n_head = 4;
  c.n_kv_head = 2;
  c.d_ff = 24;
  c.vocab_size = 23;
  c.n_ctx = 16;
  c.tied_embeddings = false;
  return c;
}

}  // namespace loom::testing

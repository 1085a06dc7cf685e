// The loss of one token from its logits, computed one way for `loom eval` and the perplexity of
// `loom bench infer --ppl-text`, so that the two report the same figure for the same model.
#pragma once
#include <cstdint>

namespace loom::cli {

// -log softmax(row)[target] over a row of V logits, in float64.
double token_nll(const float* row, int64_t V, int32_t target);

}  // namespace loom::cli

// Sampling parameters and the sampler: greedy, temperature, top-k, top-p. A draw is a pure
// function of (request seed, output position), from loom's counter-based RNG, so a request's
// tokens never depend on what else shares its batch.
#pragma once
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace loom::infer {

class ByteWriter;  // wire.h
class ByteReader;

// One request's sampling and stopping, from the HTTP request (serve/openai_request.h) or the
// command line to the sampler.
struct SamplingParams {
  double temperature = 1.0;             // 0: greedy
  int64_t top_k = 0;                    // 0: no limit
  double top_p = 1.0;                   // in (0, 1]
  int64_t max_tokens = 16;              // tokens to generate at most
  std::vector<int32_t> stop_token_ids;  // end the output (the stop token is not part of it)
  std::vector<std::string> stop;        // end once the detokenised output contains one
  std::optional<uint64_t> seed;         // unset: the engine derives one from its own seed
  // With an engine that speculates (EngineConfig::speculative): false decodes this request
  // plainly. Either way its tokens have the same distribution (greedy: the same tokens).
  bool speculate = true;
  // Report each token's probability under the model (TokenEvent::prob): a softmax over the
  // row at temperature 1, whatever the sampling parameters; one extra pass over the
  // vocabulary per token, so only callers that use it (the cascade's confidence) ask.
  bool token_probs = false;

  // Throws "[sampling] <parameter> ..." naming the bad parameter.
  void validate() const;
  bool greedy() const { return temperature == 0.0; }
  bool operator==(const SamplingParams&) const = default;
};

// Every field, for a tensor-parallel leader's broadcast (engine_tp.cpp); a field added to
// SamplingParams fails to compile here until it is written and read.
void write_sampling_params(ByteWriter& w, const SamplingParams& p);
SamplingParams read_sampling_params(ByteReader& r);

// The ranges users may give, shared by the server's request fields and `loom generate`'s
// options so that both refuse the same values (the engine itself accepts any temperature >= 0
// and only top_k >= 0). Each returns "" or what is wrong, naming the parameter as `name`: how
// the caller's users spell it ("'top_p'" in a request body, "--top-p" on the command line).
std::string temperature_problem(double temperature, std::string_view name);  // [0, 2]
std::string top_p_problem(double top_p, std::string_view name);              // (0, 1]
std::string top_k_problem(int64_t top_k, std::string_view name);             // >= 1, or 0 / -1: no limit
std::string max_tokens_problem(int64_t max_tokens, std::string_view name);   // >= 1
// A user's top_k as SamplingParams takes it (-1, like 0, means no limit).
inline int64_t user_top_k(int64_t top_k) { return top_k > 0 ? top_k : 0; }

// The uniform draw for output position `index` of a request with this seed.
float sampling_draw(uint64_t seed, int64_t index);

// sample_token's answer for a row that cannot be sampled: a logit that is NaN or +inf, or
// every logit -inf (a -inf logit alone is a masked token, weight 0).
inline constexpr int32_t kNonFiniteLogits = -1;

// Picks a token from one row of logits given a uniform draw u in [0, 1). Ties break toward
// the lower token ID. `scratch` is reused between calls to avoid allocating. Returns
// kNonFiniteLogits for a row that cannot be sampled (checked within a pass it makes anyway).
template <class T>
int32_t sample_token(const T* logits, int64_t V, const SamplingParams& p, float u,
                     std::vector<std::pair<T, int32_t>>& scratch);

// The distribution sample_token draws from, as probabilities over the whole vocabulary
// (temperature softmax, then top-k, then top-p; zero elsewhere; greedy: all of it on the
// greedy choice), into probs. Speculative decoding's verification compares the target's and
// the draft's. Returns false for a row sample_token refuses (kNonFiniteLogits).
template <class T>
bool sampling_distribution(const T* logits, int64_t V, const SamplingParams& p, std::vector<double>& probs,
                           std::vector<std::pair<T, int32_t>>& scratch);
// Inverse CDF in token-ID order: the first token whose cumulative weight exceeds u times the
// total (the weights need not sum to 1; the last token with weight when rounding runs past).
int32_t draw_from(std::span<const double> weights, float u);

// The probability of token `tok` under softmax(logits) at temperature 1, in double precision.
template <class T>
double token_probability(const T* logits, int64_t V, int32_t tok);

// What is wrong with a row sample_token refused, to complete "the logits are ...": "NaN",
// "+inf" or "-inf for every token".
template <class T>
std::string describe_non_finite(const T* logits, int64_t V);

}  // namespace loom::infer

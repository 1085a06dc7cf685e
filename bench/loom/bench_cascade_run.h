// The pieces of `loom bench cascade` that do not start processes: the workload (chat questions
// through the model's template, or Tiny Shakespeare continuations and out-of-distribution text),
// the timed replay of requests against one or more servers, and the center model's score of the
// answers.
#pragma once
#include <cmath>
#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "loom/model/decoder.h"
#include "loom/serve/chat_template.h"
#include "loom/serve/tokenizer.h"

namespace loom::cli {

struct CascadePrompt {
  std::string text;  // the text to continue, or (chat) the user's message
  bool in_distribution = true;
  bool chat = false;         // sent to /v1/chat/completions as one user message
  std::vector<int32_t> ids;  // prepare_prompts: the prompt as the server tokenizes it
};
// n prompts, alternating in- and out-of-distribution: Shakespeare passages of about 120
// characters from `corpus`'s last tenth (cut at line starts), and modern technical and
// conversational sentences no Shakespeare model has seen.
std::vector<CascadePrompt> cascade_workload(const std::string& corpus, int64_t n, uint64_t seed);
// n chat prompts: the lines of `questions` (data/chat/questions.txt) in an order `seed` shuffles,
// repeated when n exceeds them.
std::vector<CascadePrompt> chat_workload(const std::string& questions, int64_t n, uint64_t seed);

// Fills every prompt's ids: a chat prompt rendered through `chat` (the model's template) as the
// server renders it, a text prompt cut (leading words dropped) to max_prompt_tokens. A chat
// prompt longer than that is an error naming it.
void prepare_prompts(std::vector<CascadePrompt>& prompts, const serve::TextTokenizer& tok,
                     const serve::ChatFormat& chat, int64_t max_prompt_tokens);

struct AnswerScore {
  double logprob = 0;
  int64_t tokens = 0;
};

struct CascadeAnswer {
  bool ok = false;
  double latency_s = 0;
  std::string text, answered_by, version, edge_version, error;
  std::vector<int32_t> token_ids;  // the tokens the answering model chose
  // An edge's confidence in its window (X-Loom-Confidence, -Min); NaN when it did not say.
  double confidence = std::nan(""), confidence_min = std::nan("");
  AnswerScore score;  // score_answers: what the center model makes of token_ids
};

struct ReplayOptions {
  std::vector<std::string> urls;  // request i goes to urls[i % urls.size()]
  std::string model;
  int64_t max_tokens = 32;
  double rate = 1;  // Poisson arrivals per second
  uint64_t seed = 0;
  double timeout_s = 300;
};
// Sends every prompt at its arrival time (greedy completions), waits for all answers.
// `midway` (if set) runs once half the requests have been sent.
std::vector<CascadeAnswer> replay_cascade(const std::vector<CascadePrompt>& prompts, const ReplayOptions& opt,
                                          const std::function<void()>& midway = {});

// The tokens the answering model chose, after the prompt's ids (a cascade's edge and center share
// the tokenizer), scored by `center`: the sum of their log-probabilities and their count; the
// sequence is cut to the model's context.
AnswerScore score_answer(model::Decoder& center, const std::vector<int32_t>& prompt,
                         const std::vector<int32_t>& answer);
// Answers already scored, by prompt index and answer tokens: runs at different thresholds
// repeat most answers (the center's, and the edge's greedy ones).
using ScoreCache = std::map<std::pair<size_t, std::vector<int32_t>>, AnswerScore>;
// Fills every answered request's `score` (LOOM_BENCH_CASCADE_TRACE prints each on stderr).
void score_answers(std::vector<CascadeAnswer>& answers, const std::vector<CascadePrompt>& prompts,
                   model::Decoder& center, const std::string& run_name, ScoreCache& cache);

}  // namespace loom::cli

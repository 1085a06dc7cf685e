// Speculative decoding: who proposes the next tokens of a decoding sequence, and the rule that
// decides which of them the target keeps. Proposers: a draft model (a smaller model with the
// target's vocabulary, run on its own paged KV cache) or n-gram lookup in the sequence's own
// tokens (no model). The engine (engine.h) asks for proposals before it schedules, the target
// scores them in one forward with the sequence's last token, and verify_proposals keeps the
// longest acceptable run: the greedy choice wherever the request is greedy, the
// rejection-sampling rule of Leviathan et al. / Chen et al. (2023) otherwise, so that what a
// request returns is distributed exactly as without speculation.
#pragma once
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "loom/infer/kv_cache.h"
#include "loom/infer/model_runner.h"
#include "loom/infer/quant_weights.h"
#include "loom/infer/sampler.h"
#include "loom/model/decoder.h"

namespace loom::infer {

enum class SpecMethod { none, draft, ngram };
const char* spec_method_name(SpecMethod m);

// exact: the rule above. accept_all keeps every proposal: a deliberately wrong rule, for the
// tests that show the distribution check can fail; never for serving.
enum class AcceptRule { exact, accept_all };

struct SpeculativeConfig {
  SpecMethod method = SpecMethod::none;
  int64_t k = 4;          // proposals per sequence and step, at most
  int64_t ngram_max = 3;  // n-gram: match the sequence's last n tokens, n from ngram_max
  int64_t ngram_min = 1;  //   down to ngram_min, at their most recent earlier occurrence
  // Each request's k follows its measured acceptance (1..k); below 25% it stops proposing,
  // with one probe every 8 steps.
  bool adaptive = true;
  // No proposals in a step where more sequences than this decode: a large batch is
  // compute-bound, and scoring proposals there costs more than it saves. 0: no limit.
  int64_t max_batch = 8;
  const model::Decoder* draft = nullptr;        // SpecMethod::draft; outlives the engine
  const QuantizedModel* draft_quant = nullptr;  // its quantized matrices, or null
  AcceptRule rule = AcceptRule::exact;
  bool enabled() const { return method != SpecMethod::none; }
  // Throws "[speculative] ..." naming the problem: k < 1, n-gram bounds, a missing draft, a
  // draft whose vocabulary or dtype differs from the target's.
  void validate(const model::ModelConfig& target, DType target_dtype) const;
  std::string describe() const;  // "draft k=4 (adaptive)", "ngram k=4 n=3..1"
};

// One sequence's request for proposals, and the proposer's answer.
struct ProposalRequest {
  int64_t id = -1;
  std::span<const int32_t> tokens;  // the sequence so far: prompt and output
  int64_t k = 0;                    // proposals wanted, at most
  const SamplingParams* params = nullptr;
  uint64_t seed = 0;
  int64_t index = 0;               // output position of the first proposal
  std::vector<int32_t> proposals;  // out
  // out: for each proposal, the distribution it was drawn from (V values each); empty when
  // proposals are certain (n-gram, greedy drafts), which the rule treats as q(d) = 1.
  std::vector<double> q;
};

class Proposer {
 public:
  virtual ~Proposer() = default;
  virtual void propose(std::span<ProposalRequest> reqs) = 0;
  // The sequence finished: forget it.
  virtual void release(int64_t /*id*/) {}
  virtual int64_t blocks_used() const { return 0; }  // of its own KV cache, if it has one
};

// Prompt lookup: the continuation of the most recent earlier occurrence of the sequence's
// last n tokens (n from n_max down to n_min), k tokens long; where it reaches the end of the
// sequence it repeats (a loop is proposed as a loop).
class NgramProposer : public Proposer {
 public:
  NgramProposer(int64_t n_max, int64_t n_min) : n_max_(n_max), n_min_(n_min) {}
  void propose(std::span<ProposalRequest> reqs) override;

 private:
  int64_t n_max_, n_min_;
};

// Runs the draft over its own paged cache (no prefix caching): each call first brings every
// sequence's draft K/V up to date (a new sequence's prompt is prefilled in chunks of
// max_batched_tokens; positions the target rejected are recomputed), then proposes k tokens one
// batched draft forward at a time.
class DraftProposer : public Proposer {
 public:
  DraftProposer(const model::Decoder& draft, const QuantizedModel* quant, int64_t num_blocks, int64_t block_size,
                int64_t max_batched_tokens, int64_t max_seqs);
  void propose(std::span<ProposalRequest> reqs) override;
  void release(int64_t id) override;
  int64_t blocks_used() const override { return kv_.pool().num_used(); }

 private:
  struct State {
    std::vector<int32_t> seen;  // tokens whose K/V the draft cache holds, in order
  };
  const model::Decoder& draft_;
  int64_t max_batched_tokens_, max_seqs_;
  KVCacheManager kv_;
  KVCache cache_;
  ModelRunner runner_;
  std::unordered_map<int64_t, State> states_;
};

std::unique_ptr<Proposer> make_proposer(const SpeculativeConfig& cfg, int64_t num_blocks, int64_t block_size,
                                        int64_t max_batched_tokens, int64_t max_seqs);

// The outcome of verifying one sequence's proposals.
struct Verdict {
  std::vector<int32_t> tokens;  // the accepted proposals, then one token of the target's
  int64_t accepted = 0;
  int64_t bad_row = -1;  // >= 0: that row's logits cannot be sampled; tokens is empty
};

// rows: the target's logits for the sequence's last token and its proposals, [m + 1, V] for m
// proposals; q: the proposals' distributions (m x V values), or empty when they are certain.
// Greedy requests keep proposals while they equal the target's greedy choice, then add that
// choice. Sampled ones accept proposal d with probability min(1, p(d) / q(d)) (p the target's
// sampling distribution, q the proposal's); on the first rejection they draw from
// norm(max(0, p - q)) and stop; when all are accepted they draw a bonus token from the last
// row exactly as plain sampling would. Every draw is a pure function of (seed, output
// position); `index` is the output position of the first proposal.
template <class T>
Verdict verify_proposals(const T* rows, int64_t V, const SamplingParams& params, uint64_t seed, int64_t index,
                         std::span<const int32_t> proposals, std::span<const double> q, AcceptRule rule);

// The uniform draw a draft uses to propose output position `index` of a request.
float draft_draw(uint64_t seed, int64_t index);

}  // namespace loom::infer

// Speculative decoding: configuration checks, the n-gram and draft-model proposers, and the
// verification rule.
#include "loom/infer/speculative.h"

#include <algorithm>

#include "loom/core/error.h"
#include "loom/core/rng.h"

namespace loom::infer {

// Stream ids of the speculative draws ("draft", "accept" hashed), apart from sampling's.
static constexpr uint64_t kDraftStream = 0x6472616674ull;
static constexpr uint64_t kAcceptStream = 0x616363657074ull;

float draft_draw(uint64_t seed, int64_t index) { return uniform01(seed, kDraftStream, uint64_t(index)); }

const char* spec_method_name(SpecMethod m) {
  switch (m) {
    case SpecMethod::draft: return "draft";
    case SpecMethod::ngram: return "ngram";
    default: return "none";
  }
}

void SpeculativeConfig::validate(const model::ModelConfig& target, DType target_dtype) const {
  if (!enabled()) return;
  LOOM_CHECK(k >= 1, "speculative", "k=", k, " must be at least 1 (proposals per step)");
  LOOM_CHECK(max_batch >= 0, "speculative", "max_batch=", max_batch, " must be >= 0 (0: no limit)");
  if (method == SpecMethod::ngram) {
    LOOM_CHECK(ngram_min >= 1 && ngram_max >= ngram_min, "speculative", "n-gram sizes n=", ngram_max, " (down to ",
               ngram_min, ") must satisfy n >= ", ngram_min, " >= 1");
    return;
  }
  LOOM_CHECK(draft, "speculative", "method draft needs a draft model (draft=DIR)");
  const model::ModelConfig& d = draft->config();
  LOOM_CHECK(d.vocab_size == target.vocab_size, "speculative", "the draft's vocabulary has ", d.vocab_size,
             " tokens but the target's has ", target.vocab_size,
             "; a draft must share the target's tokenizer and vocabulary");
  LOOM_CHECK(draft->params().dtype() == target_dtype, "speculative", "the draft's weights are ",
             dtype_name(draft->params().dtype()), " but the target's are ", dtype_name(target_dtype));
}

std::string SpeculativeConfig::describe() const {
  if (!enabled()) return "off";
  std::string s = str_cat(spec_method_name(method), " k=", k);
  if (method == SpecMethod::ngram) s += str_cat(" n=", ngram_max, "..", ngram_min);
  if (adaptive) s += " (adaptive)";
  if (max_batch > 0) s += str_cat(", off above ", max_batch, " sequences");
  return s;
}

void NgramProposer::propose(std::span<ProposalRequest> reqs) {
  for (ProposalRequest& r : reqs) {
    const auto& t = r.tokens;
    const int64_t len = int64_t(t.size());
    r.proposals.clear();
    r.q.clear();
    // The most recent earlier occurrence of the last n tokens, longest n first; its
    // continuation is the proposal (prompt lookup decoding).
    for (int64_t n = std::min(n_max_, len - 1); n >= n_min_ && r.proposals.empty(); --n) {
      const int32_t* pat = t.data() + (len - n);
      for (int64_t j = len - n - 1; j >= 0; --j) {
        if (!std::equal(pat, pat + n, t.data() + j)) continue;
        // A continuation that reaches the end of the sequence goes on with the proposals
        // themselves: a loop of period len - j - n is proposed k tokens ahead.
        for (int64_t i = j + n; int64_t(r.proposals.size()) < r.k; ++i)
          r.proposals.push_back(i < len ? t[size_t(i)] : r.proposals[size_t(i - len)]);
        break;
      }
    }
  }
}

DraftProposer::DraftProposer(const model::Decoder& draft, const QuantizedModel* quant, int64_t num_blocks,
                             int64_t block_size, int64_t max_batched_tokens, int64_t max_seqs)
    : draft_(draft),
      max_batched_tokens_(max_batched_tokens),
      max_seqs_(max_seqs),
      kv_(num_blocks, block_size, /*prefix_caching=*/false),
      cache_(draft.config(), num_blocks, block_size, draft.params().dtype()),
      runner_(draft, cache_, max_batched_tokens, max_seqs, quant) {}

void DraftProposer::release(int64_t id) {
  kv_.release(id);
  states_.erase(id);
}

namespace {
template <class T>
void draft_token(const T* row, int64_t V, ProposalRequest& r, std::vector<double>& probs,
                 std::vector<std::pair<T, int32_t>>& scratch) {
  const int64_t index = r.index + int64_t(r.proposals.size());
  if (r.params->greedy()) {
    const int32_t t = sample_token(row, V, *r.params, 0.f, scratch);
    if (t >= 0) r.proposals.push_back(t);
    return;
  }
  if (!sampling_distribution(row, V, *r.params, probs, scratch)) return;
  r.proposals.push_back(draw_from(probs, draft_draw(r.seed, index)));
  r.q.insert(r.q.end(), probs.begin(), probs.end());
}
}  // namespace

void DraftProposer::propose(std::span<ProposalRequest> reqs) {
  const int64_t V = draft_.config().vocab_size, ctx = draft_.config().n_ctx;
  // Each sequence's tokens as the draft sees them: the request's, then its proposals so far.
  std::vector<std::vector<int32_t>> work(reqs.size());
  std::vector<char> active(reqs.size(), 0);
  for (size_t i = 0; i < reqs.size(); ++i) {
    ProposalRequest& r = reqs[i];
    r.proposals.clear();
    r.q.clear();
    const int64_t len = int64_t(r.tokens.size());
    r.k = std::min(r.k, ctx - len);  // the draft's own context bounds its positions
    if (r.k <= 0) continue;
    State& s = states_[r.id];
    // K/V stay valid for the longest common prefix of what the draft saw and the sequence now.
    const size_t keep =
        size_t(std::mismatch(s.seen.begin(), s.seen.end(), r.tokens.begin(), r.tokens.end()).first - s.seen.begin());
    s.seen.resize(std::min(keep, size_t(len - 1)));  // the last token is always computed
    kv_.truncate(r.id, int64_t(s.seen.size()));
    work[i].assign(r.tokens.begin(), r.tokens.end());
    active[i] = 1;
  }
  std::vector<double> probs;
  std::vector<std::pair<float, int32_t>> scratch_f;
  std::vector<std::pair<double, int32_t>> scratch_d;
  for (;;) {
    // One batched draft forward: each active sequence computes what it lacks, up to the budget.
    StepPlan plan;
    std::vector<size_t> who;
    int64_t budget = max_batched_tokens_;
    for (size_t i = 0; i < reqs.size() && budget > 0 && int64_t(plan.seqs.size()) < max_seqs_; ++i) {
      if (!active[i]) continue;
      State& s = states_[reqs[i].id];
      const int64_t start = int64_t(s.seen.size());
      const int64_t n = std::min(int64_t(work[i].size()) - start, budget);
      auto a = kv_.allocate_slots(reqs[i].id, start, n);
      if (!a) {  // the draft's cache is full: this sequence proposes what it has
        active[i] = 0;
        continue;
      }
      ScheduledSeq q;
      q.seq_id = reqs[i].id;
      q.start = start;
      q.num_tokens = n;
      q.sample = start + n == int64_t(work[i].size());
      plan.copies.insert(plan.copies.end(), a->copies.begin(), a->copies.end());
      plan.seqs.push_back(std::move(q));
      who.push_back(i);
      budget -= n;
    }
    if (plan.empty()) break;
    for (size_t j = 0; j < plan.seqs.size(); ++j) {
      ScheduledSeq& q = plan.seqs[j];
      q.block_table = kv_.block_table(q.seq_id);
      q.tokens = std::span<const int32_t>(work[who[j]]).subspan(size_t(q.start), size_t(q.num_tokens));
    }
    const Tensor logits = runner_.execute(plan);
    int64_t row = 0;
    for (size_t j = 0; j < plan.seqs.size(); ++j) {
      const ScheduledSeq& q = plan.seqs[j];
      const size_t i = who[j];
      ProposalRequest& r = reqs[i];
      State& s = states_[r.id];
      s.seen.insert(s.seen.end(), q.tokens.begin(), q.tokens.end());
      if (!q.sample) continue;
      const size_t before = r.proposals.size();
      if (logits.dtype() == DType::f32)
        draft_token(logits.data<float>() + row * V, V, r, probs, scratch_f);
      else
        draft_token(logits.data<double>() + row * V, V, r, probs, scratch_d);
      ++row;
      if (r.proposals.size() == before || int64_t(r.proposals.size()) >= r.k) {
        active[i] = 0;  // done (or the draft's logits were not finite: it proposes what it has)
        continue;
      }
      work[i].push_back(r.proposals.back());
    }
  }
}

std::unique_ptr<Proposer> make_proposer(const SpeculativeConfig& cfg, int64_t num_blocks, int64_t block_size,
                                        int64_t max_batched_tokens, int64_t max_seqs) {
  switch (cfg.method) {
    case SpecMethod::ngram: return std::make_unique<NgramProposer>(cfg.ngram_max, cfg.ngram_min);
    case SpecMethod::draft:
      return std::make_unique<DraftProposer>(*cfg.draft, cfg.draft_quant, num_blocks, block_size, max_batched_tokens,
                                             max_seqs);
    default: return nullptr;
  }
}

template <class T>
Verdict verify_proposals(const T* rows, int64_t V, const SamplingParams& sp, uint64_t seed, int64_t first,
                         std::span<const int32_t> proposals, std::span<const double> qs, AcceptRule rule) {
  static thread_local std::vector<std::pair<T, int32_t>> scratch;
  static thread_local std::vector<double> p;
  Verdict v;
  const int64_t m = int64_t(proposals.size());
  for (int64_t i = 0; i < m; ++i) {
    const T* row = rows + i * V;
    const int32_t d = proposals[size_t(i)];
    const int64_t index = first + i;
    if (sp.greedy()) {
      const int32_t t = sample_token(row, V, sp, 0.f, scratch);
      if (t == kNonFiniteLogits) return {{}, 0, i};
      if (t == d || rule == AcceptRule::accept_all) {
        v.tokens.push_back(d);
        continue;
      }
      v.tokens.push_back(t);  // the target's choice ends the run
      v.accepted = i;
      return v;
    }
    if (!sampling_distribution(row, V, sp, p, scratch)) return {{}, 0, i};
    const double* q = qs.empty() ? nullptr : qs.data() + i * V;
    const double qd = q ? q[d] : 1.0;
    if (rule == AcceptRule::accept_all || double(uniform01(seed, kAcceptStream, uint64_t(index))) * qd < p[size_t(d)]) {
      v.tokens.push_back(d);
      continue;
    }
    // Rejected: the residual max(0, p - q), which is positive somewhere since p(d) < q(d).
    double total = 0;
    for (int64_t t = 0; t < V; ++t) {
      const double w = std::max(0.0, p[size_t(t)] - (q ? q[t] : (t == d ? 1.0 : 0.0)));
      p[size_t(t)] = w;
      total += w;
    }
    if (total <= 0) sampling_distribution(row, V, sp, p, scratch);  // rounding: p == q
    v.tokens.push_back(draw_from(p, sampling_draw(seed, index)));
    v.accepted = i;
    return v;
  }
  // Every proposal accepted: a bonus token from the last row, drawn as plain sampling draws.
  const int32_t t = sample_token(rows + m * V, V, sp, sampling_draw(seed, first + m), scratch);
  if (t == kNonFiniteLogits) return {{}, 0, m};
  v.tokens.push_back(t);
  v.accepted = m;
  return v;
}

template Verdict verify_proposals<float>(const float*, int64_t, const SamplingParams&, uint64_t, int64_t,
                                         std::span<const int32_t>, std::span<const double>, AcceptRule);
template Verdict verify_proposals<double>(const double*, int64_t, const SamplingParams&, uint64_t, int64_t,
                                          std::span<const int32_t>, std::span<const double>, AcceptRule);

}  // namespace loom::infer

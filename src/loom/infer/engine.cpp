// Engine: request validation and intake, the step loop body (schedule -> forward -> sample ->
// stream -> retire), stop conditions, and the metrics snapshot other threads read.
#include "loom/infer/engine.h"

#include <algorithm>
#include <cmath>
#include <type_traits>

#include "loom/core/error.h"
#include "loom/core/rng.h"
#include "loom/core/timer.h"
#include "loom/infer/wire.h"

namespace loom::infer {

const char* finish_reason_name(FinishReason r) {
  switch (r) {
    case FinishReason::stop: return "stop";
    case FinishReason::length: return "length";
    case FinishReason::abort: return "abort";
    case FinishReason::error: return "error";
    default: return "none";
  }
}

namespace {
uint64_t derive_seed(uint64_t engine_seed, int64_t id) {
  return splitmix64_mix(engine_seed ^ (uint64_t(id) * 0x9e3779b97f4a7c15ull));
}
}  // namespace

Engine::Engine(const model::Decoder& model, const EngineConfig& cfg) : model_(model), cfg_(cfg) {
  const model::ModelConfig& mc = model.config();
  LOOM_CHECK(cfg.block_size > 0, "engine", "block_size must be positive, got ", cfg.block_size);
  LOOM_CHECK(cfg.max_num_seqs > 0, "engine", "max_num_seqs must be positive, got ", cfg.max_num_seqs);
  LOOM_CHECK(cfg.max_batched_tokens > 0, "engine", "max_batched_tokens must be positive, got ", cfg.max_batched_tokens);
  LOOM_CHECK(cfg.chunked_prefill || cfg.max_batched_tokens >= mc.n_ctx, "engine",
             "max_batched_tokens=", cfg.max_batched_tokens, " is below model.n_ctx=", mc.n_ctx,
             ": without chunked prefill a long prompt could never run; enable chunked_prefill "
             "or raise max_batched_tokens");
  LOOM_CHECK(cfg.max_seq_len >= 0 && cfg.max_seq_len <= mc.n_ctx, "engine", "max_seq_len=", cfg.max_seq_len,
             " must lie in [1, model.n_ctx=", mc.n_ctx, "] (0: model.n_ctx)");
  max_seq_len_ = cfg.max_seq_len > 0 ? cfg.max_seq_len : mc.n_ctx;
  const DType dt = model.params().dtype();
  const model::ModelConfig kv = ModelRunner::kv_cache_config(model);  // this rank's kv heads
  if (model.layout().slice().tp > 1) {
    LOOM_CHECK(cfg.tp && cfg.tp->size() == model.layout().slice().tp, "engine",
               "the model is a tensor-parallel slice of ", model.layout().slice().tp,
               " ranks; give the engine that tp group (EngineConfig::tp)");
    tp_ = cfg.tp;
  }
  const int64_t bpb = KVCache::bytes_per_block(kv, cfg.block_size, dt);
  const int64_t num_blocks = cfg.num_blocks > 0 ? cfg.num_blocks : cfg.kv_cache_bytes / bpb;
  const int64_t need = KVCache::blocks_for_tokens(max_seq_len_, cfg.block_size);
  LOOM_CHECK(num_blocks >= need, "engine", "the KV cache holds ", num_blocks, " blocks of ", cfg.block_size,
             " tokens (", format_bytes(num_blocks * bpb), ") but one full-length sequence of ",
             cfg.max_seq_len > 0 ? "max_seq_len=" : "model.n_ctx=", max_seq_len_, " tokens needs ", need,
             " blocks; raise the KV cache to at least ", format_bytes(need * bpb), " (", need, " blocks)");
  cache_ = std::make_unique<KVCache>(kv, num_blocks, cfg.block_size, dt);
  SchedulerConfig sc;
  sc.max_num_seqs = cfg.max_num_seqs;
  sc.max_batched_tokens = cfg.max_batched_tokens;
  sc.num_blocks = num_blocks;
  sc.block_size = cfg.block_size;
  sc.prefix_caching = cfg.prefix_caching;
  sc.chunked_prefill = cfg.chunked_prefill;
  sc.mode = cfg.mode;
  sched_ = std::make_unique<Scheduler>(sc);
  const SpeculativeConfig& spec = cfg.speculative;
  spec.validate(mc, dt);
  // Speculation asks for logits of every proposal and of the token before them.
  const int64_t logit_rows =
      spec.enabled() ? std::min(cfg.max_batched_tokens, cfg.max_num_seqs * (1 + spec.k)) : cfg.max_num_seqs;
  runner_ = std::make_unique<ModelRunner>(model, *cache_, cfg.max_batched_tokens, cfg.max_num_seqs, cfg.quant,
                                          std::max(logit_rows, cfg.max_num_seqs), tp_);
  // The draft's cache holds whatever the target's does, and each sequence's proposals.
  proposer_ =
      make_proposer(spec, num_blocks + cfg.max_num_seqs * (KVCache::blocks_for_tokens(spec.k, cfg.block_size) + 1),
                    cfg.block_size, cfg.max_batched_tokens, cfg.max_num_seqs);
  publish_metrics();
}

Engine::~Engine() {
  try {
    close();
  } catch (...) {
  }
}

int64_t Engine::add_request(std::vector<int32_t> prompt, const SamplingParams& params, TokenCallback callback) {
  LOOM_CHECK(leader(), "engine", "requests of a tensor-parallel engine are added on rank 0, which leads; rank ",
             tp_ ? tp_->rank() : 0, " follows it (follow())");
  LOOM_CHECK(!closed_, "engine", "the engine was closed; no more requests");
  params.validate();
  const model::ModelConfig& mc = model_.config();
  const int64_t len = int64_t(prompt.size());
  LOOM_CHECK(len > 0, "engine", "the prompt is empty; give at least one token");
  LOOM_CHECK(len <= mc.n_ctx, "engine", "the prompt has ", len, " tokens, longer than the model's context of ",
             mc.n_ctx, " tokens (model.n_ctx); shorten it (prompts are never truncated)");
  LOOM_CHECK(len < mc.n_ctx, "engine", "the prompt has ", len, " tokens, which fills the model's context of ", mc.n_ctx,
             " tokens (model.n_ctx) and leaves no room to generate; shorten it");
  LOOM_CHECK(len < max_seq_len_, "engine", "the prompt has ", len, " tokens, which fills this engine's ", max_seq_len_,
             "-token sequences (EngineConfig::max_seq_len) and leaves no room to generate; "
             "shorten it or raise max_seq_len");
  for (int64_t i = 0; i < len; ++i)
    LOOM_CHECK(prompt[size_t(i)] >= 0 && prompt[size_t(i)] < mc.vocab_size, "engine", "prompt token ",
               prompt[size_t(i)], " at position ", i, " is outside the vocabulary [0, ", mc.vocab_size, ")");
  LOOM_CHECK(params.stop.empty() || cfg_.detokenizer, "sampling",
             "stop strings need a detokenizer: set EngineConfig::detokenizer (or use "
             "stop_token_ids)");
  const int64_t id = next_id_++;
  Request r;
  r.params = params;
  r.stops = StopStringMatcher(params.stop);
  if (r.stops.active()) r.text = DecodeStream(cfg_.detokenizer);
  r.seed = params.seed ? *params.seed : derive_seed(cfg_.seed, id);
  r.callback = std::move(callback);
  r.max_tokens = std::min(params.max_tokens, max_seq_len_ - len);
  r.spec_k = cfg_.speculative.k;
  r.prompt = std::move(prompt);
  std::lock_guard<std::mutex> lock(mu_);
  intake_.push_back({id, std::move(r)});
  ++in_flight_;
  return id;
}

void Engine::abort(int64_t id) {
  std::lock_guard<std::mutex> lock(mu_);
  aborts_.push_back(id);
}

bool Engine::has_unfinished() const { return in_flight_.load() > 0; }

EngineMetrics Engine::metrics() const {
  std::lock_guard<std::mutex> lock(mu_);
  return metrics_;
}

void Engine::admit_pending(std::vector<RequestOutput>& done) {
  std::vector<Pending> intake;
  std::vector<int64_t> aborts;
  {
    std::lock_guard<std::mutex> lock(mu_);
    intake.swap(intake_);
    aborts.swap(aborts_);
  }
  if (tp_) sync_intake(intake, aborts, /*closing=*/false);
  for (auto& p : intake) {
    prompt_tokens_ += int64_t(p.req.prompt.size());
    sched_->add(p.id, p.req.prompt);
    requests_.emplace(p.id, std::move(p.req));
  }
  for (int64_t id : aborts)
    if (requests_.count(id)) finish(id, FinishReason::abort, true, done);
}

void Engine::finish(int64_t id, FinishReason why, bool end_event, std::vector<RequestOutput>& done, int32_t stop_token,
                    std::string stop_string, std::string error) {
  auto it = requests_.find(id);
  Request& r = it->second;
  if (end_event && r.callback) r.callback({id, -1, int64_t(r.output.size()), why, error});
  RequestOutput out;
  out.id = id;
  out.prompt = std::move(r.prompt);
  out.tokens = std::move(r.output);
  out.finish_reason = why;
  out.stop_token = stop_token;
  out.stop_string = std::move(stop_string);
  out.error = std::move(error);
  out.num_preemptions = sched_->has(id) ? sched_->num_preemptions(id) : 0;
  sched_->finish(id);
  if (proposer_) proposer_->release(id);
  requests_.erase(it);
  done.push_back(std::move(out));
  ++finished_;
  --in_flight_;
}

bool Engine::hits_stop_string(Request& r, std::string* which) const {
  // A short window of the output is decoded per token, not all of it (decode_stream.h).
  r.stops.push(r.text.push(r.output.back()));
  if (r.stops.stopped()) *which = r.stops.stop();
  return r.stops.stopped();
}

bool Engine::take_token(int64_t id, Request& r, int32_t tok, bool last, std::vector<RequestOutput>& done, double prob) {
  const int64_t index = int64_t(r.output.size());
  ++generated_tokens_;
  const auto& stops = r.params.stop_token_ids;
  if (std::find(stops.begin(), stops.end(), tok) != stops.end()) {
    finish(id, FinishReason::stop, true, done, tok);
    return false;
  }
  r.output.push_back(tok);
  std::string which;
  FinishReason why = FinishReason::none;
  if (r.stops.active() && hits_stop_string(r, &which))
    why = FinishReason::stop;
  else if (int64_t(r.output.size()) >= r.max_tokens)
    why = FinishReason::length;
  if (why == FinishReason::none && last) sched_->append_token(id, tok);
  if (r.callback) r.callback({id, tok, index, why, {}, prob});
  if (why == FinishReason::none) return true;
  finish(id, why, false, done, -1, std::move(which));
  return false;
}

void Engine::adapt_k(Request& r, int64_t proposed, int64_t accepted) const {
  const SpeculativeConfig& sc = cfg_.speculative;
  if (!sc.adaptive) return;
  // Decayed counts; with acceptance rate a per proposal, a run of accepted proposals is
  // a / (1 - a) long on average: propose one more than that.
  r.spec_accepted = 0.8 * r.spec_accepted + double(accepted);
  r.spec_rejected = 0.8 * r.spec_rejected + (accepted < proposed ? 1.0 : 0.0);
  if (r.spec_rejected <= 0) {
    r.spec_k = sc.k;
    return;
  }
  // Below kMinAcceptance a proposal costs more than it returns (its row of the target's
  // forward, the draft's step): the request stops proposing and probes with one proposal
  // every kProbeEvery steps.
  constexpr double kMinAcceptance = 0.25;
  constexpr int64_t kProbeEvery = 8;
  if (r.spec_accepted / (r.spec_accepted + r.spec_rejected) < kMinAcceptance && r.spec_rejected >= 2) {
    r.spec_k = 0;
    r.spec_wait = kProbeEvery;
    return;
  }
  const double run = r.spec_accepted / r.spec_rejected;
  r.spec_k = std::clamp<int64_t>(int64_t(std::llround(run)) + 1, 1, sc.k);
}

void Engine::propose() {
  const SpeculativeConfig& sc = cfg_.speculative;
  const std::vector<int64_t>& running = sched_->running();
  if (sc.max_batch > 0 && int64_t(running.size()) > sc.max_batch) return;
  std::vector<ProposalRequest> reqs;
  for (int64_t id : running) {
    if (!sched_->decoding(id)) continue;
    Request& r = requests_.at(id);
    if (!r.params.speculate) continue;
    if (r.spec_k == 0 && --r.spec_wait > 0) continue;  // adapt_k turned it off; probe now and then
    const std::vector<int32_t>& toks = sched_->tokens(id);
    const int64_t out = int64_t(r.output.size());
    const int64_t k =
        std::min({std::max<int64_t>(r.spec_k, 1), r.max_tokens - out - 1, max_seq_len_ - int64_t(toks.size())});
    if (k < 1) continue;
    ProposalRequest q;
    q.id = id;
    q.tokens = toks;
    q.k = k;
    q.params = &r.params;
    q.seed = r.seed;
    q.index = out;
    reqs.push_back(std::move(q));
  }
  if (reqs.empty()) return;
  // Tensor parallel: every rank lists the same requests. n-gram proposals are integer work,
  // the same everywhere; a draft's floats could differ between hosts (kernels chosen by CPU),
  // so the leader's proposals are broadcast instead.
  const bool from_leader = tp_ && sc.method == SpecMethod::draft;
  Stopwatch sw;
  if (!from_leader || leader()) proposer_->propose(reqs);
  if (from_leader) {
    ByteWriter w;
    if (leader())
      for (const ProposalRequest& q : reqs) {
        w.put_vec(q.proposals);
        w.put_vec(q.q);
      }
    share_from_leader(w.bytes());
    ByteReader rd(w.bytes());
    if (!leader())
      for (ProposalRequest& q : reqs) {
        q.proposals = rd.get_vec<int32_t>();
        q.q = rd.get_vec<double>();
      }
  }
  spec_propose_s_ += sw.seconds();
  for (ProposalRequest& q : reqs) {
    if (q.proposals.empty()) continue;
    Request& r = requests_.at(q.id);
    r.proposals = std::move(q.proposals);
    r.proposal_q = std::move(q.q);
    sched_->propose(q.id, r.proposals);
  }
}

template <class T>
void Engine::sample_all(const StepPlan& plan, const Tensor& logits, std::vector<RequestOutput>& done) {
  const int64_t V = model_.config().vocab_size;
  const T* rows = logits.numel() ? logits.data<T>() : nullptr;
  // First every sequence's tokens, in parallel: a draw is a pure function of the rows'
  // logits, the request's parameters and (seed, position), so the order of computation
  // changes nothing. Then, in plan order, what the tokens do to their requests.
  struct Job {
    const ScheduledSeq* seq;
    const Request* req;
    int64_t row;
  };
  std::vector<Job> jobs;
  int64_t row = 0;
  for (const ScheduledSeq& s : plan.seqs)
    if (s.sample) {
      jobs.push_back({&s, &requests_.at(s.seq_id), row});
      row += 1 + s.num_spec;
    }
  std::vector<Verdict> verdicts(jobs.size());
  std::vector<std::vector<double>> probs(jobs.size());  // SamplingParams::token_probs
  const AcceptRule rule = cfg_.speculative.rule;
#pragma omp parallel for schedule(dynamic, 1) if (jobs.size() > 1)
  for (size_t j = 0; j < jobs.size(); ++j) {
    const Request& r = *jobs[j].req;
    const T* at = rows + jobs[j].row * V;
    const int64_t index = int64_t(r.output.size()), m = jobs[j].seq->num_spec;
    if (m == 0) {
      static thread_local std::vector<std::pair<T, int32_t>> scratch;
      const int32_t tok = sample_token<T>(at, V, r.params, sampling_draw(r.seed, index), scratch);
      verdicts[j] = tok == kNonFiniteLogits ? Verdict{{}, 0, 0} : Verdict{{tok}, 0, -1};
    } else {
      const std::span<const double> q(r.proposal_q);
      verdicts[j] =
          verify_proposals<T>(at, V, r.params, r.seed, index, std::span<const int32_t>(r.proposals).first(size_t(m)),
                              q.empty() ? q : q.first(size_t(m * V)), rule);
    }
    if (r.params.token_probs && verdicts[j].bad_row < 0)
      for (size_t t = 0; t < verdicts[j].tokens.size(); ++t)
        probs[j].push_back(token_probability<T>(at + int64_t(t) * V, V, verdicts[j].tokens[t]));
  }
  for (size_t j = 0; j < jobs.size(); ++j) {
    const ScheduledSeq& s = *jobs[j].seq;
    const int64_t id = s.seq_id;
    Request& r = requests_.at(id);
    const Verdict& v = verdicts[j];
    if (v.bad_row >= 0) {
      // Nothing can be sampled from this row; the request fails alone (others may be fine).
      const int64_t n_prompt = int64_t(r.prompt.size()), index = int64_t(r.output.size());
      finish(id, FinishReason::error, true, done, -1, {},
             str_cat("the model's logits for position ", n_prompt + index + v.bad_row, " (after ", n_prompt,
                     " prompt and ", index, " generated tokens", v.bad_row > 0 ? " and accepted proposals" : "",
                     ") are ", describe_non_finite(rows + (jobs[j].row + v.bad_row) * V, V),
                     ": the model's weights, or the activations they produce, are not finite"));
      continue;
    }
    if (s.num_spec > 0) {
      sched_->settle(id, v.accepted);
      spec_proposed_ += s.num_spec;
      spec_accepted_ += v.accepted;
      ++spec_verifications_;
      adapt_k(r, s.num_spec, v.accepted);
    }
    for (size_t t = 0; t < v.tokens.size(); ++t)
      if (!take_token(id, r, v.tokens[t], t + 1 == v.tokens.size(), done,
                      t < probs[j].size() ? probs[j][t] : std::numeric_limits<double>::quiet_NaN()))
        break;
  }
}

std::vector<RequestOutput> Engine::step() {
  std::vector<RequestOutput> done;
  LOOM_CHECK(!(closed_ && leader()), "engine", "step() after close(): the followers have been released");
  admit_pending(done);
  if (closed_) return done;  // a follower released by the leader
  if (proposer_) propose();
  StepPlan plan = sched_->schedule();
  if (!plan.empty()) {
    const Tensor logits = runner_->execute(plan);
    sched_->complete(plan);
    for (const ScheduledSeq& s : plan.seqs) decode_rows_ += s.sample && s.num_tokens == 1 ? 1 : 0;
    if (logits.dtype() == DType::f32)
      sample_all<float>(plan, logits, done);
    else
      sample_all<double>(plan, logits, done);
    ++steps_;
  }
  publish_metrics();
  return done;
}

void Engine::publish_metrics() {
  const SchedulerStats st = sched_->stats();
  std::lock_guard<std::mutex> lock(mu_);
  metrics_.num_running = st.num_running;
  metrics_.num_waiting = st.num_waiting + int64_t(intake_.size());
  metrics_.kv_blocks_used = st.blocks_used;
  metrics_.kv_blocks_total = st.blocks_total;
  metrics_.prompt_tokens = prompt_tokens_;
  metrics_.generated_tokens = generated_tokens_;
  metrics_.prefix_hit_tokens = st.prefix_hit_tokens;
  metrics_.num_preemptions = st.num_preemptions;
  metrics_.steps = steps_;
  metrics_.requests_finished = finished_;
  metrics_.kv_slots_unused = st.slots_allocated - st.tokens_cached;
  metrics_.decode_rows = decode_rows_;
  metrics_.spec_proposed = spec_proposed_;
  metrics_.spec_accepted = spec_accepted_;
  metrics_.spec_verifications = spec_verifications_;
  metrics_.spec_propose_s = spec_propose_s_;
  metrics_.draft_kv_blocks_used = proposer_ ? proposer_->blocks_used() : 0;
}

RequestOutput Engine::run(const std::vector<int32_t>& prompt, const SamplingParams& params, TokenCallback callback) {
  const int64_t id = add_request(prompt, params, std::move(callback));
  for (;;)
    for (auto& out : step())
      if (out.id == id) return std::move(out);
}

std::vector<int32_t> Engine::generate(const std::vector<int32_t>& prompt, const SamplingParams& params,
                                      TokenCallback callback) {
  RequestOutput out = run(prompt, params, std::move(callback));
  if (out.finish_reason == FinishReason::error) fail("engine", out.error);
  return std::move(out.tokens);
}

}  // namespace loom::infer

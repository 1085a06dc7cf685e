// Engine: the inference API. add_request() and abort() may be called from any thread; one
// loop thread calls step(), which admits new requests, schedules, runs the model, samples,
// streams each token to the request's callback (on the stepping thread) and retires finished
// requests. Also a blocking generate() for tools that run one request at a time.
// Tensor parallel (EngineConfig::tp, a model holding one tp slice): every rank of the group
// runs an Engine and they step together. Rank 0 leads: requests and aborts are added there
// only, and each step first broadcasts what it admits, so every rank schedules, computes and
// samples the same (the logits are all-gathered, the draws are pure functions); the other
// ranks call follow() until the leader's close().
#pragma once
#include <atomic>
#include <cstdint>
#include <functional>
#include <limits>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "loom/infer/decode_stream.h"
#include "loom/infer/finish_reason.h"
#include "loom/infer/kv_cache.h"
#include "loom/infer/model_runner.h"
#include "loom/infer/quant_weights.h"
#include "loom/infer/sampler.h"
#include "loom/infer/scheduler.h"
#include "loom/infer/speculative.h"
#include "loom/infer/stop_strings.h"
#include "loom/model/decoder.h"

namespace loom::infer {

struct EngineConfig {
  int64_t block_size = 16;
  int64_t num_blocks = 0;  // 0: as many as kv_cache_bytes holds
  int64_t kv_cache_bytes = int64_t(512) << 20;
  // Tokens of one sequence (prompt + output) at most; 0: model.n_ctx. The cache must hold one
  // such sequence; outputs stop there (finish reason length) as they would at the context.
  int64_t max_seq_len = 0;
  int64_t max_num_seqs = 32;
  int64_t max_batched_tokens = 2048;
  bool prefix_caching = true;
  bool chunked_prefill = true;
  BatchingMode mode = BatchingMode::continuous;
  uint64_t seed = 0;  // requests without a seed get one derived from this and their id
  // The bytes of a token sequence, for stop strings (matched in the output's text decoded on
  // its own, piece by piece as decode_stream.h does); may be empty otherwise.
  Detokenizer detokenizer;
  // Quantized matrices of the engine's model (QuantizedModel::quantize or a quantized
  // checkpoint), outliving the engine; null: the model's f32 weights.
  const QuantizedModel* quant = nullptr;
  // Speculative decoding (speculative.h): off by default.
  SpeculativeConfig speculative;
  // The tensor-parallel group, when the model is a tp slice (its size and rank the slice's);
  // outlives the engine.
  const comm::Group* tp = nullptr;
};

// One streamed event. token is -1 when the event only ends the stream (a stop token, an
// abort); finish is none until the request's last event.
struct TokenEvent {
  int64_t request_id = -1;
  int32_t token = -1;
  int64_t index = 0;  // position of the token in the output
  FinishReason finish = FinishReason::none;
  std::string error;  // finish == error: what went wrong (as RequestOutput::error)
  // SamplingParams::token_probs: the token's probability under the model (NaN otherwise).
  double prob = std::numeric_limits<double>::quiet_NaN();
};
using TokenCallback = std::function<void(const TokenEvent&)>;

struct RequestOutput {
  int64_t id = -1;
  std::vector<int32_t> prompt, tokens;
  FinishReason finish_reason = FinishReason::none;
  int32_t stop_token = -1;  // the stop token that ended it, if one did
  std::string stop_string;  // the stop string that ended it, if one did
  // finish_reason == error: what went wrong, without a "[where]" prefix, e.g. "the model's
  // logits for position 12 (after 12 prompt and 0 generated tokens) are NaN: ...".
  std::string error;
  int64_t num_preemptions = 0;
};

struct EngineMetrics {
  int64_t num_running = 0, num_waiting = 0;
  int64_t kv_blocks_used = 0, kv_blocks_total = 0;
  int64_t prompt_tokens = 0;      // prompt tokens of admitted requests
  int64_t generated_tokens = 0;   // tokens sampled
  int64_t prefix_hit_tokens = 0;  // prompt tokens whose K/V came from the prefix cache
  int64_t num_preemptions = 0;
  int64_t steps = 0;
  int64_t requests_finished = 0;
  int64_t kv_slots_unused = 0;  // allocated slots of running sequences holding no token
  int64_t decode_rows = 0;      // one-token rows of generating sequences computed
  // Speculative decoding: tokens proposed and scored by the target, how many it accepted,
  // the sequence-steps that verified proposals (each emits accepted + 1 tokens), and the
  // seconds spent proposing.
  int64_t spec_proposed = 0, spec_accepted = 0, spec_verifications = 0;
  double spec_propose_s = 0;
  int64_t draft_kv_blocks_used = 0;  // blocks of the draft model's own cache in use
};

class Engine {
 public:
  // Throws at construction when the KV cache cannot hold one sequence of max_seq_len tokens.
  Engine(const model::Decoder& model, const EngineConfig& cfg);
  ~Engine();

  // Validates (throws "[engine] ..." or "[sampling] ..." naming the problem) and queues.
  int64_t add_request(std::vector<int32_t> prompt, const SamplingParams& params, TokenCallback callback = {});
  // Ends a request at the next step (no-op for unknown or finished ids).
  void abort(int64_t id);
  // One scheduling step; returns the requests that finished (or were aborted) in it.
  std::vector<RequestOutput> step();
  bool has_unfinished() const;
  EngineMetrics metrics() const;

  // Run one request to completion by stepping the engine themselves (outputs of other
  // requests finishing meanwhile are dropped). Not for use while another thread steps.
  // run() returns a failed request's output (finish_reason error, with the reason);
  // generate() throws it as "[engine] ...".
  RequestOutput run(const std::vector<int32_t>& prompt, const SamplingParams& params, TokenCallback callback = {});
  std::vector<int32_t> generate(const std::vector<int32_t>& prompt, const SamplingParams& params,
                                TokenCallback callback = {});

  // Tensor parallel. follow(): a rank other than 0 steps with the leader until it closes;
  // close(): the leader releases the followers (call it from the thread that steps, once no
  // more steps will run; the destructor does when it was not called).
  bool leader() const { return !tp_ || tp_->rank() == 0; }
  void follow();
  void close();

  const EngineConfig& config() const { return cfg_; }
  const model::ModelConfig& model_config() const { return model_.config(); }
  int64_t max_seq_len() const { return max_seq_len_; }  // EngineConfig::max_seq_len resolved
  const Scheduler& scheduler() const { return *sched_; }
  const KVCache& kv_cache() const { return *cache_; }
  int64_t weight_bytes_per_token() const { return runner_->weight_bytes_per_token(); }

 private:
  struct Request {
    SamplingParams params;
    uint64_t seed = 0;
    TokenCallback callback;
    std::vector<int32_t> prompt, output;
    int64_t max_tokens = 0;   // after capping at the context
    DecodeStream text;        // the output's bytes, when there are stop strings
    StopStringMatcher stops;  // over those bytes
    // Speculative decoding: the proposals handed to the scheduler (and the distributions
    // they were drawn from), the request's current k (0: off, probing when spec_wait steps
    // have passed), and its decayed counts of accepted proposals and of rejections (its
    // acceptance rate, for adaptive k).
    std::vector<int32_t> proposals;
    std::vector<double> proposal_q;
    int64_t spec_k = 0, spec_wait = 0;
    double spec_accepted = 0, spec_rejected = 0;
  };
  struct Pending {
    int64_t id;
    Request req;
  };
  void admit_pending(std::vector<RequestOutput>& done);
  // Tensor parallel: the leader broadcasts the intake and aborts it is about to admit (and
  // whether it closes); the followers receive them in their place. Returns false on close.
  bool sync_intake(std::vector<Pending>& intake, std::vector<int64_t>& aborts, bool closing);
  // Tensor parallel: the leader's bytes reach every rank (the followers' are replaced).
  void share_from_leader(std::vector<uint8_t>& bytes) const;
  template <class T>
  void sample_all(const StepPlan& plan, const Tensor& logits, std::vector<RequestOutput>& done);
  // Retires a request; end_event sends the callback a closing event without a token.
  void finish(int64_t id, FinishReason why, bool end_event, std::vector<RequestOutput>& done, int32_t stop_token = -1,
              std::string stop_string = {}, std::string error = {});
  bool hits_stop_string(Request& r, std::string* which) const;
  // Speculative decoding: proposals for the decoding sequences that speculate.
  void propose();
  // What one emitted token does to its request: returns false when the request has ended.
  // `last`: the token is not already in the scheduler's sequence (it is appended there).
  // prob: the token's probability when the request asked for it (TokenEvent::prob).
  bool take_token(int64_t id, Request& r, int32_t tok, bool last, std::vector<RequestOutput>& done, double prob);
  void adapt_k(Request& r, int64_t proposed, int64_t accepted) const;
  void publish_metrics();

  const model::Decoder& model_;
  EngineConfig cfg_;
  int64_t max_seq_len_ = 0;
  std::unique_ptr<KVCache> cache_;
  std::unique_ptr<Scheduler> sched_;
  std::unique_ptr<ModelRunner> runner_;
  std::unique_ptr<Proposer> proposer_;
  const comm::Group* tp_ = nullptr;  // set when the group has more than one rank
  bool closed_ = false;
  std::unordered_map<int64_t, Request> requests_;  // stepping thread only

  mutable std::mutex mu_;  // guards the intake, the abort list and the metrics snapshot
  std::vector<Pending> intake_;
  std::vector<int64_t> aborts_;
  EngineMetrics metrics_;
  std::atomic<int64_t> next_id_{0};
  std::atomic<int64_t> in_flight_{0};  // added and not yet finished
  int64_t prompt_tokens_ = 0, generated_tokens_ = 0, steps_ = 0, finished_ = 0;
  int64_t decode_rows_ = 0;
  int64_t spec_proposed_ = 0, spec_accepted_ = 0, spec_verifications_ = 0;
  double spec_propose_s_ = 0;
};

}  // namespace loom::infer

// Scheduler: decides each step which sequences run and how many tokens each computes, within
// max_num_seqs and max_batched_tokens, allocating KV blocks through the KVCacheManager, and
// returns it all as a plain StepPlan. Continuous (iteration-level) batching with chunked
// prefill, FCFS admission, and preemption by recomputation; or static batching for
// comparison (a batch is admitted whole and nobody joins until all of it has left). Runs no
// model: tests drive it as data.
#pragma once
#include <cstdint>
#include <deque>
#include <span>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "loom/infer/kv_manager.h"

namespace loom::infer {

enum class BatchingMode { continuous, static_batch };
const char* batching_mode_name(BatchingMode m);

struct SchedulerConfig {
  int64_t max_num_seqs = 32;          // sequences in one step
  int64_t max_batched_tokens = 2048;  // tokens computed in one step, all sequences together
  int64_t num_blocks = 0;
  int64_t block_size = 16;
  bool prefix_caching = true;
  bool chunked_prefill = true;  // off: a prompt is admitted only when it fits one step whole
  BatchingMode mode = BatchingMode::continuous;
};

// One sequence's share of a step: compute tokens[start, start + num_tokens).
struct ScheduledSeq {
  int64_t seq_id = -1;
  int64_t start = 0;
  int64_t num_tokens = 0;
  bool sample = false;  // the chunk ends at the last token: sample the next one
  // Speculative decoding: the chunk's last num_spec tokens are proposals (propose()); the
  // step needs logits for its last num_spec + 1 tokens, and settle() afterwards.
  int64_t num_spec = 0;
  std::span<const int32_t> tokens;       // the chunk's token IDs
  std::span<const int32_t> block_table;  // valid until the next schedule()/complete()
  std::vector<int32_t> new_blocks;       // allocated to this sequence in this step
};

struct StepPlan {
  std::vector<ScheduledSeq> seqs;     // running order: oldest admission first, then the
                                      // admissions
  std::vector<BlockCopy> copies;      // copy-on-write, to do before the forward
  std::vector<int32_t> freed_blocks;  // released since the previous plan (preemptions,
                                      // finished and aborted sequences)
  std::vector<int64_t> preempted;     // sequences sent back to wait for recomputation
  int64_t num_tokens() const;
  int64_t num_sampled() const;
  bool empty() const { return seqs.empty(); }
};

struct SchedulerStats {
  int64_t num_running = 0, num_waiting = 0;
  int64_t blocks_used = 0, blocks_total = 0;
  int64_t num_preemptions = 0;
  int64_t prefix_hit_tokens = 0;  // prompt tokens served from the prefix cache
  int64_t slots_allocated = 0;    // tokens the running sequences' blocks could hold
  int64_t tokens_cached = 0;      // tokens whose K/V they hold
};

class Scheduler {
 public:
  explicit Scheduler(const SchedulerConfig& cfg);
  const SchedulerConfig& config() const { return cfg_; }

  // Queues a new sequence (FCFS by call order).
  void add(int64_t seq_id, std::vector<int32_t> prompt);
  StepPlan schedule();
  // After the forward of `plan`: the scheduled tokens now sit in the cache.
  void complete(const StepPlan& plan);
  // A sampled token joins the sequence (computed in a later step).
  void append_token(int64_t seq_id, int32_t token);
  // Finished or aborted: blocks go back to the pool; the id is forgotten.
  void finish(int64_t seq_id);

  // Speculative decoding. A running sequence with exactly its last token to compute
  // (decoding()) may be given proposed continuations; schedule() computes them with that token
  // in one chunk, budgeted like prompt tokens. Proposals are the first thing given up: those
  // beyond the step's token budget are dropped, and when the sequence's blocks run short all
  // of them are dropped before anyone is preempted; a preemption drops them too. Proposals
  // are never offered to the prefix cache.
  bool decoding(int64_t seq_id) const;
  void propose(int64_t seq_id, std::span<const int32_t> proposals);
  // After complete(): keeps the first num_accepted proposals the step computed and rolls the
  // rest back (their tokens dropped, blocks past the kept tokens and the next one freed).
  void settle(int64_t seq_id, int64_t num_accepted);

  bool has(int64_t seq_id) const { return seqs_.count(seq_id) != 0; }
  bool has_work() const { return !running_.empty() || !waiting_.empty(); }
  const std::vector<int32_t>& tokens(int64_t seq_id) const;
  int64_t num_computed(int64_t seq_id) const;
  int64_t num_preemptions(int64_t seq_id) const;
  const std::vector<int32_t>& block_table(int64_t seq_id) const { return kv_.block_table(seq_id); }
  const std::vector<int64_t>& running() const { return running_; }
  const std::deque<int64_t>& waiting() const { return waiting_; }
  const KVCacheManager& kv() const { return kv_; }
  SchedulerStats stats() const;

 private:
  struct Seq {
    std::vector<int32_t> tokens;
    int64_t num_computed = 0;
    int64_t preemptions = 0;
    int64_t num_spec = 0;  // trailing tokens that are proposals (propose())
  };
  void drop_proposals(Seq& s, int64_t n);
  Seq& seq(int64_t id);
  void preempt(int64_t id, StepPlan& plan);
  bool schedule_running(StepPlan& plan, int64_t& budget);
  void schedule_waiting(StepPlan& plan, int64_t& budget);
  ScheduledSeq& emit(StepPlan& plan, int64_t id, int64_t start, int64_t n, SlotAllocation&& a);

  SchedulerConfig cfg_;
  KVCacheManager kv_;
  std::unordered_map<int64_t, Seq> seqs_;
  std::vector<int64_t> running_;  // admission order
  std::deque<int64_t> waiting_;
  std::unordered_set<int64_t> static_batch_;  // members of the current static batch
  std::vector<int32_t> pending_freed_;
  int64_t num_preemptions_ = 0;
  int64_t prefix_hit_tokens_ = 0;
};

}  // namespace loom::infer

// The scheduling policy (after vLLM v1's scheduler): running sequences first, oldest first,
// so decodes are never stalled by a long prompt; then waiting sequences FCFS with the token
// budget left, prompts split into chunks. Out of blocks, the newest running sequence is
// preempted: its blocks are freed and it is recomputed from its tokens when re-admitted.
#include "loom/infer/scheduler.h"

#include <algorithm>

#include "loom/core/error.h"

namespace loom::infer {

const char* batching_mode_name(BatchingMode m) { return m == BatchingMode::continuous ? "continuous" : "static"; }

int64_t StepPlan::num_tokens() const {
  int64_t n = 0;
  for (const auto& s : seqs) n += s.num_tokens;
  return n;
}

int64_t StepPlan::num_sampled() const {
  int64_t n = 0;
  for (const auto& s : seqs) n += s.sample ? 1 : 0;
  return n;
}

Scheduler::Scheduler(const SchedulerConfig& cfg) : cfg_(cfg), kv_(cfg.num_blocks, cfg.block_size, cfg.prefix_caching) {
  LOOM_CHECK(cfg.max_num_seqs > 0, "scheduler", "max_num_seqs must be positive, got ", cfg.max_num_seqs);
  LOOM_CHECK(cfg.max_batched_tokens > 0, "scheduler", "max_batched_tokens must be positive, got ",
             cfg.max_batched_tokens);
}

Scheduler::Seq& Scheduler::seq(int64_t id) {
  auto it = seqs_.find(id);
  LOOM_CHECK(it != seqs_.end(), "scheduler", "unknown sequence ", id);
  return it->second;
}

void Scheduler::add(int64_t id, std::vector<int32_t> prompt) {
  LOOM_CHECK(!seqs_.count(id), "scheduler", "sequence ", id, " was added twice");
  LOOM_CHECK(!prompt.empty(), "scheduler", "sequence ", id, " has an empty prompt");
  seqs_[id].tokens = std::move(prompt);
  waiting_.push_back(id);
}

const std::vector<int32_t>& Scheduler::tokens(int64_t id) const { return seqs_.at(id).tokens; }
int64_t Scheduler::num_computed(int64_t id) const { return seqs_.at(id).num_computed; }
int64_t Scheduler::num_preemptions(int64_t id) const { return seqs_.at(id).preemptions; }

ScheduledSeq& Scheduler::emit(StepPlan& plan, int64_t id, int64_t start, int64_t n, SlotAllocation&& a) {
  ScheduledSeq s;
  s.seq_id = id;
  s.start = start;
  s.num_tokens = n;
  s.sample = start + n == int64_t(seq(id).tokens.size());
  s.num_spec = seq(id).num_spec;
  s.new_blocks = std::move(a.new_blocks);
  plan.copies.insert(plan.copies.end(), a.copies.begin(), a.copies.end());
  plan.seqs.push_back(std::move(s));
  return plan.seqs.back();
}

void Scheduler::drop_proposals(Seq& s, int64_t n) {
  n = std::min(n, s.num_spec);
  s.tokens.resize(s.tokens.size() - size_t(n));
  s.num_spec -= n;
}

void Scheduler::preempt(int64_t id, StepPlan& plan) {
  running_.erase(std::find(running_.begin(), running_.end(), id));
  auto freed = kv_.free(id);
  plan.freed_blocks.insert(plan.freed_blocks.end(), freed.begin(), freed.end());
  Seq& s = seq(id);
  drop_proposals(s, s.num_spec);
  s.num_computed = 0;
  ++s.preemptions;
  ++num_preemptions_;
  waiting_.push_front(id);  // ahead of later arrivals: it is older than them
  plan.preempted.push_back(id);
}

// Returns whether anything was preempted (then nobody new is admitted this step).
bool Scheduler::schedule_running(StepPlan& plan, int64_t& budget) {
  bool preempted = false;
  for (size_t i = 0; i < running_.size() && budget > 0; ++i) {
    const int64_t id = running_[i];
    Seq& s = seq(id);
    int64_t n = std::min(int64_t(s.tokens.size()) - s.num_computed, budget);
    if (n <= 0) continue;
    drop_proposals(s, int64_t(s.tokens.size()) - s.num_computed - n);  // past the budget
    std::optional<SlotAllocation> a;
    while (!(a = kv_.allocate_slots(id, s.num_computed, n))) {
      if (s.num_spec > 0) {  // speculation backs off before anyone is preempted
        drop_proposals(s, s.num_spec);
        n = int64_t(s.tokens.size()) - s.num_computed;
        continue;
      }
      const int64_t victim = running_.back();
      preempt(victim, plan);
      preempted = true;
      if (victim == id) break;
    }
    if (!a) break;  // it was the newest itself
    emit(plan, id, s.num_computed, n, std::move(*a));
    budget -= n;
  }
  return preempted;
}

void Scheduler::schedule_waiting(StepPlan& plan, int64_t& budget) {
  const bool is_static = cfg_.mode == BatchingMode::static_batch;
  if (is_static && static_batch_.empty())
    for (size_t i = 0; i < waiting_.size() && int64_t(i) < cfg_.max_num_seqs; ++i) static_batch_.insert(waiting_[i]);
  const int64_t bs = cfg_.block_size;
  while (!waiting_.empty() && int64_t(running_.size()) < cfg_.max_num_seqs && budget > 0) {
    const int64_t id = waiting_.front();
    if (is_static && !static_batch_.count(id)) break;
    Seq& s = seq(id);
    const int64_t len = int64_t(s.tokens.size());
    std::vector<int32_t> prefix = kv_.find_cached_prefix(id, s.tokens);
    // The last token is always computed: its logits give the next token.
    const int64_t computed = std::min(int64_t(prefix.size()) * bs, len - 1);
    int64_t n = len - computed;
    if (n > budget) {
      if (!cfg_.chunked_prefill) break;
      n = budget;
    }
    auto a = kv_.allocate_slots(id, computed, n, prefix);
    if (!a) break;  // FCFS: nobody overtakes the head of the queue
    waiting_.pop_front();
    running_.push_back(id);
    s.num_computed = computed;
    prefix_hit_tokens_ += computed;
    emit(plan, id, computed, n, std::move(*a));
    budget -= n;
  }
}

StepPlan Scheduler::schedule() {
  StepPlan plan;
  plan.freed_blocks = std::move(pending_freed_);
  pending_freed_.clear();
  int64_t budget = cfg_.max_batched_tokens;
  if (!schedule_running(plan, budget)) schedule_waiting(plan, budget);
  // Tables are final now; hand out views of them and of the chunks' tokens.
  for (auto& s : plan.seqs) {
    s.block_table = kv_.block_table(s.seq_id);
    s.tokens = std::span<const int32_t>(seq(s.seq_id).tokens).subspan(size_t(s.start), size_t(s.num_tokens));
  }
  return plan;
}

void Scheduler::complete(const StepPlan& plan) {
  for (const auto& p : plan.seqs) {
    Seq& s = seq(p.seq_id);
    LOOM_CHECK(s.num_computed == p.start, "scheduler", "sequence ", p.seq_id, " completed a step planned from token ",
               p.start, " but stands at ", s.num_computed);
    s.num_computed += p.num_tokens;
    kv_.cache_full_blocks(p.seq_id, s.tokens, s.num_computed - s.num_spec);
  }
}

bool Scheduler::decoding(int64_t id) const {
  auto it = seqs_.find(id);
  if (it == seqs_.end()) return false;
  const Seq& s = it->second;
  return s.num_spec == 0 && s.num_computed > 0 && s.num_computed + 1 == int64_t(s.tokens.size()) &&
         std::find(running_.begin(), running_.end(), id) != running_.end();
}

void Scheduler::propose(int64_t id, std::span<const int32_t> proposals) {
  LOOM_CHECK(decoding(id), "scheduler", "sequence ", id,
             " was given proposals but is not decoding (running, with only its last token to compute)");
  Seq& s = seq(id);
  s.tokens.insert(s.tokens.end(), proposals.begin(), proposals.end());
  s.num_spec = int64_t(proposals.size());
}

void Scheduler::settle(int64_t id, int64_t num_accepted) {
  Seq& s = seq(id);
  LOOM_CHECK(num_accepted >= 0 && num_accepted <= s.num_spec, "scheduler", "sequence ", id, " accepted ", num_accepted,
             " of its ", s.num_spec, " proposals");
  LOOM_CHECK(s.num_computed == int64_t(s.tokens.size()), "scheduler", "sequence ", id,
             " settled its proposals before they were computed");
  drop_proposals(s, s.num_spec - num_accepted);
  s.num_spec = 0;
  s.num_computed = int64_t(s.tokens.size());
  kv_.cache_full_blocks(id, s.tokens, s.num_computed);
  auto freed = kv_.truncate(id, s.num_computed + 1);
  pending_freed_.insert(pending_freed_.end(), freed.begin(), freed.end());
}

void Scheduler::append_token(int64_t id, int32_t token) { seq(id).tokens.push_back(token); }

void Scheduler::finish(int64_t id) {
  if (!seqs_.count(id)) return;
  if (auto it = std::find(running_.begin(), running_.end(), id); it != running_.end()) running_.erase(it);
  if (auto it = std::find(waiting_.begin(), waiting_.end(), id); it != waiting_.end()) waiting_.erase(it);
  auto freed = kv_.release(id);
  pending_freed_.insert(pending_freed_.end(), freed.begin(), freed.end());
  seqs_.erase(id);
  static_batch_.erase(id);
}

SchedulerStats Scheduler::stats() const {
  SchedulerStats st;
  st.num_running = int64_t(running_.size());
  st.num_waiting = int64_t(waiting_.size());
  st.blocks_total = kv_.pool().num_blocks();
  st.blocks_used = kv_.pool().num_used();
  st.num_preemptions = num_preemptions_;
  st.prefix_hit_tokens = prefix_hit_tokens_;
  for (int64_t id : running_) {
    const Seq& s = seqs_.at(id);
    st.slots_allocated += int64_t(kv_.block_table(id).size()) * cfg_.block_size;
    st.tokens_cached += s.num_computed;
  }
  return st;
}

}  // namespace loom::infer

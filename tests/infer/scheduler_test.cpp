// The scheduler as data, with no model: budgets, chunked prefill that leaves decodes running,
// FCFS, preemption by recomputation, prefix sharing, static batching,
// and block accounting.
#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>

#include "loom/infer/scheduler.h"

using namespace loom::infer;

namespace {

SchedulerConfig config(int64_t blocks, int64_t bs = 4) {
  SchedulerConfig c;
  c.num_blocks = blocks;
  c.block_size = bs;
  c.max_num_seqs = 4;
  c.max_batched_tokens = 64;
  return c;
}

std::vector<int32_t> prompt(int n, int first = 1) {
  std::vector<int32_t> t(static_cast<size_t>(n));
  std::iota(t.begin(), t.end(), first);
  return t;
}

const ScheduledSeq* find(const StepPlan& p, int64_t id) {
  for (const auto& s : p.seqs)
    if (s.seq_id == id) return &s;
  return nullptr;
}

// What the engine does after the forward: every sampling sequence gets a token.
void finish_step(Scheduler& s, const StepPlan& p, int32_t token = 500) {
  s.complete(p);
  for (const auto& q : p.seqs)
    if (q.sample) s.append_token(q.seq_id, token);
}

}  // namespace

TEST(Scheduler, BatchesUpToMaxNumSeqsThenDecodesOneTokenEach) {
  auto cfg = config(32);
  cfg.max_num_seqs = 2;
  Scheduler s(cfg);
  s.add(1, prompt(5));
  s.add(2, prompt(3));
  s.add(3, prompt(2));
  StepPlan p = s.schedule();
  ASSERT_EQ(p.seqs.size(), 2u);
  EXPECT_EQ(p.seqs[0].seq_id, 1);
  EXPECT_EQ(p.seqs[0].num_tokens, 5);
  EXPECT_TRUE(p.seqs[0].sample);
  EXPECT_EQ(p.seqs[0].new_blocks.size(), 2u);
  EXPECT_EQ(p.seqs[0].tokens.size(), 5u);
  EXPECT_EQ(p.seqs[1].num_tokens, 3);
  EXPECT_EQ(s.waiting().size(), 1u);
  finish_step(s, p);
  p = s.schedule();
  ASSERT_EQ(p.seqs.size(), 2u);
  for (const auto& q : p.seqs) {
    EXPECT_EQ(q.num_tokens, 1);
    EXPECT_TRUE(q.sample);
    EXPECT_EQ(q.tokens[0], 500) << "the decode input is the last sampled token";
  }
  EXPECT_EQ(find(p, 1)->start, 5);
  finish_step(s, p);
  s.finish(1);
  p = s.schedule();
  ASSERT_EQ(p.seqs.size(), 2u) << "the freed slot is refilled at once (continuous batching)";
  EXPECT_EQ(p.seqs[0].seq_id, 2);
  EXPECT_EQ(p.seqs[1].seq_id, 3);
  EXPECT_EQ(p.seqs[1].num_tokens, 2);
  EXPECT_EQ(p.freed_blocks.size(), 2u) << "sequence 1's blocks are reported freed";
}

TEST(Scheduler, ChunkedPrefillKeepsDecodesRunning) {
  auto cfg = config(64);
  cfg.max_batched_tokens = 16;
  Scheduler s(cfg);
  s.add(1, prompt(4));
  finish_step(s, s.schedule());
  s.add(2, prompt(40, 100));
  int64_t prefilled = 0, steps = 0;
  while (prefilled < 40) {
    StepPlan p = s.schedule();
    const ScheduledSeq* a = find(p, 1);
    const ScheduledSeq* b = find(p, 2);
    ASSERT_TRUE(a && b);
    EXPECT_EQ(a->num_tokens, 1) << "the decode runs every step";
    EXPECT_EQ(p.num_tokens(), std::min<int64_t>(16, 1 + 40 - prefilled));
    EXPECT_EQ(b->start, prefilled);
    prefilled += b->num_tokens;
    EXPECT_EQ(b->sample, prefilled == 40) << "only the last chunk samples";
    finish_step(s, p);
    ++steps;
  }
  EXPECT_EQ(steps, 3);  // 15 + 15 + 10
  EXPECT_EQ(s.num_computed(2), 40);
}

TEST(Scheduler, WithoutChunkingAPromptWaitsForAWholeStep) {
  auto cfg = config(64);
  cfg.max_batched_tokens = 16;
  cfg.chunked_prefill = false;
  Scheduler s(cfg);
  s.add(1, prompt(4));
  finish_step(s, s.schedule());
  s.add(2, prompt(16, 100));
  StepPlan p = s.schedule();
  EXPECT_EQ(p.seqs.size(), 1u) << "15 tokens of budget left, the prompt needs 16";
  EXPECT_EQ(s.waiting().size(), 1u);
}

TEST(Scheduler, AdmissionIsFirstComeFirstServed) {
  Scheduler s(config(6));  // 24 slots
  s.add(1, prompt(12));    // 3 blocks
  finish_step(s, s.schedule());
  s.add(2, prompt(13, 100));  // needs 4 blocks, 3 free: blocked
  s.add(3, prompt(2, 200));   // would fit, but must not overtake 2
  StepPlan p = s.schedule();
  EXPECT_TRUE(find(p, 1));
  EXPECT_FALSE(find(p, 2));
  EXPECT_FALSE(find(p, 3));
  EXPECT_EQ(s.waiting().front(), 2);
}

TEST(Scheduler, OutOfBlocksPreemptsTheNewestAndRecomputesIt) {
  Scheduler s(config(4));  // 16 slots
  s.add(1, prompt(7));
  s.add(2, prompt(7, 100));
  StepPlan p = s.schedule();
  ASSERT_EQ(p.seqs.size(), 2u);
  EXPECT_EQ(s.kv().pool().num_free(), 0);
  finish_step(s, p, 101);  // both now hold 8 tokens, 7 computed: slot 7 fits their block 1
  p = s.schedule();
  ASSERT_EQ(p.seqs.size(), 2u);
  finish_step(s, p, 102);  // 9 tokens: the next decode needs a third block each
  p = s.schedule();
  ASSERT_EQ(p.preempted.size(), 1u);
  EXPECT_EQ(p.preempted[0], 2) << "the newest running sequence yields";
  EXPECT_EQ(p.freed_blocks.size(), 2u);
  ASSERT_EQ(p.seqs.size(), 1u);
  EXPECT_EQ(p.seqs[0].seq_id, 1);
  EXPECT_EQ(p.seqs[0].new_blocks.size(), 1u);
  EXPECT_EQ(s.num_computed(2), 0);
  EXPECT_EQ(s.num_preemptions(2), 1);
  EXPECT_EQ(s.waiting().front(), 2);
  EXPECT_EQ(s.tokens(2).size(), 9u) << "its generated tokens are kept";
  finish_step(s, p, 103);
  s.finish(1);
  // Re-admitted: its prompt and generated tokens are recomputed, then it samples token 10.
  // Its first block is still cached (evicted tail-first), so only the rest is recomputed.
  p = s.schedule();
  const ScheduledSeq* q = find(p, 2);
  ASSERT_TRUE(q);
  EXPECT_EQ(q->start, 4);
  EXPECT_EQ(q->num_tokens, 5);
  EXPECT_TRUE(q->sample);
  EXPECT_EQ(std::vector<int32_t>(q->tokens.begin(), q->tokens.end()), (std::vector<int32_t>{104, 105, 106, 101, 102}));
  finish_step(s, p);
  s.finish(2);
  EXPECT_EQ(s.kv().pool().num_free(), 4);
  EXPECT_FALSE(s.has_work());
}

TEST(Scheduler, PreemptingItselfStopsTheStep) {
  Scheduler s(config(4));  // 16 slots
  s.add(1, prompt(8));
  finish_step(s, s.schedule(), 9);
  s.add(2, prompt(4, 100));
  StepPlan p = s.schedule();
  ASSERT_EQ(p.seqs.size(), 2u);  // 1 takes a third block, 2 the last one
  finish_step(s, p, 9);
  // 1's next slot fits its third block; 2 needs a new block, and it is the newest itself.
  p = s.schedule();
  EXPECT_EQ(p.preempted, std::vector<int64_t>{2});
  ASSERT_EQ(p.seqs.size(), 1u);
  EXPECT_EQ(p.seqs[0].seq_id, 1);
  EXPECT_EQ(s.waiting().front(), 2);
}

TEST(Scheduler, RequestsWithACommonPrefixShareBlocks) {
  Scheduler s(config(16));
  auto shared = prompt(8);
  auto a = shared, b = shared;
  a.push_back(50);
  b.push_back(60);
  s.add(1, a);
  finish_step(s, s.schedule());
  s.add(2, b);
  StepPlan p = s.schedule();
  const ScheduledSeq* q = find(p, 2);
  ASSERT_TRUE(q);
  EXPECT_EQ(q->start, 8) << "the two full blocks come from the prefix cache";
  EXPECT_EQ(q->num_tokens, 1);
  EXPECT_EQ(q->new_blocks.size(), 1u);
  EXPECT_EQ(s.block_table(1)[0], s.block_table(2)[0]);
  EXPECT_EQ(s.block_table(1)[1], s.block_table(2)[1]);
  EXPECT_EQ(s.stats().prefix_hit_tokens, 8);
  // A fully cached prompt still recomputes its last token, into a copy of the shared block.
  finish_step(s, p);
  s.add(3, shared);
  p = s.schedule();
  q = find(p, 3);
  ASSERT_TRUE(q);
  EXPECT_EQ(q->start, 7);
  ASSERT_EQ(p.copies.size(), 1u);
  EXPECT_EQ(p.copies[0].src, s.block_table(1)[1]);
  EXPECT_EQ(p.copies[0].dst, s.block_table(3)[1]);
  for (int64_t id : {1, 2, 3}) s.finish(id);
  EXPECT_EQ(s.kv().pool().num_free(), 16);
}

TEST(Scheduler, StaticModeAdmitsOnlyAfterTheWholeBatchFinishes) {
  auto cfg = config(32);
  cfg.mode = BatchingMode::static_batch;
  cfg.max_num_seqs = 2;
  Scheduler s(cfg);
  s.add(1, prompt(3));
  s.add(2, prompt(3));
  s.add(3, prompt(3));
  StepPlan p = s.schedule();
  ASSERT_EQ(p.seqs.size(), 2u);
  finish_step(s, p);
  s.finish(1);
  p = s.schedule();
  ASSERT_EQ(p.seqs.size(), 1u) << "3 waits although a slot is free";
  EXPECT_EQ(p.seqs[0].seq_id, 2);
  finish_step(s, p);
  s.finish(2);
  p = s.schedule();
  ASSERT_EQ(p.seqs.size(), 1u);
  EXPECT_EQ(p.seqs[0].seq_id, 3);
  // The same sequence of events under continuous batching admits 3 as soon as 1 leaves.
  cfg.mode = BatchingMode::continuous;
  Scheduler c(cfg);
  c.add(1, prompt(3));
  c.add(2, prompt(3));
  c.add(3, prompt(3));
  finish_step(c, c.schedule());
  c.finish(1);
  EXPECT_EQ(c.schedule().seqs.size(), 2u);
}

TEST(Scheduler, AbortedSequencesReturnTheirBlocks) {
  Scheduler s(config(8));
  s.add(1, prompt(9));
  s.add(2, prompt(5));
  finish_step(s, s.schedule());
  s.add(3, prompt(4));
  s.finish(2);   // running
  s.finish(3);   // still waiting
  s.finish(42);  // unknown: ignored
  StepPlan p = s.schedule();
  EXPECT_EQ(p.freed_blocks.size(), 2u);
  s.finish(1);
  EXPECT_EQ(s.kv().pool().num_free(), 8);
  EXPECT_EQ(s.kv().num_sequences(), 0);
}

// Speculative decoding's part: proposals computed with the last token, budgeted like prompt
// tokens, given up first (budget, blocks, preemption), rolled back by settle().
TEST(SchedulerSpeculation, ProposalsAreComputedThenRolledBackToTheAcceptedOnes) {
  Scheduler s(config(16));
  s.add(0, prompt(6));
  finish_step(s, s.schedule());  // prefill; token 500 sampled
  ASSERT_TRUE(s.decoding(0));
  const std::vector<int32_t> props = {7, 8, 9};
  s.propose(0, props);
  EXPECT_FALSE(s.decoding(0));
  StepPlan p = s.schedule();
  ASSERT_EQ(p.seqs.size(), 1u);
  EXPECT_EQ(p.seqs[0].start, 6);
  EXPECT_EQ(p.seqs[0].num_tokens, 4);
  EXPECT_EQ(p.seqs[0].num_spec, 3);
  EXPECT_TRUE(p.seqs[0].sample);
  EXPECT_EQ(s.block_table(0).size(), 3u);  // 10 tokens in 4-token blocks
  s.complete(p);
  s.settle(0, 1);  // 7 accepted, 8 and 9 rejected
  EXPECT_EQ(s.tokens(0), (std::vector<int32_t>{1, 2, 3, 4, 5, 6, 500, 7}));
  EXPECT_EQ(s.num_computed(0), 8);
  EXPECT_EQ(s.block_table(0).size(), 3u);  // the kept 8 tokens and the next one
  s.append_token(0, 42);
  EXPECT_TRUE(s.decoding(0));
  s.propose(0, props);
  s.complete(p = s.schedule());
  s.settle(0, 0);
  EXPECT_EQ(s.num_computed(0), 9);
  EXPECT_EQ(s.block_table(0).size(), 3u);
  EXPECT_EQ(s.schedule().freed_blocks.size(), 0u);
  s.finish(0);
  EXPECT_EQ(s.kv().pool().num_free(), 16);
}

TEST(SchedulerSpeculation, ProposalsGiveWayToTheBudgetAndToOtherSequencesBlocks) {
  SchedulerConfig c = config(4);
  c.max_batched_tokens = 3;
  Scheduler s(c);
  s.add(0, prompt(3));
  finish_step(s, s.schedule());
  const std::vector<int32_t> props = {7, 8, 9, 10};
  s.propose(0, props);
  StepPlan p = s.schedule();
  EXPECT_EQ(p.seqs[0].num_tokens, 3);  // the last token and two proposals fit the budget
  EXPECT_EQ(p.seqs[0].num_spec, 2);
  s.complete(p);
  s.settle(0, 2);
  s.append_token(0, 11);
  EXPECT_EQ(s.num_computed(0), 6);
  s.finish(0);
  // Three blocks: 0 holds two (7 tokens), 1 holds one (3 tokens). 0's proposals would need a
  // fourth block, so they are dropped rather than anyone preempted.
  SchedulerConfig c3 = config(3);
  Scheduler t(c3);
  t.add(0, prompt(7));
  t.add(1, prompt(3, 100));
  finish_step(t, t.schedule());
  ASSERT_TRUE(t.decoding(0));
  t.propose(0, props);
  p = t.schedule();
  const ScheduledSeq* q = find(p, 0);
  ASSERT_NE(q, nullptr);
  EXPECT_EQ(q->num_spec, 0);
  EXPECT_EQ(q->num_tokens, 1);
  EXPECT_TRUE(p.preempted.empty());
  ASSERT_NE(find(p, 1), nullptr);
  EXPECT_EQ(t.tokens(0).size(), 8u);
}

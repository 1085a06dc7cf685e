// The scheduler as data, with no model: budgets, chunked prefill that leaves decodes running,
// FCFS, preemption by recomputation, prefix sharing, static batching (compact and padded),
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

// What the engine does in padded static batching: every generating sequence that samples gets
// a token, except those in `finishing`, which become padding rows; padding rows' samples are
// dropped.
void padded_step(Scheduler& s, const StepPlan& p, std::initializer_list<int64_t> finishing = {},
                 int32_t token = 500) {
  s.complete(p);
  for (const auto& q : p.seqs) {
    if (!q.sample || q.padding) continue;
    if (std::find(finishing.begin(), finishing.end(), q.seq_id) != finishing.end())
      s.pad(q.seq_id);
    else
      s.append_token(q.seq_id, token);
  }
}

SchedulerConfig padded_config(int64_t blocks, int64_t bs = 4) {
  SchedulerConfig c = config(blocks, bs);
  c.mode = BatchingMode::static_batch;
  c.static_policy = StaticPolicy::padded;
  return c;
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
  s.add(1, prompt(12));   // 3 blocks
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
  EXPECT_EQ(std::vector<int32_t>(q->tokens.begin(), q->tokens.end()),
            (std::vector<int32_t>{104, 105, 106, 101, 102}));
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
  s.finish(2);  // running
  s.finish(3);  // still waiting
  s.finish(42); // unknown: ignored
  StepPlan p = s.schedule();
  EXPECT_EQ(p.freed_blocks.size(), 2u);
  s.finish(1);
  EXPECT_EQ(s.kv().pool().num_free(), 8);
  EXPECT_EQ(s.kv().num_sequences(), 0);
}

TEST(Scheduler, PaddedStaticKeepsEveryRowUntilTheLongestFinishes) {
  auto cfg = padded_config(32);
  cfg.max_num_seqs = 3;
  Scheduler s(cfg);
  for (int64_t id = 1; id <= 4; ++id) s.add(id, prompt(3, int(id) * 10));
  StepPlan p = s.schedule();
  ASSERT_EQ(p.seqs.size(), 3u);
  padded_step(s, p, {1});  // 1 finishes with its first token
  EXPECT_TRUE(s.is_padding(1));
  EXPECT_TRUE(s.finished_batch().empty()) << "2 and 3 still generate";
  // 2 decodes one more step, 3 three more: every step computes 3 rows.
  for (int step = 0; step < 3; ++step) {
    p = s.schedule();
    ASSERT_EQ(p.seqs.size(), 3u) << "step " << step;
    EXPECT_FALSE(find(p, 4)) << "nothing is admitted while the batch runs, step " << step;
    const ScheduledSeq* pad = find(p, 1);
    ASSERT_TRUE(pad);
    EXPECT_TRUE(pad->padding);
    EXPECT_TRUE(pad->sample) << "a padding row is computed like any row";
    EXPECT_EQ(pad->num_tokens, 1);
    EXPECT_EQ(pad->start, 3 + step) << "its K/V grow by a token per step";
    EXPECT_EQ(pad->tokens[0], 12) << "its last token, repeated";
    EXPECT_EQ(find(p, 2)->padding, step > 0);
    EXPECT_FALSE(find(p, 3)->padding);
    EXPECT_EQ(s.stats().num_padding, step == 0 ? 1 : 2);
    if (step == 0) padded_step(s, p, {2});
    else if (step == 1) padded_step(s, p);
    else padded_step(s, p, {3});
  }
  EXPECT_EQ(s.tokens(1).size(), 6u) << "3 prompt tokens, 3 padding tokens";
  EXPECT_EQ(s.block_table(1).size(), 2u) << "the padding row's memory grew like a real row's";
  EXPECT_EQ(s.stats().tokens_cached, 3 + 4 + 6) << "real tokens only";
  EXPECT_EQ(s.stats().padding_cached, 3 + 2 + 0);
  EXPECT_EQ(s.finished_batch(), (std::vector<int64_t>{1, 2, 3}));
  for (int64_t id : s.finished_batch()) s.finish(id);
  p = s.schedule();
  ASSERT_EQ(p.seqs.size(), 1u) << "the next batch";
  EXPECT_EQ(p.seqs[0].seq_id, 4);
  EXPECT_FALSE(p.seqs[0].padding);
  EXPECT_FALSE(p.freed_blocks.empty());
  padded_step(s, p, {4});
  EXPECT_EQ(s.finished_batch(), std::vector<int64_t>{4}) << "a batch of one ends with it";
  s.finish(4);
  EXPECT_EQ(s.kv().pool().num_free(), 32);
  EXPECT_FALSE(s.has_work());
}

TEST(Scheduler, PaddingRowsAreNeverOfferedToThePrefixCache) {
  Scheduler s(padded_config(32));
  s.add(1, prompt(3));
  s.add(2, prompt(3, 100));
  StepPlan p = s.schedule();
  padded_step(s, p, {1});
  for (int step = 0; step < 5; ++step) padded_step(s, s.schedule());
  padded_step(s, s.schedule(), {2});
  ASSERT_EQ(s.tokens(1).size(), 9u);  // two full blocks: 1 2 3 3 | 3 3 3 3 | 3
  // A prompt equal to 1's first block, padding included, finds nothing cached.
  s.add(3, {1, 2, 3, 3, 9});
  for (int64_t id : s.finished_batch()) s.finish(id);
  p = s.schedule();
  ASSERT_TRUE(find(p, 3));
  EXPECT_EQ(find(p, 3)->start, 0);
  EXPECT_EQ(s.stats().prefix_hit_tokens, 0);
}

TEST(Scheduler, PaddedStaticBatchesMayOnlyPadTheirOwnMembers) {
  Scheduler c(config(8));
  c.add(1, prompt(3));
  finish_step(c, c.schedule());
  EXPECT_THROW(c.pad(1), std::exception) << "continuous batching has no padding rows";
  Scheduler s(padded_config(8));
  s.add(1, prompt(3));
  const StepPlan p = s.schedule();
  EXPECT_THROW(s.pad(1), std::exception) << "its prompt is not computed yet";
  padded_step(s, p);
  s.add(2, prompt(3));
  EXPECT_THROW(s.pad(2), std::exception) << "2 is not in the batch";
}

// A padding row never stands in the way of a generating member: without a free block it
// stops growing (recomputes its last position); when a generating member needs a block, the
// padding rows hand theirs back and are no longer computed.
TEST(Scheduler, PaddingRowsYieldTheirBlocksToGeneratingMembers) {
  Scheduler s(padded_config(3));  // 12 slots
  s.add(1, prompt(3));
  s.add(2, prompt(3, 100));
  StepPlan p = s.schedule();
  padded_step(s, p, {1});
  // 1 pads at position 3 (its block), then wants a second block at 4, and so does 2: the
  // one free block goes to 2, the generating member, and 1 recomputes position 3.
  p = s.schedule();
  EXPECT_EQ(find(p, 1)->start, 3);
  padded_step(s, p);
  p = s.schedule();
  ASSERT_EQ(p.seqs.size(), 2u);
  EXPECT_EQ(p.seqs[0].seq_id, 2) << "generating members go first";
  EXPECT_EQ(p.seqs[0].new_blocks.size(), 1u);
  EXPECT_TRUE(p.seqs[1].padding);
  EXPECT_EQ(p.seqs[1].start, 3) << "no block left: it recomputes its last position";
  EXPECT_TRUE(p.seqs[1].new_blocks.empty());
  padded_step(s, p);
  for (int step = 0; step < 3; ++step) {  // 2 fills its second block
    p = s.schedule();
    EXPECT_EQ(p.seqs.size(), 2u);
    padded_step(s, p);
  }
  EXPECT_EQ(s.num_computed(2), 8);
  p = s.schedule();  // 2 needs a third block: 1 hands its block back
  ASSERT_EQ(p.seqs.size(), 1u);
  EXPECT_EQ(p.seqs[0].seq_id, 2);
  EXPECT_EQ(p.freed_blocks.size(), 1u);
  EXPECT_TRUE(p.preempted.empty()) << "parking a padding row preempts nobody";
  EXPECT_EQ(s.stats().num_parked, 1);
  EXPECT_EQ(s.stats().num_running, 1);
  padded_step(s, p, {2});
  EXPECT_EQ(s.finished_batch(), (std::vector<int64_t>{1, 2})) << "parked rows end with the batch";
  for (int64_t id : s.finished_batch()) s.finish(id);
  EXPECT_EQ(s.kv().pool().num_free(), 3);
  EXPECT_EQ(s.kv().num_sequences(), 0);
}

// A member still waiting for blocks when the others have finished gets the padding rows'
// blocks: the batch always ends.
TEST(Scheduler, AWaitingMemberTakesThePaddingRowsBlocks) {
  auto cfg = padded_config(4);  // 16 slots
  cfg.max_num_seqs = 2;
  Scheduler s(cfg);
  s.add(1, prompt(12));  // 3 blocks
  s.add(2, prompt(8, 100));  // 2 blocks: waits
  StepPlan p = s.schedule();
  ASSERT_EQ(p.seqs.size(), 1u);
  padded_step(s, p, {1});
  p = s.schedule();
  ASSERT_TRUE(find(p, 2)) << "admitted with the padding row's blocks";
  EXPECT_FALSE(find(p, 1));
  EXPECT_EQ(s.stats().num_parked, 1);
  padded_step(s, p, {2});
  EXPECT_EQ(s.finished_batch(), (std::vector<int64_t>{1, 2}));
}

TEST(Scheduler, PaddingRowsStopGrowingAtTheMaximumLength) {
  auto cfg = padded_config(32);
  cfg.max_seq_len = 6;
  Scheduler s(cfg);
  s.add(1, prompt(4));
  s.add(2, prompt(2, 100));
  StepPlan p = s.schedule();
  padded_step(s, p, {1});
  std::vector<int64_t> starts;
  for (int step = 0; step < 4; ++step) {
    p = s.schedule();
    starts.push_back(find(p, 1)->start);
    padded_step(s, p);
  }
  EXPECT_EQ(starts, (std::vector<int64_t>{4, 5, 5, 5}));
  EXPECT_EQ(s.tokens(1).size(), 6u);
  EXPECT_EQ(s.num_computed(1), 6);
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

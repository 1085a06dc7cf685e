// The engine's API contract: copy-on-write of a shared cached block, abort, stop tokens and
// stop strings, streaming events, context capping, refusal of bad input with the numbers or
// parameter named, and add/abort from another thread while a loop thread steps.
#include <gtest/gtest.h>

#include <atomic>
#include <cmath>
#include <map>
#include <mutex>
#include <random>
#include <thread>

#include "infer/infer_testing.h"
#include "loom/infer/engine.h"

using namespace loom;
using namespace loom::infer;
using fixtures::greedy;

namespace {

std::unique_ptr<model::Decoder> make_model() {
  return fixtures::wandering_model(model::Family::gpt2, DType::f64, 7, /*perturb_others=*/false);
}

std::vector<int32_t> tokens(int n, unsigned seed) { return fixtures::random_tokens(n, seed); }

EngineConfig small_config() { return fixtures::engine_config(64, 4, 64); }

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "(no error)";
}

}  // namespace

TEST(EngineApi, WholePromptCacheHitCopiesTheSharedBlock) {
  auto m = make_model();
  const auto prompt = tokens(16, 1);  // four full blocks of 4
  SamplingParams sp;
  sp.temperature = 0.8;
  sp.seed = 42;
  sp.max_tokens = 20;
  const auto alone = Engine(*m, small_config()).generate(prompt, sp);
  Engine e(*m, small_config());
  e.add_request(prompt, sp);
  e.step();  // prefill: all four blocks are cached now
  e.step();
  e.add_request(prompt, sp);  // every block is a hit; its last token is recomputed into a copy
  std::vector<RequestOutput> outs;
  while (e.has_unfinished())
    for (auto& o : e.step()) outs.push_back(std::move(o));
  ASSERT_EQ(outs.size(), 2u);
  EXPECT_EQ(outs[0].tokens, alone);
  EXPECT_EQ(outs[1].tokens, alone);
  EXPECT_EQ(e.metrics().prefix_hit_tokens, 15);
  EXPECT_EQ(e.scheduler().kv().pool().num_free(), 64);
}

TEST(EngineApi, AbortEndsRunningAndWaitingRequests) {
  auto m = make_model();
  auto cfg = small_config();
  cfg.max_num_seqs = 1;
  Engine e(*m, cfg);
  std::map<int64_t, std::vector<TokenEvent>> events;
  auto record = [&](const TokenEvent& ev) { events[ev.request_id].push_back(ev); };
  const int64_t a = e.add_request(tokens(5, 2), greedy(30), record);
  const int64_t b = e.add_request(tokens(5, 3), greedy(30), record);
  for (int i = 0; i < 3; ++i) e.step();
  EXPECT_EQ(e.metrics().num_running, 1);
  EXPECT_EQ(e.metrics().num_waiting, 1);
  e.abort(a);
  e.abort(b);
  e.abort(12345);  // unknown ids are ignored
  auto outs = e.step();
  ASSERT_EQ(outs.size(), 2u);
  for (const auto& o : outs) EXPECT_EQ(o.finish_reason, FinishReason::abort);
  EXPECT_EQ(outs[0].tokens.size(), 3u);
  EXPECT_TRUE(outs[1].tokens.empty());
  ASSERT_EQ(events[a].size(), 4u);  // three tokens, then the closing event
  EXPECT_EQ(events[a].back().token, -1);
  EXPECT_EQ(events[a].back().finish, FinishReason::abort);
  EXPECT_EQ(events[b].size(), 1u);
  EXPECT_FALSE(e.has_unfinished());
  EXPECT_EQ(e.scheduler().kv().pool().num_free(), 64);
}

TEST(EngineApi, StopTokenAndStopStringEndTheOutput) {
  auto m = make_model();
  const auto prompt = tokens(6, 4);
  const auto ref = Engine(*m, small_config()).generate(prompt, greedy(12));
  // Stop at the first occurrence of ref[4]: the output is everything before it.
  SamplingParams st = greedy(12);
  st.stop_token_ids = {ref[4]};
  const size_t first = size_t(std::find(ref.begin(), ref.end(), ref[4]) - ref.begin());
  Engine e(*m, small_config());
  std::vector<TokenEvent> events;
  const auto out = e.run(prompt, st, [&](const TokenEvent& ev) { events.push_back(ev); });
  EXPECT_EQ(out.finish_reason, FinishReason::stop);
  EXPECT_EQ(out.stop_token, ref[4]);
  EXPECT_EQ(out.tokens, std::vector<int32_t>(ref.begin(), ref.begin() + long(first)));
  ASSERT_EQ(events.size(), first + 1);
  EXPECT_EQ(events.back().token, -1);
  for (size_t i = 0; i < first; ++i) {
    EXPECT_EQ(events[i].token, ref[i]);
    EXPECT_EQ(events[i].index, int64_t(i));
    EXPECT_EQ(events[i].finish, FinishReason::none);
  }
  // Stop strings through a detokenizer that spells token t as the letter 'A' + t % 26.
  auto cfg = small_config();
  cfg.detokenizer = [](const std::vector<int32_t>& t) {
    std::string s;
    for (int32_t x : t) s += char('A' + x % 26);
    return s;
  };
  const std::string text = cfg.detokenizer(ref);
  SamplingParams ss = greedy(12);
  ss.stop = {text.substr(5, 2), "no such text"};
  const size_t end = text.find(ss.stop[0]) + 2;  // tokens up to the one completing it
  const auto out2 = Engine(*m, cfg).run(prompt, ss);
  EXPECT_EQ(out2.finish_reason, FinishReason::stop);
  EXPECT_EQ(out2.stop_string, ss.stop[0]);
  EXPECT_EQ(out2.tokens, std::vector<int32_t>(ref.begin(), ref.begin() + long(end)));
}

TEST(EngineApi, StopStringsSpanningTokensOfDifferentLengths) {
  // Token t is spelled as 1 + t % 3 copies of a letter, so stop strings cross token boundaries
  // at every offset; the engine decodes one token at a time and must stop where decoding
  // every prefix of the output whole would first contain the string.
  auto m = make_model();
  const auto prompt = tokens(6, 4);
  const auto ref = Engine(*m, small_config()).generate(prompt, greedy(16));
  auto cfg = small_config();
  cfg.detokenizer = [](const std::vector<int32_t>& t) {
    std::string s;
    for (int32_t x : t) s += std::string(size_t(1 + x % 3), char('a' + x % 26));
    return s;
  };
  const std::string text = cfg.detokenizer(ref);
  for (size_t at : {size_t(2), size_t(5), size_t(9)})
    for (size_t len : {size_t(1), size_t(3), size_t(6)}) {
      if (at + len > text.size()) continue;
      SamplingParams ss = greedy(16);
      ss.stop = {"#", text.substr(at, len)};  // "#" never occurs; the other is the longest
      size_t k = 1;                           // the shortest output prefix whose text contains the stop string
      while (cfg.detokenizer({ref.begin(), ref.begin() + long(k)}).find(ss.stop[1]) == std::string::npos) ++k;
      const auto out = Engine(*m, cfg).run(prompt, ss);
      EXPECT_EQ(out.finish_reason, FinishReason::stop) << at << "+" << len;
      EXPECT_EQ(out.stop_string, ss.stop[1]);
      EXPECT_EQ(out.tokens, std::vector<int32_t>(ref.begin(), ref.begin() + long(k))) << at << "+" << len;
    }
}

TEST(EngineApi, StopStringsSeeTheSpacesADecoderDropsFromAFirstToken) {
  // Token t is spelled " " + a letter, and the first token of whatever is decoded loses its
  // space, as SentencePiece decodes: the output's text has spaces only between tokens, which
  // decoding one token at a time never shows.
  auto m = make_model();
  const auto prompt = tokens(6, 4);
  const auto ref = Engine(*m, small_config()).generate(prompt, greedy(12));
  auto cfg = small_config();
  cfg.detokenizer = [](const std::vector<int32_t>& t) {
    std::string s;
    for (int32_t x : t) s += std::string(" ") + char('a' + x % 26);
    return s.empty() ? s : s.substr(1);
  };
  const std::string text = cfg.detokenizer(ref);
  SamplingParams ss = greedy(12);
  ss.stop = {text.substr(5, 4)};                         // " x y": the spaces before the 4th and 5th tokens
  const size_t k = (text.find(ss.stop[0]) + 4 + 1) / 2;  // tokens up to the one completing it
  const auto out = Engine(*m, cfg).run(prompt, ss);
  EXPECT_EQ(out.finish_reason, FinishReason::stop);
  EXPECT_EQ(out.stop_string, ss.stop[0]);
  EXPECT_EQ(out.tokens, std::vector<int32_t>(ref.begin(), ref.begin() + long(k)));
}

TEST(EngineApi, OutputIsCappedAtTheContext) {
  auto m = make_model();
  Engine e(*m, small_config());
  const auto out = e.run(tokens(60, 5), greedy(100));
  EXPECT_EQ(out.tokens.size(), 4u);
  EXPECT_EQ(out.finish_reason, FinishReason::length);
}

TEST(EngineApi, BadInputIsRefusedNamingTheProblem) {
  auto m = make_model();
  Engine e(*m, small_config());
  std::string err = error_of([&] { e.add_request(tokens(70, 1), greedy(1)); });
  EXPECT_NE(err.find("70"), std::string::npos) << err;
  EXPECT_NE(err.find("64"), std::string::npos) << err;
  EXPECT_NE(err.find("never truncated"), std::string::npos) << err;
  err = error_of([&] { e.add_request(tokens(64, 1), greedy(1)); });
  EXPECT_NE(err.find("no room to generate"), std::string::npos) << err;
  err = error_of([&] { e.add_request({}, greedy(1)); });
  EXPECT_NE(err.find("empty"), std::string::npos) << err;
  err = error_of([&] { e.add_request({1, 61}, greedy(1)); });
  EXPECT_NE(err.find("token 61"), std::string::npos) << err;

  SamplingParams p;
  p.temperature = -0.5;
  EXPECT_NE(error_of([&] { e.add_request({1}, p); }).find("[sampling] temperature"), std::string::npos);
  p = {};
  p.top_p = 0;
  EXPECT_NE(error_of([&] { e.add_request({1}, p); }).find("top_p"), std::string::npos);
  p.top_p = 1.5;
  EXPECT_NE(error_of([&] { e.add_request({1}, p); }).find("top_p"), std::string::npos);
  p = {};
  p.top_k = -1;
  EXPECT_NE(error_of([&] { e.add_request({1}, p); }).find("top_k"), std::string::npos);
  p = {};
  p.max_tokens = 0;
  EXPECT_NE(error_of([&] { e.add_request({1}, p); }).find("max_tokens"), std::string::npos);
  p = {};
  p.stop = {"x"};
  EXPECT_NE(error_of([&] { e.add_request({1}, p); }).find("detokenizer"), std::string::npos);
  EXPECT_FALSE(e.has_unfinished()) << "refused requests are not queued";

  // A KV budget below one full-length sequence (64 tokens = 16 blocks of 4) is refused.
  auto cfg = small_config();
  cfg.num_blocks = 15;
  err = error_of([&] { Engine tiny(*m, cfg); });
  EXPECT_NE(err.find("[engine]"), std::string::npos) << err;
  EXPECT_NE(err.find("n_ctx=64"), std::string::npos) << err;
  EXPECT_NE(err.find("16 blocks"), std::string::npos) << err;
  cfg = small_config();
  cfg.num_blocks = 0;
  cfg.kv_cache_bytes = 1000;
  EXPECT_NE(error_of([&] { Engine tiny(*m, cfg); }).find("one full-length sequence"), std::string::npos);
}

TEST(EngineApi, RequestsAndAbortsFromOtherThreadsWhileALoopSteps) {
  auto m = make_model();
  Engine e(*m, small_config());
  std::mutex mu;
  std::map<int64_t, std::vector<int32_t>> streamed;
  std::map<int64_t, RequestOutput> done;
  std::atomic<bool> stop{false};
  std::thread loop([&] {
    while (!stop.load() || e.has_unfinished()) {
      for (auto& o : e.step()) {
        std::lock_guard<std::mutex> lock(mu);
        done[o.id] = std::move(o);
      }
      std::this_thread::yield();
    }
  });
  std::vector<int64_t> ids;
  for (int i = 0; i < 6; ++i) {
    ids.push_back(e.add_request(tokens(4 + i, 10 + unsigned(i)), greedy(8), [&](const TokenEvent& ev) {
      std::lock_guard<std::mutex> lock(mu);
      if (ev.token >= 0) streamed[ev.request_id].push_back(ev.token);
    }));
    if (i == 3) e.abort(ids[1]);
  }
  stop = true;
  loop.join();
  ASSERT_EQ(done.size(), 6u);
  for (int64_t id : ids) {
    EXPECT_EQ(done[id].tokens, streamed[id]) << "the stream carries exactly the output";
    if (id != ids[1]) {
      EXPECT_EQ(done[id].tokens.size(), 8u);
    }
  }
  const EngineMetrics mt = e.metrics();
  EXPECT_EQ(mt.requests_finished, 6);
  EXPECT_EQ(mt.kv_blocks_used, 0);
  EXPECT_EQ(mt.num_running + mt.num_waiting, 0);
}

// A NaN in the position table at position 10: requests that never reach it are untouched,
// the others fail alone, naming the position, after streaming the tokens they had.
TEST(EngineApi, NonFiniteLogitsFailOnlyTheirRequest) {
  auto clean = make_model();
  auto m = make_model();
  const model::ParamInfo& wpe = m->layout().get("transformer.wpe.weight");
  m->params().data<double>()[wpe.offset + 10 * m->config().d_model] = std::nan("");
  const auto short_prompt = tokens(4, 1), long_prompt = tokens(12, 2), mid_prompt = tokens(6, 3);
  Engine e(*m, small_config());
  std::map<int64_t, std::vector<TokenEvent>> events;
  auto record = [&](const TokenEvent& ev) { events[ev.request_id].push_back(ev); };
  const int64_t a = e.add_request(short_prompt, greedy(4), record);
  const int64_t b = e.add_request(long_prompt, greedy(4), record);
  const int64_t c = e.add_request(mid_prompt, greedy(10), record);
  std::map<int64_t, RequestOutput> outs;
  while (e.has_unfinished())
    for (auto& o : e.step()) outs[o.id] = std::move(o);
  EXPECT_EQ(outs[a].finish_reason, FinishReason::length);
  EXPECT_EQ(outs[a].tokens, Engine(*clean, small_config()).generate(short_prompt, greedy(4)));
  EXPECT_EQ(outs[b].finish_reason, FinishReason::error);
  EXPECT_TRUE(outs[b].tokens.empty());
  EXPECT_EQ(outs[b].error,
            "the model's logits for position 12 (after 12 prompt and 0 generated tokens) are NaN: the model's "
            "weights, or the activations they produce, are not finite");
  // c computes position 10 for its fifth token's successor.
  EXPECT_EQ(outs[c].finish_reason, FinishReason::error);
  EXPECT_EQ(outs[c].tokens, Engine(*clean, small_config()).generate(mid_prompt, greedy(5)));
  EXPECT_NE(outs[c].error.find("position 11 (after 6 prompt and 5 generated tokens) are NaN"), std::string::npos)
      << outs[c].error;
  ASSERT_FALSE(events[c].empty());
  EXPECT_EQ(events[c].back().finish, FinishReason::error);
  EXPECT_EQ(events[c].back().token, -1);
  EXPECT_EQ(events[c].back().error, outs[c].error);
  EXPECT_EQ(e.scheduler().kv().pool().num_free(), 64) << "a failed request gives its blocks back";
  // The engine goes on; generate() throws what run() returns.
  EXPECT_EQ(e.generate(short_prompt, greedy(4)), outs[a].tokens);
  const std::string err = error_of([&] { e.generate(long_prompt, greedy(4)); });
  EXPECT_EQ(err.rfind("[engine] the model's logits for position 12", 0), 0u) << err;
}

// A KV cache for sequences shorter than the context: sized by max_seq_len, outputs capped there.
TEST(EngineApi, MaxSeqLenSizesTheCacheBelowTheContext) {
  auto m = make_model();
  EngineConfig cfg = small_config();
  cfg.max_seq_len = 20;
  cfg.num_blocks = 5;  // 20 tokens in blocks of 4; the full context (64) would need 16
  Engine e(*m, cfg);
  EXPECT_EQ(e.max_seq_len(), 20);
  const RequestOutput out = e.run(tokens(8, 4), greedy(30));
  EXPECT_EQ(out.finish_reason, FinishReason::length);
  EXPECT_EQ(out.tokens, Engine(*m, small_config()).generate(tokens(8, 4), greedy(12)));
  std::string err = error_of([&] { e.add_request(tokens(20, 1), greedy(1)); });
  EXPECT_NE(err.find("max_seq_len"), std::string::npos) << err;
  cfg.num_blocks = 4;
  err = error_of([&] { Engine tiny(*m, cfg); });
  EXPECT_NE(err.find("max_seq_len=20 tokens needs 5 blocks"), std::string::npos) << err;
  cfg.max_seq_len = 65;
  EXPECT_NE(error_of([&] { Engine bad(*m, cfg); }).find("model.n_ctx=64"), std::string::npos);
}

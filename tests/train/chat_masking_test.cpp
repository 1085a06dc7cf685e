// The loss mask of `loom prepare --chat` reaching the loss: data.chat_layout picks the rows, the
// trainer's DatasetSource gives ignored targets (-1) exactly where the mask does not train the
// target token, in both layouts, and a model's gradients do not depend on the user's tokens as
// targets: conversations that differ only in a last user turn (after the last reply) give
// bitwise-equal gradients in the pad layout, while a different reply does not. The trainer's
// gradient is the mean over the trained tokens only, however many the mask leaves out. Packed
// rows give each conversation positions from its own start, and a row packing conversations
// trains exactly like the conversations apart.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>

#include "data/data_testing.h"
#include "loom/data/dataset.h"
#include "loom/data/prepare.h"
#include "loom/model/decoder.h"
#include "loom/train/dataset_source.h"
#include "loom/train/trainer.h"
#include "train/train_testing.h"

using namespace loom;

namespace {

const char* const kSystemUser =
    R"({"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is 2+2?"})";

// One conversation whose last user turn is `last_user` and whose reply is `reply`, and a second,
// longer one that stays the same.
std::string chat_jsonl(const std::string& reply, const std::string& last_user) {
  return std::string(R"({"messages": [)") + kSystemUser + R"(, {"role": "assistant", "content": ")" + reply +
         R"("}, {"role": "user", "content": ")" + last_user + R"("}]})" + "\n" +
         R"({"messages": [{"role": "user", "content": "Name two colours."}, {"role": "assistant", "content": "Red and blue."}, {"role": "user", "content": "One more?"}, {"role": "assistant", "content": "Green."}]})" +
         "\n";
}

// Byte-tokenized ChatML conversations in `dir`/data.
std::string prepare_chat(const std::string& dir, const std::string& jsonl) {
  std::filesystem::create_directories(dir);
  data::testing::write_bytes(dir + "/chat.jsonl", jsonl);
  data::PrepareOptions o;
  o.chat_inputs = {dir + "/chat.jsonl"};
  o.tokenizer = "byte";
  const std::string tmpl = std::string(LOOM_SOURCE_DIR) + "/tests/golden/chat_templates/templates/chatml.jinja";
  o.chat_template = data::ChatTemplateText{data::testing::read_bytes(tmpl), tmpl, std::nullopt, std::nullopt};
  o.out_dir = dir + "/data";
  o.val_fraction = 0;
  o.force = true;
  data::prepare(o);
  return o.out_dir;
}

train::TrainConfig chat_config(const std::string& data_dir, const std::string& layout, int64_t T) {
  const std::string yaml = "model:\n  preset: llama-tiny\n  vocab_size: 256\n  n_ctx: " + std::to_string(T) +
                           "\ndata:\n  dir: " + data_dir + "\n  seq_len: " + std::to_string(T) +
                           "\n  batch_size: 4\n  chat_layout: " + layout + "\nlog:\n  progress: off\n";
  return train::parse_train_config(yaml, {});
}

struct Batch {
  std::vector<int32_t> tokens, targets;
};

Batch train_batch(train::DatasetSource& src, int64_t step, int64_t B, int64_t T) {
  Batch b{std::vector<int32_t>(size_t(B * T)), std::vector<int32_t>(size_t(B * T))};
  src.fill_train(step, 0, B, B, T, b.tokens.data(), b.targets.data(), nullptr);
  return b;
}

// The loss sum and the flat gradient of one forward/backward on a model with fixed weights.
std::pair<double, std::vector<float>> loss_and_grads(const model::ModelConfig& cfg, const Batch& b, int64_t B,
                                                     int64_t T) {
  model::Decoder m(cfg);
  m.init_weights(7);
  m.zero_grads();
  const double loss = m.forward_backward(b.tokens.data(), b.targets.data(), B, T, 1.0 / double(B * T));
  const float* g = m.grads().data<float>();
  return {loss, std::vector<float>(g, g + m.grads().numel())};
}

bool bitwise_equal(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

}  // namespace

TEST(ChatMasking, TheLayoutKeyIsParsedAndChecked) {
  EXPECT_EQ(chat_config("d", "pad", 64).data.chat_layout, data::ChatLayout::pad);
  EXPECT_EQ(chat_config("d", "pack", 64).data.chat_layout, data::ChatLayout::pack);
  const std::string e = data::testing::error_of([] { chat_config("d", "packed", 64); });
  EXPECT_EQ(e, "[config] data.chat_layout: \"packed\" is not one of: pack, pad");
  // Plain text has no conversations to pad.
  const std::string dir = loom::testing::temp_dir("chat_layout_text");
  const std::string text = loom::testing::prepare_shakespeare(dir, 5000);
  EXPECT_NE(data::testing::error_of([&] {
              train::DatasetSource s(chat_config(text, "pad", 64), nullptr);
            }).find("holds plain text (no loss mask), but the pad layout"),
            std::string::npos);
}

TEST(ChatMasking, TargetsAreIgnoredExactlyWhereTheMaskSaysInBothLayouts) {
  const std::string dir = loom::testing::temp_dir("chat_targets");
  const std::string data = prepare_chat(dir, chat_jsonl("Four.", "Thanks!"));
  const data::TokenDataset shard(data + "/train.bin");
  std::vector<int32_t> ids(size_t(shard.size()));
  std::vector<uint8_t> mask(size_t(shard.size()));
  shard.read(0, shard.size(), ids.data());
  shard.read_mask(0, shard.size(), mask.data());
  const int64_t B = 4;
  for (const char* layout : {"pad", "pack"}) {
    SCOPED_TRACE(layout);
    const int64_t T = std::string(layout) == "pad" ? 176 : 320;  // pack: both conversations in a row
    const train::TrainConfig cfg = chat_config(data, layout, T);
    train::DatasetSource src(cfg, nullptr);
    const data::TokenDataset same(data + "/train.bin", {.seed = cfg.data.seed, .layout = cfg.data.chat_layout});
    int64_t trained = 0;
    for (int64_t step = 0; step < 6; ++step) {
      const Batch b = train_batch(src, step, B, T);
      for (int64_t r = 0; r < B; ++r) {
        const int64_t start = same.window_start(step, r, B, T);
        for (int64_t t = 0; t < T; ++t) {
          const size_t i = size_t(r * T + t), next = size_t(start + t + 1);
          const bool in_shard = next < ids.size();
          const bool same_conversation = in_shard && !(mask[next] & data::kMaskConversationStart);
          const bool trains = same_conversation && (mask[next] & data::kMaskTrained);
          EXPECT_EQ(b.targets[i], trains ? ids[next] : -1) << "step " << step << " row " << r << " t " << t;
          trained += trains;
        }
      }
    }
    EXPECT_GT(trained, 0);
  }
}

TEST(ChatMasking, GradientsDoNotDependOnTheUserTurnsAsTargets) {
  const int64_t B = 4, T = 176;  // the conversations have 152 and 167 tokens
  const std::string dir = loom::testing::temp_dir("chat_grads");
  auto batch_of = [&](const std::string& name, const std::string& reply, const std::string& last_user) {
    const std::string data = prepare_chat(dir + "/" + name, chat_jsonl(reply, last_user));
    train::DatasetSource src(chat_config(data, "pad", T), nullptr);
    return train_batch(src, 3, B, T);
  };
  const Batch a = batch_of("a", "Four.", "Thanks!");
  const Batch b = batch_of("b", "Four.", "Why is that so? Tell me more, please.");
  const Batch c = batch_of("c", "Five.", "Thanks!");
  ASSERT_NE(a.tokens, b.tokens);    // the user's last turn differs, as inputs
  ASSERT_EQ(a.targets, b.targets);  // but never as a target: it follows the last reply
  const model::ModelConfig cfg = chat_config("d", "pad", T).model;
  const auto [loss_a, grads_a] = loss_and_grads(cfg, a, B, T);
  const auto [loss_b, grads_b] = loss_and_grads(cfg, b, B, T);
  EXPECT_EQ(loss_a, loss_b);
  EXPECT_TRUE(bitwise_equal(grads_a, grads_b));

  // Any negative target is ignored alike (Hugging Face writes -100).
  Batch hf = a;
  for (int32_t& t : hf.targets)
    if (t < 0) t = -100;
  EXPECT_TRUE(bitwise_equal(grads_a, loss_and_grads(cfg, hf, B, T).second));

  // The check can fail: a different reply changes the gradients, and so does training the
  // user's turn (its targets as the tokens that follow).
  EXPECT_FALSE(bitwise_equal(grads_a, loss_and_grads(cfg, c, B, T).second));
  Batch unmasked = a;
  for (int64_t i = 0; i + 1 < B * T; ++i)
    if ((i + 1) % T != 0) unmasked.targets[size_t(i)] = a.tokens[size_t(i + 1)];
  EXPECT_FALSE(bitwise_equal(grads_a, loss_and_grads(cfg, unmasked, B, T).second));
}

TEST(ChatMasking, ThePadLayoutSaysHowManyConversationsItCuts) {
  const std::string dir = loom::testing::temp_dir("chat_cut");
  const std::string data = prepare_chat(dir, chat_jsonl("Four.", "Thanks!"));
  std::FILE* log = std::tmpfile();
  train::DatasetSource src(chat_config(data, "pad", 160), log);
  std::rewind(log);
  char line[512] = {};
  ASSERT_NE(std::fgets(line, sizeof line, log), nullptr);
  std::fclose(log);
  EXPECT_EQ(std::string(line), "[data] 1 of 2 conversations in " + data +
                                   "/train.bin are longer than data.seq_len + 1 = 161 tokens; the pad layout trains "
                                   "their first 160 targets only (raise data.seq_len)\n");
}

namespace {

// Every step, rows 0..3 of the inner source's 4-row batch: all but row 0 masked (targets -1), or
// row 0 alone.
class RowZero : public train::BatchSource {
 public:
  RowZero(train::BatchSource& inner, bool alone) : in_(inner), alone_(alone) {}
  void fill_train(int64_t step, int64_t first, int64_t n, int64_t, int64_t T, int32_t* tok, int32_t* tgt,
                  int32_t*) override {
    std::vector<int32_t> t(4 * T), g(4 * T);
    in_.fill_train(step, 0, 4, 4, T, t.data(), g.data(), nullptr);
    if (!alone_)
      for (int64_t i = T; i < 4 * T; ++i) g[i] = -1;
    for (int64_t r = 0; r < n; ++r) {
      std::memcpy(tok + r * T, t.data() + (first + r) * T, sizeof(int32_t) * T);
      std::memcpy(tgt + r * T, g.data() + (first + r) * T, sizeof(int32_t) * T);
    }
  }
  void fill_val(int64_t i, int64_t B, int64_t T, int32_t* tok, int32_t* tgt, int32_t*) override {
    in_.fill_val(i, B, T, tok, tgt, nullptr);
  }
  int64_t vocab_size() const override { return in_.vocab_size(); }
  bool has_val() const override { return false; }

 private:
  train::BatchSource& in_;
  bool alone_;
};

// The first step's gradient norm (before clipping), and the gradient as the optimizer used it:
// Adam's first moment after one step is (1 - beta1) x that gradient.
std::pair<double, std::vector<float>> first_step_grads(const train::TrainConfig& cfg, train::BatchSource& src) {
  train::TrainerOptions o = loom::testing::quiet();
  double norm = -1;
  o.observer.on_step = [&](const train::LoggedStep& s) {
    if (s.step == 1) norm = s.grad_norm;
  };
  train::Trainer t(cfg, src, o);
  t.run();
  const int64_t n = t.model().params().numel();
  Tensor m = Tensor::zeros({n}, DType::f32), v = Tensor::zeros({n}, DType::f32);
  t.data_parallel().gather_full_moments(m, v);
  return {norm, m.to_f32_vector()};
}

}  // namespace

// A batch of four rows of which three are masked out trains like the one row that is left: the
// gradient (as the optimizer uses it, and its norm) is the mean over the trained tokens, not over
// every position of the batch (which would make it four times smaller).
TEST(ChatMasking, TheGradientIsTheMeanOverTheTrainedTokens) {
  const std::string dir = loom::testing::temp_dir("mask_mean");
  const std::string data = loom::testing::prepare_shakespeare(dir, 20000);
  const auto config = [&](int64_t batch) {
    return train::parse_train_config(loom::testing::tiny_config_yaml(data, ""),
                                     {"schedule.steps=1", "log.every=1", "data.micro_batch_size=0",
                                      "schedule.clip.max_norm=0", "data.batch_size=" + std::to_string(batch)});
  };
  const train::TrainConfig four = config(4);
  train::DatasetSource inner(four);
  RowZero masked(inner, false), alone(inner, true);
  const auto [m, mg] = first_step_grads(four, masked);
  const auto [a, ag] = first_step_grads(config(1), alone);
  ASSERT_GT(a, 0);
  EXPECT_NEAR(m / a, 1.0, 1e-5) << "masked " << m << ", alone " << a;
  ASSERT_EQ(mg.size(), ag.size());
  double worst = 0;
  for (size_t i = 0; i < ag.size(); ++i) worst = std::max(worst, double(std::abs(mg[i] - ag[i])));
  EXPECT_LT(worst, 1e-6 * a) << "the gradients the optimizer used differ (largest difference " << worst << ")";
}

// The pack layout puts both conversations of the shard (152 and 167 tokens) in one row of 320,
// positions restarting at the second; the pad layout's rows are one conversation each.
TEST(ChatMasking, PackedRowsRestartPositionsAtEachConversation) {
  const std::string dir = loom::testing::temp_dir("chat_positions");
  const std::string data = prepare_chat(dir, chat_jsonl("Four.", "Thanks!"));
  for (const char* layout : {"pad", "pack"}) {
    SCOPED_TRACE(layout);
    const bool pack = std::string(layout) == "pack";
    const int64_t T = 320, B = 2;
    train::DatasetSource src(chat_config(data, layout, T), nullptr);
    EXPECT_EQ(src.packs_documents(), pack);
    std::vector<int32_t> tok(size_t(B * T)), tgt(size_t(B * T)), pos(size_t(B * T), -7);
    src.fill_train(3, 0, B, B, T, tok.data(), tgt.data(), pos.data());
    for (int64_t r = 0; r < B; ++r)
      for (int64_t t = 0; t < T; ++t) {
        const int32_t want = pack ? int32_t(t < 152 ? t : t - 152) : int32_t(t);
        EXPECT_EQ(pos[size_t(r * T + t)], want) << "row " << r << " t " << t;
      }
  }
}

namespace {

// The loss sum and the gradient (f64) of one forward/backward over [B, T] rows.
std::pair<double, std::vector<double>> loss_and_grads_f64(const model::ModelConfig& cfg, int64_t checkpoint,
                                                          const std::vector<int32_t>& tok,
                                                          const std::vector<int32_t>& tgt, const int32_t* pos,
                                                          int64_t B, int64_t T) {
  model::DecoderOptions o;
  o.activation_checkpoint_interval = checkpoint;
  model::Decoder m(cfg, o, DType::f64);
  m.init_weights(7);
  m.zero_grads();
  const double loss = m.forward_backward(tok.data(), tgt.data(), B, T, 1.0, nullptr, pos);
  const double* g = m.grads().data<double>();
  return {loss, std::vector<double>(g, g + m.grads().numel())};
}

double largest_difference(const std::vector<double>& a, const std::vector<double>& b) {
  double w = 0, m = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    w = std::max(w, std::fabs(a[i] - b[i]));
    m = std::max(m, std::fabs(b[i]));
  }
  return w / m;
}

}  // namespace

// Both conversations of a shard packed into one row, with their positions, give the loss and the
// gradients of the two conversations in rows of their own (the pad layout), to f64 rounding: with
// RoPE (llama) and learned positions (GPT-2), with and without recomputation. Without the
// positions the second conversation sees the first, and the gradients differ.
TEST(ChatMasking, APackedRowTrainsLikeItsConversationsApart) {
  const std::string dir = loom::testing::temp_dir("chat_packed_row");
  const std::string data = prepare_chat(dir, chat_jsonl("Four.", "Thanks!"));
  const data::TokenDataset shard(data + "/train.bin");
  const int64_t N = shard.size(), Tp = N + 1, Ta = 176;  // conversations of 152 and 167 tokens
  ASSERT_EQ(shard.conversation_starts().size(), 2u);
  std::vector<int32_t> ids(static_cast<size_t>(N));
  std::vector<uint8_t> mask(static_cast<size_t>(N));
  shard.read(0, N, ids.data());
  shard.read_mask(0, N, mask.data());
  // The pack layout's row: both conversations, then one padding token.
  const data::TokenDataset packed(data + "/train.bin", {.layout = data::ChatLayout::pack});
  std::vector<int32_t> tok(static_cast<size_t>(Tp)), tgt(static_cast<size_t>(Tp)), pos(static_cast<size_t>(Tp));
  packed.fill_eval_batch(0, 1, Tp, tok.data(), tgt.data(), pos.data());
  ASSERT_EQ(packed.eval_windows(Tp), 1);
  for (int64_t t = 0; t < N; ++t) {  // each conversation's own targets, in the shard's order
    const uint8_t next = t + 1 < N ? mask[size_t(t + 1)] : data::kMaskConversationStart;
    ASSERT_EQ(tok[size_t(t)], ids[size_t(t)]);
    ASSERT_EQ(tgt[size_t(t)],
              (next & data::kMaskTrained) && !(next & data::kMaskConversationStart) ? ids[size_t(t + 1)] : -1);
  }
  const data::TokenDataset pad(data + "/train.bin", {.layout = data::ChatLayout::pad});
  std::vector<int32_t> atok(size_t(2 * Ta)), atgt(size_t(2 * Ta));
  pad.fill_eval_batch(0, 2, Ta, atok.data(), atgt.data());  // conversation 0, then 1
  for (const char* preset : {"llama-tiny", "gpt2-tiny"})
    for (int64_t checkpoint : {0, 1}) {
      SCOPED_TRACE(std::string(preset) + (checkpoint ? " recomputed" : ""));
      model::ModelConfig cfg = model::preset(preset);
      cfg.vocab_size = 256;
      cfg.n_ctx = 320;
      const auto [loss, grads] = loss_and_grads_f64(cfg, checkpoint, tok, tgt, pos.data(), 1, Tp);
      const auto [apart, apart_grads] = loss_and_grads_f64(cfg, checkpoint, atok, atgt, nullptr, 2, Ta);
      EXPECT_NEAR(loss / apart, 1.0, 1e-13);
      EXPECT_LT(largest_difference(grads, apart_grads), 1e-11);
      if (checkpoint == 0) {
        EXPECT_GT(largest_difference(loss_and_grads_f64(cfg, 0, tok, tgt, nullptr, 1, Tp).second, apart_grads), 1e-4);
      }
    }
}

// Positions that neither start at 0 nor count up by one are refused, naming the row and token.
TEST(ChatMasking, PackedPositionsMustCountUpFromZero) {
  model::ModelConfig cfg = model::preset("llama-tiny");
  model::Decoder m(cfg);
  m.init_weights(7);
  const std::vector<int32_t> tok(8, 1), tgt(8, 2), bad = {0, 1, 2, 0, 1, 3, 4, 5};
  EXPECT_EQ(data::testing::error_of([&] { m.forward(tok.data(), tgt.data(), 1, 8, nullptr, bad.data()); }),
            "[model] packed positions of row 0 give 3 at token 5 where 2 or 0 was expected: a row's positions start "
            "at 0 and count up by one, restarting at 0 where another document starts");
  const std::vector<int32_t> good = {0, 1, 2, 0, 1, 2, 0, 1};
  EXPECT_GT(m.forward(tok.data(), tgt.data(), 1, 8, nullptr, good.data()), 0);
}

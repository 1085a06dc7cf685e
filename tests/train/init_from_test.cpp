// model.init_from on one process: the architecture comes from the source and architecture keys
// beside it are refused; a new run starts from the source's weights (a loom run directory, a
// Hugging Face directory, a GGUF file), bitwise in f32; data of another vocabulary is refused
// naming `loom prepare --tokenizer`; a resumed run continues from its own checkpoint.
#include <gtest/gtest.h>

#include <filesystem>

#include <nlohmann/json.hpp>

#include "loom/data/tokenizer.h"
#include "loom/io/file.h"
#include "loom/model/checkpoint_reader.h"
#include "loom/model/hf_weights.h"
#include "loom/train/init_from.h"
#include "parallel/mpi/synthetic_source.h"
#include "testing/errors.h"
#include "testing/gguf_fixture.h"
#include "train/train_testing.h"

using namespace loom;
using loom::testing::error_of;

namespace {

namespace fs = std::filesystem;

train::TrainConfig init_config(const std::string& from, std::vector<std::string> sets = {}) {
  std::vector<std::string> all = {"model.init_from=" + from, "data.dir=unused",          "data.seq_len=16",
                                  "data.batch_size=4",       "schedule.eval_interval=0", "log.progress=off"};
  all.insert(all.end(), sets.begin(), sets.end());
  return train::parse_train_config("{}", all, "<test>", train::init_source_config);
}

// A llama-family model written as llama.cpp writes one, with a 257-token byte-level vocabulary.
model::Decoder& tiny_llama() {
  static model::Decoder m = [] {
    model::ModelConfig c = model::preset("llama-tiny");
    c.vocab_size = 257;
    model::Decoder d(c);
    d.init_weights(7);
    return d;
  }();
  return m;
}

// tiny_llama() as a GGUF file with its byte-level vocabulary; returns the path.
std::string write_tiny_gguf(const std::string& path) {
  loom::testing::GgufFixture f;
  f.tokenizer = true;
  loom::testing::gguf_writer_of(tiny_llama(), f).write(path);
  return path;
}

std::vector<float> params_of(train::Trainer& t) { return t.full_params().to_f32_vector(); }

// The tokenizer a checkpoint's trainer_state.json records, as written.
std::string recorded_tokenizer(const std::string& ckpt) {
  return nlohmann::json::parse(io::read_file(ckpt + "/trainer_state.json")).value("tokenizer", "");
}

}  // namespace

TEST(InitFrom, ArchitectureKeysBesideItAreRefused) {
  const std::string dir = loom::testing::temp_dir("init_from_keys");
  const std::string gguf = write_tiny_gguf(dir + "/m.gguf");
  for (const char* key : {"model.n_layer=2", "model.preset=gpt2-tiny", "model.vocab_size=300"}) {
    const std::string k = std::string(key).substr(0, std::string(key).find('='));
    const std::string e = error_of([&] { init_config(gguf, {key}); });
    EXPECT_NE(e.find(k + ": the architecture comes from model.init_from=" + gguf), std::string::npos)
        << key << ": " << e;
  }
  const train::TrainConfig c = init_config(gguf, {"model.precision=bf16"});
  EXPECT_EQ(c.model.n_layer, tiny_llama().config().n_layer);
  EXPECT_EQ(c.model.vocab_size, 257);
  EXPECT_EQ(c.model.precision, model::Precision::bf16);
  EXPECT_EQ(c.model.name, "m");
  EXPECT_NE(error_of([&] {
              train::parse_train_config("{}", {"model.init_from=" + gguf, "data.dir=unused"});
            }).find("does not read model files"),
            std::string::npos);
  EXPECT_NE(error_of([&] { init_config(dir + "/absent.gguf"); }).find(dir + "/absent.gguf does not exist"),
            std::string::npos);
  // MoE training keys may be set beside it, the MoE architecture may not.
  EXPECT_NO_THROW(init_config(gguf, {"model.moe.router_aux_loss_coef=0.02"}));
  EXPECT_NE(error_of([&] {
              init_config(gguf, {"model.moe.num_experts=4"});
            }).find("model.moe.num_experts: the architecture comes from"),
            std::string::npos);
  // A source inside the run's own checkpoint directory could be pruned under it.
  EXPECT_NE(error_of([&] { init_config(gguf, {"checkpoint.dir=" + dir}); }).find("is inside checkpoint.dir=" + dir),
            std::string::npos);
  fs::remove_all(dir);
}

TEST(InitFrom, ANewRunStartsFromAGgufsWeightsAndRefusesDataOfAnotherVocabulary) {
  const std::string dir = loom::testing::temp_dir("init_from_gguf");
  const std::string gguf = write_tiny_gguf(dir + "/m.gguf");
  const train::TrainConfig cfg =
      init_config(gguf, {"schedule.steps=1", "checkpoint.dir=" + dir + "/run", "checkpoint.every_steps=1"});
  loom::testing::SyntheticSource src(257);
  {
    train::Trainer t(cfg, src, loom::testing::quiet());
    EXPECT_EQ(params_of(t), tiny_llama().params().to_f32_vector());
    t.run();
  }
  // The checkpoint carries the GGUF's vocabulary and chat files, and names them as its tokenizer.
  const std::string ckpt = dir + "/run/step_000001";
  EXPECT_EQ(recorded_tokenizer(ckpt), "tokenizer.gguf");
  for (const char* f : {"tokenizer.gguf", "tokenizer_config.json", "generation_config.json"})
    EXPECT_TRUE(fs::exists(fs::path(ckpt) / f)) << f;
  EXPECT_EQ(data::make_tokenizer(model::checkpoint_tokenizer(ckpt))->vocab_size(), 257);

  loom::testing::SyntheticSource bytes(256);
  const std::string w = error_of([&] { train::Trainer refused(cfg, bytes, loom::testing::quiet()); });
  EXPECT_NE(w.find("holds tokens of a 256-token vocabulary"), std::string::npos) << w;
  EXPECT_NE(w.find("loom prepare --tokenizer " + gguf), std::string::npos) << w;
  fs::remove_all(dir);
}

TEST(InitFrom, AHuggingFaceDirectoryLoadsIntoTheRunsLayout) {
  const std::string dir = loom::testing::temp_dir("init_from_hf");
  model::save_hf_pretrained(tiny_llama(), dir + "/hf");
  const model::ModelConfig c = train::init_source_config(dir + "/hf");
  EXPECT_EQ(c.n_layer, tiny_llama().config().n_layer);
  EXPECT_EQ(c.d_model, tiny_llama().config().d_model);
  // Into a model whose units are padded (as data parallelism pads them), then back out.
  model::DecoderOptions o;
  o.unit_align = 7;  // pads: the units of tiny_llama are not multiples of 7
  o.allocate_flat_grads = false;
  model::Decoder dst(c, o);
  const model::ParamLayout& padded = dst.layout();
  const model::ParamLayout whole(c, 1);
  ASSERT_NE(padded.total(), whole.total());
  Tensor flat = Tensor::zeros({padded.total()}, DType::f32);
  const std::string what =
      train::load_init_weights(train::resolve_init_source(dir + "/hf", comm::Group::single()), dst, flat, nullptr);
  EXPECT_NE(what.find("Hugging Face"), std::string::npos) << what;
  for (const auto& p : whole.params()) {
    const float* got = flat.data<float>() + padded.get(p.name).offset;
    const Tensor want = tiny_llama().param(p.name);
    for (int64_t i = 0; i < p.numel(); ++i) ASSERT_EQ(got[i], want.data<float>()[i]) << p.name << "[" << i << "]";
  }
  fs::remove_all(dir);
}

TEST(InitFrom, ALoomRunDirectoryGivesItsNewestWeightsAndAResumeKeepsItsOwn) {
  const std::string dir = loom::testing::temp_dir("init_from_loom");
  // The source: 3 steps of a byte-vocabulary model, checkpointed.
  const train::TrainConfig a = train::parse_train_config(
      "{}", {"model.preset=gpt2-tiny", "model.vocab_size=256", "data.dir=unused", "data.seq_len=16",
             "data.batch_size=4", "schedule.steps=3", "schedule.eval_interval=0", "log.progress=off",
             "checkpoint.dir=" + dir + "/a", "checkpoint.every_steps=3"});
  loom::testing::SyntheticSource src(256);
  std::vector<float> trained;
  {
    train::Trainer t(a, src, loom::testing::quiet());
    t.run();
    trained = params_of(t);
  }
  // A new run from it: its weights, at step 0; then 2 steps, checkpointed in its own directory.
  const train::TrainConfig b =
      init_config(dir + "/a", {"checkpoint.dir=" + dir + "/b", "checkpoint.every_steps=2", "schedule.steps=2"});
  EXPECT_EQ(b.model.n_layer, a.model.n_layer);
  std::vector<float> fine_tuned;
  {
    train::Trainer t(b, src, loom::testing::quiet());
    EXPECT_EQ(params_of(t), trained);
    EXPECT_EQ(t.step(), 0);
    t.run();
    fine_tuned = params_of(t);
  }
  EXPECT_NE(fine_tuned, trained);
  // Its checkpoints record the source's tokenizer ("byte", which the source's falls back to),
  // not the synthetic data's (none).
  EXPECT_EQ(recorded_tokenizer(model::resolve_checkpoint(dir + "/b")), "byte");
  // Resumed: the run's own step-2 weights, not the source's.
  {
    train::Trainer t(b, src, loom::testing::quiet("auto"));
    EXPECT_EQ(t.step(), 2);
    EXPECT_EQ(params_of(t), fine_tuned);
  }
  fs::remove_all(dir);
}

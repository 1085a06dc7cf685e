// model/checkpoint_reader.h on its own: a run directory resolves to its newest valid
// checkpoint (DIR/latest first), a damaged one is skipped and named, and the weights, config and
// tokenizer come back as saved. This binary links loom_model and its dependencies only (core,
// kernels, io), never loom_train, loom_parallel or MPI: a reader that grew such a dependency
// fails to link here (and checkpoint_reader_links_no_mpi checks the binary's libraries).
// The checkpoints are written by hand in the trainer's format (io/checkpoint_files.h); that the
// trainer's own checkpoints read the same is tests/parallel/mpi/checkpoint_reader_test.cpp.
#include <gtest/gtest.h>

#include <unistd.h>
#include <filesystem>
#include <fstream>
#include <map>
#include <vector>

#include <nlohmann/json.hpp>

#include "loom/io/checkpoint_files.h"
#include "loom/io/file.h"
#include "loom/io/manifest.h"
#include "loom/model/checkpoint_reader.h"
#include "loom/model/hf_weights.h"

using namespace loom;
namespace fs = std::filesystem;

namespace {

std::string fresh_dir(const std::string& name) {
  const fs::path p = fs::temp_directory_path() / str_cat("loom_reader_", name, "_", ::getpid());
  fs::remove_all(p);
  fs::create_directories(p);
  return p.string();
}

model::ModelConfig tiny() {
  model::ModelConfig c = model::preset("gpt2-tiny");
  c.vocab_size = 256;
  return c;
}

// DIR/step_N as the trainer writes it (weights, config, trainer state, run config, manifest),
// weights from `seed`; `latest` then names it. Returns its path.
std::string write_checkpoint(const std::string& dir, int64_t step, uint64_t seed, const std::string& tokenizer) {
  const std::string path = io::checkpoint_path(dir, step);
  fs::create_directories(path);
  model::Decoder m(tiny());
  m.init_weights(seed);
  io::ManifestWriter manifest(path);
  model::save_hf_safetensors(m.layout(), m.params(), (fs::path(path) / io::kWeightsFile).string());
  manifest.record(io::kWeightsFile);
  model::save_hf_safetensors(m.layout(), m.params(), (fs::path(path) / io::kExpAvgFile).string());
  manifest.record(io::kExpAvgFile);
  io::write_file_atomic((fs::path(path) / io::kHfConfigFile).string(), model::hf_config_json(m.config()));
  manifest.record(io::kHfConfigFile);
  nlohmann::json state = {{"step", step}, {"run_id", "0123456789abcdef"}};
  if (!tokenizer.empty()) state["tokenizer"] = tokenizer;
  io::write_file_atomic((fs::path(path) / io::kTrainerStateFile).string(), state.dump());
  manifest.record(io::kTrainerStateFile);
  io::write_file_atomic((fs::path(path) / io::kRunConfigFile).string(), "model:\n  preset: gpt2-tiny\n");
  manifest.record(io::kRunConfigFile);
  manifest.write(io::kTrainingCheckpointFormat, io::kTrainingCheckpointVersion, {{"step", step}});
  io::write_file_atomic((fs::path(dir) / "latest").string(), io::checkpoint_dir_name(step) + "\n");
  return path;
}

void flip_byte(const std::string& file, std::streamoff at) {
  std::fstream f(file, std::ios::in | std::ios::out | std::ios::binary);
  ASSERT_TRUE(f) << file;
  char c = 0;
  f.seekg(at);
  f.read(&c, 1);
  c = char(c ^ 0x40);
  f.seekp(at);
  f.write(&c, 1);
}

std::vector<float> weights_of(uint64_t seed) {
  model::Decoder m(tiny());
  m.init_weights(seed);
  return m.params().to_f32_vector();
}

}  // namespace

TEST(CheckpointReader, RunDirectoryResolvesToItsNewestValidCheckpoint) {
  const std::string dir = fresh_dir("newest");
  write_checkpoint(dir, 2, 2, "byte");
  write_checkpoint(dir, 6, 6, "byte");
  const std::string four = write_checkpoint(dir, 4, 4, "byte");  // the last save: `latest` names it
  EXPECT_EQ(model::resolve_checkpoint(dir), four);
  fs::remove(fs::path(dir) / "latest");
  EXPECT_EQ(model::resolve_checkpoint(dir), io::checkpoint_path(dir, 6)) << "without latest: the highest step";
  EXPECT_EQ(model::resolve_checkpoint(four), four) << "a checkpoint directory is itself";
}

TEST(CheckpointReader, DamagedCheckpointIsSkippedAndNamed) {
  const std::string dir = fresh_dir("damaged");
  write_checkpoint(dir, 2, 2, "byte");
  const std::string four = write_checkpoint(dir, 4, 4, "byte");
  flip_byte(four + "/" + io::kWeightsFile, 200);
  FILE* log = std::tmpfile();
  EXPECT_EQ(model::resolve_checkpoint(dir, log), io::checkpoint_path(dir, 2));
  std::rewind(log);
  char buf[512] = {};
  const size_t n = std::fread(buf, 1, sizeof buf - 1, log);
  std::fclose(log);
  EXPECT_NE(std::string(buf, n).find("[resume] skipping " + four), std::string::npos) << std::string(buf, n);
  // Named directly, the damaged one is refused with the reason.
  try {
    model::resolve_checkpoint(four);
    ADD_FAILURE() << "a damaged checkpoint resolved";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("failed verification"), std::string::npos) << e.what();
  }
  // Only the weights' files are the reader's business: damaged moments do not stop it.
  const std::string six = write_checkpoint(dir, 6, 6, "byte");
  flip_byte(six + "/" + io::kExpAvgFile, 200);
  EXPECT_EQ(model::resolve_checkpoint(dir), six);
  EXPECT_FALSE(io::verify_checkpoint(six, nullptr, io::VerifyScope::everything()));
  // Nothing valid at all: the error names the directory.
  const std::string empty = fresh_dir("empty");
  try {
    model::resolve_checkpoint(empty);
    ADD_FAILURE() << "an empty directory resolved";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("no valid checkpoint in " + empty), std::string::npos) << e.what();
  }
}

TEST(CheckpointReader, WeightsConfigAndTokenizerComeBackAsSaved) {
  const std::string dir = fresh_dir("weights");
  const std::string path = write_checkpoint(dir, 7, 7, "");
  const model::ModelConfig cfg = model::checkpoint_model_config(path);
  EXPECT_EQ(cfg.name, "gpt2-tiny") << "the preset config.yaml names";
  EXPECT_EQ(cfg.vocab_size, 256);
  EXPECT_EQ(model::checkpoint_tokenizer(path), "byte") << "unrecorded, 256 entries: bytes";
  model::Decoder m(cfg);
  const model::CheckpointWeights w = model::read_checkpoint_weights(path, m);
  EXPECT_EQ(w.step, 7);
  EXPECT_EQ(w.run_id, "0123456789abcdef");
  EXPECT_EQ(m.params().to_f32_vector(), weights_of(7));
  EXPECT_EQ(model::checkpoint_tokenizer(write_checkpoint(dir, 8, 8, "gpt2")), "gpt2");
}

// Rank 1 of tp=2 of a GPT-2 small enough to write out: d_model 4, 2 heads, d_ff 8, vocab 5, 3
// positions, one block. Whole element i holds i + 1, so each expected value below names the
// whole element it must come from, by Megatron-LM's split (Shoeybi et al. 2019, section 3):
// column-parallel weights (c_attn's q, k and v each, c_fc) and their biases by output rows,
// row-parallel weights (both c_proj) by input columns, the rest whole. The token table holds
// rows ceil(5 / 2) = 3 per rank, the last of rank 1 padding (0).
TEST(CheckpointReader, SliceOfTheWholeModelIsTheSameElements) {
  model::ModelConfig cfg = model::preset("gpt2-tiny");
  cfg.n_layer = 1;
  cfg.d_model = 4;
  cfg.n_head = cfg.n_kv_head = 2;
  cfg.d_ff = 8;
  cfg.vocab_size = 5;
  cfg.n_ctx = 3;
  model::Decoder whole(cfg);
  ASSERT_EQ(whole.layout().num_params(), 212);
  float* w = whole.params().data<float>();
  for (int64_t i = 0; i < 212; ++i) w[i] = float(i + 1);
  model::DecoderOptions o;
  o.allocate_flat_grads = false;
  o.slice.tp = 2;
  o.slice.tp_rank = 1;
  model::Decoder half(cfg, o);
  model::slice_whole_params(whole.layout(), whole.params(), half.layout(), half.params());

  const std::map<std::string, std::vector<float>> expected = {
      // whole [5, 4] at 0: rows 3 and 4, then a padding row
      {"transformer.wte.weight", {13, 14, 15, 16, 17, 18, 19, 20, 0, 0, 0, 0}},
      {"transformer.wpe.weight", {21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31, 32}},
      {"transformer.h.0.ln_1.weight", {33, 34, 35, 36}},
      {"transformer.h.0.ln_1.bias", {37, 38, 39, 40}},
      // whole [12, 4] at 40, q rows 0-3, k 4-7, v 8-11: rows 2, 3, 6, 7, 10, 11
      {"transformer.h.0.attn.c_attn.weight",
       {49, 50, 51, 52, 53, 54, 55, 56, 65, 66, 67, 68, 69, 70, 71, 72, 81, 82, 83, 84, 85, 86, 87, 88}},
      {"transformer.h.0.attn.c_attn.bias", {91, 92, 95, 96, 99, 100}},  // whole [12] at 88
      // whole [4, 4] at 100: columns 2 and 3 of each row
      {"transformer.h.0.attn.c_proj.weight", {103, 104, 107, 108, 111, 112, 115, 116}},
      {"transformer.h.0.attn.c_proj.bias", {117, 118, 119, 120}},
      {"transformer.h.0.ln_2.weight", {121, 122, 123, 124}},
      {"transformer.h.0.ln_2.bias", {125, 126, 127, 128}},
      // whole [8, 4] at 128: rows 4-7
      {"transformer.h.0.mlp.c_fc.weight",
       {145, 146, 147, 148, 149, 150, 151, 152, 153, 154, 155, 156, 157, 158, 159, 160}},
      {"transformer.h.0.mlp.c_fc.bias", {165, 166, 167, 168}},  // whole [8] at 160
      // whole [4, 8] at 168: columns 4-7 of each row
      {"transformer.h.0.mlp.c_proj.weight",
       {173, 174, 175, 176, 181, 182, 183, 184, 189, 190, 191, 192, 197, 198, 199, 200}},
      {"transformer.h.0.mlp.c_proj.bias", {201, 202, 203, 204}},
      {"transformer.ln_f.weight", {205, 206, 207, 208}},
      {"transformer.ln_f.bias", {209, 210, 211, 212}},
  };
  ASSERT_EQ(half.layout().params().size(), expected.size());
  for (const auto& p : half.layout().params()) {
    ASSERT_TRUE(expected.count(p.name)) << p.name;
    const float* got = half.params().data<float>() + p.offset;
    EXPECT_EQ(std::vector<float>(got, got + p.numel()), expected.at(p.name)) << p.name;
  }
}

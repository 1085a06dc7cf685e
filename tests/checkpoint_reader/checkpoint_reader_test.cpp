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

TEST(CheckpointReader, SliceOfTheWholeModelIsTheSameElements) {
  const model::ModelConfig cfg = tiny();
  model::Decoder whole(cfg);
  whole.init_weights(3);
  model::DecoderOptions o;
  o.allocate_flat_grads = false;
  o.slice.tp = 2;
  o.slice.tp_rank = 1;
  model::Decoder half(cfg, o);
  model::slice_whole_params(whole.layout(), whole.params(), half.layout(), half.params());
  for (const auto& p : half.layout().params())
    for (const auto& run : half.layout().element_runs(p))
      for (int64_t i = 0; i < run.n; i += 7)
        ASSERT_EQ(half.params().data<float>()[p.offset + run.local + i],
                  whole.params().data<float>()[whole.layout().get(p.name).offset + run.global + i])
            << p.name;
}

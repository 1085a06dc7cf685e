// Helpers for trainer tests: a prepared byte-level dataset in a temporary directory and a
// tiny model config around it.
#pragma once
#include <unistd.h>
#include <filesystem>
#include <fstream>

#include <string>

#include "loom/data/prepare.h"
#include "loom/train/train_config.h"
#include "loom/train/trainer.h"
#include "testing/temp_dir.h"

namespace loom::testing {

// Trainer options for a test run: silent (one /dev/null stream per process), no MFU timing.
inline train::TrainerOptions quiet_trainer_options(const parallel::Mesh* mesh = nullptr, const std::string& resume = "",
                                                   int64_t stop = -1) {
  static FILE* const devnull = std::fopen("/dev/null", "w");
  train::TrainerOptions o;
  o.mesh = mesh;
  o.resume = resume;
  o.stop_after_steps = stop;
  o.peak_gflops = 1;
  o.log = devnull;
  return o;
}

// The same for one process.
inline train::TrainerOptions quiet(const std::string& resume = "", int64_t stop = -1) {
  return quiet_trainer_options(nullptr, resume, stop);
}

// Flips the bits `mask` of the byte at `offset`, keeping the file's size: a damaged checkpoint
// file that only its checksum can catch. False when the file cannot be opened.
inline bool flip_byte(const std::string& path, std::streamoff offset, char mask) {
  std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
  if (!f) return false;
  char c = 0;
  f.seekg(offset);
  f.read(&c, 1);
  c = char(c ^ mask);
  f.seekp(offset);
  f.write(&c, 1);
  return bool(f);
}

// Prepares a byte-level dataset from a slice of Tiny Shakespeare.
inline std::string prepare_shakespeare(const std::string& dir, size_t bytes = 60000) {
  std::ifstream in(std::string(LOOM_SOURCE_DIR) + "/data/tinyshakespeare/input.txt");
  std::string text(bytes, '\0');
  in.read(text.data(), std::streamsize(bytes));
  text.resize(size_t(in.gcount()));
  const std::string src = dir + "/input.txt";
  std::ofstream(src) << text;
  data::PrepareOptions o;
  o.inputs = {src};
  o.tokenizer = "byte";
  o.out_dir = dir + "/data";
  o.force = true;
  data::prepare(o);
  return o.out_dir;
}

inline std::string tiny_config_yaml(const std::string& data_dir, const std::string& ckpt_dir) {
  return "model:\n  preset: gpt2-tiny\n  vocab_size: 256\n  n_ctx: 32\n"
         "data:\n  dir: " +
         data_dir +
         "\n  seq_len: 32\n  batch_size: 8\n  micro_batch_size: 4\n"
         "optim:\n  lr: 3.0e-3\n"
         "schedule:\n  steps: 20\n  warmup_steps: 4\n  eval_interval: 0\n  eval_batches: 2\n"
         "checkpoint:\n  dir: " +
         ckpt_dir +
         "\n  keep_last: 3\n"
         "log:\n  every: 1000\n  progress: off\n";
}

}  // namespace loom::testing

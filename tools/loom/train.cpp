// `loom train CONFIG.yaml [--set key=value]... [--resume auto|DIR] [--metrics FILE]`.
#include <cstdio>
#include <filesystem>

#include <nlohmann/json.hpp>

#include "loom/data/dataset.h"
#include "loom/train/trainer.h"
#include "tools/loom/commands.h"

namespace loom::cli {

namespace {

// The trainer's view of a prepared data directory (train.bin and, when present, val.bin).
class DatasetSource final : public train::BatchSource {
 public:
  DatasetSource(const train::TrainConfig& cfg) {
    data::DatasetOptions o;
    o.model_vocab = cfg.model.vocab_size;
    o.seed = cfg.data.seed;
    train_ = std::make_unique<data::TokenDataset>(data::TokenDataset::open_split(cfg.data.dir, "train", o));
    if (std::filesystem::exists(std::filesystem::path(cfg.data.dir) / "val.bin"))
      val_ = std::make_unique<data::TokenDataset>(data::TokenDataset::open_split(cfg.data.dir, "val", o));
  }
  void fill_train(int64_t step, int64_t first, int64_t n, int64_t global, int64_t T, int32_t* tok,
                  int32_t* tgt) override {
    train_->fill_batch(step, first, n, global, T, tok, tgt);
  }
  void fill_val(int64_t index, int64_t B, int64_t T, int32_t* tok, int32_t* tgt) override {
    val_->fill_eval_batch(index, B, T, tok, tgt);
  }
  int64_t vocab_size() const override { return int64_t(train_->header().vocab_size); }
  bool has_val() const override { return val_ != nullptr; }

 private:
  std::unique_ptr<data::TokenDataset> train_, val_;
};

const char* kHelp =
    "usage: loom train CONFIG.yaml [--set key=value]... [--resume auto|DIR] [--metrics FILE]\n\n"
    "Trains a model as the YAML config says (see docs/CONFIG.md and configs/).\n"
    "  --set key=value   override a config key, e.g. --set optim.lr=3e-4 (repeatable)\n"
    "  --resume auto     continue from the newest valid checkpoint in checkpoint.dir\n"
    "  --resume DIR      continue from that checkpoint directory\n"
    "  --metrics FILE    JSONL metrics, one object per logged step (= log.metrics_path)\n"
    "The last line is SUMMARY {json}.\n";

}  // namespace

int cmd_train(const std::vector<std::string>& argv) {
  Args a("train", argv, {{"set", true}, {"resume", true}, {"metrics", true}, {"help", false}});
  if (a.has("help")) {
    std::printf("%s", kHelp);
    return 0;
  }
  if (a.positional().size() != 1) throw UsageError(std::string("[train] expected one CONFIG.yaml\n\n") + kHelp);
  std::vector<std::string> sets = a.get_all("set");
  if (a.has("metrics")) sets.push_back("log.metrics_path=" + a.get("metrics", ""));
  train::TrainConfig cfg = train::load_train_config(a.positional()[0], sets);
  DatasetSource data(cfg);
  train::TrainerOptions opt;
  opt.resume = a.get("resume", "");
  train::Trainer trainer(cfg, data, opt);
  train::TrainResult r = trainer.run();
  nlohmann::json s = {{"steps", r.steps}, {"final_train_loss", r.final_train_loss},
                      {"final_val_loss", r.final_val_loss < 0 ? nlohmann::json(nullptr) : nlohmann::json(r.final_val_loss)},
                      {"tokens_per_s", r.tokens_per_s}, {"peak_bytes", r.peak_bytes},
                      {"checkpoint", r.last_checkpoint}};
  std::printf("SUMMARY %s\n", s.dump().c_str());
  return 0;
}

}  // namespace loom::cli

// Trainer's checkpoints: resuming from one (a path or the newest valid one in checkpoint.dir),
// saving on the configured step or time interval, synchronously or through the background
// writer, and agreeing across ranks on how a background write ended.
#include <filesystem>
#include <optional>

#include "loom/core/timer.h"
#include "loom/model/lora_merge.h"
#include "loom/train/checkpoint.h"
#include "loom/train/checkpoint_agreement.h"
#include "loom/train/checkpoint_dir.h"
#include "loom/train/checkpoint_writer.h"
#include "loom/train/trainer.h"

namespace loom::train {

void Trainer::resume_from(const std::string& spec) {
  std::string path = spec;
  FILE* log = main_rank() ? opt_.log : nullptr;
  if (spec == "auto") {
    LOOM_CHECK(!cfg_.checkpoint.dir.empty(), "train", "--resume auto needs checkpoint.dir in the config");
    auto found =
        find_latest_valid_checkpoint(cfg_.checkpoint.dir, log, checkpoint_load_scope(mesh_->world()), &mesh_->world());
    if (!found) {
      if (log)
        std::fprintf(log, "[resume] no valid checkpoint in %s; starting from step 0\n", cfg_.checkpoint.dir.c_str());
      return;
    }
    path = *found;
  }
  if (model_->lora()) {
    check_lora_base(path);
  } else {
    LOOM_CHECK(!model::is_lora_checkpoint(path), "resume", path,
               " holds LoRA adapters, not a whole model; resume it with the model.lora settings it was trained with "
               "(or start full training in another checkpoint.dir)");
  }
  const CheckpointMeta meta =
      load_checkpoint(path, *model_, *data_parallel_, model_parallel_info(), /*verified=*/spec == "auto");
  step_ = meta.step;
  last_checkpoint_ = path;
  skipped_windows_ = meta.skipped_windows;
  if (scaler_.enabled() && meta.loss_scale > 0) scaler_.restore(meta.loss_scale, meta.loss_scale_clean_steps);
  run_id_ = meta.run_id.empty() ? new_run_id(mesh_->world()) : meta.run_id;
  if (!log) return;
  const std::string run = meta.run_id.empty()
                              ? str_cat("a run saved before run ids were recorded, continued as run ", run_id_)
                              : str_cat("run ", run_id_);
  if (meta.resharded_from.empty())
    std::fprintf(log, "[resume] resumed %s from %s at step %lld\n", run.c_str(), path.c_str(), (long long)step_);
  else
    std::fprintf(log, "[resume] resumed %s from %s at step %lld, resharded from %s to %s zero_stage=%d\n", run.c_str(),
                 path.c_str(), (long long)step_, meta.resharded_from.c_str(), layout_desc_.c_str(),
                 data_parallel_->zero_stage());
}

void Trainer::identify_lora_base() {
  if (!main_rank()) return;
  if (cfg_.init_from.empty()) {
    lora_base_ = str_cat("random weights of schedule.seed=", cfg_.schedule.seed);
    lora_base_sha256_ = str_cat("seed ", cfg_.schedule.seed);
    return;
  }
  // A loom run directory as the source: the checkpoint it resolved to, which stays what it is
  // when that run saves again.
  const std::string base = init_source_.card ? cfg_.init_from : init_source_.checkpoint;
  lora_base_ = std::filesystem::absolute(base).lexically_normal().string();
  lora_base_sha256_ = init_source_sha256(init_source_);
}

void Trainer::check_lora_base(const std::string& checkpoint) {
  on_every_rank_or_none(mesh_->world(), str_cat("checking ", checkpoint, "'s LoRA base"), [&] {
    if (!main_rank()) return;
    LOOM_CHECK(model::is_lora_checkpoint(checkpoint), "resume", checkpoint,
               " holds a whole model, not LoRA adapters; resume it without model.lora, or start the LoRA run in "
               "another checkpoint.dir");
    const model::LoraCheckpoint c = model::read_lora_checkpoint(checkpoint);
    LOOM_CHECK(c.base_sha256 == lora_base_sha256_, "resume", checkpoint, "'s adapters were trained on ", c.base,
               " (sha256 ", c.base_sha256.substr(0, 12), "), but this run's model is ", lora_base_, " (sha256 ",
               lora_base_sha256_.substr(0, 12), "); set model.init_from to the model they were trained on");
    // The adapters' shape and scale must be this run's: another alpha would resume at another scale.
    model::ModelConfig saved = cfg_.model;
    saved.lora.rank = c.lora.rank;
    saved.lora.alpha = c.lora.alpha;
    saved.lora.targets = c.lora.targets;
    LOOM_CHECK(c.lora.rank == cfg_.model.lora.rank && c.lora.alpha == cfg_.model.lora.alpha &&
                   model::lora_modules(saved) == model::lora_modules(cfg_.model),
               "resume", checkpoint, " holds adapters of ", c.lora.describe(), ", but this run sets ",
               cfg_.model.lora.describe(), "; resume with the model.lora settings it was trained with");
  });
}

void Trainer::init_from_source() {
  std::string what;
  on_every_rank_or_none(mesh_->world(), str_cat("model.init_from=", cfg_.init_from, " failed to load"), [&] {
    if (model_->lora()) {  // the frozen model (straight into an f32 base); the adapters stay as they are
      const bool sliced = !model_->base_layout().whole_model();
      const model::ParamLayout whole_base(cfg_.model, 1);
      const bool f32 = model_->base_params().dtype() == DType::f32;
      const Tensor into = f32 ? model_->base_params()
                              : Tensor::zeros({model_->base_layout().total()}, DType::f32, MemCategory::workspace);
      what = load_init_weights(init_source_, *model_, into, sliced ? &whole_base : nullptr);
      if (!f32) model_->set_base_params(into);
      return;
    }
    Tensor flat = Tensor::zeros({model_->flat_size()}, DType::f32, MemCategory::workspace);
    what = load_init_weights(init_source_, *model_, flat, whole_layout_.get());
    data_parallel_->load_full_params(flat);
  });
  if (!main_rank()) return;
  if (model_->lora())
    std::fprintf(opt_.log, "[train] frozen weights from model.init_from=%s (%s)\n", cfg_.init_from.c_str(),
                 what.c_str());
  else
    std::fprintf(opt_.log, "[train] weights from model.init_from=%s (%s); optimizer state starts fresh\n",
                 cfg_.init_from.c_str(), what.c_str());
}

void Trainer::maybe_checkpoint(bool force) {
  if (cfg_.checkpoint.dir.empty()) return;
  const bool by_steps = cfg_.checkpoint.every_steps > 0 && step_ % cfg_.checkpoint.every_steps == 0;
  bool by_time =
      cfg_.checkpoint.every_minutes > 0 && now_seconds() - last_checkpoint_time_ >= cfg_.checkpoint.every_minutes * 60;
  if (cfg_.checkpoint.every_minutes > 0 && mesh_->world().size() > 1) {
    // Clocks differ between ranks; saving is collective, so rank 0's clock decides for all.
    Tensor flag = Tensor::from_vector<int32_t>({by_time ? 1 : 0}, {1});
    mesh_->world().broadcast(flag, 0);
    by_time = flag.data<int32_t>()[0] != 0;
  }
  if (!(force || by_steps || by_time)) return;
  if (last_checkpoint_.size() && checkpoint_step_of(last_checkpoint_) == step_) return;
  if (async_pending_ && async_step_ == step_) return;
  const SaveOptions save{cfg_.resolved_yaml,
                         cfg_.checkpoint.keep_last,
                         card_files_.tokenizer.empty() ? data_.tokenizer_name() : card_files_.tokenizer,
                         run_id_,
                         scaler_.enabled() ? scaler_.scale() : 0.0,
                         scaler_.clean_steps(),
                         skipped_windows_,
                         card_files_.files,
                         fallback_step(),
                         lora_base_,
                         lora_base_sha256_};
  Stopwatch sw;
  if (!cfg_.checkpoint.async) {
    last_checkpoint_ =
        save_checkpoint(cfg_.checkpoint.dir, step_, *model_, *data_parallel_, save, model_parallel_info());
    checkpoint_stall_s_ += sw.seconds();
    ++checkpoints_;
    if (main_rank())
      std::fprintf(opt_.log, "[checkpoint] step %lld saved to %s (%.1f s)\n", (long long)step_,
                   last_checkpoint_.c_str(), sw.seconds());
    last_checkpoint_time_ = now_seconds();
    return;
  }
  finish_async_checkpoint(/*wait=*/true);  // at most one write in flight
  const double waited = sw.seconds();
  if (main_rank() && !writer_) writer_ = std::make_unique<CheckpointWriter>();
  CheckpointSnapshot snap = snapshot_checkpoint(step_, *model_, *data_parallel_, save, model_parallel_info(),
                                                main_rank() ? writer_->spare() : nullptr);
  if (main_rank()) writer_->start(cfg_.checkpoint.dir, std::move(snap));
  async_pending_ = true;
  async_step_ = step_;
  checkpoint_stall_s_ += sw.seconds();
  ++checkpoints_;
  if (main_rank())
    std::fprintf(opt_.log, "[checkpoint] step %lld: state copied in %.2f s%s; writing in the background\n",
                 (long long)step_, sw.seconds() - waited,
                 waited > 0.05
                     ? str_cat(" (after waiting ", int(waited * 10) / 10.0, " s for the previous write)").c_str()
                     : "");
  last_checkpoint_time_ = now_seconds();
}

void Trainer::finish_async_checkpoint(bool wait) {
  if (!async_pending_) return;
  std::optional<CheckpointWriter::Result> r;
  if (main_rank() && writer_) r = wait ? writer_->wait() : writer_->poll();
  int state = !main_rank() ? 0 : !r ? 0 : r->ok ? 1 : 2;  // running, written, failed
  if (mesh_->world().size() > 1) {
    Tensor flag = Tensor::from_vector<int32_t>({state}, {1});
    mesh_->world().broadcast(flag, 0);
    state = flag.data<int32_t>()[0];
  }
  if (state == 0) return;
  async_pending_ = false;
  const std::string path = checkpoint_path(cfg_.checkpoint.dir, async_step_);
  throw_unless_ok_everywhere(
      mesh_->world(), state == 1, r ? r->error : "",
      str_cat("saving step ", async_step_, " to ", path, " in the background failed"),
      str_cat("; the earlier checkpoints in ", cfg_.checkpoint.dir,
              " are untouched: free space there or set another checkpoint.dir, then --resume auto"));
  last_checkpoint_ = path;
  if (r) checkpoint_write_s_ += r->seconds;
  if (main_rank())
    std::fprintf(opt_.log, "[checkpoint] step %lld saved to %s (%.1f s in the background)\n", (long long)async_step_,
                 path.c_str(), r ? r->seconds : 0.0);
}

}  // namespace loom::train

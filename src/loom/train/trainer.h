// The training loop: micro-batches with gradient accumulation, global-norm clipping (fixed
// or dynamic threshold), warmup + cosine LR, AdamW, periodic validation, logging (lines,
// JSONL metrics, a progress bar), guards (non-finite steps skipped, loss spikes rolled back),
// synchronous or asynchronous checkpoints and exact resume on any layout.
// Parallel layouts: data parallelism (ZeRO 0-3) through parallel::DataParallel, tensor
// parallelism through TensorParallelLayers, pipeline parallelism through PipelineStage, on the
// mesh pp x dp x tp; alone, each is a no-op.
// Files: trainer.cpp (construction, the step, evaluation, the run loop), trainer_start.cpp
// (stage partition, memory check, a new run's checkpoint directory), trainer_report.cpp (log
// lines, JSONL metrics, MoE statistics), trainer_guards.cpp (loss spikes and roll-back),
// trainer_checkpoints.cpp (resume, periodic and background saves).
#pragma once
#include <cstdio>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "loom/model/decoder.h"
#include "loom/optim/adamw.h"
#include "loom/optim/loss_scale.h"
#include "loom/parallel/data_parallel.h"
#include "loom/parallel/expert_parallel.h"
#include "loom/parallel/mesh.h"
#include "loom/parallel/partition.h"
#include "loom/parallel/pipeline.h"
#include "loom/parallel/tp_layers.h"
#include "loom/train/batch_source.h"
#include "loom/train/checkpoint.h"
#include "loom/train/init_from.h"
#include "loom/train/loss_guard.h"
#include "loom/train/micro_batch_tuner.h"
#include "loom/train/train_config.h"

namespace loom::train {

// How a run ended: every step done, or stopped by a guard (cmd_train exits with kExitDiverged).
enum class RunEnd {
  finished,
  diverged,   // the smoothed loss stayed far above its minimum (guard.divergence=stop)
  nonfinite,  // non-finite losses or gradient norms (guard.nonfinite=stop, guard.max_consecutive_skips)
};
const char* run_end_name(RunEnd e);  // "finished", "diverged", "nonfinite"

struct TrainResult {
  RunEnd ended = RunEnd::finished;
  // A stopped run: one line saying why, with the likely causes, and the last healthy step (the
  // run's checkpoints after it were removed; `latest` names the newest one up to it, if any).
  std::string end_reason;
  int64_t last_healthy_step = -1;
  int64_t steps = 0;  // steps completed (including resumed ones)
  double final_train_loss = 0;
  double final_val_loss = -1;  // -1: no validation data
  double tokens_per_s = 0;
  int64_t peak_bytes = 0;
  std::string last_checkpoint;
  std::vector<double> losses;       // train loss of every step this run executed
  std::vector<double> loss_scales;  // with loss scaling: the scale each executed step ran at
  int64_t skipped_steps = 0;        // steps whose update was skipped (gradient overflow, non-finite)
  int64_t nonfinite_steps = 0;      // of those, skipped by the non-finite guard (guard.nonfinite)
  int64_t rollbacks = 0;            // loss-spike rollbacks to a checkpoint (guard.spike_z)
  int64_t spikes = 0;               // loss spikes detected, rolled back or not
  int64_t divergence_warnings = 0;  // guard.divergence=warn: divergences logged
  // Seconds the training loop was held by checkpoints (a synchronous save whole; an
  // asynchronous one its snapshot and any wait for the previous write), and how many it started.
  double checkpoint_stall_s = 0;
  int64_t checkpoints = 0;
  double checkpoint_write_s = 0;  // asynchronous: the background writes' own time (rank 0)
};

// Bytes of one allocation category on rank 0 at a logged step.
struct CategoryBytes {
  std::string category;  // mem_category_name()
  int64_t current = 0, peak = 0;
};

// The figures of one logged step (every log.every steps): what its JSONL line holds, for
// observers such as `loom train --metrics-port`.
struct LoggedStep {
  int64_t step = 0, total_steps = 0;
  double loss = 0, lr = 0, grad_norm = 0, tokens_per_s = 0, mfu = 0, ms_per_step = 0;
  // Per step, the mean over the logging window of the time the training thread waited on
  // gradient collectives (and expert all-to-alls): communication not hidden behind compute.
  double exposed_comm_ms = 0;
  int64_t window_tokens = 0;  // tokens trained since the previous logged step
  int64_t peak_bytes = 0;     // every category together
  int64_t skipped_steps = 0, nonfinite_steps = 0, rollbacks = 0, spikes = 0;
  std::vector<CategoryBytes> memory;  // the categories with a nonzero peak
};

// Called on rank 0, on the training thread, after the JSONL line is written; keep them short.
struct TrainObserver {
  std::function<void(const LoggedStep&)> on_step;
  std::function<void(int64_t step, double val_loss)> on_val_loss;
};

struct TrainerOptions {
  std::string resume;  // "", "auto" or a checkpoint directory
  // A run from step 0 into a checkpoint.dir holding checkpoints removes them instead of
  // refusing to start.
  bool overwrite_checkpoints = false;
  FILE* log = stdout;
  // The rank grid; nullptr: one process (a single-rank mesh is built).
  const parallel::Mesh* mesh = nullptr;
  int64_t stop_after_steps = -1;  // stop early (tests: N steps, save, resume)
  // Tests: steps (1-based) whose backward on world rank 0 overflows (its loss gradient is
  // scaled by infinity), as an fp16 overflow would; the gradient reduction carries it to every
  // rank, and the loss scaler must skip the step everywhere. Rank 0 must compute a loss (no
  // pipeline stages).
  std::vector<int64_t> inject_grad_overflow_at;
  // Tests: batches (1-based; batch s is step s's until a rollback skips batches) whose loss on
  // world rank 0 is multiplied by the factor (NaN: a non-finite loss; 100: a spike), as a bad
  // batch would make it; gradients are left alone. Data parallelism only (tp = pp = 1: rank 0's
  // loss is not reduced over tensor ranks, and under pp it computes none).
  std::vector<std::pair<int64_t, double>> inject_loss_factor_at;
  double peak_gflops = 0;  // MFU denominator; 0: measure the products' GEMM at start
  TrainObserver observer;
};

class Trainer {
 public:
  Trainer(const TrainConfig& cfg, BatchSource& data, const TrainerOptions& opt = {});
  ~Trainer();
  TrainResult run();

  model::Decoder& model() { return *model_; }
  // The expert-parallel exchange (parallel.ep > 1), else nullptr.
  parallel::ExpertParallelExchange* expert_parallel() { return ep_.get(); }
  // Data parallelism (ZeRO 0-3) over the dp group: the gradients, the optimizer and its state.
  parallel::DataParallel& data_parallel() { return *data_parallel_; }
  // The full weights as one flat buffer in full_layout() (gathered under ZeRO-3 and across
  // model-parallel ranks; collective then).
  Tensor full_params();
  // The model's own layout (data parallelism only) or, under tensor or pipeline parallelism,
  // the whole model's (ParamLayout(cfg, 1)).
  const model::ParamLayout& full_layout() const { return whole_layout_ ? *whole_layout_ : model_->layout(); }
  int64_t step() const { return step_; }
  // What checkpoints record and check of this run's layout (data_parallel_only: pp = tp = ep = 1).
  ModelParallelInfo model_parallel_info() const;
  double evaluate();  // mean validation loss over eval_batches

 private:
  double train_step();  // returns the mean train loss of the step
  std::vector<parallel::StageRange> partition_stages();
  void reduce_over_model_parallel(const Tensor& t, bool over_tp);
  // The step's MoE router statistics summed over the data-parallel (and pipeline) ranks into
  // moe_stats_; the balancing bias moves from them when enabled.
  void reduce_moe_stats();
  std::string moe_log() const;  // " | moe load max/mean ..." for the step line; "" for dense
  void maybe_checkpoint(bool force);
  // checkpoint.async: the write in flight, polled (or, with wait, waited for) on rank 0 and its
  // outcome shared with every rank (collective); a failed write fails every rank.
  void finish_async_checkpoint(bool wait);
  // guard.spike_z: judges an accepted step's loss; true when it makes guard.max_spikes spikes in a
  // row and checkpoint.dir is set (the caller rolls back). Spikes are logged and counted.
  bool spike_detected(double loss);
  // Reloads the newest checkpoint from before the first spike and skips the batches since it.
  // Rolling back to the same checkpoint for the third time ends the run as diverged.
  void roll_back();
  // guard.divergence: feeds an accepted step's loss to the detector; true when the run must stop.
  bool divergence_detected(double loss);
  // Ends a diverged or non-finite run: removes this run's checkpoints after keep_upto (default: the
  // last healthy step; before a non-finite loss, the step before it), points `latest` at the
  // newest one left, logs why and the likely causes.
  void stop_run(RunEnd why, const std::string& reason, int64_t keep_upto = -2);
  // The newest step whose checkpoint is known sound while the loss misbehaves (a non-finite streak,
  // spikes, a divergence under way): checkpoint pruning keeps the newest one up to it. -1 while
  // all is well.
  int64_t fallback_step() const;
  // The batch index step s trains on (s, moved on past windows a rollback skipped).
  int64_t batch_of(int64_t step) const;
  void resume_from(const std::string& spec);
  // model.init_from: the source's weights into this rank's slice, before a new run's first step.
  void init_from_source();
  // A validation loss on the log, in the metrics JSONL and to the observer (rank 0); `final`: the
  // evaluation after the last step, marked so in both.
  void report_val_loss(double v, int64_t total, bool final);
  // A run from step 0: a new run id, and checkpoint.dir claimed (refused on every rank when it
  // holds another run's checkpoints, unless overwrite_checkpoints).
  void start_new_run();
  void open_metrics();
  // The metrics JSONL's run_start line: config, run id, layout and environment.
  void write_run_start();
  void write_step_metrics(const LoggedStep& ls);
  // One line of the metrics JSONL (a dumped object), flushed; nothing without log.metrics_path.
  void write_metrics_line(const std::string& json);
  // The metrics JSONL's last line: {"event":"end"} with how the run ended.
  void write_run_end();
  // rank 0's start-up lines (model, layout, schedule, MFU denominator, model-state bytes).
  void log_run_start(int64_t whole_params);
  // rank 0's step line, metrics line and observer call for the `window_steps` steps of the last
  // `elapsed_s` seconds.
  void log_step(double last_loss, double lr, double elapsed_s, int64_t window_steps, double flops_per_step);
  // Seconds the training thread waited on communication since the last call (this rank).
  double take_exposed_comm_seconds();
  // Refuses, before the first step allocates them, activations that cannot fit in memory.
  void check_fits_in_memory() const;
  // parallel.micro_batches=auto: the counts the tuner may choose (divisors of the per-rank batch
  // that the schedule takes and whose activations fit) and the tuner; after each step, its time
  // (the slowest rank's) goes to the tuner and a change it makes applies from the next step.
  void start_micro_batch_tuner();
  void tune_micro_batches(double step_s);
  void set_micro_batches(int64_t m);
  // The whole model's activations for one micro-batch of `micro_batch_size` sequences (0: the
  // configured data.micro_batch_size), this rank's share of the model-parallel split.
  double predicted_activation_bytes(int64_t micro_batch_size = 0) const;
  // Model states this rank keeps resident (less Adam moments kept off the device), and under
  // LoRA the frozen model beside the adapters' states.
  double resident_state_bytes() const;
  // parallel.offload and parallel.memory_limit_mb, before DataParallel exists: which stages keep
  // their Adam moments (and ZeRO-3 parameter shards) off the device, and a stage that would need
  // more than the limit refused on every rank alike (collective over the pipeline group). This
  // rank's choice goes into dp_plan_'s options, which DataParallel is then built with.
  void place_optimizer_state();
  bool main_rank() const { return mesh_->rank() == 0; }

  // LoRA: the frozen model the adapters belong to and its weights' identity (SaveOptions);
  // rank 0 only.
  void identify_lora_base();
  // A resumed LoRA checkpoint must have been trained on the same frozen weights (collective).
  void check_lora_base(const std::string& checkpoint);
  std::string lora_base_, lora_base_sha256_;

  TrainConfig cfg_;
  BatchSource& data_;
  TrainerOptions opt_;
  std::unique_ptr<parallel::Mesh> own_mesh_;
  const parallel::Mesh* mesh_;
  std::unique_ptr<model::Decoder> model_;
  // The data-parallel choices for this layout and their predicted model-state bytes per rank
  // (the start-up line, check_fits_in_memory).
  parallel::DataParallelPlan dp_plan_;
  std::unique_ptr<parallel::DataParallel> data_parallel_;
  std::unique_ptr<parallel::TensorParallelLayers> tp_;
  std::unique_ptr<parallel::ExpertParallelExchange> ep_;
  std::unique_ptr<parallel::PipelineStage> pipe_;
  std::unique_ptr<MicroBatchTuner> micro_tuner_;
  double last_bubble_s_ = 0;                          // this stage's idle time in the last pipelined step
  std::unique_ptr<model::ParamLayout> whole_layout_;  // tp or pp > 1
  std::vector<parallel::StageRange> stages_;
  std::string layout_desc_;  // the mesh and the stages: a checkpoint resumes on the same ones
  int64_t step_ = 0;
  double last_grad_norm_ = 0;
  double last_checkpoint_time_ = 0;
  std::string last_checkpoint_;
  std::string run_id_;  // the run's id, recorded in its checkpoints; kept across resumes
  // model.init_from as every rank reads it (a run directory resolved to one checkpoint).
  InitSource init_source_;
  // model.init_from's tokenizer and chat files, which rank 0 puts into every checkpoint, and the
  // tokenizer they record; empty: the data's tokenizer, no files.
  model::TokenizerFiles card_files_;
  optim::LossScaler scaler_;
  int64_t skipped_steps_ = 0;
  double last_step_scale_ = 1;  // the loss scale the last step ran at
  FILE* metrics_ = nullptr;
  std::unique_ptr<class CheckpointWriter> writer_;  // checkpoint.async, rank 0
  bool async_pending_ = false;                      // every rank: a background write was started and not yet settled
  int64_t async_step_ = -1;
  // Guards.
  double checkpoint_stall_s_ = 0;
  int64_t checkpoints_ = 0;
  double checkpoint_write_s_ = 0;
  int64_t nonfinite_steps_ = 0, consecutive_nonfinite_ = 0, rollbacks_ = 0;
  SpikeDetector spike_detector_{0, 50};
  DivergenceDetector divergence_{2, 25};
  int64_t spikes_ = 0, spikes_in_row_ = 0, first_spike_step_ = -1, divergence_warnings_ = 0;
  int64_t first_nonfinite_step_ = -1;  // the first step of the current run of non-finite ones
  double last_counted_ = 0;            // targets the last step's loss counted (0: all masked)
  std::string last_rollback_target_;
  int64_t rollbacks_to_target_ = 0;
  RunEnd ended_ = RunEnd::finished;  // a guard's verdict; the loop stops when it is set
  std::string end_reason_;
  int64_t last_healthy_step_ = -1;
  std::vector<std::pair<int64_t, int64_t>> skipped_windows_;
  std::vector<model::MoeLayerStats> moe_stats_;  // the last step's, over every rank
  // moe_stats_'s loads, choices and drops summed over the steps since the last logged one.
  std::vector<model::MoeLayerStats> moe_window_;
  int64_t moe_window_steps_ = 0;
  double peak_gflops_ = 0;   // measured GEMM rate, for the MFU estimate
  bool mfu_warned_ = false;  // the log said once that MFU exceeded 100%
};

}  // namespace loom::train

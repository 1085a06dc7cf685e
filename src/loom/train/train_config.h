// The typed configuration of a training run (`loom train CONFIG.yaml`): model, data,
// optimizer, schedule, checkpointing, logging and parallel layout. Parsed and fully
// validated before any work; docs/CONFIG.md is the reference for every key.
#pragma once
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "loom/comm/algorithm.h"
#include "loom/data/dataset.h"
#include "loom/model/config.h"
#include "loom/model/decoder.h"
#include "loom/optim/adamw.h"
#include "loom/optim/loss_scale.h"
#include "loom/parallel/data_parallel_options.h"
#include "loom/parallel/layout.h"
#include "loom/parallel/partition.h"
#include "loom/parallel/pipeline_schedule.h"

namespace loom::train {

struct DataConfig {
  std::string dir;  // output of `loom prepare`
  int64_t seq_len = 256;
  int64_t batch_size = 16;       // global batch, in sequences
  int64_t micro_batch_size = 0;  // per rank; 0 = the whole per-rank batch at once
  uint64_t seed = 1;
  // Rows of a shard of conversations: packed windows, or one conversation per row, padded.
  data::ChatLayout chat_layout = data::ChatLayout::pack;
};

struct ScheduleConfig {
  int64_t steps = 1000;
  int64_t warmup_steps = -1;  // -1: min(10000, 10% of steps)
  double min_lr = 6e-5;
  double clip_max_norm = 1.0;  // 0 disables clipping
  bool clip_dynamic = false;   // max(1, 10 (1 - step/total)) instead of clip_max_norm
  int64_t eval_interval = 100;
  int64_t eval_batches = 10;
  uint64_t seed = 1337;  // weight initialisation
};

struct CheckpointConfig {
  std::string dir;  // empty: no checkpoints
  int64_t every_steps = 0;
  double every_minutes = 0;
  int64_t keep_last = 3;
  // Snapshot to memory, write on a background thread while training goes on (at most one
  // write in flight; docs/FAULT_TOLERANCE.md).
  bool async = false;
};

// guard.nonfinite: skip: a non-finite loss or gradient norm skips the update on every rank;
// stop: the run stops with the diagnosis.
enum class NonFinite { skip, stop };
const char* nonfinite_name(NonFinite n);  // "skip", "stop"

// guard.divergence: what a diverging loss does (train/loss_guard.h's DivergenceDetector).
// stop: the run ends with kExitDiverged; warn: it is logged and counted; off: not watched.
enum class Divergence { stop, warn, off };
const char* divergence_name(Divergence d);  // "stop", "warn", "off"

// The spike threshold on by default, chosen by replaying healthy and diverging runs (`loom bench
// guards`; the figures are in docs/FAULT_TOLERANCE.md).
inline constexpr double kDefaultSpikeZ = 6;

// What a step does with a non-finite, spiking or diverging loss (docs/FAULT_TOLERANCE.md).
struct GuardConfig {
  NonFinite nonfinite = NonFinite::skip;
  int64_t max_consecutive_skips = 10;  // more non-finite steps in a row than this stop the run
  // A loss more than spike_z standard deviations above the mean of the last spike_window
  // accepted steps is a spike; max_spikes in a row roll back to the newest checkpoint before
  // them and skip their batches (without checkpoint.dir, or with no checkpoint before them,
  // they are logged and counted). 0: off.
  double spike_z = kDefaultSpikeZ;
  int64_t spike_window = 50;
  int64_t max_spikes = 3;
  // The smoothed loss above divergence_factor x its running minimum for divergence_steps steps
  // in a row is a divergence.
  Divergence divergence = Divergence::stop;
  double divergence_factor = 2;
  int64_t divergence_steps = 25;
};

// log.progress: the progress bar always, never, or (auto) when stderr is a terminal.
enum class Progress { auto_detect, on, off };

struct LogConfig {
  int64_t every = 10;
  std::string metrics_path;  // JSONL, one object per logged step
  Progress progress = Progress::auto_detect;
};

// "fp32", "bf16", "fp16" as the DType of that width (parallel.grad_dtype, parallel.gather_dtype).
DType wire_dtype(const std::string& name);

// parallel.*: the layout (dp, tp, pp, ep, zero_stage, micro_batches, pp_schedule, order; the
// description the planner and the mesh share) and how the data crosses it.
struct ParallelConfig : parallel::Layout {
  double bucket_mb = 25.0;
  // Data-parallel gradients on the wire: f32 or bf16 (half the bytes); the default is
  // model.precision's (bf16 under bf16 training).
  DType grad_dtype = DType::f32;
  // ZeRO's weight all-gathers (stages 1-3): f32, or model.precision's 16-bit type (the default
  // under bf16/fp16 training): the products' weights in 16 bits, exact (see
  // DataParallelOptions::gather_dtype).
  DType gather_dtype = DType::f32;
  // Stages 1-2 with 16-bit gathers: keep the weights as the gathered 16-bit replica and only
  // the owned fp32 masters (DataParallelOptions::weight_replica).
  parallel::WeightReplica weight_replica = parallel::WeightReplica::auto_choice;
  // Pipeline activations and their gradients between stages: "fp32", "bf16" or "fp16" (half
  // the bytes, rounded); the default is model.precision's.
  DType pp_dtype = DType::f32;
  parallel::PartitionMethod pp_partition = parallel::PartitionMethod::uniform;
  double collective_timeout_s = 600;
  std::string offload_dir;  // parallel.offload.dir: disk offload's files; empty: checkpoint.dir/offload or a temp dir
  // parallel.memory_limit_mb: the bytes a rank may hold resident (model states not offloaded,
  // activations, workspace, as the estimates predict); a rank over it stops at start naming the
  // fixes. 0: the machine's memory.
  double memory_limit_mb = 0;
  // parallel.micro_batches: auto: the trainer chooses the count per step from measured step
  // times (train/micro_batch_tuner.h); micro_batches holds the count it starts from.
  bool micro_batches_auto = false;
};

// How collectives run (docs/DISTRIBUTED.md, "Collective algorithms").
struct CommConfig {
  // auto | ring | tree | hierarchical | mpi; unset: comm::World's default
  // ($LOOM_COMM_ALGORITHM, else auto).
  std::optional<comm::Algorithm> algorithm;
  // A cost-model file from `loom bench comm --calibrate`; empty: $LOOM_COMM_CALIBRATION.
  std::string calibration;
};

struct TrainConfig {
  // model.init_from: the GGUF file, Hugging Face directory or loom checkpoint whose architecture
  // `model` is and whose weights a new run starts from (train/init_from.h); empty: random init.
  std::string init_from;
  model::ModelConfig model;
  model::DecoderOptions decoder;
  DataConfig data;
  optim::AdamWConfig optim;
  optim::LossScaleConfig loss_scale;  // optim.loss_scale*: dynamic under model.precision=fp16
  GuardConfig guard;
  ScheduleConfig schedule;
  CheckpointConfig checkpoint;
  LogConfig log;
  ParallelConfig parallel;
  CommConfig comm;
  int64_t threads = 0;  // 0: OMP_NUM_THREADS / all cores

  std::string resolved_yaml;  // the config after defaults and overrides, for checkpoints
  // Allowed but probably unintended settings, one line each (the trainer prints them).
  std::vector<std::string> warnings;
};

// The architecture of a model.init_from source. The parser takes it as an argument so that it
// stays free of the weight readers (the fuzz target links it alone); the commands pass
// train::init_source_config (train/init_from.h). Empty: model.init_from is refused.
using SourceConfigReader = std::function<model::ModelConfig(const std::string& path)>;

// Reads the YAML file, applies `--set key=value` overrides, validates everything.
TrainConfig load_train_config(const std::string& path, const std::vector<std::string>& sets,
                              const SourceConfigReader& source_config = {});
TrainConfig parse_train_config(const std::string& yaml_text, const std::vector<std::string>& sets,
                               const std::string& source = "<string>", const SourceConfigReader& source_config = {});

}  // namespace loom::train

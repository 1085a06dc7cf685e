#include "loom/train/train_config.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <limits>
#include <set>
#include <sstream>

#include "loom/io/yaml_load.h"
#include "loom/model/param_layout.h"
#include "loom/parallel/data_parallel_options.h"
#include "loom/parallel/mesh_shape.h"
#include "loom/parallel/partition.h"
#include "loom/parallel/pipeline_schedule.h"
#include "loom/train/config_reader.h"

namespace loom::train {

DType wire_dtype(const std::string& name) {
  if (const auto t = parallel::wire_dtype_from_name(name)) return *t;
  fail("config", "dtype '", name, "': expected fp32, bf16 or fp16");
}

namespace {
namespace fs = std::filesystem;
constexpr int64_t kMaxI = std::numeric_limits<int64_t>::max();
constexpr double kInf = std::numeric_limits<double>::infinity();

// parallel.micro_batches=auto's starting count when data.micro_batch_size does not give one:
// the smallest divisor of the per-rank batch that fills a pipeline of pp stages (a multiple of
// pp when the stages are interleaved); one without a pipeline, or the whole batch as single
// sequences when it is smaller than pp.
int64_t first_auto_micro_batches(int64_t pp, int64_t per_rank, bool interleaved) {
  for (int64_t m = std::max<int64_t>(1, pp); m <= per_rank; ++m)
    if (per_rank % m == 0 && (!interleaved || m % pp == 0)) return m;
  return per_rank;
}

// What a config may set beside model.init_from, whose source brings the architecture: the
// precision, memory and MoE training keys.
bool settable_beside_init_from(const std::string& key) {
  static const std::set<std::string> keys = {"model.init_from",
                                             "model.precision",
                                             "model.activation_dtype",
                                             "model.activation_checkpoint_interval",
                                             "model.xent_chunk",
                                             "model.moe",
                                             "model.moe.capacity_factor",
                                             "model.moe.router_aux_loss_coef",
                                             "model.moe.router_z_loss_coef",
                                             "model.moe.bias_update_rate",
                                             "model.lora",
                                             "model.lora.rank",
                                             "model.lora.alpha",
                                             "model.lora.dropout",
                                             "model.lora.targets",
                                             "model.lora.base_dtype"};
  return keys.count(key) > 0;
}

// The architecture of model.init_from.
model::ModelConfig read_source_architecture(ConfigReader& r, const std::string& init_from,
                                            const SourceConfigReader& source_config) {
  std::vector<std::string> set = r.keys("model");
  for (const char* section : {"model.moe", "model.lora"})
    for (const std::string& k : r.keys(section)) set.push_back(k);
  for (const std::string& k : set)
    LOOM_CHECK(settable_beside_init_from(k), "config", k, ": the architecture comes from model.init_from=", init_from,
               "; remove ", k);
  LOOM_CHECK(bool(source_config), "config", "model.init_from=", init_from,
             ": this command does not read model files; use loom train");
  return source_config(init_from);
}

// The architecture the model keys describe.
model::ModelConfig read_architecture(ConfigReader& r) {
  model::ModelConfig m;
  const std::string preset = r.string("model.preset", "");
  if (!preset.empty()) m = model::preset(preset);
  m.family = model::family_from_name(r.string("model.family", model::family_name(m.family), {"gpt2", "llama"}));
  if (preset.empty() && m.family == model::Family::llama) m.tied_embeddings = false;
  m.vocab_size = r.integer("model.vocab_size", m.vocab_size, 1, int64_t(1) << 31);
  m.n_ctx = r.integer("model.n_ctx", m.n_ctx, 1, 1 << 20);
  m.n_layer = r.integer("model.n_layer", m.n_layer, 1, 4096);
  m.n_head = r.integer("model.n_head", m.n_head, 1, 4096);
  m.n_kv_head = r.integer("model.n_kv_head",
                          r.has("model.n_head") && !r.has("model.n_kv_head") ? m.n_head : m.n_kv_head, 1, 4096);
  m.d_model = r.integer("model.d_model", m.d_model, 1, 1 << 20);
  m.d_ff = r.integer(
      "model.d_ff",
      r.has("model.d_model") && !r.has("model.d_ff") && m.family == model::Family::gpt2 ? 4 * m.d_model : m.d_ff, 1,
      1 << 22);
  m.norm_eps = r.number("model.norm_eps", m.norm_eps, 1e-12, 1.0);
  m.rope_theta = r.number("model.rope_theta", m.rope_theta, 1.0, 1e9);
  m.tied_embeddings = r.boolean("model.tied_embeddings", m.tied_embeddings);
  m.qkv_bias = r.boolean("model.qkv_bias", m.qkv_bias);
  model::MoeConfig& e = m.moe;
  e.num_experts = r.integer("model.moe.num_experts", e.num_experts, 0, 1 << 16);
  e.top_k = r.integer("model.moe.top_k", e.top_k, 1, 1 << 16);
  e.num_shared_experts = r.integer("model.moe.num_shared_experts", e.num_shared_experts, 0, 1 << 10);
  e.expert_d_ff = r.integer("model.moe.expert_d_ff", e.expert_d_ff, 0, 1 << 22);
  e.moe_every = r.integer("model.moe.moe_every", e.moe_every, 1, 4096);
  e.first_dense = r.integer("model.moe.first_dense", e.first_dense, 0, 4096);
  e.score = model::router_score_from_name(
      r.string("model.moe.score", model::router_score_name(e.score), {"softmax", "sigmoid"}));
  if (preset.empty()) m.name = "custom";
  return m;
}

// model.lora: low-rank adapters trained beside the frozen model (model/config.h LoraConfig).
void read_lora(ConfigReader& r, model::LoraConfig& l) {
  l.rank = r.integer("model.lora.rank", l.rank, 0, 1 << 16);
  for (const std::string& k : r.keys("model.lora"))
    LOOM_CHECK(l.rank > 0 || k == "model.lora.rank", "config", k,
               " is set but model.lora.rank is 0 (no adapters: the whole model would train); set model.lora.rank, "
               "8 or 16 is usual");
  l.alpha = r.number("model.lora.alpha", l.alpha, 0, 1e6);
  l.dropout = r.number("model.lora.dropout", l.dropout, 0, 0.99);
  l.base_dtype = r.string("model.lora.base_dtype", "fp32", {"fp32", "bf16"}) == "bf16" ? DType::bf16 : DType::f32;
  std::vector<std::string> names, def;
  for (int t = 0; t < model::kLoraTargets; ++t) names.push_back(model::lora_target_name(model::LoraTarget(t)));
  for (model::LoraTarget t : l.targets) def.push_back(model::lora_target_name(t));
  l.targets.clear();
  for (const std::string& n : r.strings("model.lora.targets", def, names))
    l.targets.push_back(model::LoraTarget(std::find(names.begin(), names.end(), n) - names.begin()));
}

model::ModelConfig read_model(ConfigReader& r, const std::string& init_from, const SourceConfigReader& source_config) {
  model::ModelConfig m =
      init_from.empty() ? read_architecture(r) : read_source_architecture(r, init_from, source_config);
  model::MoeConfig& e = m.moe;
  e.capacity_factor = r.number("model.moe.capacity_factor", e.capacity_factor, 0, 1e6);
  e.router_aux_loss_coef = r.number("model.moe.router_aux_loss_coef", e.router_aux_loss_coef, 0, 1e3);
  e.router_z_loss_coef = r.number("model.moe.router_z_loss_coef", e.router_z_loss_coef, 0, 1e3);
  e.bias_update_rate = r.number("model.moe.bias_update_rate", e.bias_update_rate, 0, 1);
  read_lora(r, m.lora);
  m.precision = model::precision_from_name(r.string("model.precision", "fp32", {"fp32", "bf16", "fp16"}));
  m.activation_dtype =
      wire_dtype(r.string("model.activation_dtype", model::precision_name(m.precision), {"fp32", "bf16", "fp16"}));
  m.validate();
  return m;
}

void read_model_section(ConfigReader& r, TrainConfig& c, const SourceConfigReader& source_config) {
  c.init_from = r.string("model.init_from", "");
  c.model = read_model(r, c.init_from, source_config);
  c.decoder.activation_checkpoint_interval =
      int(r.integer("model.activation_checkpoint_interval", 0, 0, c.model.n_layer));
  c.decoder.xent_chunk = r.integer("model.xent_chunk", 1024, 1, 1 << 20);
}

void read_data(ConfigReader& r, TrainConfig& c) {
  c.data.dir = r.string("data.dir", "");
  LOOM_CHECK(!c.data.dir.empty(), "config", "data.dir: required (a directory written by loom prepare)");
  c.data.seq_len = r.integer("data.seq_len", 256, 1, c.model.n_ctx);
  c.data.batch_size = r.integer("data.batch_size", 16, 1, kMaxI);
  c.data.micro_batch_size = r.integer("data.micro_batch_size", 0, 0, kMaxI);
  c.data.seed = uint64_t(r.integer("data.seed", 1, 0, kMaxI));
  c.data.chat_layout = r.choice("data.chat_layout", data::ChatLayout::pack,
                                {{"pack", data::ChatLayout::pack}, {"pad", data::ChatLayout::pad}});
}

// optim.* and its loss scaling.
void read_optim(ConfigReader& r, TrainConfig& c) {
  c.optim.lr = r.number("optim.lr", 6e-4, 0, 10);
  c.optim.beta1 = r.number("optim.beta1", 0.9, 0, 0.999999);
  c.optim.beta2 = r.number("optim.beta2", 0.95, 0, 0.99999999);
  c.optim.eps = r.number("optim.eps", 1e-8, 1e-30, 1);
  c.optim.weight_decay = r.number("optim.weight_decay", 0.1, 0, 10);
  c.optim.kind = optim::optimizer_from_name(r.string("optim.name", "adamw", {"adamw", "onebit_adam"}));
  c.optim.freeze_step = r.integer("optim.freeze_step", 100, 1, int64_t(1) << 40);
  const bool fp16 = c.model.precision == model::Precision::fp16;
  const std::string scaling = r.string("optim.loss_scale", fp16 ? "dynamic" : "off", {"dynamic", "off"});
  c.loss_scale.dynamic = scaling == "dynamic";
  c.loss_scale.initial = r.number("optim.loss_scale_initial", 65536, 1, 1e30);
  c.loss_scale.window = r.integer("optim.loss_scale_window", 1000, 1, int64_t(1) << 40);
  LOOM_CHECK(!fp16 || c.loss_scale.dynamic, "config", "model.precision=fp16 needs optim.loss_scale=dynamic: ",
             "fp16 gradients underflow without loss scaling (or train in bf16, which needs none)");
  LOOM_CHECK(fp16 || !c.loss_scale.dynamic, "config", "optim.loss_scale=dynamic is for model.precision=fp16; ",
             "model.precision=", model::precision_name(c.model.precision), " needs no loss scaling");
}

void read_schedule(ConfigReader& r, TrainConfig& c) {
  c.schedule.steps = r.integer("schedule.steps", 1000, 1, kMaxI);
  c.schedule.warmup_steps = r.integer("schedule.warmup_steps", -1, -1, kMaxI);
  c.schedule.min_lr = r.number("schedule.min_lr", c.optim.lr * 0.1, 0, 10);
  c.schedule.clip_max_norm = r.number("schedule.clip.max_norm", 1.0, 0, kInf);
  c.schedule.clip_dynamic = r.boolean("schedule.clip.dynamic", false);
  c.schedule.eval_interval = r.integer("schedule.eval_interval", 100, 0, kMaxI);
  c.schedule.eval_batches = r.integer("schedule.eval_batches", 10, 1, kMaxI);
  c.schedule.seed = uint64_t(r.integer("schedule.seed", 1337, 0, kMaxI));
  LOOM_CHECK(c.schedule.min_lr <= c.optim.lr, "config", "schedule.min_lr=", c.schedule.min_lr,
             " exceeds optim.lr=", c.optim.lr);
}

// checkpoint.*, guard.* (whose rollbacks need checkpoints) and log.*.
void read_checkpoint_guard_log(ConfigReader& r, TrainConfig& c) {
  c.checkpoint.dir = r.string("checkpoint.dir", "");
  c.checkpoint.every_steps = r.integer("checkpoint.every_steps", 0, 0, kMaxI);
  c.checkpoint.every_minutes = r.number("checkpoint.every_minutes", 0, 0, 1e7);
  c.checkpoint.keep_last = r.integer("checkpoint.keep_last", 3, 1, 1000000);
  c.checkpoint.async = r.boolean("checkpoint.async", false);
  LOOM_CHECK(!c.checkpoint.dir.empty() || (c.checkpoint.every_steps == 0 && c.checkpoint.every_minutes == 0), "config",
             "checkpoint.dir: required when checkpoint.every_steps or every_minutes is set");

  c.guard.nonfinite =
      r.choice("guard.nonfinite", NonFinite::skip, {{"skip", NonFinite::skip}, {"stop", NonFinite::stop}});
  c.guard.max_consecutive_skips = r.integer("guard.max_consecutive_skips", 10, 0, kMaxI);
  c.guard.spike_z = r.number("guard.spike_z", kDefaultSpikeZ, 0, 1e6);
  c.guard.spike_window = r.integer("guard.spike_window", 50, 4, 1000000);
  c.guard.max_spikes = r.integer("guard.max_spikes", 3, 1, kMaxI);
  c.guard.divergence = r.choice("guard.divergence", Divergence::stop,
                                {{"stop", Divergence::stop}, {"warn", Divergence::warn}, {"off", Divergence::off}});
  c.guard.divergence_factor = r.number("guard.divergence_factor", 2, 1.01, 1e6);
  c.guard.divergence_steps = r.integer("guard.divergence_steps", 25, 1, kMaxI);

  c.log.every = r.integer("log.every", 10, 1, kMaxI);
  c.log.metrics_path = r.string("log.metrics_path", "");
  c.log.progress = r.choice("log.progress", Progress::auto_detect,
                            {{"auto", Progress::auto_detect}, {"on", Progress::on}, {"off", Progress::off}});
}

void read_parallel(ConfigReader& r, TrainConfig& c) {
  c.parallel.dp = r.integer("parallel.dp", 1, 1, 1 << 20);
  c.parallel.tp = r.integer("parallel.tp", 1, 1, 1 << 12);
  c.parallel.pp = r.integer("parallel.pp", 1, 1, 1 << 12);
  c.parallel.ep = r.integer("parallel.ep", 1, 1, 1 << 12);
  c.parallel.zero_stage = int(r.integer("parallel.zero_stage", 0, 0, 3));
  c.parallel.bucket_mb = r.number("parallel.bucket_mb", 25.0, 0.001, 1e6);
  c.parallel.grad_dtype = wire_dtype(
      r.string("parallel.grad_dtype", c.model.precision == model::Precision::bf16 ? "bf16" : "fp32", {"fp32", "bf16"}));
  c.parallel.gather_dtype =
      wire_dtype(r.string("parallel.gather_dtype", model::precision_name(c.model.precision), {"fp32", "bf16", "fp16"}));
  parallel::check_gather_dtype(c.parallel.gather_dtype, c.model.precision);
  c.parallel.weight_replica =
      parallel::weight_replica_from_name(r.string("parallel.weight_replica", "auto", {"auto", "on", "off"}));
  c.parallel.pp_dtype =
      wire_dtype(r.string("parallel.pp_dtype", model::precision_name(c.model.precision), {"fp32", "bf16", "fp16"}));
  c.parallel.pp_schedule =
      parallel::pipe_schedule_from_name(r.string("parallel.pp_schedule", "1f1b", {"gpipe", "1f1b", "zb1p", "zbv"}));
  c.parallel.virtual_stages = r.integer("parallel.virtual_stages", 1, 1, 1 << 12);
  // ZB-V always runs 2 chunks per stage of a pipeline; unset, virtual_stages says so.
  if (c.parallel.pp_schedule == parallel::PipeSchedule::zero_bubble_v && c.parallel.pp > 1 &&
      !r.has("parallel.virtual_stages"))
    c.parallel.virtual_stages = parallel::schedule_chunk_count(c.parallel.pp_schedule, 1);
  c.parallel.pp_partition = parallel::partition_method_from_name(
      r.string("parallel.pp_partition", "uniform", {"uniform", "parameters", "profile"}));
  // A count, or auto (resolved below to the count the trainer starts from); unset: 0, resolved
  // from data.micro_batch_size.
  const std::string micro = r.has("parallel.micro_batches") ? r.string("parallel.micro_batches", "") : "";
  c.parallel.micro_batches_auto = micro == "auto";
  LOOM_CHECK(micro.empty() || micro == "auto" || micro.find_first_not_of("0123456789") == std::string::npos, "config",
             "parallel.micro_batches: expected a number of micro-batches per step or auto, got \"", micro, "\"");
  c.parallel.micro_batches = c.parallel.micro_batches_auto ? 0 : r.integer("parallel.micro_batches", 0, 0, kMaxI);
  c.parallel.collective_timeout_s = r.number("parallel.collective_timeout_s", 600, 0.1, 1e7);
  c.parallel.order = parallel::parse_mesh_order(r.string("parallel.order", "pp,dp,ep,tp"));
  using optim::OffloadTarget;
  c.parallel.offload =
      r.choice("parallel.offload.optimizer", OffloadTarget::none,
               {{"none", OffloadTarget::none}, {"host", OffloadTarget::host}, {"disk", OffloadTarget::disk}});
  c.parallel.offload_params =
      r.choice("parallel.offload.params", OffloadTarget::none,
               {{"none", OffloadTarget::none}, {"host", OffloadTarget::host}, {"disk", OffloadTarget::disk}});
  const std::vector<std::string> stages = r.strings("parallel.offload.stages", {"auto"});
  if (!(stages.size() == 1 && stages[0] == "auto"))
    for (const std::string& s : stages) {
      char* end = nullptr;
      const long v = std::strtol(s.c_str(), &end, 10);
      LOOM_CHECK(!s.empty() && *end == 0 && v >= 0 && v < c.parallel.pp, "config", "parallel.offload.stages: \"", s,
                 "\" is not a pipeline stage (0 to parallel.pp - 1 = ", c.parallel.pp - 1, ") nor auto");
      c.parallel.offload_stages.push_back(v);
    }
  c.parallel.offload_dir = r.string("parallel.offload.dir", "");
  c.parallel.memory_limit_mb = r.number("parallel.memory_limit_mb", 0, 0, 1e12);
}

void read_comm(ConfigReader& r, TrainConfig& c) {
  // Unset: comm::World takes $LOOM_COMM_ALGORITHM / $LOOM_COMM_CALIBRATION, else its defaults.
  const std::string algorithm = r.string("comm.algorithm", "", {"auto", "ring", "tree", "hierarchical", "mpi"});
  if (!algorithm.empty()) c.comm.algorithm = comm::parse_algorithm(algorithm);
  c.comm.calibration = r.string("comm.calibration", "");
}

// A run writes (and with --overwrite-checkpoints empties) checkpoint.dir: a source inside it
// could be pruned or deleted under the run that starts from it.
void check_init_from_outside_checkpoints(const TrainConfig& c) {
  if (c.init_from.empty() || c.checkpoint.dir.empty()) return;
  const fs::path from = fs::absolute(c.init_from).lexically_normal(),
                 dir = fs::absolute(c.checkpoint.dir).lexically_normal();
  const fs::path rel = from.lexically_relative(dir);
  LOOM_CHECK(rel.empty() || *rel.begin() == "..", "config", "model.init_from=", c.init_from,
             " is inside checkpoint.dir=", c.checkpoint.dir,
             ", which this run writes and prunes; copy the source elsewhere or set another checkpoint.dir");
}

// The batch split into micro-batches, and the layouts refused (or warned about) before any
// work, with the numbers in the message.
void check_parallel_layout(TrainConfig& c) {
  const int64_t pp = c.parallel.pp, tp = c.parallel.tp, ep = c.parallel.ep;
  model::check_expert_parallel(c.model, ep);
  LOOM_CHECK(c.parallel.offload_params == optim::OffloadTarget::none || c.parallel.zero_stage == 3, "config",
             "parallel.offload.params=", optim::offload_target_name(c.parallel.offload_params),
             " keeps ZeRO-3's parameter shards off the device, but parallel.zero_stage=", c.parallel.zero_stage,
             " keeps whole weights on every rank; set parallel.zero_stage=3 or parallel.offload.params=none");
  LOOM_CHECK(c.parallel.offload == optim::OffloadTarget::none || c.optim.kind != optim::OptimizerKind::onebit_adam,
             "config", "parallel.offload.optimizer=", optim::offload_target_name(c.parallel.offload),
             " with optim.name=onebit_adam is not supported (its momentum exchange reads the moments in place); use "
             "optim.name=adamw or parallel.offload.optimizer=none");
  // Every dp x ep rank sees its own share of the batch.
  const int64_t dp = c.parallel.dp * ep;
  const std::string dp_name = ep > 1 ? str_cat("parallel.dp x parallel.ep=", dp) : str_cat("parallel.dp=", dp);
  LOOM_CHECK(c.data.batch_size % dp == 0, "config", "data.batch_size=", c.data.batch_size, " is not divisible by ",
             dp_name);
  const int64_t per_rank = c.data.batch_size / dp;
  if (c.parallel.micro_batches_auto && c.data.micro_batch_size == 0)
    c.parallel.micro_batches = first_auto_micro_batches(
        c.parallel.pp, per_rank,
        c.parallel.virtual_stages > 1 && c.parallel.pp_schedule == parallel::PipeSchedule::one_f_one_b);
  if (c.parallel.micro_batches > 0) {  // micro-batches named: they set the micro-batch size
    const int64_t m = c.parallel.micro_batches;
    LOOM_CHECK(per_rank % m == 0, "config", "parallel.micro_batches=", m, " does not divide the per-rank batch ",
               per_rank, " (data.batch_size=", c.data.batch_size, " / ", dp_name, ")");
    LOOM_CHECK(c.data.micro_batch_size == 0 || c.data.micro_batch_size * m == per_rank, "config",
               "data.micro_batch_size=", c.data.micro_batch_size, " and parallel.micro_batches=", m, " disagree: ", m,
               " micro-batches of the per-rank batch ", per_rank, " hold ", per_rank / m,
               " sequences each; set only one of them");
    c.data.micro_batch_size = per_rank / m;
  }
  const int64_t micro = c.data.micro_batch_size ? c.data.micro_batch_size : per_rank;
  LOOM_CHECK(per_rank % micro == 0, "config", "data.micro_batch_size=", micro, " does not divide the per-rank batch ",
             per_rank, " (data.batch_size=", c.data.batch_size, " / ", dp_name, ")");
  c.data.micro_batch_size = micro;
  c.parallel.micro_batches = per_rank / micro;

  const bool onebit = c.optim.kind == optim::OptimizerKind::onebit_adam;
  // Model-parallel layouts, refused before any work with the numbers in the message.
  model::check_tensor_parallel(c.model, tp);
  LOOM_CHECK(ep == 1 || !onebit, "config", "optim.name=onebit_adam with parallel.ep=", ep,
             " is not supported (its compressed exchange covers one data-parallel group); use optim.name=adamw");
  parallel::check_stage_count(int(c.model.n_layer), int(pp));
  parallel::check_virtual_stages(c.parallel.pp_schedule, int(pp), int(c.parallel.micro_batches),
                                 int(c.parallel.virtual_stages), int(c.model.n_layer));
  const bool split = c.parallel.pp_schedule == parallel::PipeSchedule::zero_bubble_h1 ||
                     c.parallel.pp_schedule == parallel::PipeSchedule::zero_bubble_v;
  LOOM_CHECK(pp == 1 || !split || c.decoder.activation_checkpoint_interval == 0, "config",
             "parallel.pp_schedule=", parallel::pipe_schedule_name(c.parallel.pp_schedule),
             " defers each block's weight gradients, which needs the block's ",
             "saved activations: model.activation_checkpoint_interval=", c.decoder.activation_checkpoint_interval,
             " recomputes them; set it to 0 or use parallel.pp_schedule=1f1b");
  LOOM_CHECK(pp == 1 || c.parallel.zero_stage <= 1, "config", "parallel.zero_stage=", c.parallel.zero_stage,
             " with parallel.pp=", pp, " is not supported: ZeRO-2/3 reduce ",
             "and gather per forward/backward pass, which a pipeline interleaves across micro-batches; ",
             "use parallel.zero_stage=0 or 1 with pipelines");
  LOOM_CHECK(!onebit || c.parallel.zero_stage <= 1, "config",
             "optim.name=onebit_adam with parallel.zero_stage=", c.parallel.zero_stage,
             " is not supported: ZeRO-2/3 reduce-scatter gradients during backward, which 1-bit Adam "
             "replaces by its compressed exchange after it; use parallel.zero_stage 0 or 1");
  if (c.parallel.weight_replica == parallel::WeightReplica::on)  // the trainer's refusal, before any work
    parallel::check_weight_replica({int(c.parallel.zero_stage), c.parallel.bucket_mb, DType::f32,
                                    c.parallel.gather_dtype, parallel::WeightReplica::on},
                                   c.optim.kind);
  LOOM_CHECK(!c.checkpoint.async || !onebit, "config",
             "checkpoint.async=true with optim.name=onebit_adam is not supported (each rank's error feedback is "
             "written by that rank, synchronously); set checkpoint.async=false");
  if (onebit && dp == 1)
    c.warnings.push_back("optim.name=onebit_adam with parallel.dp=1 has nothing to compress: it runs as AdamW");
  if (onebit && c.optim.freeze_step >= c.schedule.steps)
    c.warnings.push_back(str_cat("optim.freeze_step=", c.optim.freeze_step, " is not below schedule.steps=",
                                 c.schedule.steps, ": the whole run is 1-bit Adam's full-precision warm-up"));
  const int64_t m = c.parallel.micro_batches;
  if (pp > 1 && m < pp)
    c.warnings.push_back(str_cat(
        "parallel.micro_batches=", m, " is below parallel.pp=", pp, ": every stage idles for (p-1)/(m+p-1) = ", pp - 1,
        "/", m + pp - 1, " = ", int(100.0 * parallel::bubble_fraction(int(pp), int(m)) + 0.5),
        "% of each step (the pipeline bubble); use at least ", pp, " micro-batches (e.g. ", 4 * pp, ")"));
  if (c.model.precision == model::Precision::fp16)
    c.warnings.push_back(
        str_cat("model.precision=fp16 runs its products as fp16 operands rounded in f32 and multiplied by f32 SGEMM "
                "(fp16 numerics at f32 speed), with dynamic loss scaling from ",
                c.loss_scale.initial, " (window ", c.loss_scale.window, " steps)"));
}
}  // namespace

const char* nonfinite_name(NonFinite n) { return n == NonFinite::stop ? "stop" : "skip"; }
const char* divergence_name(Divergence d) {
  return d == Divergence::stop ? "stop" : d == Divergence::warn ? "warn" : "off";
}

TrainConfig parse_train_config(const std::string& text, const std::vector<std::string>& sets, const std::string& source,
                               const SourceConfigReader& source_config) {
  YAML::Node root = io::load_yaml(text, source, "config", "a loom config");
  ConfigReader::reject_duplicate_keys(root, source);
  ConfigReader::reject_duplicate_overrides(sets);
  for (const auto& s : sets) ConfigReader::apply_override(root, s);
  ConfigReader r(root);
  TrainConfig c;
  read_model_section(r, c, source_config);
  read_data(r, c);
  read_optim(r, c);
  read_schedule(r, c);
  read_checkpoint_guard_log(r, c);
  read_parallel(r, c);
  read_comm(r, c);
  c.threads = r.integer("threads", 0, 0, 4096);
  r.reject_unknown();
  check_parallel_layout(c);
  check_init_from_outside_checkpoints(c);

  YAML::Emitter out;
  out << root;
  c.resolved_yaml = out.c_str();
  return c;
}

TrainConfig load_train_config(const std::string& path, const std::vector<std::string>& sets,
                              const SourceConfigReader& source_config) {
  std::ifstream f(path);
  LOOM_CHECK(f.good(), "config", "cannot read ", path, ": no such file or not readable");
  std::stringstream ss;
  ss << f.rdbuf();
  return parse_train_config(ss.str(), sets, path, source_config);
}

}  // namespace loom::train

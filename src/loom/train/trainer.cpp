#include "loom/train/trainer.h"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <limits>
#include <sstream>
#include <vector>

#include <nlohmann/json.hpp>

#include "loom/core/threads.h"
#include "loom/core/timer.h"
#include "loom/core/trace.h"
#include "loom/io/file.h"
#include "loom/kernels/cpu/bf16_gemm.h"
#include "loom/kernels/cpu/gemm.h"
#include "loom/model/memory_estimate.h"
#include "loom/optim/schedule.h"
#include "loom/parallel/model_gather.h"
#include "loom/parallel/partition_profile.h"
#include "loom/train/checkpoint.h"
#include "loom/train/checkpoint_dir.h"
#include "loom/train/checkpoint_writer.h"
#include "loom/train/progress.h"
#include "loom/train/run_environment.h"

namespace loom::train {

namespace fs = std::filesystem;

namespace {

// The denominator of the MFU estimate (model FLOPs / time / this): the matrix-product rate of a
// product large enough for OpenBLAS to reach its full rate on every thread (a smaller one
// understates the rate, and MFU would then exceed 100%), on the engine the run's products use:
// SGEMM, or under bf16 the AVX512-BF16 GEMM where it is chosen (about twice SGEMM's rate on
// Zen 4). About 0.1 s.
double measure_gemm_gflops(bool bf16_engine) {
  const int64_t n = 1024;
  std::vector<float> a(size_t(n * n), 0.5f), b(size_t(n * n), 0.25f), c(size_t(n * n));
  auto product = [&] {
    if (bf16_engine)
      cpu::bf16_gemm(false, false, n, n, n, a.data(), n, b.data(), n, 0.0f, c.data(), n);
    else
      cpu::gemm(false, false, n, n, n, 1.0f, a.data(), n, b.data(), n, 0.0f, c.data(), n);
  };
  product();
  // The best of several short timings: robust to the process being descheduled now and then.
  double best = 0;
  for (int rep = 0; rep < 6; ++rep) {
    Stopwatch sw;
    product();
    best = std::max(best, 2.0 * double(n * n * n) / sw.seconds() / 1e9);
  }
  return best;
}

// How bf16 products run on this CPU, said at start as a warning: the configuration does not
// decide it (bf16_gemm_preferred measures the CPU), so parsing one leaves it to the run.
const char* bf16_products_note() {
  return cpu::bf16_gemm_preferred()
             ? "model.precision=bf16 runs its products on an AVX512-BF16 GEMM: bf16 operands (rounded while "
               "packing) multiplied by vdpbf16ps, which on this CPU does twice the multiplies per second of "
               "f32 FMAs, with f32 accumulation (LOOM_BF16_GEMM=off: rounded operands and SGEMM instead, "
               "docs/PERFORMANCE.md)"
             : "model.precision=bf16 runs its products as bf16 operands rounded in f32 and multiplied by f32 "
               "SGEMM: bf16 numerics at f32 speed and memory (this CPU has no bf16 instructions faster than "
               "its FMAs, and AMX is not used, docs/PERFORMANCE.md)";
}

}  // namespace

Trainer::Trainer(const TrainConfig& cfg, BatchSource& data, const TrainerOptions& opt)
    : cfg_(cfg), data_(data), opt_(opt), scaler_(cfg.loss_scale) {
  if (cfg_.threads > 0) set_num_threads(int(cfg_.threads));
  if (opt_.mesh) {
    mesh_ = opt_.mesh;
  } else {
    own_mesh_ = std::make_unique<parallel::Mesh>(comm::Group::single(), parallel::MeshShape(1, 1, 1, 1));
    mesh_ = own_mesh_.get();
  }
  if (main_rank()) {
    for (const auto& w : cfg_.warnings) std::fprintf(opt_.log, "[warning] %s\n", w.c_str());
    if (cfg_.model.precision == model::Precision::bf16) std::fprintf(opt_.log, "[warning] %s\n", bf16_products_note());
  }
  const auto& p = cfg_.parallel;
  const parallel::MeshShape& shape = mesh_->shape();
  for (auto [d, want] : {std::pair{parallel::Dim::pp, p.pp},
                         {parallel::Dim::dp, p.dp},
                         {parallel::Dim::ep, p.ep},
                         {parallel::Dim::tp, p.tp}})
    LOOM_CHECK(shape.size(d) == want, "config", "parallel.", parallel::dim_name(d), "=", want, " but the mesh has ",
               parallel::dim_name(d), "=", shape.size(d), " (", shape.describe(),
               "); launch pp x dp x ep x tp = ", p.pp * p.dp * p.ep * p.tp, " processes");
  LOOM_CHECK(data_.vocab_size() <= cfg_.model.vocab_size, "train", "the data's vocabulary (", data_.vocab_size(),
             " tokens) does not fit model.vocab_size=", cfg_.model.vocab_size, "; set model.vocab_size to at least ",
             data_.vocab_size());
  // Ranks that see different data: dp x ep (each ep rank routes its own tokens).
  const auto ranks = parallel::DataParallelRanks::of_mesh(p.dp, p.ep);
  const int pp_rank = int(mesh_->coord().pp);
  stages_ = partition_stages();
  const model::ModelSlice slice{stages_[size_t(pp_rank)].first_layer,
                                stages_[size_t(pp_rank)].last_layer,
                                pp_rank == 0,
                                pp_rank == int(p.pp) - 1,
                                p.tp,
                                mesh_->coord().tp,
                                p.ep,
                                mesh_->coord().ep};
  dp_plan_ =
      parallel::plan_data_parallel({int(p.zero_stage), p.bucket_mb, p.grad_dtype, p.gather_dtype, p.weight_replica},
                                   cfg_.optim.kind, model::ParamLayout(cfg_.model, ranks.dp_size, slice), ranks);
  const bool replica = dp_plan_.weight_replica;
  model::DecoderOptions dopt = dp_plan_.decoder_options(cfg_.decoder);
  dopt.slice = slice;
  model_ = std::make_unique<model::Decoder>(cfg_.model, dopt);
  if (p.tp > 1) {
    tp_ = std::make_unique<parallel::TensorParallelLayers>(mesh_->tp(), cfg_.model);
    model_->set_tensor_parallel(tp_.get());
  }
  if (p.ep > 1) {
    ep_ = std::make_unique<parallel::ExpertParallelExchange>(mesh_->ep());
    model_->set_expert_parallel(ep_.get());
  }
  if (dopt.allocate_flat_params) model_->init_weights(cfg_.schedule.seed);  // else DataParallel inits its chunks
  data_parallel_ = std::make_unique<parallel::DataParallel>(*model_, mesh_->data(), cfg_.optim, dp_plan_.options,
                                                            cfg_.schedule.seed, mesh_->dp());
  if (main_rank() && p.weight_replica == parallel::WeightReplica::auto_choice &&
      parallel::weight_replica_possible(dp_plan_.options, cfg_.optim.kind))
    std::fprintf(opt_.log, "[train] weights%s: %s (parallel.weight_replica=auto%s)\n",
                 p.pp > 1 ? " of the first pipeline stage" : "",
                 replica ? str_cat("the gathered ", parallel::wire_dtype_name(p.gather_dtype),
                                   " replica and this rank's fp32 masters")
                               .c_str()
                         : "a whole fp32 copy",
                 replica ? ""
                         : str_cat(": at dp=", ranks.dp_size, " the ", parallel::wire_dtype_name(p.gather_dtype),
                                   " replica and the owned masters would take more bytes; =on forces it")
                               .c_str());
  // The gradient norm counts every parameter once across the model-parallel ranks.
  std::vector<std::pair<int64_t, int64_t>> skip;
  for (const auto& pi : model_->layout().params())
    if (pi.tied_copy || (pi.tp_replicated && mesh_->coord().tp != 0))
      skip.push_back({pi.offset, pi.offset + pi.numel()});
  data_parallel_->set_norm_skip(skip);
  if (p.pp > 1)
    pipe_ = std::make_unique<parallel::PipelineStage>(
        *model_, *mesh_,
        parallel::PipelineOptions{parallel::pipe_schedule_from_name(p.pp_schedule), int(p.micro_batches),
                                  wire_dtype(p.pp_dtype)});
  if (p.pp > 1 || p.tp > 1 || p.ep > 1) whole_layout_ = std::make_unique<model::ParamLayout>(cfg_.model, 1);
  check_fits_in_memory();
  layout_desc_ = str_cat(shape.describe(), ", stages ", parallel::describe_partition(stages_));
  if (!opt_.resume.empty()) resume_from(opt_.resume);
  if (step_ == 0) start_new_run();
  if (main_rank() && !cfg_.log.metrics_path.empty()) open_metrics();
  peak_gflops_ =
      opt_.peak_gflops > 0 ? opt_.peak_gflops : measure_gemm_gflops(cpu::on_bf16_gemm(cfg_.model.products()));
  if (cfg_.checkpoint.async && !cfg_.checkpoint.dir.empty() && main_rank()) {
    writer_ = std::make_unique<CheckpointWriter>();
    // Data parallelism only: snapshots fill reserved buffers (model-parallel ones gather into
    // fresh ones; parallel/model_gather.h).
    if (!whole_layout_) writer_->reserve(cfg_.model);
  }
  last_checkpoint_time_ = now_seconds();
}

Trainer::~Trainer() {
  if (writer_ && writer_->pending()) {  // a background write in flight completes (or fails) first
    const auto r = writer_->wait();
    if (r && !r->ok)
      std::fprintf(opt_.log, "[checkpoint] background save of step %lld failed: %s\n", (long long)r->step,
                   r->error.c_str());
  }
  data_parallel_.reset();
  if (metrics_) std::fclose(metrics_);
}

std::vector<parallel::StageRange> Trainer::partition_stages() {
  const int L = int(cfg_.model.n_layer), pp = int(cfg_.parallel.pp);
  switch (parallel::partition_method_from_name(cfg_.parallel.pp_partition)) {
    case parallel::PartitionMethod::uniform: return parallel::partition_uniform(L, pp);
    case parallel::PartitionMethod::parameters:
      return parallel::partition_balanced(parallel::parameter_costs(cfg_.model), pp);
    case parallel::PartitionMethod::profile: break;
  }
  if (pp == 1) return parallel::partition_uniform(L, 1);
  // Timed on rank 0 only (the others would compete for its cores), then shared.
  Tensor costs = Tensor::zeros({L + 2}, DType::f64, MemCategory::workspace);
  if (main_rank()) {
    const auto c = parallel::profile_costs(cfg_.model, cfg_.data.micro_batch_size, cfg_.data.seq_len);
    for (int l = 0; l < L; ++l) costs.data<double>()[l] = c.block[size_t(l)];
    costs.data<double>()[L] = c.embedding;
    costs.data<double>()[L + 1] = c.head;
  }
  mesh_->world().broadcast(costs, 0);
  parallel::PartitionCosts c;
  c.block.assign(costs.data<double>(), costs.data<double>() + L);
  c.embedding = costs.data<double>()[L];
  c.head = costs.data<double>()[L + 1];
  return parallel::partition_balanced(c, pp);
}

// Sums t over the pipeline stages (and, when over_tp, the tensor-parallel ranks).
void Trainer::reduce_over_model_parallel(const Tensor& t, bool over_tp) {
  if (cfg_.parallel.pp > 1) mesh_->pp().all_reduce(t);
  if (over_tp && cfg_.parallel.tp > 1) mesh_->tp().all_reduce(t);
}

Tensor Trainer::full_params() {
  Tensor local = model_->params();
  if (!data_parallel_->params_are_masters()) {
    local = Tensor::zeros({model_->flat_size()}, DType::f32, MemCategory::workspace);
    data_parallel_->gather_full_params(local);
  }
  if (!whole_layout_) return local;
  return parallel::gather_whole_params(*mesh_, model_->layout(), local);
}

ModelParallelInfo Trainer::model_parallel_info() const {
  const auto& p = cfg_.parallel;
  return {mesh_, whole_layout_.get(), layout_desc_, p.pp == 1 && p.tp == 1 && p.ep == 1};
}

void Trainer::check_fits_in_memory() const {
  const auto& p = cfg_.parallel;
  const double states = double(dp_plan_.model_states.total());
  // The whole model's activations for one micro-batch, split over the model-parallel ranks.
  const double activations =
      model::estimate_training_bytes(cfg_.model, 0, double(cfg_.data.micro_batch_size), cfg_.data.seq_len,
                                     cfg_.decoder.activation_checkpoint_interval, cfg_.decoder.xent_chunk) /
      double(p.pp * p.tp);
  const double machine = double(sysconf(_SC_PHYS_PAGES)) * double(sysconf(_SC_PAGESIZE));
  const auto bytes = [](double b) { return format_bytes(int64_t(std::min(b, 9e18))); };
  LOOM_CHECK(states + activations <= machine, "train", "micro-batches of ", cfg_.data.micro_batch_size,
             " sequences (data.micro_batch_size, or the per-rank batch when unset) of data.seq_len=", cfg_.data.seq_len,
             " tokens need about ", bytes(activations), " of activations per rank besides ", bytes(states),
             " of model states, more than this machine's ", bytes(machine),
             " of memory; lower data.micro_batch_size (gradient accumulation keeps data.batch_size), "
             "data.seq_len, or set model.activation_checkpoint_interval");
}

void Trainer::start_new_run() {
  run_id_ = new_run_id(mesh_->world());
  if (cfg_.checkpoint.dir.empty()) return;
  std::string why;
  std::vector<std::string> removed;
  if (main_rank()) {
    try {
      removed = claim_checkpoint_dir(cfg_.checkpoint.dir, opt_.overwrite_checkpoints);
    } catch (const Error& e) {
      why = e.what();
    }
  }
  Tensor refused = Tensor::from_vector<int32_t>({why.empty() ? 0 : 1}, {1});
  if (mesh_->world().size() > 1) mesh_->world().broadcast(refused, 0);
  if (refused.data<int32_t>()[0] != 0) {
    if (main_rank()) throw Error(why);
    fail("checkpoint", "rank 0 refused checkpoint.dir=", cfg_.checkpoint.dir, " (its reason is in its log)");
  }
  if (main_rank() && !removed.empty())
    std::fprintf(opt_.log, "[checkpoint] --overwrite-checkpoints: removed %zu entries of %s\n", removed.size(),
                 cfg_.checkpoint.dir.c_str());
  if (main_rank())
    std::fprintf(opt_.log, "[train] run %s, checkpoints in %s\n", run_id_.c_str(), cfg_.checkpoint.dir.c_str());
}

// The JSONL metrics: a new run truncates the file. A resumed one drops the lines of steps after
// the one it resumes at (a previous attempt logged them before it failed; they are replayed
// now) and appends a resume marker, so every step appears once and plots stay right.
void Trainer::open_metrics() {
  const std::string& path = cfg_.log.metrics_path;
  const fs::path parent = fs::path(path).parent_path();
  std::error_code ec;
  if (!parent.empty()) fs::create_directories(parent, ec);
  LOOM_CHECK(!ec, "train", "log.metrics_path=", path, ": cannot create ", parent.string(), ": ", ec.message());
  int64_t dropped = 0;
  if (step_ > 0 && fs::exists(path)) {
    std::string kept;
    std::istringstream in(io::read_file(path));
    for (std::string line; std::getline(in, line);) {
      const auto j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
      if (j.is_object() && j.contains("step") && j["step"].is_number_integer() && j["step"].get<int64_t>() > step_) {
        ++dropped;
        continue;
      }
      kept += line + "\n";
    }
    io::write_file_atomic(path, kept);
  }
  metrics_ = std::fopen(path.c_str(), step_ > 0 ? "a" : "w");
  LOOM_CHECK(metrics_, "train", "cannot open log.metrics_path=", path, ": ", std::strerror(errno));
  if (step_ > 0) {
    const nlohmann::json mark = {{"event", "resume"},
                                 {"step", step_},
                                 {"run_id", run_id_},
                                 {"checkpoint", last_checkpoint_},
                                 {"dropped_lines", dropped}};
    std::fprintf(metrics_, "%s\n", mark.dump().c_str());
  }
  write_run_start();
}

// A resumed run appends its own run_start ("resumed": true) after the resume mark, so a report
// shows every attempt's environment; "step" keeps it when a later resume drops newer steps.
void Trainer::write_run_start() {
  const auto& p = cfg_.parallel;
  // In insertion order, "event" first: the line is read by people too.
  nlohmann::ordered_json env = nlohmann::ordered_json::object();
  for (const auto& [name, value] : describe_run_environment()) env[name] = value;
  const nlohmann::ordered_json j = {
      {"event", "run_start"},
      {"step", step_},
      {"run_id", run_id_},
      {"resumed", step_ > 0},
      {"world_size", mesh_->world().size()},
      {"layout", layout_desc_},
      {"parallel", {{"pp", p.pp}, {"dp", p.dp}, {"ep", p.ep}, {"tp", p.tp}, {"zero_stage", p.zero_stage}}},
      {"config", cfg_.resolved_yaml},
      {"environment", env}};
  std::fprintf(metrics_, "%s\n", j.dump().c_str());
  std::fflush(metrics_);
}

void Trainer::write_step_metrics(const LoggedStep& ls) {
  nlohmann::json j = {{"step", ls.step},
                      {"loss", ls.loss},
                      {"lr", ls.lr},
                      {"grad_norm", ls.grad_norm},
                      {"tokens_per_s", ls.tokens_per_s},
                      {"mfu", ls.mfu},
                      {"ms_per_step", ls.ms_per_step},
                      {"peak_bytes", ls.peak_bytes},
                      {"exposed_comm_ms", ls.exposed_comm_ms}};
  nlohmann::json mem = nlohmann::json::object();
  for (const CategoryBytes& c : ls.memory) mem[c.category] = {{"current", c.current}, {"peak", c.peak}};
  j["memory"] = mem;
  if (scaler_.enabled()) {
    j["loss_scale"] = scaler_.scale();
    j["skipped_steps"] = skipped_steps_;
  }
  if (nonfinite_steps_ > 0) j["nonfinite_steps"] = nonfinite_steps_;
  if (rollbacks_ > 0) j["rollbacks"] = rollbacks_;
  for (size_t i = 0; i < moe_stats_.size(); ++i) {  // the last step's, per MoE block
    const model::MoeLayerStats& st = moe_stats_[i];
    int64_t mx = 0;
    for (int64_t l : st.load) mx = std::max(mx, l);
    j["moe"].push_back({{"layer", st.layer},
                        {"tokens_per_expert", st.load},
                        {"tokens_per_expert_window", moe_window_[i].load},
                        {"window_dropped_fraction", moe_window_[i].dropped_fraction()},
                        {"tokens_per_expert_max", mx},
                        {"tokens_per_expert_mean", double(st.choices) / double(std::max<size_t>(1, st.load.size()))},
                        {"load_max_over_mean", st.load_max_over_mean()},
                        {"dropped_fraction", st.dropped_fraction()},
                        {"aux_loss", st.aux()},
                        {"z_loss", st.z()}});
  }
  if (!moe_stats_.empty()) j["moe_window_steps"] = moe_window_steps_;
  std::fprintf(metrics_, "%s\n", j.dump().c_str());
  std::fflush(metrics_);
}

double Trainer::take_exposed_comm_seconds() {
  double dp = data_parallel_->take_wait_seconds();
  if (mesh_->data().size() == 1) dp = 0;  // nothing to wait for: what was timed is bookkeeping
  return dp + (ep_ ? ep_->take_wait_seconds() : 0.0);
}

double Trainer::train_step() {
  trace::Span span("train step", "step", {{"step", step_ + 1}});
  const int64_t T = cfg_.data.seq_len, G = cfg_.data.batch_size;
  const int64_t micro = cfg_.data.micro_batch_size;
  const int64_t per_rank = G / mesh_->data_size();
  const int64_t first = mesh_->data_index() * per_rank;  // this rank's share of the global batch
  data_parallel_->zero_grads();
  model_->reset_moe_stats();
  // The mean over the global batch, times the loss scale (fp16): gradients are scale x too large
  // until they are unscaled below.
  const double loss_scale = scaler_.scale();
  last_step_scale_ = loss_scale;
  const bool inject = mesh_->world().rank() == 0 &&
                      std::count(opt_.inject_grad_overflow_at.begin(), opt_.inject_grad_overflow_at.end(), step_ + 1);
  const double grad_scale = inject ? std::numeric_limits<double>::infinity() : loss_scale / double(G * T);
  double loss_sum = 0;
  int64_t count = 0;
  if (pipe_) {
    const int M = int(cfg_.parallel.micro_batches);
    const parallel::PipelineStepStats stats = pipe_->train_step(
        [&](int m, int32_t* tok, int32_t* tgt) {
          data_.fill_train(batch_of(step_), first + m * micro, micro, G, T, tok, tgt);
        },
        micro, T, grad_scale, [&](int m) { data_parallel_->set_sync(m == M - 1); });
    loss_sum = stats.loss_sum;
    count = stats.n_valid;
  } else {
    std::vector<int32_t> tok(size_t(micro * T)), tgt(size_t(micro * T));
    for (int64_t m0 = 0; m0 < per_rank; m0 += micro) {
      data_.fill_train(batch_of(step_), first + m0, micro, G, T, tok.data(), tgt.data());
      data_parallel_->set_sync(m0 + micro >= per_rank);  // only the last micro-batch communicates
      int64_t n = 0;
      loss_sum += model_->forward_backward(tok.data(), tgt.data(), micro, T, grad_scale, &n);
      count += n;
    }
  }
  if (mesh_->world().rank() == 0)
    for (const auto& [at, factor] : opt_.inject_loss_factor_at)
      if (at == step_ + 1) loss_sum *= factor;
  data_parallel_->finish_grads();
  reduce_moe_stats();
  if (pipe_) pipe_->sync_tied_grads(model_->grads());
  if (tp_) tp_->sum_partial_grads(model_->layout(), *data_parallel_);
  Tensor totals = Tensor::from_vector<double>({loss_sum, double(count)}, {2});
  reduce_over_model_parallel(totals, false);  // the last stage's loss, same on every tp rank
  mesh_->data().all_reduce(totals);
  const double loss = totals.data<double>()[0] / std::max(1.0, totals.data<double>()[1]);
  Tensor norm_sq = Tensor::from_vector<double>({data_parallel_->grad_norm_sq()}, {1});
  reduce_over_model_parallel(norm_sq, true);
  const double scaled_norm = std::sqrt(norm_sq.data<double>()[0]);  // the same on every rank
  // The loss and the norm are the same on every rank (summed over all of them, so a NaN anywhere
  // is a NaN everywhere): every rank takes the same decision without another collective.
  const bool loss_ok = std::isfinite(loss), norm_ok = std::isfinite(scaled_norm);
  if (!loss_ok || (!norm_ok && !scaler_.enabled())) {
    const std::string what =
        loss_ok ? str_cat("gradient norm is ", scaled_norm / loss_scale) : str_cat("loss is ", loss);
    LOOM_CHECK(cfg_.guard.nonfinite == "skip", "train", what, " at step ", step_ + 1,
               ": training diverged (lower optim.lr or enable schedule.clip; guard.nonfinite=skip skips such steps)");
    ++nonfinite_steps_;
    ++skipped_steps_;
    ++consecutive_nonfinite_;
    LOOM_CHECK(consecutive_nonfinite_ <= cfg_.guard.max_consecutive_skips, "train", consecutive_nonfinite_,
               " steps in a row had a non-finite loss or gradient norm (the last at step ", step_ + 1, ": ", what,
               "): training diverged; lower optim.lr, enable schedule.clip, or resume from an earlier checkpoint "
               "(guard.max_consecutive_skips=",
               cfg_.guard.max_consecutive_skips, ")");
    if (main_rank())
      std::fprintf(opt_.log, "[guard] step %lld: %s; update skipped on every rank (%lld in a row, %lld in all)\n",
                   (long long)step_ + 1, what.c_str(), (long long)consecutive_nonfinite_, (long long)nonfinite_steps_);
    ++step_;
    return loss;
  }
  consecutive_nonfinite_ = 0;
  if (scaler_.enabled()) {
    if (!scaler_.update(std::isfinite(scaled_norm))) {
      // Overflow: no update on any rank, the scale halves, the data moves on.
      ++skipped_steps_;
      if (main_rank())
        std::fprintf(opt_.log,
                     "[loss-scale] step %lld: gradients overflowed at scale %g; update skipped, scale now %g\n",
                     (long long)step_ + 1, loss_scale, scaler_.scale());
      ++step_;
      return loss;
    }
    data_parallel_->scale_grads(float(1.0 / loss_scale));
  }
  const double norm = scaled_norm / loss_scale;
  last_grad_norm_ = norm;
  double max_norm = cfg_.schedule.clip_max_norm;
  if (cfg_.schedule.clip_dynamic) max_norm = optim::dynamic_clip_threshold(step_, cfg_.schedule.steps);
  if (max_norm > 0 && norm > max_norm) data_parallel_->scale_grads(float(max_norm / norm));
  optim::LrSchedule sched{cfg_.optim.lr, cfg_.schedule.min_lr, cfg_.schedule.warmup_steps, cfg_.schedule.steps};
  data_parallel_->step(sched.lr_at(step_));
  // A dense model ignores the model.moe keys, the balancing bias's rate among them (so one
  // config file serves a MoE model and, with a dense preset, its dense peer).
  if (cfg_.model.moe.enabled() && cfg_.model.moe.bias_update_rate > 0)
    model_->update_router_bias(moe_stats_, cfg_.model.moe.bias_update_rate);
  ++step_;
  return loss;
}

void Trainer::reduce_moe_stats() {
  if (!cfg_.model.moe.enabled()) return;
  moe_stats_ = model_->moe_stats();
  // Each block's statistics live on its pipeline stage, identical on every tp rank; dp and ep
  // ranks route different tokens.
  const std::vector<double> v = model::pack_moe_stats(cfg_.model, moe_stats_);
  Tensor t = Tensor::from_vector<double>(v, {int64_t(v.size())});
  reduce_over_model_parallel(t, false);
  mesh_->data().all_reduce(t);
  model::unpack_moe_stats(cfg_.model, t.data<double>(), moe_stats_);
  if (!main_rank()) return;  // the window is for the metrics, which rank 0 writes
  if (moe_window_.empty()) moe_window_.assign(moe_stats_.size(), {});
  for (size_t i = 0; i < moe_stats_.size(); ++i) moe_window_[i].add(moe_stats_[i]);
  ++moe_window_steps_;
}

std::string Trainer::moe_log() const {
  if (moe_stats_.empty()) return "";
  const model::MoeSummary s = model::summarize_moe_stats(moe_stats_);
  char buf[128];
  std::snprintf(buf, sizeof buf, " | moe load max/mean %.2f, dropped %.2f%%, aux %.3f", s.worst_load,
                100.0 * s.dropped_fraction, s.aux);
  return buf;
}

double Trainer::evaluate() {
  if (!data_.has_val()) return -1;
  const int64_t T = cfg_.data.seq_len, B = cfg_.data.micro_batch_size;
  const int64_t dp = mesh_->data_size(), r = mesh_->data_index();
  double sum = 0, count = 0;
  // Ranks split the evaluation batches; every rank runs the same number of passes (ZeRO-3
  // gathers and pipeline transfers are collective), padding with a batch whose result it ignores.
  const int64_t E = cfg_.schedule.eval_batches, per = (E + dp - 1) / dp;
  if (pipe_) {
    const auto res = pipe_->evaluate(
        [&](int j, int32_t* tok, int32_t* tgt) { data_.fill_val(std::min(r * per + j, E - 1), B, T, tok, tgt); },
        int(per), B, T);
    for (int64_t j = 0; j < per; ++j)
      if (r * per + j < E) {
        sum += res[size_t(j)].first;
        count += double(res[size_t(j)].second);
      }
  } else {
    std::vector<int32_t> tok(size_t(B * T)), tgt(size_t(B * T));
    for (int64_t j = 0; j < per; ++j) {
      const int64_t i = r * per + j;
      data_.fill_val(std::min(i, E - 1), B, T, tok.data(), tgt.data());
      int64_t n = 0;
      const double s = model_->forward(tok.data(), tgt.data(), B, T, &n);
      if (i < E) {
        sum += s;
        count += double(n);
      }
    }
  }
  Tensor totals = Tensor::from_vector<double>({sum, count}, {2});
  reduce_over_model_parallel(totals, false);
  mesh_->data().all_reduce(totals);
  return totals.data<double>()[0] / std::max(1.0, totals.data<double>()[1]);
}

int64_t Trainer::batch_of(int64_t step) const {
  int64_t b = step;
  for (const auto& [from, count] : skipped_windows_)
    if (from <= step) b += count;
  return b;
}

bool Trainer::spike_detected(double loss) {
  const size_t W = size_t(cfg_.guard.spike_window);
  bool spike = false;
  double mean = 0, sd = 0;
  if (loss_window_.size() >= std::max<size_t>(4, W / 2)) {  // enough history to judge
    for (double l : loss_window_) mean += l;
    mean /= double(loss_window_.size());
    for (double l : loss_window_) sd += (l - mean) * (l - mean);
    sd = std::sqrt(sd / double(loss_window_.size() - 1));
    // A floor on the spread: a flat stretch of the curve must not turn noise into spikes.
    sd = std::max(sd, 1e-3 * std::abs(mean));
    spike = (loss - mean) / sd > cfg_.guard.spike_z;
  }
  if (!spike) {
    if (loss_window_.size() < W) {
      loss_window_.push_back(loss);
    } else {
      loss_window_[loss_window_next_] = loss;
      loss_window_next_ = (loss_window_next_ + 1) % W;
    }
    spikes_in_row_ = 0;
    return false;
  }
  if (spikes_in_row_ == 0) first_spike_step_ = step_;  // step_ is the 1-based number of the step just done
  ++spikes_in_row_;
  if (main_rank())
    std::fprintf(opt_.log,
                 "[guard] step %lld: loss %.4f is %.1f standard deviations above the mean %.4f of the last %zu "
                 "steps (spike %lld of guard.max_spikes=%lld in a row)\n",
                 (long long)step_, loss, (loss - mean) / sd, mean, loss_window_.size(), (long long)spikes_in_row_,
                 (long long)cfg_.guard.max_spikes);
  return spikes_in_row_ >= cfg_.guard.max_spikes;
}

void Trainer::roll_back() {
  finish_async_checkpoint(/*wait=*/true);
  const int64_t first = first_spike_step_, last = step_;
  spikes_in_row_ = 0;
  FILE* log = main_rank() ? opt_.log : nullptr;
  // The newest checkpoint from before the first spike's update.
  const auto found = find_latest_valid_checkpoint(cfg_.checkpoint.dir, log, checkpoint_load_scope(mesh_->world()),
                                                  &mesh_->world(), first - 1);
  if (!found) {
    if (log)
      std::fprintf(log, "[guard] no checkpoint from before step %lld to roll back to; training goes on\n",
                   (long long)first);
    return;
  }
  const CheckpointMeta meta =
      load_checkpoint(*found, *model_, *data_parallel_, model_parallel_info(), /*verified=*/true);
  if (main_rank()) {
    // Checkpoints this run saved after the target come from the spiking trajectory: a resume
    // must not pick them (the run saves those steps again as it goes).
    for (const CheckpointEntry& e : list_checkpoints(cfg_.checkpoint.dir))
      if (e.step > meta.step && checkpoint_run_id(e.path) == run_id_) {
        std::error_code ec;
        fs::remove_all(e.path, ec);
      }
    io::write_file_atomic((fs::path(cfg_.checkpoint.dir) / "latest").string(),
                          fs::path(*found).filename().string() + "\n");
  }
  step_ = meta.step;
  last_checkpoint_ = *found;
  if (scaler_.enabled() && meta.loss_scale > 0) scaler_.restore(meta.loss_scale, meta.loss_scale_clean_steps);
  // Steps first..last (1-based) trained on the batches that spiked: skip them from step `first` on.
  skipped_windows_.push_back({first - 1, last - first + 1});
  loss_window_.clear();
  loss_window_next_ = 0;
  ++rollbacks_;
  if (log) {
    std::fprintf(log, "[guard] rolled back to step %lld (%s); the batches of steps %lld-%lld are skipped\n",
                 (long long)step_, found->c_str(), (long long)first, (long long)last);
    std::fflush(log);
  }
  if (metrics_) {
    const nlohmann::json j = {{"event", "rollback"},
                              {"step", step_},
                              {"checkpoint", *found},
                              {"skipped_from_step", first},
                              {"skipped_steps", last - first + 1}};
    std::fprintf(metrics_, "%s\n", j.dump().c_str());
    std::fflush(metrics_);
  }
}

TrainResult Trainer::run() {
  const int64_t total = cfg_.schedule.steps;
  const int64_t stop = opt_.stop_after_steps >= 0 ? std::min(total, opt_.stop_after_steps) : total;
  const int64_t tokens_per_step = cfg_.data.batch_size * cfg_.data.seq_len;
  const int64_t whole_params = full_layout().num_params();  // the whole model's, on every layout
  const double flops_per_step =
      model::training_flops(cfg_.model, whole_params, cfg_.data.batch_size, cfg_.data.seq_len);
  const bool bar_on =
      main_rank() && (cfg_.log.progress == "on" || (cfg_.log.progress == "auto" && ProgressBar::stderr_is_terminal()));
  ProgressBar bar(total, bar_on);
  if (main_rank()) {
    std::fprintf(opt_.log, "[train] model %s, %lld parameters\n", cfg_.model.summary().c_str(),
                 (long long)whole_params);
    if (whole_layout_)
      std::fprintf(opt_.log,
                   "[train] layout %s (%s partition), %s schedule, %lld micro-batches; %lld parameters on rank 0\n",
                   layout_desc_.c_str(), cfg_.parallel.pp_partition.c_str(), cfg_.parallel.pp_schedule.c_str(),
                   (long long)cfg_.parallel.micro_batches, (long long)model_->num_params());
    std::fprintf(opt_.log,
                 "[train] %lld steps of %lld sequences x %lld tokens (micro-batch %lld), lr %.3g "
                 "(warmup %lld, cosine to %.3g)\n",
                 (long long)total, (long long)cfg_.data.batch_size, (long long)cfg_.data.seq_len,
                 (long long)cfg_.data.micro_batch_size, cfg_.optim.lr,
                 (long long)optim::LrSchedule{cfg_.optim.lr, cfg_.schedule.min_lr, cfg_.schedule.warmup_steps, total}
                     .resolved_warmup(),
                 cfg_.schedule.min_lr);
    if (opt_.peak_gflops <= 0)
      std::fprintf(opt_.log, "[train] MFU: model FLOPs over %.0f GFLOP/s per rank, the %s rate measured now\n",
                   peak_gflops_, cpu::on_bf16_gemm(cfg_.model.products()) ? "bf16 GEMM" : "SGEMM");
    const parallel::ModelStateBytes pred = dp_plan_.model_states;
    const auto snap = cpu_allocator().snapshot();
    const int64_t actual =
        snap[MemCategory::params].current + snap[MemCategory::grads].current + snap[MemCategory::optimizer].current;
    std::fprintf(opt_.log,
                 "[train] model states per rank (dp=%lld%s, ZeRO-%lld%s): predicted %s (params %s, grads "
                 "%s, optimizer %s), actual %s\n",
                 (long long)cfg_.parallel.dp, cfg_.parallel.ep > 1 ? str_cat(" x ep=", cfg_.parallel.ep).c_str() : "",
                 (long long)cfg_.parallel.zero_stage,
                 data_parallel_->keeps_replica() ? str_cat(", ", parallel::wire_dtype_name(cfg_.parallel.gather_dtype),
                                                           " weights, fp32 masters with the optimizer")
                                                       .c_str()
                                                 : "",
                 format_bytes(pred.total()).c_str(), format_bytes(pred.params).c_str(),
                 format_bytes(pred.grads).c_str(), format_bytes(pred.optimizer).c_str(), format_bytes(actual).c_str());
    std::fflush(opt_.log);
  }
  TrainResult r;
  take_exposed_comm_seconds();  // the window starts now
  double last_loss = 0, tok_time = 0;
  int64_t timed_steps = 0;
  double window_start = now_seconds();
  int64_t window_steps = 0;
  while (step_ < stop) {
    Stopwatch sw;
    const double lr =
        optim::LrSchedule{cfg_.optim.lr, cfg_.schedule.min_lr, cfg_.schedule.warmup_steps, total}.lr_at(step_);
    const int64_t skipped_before = skipped_steps_;
    last_loss = train_step();
    r.losses.push_back(last_loss);
    if (scaler_.enabled()) r.loss_scales.push_back(last_step_scale_);
    if (async_pending_) finish_async_checkpoint(/*wait=*/false);
    if (cfg_.guard.spike_z > 0 && skipped_steps_ == skipped_before && spike_detected(last_loss)) {
      roll_back();
      window_start = now_seconds();
      window_steps = 0;
      take_exposed_comm_seconds();
      continue;
    }
    const double ms = sw.ms();
    tok_time += ms;
    ++timed_steps;
    ++window_steps;
    if (main_rank() && (step_ % cfg_.log.every == 0 || step_ == stop)) {
      const double el = now_seconds() - window_start;
      LoggedStep ls;
      ls.step = step_;
      ls.total_steps = total;
      ls.loss = last_loss;
      ls.lr = lr;
      ls.grad_norm = last_grad_norm_;
      ls.window_tokens = tokens_per_step * window_steps;
      ls.tokens_per_s = double(ls.window_tokens) / el;
      ls.mfu = flops_per_step * double(window_steps) / el / 1e9 / (peak_gflops_ * double(mesh_->world().size()));
      ls.ms_per_step = el / double(window_steps) * 1e3;
      ls.exposed_comm_ms = take_exposed_comm_seconds() / double(window_steps) * 1e3;
      ls.skipped_steps = skipped_steps_;
      ls.nonfinite_steps = nonfinite_steps_;
      ls.rollbacks = rollbacks_;
      const MemorySnapshot mem = cpu_allocator().snapshot();
      ls.peak_bytes = mem.total.peak;
      for (int c = 0; c < kNumMemCategories; ++c)
        if (mem.by_category[size_t(c)].peak > 0)
          ls.memory.push_back(
              {mem_category_name(MemCategory(c)), mem.by_category[size_t(c)].current, mem.by_category[size_t(c)].peak});
      bar.clear();
      if (ls.mfu > 1.05 && !mfu_warned_ && opt_.peak_gflops <= 0) {
        mfu_warned_ = true;
        std::fprintf(opt_.log,
                     "[train] warning: MFU %.0f%% is over 100%%: the %.0f GFLOP/s measured at start-up was low, "
                     "most likely because other processes used the cores then; this run's MFU figures are "
                     "inflated by as much\n",
                     100 * ls.mfu, peak_gflops_);
      }
      std::fprintf(opt_.log,
                   "step %6lld/%lld | loss %.4f | lr %.3e | grad_norm %.3f | %.0f tok/s | mfu %.1f%% "
                   "| %.0f ms/step | peak %s%s%s\n",
                   (long long)step_, (long long)total, last_loss, lr, last_grad_norm_, ls.tokens_per_s, 100 * ls.mfu,
                   ls.ms_per_step, format_bytes(ls.peak_bytes).c_str(), moe_log().c_str(),
                   scaler_.enabled()
                       ? str_cat(" | loss scale ", scaler_.scale(), ", ", skipped_steps_, " skipped").c_str()
                   : nonfinite_steps_ > 0 ? str_cat(" | ", nonfinite_steps_, " non-finite skipped").c_str()
                                          : "");
      std::fflush(opt_.log);
      if (metrics_) write_step_metrics(ls);
      if (opt_.observer.on_step) opt_.observer.on_step(ls);
      window_start = now_seconds();
      window_steps = 0;
      moe_window_.clear();
      moe_window_steps_ = 0;
    }
    if (cfg_.schedule.eval_interval > 0 && step_ % cfg_.schedule.eval_interval == 0 && step_ < stop) {
      const double v = evaluate();
      if (main_rank() && v >= 0) {
        bar.clear();
        std::fprintf(opt_.log, "step %6lld/%lld | val_loss %.4f\n", (long long)step_, (long long)total, v);
        if (metrics_) {
          std::fprintf(metrics_, "%s\n", nlohmann::json({{"step", step_}, {"val_loss", v}}).dump().c_str());
          std::fflush(metrics_);
        }
        if (opt_.observer.on_val_loss) opt_.observer.on_val_loss(step_, v);
      }
    }
    maybe_checkpoint(false);
    bar.update(step_, str_cat("loss ", last_loss));
  }
  bar.finish();
  maybe_checkpoint(true);
  finish_async_checkpoint(/*wait=*/true);
  r.steps = step_;
  r.skipped_steps = skipped_steps_;
  r.nonfinite_steps = nonfinite_steps_;
  r.rollbacks = rollbacks_;
  r.checkpoint_stall_s = checkpoint_stall_s_;
  r.checkpoints = checkpoints_;
  r.checkpoint_write_s = checkpoint_write_s_;
  r.final_train_loss = last_loss;
  r.final_val_loss = evaluate();
  r.tokens_per_s = timed_steps ? double(tokens_per_step * timed_steps) / (tok_time / 1e3) : 0;
  r.peak_bytes = cpu_allocator().snapshot().total.peak;
  r.last_checkpoint = last_checkpoint_;
  return r;
}

}  // namespace loom::train

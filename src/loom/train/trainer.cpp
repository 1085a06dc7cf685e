// The Trainer's construction (mesh, model, tensor, pipeline and data parallelism), one training
// step, evaluation and the run loop; the rest of the class is in trainer_*.cpp (see trainer.h).
#include "loom/train/trainer.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include <nlohmann/json.hpp>

#include "loom/core/threads.h"
#include "loom/core/timer.h"
#include "loom/core/trace.h"
#include "loom/kernels/cpu/bf16_gemm.h"
#include "loom/kernels/cpu/gemm.h"
#include "loom/model/memory_estimate.h"
#include "loom/optim/schedule.h"
#include "loom/parallel/model_gather.h"
#include "loom/train/checkpoint.h"
#include "loom/train/checkpoint_agreement.h"
#include "loom/train/checkpoint_writer.h"
#include "loom/train/progress.h"

namespace loom::train {

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
    : cfg_(cfg),
      data_(data),
      opt_(opt),
      scaler_(cfg.loss_scale),
      spike_detector_(cfg.guard.spike_z, cfg.guard.spike_window),
      divergence_(cfg.guard.divergence_factor, cfg.guard.divergence_steps) {
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
  if (!cfg_.init_from.empty()) {
    init_source_ = resolve_init_source(cfg_.init_from, mesh_->world());
    on_every_rank_or_none(mesh_->world(), str_cat("reading model.init_from=", cfg_.init_from, "'s tokenizer"), [&] {
      check_init_source_data(init_source_, data_.vocab_size(), cfg_.data.dir);
      if (main_rank()) card_files_ = init_source_tokenizer_files(init_source_);
    });
  }
  LOOM_CHECK(data_.vocab_size() <= cfg_.model.vocab_size, "train", "the data's vocabulary (", data_.vocab_size(),
             " tokens) does not fit model.vocab_size=", cfg_.model.vocab_size, "; set model.vocab_size to at least ",
             data_.vocab_size());
  // Ranks that see different data: dp x ep (each ep rank routes its own tokens).
  const auto ranks = p.data_parallel_ranks();
  const int pp_rank = int(mesh_->coord().pp);
  stages_ = partition_stages();
  // This stage's chunks of blocks: stages_ holds the model's pp x v chunks in model order.
  model::ModelSlice slice = parallel::stage_slice(stages_, pp_rank, int(p.pp), int(p.virtual_stages),
                                                  parallel::chunk_placement(p.pp_schedule));
  slice.tp = p.tp;
  slice.tp_rank = mesh_->coord().tp;
  slice.ep = p.ep;
  slice.ep_rank = mesh_->coord().ep;
  slice.lora_adapters = cfg_.model.lora.enabled();
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
  // Random weights unless model.init_from (or the resume before it) overwrites them all; without
  // a flat buffer DataParallel inits its chunks. LoRA: the adapters always start random (B zero),
  // and the frozen model is init_from's weights, loaded below on every start, resumed or not.
  const bool lora = cfg_.model.lora.enabled();
  if (dopt.allocate_flat_params && (cfg_.init_from.empty() || lora)) model_->init_weights(cfg_.schedule.seed);
  if (lora && cfg_.init_from.empty()) model_->init_base_weights(cfg_.schedule.seed);
  place_optimizer_state();  // before DataParallel: what it offloads is never resident
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
        parallel::PipelineOptions{p.pp_schedule, int(p.micro_batches), int(p.virtual_stages), p.pp_dtype,
                                  data_.packs_documents()});
  if (p.pp > 1 || p.tp > 1 || p.ep > 1)
    whole_layout_ = std::make_unique<model::ParamLayout>(cfg_.model, 1, model::ModelSlice{.lora_adapters = lora});
  check_fits_in_memory();
  if (p.micro_batches_auto) start_micro_batch_tuner();
  layout_desc_ = str_cat(shape.describe(), ", stages ", parallel::describe_partition(stages_),
                         p.virtual_stages > 1 ? str_cat(" (", p.virtual_stages, " chunks per stage)") : "");
  if (lora) identify_lora_base();
  if (!opt_.resume.empty()) resume_from(opt_.resume);
  if (step_ == 0) start_new_run();
  if (!cfg_.init_from.empty() && (step_ == 0 || lora)) init_from_source();
  if (main_rank() && !cfg_.log.metrics_path.empty()) open_metrics();
  peak_gflops_ =
      opt_.peak_gflops > 0 ? opt_.peak_gflops : measure_gemm_gflops(cpu::on_bf16_gemm(cfg_.model.products()));
  if (cfg_.checkpoint.async && !cfg_.checkpoint.dir.empty() && main_rank()) {
    writer_ = std::make_unique<CheckpointWriter>();
    // Data parallelism only: snapshots fill reserved buffers (model-parallel ones gather into
    // fresh ones; parallel/model_gather.h).
    if (!whole_layout_) writer_->reserve(cfg_.model, model::ModelSlice{.lora_adapters = lora});
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
  // LoRA dropout: masks of (seed, step, micro-batch), the same on the ranks that share data (tp).
  model_->set_dropout_step(cfg_.schedule.seed ^ (uint64_t(mesh_->data_index()) * 0x9e3779b97f4a7c15ULL), step_);
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
        [&](int m, int32_t* tok, int32_t* tgt, int32_t* pos) {
          data_.fill_train(batch_of(step_), first + m * micro, micro, G, T, tok, tgt, pos);
        },
        micro, T, grad_scale, [&](int m) { data_parallel_->set_sync(m == M - 1); });
    loss_sum = stats.loss_sum;
    count = stats.n_valid;
    last_bubble_s_ = std::max(0.0, stats.wall_s - stats.busy_s);
  } else {
    std::vector<int32_t> tok(size_t(micro * T)), tgt(size_t(micro * T));
    std::vector<int32_t> pos(data_.packs_documents() ? size_t(micro * T) : 0);
    int32_t* positions = pos.empty() ? nullptr : pos.data();
    for (int64_t m0 = 0; m0 < per_rank; m0 += micro) {
      data_.fill_train(batch_of(step_), first + m0, micro, G, T, tok.data(), tgt.data(), positions);
      data_parallel_->set_sync(m0 + micro >= per_rank);  // only the last micro-batch communicates
      int64_t n = 0;
      loss_sum += model_->forward_backward(tok.data(), tgt.data(), micro, T, grad_scale, &n, positions);
      count += n;
    }
  }
  if (mesh_->world().rank() == 0)
    for (const auto& [at, factor] : opt_.inject_loss_factor_at)
      if (at == batch_of(step_) + 1) loss_sum *= factor;
  data_parallel_->finish_grads();
  reduce_moe_stats();
  if (pipe_) pipe_->sync_tied_grads(model_->grads());
  if (tp_) tp_->sum_partial_grads(model_->layout(), *data_parallel_);
  Tensor totals = Tensor::from_vector<double>({loss_sum, double(count)}, {2});
  reduce_over_model_parallel(totals, false);  // the last stage's loss, same on every tp rank
  mesh_->data().all_reduce(totals);
  const double counted = totals.data<double>()[1];
  last_counted_ = counted;
  const double loss = totals.data<double>()[0] / std::max(1.0, counted);
  // The backward divided by every position of the global batch; with a loss mask (chat data:
  // only the replies are trained) fewer count, and the mean over those is `per_counted` x it.
  // Text data counts them all: exactly 1, and nothing is rescaled.
  const double per_counted = counted > 0 && counted < double(G * T) ? double(G * T) / counted : 1.0;
  Tensor norm_sq = Tensor::from_vector<double>({data_parallel_->grad_norm_sq()}, {1});
  reduce_over_model_parallel(norm_sq, true);
  const double scaled_norm = std::sqrt(norm_sq.data<double>()[0]) * per_counted;  // the same on every rank
  // The loss and the norm are the same on every rank (summed over all of them, so a NaN anywhere
  // is a NaN everywhere): every rank takes the same decision without another collective.
  const bool loss_ok = std::isfinite(loss), norm_ok = std::isfinite(scaled_norm);
  if (!loss_ok || (!norm_ok && !scaler_.enabled())) {
    const std::string what =
        loss_ok ? str_cat("gradient norm is ", scaled_norm / loss_scale) : str_cat("loss is ", loss);
    ++nonfinite_steps_;
    ++skipped_steps_;
    if (consecutive_nonfinite_++ == 0) first_nonfinite_step_ = step_ + 1;
    if (cfg_.guard.nonfinite == NonFinite::stop) {
      stop_run(RunEnd::nonfinite, str_cat(what, " at step ", step_ + 1, " (guard.nonfinite=stop)"));
    } else if (consecutive_nonfinite_ > cfg_.guard.max_consecutive_skips) {
      stop_run(
          RunEnd::nonfinite,
          str_cat(consecutive_nonfinite_, " steps in a row had a non-finite loss or gradient norm (the last at step ",
                  step_ + 1, ": ", what, "; guard.max_consecutive_skips=", cfg_.guard.max_consecutive_skips, ")"));
    } else if (main_rank()) {
      std::fprintf(opt_.log, "[guard] step %lld: %s; update skipped on every rank (%lld in a row, %lld in all)\n",
                   (long long)step_ + 1, what.c_str(), (long long)consecutive_nonfinite_, (long long)nonfinite_steps_);
    }
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
  }
  if (loss_scale != 1 || per_counted != 1) data_parallel_->scale_grads(float(per_counted / loss_scale));
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

double Trainer::evaluate() {
  if (!data_.has_val()) return -1;
  const int64_t T = cfg_.data.seq_len, B = cfg_.data.micro_batch_size;
  const int64_t dp = mesh_->data_size(), r = mesh_->data_index();
  double sum = 0, count = 0;
  // Ranks split the evaluation batches; every rank runs the same number of passes (ZeRO-3
  // gathers and pipeline transfers are collective), padding with a batch whose result it ignores.
  const int64_t E = cfg_.schedule.eval_batches, per = (E + dp - 1) / dp;
  if (pipe_) {
    const auto res =
        pipe_->evaluate([&](int j, int32_t* tok, int32_t* tgt,
                            int32_t* pos) { data_.fill_val(std::min(r * per + j, E - 1), B, T, tok, tgt, pos); },
                        int(per), B, T);
    for (int64_t j = 0; j < per; ++j)
      if (r * per + j < E) {
        sum += res[size_t(j)].first;
        count += double(res[size_t(j)].second);
      }
  } else {
    std::vector<int32_t> tok(size_t(B * T)), tgt(size_t(B * T));
    std::vector<int32_t> pos(data_.packs_documents() ? size_t(B * T) : 0);
    int32_t* positions = pos.empty() ? nullptr : pos.data();
    for (int64_t j = 0; j < per; ++j) {
      const int64_t i = r * per + j;
      data_.fill_val(std::min(i, E - 1), B, T, tok.data(), tgt.data(), positions);
      int64_t n = 0;
      const double s = model_->forward(tok.data(), tgt.data(), B, T, &n, positions);
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

void Trainer::report_val_loss(double v, int64_t total, bool final) {
  if (!main_rank() || v < 0) return;
  std::fprintf(opt_.log, "step %6lld/%lld | val_loss %.4f%s\n", (long long)step_, (long long)total, v,
               final ? " (final)" : "");
  if (metrics_) {
    nlohmann::json j = {{"step", step_}, {"val_loss", v}};
    if (final) j["final"] = true;
    write_metrics_line(j.dump());
  }
  if (opt_.observer.on_val_loss) opt_.observer.on_val_loss(step_, v);
}

TrainResult Trainer::run() {
  const int64_t total = cfg_.schedule.steps;
  const int64_t stop = opt_.stop_after_steps >= 0 ? std::min(total, opt_.stop_after_steps) : total;
  const int64_t tokens_per_step = cfg_.data.batch_size * cfg_.data.seq_len;
  // The whole model's parameters, on every layout (under LoRA the frozen model's).
  const int64_t whole_params =
      model_->lora() ? model::ParamLayout(cfg_.model, 1).num_params() : full_layout().num_params();
  // LoRA computes no weight gradient of the model: its forward and input-gradient products, 4 of
  // the 6 FLOPs per parameter and token (the adapters' own are a rounding error).
  const double flops_per_step =
      model::training_flops(cfg_.model, whole_params, cfg_.data.batch_size, cfg_.data.seq_len) *
      (model_->lora() ? 2.0 / 3.0 : 1.0);
  const bool bar_on =
      main_rank() && (cfg_.log.progress == Progress::on ||
                      (cfg_.log.progress == Progress::auto_detect && ProgressBar::stderr_is_terminal()));
  ProgressBar bar(total, bar_on);
  if (main_rank()) log_run_start(whole_params);
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
    if (ended_ != RunEnd::finished) break;  // train_step stopped it (non-finite)
    // An update was made (its loss is finite) on a batch with trained targets (a fully masked
    // batch's loss is 0, which says nothing of the run).
    if (skipped_steps_ == skipped_before && last_counted_ > 0) {
      if (cfg_.guard.spike_z > 0 && spike_detected(last_loss)) {
        roll_back();
        if (ended_ != RunEnd::finished) break;
        window_start = now_seconds();
        window_steps = 0;
        take_exposed_comm_seconds();
        continue;
      }
      if (divergence_detected(last_loss)) break;
    }
    const double ms = sw.ms();
    tok_time += ms;
    ++timed_steps;
    ++window_steps;
    if (main_rank() && (step_ % cfg_.log.every == 0 || step_ == stop)) {
      bar.clear();
      log_step(last_loss, lr, now_seconds() - window_start, window_steps, flops_per_step);
      window_start = now_seconds();
      window_steps = 0;
    }
    if (micro_tuner_) tune_micro_batches(ms / 1e3);
    if (cfg_.schedule.eval_interval > 0 && step_ % cfg_.schedule.eval_interval == 0 && step_ < stop) {
      bar.clear();
      report_val_loss(evaluate(), total, false);
    }
    maybe_checkpoint(false);
    bar.update(step_, str_cat("loss ", last_loss));
  }
  bar.finish();
  const bool finished = ended_ == RunEnd::finished;
  if (finished) maybe_checkpoint(true);
  finish_async_checkpoint(/*wait=*/true);
  r.ended = ended_;
  r.end_reason = end_reason_;
  r.last_healthy_step = last_healthy_step_;
  r.spikes = spikes_;
  r.divergence_warnings = divergence_warnings_;
  r.steps = step_;
  r.skipped_steps = skipped_steps_;
  r.nonfinite_steps = nonfinite_steps_;
  r.rollbacks = rollbacks_;
  r.checkpoint_stall_s = checkpoint_stall_s_;
  r.checkpoints = checkpoints_;
  r.checkpoint_write_s = checkpoint_write_s_;
  r.final_train_loss = last_loss;
  if (finished) {  // a stopped run's weights are not worth a validation pass
    r.final_val_loss = evaluate();
    report_val_loss(r.final_val_loss, total, true);
  }
  write_run_end();
  r.tokens_per_s = timed_steps ? double(tokens_per_step * timed_steps) / (tok_time / 1e3) : 0;
  r.peak_bytes = cpu_allocator().snapshot().total.peak;
  r.last_checkpoint = last_checkpoint_;
  return r;
}

}  // namespace loom::train

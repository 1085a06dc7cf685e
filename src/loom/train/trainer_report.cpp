// What a training run says: the start-up lines and the step lines on the log, the JSONL metrics
// (run start, steps, resume marks), and the MoE router statistics both draw from. The loop that
// produces the values is in trainer.cpp.
#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <sstream>

#include <nlohmann/json.hpp>

#include "loom/io/file.h"
#include "loom/kernels/cpu/bf16_gemm.h"
#include "loom/optim/schedule.h"
#include "loom/train/run_environment.h"
#include "loom/train/trainer.h"

namespace loom::train {

namespace fs = std::filesystem;

// The start-up lines on rank 0: model, layout, schedule, the MFU's denominator and the
// predicted against the actual model-state bytes.
void Trainer::log_run_start(int64_t whole_params) {
  const int64_t total = cfg_.schedule.steps;
  std::fprintf(opt_.log, "[train] model %s, %lld parameters\n", cfg_.model.summary().c_str(), (long long)whole_params);
  if (whole_layout_)
    std::fprintf(opt_.log,
                 "[train] layout %s (%s partition), %s schedule, %lld micro-batches%s; %lld parameters on rank 0\n",
                 layout_desc_.c_str(), parallel::partition_method_name(cfg_.parallel.pp_partition),
                 parallel::pipe_schedule_name(cfg_.parallel.pp_schedule), (long long)cfg_.parallel.micro_batches,
                 micro_tuner_ ? " to start (auto)" : "", (long long)model_->num_params());
  std::fprintf(opt_.log,
               "[train] %lld steps of %lld sequences x %lld tokens (micro-batch %lld%s), lr %.3g "
               "(warmup %lld, cosine to %.3g)\n",
               (long long)total, (long long)cfg_.data.batch_size, (long long)cfg_.data.seq_len,
               (long long)cfg_.data.micro_batch_size, micro_tuner_ ? " to start" : "", cfg_.optim.lr,
               (long long)optim::LrSchedule{cfg_.optim.lr, cfg_.schedule.min_lr, cfg_.schedule.warmup_steps, total}
                   .resolved_warmup(),
               cfg_.schedule.min_lr);
  if (opt_.peak_gflops <= 0)
    std::fprintf(opt_.log, "[train] MFU: model FLOPs over %.0f GFLOP/s per rank, the %s rate measured now\n",
                 peak_gflops_, cpu::on_bf16_gemm(cfg_.model.products()) ? "bf16 GEMM" : "SGEMM");
  const parallel::ModelStateBytes pred = dp_plan_.model_states;
  const auto snap = cpu_allocator().snapshot();
  // LoRA: the frozen model is not a model state of the training (no gradient, no optimizer):
  // said apart.
  const int64_t frozen = model_->frozen_bytes();
  if (frozen)
    std::fprintf(opt_.log,
                 "[train] LoRA %s: %lld trainable parameters (%.2f%% of the model's), the model's weights "
                 "frozen (%s per rank, %s)\n",
                 cfg_.model.lora.describe().c_str(), (long long)full_layout().num_params(),
                 100.0 * double(full_layout().num_params()) / double(whole_params), format_bytes(frozen).c_str(),
                 cfg_.model.lora.base_dtype == DType::bf16 ? "bf16 blocks, f32 embeddings and head" : "f32");
  const int64_t actual = snap[MemCategory::params].current - frozen + snap[MemCategory::grads].current +
                         snap[MemCategory::optimizer].current;
  std::fprintf(opt_.log,
               "[train] model states per rank (dp=%lld%s, ZeRO-%lld%s): predicted %s (params %s, grads "
               "%s, optimizer %s), actual %s\n",
               (long long)cfg_.parallel.dp, cfg_.parallel.ep > 1 ? str_cat(" x ep=", cfg_.parallel.ep).c_str() : "",
               (long long)cfg_.parallel.zero_stage,
               data_parallel_->keeps_replica() ? str_cat(", ", parallel::wire_dtype_name(cfg_.parallel.gather_dtype),
                                                         " weights, fp32 masters with the optimizer")
                                                     .c_str()
                                               : "",
               format_bytes(pred.total()).c_str(), format_bytes(pred.params).c_str(), format_bytes(pred.grads).c_str(),
               format_bytes(pred.optimizer).c_str(), format_bytes(actual).c_str());
  std::fflush(opt_.log);
}

// The step line (and the metrics line and the observer's call) for the `window_steps` steps
// of the last `elapsed_s` seconds, on rank 0.
void Trainer::log_step(double last_loss, double lr, double elapsed_s, int64_t window_steps, double flops_per_step) {
  const int64_t total = cfg_.schedule.steps, tokens_per_step = cfg_.data.batch_size * cfg_.data.seq_len;
  LoggedStep ls;
  ls.step = step_;
  ls.total_steps = total;
  ls.loss = last_loss;
  ls.lr = lr;
  ls.grad_norm = last_grad_norm_;
  ls.window_tokens = tokens_per_step * window_steps;
  ls.tokens_per_s = double(ls.window_tokens) / elapsed_s;
  ls.mfu = flops_per_step * double(window_steps) / elapsed_s / 1e9 / (peak_gflops_ * double(mesh_->world().size()));
  ls.ms_per_step = elapsed_s / double(window_steps) * 1e3;
  ls.exposed_comm_ms = take_exposed_comm_seconds() / double(window_steps) * 1e3;
  ls.skipped_steps = skipped_steps_;
  ls.nonfinite_steps = nonfinite_steps_;
  ls.rollbacks = rollbacks_;
  ls.spikes = spikes_;
  const MemorySnapshot mem = cpu_allocator().snapshot();
  ls.peak_bytes = mem.total.peak;
  for (int c = 0; c < kNumMemCategories; ++c)
    if (mem.by_category[size_t(c)].peak > 0)
      ls.memory.push_back(
          {mem_category_name(MemCategory(c)), mem.by_category[size_t(c)].current, mem.by_category[size_t(c)].peak});
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
               scaler_.enabled() ? str_cat(" | loss scale ", scaler_.scale(), ", ", skipped_steps_, " skipped").c_str()
               : nonfinite_steps_ > 0 ? str_cat(" | ", nonfinite_steps_, " non-finite skipped").c_str()
                                      : "");
  std::fflush(opt_.log);
  if (metrics_) write_step_metrics(ls);
  if (opt_.observer.on_step) opt_.observer.on_step(ls);
  moe_window_.clear();
  moe_window_steps_ = 0;
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
  write_metrics_line(j.dump());
}

void Trainer::write_metrics_line(const std::string& json) {
  if (!metrics_) return;
  std::fprintf(metrics_, "%s\n", json.c_str());
  std::fflush(metrics_);
}

void Trainer::write_run_end() {
  if (!metrics_) return;
  nlohmann::ordered_json j = {{"event", "end"},    {"step", step_},           {"ended", run_end_name(ended_)},
                              {"spikes", spikes_}, {"rollbacks", rollbacks_}, {"nonfinite_steps", nonfinite_steps_}};
  if (ended_ != RunEnd::finished) {
    j["last_healthy_step"] = last_healthy_step_;
    j["reason"] = end_reason_;
  }
  write_metrics_line(j.dump());
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
                      {"exposed_comm_ms", ls.exposed_comm_ms},
                      {"micro_batches", cfg_.parallel.micro_batches}};
  nlohmann::json mem = nlohmann::json::object();
  for (const CategoryBytes& c : ls.memory) mem[c.category] = {{"current", c.current}, {"peak", c.peak}};
  j["memory"] = mem;
  if (scaler_.enabled()) {
    j["loss_scale"] = scaler_.scale();
    j["skipped_steps"] = skipped_steps_;
  }
  if (nonfinite_steps_ > 0) j["nonfinite_steps"] = nonfinite_steps_;
  if (rollbacks_ > 0) j["rollbacks"] = rollbacks_;
  if (spikes_ > 0) j["spikes"] = spikes_;
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
  write_metrics_line(j.dump());
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

}  // namespace loom::train

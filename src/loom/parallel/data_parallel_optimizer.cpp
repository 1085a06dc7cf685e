// DataParallel's optimizer step and the state checkpoints read and write: AdamW (or 1-bit
// Adam past its warm-up) on this rank's ranges, the global gradient norm, the weight source's
// refresh after the step, and whole moments gathered or taken back.
#include <algorithm>

#include "loom/core/timer.h"
#include "loom/core/trace.h"
#include "loom/optim/schedule.h"
#include "loom/parallel/data_parallel.h"

namespace loom::parallel {

using model::ParamUnit;

void DataParallel::set_norm_skip(std::vector<std::pair<int64_t, int64_t>> ranges) {
  std::sort(ranges.begin(), ranges.end());
  norm_skip_ = std::move(ranges);
}

// Sum of squares of grads[0, n) standing for flat indices [flat0, flat0 + n), minus the
// skipped ranges.
double DataParallel::counted_sum_squares(const float* g, int64_t flat0, int64_t n) const {
  double total = 0;
  int64_t at = flat0;
  const int64_t end = flat0 + n;
  for (const auto& [b, e] : norm_skip_) {
    if (e <= at || b >= end) continue;
    if (b > at) total += optim::sum_squares(g + (at - flat0), b - at);
    at = std::max(at, e);
  }
  if (at < end) total += optim::sum_squares(g + (at - flat0), end - at);
  return total;
}

double DataParallel::grad_norm_sq() {
  finish_grads();
  if (compressing()) {
    // Local gradients only: the mean over ranks of the squared norm of each rank's own
    // batch-mean gradient (its gradient here is that over n), an upper estimate of the
    // global gradient's squared norm (which no rank has) for clipping and overflow checks.
    Tensor s = Tensor::from_vector<double>(
        {counted_sum_squares(model_.grads().data<float>(), 0, model_.grads().numel())}, {1});
    dp_.all_reduce(s);
    return s.data<double>()[0] * n_;
  }
  return grad_sync_->norm_sq();
}

double DataParallel::sum_over_dp(double local) {
  Tensor s = Tensor::from_vector<double>({local}, {1});
  trace::Span span("wait grad norm all_reduce", "wait");
  Stopwatch sw;
  dp_.all_reduce(s);
  wait_s_ += sw.seconds();
  return s.data<double>()[0];
}

const std::vector<std::unique_ptr<comm::OneBitAllReduce>>& DataParallel::onebit() const {
  static const std::vector<std::unique_ptr<comm::OneBitAllReduce>> none;
  return onebit_ ? onebit_->exchanges() : none;
}

void DataParallel::onebit_step(double lr) {
  const auto& units = layout_.units();
  const float gs = float(grad_scale_);
  float* params = model_.params().data<float>();
  const float* grads = model_.grads().data<float>();
  for (size_t i = 0; i < units.size(); ++i) {
    const ParamUnit& u = units[i];
    if (u.size() == 0) continue;
    optim::AdamW& a = optimizer_->unit(i);
    // ZeRO-0 averages each unit's momentum; ZeRO-1 sends gradients to the chunks' owners and
    // their weight changes back.
    if (opt_.zero_stage == 1)
      onebit_->step_owner(i, a, u.begin, params + u.begin, grads + u.begin, gs, lr);
    else
      onebit_->step_replicated(i, a, params + a.begin(), grads + a.begin(), gs, lr);
  }
  const optim::OneBitAdam::Totals t = onebit_->take_totals();
  wait_s_ += t.comm_s;
  compress_s_ += t.compute_s;
  wire_bytes_ += t.wire_bytes;
}

void DataParallel::step(double lr) {
  finish_grads();
  trace::Span span("optimizer", "compute");
  const auto& units = layout_.units();
  if (compressing()) {
    onebit_step(lr);
    grad_scale_ = 1.0;
    last_wire_bytes_ = wire_bytes_;
    wire_bytes_ = 0;
    return;
  }
  for (size_t i = 0; i < units.size(); ++i) {
    const ParamUnit& u = units[i];
    const int64_t b = optimizer_->unit(i).begin();
    optimizer_->step_unit(i, weights_->masters(u, b), grad_sync_->unit_grads(u, b), lr, grad_scale_);
  }
  grad_scale_ = 1.0;
  const int64_t refreshed = weights_->refresh();  // the updated chunks to the other ranks
  last_wire_bytes_ = wire_bytes_ + refreshed;
  wire_bytes_ = 0;
}

double DataParallel::take_wait_seconds() {
  const double s = wait_s_;
  wait_s_ = 0;
  return s;
}

double DataParallel::take_compress_seconds() {
  const double s = compress_s_;
  compress_s_ = 0;
  return s;
}

int64_t DataParallel::optimizer_steps() const { return optimizer_->step_count(); }

void DataParallel::gather_full_moments(const Tensor& exp_avg, const Tensor& exp_avg_sq) const {
  optimizer_->gather_full_moments(exp_avg, exp_avg_sq);
}

void DataParallel::load_full_moments(const Tensor& exp_avg, const Tensor& exp_avg_sq, int64_t optimizer_steps) {
  optimizer_->load_full_moments(exp_avg, exp_avg_sq, optimizer_steps);
}

}  // namespace loom::parallel

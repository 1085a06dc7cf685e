// DataParallel's optimizer step and the state checkpoints read and write: AdamW (or 1-bit
// Adam past its warm-up) on this rank's ranges, the global gradient norm, the weights'
// all-gather after the step at stages 1-2, and whole weights and moments gathered or taken back.
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
  double local = 0;
  if (opt_.zero_stage < 2) {
    // Every rank of the dp group holds the same reduced dense gradients; expert units differ
    // between the dp group's expert-parallel ranks and repeat over each expert-dp group.
    if (en_ == n_) return counted_sum_squares(model_.grads().data<float>(), 0, model_.grads().numel());
    for (const auto& u : layout_.units())
      local += counted_sum_squares(model_.grads().data<float>() + u.begin, u.begin, u.size()) / double(n_of(u));
  } else {
    for (const auto& u : layout_.units())
      local += counted_sum_squares(grad_shard_.data<float>() + shard_offset(u), u.begin + r_of(u) * chunk_size(u),
                                   chunk_size(u));
  }
  Tensor s = Tensor::from_vector<double>({local}, {1});
  trace::Span span("wait grad norm all_reduce", "wait");
  Stopwatch sw;
  dp_.all_reduce(s);
  wait_s_ += sw.seconds();
  return s.data<double>()[0];
}

void DataParallel::onebit_step_zero0(double lr) {
  const auto& units = layout_.units();
  // Each rank's momentum estimate b1 m / n + (1 - b1) g (its gradient is its share of the
  // sum over ranks), summed over ranks by the 1-bit all-reduce, is the new momentum.
  const float b1 = float(adam_cfg_.beta1), gs = float(grad_scale_), inv_n = 1.f / float(n_);
  for (size_t i = 0; i < units.size(); ++i) {
    if (units[i].size() == 0) continue;
    float* m = adam_[i]->exp_avg().data<float>();
    const float* g = model_.grads().data<float>() + adam_[i]->begin();
    const int64_t n = adam_[i]->end() - adam_[i]->begin();
#pragma omp parallel for schedule(static) if (n > 65536)
    for (int64_t j = 0; j < n; ++j) m[j] = b1 * m[j] * inv_n + (1.f - b1) * g[j] * gs;
    onebit_[i]->sum(m);
    wait_s_ += onebit_[i]->last_comm_seconds();
    compress_s_ += onebit_[i]->last_compute_seconds();
    wire_bytes_ += onebit_[i]->wire_bytes();
    // Bounded at 2 lr per element, as ZeRO-1's step below: a parameter whose gradients were
    // tiny until the freeze (the token-table rows of rare tokens) has a tiny v, and the sign
    // noise of the compressed momentum over sqrt(v) would step it far every step.
    adam_[i]->step_frozen_variance(model_.params().data<float>() + adam_[i]->begin(), lr, adam_cfg_.freeze_step, 2.f);
  }
}

void DataParallel::onebit_step_zero1(double lr) {
  const auto& units = layout_.units();
  // ZeRO-1: the owner of each chunk gets the compressed sum of the ranks' gradients for
  // it, updates its momentum (exact) and weights with the frozen variance, and sends the
  // weight change compressed to everyone, itself included, so every copy stays identical.
  const float b1 = float(adam_cfg_.beta1), gs = float(grad_scale_);
  for (size_t i = 0; i < units.size(); ++i) {
    const ParamUnit& u = units[i];
    if (u.size() == 0) continue;
    auto& a = *adam_[i];
    const int64_t c = a.end() - a.begin();
    Tensor scaled = take_buffer(u.size()), ghat = take_buffer(c), next = take_buffer(c);
    const float* g = model_.grads().data<float>() + u.begin;
    float* x = scaled.data<float>();
#pragma omp parallel for schedule(static) if (u.size() > 65536)
    for (int64_t j = 0; j < u.size(); ++j) x[j] = g[j] * gs;
    onebit_[i]->reduce_to_owner(x, ghat.data<float>());
    wait_s_ += onebit_[i]->last_comm_seconds();
    compress_s_ += onebit_[i]->last_compute_seconds();
    float* m = a.exp_avg().data<float>();
    const float* gh = ghat.data<float>();
    for (int64_t j = 0; j < c; ++j) m[j] = b1 * m[j] + (1.f - b1) * gh[j];
    float* p = model_.params().data<float>() + a.begin();
    float* d = next.data<float>();
    std::copy_n(p, c, d);
    // A parameter whose gradient was ~0 until the freeze has v ~ 0, and the sign noise of
    // its compressed gradient divided by sqrt(v) makes a huge step; compressed with its
    // block it would set the whole block's scale. Bounding the step at 2 lr (Adam's own
    // steps are about lr) keeps one such element from wiping out its 1023 neighbours.
    a.step_frozen_variance(d, lr, adam_cfg_.freeze_step, 2.f);
    for (int64_t j = 0; j < c; ++j) d[j] -= p[j];  // the change this step
    onebit_[i]->all_gather_add(d, model_.params().data<float>() + u.begin);
    wait_s_ += onebit_[i]->last_comm_seconds();
    compress_s_ += onebit_[i]->last_compute_seconds();
    wire_bytes_ += onebit_[i]->wire_bytes();
    recycle(std::move(scaled));
    recycle(std::move(ghat));
    recycle(std::move(next));
  }
}

void DataParallel::step(double lr) {
  finish_grads();
  trace::Span span("optimizer", "compute");
  const auto& units = layout_.units();
  if (compressing()) {
    if (opt_.zero_stage == 1)
      onebit_step_zero1(lr);
    else
      onebit_step_zero0(lr);
    grad_scale_ = 1.0;
    last_wire_bytes_ = wire_bytes_;
    wire_bytes_ = 0;
    return;
  }
  for (size_t i = 0; i < units.size(); ++i) {
    const ParamUnit& u = units[i];
    float* p = serves_units() ? param_shard_.data<float>() + shard_offset(u)
                              : model_.params().data<float>() + adam_[i]->begin();
    const float* g = opt_.zero_stage < 2 ? model_.grads().data<float>() + adam_[i]->begin()
                                         : grad_shard_.data<float>() + shard_offset(u);
    adam_[i]->step(p, g, lr, grad_scale_);
  }
  grad_scale_ = 1.0;
  last_wire_bytes_ = wire_bytes_;
  wire_bytes_ = 0;
  if (opt_.zero_stage != 1 && opt_.zero_stage != 2) return;
  // Our chunk to every other rank: into the 16-bit replica, or into the flat buffer (16-bit
  // gathers widen the other ranks' chunks there and keep this rank's fp32 master).
  for (const auto& u : units) last_wire_bytes_ += u.size() > 0 ? gather_wire_bytes(u) : 0;
  if (replica_) return refresh_replica();
  std::vector<comm::Work> works(units.size());
  std::vector<Tensor> wires(units.size());
  for (size_t i = 0; i < units.size(); ++i) {
    const ParamUnit& u = units[i];
    if (u.size() == 0) continue;  // a pipeline stage's missing embedding or head unit
    works[i] = start_unit_gather(u, chunk_view(model_.params(), u, false), model_.params().slice(u.begin, {u.size()}),
                                 wires[i]);
  }
  {
    trace::Span wait("wait weight all_gather", "wait");
    Stopwatch sw;
    for (auto& w : works) w.wait();
    wait_s_ += sw.seconds();
  }
  for (size_t i = 0; i < units.size(); ++i)
    finish_unit_gather(units[i], wires[i], model_.params().slice(units[i].begin, {units[i].size()}), true);
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

int64_t DataParallel::optimizer_steps() const { return adam_.front()->step_count(); }

void DataParallel::gather_full_params(const Tensor& flat) const {
  if (params_are_masters()) {
    if (flat.raw() != model_.params().raw()) flat.copy_from(model_.params());
    return;
  }
  // The owners' fp32 chunks: the shards (stage 3, the replica) or the model's buffer.
  const bool shard = serves_units();
  for (const auto& u : layout_.units())
    if (u.size() > 0)
      group_of(u).all_gather(chunk_view(shard ? param_shard_ : model_.params(), u, shard),
                             flat.slice(u.begin, {u.size()}));
}

void DataParallel::load_full_params(const Tensor& flat) {
  if (!serves_units()) {
    if (flat.raw() != model_.params().raw()) model_.params().copy_from(flat);
    return;
  }
  for (const auto& u : layout_.units())
    chunk_view(param_shard_, u, true).copy_from(flat.slice(u.begin + r_of(u) * chunk_size(u), {chunk_size(u)}));
  if (replica_) load_replica(flat);
}

void DataParallel::gather_full_moments(const Tensor& exp_avg, const Tensor& exp_avg_sq) const {
  exp_avg.zero();
  exp_avg_sq.zero();
  const auto& units = layout_.units();
  for (size_t i = 0; i < units.size(); ++i) {
    const auto& u = units[i];
    const optim::AdamW& a = *adam_[i];
    if (opt_.zero_stage == 0) {
      exp_avg.slice(u.begin, {u.size()}).copy_from(a.exp_avg());
      exp_avg_sq.slice(u.begin, {u.size()}).copy_from(a.exp_avg_sq());
    } else {
      group_of(u).all_gather(a.exp_avg(), exp_avg.slice(u.begin, {u.size()}));
      group_of(u).all_gather(a.exp_avg_sq(), exp_avg_sq.slice(u.begin, {u.size()}));
    }
  }
}

void DataParallel::load_full_moments(const Tensor& exp_avg, const Tensor& exp_avg_sq, int64_t optimizer_steps) {
  for (const auto& a : adam_) {
    a->exp_avg().copy_from(exp_avg.slice(a->begin(), {a->end() - a->begin()}));
    a->exp_avg_sq().copy_from(exp_avg_sq.slice(a->begin(), {a->end() - a->begin()}));
    a->set_step_count(optimizer_steps);
  }
}

}  // namespace loom::parallel

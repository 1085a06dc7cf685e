// BucketedAllReduce (ZeRO stages 0 and 1): whole gradients on every rank, grouped into buckets
// of about bucket_mb that are all-reduced asynchronously as soon as backward has produced their
// last gradient. Not the embedding's lookup rows (data_parallel_embedding_rows.cpp).
#include <algorithm>

#include "loom/core/timer.h"
#include "loom/core/trace.h"
#include "loom/kernels/ops.h"
#include "loom/parallel/data_parallel.h"

namespace loom::parallel {

using model::ParamUnit;

BucketedAllReduce::BucketedAllReduce(DataParallel& dp) : d_(dp) {
  // Blocks grouped from the last one backwards until each holds about bucket_mb (units of one
  // group only: expert units reduce over their own); embed and head are buckets of their own
  // (their gradients finish last).
  const auto& units = d_.layout_.units();
  bucket_of_unit_.assign(units.size(), -1);
  const int64_t cap = std::max<int64_t>(1, int64_t(d_.opt_.bucket_mb * 1024 * 1024 / 4));
  const size_t L = units.size() - 2;
  size_t hi = L;  // unit index of the last block
  while (hi >= 1) {
    size_t lo = hi;
    int64_t elems = units[hi].size();
    while (lo > 1 && elems < cap && units[lo - 1].experts == units[hi].experts) elems += units[--lo].size();
    buckets_.push_back({lo, hi, int(hi - lo + 1)});
    for (size_t u = lo; u <= hi; ++u) bucket_of_unit_[u] = int(buckets_.size() - 1);
    if (lo == 1) break;
    hi = lo - 1;
  }
  buckets_.push_back({0, 0, 1});
  bucket_of_unit_[0] = int(buckets_.size() - 1);
  buckets_.push_back({units.size() - 1, units.size() - 1, 1});
  bucket_of_unit_[units.size() - 1] = int(buckets_.size() - 1);
  // The embedding-row path (data_parallel_embedding_rows.cpp) needs the whole model here: a ZB-V
  // pipeline's first stage holds both ends too, but runs other micro-batches' embedding backward
  // after the last one's head.
  const auto& sl = d_.layout_.slice();
  early_outer_ = d_.n_ > 1 && sl.has_embedding && sl.has_head && sl.later_chunks.empty() && sl.tp == 1 &&
                 units.front().size() > 0 && units.back().size() > 0;
}

void BucketedAllReduce::zero() { d_.model_.zero_grads(); }

model::BlockWeights BucketedAllReduce::block_grads(int layer) {
  return model::block_weights(d_.cfg_, d_.layout_, d_.model_.grads(), layer);
}

void BucketedAllReduce::block_grads_done(int layer, bool sync) {
  if (!sync) return;
  if (const ParamUnit* e = d_.expert_unit_of(layer)) unit_ready(d_.index_of(*e));
  unit_ready(d_.layout_.block_unit_index(layer));
}

Tensor BucketedAllReduce::outer_grad(const std::string& name) {
  const auto& p = d_.layout_.get(name);
  return d_.model_.grads().slice(p.offset, p.shape);
}

void BucketedAllReduce::outer_grads_done(bool sync) {
  const auto& units = d_.layout_.units();
  if (sync && !outer_fired_) {  // not sent early by head_grads_done
    unit_ready(units.size() - 1);
    unit_ready(0);
  }
  outer_fired_ = false;
}

void BucketedAllReduce::finish() {
  if (!inflight_.empty() || !sparse_.empty()) {
    trace::Span span("wait grad all_reduce", "wait");
    Stopwatch sw;
    wait_buckets();
    wait_embedding_rows();
    d_.wait_s_ += sw.seconds();
  }
  land_buckets();
  add_embedding_rows();
}

const float* BucketedAllReduce::unit_grads(const ParamUnit&, int64_t begin) const {
  return d_.model_.grads().data<float>() + begin;
}

double BucketedAllReduce::norm_sq() {
  // Every rank of the dp group holds the same reduced dense gradients; expert units differ
  // between the dp group's expert-parallel ranks and repeat over each expert-dp group.
  const float* g = d_.model_.grads().data<float>();
  if (d_.en_ == d_.n_) return d_.counted_sum_squares(g, 0, d_.model_.grads().numel());
  double local = 0;
  for (const auto& u : d_.layout_.units())
    local += d_.counted_sum_squares(g + u.begin, u.begin, u.size()) / double(d_.n_of(u));
  return d_.sum_over_dp(local);
}

std::vector<Tensor> BucketedAllReduce::held(int64_t begin, int64_t end) const {
  return {d_.model_.grads().slice(begin, {end - begin})};
}

void BucketedAllReduce::unit_ready(size_t ui) {
  Bucket& b = buckets_[size_t(bucket_of_unit_[ui])];
  if (--b.remaining > 0) return;
  const auto& units = d_.layout_.units();
  const int64_t begin = units[b.first_unit].begin, end = units[b.last_unit].end;
  // A pipeline stage without the embeddings or the head has empty units: nothing to send.
  if (end > begin) {
    const ParamUnit& first = units[b.first_unit];
    const comm::Group& g = d_.group_of(first);
    const int n = d_.n_of(first);
    const Tensor grads = d_.model_.grads().slice(begin, {end - begin});
    d_.wire_bytes_ += 2 * (n - 1) * ((end - begin) * int64_t(dtype_size(d_.opt_.grad_dtype)) / n);
    if (d_.opt_.grad_dtype == DType::bf16) {
      Tensor wire = d_.take_buffer(end - begin, DType::bf16);
      ops::narrow_to_16(grads, wire);
      inflight_.push_back({g.all_reduce_async(wire), wire, grads});
    } else {
      inflight_.push_back({g.all_reduce_async(grads), {}, {}});
    }
  }
  b.remaining = int(b.last_unit - b.first_unit + 1);
}

void BucketedAllReduce::wait_buckets() {
  for (auto& f : inflight_) f.work.wait();
}

void BucketedAllReduce::land_buckets() {
  for (auto& f : inflight_)
    if (f.wire.defined()) {
      ops::widen_from_16(f.wire, f.grads);
      f.work = comm::Work();  // releases the collective's hold on the buffer
      d_.recycle(std::move(f.wire));
    }
  inflight_.clear();
}

}  // namespace loom::parallel

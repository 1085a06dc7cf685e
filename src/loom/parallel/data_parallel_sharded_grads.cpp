// ShardedReduceScatter (ZeRO stages 2 and 3): each unit's gradients are staged in a
// communication buffer during backward and reduce-scattered into this rank's gradient chunk as
// soon as the unit is done; the staging buffers are pooled and at most two reductions are in
// flight.
#include <algorithm>

#include "loom/core/timer.h"
#include "loom/core/trace.h"
#include "loom/kernels/ops.h"
#include "loom/parallel/data_parallel.h"

namespace loom::parallel {

using model::ParamUnit;

ShardedReduceScatter::ShardedReduceScatter(DataParallel& dp, int64_t shard_elems)
    : d_(dp), grad_shard_(Tensor::zeros({shard_elems}, DType::f32, MemCategory::grads)) {}

model::BlockWeights ShardedReduceScatter::block_grads(int layer) {
  const ParamUnit& u = d_.unit_of(layer);
  Tensor staging = take_staging(u.size());
  staging_of_layer_[layer] = staging;
  const ParamUnit* e = d_.expert_unit_of(layer);
  Tensor estaging;
  if (e) {
    estaging = take_staging(e->size());
    staging_of_layer_[DataParallel::expert_unit_key(layer)] = estaging;
  }
  return model::block_weights(d_.cfg_, d_.layout_, staging, layer, u.begin, estaging, e ? e->begin : 0);
}

// Every micro-batch: ZeRO-2/3 keep no whole gradients to accumulate into.
void ShardedReduceScatter::block_grads_done(int layer, bool) {
  if (const ParamUnit* e = d_.expert_unit_of(layer)) {
    auto it = staging_of_layer_.find(DataParallel::expert_unit_key(layer));
    reduce_scatter_unit(*e, it->second, true);
    staging_of_layer_.erase(it);
  }
  auto it = staging_of_layer_.find(layer);
  reduce_scatter_unit(d_.unit_of(layer), it->second, true);
  staging_of_layer_.erase(it);
}

Tensor ShardedReduceScatter::outer_grad(const std::string& name) {
  const auto& p = d_.layout_.get(name);
  const ParamUnit& u = d_.outer_unit(name);
  const Tensor& staging = d_.outer_unit_key(u) == DataParallel::kEmbeddingUnit ? embed_staging_ : head_staging_;
  LOOM_CHECK(staging.defined(), "zero", "gradients of ", u.name, " used outside a training pass");
  return staging.slice(p.offset - u.begin, p.shape);
}

void ShardedReduceScatter::outer_grads_done(bool) {
  const auto& units = d_.layout_.units();
  if (units.back().size() > 0) reduce_scatter_unit(units.back(), head_staging_, false);
  if (units.front().size() > 0) reduce_scatter_unit(units.front(), embed_staging_, false);
  head_staging_ = embed_staging_ = {};
}

void ShardedReduceScatter::pass_begin(bool train) {
  if (!train) return;
  const auto& units = d_.layout_.units();
  embed_staging_ = Tensor::zeros({units.front().size()}, DType::f32, MemCategory::comm);
  head_staging_ = Tensor::zeros({units.back().size()}, DType::f32, MemCategory::comm);
}

Tensor ShardedReduceScatter::take_staging(int64_t elems) {
  for (size_t i = 0; i < staging_pool_.size(); ++i)
    if (staging_pool_[i].numel() >= elems) {
      Tensor t = staging_pool_[i];
      staging_pool_.erase(staging_pool_.begin() + long(i));
      t = t.slice(0, {elems});
      t.zero();
      return t;
    }
  if (pending_.size() >= 2) {  // bound staging memory: recycle the oldest in flight
    drain(pending_.size() - 1);
    return take_staging(elems);
  }
  return Tensor::zeros({elems}, DType::f32, MemCategory::comm);
}

void ShardedReduceScatter::reduce_scatter_unit(const ParamUnit& u, const Tensor& staging, bool pooled) {
  const DType wire_dtype = d_.opt_.grad_dtype;
  Pending p;
  p.staging = staging;
  p.pooled = pooled;
  p.shard_offset = d_.shard_offset(u);
  p.chunk_tmp = d_.take_buffer(d_.chunk_size(u), wire_dtype);
  d_.wire_bytes_ += (d_.n_of(u) - 1) * d_.chunk_size(u) * int64_t(dtype_size(wire_dtype));  // the others' chunks
  if (wire_dtype == DType::bf16) {
    p.wire = d_.take_buffer(staging.numel(), DType::bf16);
    ops::narrow_to_16(staging, p.wire);
    p.work = d_.group_of(u).reduce_scatter_async(p.wire, p.chunk_tmp);
  } else {
    p.work = d_.group_of(u).reduce_scatter_async(staging, p.chunk_tmp);
  }
  pending_.push_back(std::move(p));
}

void ShardedReduceScatter::retire(Pending& p) {
  {
    trace::Span span("wait grad reduce_scatter", "wait");
    Stopwatch sw;
    p.work.wait();
    p.work = comm::Work();  // releases the collective's hold on its buffers
    d_.wait_s_ += sw.seconds();
  }
  float* dst = grad_shard_.data<float>() + p.shard_offset;
  if (p.wire.defined()) {  // the bf16 sums, added widened
    const bf16_t* src = p.chunk_tmp.data<bf16_t>();
    const int64_t n = p.chunk_tmp.numel();
#pragma omp parallel for schedule(static) if (n > (1 << 18))
    for (int64_t i = 0; i < n; ++i) dst[i] += bf16_to_f32(src[i]);
    d_.recycle(std::move(p.wire));
  } else {
    const float* src = p.chunk_tmp.data<float>();
    const int64_t n = p.chunk_tmp.numel();
    for (int64_t i = 0; i < n; ++i) dst[i] += src[i];
  }
  d_.recycle(std::move(p.chunk_tmp));
  if (p.pooled) staging_pool_.push_back(p.staging);
}

void ShardedReduceScatter::drain(size_t keep) {
  while (pending_.size() > keep) {
    retire(pending_.front());
    pending_.pop_front();
  }
}

const float* ShardedReduceScatter::unit_grads(const ParamUnit& u, int64_t) const {
  return grad_shard_.data<float>() + d_.shard_offset(u);
}

double ShardedReduceScatter::norm_sq() {
  double local = 0;
  for (const auto& u : d_.layout_.units())
    local += d_.counted_sum_squares(grad_shard_.data<float>() + d_.shard_offset(u),
                                    u.begin + d_.r_of(u) * d_.chunk_size(u), d_.chunk_size(u));
  return d_.sum_over_dp(local);
}

std::vector<Tensor> ShardedReduceScatter::held(int64_t begin, int64_t end) const {
  std::vector<Tensor> out;
  for (const auto& u : d_.layout_.units()) {
    const int64_t c0 = u.begin + d_.r_of(u) * d_.chunk_size(u), c1 = c0 + d_.chunk_size(u);
    const int64_t b = std::max(begin, c0), e = std::min(end, c1);
    if (b < e) out.push_back(grad_shard_.slice(d_.shard_offset(u) + (b - c0), {e - b}));
  }
  return out;
}

}  // namespace loom::parallel

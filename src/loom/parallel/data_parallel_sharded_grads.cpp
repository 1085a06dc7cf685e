// DataParallel at ZeRO stages 2 and 3: each unit's gradients are staged in a communication
// buffer during backward and reduce-scattered into this rank's gradient chunk as soon as the
// unit is done; the staging buffers are pooled and at most two reductions are in flight.
#include <algorithm>

#include "loom/core/timer.h"
#include "loom/core/trace.h"
#include "loom/kernels/ops.h"
#include "loom/parallel/data_parallel.h"

namespace loom::parallel {

using model::ParamUnit;

model::BlockWeights DataParallel::staged_block_grads(int layer) {
  const ParamUnit& u = unit_of(layer);
  Tensor staging = take_staging(u.size());
  staging_of_layer_[layer] = staging;
  const ParamUnit* e = expert_unit_of(layer);
  Tensor estaging;
  if (e) {
    estaging = take_staging(e->size());
    staging_of_layer_[expert_unit_key(layer)] = estaging;
  }
  return model::block_weights(cfg_, layout_, staging, layer, u.begin, estaging, e ? e->begin : 0);
}

void DataParallel::reduce_scatter_block(int layer) {
  if (const ParamUnit* e = expert_unit_of(layer)) {
    auto it = staging_of_layer_.find(expert_unit_key(layer));
    reduce_scatter_unit(*e, it->second, true);
    staging_of_layer_.erase(it);
  }
  auto it = staging_of_layer_.find(layer);
  reduce_scatter_unit(unit_of(layer), it->second, true);
  staging_of_layer_.erase(it);
}

void DataParallel::reduce_scatter_outer() {
  const auto& units = layout_.units();
  if (units.back().size() > 0) reduce_scatter_unit(units.back(), head_staging_, false);
  if (units.front().size() > 0) reduce_scatter_unit(units.front(), embed_staging_, false);
  head_staging_ = embed_staging_ = {};
}

Tensor DataParallel::take_staging(int64_t elems) {
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

void DataParallel::reduce_scatter_unit(const ParamUnit& u, const Tensor& staging, bool pooled) {
  Pending p;
  p.staging = staging;
  p.pooled = pooled;
  p.shard_offset = shard_offset(u);
  p.chunk_tmp = take_buffer(chunk_size(u), opt_.grad_dtype);
  wire_bytes_ += (n_of(u) - 1) * chunk_size(u) * int64_t(dtype_size(opt_.grad_dtype));  // the others' chunks
  if (opt_.grad_dtype == DType::bf16) {
    p.wire = take_buffer(staging.numel(), DType::bf16);
    ops::narrow_to_16(staging, p.wire);
    p.work = group_of(u).reduce_scatter_async(p.wire, p.chunk_tmp);
  } else {
    p.work = group_of(u).reduce_scatter_async(staging, p.chunk_tmp);
  }
  pending_.push_back(std::move(p));
}

void DataParallel::retire(Pending& p) {
  {
    trace::Span span("wait grad reduce_scatter", "wait");
    Stopwatch sw;
    p.work.wait();
    p.work = comm::Work();  // releases the collective's hold on its buffers
    wait_s_ += sw.seconds();
  }
  float* dst = grad_shard_.data<float>() + p.shard_offset;
  if (p.wire.defined()) {  // the bf16 sums, added widened
    const bf16_t* src = p.chunk_tmp.data<bf16_t>();
    const int64_t n = p.chunk_tmp.numel();
#pragma omp parallel for schedule(static) if (n > (1 << 18))
    for (int64_t i = 0; i < n; ++i) dst[i] += bf16_to_f32(src[i]);
    recycle(std::move(p.wire));
  } else {
    const float* src = p.chunk_tmp.data<float>();
    const int64_t n = p.chunk_tmp.numel();
    for (int64_t i = 0; i < n; ++i) dst[i] += src[i];
  }
  recycle(std::move(p.chunk_tmp));
  if (p.pooled) staging_pool_.push_back(p.staging);
}

void DataParallel::drain(size_t keep) {
  while (pending_.size() > keep) {
    retire(pending_.front());
    pending_.pop_front();
  }
}

std::vector<Tensor> DataParallel::held_grads(int64_t begin, int64_t end) const {
  if (opt_.zero_stage < 2) return {model_.grads().slice(begin, {end - begin})};
  std::vector<Tensor> out;
  for (const auto& u : layout_.units()) {
    const int64_t c0 = u.begin + r_of(u) * chunk_size(u), c1 = c0 + chunk_size(u);
    const int64_t b = std::max(begin, c0), e = std::min(end, c1);
    if (b < e) out.push_back(grad_shard_.slice(shard_offset(u) + (b - c0), {e - b}));
  }
  return out;
}

}  // namespace loom::parallel

// DataParallel at ZeRO stages 0 and 1: whole gradients on every rank, grouped into buckets of
// about bucket_mb that are all-reduced asynchronously as soon as backward has produced their
// last gradient. Not the embedding's lookup rows (data_parallel_embedding_rows.cpp).
#include <algorithm>

#include "loom/kernels/ops.h"
#include "loom/parallel/data_parallel.h"

namespace loom::parallel {

using model::ParamUnit;

void DataParallel::build_buckets() {
  // Blocks grouped from the last one backwards until each holds about bucket_mb (units of one
  // group only: expert units reduce over their own); embed and head are buckets of their own
  // (their gradients finish last).
  const auto& units = layout_.units();
  bucket_of_unit_.assign(units.size(), -1);
  if (opt_.zero_stage >= 2) return;
  const int64_t cap = std::max<int64_t>(1, int64_t(opt_.bucket_mb * 1024 * 1024 / 4));
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
}

void DataParallel::unit_ready(size_t ui) {
  Bucket& b = buckets_[size_t(bucket_of_unit_[ui])];
  if (--b.remaining > 0) return;
  const auto& units = layout_.units();
  const int64_t begin = units[b.first_unit].begin, end = units[b.last_unit].end;
  // A pipeline stage without the embeddings or the head has empty units: nothing to send.
  if (end > begin) {
    const ParamUnit& first = units[b.first_unit];
    const comm::Group& g = group_of(first);
    const int n = n_of(first);
    const Tensor grads = model_.grads().slice(begin, {end - begin});
    wire_bytes_ += 2 * (n - 1) * ((end - begin) * int64_t(dtype_size(opt_.grad_dtype)) / n);
    if (opt_.grad_dtype == DType::bf16) {
      Tensor wire = take_buffer(end - begin, DType::bf16);
      ops::narrow_to_16(grads, wire);
      inflight_.push_back({g.all_reduce_async(wire), wire, grads});
    } else {
      inflight_.push_back({g.all_reduce_async(grads), {}, {}});
    }
  }
  b.remaining = int(b.last_unit - b.first_unit + 1);
}

void DataParallel::wait_buckets() {
  for (auto& f : inflight_) f.work.wait();
}

void DataParallel::land_buckets() {
  for (auto& f : inflight_)
    if (f.wire.defined()) {
      ops::widen_from_16(f.wire, f.grads);
      f.work = comm::Work();  // releases the collective's hold on the buffer
      recycle(std::move(f.wire));
    }
  inflight_.clear();
}

}  // namespace loom::parallel

#include "loom/parallel/model_gather.h"

#include <algorithm>

namespace loom::parallel {

Tensor gather_whole_params(const Mesh& mesh, const model::ParamLayout& local, const Tensor& local_flat) {
  LOOM_CHECK(local_flat.dtype() == DType::f32 && local_flat.numel() == local.total(), "parallel",
             "gather_whole_params needs the rank's f32 flat weights (", local.total(), " elements), got ",
             local_flat.describe());
  const model::ParamLayout whole_layout(local.config(), 1,
                                        model::ModelSlice{.lora_adapters = local.slice().lora_adapters});
  Tensor whole = Tensor::zeros({whole_layout.total()}, DType::f32, MemCategory::workspace);
  // Each element is written by exactly one rank (data-parallel replica 0, tp rank 0 for
  // replicated parameters, the first stage for a tied table, ep rank 0 for everything but the
  // experts each ep rank holds), so the sum is exact.
  copy_local_to_whole(mesh.coord(), local, local_flat, whole_layout, whole);
  mesh.world().all_reduce(whole);
  return whole;
}

void copy_local_to_whole(const MeshCoord& c, const model::ParamLayout& local, const Tensor& local_flat,
                         const model::ParamLayout& whole_layout, const Tensor& whole) {
  copy_local_range_to_whole(c, local, local_flat.data<float>(), 0, local.total(), whole_layout, whole);
}

void copy_local_range_to_whole(const MeshCoord& c, const model::ParamLayout& local, const float* src, int64_t lo,
                               int64_t hi, const model::ParamLayout& whole_layout, const Tensor& whole) {
  if (c.dp != 0) return;
  float* dst = whole.data<float>();
  for (const auto& p : local.params()) {
    if (p.offset < lo || p.offset >= hi) continue;
    if (p.tied_copy || (p.tp_replicated && local.slice().tp_rank != 0)) continue;
    if (p.expert < 0 && c.ep != 0) continue;
    const int64_t base = whole_layout.get(p.name).offset;
    const float* from = src + (p.offset - lo);
    for (const auto& run : local.element_runs(p))
      std::copy(from + run.local, from + run.local + run.n, dst + base + run.global);
  }
}

}  // namespace loom::parallel

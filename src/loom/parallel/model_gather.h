// The whole model's weights assembled from model-parallel slices (pipeline stages, tensor-
// parallel shards), and a rank's slice taken back out of them: what checkpoints write and
// read, and what the equivalence tests compare. The whole layout is ParamLayout(cfg, 1).
#pragma once
#include "loom/core/tensor.h"
#include "loom/model/checkpoint_reader.h"
#include "loom/model/param_layout.h"
#include "loom/parallel/mesh.h"

namespace loom::parallel {

// Collective over mesh.world(): every rank returns the whole model's weights (f32, laid out
// by ParamLayout(cfg, 1)). local_flat: this rank's full slice (not a ZeRO-3 shard).
Tensor gather_whole_params(const Mesh& mesh, const model::ParamLayout& local, const Tensor& local_flat);
// Copies the elements this rank contributes to the whole model (data-parallel replica 0's,
// tp rank 0's copy of replicated parameters, not a tied copy, ep rank 0's dense parameters)
// from local_flat into `whole` (laid out by ParamLayout(cfg, 1)); the rest is left as it is.
// With one rank holding everything, this alone turns a flat buffer into the whole layout.
void copy_local_to_whole(const MeshCoord& coord, const model::ParamLayout& local, const Tensor& local_flat,
                         const model::ParamLayout& whole_layout, const Tensor& whole);
// The same for the parameters starting in flat range [lo, hi) of `local`, read from `src`, which
// holds that range (src[0] is flat element lo): one unit's optimizer state, say.
void copy_local_range_to_whole(const MeshCoord& coord, const model::ParamLayout& local, const float* src, int64_t lo,
                               int64_t hi, const model::ParamLayout& whole_layout, const Tensor& whole);
// A rank's slice taken back out of the whole model: model/checkpoint_reader.h, which readers of
// checkpoints use without linking parallel.
using model::slice_whole_params;

}  // namespace loom::parallel

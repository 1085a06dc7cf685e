// A parallel layout: the rank grid (dp, tp, pp, ep and how they nest), the ZeRO stage, and how
// a step is cut into micro-batches and scheduled through the pipeline. One description: the
// trainer reads it from parallel.* (its fields are named after those keys), the planner
// searches over it, and the mesh and the data-parallel rank counts are derived from it here.
#pragma once
#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "loom/optim/offload_target.h"
#include "loom/parallel/mesh_shape.h"
#include "loom/parallel/pipeline_schedule.h"

namespace loom::parallel {

// How many ranks share a model's units: dense parameters are sharded over `dp_size` ranks (all
// those that see different data: dp x ep), the experts of MoE blocks over `expert_dp_size` (the
// dp ranks holding the same experts).
struct DataParallelRanks {
  int dp_size = 1, expert_dp_size = 1;
};

struct Layout {
  int64_t dp = 1, tp = 1, pp = 1, ep = 1;
  int zero_stage = 0;
  // Micro-batches per rank and step (the pipeline schedule's m; gradient accumulation steps).
  // The trainer's reader holds 0 until it resolves an unset parallel.micro_batches from the
  // batch (train_config.cpp).
  int64_t micro_batches = 1;
  PipeSchedule pp_schedule = PipeSchedule::one_f_one_b;
  // Chunks of blocks per pipeline stage: > 1 runs interleaved 1F1B (pipeline_schedule.h).
  int64_t virtual_stages = 1;
  // Mesh dimensions from outermost to innermost: consecutive ranks (one host) share the
  // innermost dimension's groups.
  MeshOrder order = kDefaultMeshOrder;
  // parallel.offload: the Adam moments of the chosen pipeline stages live off the device between
  // steps (host pool or disk), staged piece by piece for the update. Stages: the listed ones, or
  // (empty: auto) those offloads_stage picks.
  optim::OffloadTarget offload = optim::OffloadTarget::none;
  // parallel.offload.params: at ZeRO-3, the same stages' parameter shards too.
  optim::OffloadTarget offload_params = optim::OffloadTarget::none;
  std::vector<int64_t> offload_stages = {};

  int64_t ranks() const { return dp * tp * pp * ep; }
  MeshShape mesh() const { return MeshShape(pp, dp, ep, tp, order); }
  DataParallelRanks data_parallel_ranks() const { return {int(dp * ep), int(dp)}; }
};

// Whether stage s keeps its Adam moments (or parameter shards) off the device: the listed
// stages, or (auto) those whose predicted bytes exceed the mean stage's by more than a tenth, or
// exceed `limit` (0: none). The trainer and the planner decide with it from their own predictions.
inline bool offloads_stage(const Layout& l, const std::vector<double>& predicted, int64_t s, double limit) {
  if (l.offload == optim::OffloadTarget::none && l.offload_params == optim::OffloadTarget::none) return false;
  if (!l.offload_stages.empty())
    return std::find(l.offload_stages.begin(), l.offload_stages.end(), s) != l.offload_stages.end();
  double mean = 0;
  for (double b : predicted) mean += b / double(predicted.size());
  const double mine = predicted[size_t(s)];
  return mine > 1.1 * mean || (limit > 0 && mine > limit);
}

}  // namespace loom::parallel

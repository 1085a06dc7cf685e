// The costs behind pp_partition=profile: each block's forward + backward timed on this
// machine (and the embeddings, and the final norm + head + loss), one piece at a time, so a
// model too large for one process can still be profiled.
#pragma once
#include "loom/model/config.h"
#include "loom/parallel/partition.h"

namespace loom::parallel {

// Median seconds over `reps` runs (after one warm-up) of each piece's forward + backward on
// B x T tokens.
PartitionCosts profile_costs(const model::ModelConfig& cfg, int64_t B, int64_t T, int reps = 3);

}  // namespace loom::parallel

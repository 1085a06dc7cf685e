// A checkpoint directory as a whole (checkpoint.dir): the step_NNNNNN checkpoints it holds,
// the run that wrote each, the order a resume tries them in, pruning to checkpoint.keep_last,
// and claiming the directory for a new run. What one checkpoint holds and how it is written,
// verified and loaded is checkpoint.h.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "loom/io/checkpoint_files.h"

namespace loom::comm {
class Group;
}

namespace loom::train {

// The step_NNNNNN directories and the order a resume tries them in are io's (read side).
using io::CheckpointEntry;
using io::list_checkpoints;
using io::resume_candidates;

// A new run's id, 16 hex digits, the same on every rank of `g` (rank 0 draws it).
std::string new_run_id(const comm::Group& g);

// The run id recorded in a checkpoint's trainer_state.json; "" when it records none (saved
// before run ids existed) or cannot be read.
std::string checkpoint_run_id(const std::string& path);

// After run `run_id` saved step `saved_step`: removes that run's checkpoints below it beyond
// the newest keep_last (the saved one included). Never removes the saved checkpoint, one with
// a higher step, another run's, one whose run cannot be read, or (protect_upto >= 0) the
// newest one at or below step protect_upto: the one a diverging run falls back to. Returns the
// removed paths.
std::vector<std::string> prune_checkpoints(const std::string& dir, const std::string& run_id, int64_t saved_step,
                                           int64_t keep_last, int64_t protect_upto = -1);

// For a run that starts at step 0 and will save into dir: when dir holds checkpoints, throws
// naming the directory, what it holds and the fixes, unless `overwrite`, which removes them
// (and leftovers of interrupted saves) instead; returns the removed paths. Only rank 0 calls
// it; the trainer makes every rank fail when it throws.
std::vector<std::string> claim_checkpoint_dir(const std::string& dir, bool overwrite);

}  // namespace loom::train

// AdamW over the units of a flat parameter buffer, each rank owning one range of every unit: the
// whole unit (unsharded), or its 1/N chunk over the unit's group (ZeRO stages 1-3, the optimizer
// states partitioned: Rajbhandari et al. 2020, P_os). Owns the owned ranges' moments; checkpoints
// read and write whole moments, all-gathered from (or cut back into) the owners' ranges.
#pragma once
#include <cstdint>
#include <memory>
#include <vector>

#include "loom/comm/group.h"
#include "loom/optim/adamw.h"
#include "loom/optim/moment_offload.h"

namespace loom::optim {

class ShardedAdamW {
 public:
  struct Unit {
    int64_t begin = 0, size = 0;  // the unit's flat range; size a multiple of the group's size
    comm::Group group;            // the ranks that share the unit's chunks
  };
  // sharded: this rank owns chunk group.rank() of every unit; otherwise every unit whole.
  // `offload` other than none: the moments live there from the start (offload() below, without
  // ever being resident).
  ShardedAdamW(const AdamWConfig& cfg, std::vector<Unit> units, bool sharded, const std::vector<DecaySpan>& spans,
               OffloadTarget offload = OffloadTarget::none, const std::string& offload_dir = "");

  // The AdamW of unit i, over the range this rank owns.
  AdamW& unit(size_t i) { return *adam_[i]; }
  const std::vector<std::unique_ptr<AdamW>>& per_unit() const { return adam_; }
  int64_t step_count() const { return adam_.front()->step_count(); }

  // Moves every unit's moments to `target` (optim/moment_offload.h; disk: under `dir`), staged in
  // pieces of at most `piece_elems`; they stay zero, so call it before a checkpoint loads them.
  void offload(OffloadTarget target, const std::string& dir, int64_t piece_elems = int64_t(1) << 20);
  MomentOffload* offloaded() const { return offload_.get(); }
  // Starts staging the offloaded moments of the next step (no-op when resident).
  void prefetch() {
    if (offload_) offload_->prefetch();
  }
  // AdamW on unit i's owned range (p and g at its begin), with its moments wherever they are.
  // Offloaded, the units are stepped in order 0, 1, ....
  void step_unit(size_t i, float* p, const float* g, double lr, double grad_scale);
  // Every unit's whole moments into `exp_avg` and `exp_avg_sq` (laid out like the flat buffer) on
  // every rank; collective over the units' groups when sharded.
  void gather_full_moments(const Tensor& exp_avg, const Tensor& exp_avg_sq) const;
  // This rank's ranges from whole moments, and the step count bias correction continues from.
  void load_full_moments(const Tensor& exp_avg, const Tensor& exp_avg_sq, int64_t step_count);

 private:
  std::vector<Unit> units_;
  bool sharded_;
  std::vector<std::unique_ptr<AdamW>> adam_;  // per unit
  std::unique_ptr<MomentOffload> offload_;
};

}  // namespace loom::optim

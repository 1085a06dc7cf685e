// ShardedAdamW: the owned ranges and the whole moments for checkpoints.
#include "loom/optim/sharded_adamw.h"

namespace loom::optim {

ShardedAdamW::ShardedAdamW(const AdamWConfig& cfg, std::vector<Unit> units, bool sharded,
                           const std::vector<DecaySpan>& spans)
    : units_(std::move(units)), sharded_(sharded) {
  for (const Unit& u : units_) {
    const int64_t chunk = u.size / u.group.size();
    const int64_t b = sharded_ ? u.begin + u.group.rank() * chunk : u.begin;
    const int64_t e = sharded_ ? b + chunk : u.begin + u.size;
    adam_.push_back(std::make_unique<AdamW>(cfg, b, e, spans));
  }
}

void ShardedAdamW::gather_full_moments(const Tensor& exp_avg, const Tensor& exp_avg_sq) const {
  exp_avg.zero();
  exp_avg_sq.zero();
  for (size_t i = 0; i < units_.size(); ++i) {
    const Unit& u = units_[i];
    const AdamW& a = *adam_[i];
    if (!sharded_) {
      exp_avg.slice(u.begin, {u.size}).copy_from(a.exp_avg());
      exp_avg_sq.slice(u.begin, {u.size}).copy_from(a.exp_avg_sq());
    } else {
      u.group.all_gather(a.exp_avg(), exp_avg.slice(u.begin, {u.size}));
      u.group.all_gather(a.exp_avg_sq(), exp_avg_sq.slice(u.begin, {u.size}));
    }
  }
}

void ShardedAdamW::load_full_moments(const Tensor& exp_avg, const Tensor& exp_avg_sq, int64_t step_count) {
  for (const auto& a : adam_) {
    a->exp_avg().copy_from(exp_avg.slice(a->begin(), {a->end() - a->begin()}));
    a->exp_avg_sq().copy_from(exp_avg_sq.slice(a->begin(), {a->end() - a->begin()}));
    a->set_step_count(step_count);
  }
}

}  // namespace loom::optim

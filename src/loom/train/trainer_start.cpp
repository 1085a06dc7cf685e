// What a run settles before its first step: the pipeline's stage boundaries, whether the
// activations fit in memory beside the model states, and (for a new run) its id and its claim on
// checkpoint.dir.
#include <unistd.h>

#include <algorithm>

#include "loom/model/memory_estimate.h"
#include "loom/parallel/partition_profile.h"
#include "loom/train/checkpoint_dir.h"
#include "loom/train/trainer.h"

namespace loom::train {

std::vector<parallel::StageRange> Trainer::partition_stages() {
  const int L = int(cfg_.model.n_layer), pp = int(cfg_.parallel.pp);
  switch (cfg_.parallel.pp_partition) {
    case parallel::PartitionMethod::uniform: return parallel::partition_uniform(L, pp);
    case parallel::PartitionMethod::parameters:
      return parallel::partition_balanced(parallel::parameter_costs(cfg_.model), pp);
    case parallel::PartitionMethod::profile: break;
  }
  if (pp == 1) return parallel::partition_uniform(L, 1);
  // Timed on rank 0 only (the others would compete for its cores), then shared.
  Tensor costs = Tensor::zeros({L + 2}, DType::f64, MemCategory::workspace);
  if (main_rank()) {
    const auto c = parallel::profile_costs(cfg_.model, cfg_.data.micro_batch_size, cfg_.data.seq_len);
    for (int l = 0; l < L; ++l) costs.data<double>()[l] = c.block[size_t(l)];
    costs.data<double>()[L] = c.embedding;
    costs.data<double>()[L + 1] = c.head;
  }
  mesh_->world().broadcast(costs, 0);
  parallel::PartitionCosts c;
  c.block.assign(costs.data<double>(), costs.data<double>() + L);
  c.embedding = costs.data<double>()[L];
  c.head = costs.data<double>()[L + 1];
  return parallel::partition_balanced(c, pp);
}

void Trainer::check_fits_in_memory() const {
  const auto& p = cfg_.parallel;
  // Model states, and under LoRA the frozen model beside the adapters' states.
  const double states = double(dp_plan_.model_states.total()) + double(model_->frozen_bytes());
  // The whole model's activations for one micro-batch, split over the model-parallel ranks.
  const double activations =
      model::estimate_training_bytes(cfg_.model, 0, double(cfg_.data.micro_batch_size), cfg_.data.seq_len,
                                     cfg_.decoder.activation_checkpoint_interval, cfg_.decoder.xent_chunk) /
      double(p.pp * p.tp);
  const double machine = double(sysconf(_SC_PHYS_PAGES)) * double(sysconf(_SC_PAGESIZE));
  const auto bytes = [](double b) { return format_bytes(int64_t(std::min(b, 9e18))); };
  LOOM_CHECK(states + activations <= machine, "train", "micro-batches of ", cfg_.data.micro_batch_size,
             " sequences (data.micro_batch_size, or the per-rank batch when unset) of data.seq_len=", cfg_.data.seq_len,
             " tokens need about ", bytes(activations), " of activations per rank besides ", bytes(states),
             " of model states, more than this machine's ", bytes(machine),
             " of memory; lower data.micro_batch_size (gradient accumulation keeps data.batch_size), "
             "data.seq_len, or set model.activation_checkpoint_interval");
}

void Trainer::start_new_run() {
  run_id_ = new_run_id(mesh_->world());
  if (cfg_.checkpoint.dir.empty()) return;
  std::string why;
  std::vector<std::string> removed;
  if (main_rank()) {
    try {
      removed = claim_checkpoint_dir(cfg_.checkpoint.dir, opt_.overwrite_checkpoints);
    } catch (const Error& e) {
      why = e.what();
    }
  }
  Tensor refused = Tensor::from_vector<int32_t>({why.empty() ? 0 : 1}, {1});
  if (mesh_->world().size() > 1) mesh_->world().broadcast(refused, 0);
  if (refused.data<int32_t>()[0] != 0) {
    if (main_rank()) throw Error(why);
    fail("checkpoint", "rank 0 refused checkpoint.dir=", cfg_.checkpoint.dir, " (its reason is in its log)");
  }
  if (main_rank() && !removed.empty())
    std::fprintf(opt_.log, "[checkpoint] --overwrite-checkpoints: removed %zu entries of %s\n", removed.size(),
                 cfg_.checkpoint.dir.c_str());
  if (main_rank())
    std::fprintf(opt_.log, "[train] run %s, checkpoints in %s\n", run_id_.c_str(), cfg_.checkpoint.dir.c_str());
}

}  // namespace loom::train

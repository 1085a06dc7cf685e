// What a run settles before its first step: the pipeline's stage boundaries, whether the
// activations fit in memory beside the model states, and (for a new run) its id and its claim on
// checkpoint.dir.
#include <algorithm>
#include <filesystem>

#include "loom/model/memory_estimate.h"
#include "loom/parallel/partition_profile.h"
#include "loom/train/checkpoint_dir.h"
#include "loom/train/trainer.h"

namespace loom::train {

// With v virtual stages, pp x v chunks: stage s holds chunks s, s + pp, ... (Megatron's layout).
std::vector<parallel::StageRange> Trainer::partition_stages() {
  const int L = int(cfg_.model.n_layer), pp = int(cfg_.parallel.pp * cfg_.parallel.virtual_stages);
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

double Trainer::predicted_activation_bytes(int64_t micro_batch_size) const {
  const int64_t b = micro_batch_size > 0 ? micro_batch_size : cfg_.data.micro_batch_size;
  return model::estimate_training_bytes(cfg_.model, 0, double(b), cfg_.data.seq_len,
                                        cfg_.decoder.activation_checkpoint_interval, cfg_.decoder.xent_chunk) /
         double(cfg_.parallel.pp * cfg_.parallel.tp);
}

double Trainer::resident_state_bytes() const {
  const optim::MomentOffload* off = data_parallel_->optimizer_offload();
  return double(dp_plan_.model_states.total()) + double(model_->frozen_bytes()) -
         (off ? double(off->offloaded_bytes() - off->staged_bytes()) : 0.0) -
         double(data_parallel_->offloaded_param_bytes());
}

namespace {
std::string bytes_text(double b) { return format_bytes(int64_t(std::min(b, 9e18))); }
double mean(const std::vector<double>& v) {
  double m = 0;
  for (double x : v) m += x / double(v.size());
  return m;
}
}  // namespace

void Trainer::place_optimizer_state() {
  const auto& p = cfg_.parallel;
  const int64_t pp = p.pp, stage = mesh_->coord().pp;
  // Every stage's model states, Adam moments and what offloading takes from it (its moments, and
  // under parallel.offload.params ZeRO-3's parameter shards): this rank's share, its pipeline
  // peers' at the same dp, ep and tp coordinates, so that every rank takes the same decisions.
  const bool moments_go = p.offload != optim::OffloadTarget::none,
             params_go = p.offload_params != optim::OffloadTarget::none;
  Tensor t = Tensor::zeros({3 * pp}, DType::f64, MemCategory::workspace);
  t.data<double>()[3 * stage] = double(dp_plan_.model_states.total()) + double(model_->frozen_bytes());
  t.data<double>()[3 * stage + 1] = double(dp_plan_.model_states.optimizer);
  t.data<double>()[3 * stage + 2] = (moments_go ? double(dp_plan_.model_states.optimizer) : 0.0) +
                                    (params_go ? double(dp_plan_.model_states.params) : 0.0);
  if (pp > 1) mesh_->pp().all_reduce(t);
  const double activations = predicted_activation_bytes();
  std::vector<double> resident(static_cast<size_t>(pp)), moments(static_cast<size_t>(pp)),
      offloadable(static_cast<size_t>(pp));
  for (int64_t s = 0; s < pp; ++s) {
    resident[size_t(s)] = t.data<double>()[3 * s] + activations;
    moments[size_t(s)] = t.data<double>()[3 * s + 1];
    offloadable[size_t(s)] = t.data<double>()[3 * s + 2];
  }
  const char* what = !params_go   ? "Adam moments"
                     : moments_go ? "Adam moments and parameter shards"
                                  : "parameter shards";
  const std::string where =
      moments_go && params_go && p.offload != p.offload_params
          ? str_cat(optim::offload_target_name(p.offload), " and ", optim::offload_target_name(p.offload_params))
          : optim::offload_target_name(moments_go ? p.offload : p.offload_params);
  const double limit = p.memory_limit_mb * 1048576.0;
  const auto& listed = p.offload_stages;
  auto chosen = [&](int64_t s) { return parallel::offloads_stage(p, resident, s, limit); };
  // The stages over the limit once their moments are where the configuration puts them.
  if (limit > 0)
    for (int64_t s = 0; s < pp; ++s) {
      const double need = resident[size_t(s)] - (chosen(s) ? offloadable[size_t(s)] : 0);
      LOOM_CHECK(need <= limit, "train", pp > 1 ? str_cat("pipeline stage ", s) : std::string("each rank"),
                 " needs about ", bytes_text(need), " resident (model states ",
                 bytes_text(resident[size_t(s)] - activations), ", of which ", chosen(s) ? what : "Adam moments", " ",
                 bytes_text(chosen(s) ? offloadable[size_t(s)] : moments[size_t(s)]), chosen(s) ? " offloaded" : "",
                 "; activations ", bytes_text(activations), "), more than parallel.memory_limit_mb=", p.memory_limit_mb,
                 chosen(s) ? "; raise parallel.zero_stage, lower data.micro_batch_size or set "
                             "model.activation_checkpoint_interval"
                           : "; offload its optimizer state (parallel.offload.optimizer=disk or host) and at "
                             "ZeRO-3 its parameter shards (parallel.offload.params), raise parallel.zero_stage, or "
                             "lower data.micro_batch_size");
    }
  if (main_rank())
    for (int64_t s = 0; s < pp; ++s)
      if (chosen(s))
        std::fprintf(opt_.log, "[train] %s: %s (%s) offloaded to %s (parallel.offload.stages=%s%s)\n",
                     pp > 1 ? str_cat("pipeline stage ", s).c_str() : "every rank", what,
                     bytes_text(offloadable[size_t(s)]).c_str(), where.c_str(), listed.empty() ? "auto" : "listed",
                     listed.empty()
                         ? str_cat(": ", bytes_text(resident[size_t(s)]), " predicted against the stages' mean ",
                                   bytes_text(mean(resident)), limit > 0 ? " and the limit" : "")
                               .c_str()
                         : "");
  if (!chosen(stage)) return;
  std::string dir = p.offload_dir;
  if (dir.empty())
    dir = cfg_.checkpoint.dir.empty() ? (std::filesystem::temp_directory_path() / "loom-offload").string()
                                      : cfg_.checkpoint.dir + "/offload";
  dp_plan_.options.offload_moments = p.offload;
  dp_plan_.options.offload_params = p.offload_params;
  dp_plan_.options.offload_dir = dir;
}

void Trainer::check_fits_in_memory() const {
  const double states = resident_state_bytes();
  const double activations = predicted_activation_bytes();
  const double machine = double(physical_memory_bytes());
  const auto bytes = bytes_text;
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

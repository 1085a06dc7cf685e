// parallel.micro_batches=auto in the trainer: which counts the tuner may choose, what it is fed
// after each step, and how a change applies (train/micro_batch_tuner.h decides).
#include <algorithm>

#include "loom/train/trainer.h"

namespace loom::train {

void Trainer::start_micro_batch_tuner() {
  const auto& p = cfg_.parallel;
  const int64_t per_rank = cfg_.data.batch_size / mesh_->data_size();
  const int64_t start = p.micro_batches;
  // A count's activations: one micro-batch of per_rank / m sequences (this rank's share of the
  // model), times the most the schedule keeps in flight on a stage (interleaved: per chunk).
  const double states = resident_state_bytes();
  const double limit = p.memory_limit_mb > 0 ? p.memory_limit_mb * 1048576.0 : double(physical_memory_bytes());
  std::vector<int64_t> candidates;
  std::string refused_schedule, refused_memory;
  for (int64_t m = 1; m <= per_rank; ++m) {
    if (per_rank % m != 0) continue;
    int in_flight = 1;
    if (p.pp > 1) {
      try {
        parallel::check_virtual_stages(p.pp_schedule, int(p.pp), int(m), int(p.virtual_stages),
                                       int(cfg_.model.n_layer));
        const auto schedule = parallel::make_schedule(p.pp_schedule, int(p.pp), int(m), int(p.virtual_stages));
        if (m > parallel::PipelineStage::max_micro_batches(int(p.virtual_stages)) ||
            !parallel::check_schedule(schedule, int(m), parallel::chunk_placement(p.pp_schedule)).empty())
          throw Error("");
        for (const auto& stage : schedule) in_flight = std::max(in_flight, parallel::max_in_flight(stage));
      } catch (const Error&) {
        refused_schedule += str_cat(refused_schedule.empty() ? "" : ", ", m);
        continue;
      }
    }
    const double activations = predicted_activation_bytes(per_rank / m) * double(in_flight) / double(p.virtual_stages);
    if (m != start && states + activations > limit) {
      refused_memory += str_cat(refused_memory.empty() ? "" : ", ", m);
      continue;
    }
    candidates.push_back(m);
  }
  micro_tuner_ = std::make_unique<MicroBatchTuner>(candidates, start);
  if (!main_rank()) return;
  std::string list;
  for (int64_t m : candidates) list += str_cat(list.empty() ? "" : ", ", m);
  std::fprintf(
      opt_.log,
      "[micro-batches] parallel.micro_batches=auto: starting at %lld of %lld sequences; "
      "choosing among %s by measured step time%s%s\n",
      (long long)start, (long long)(per_rank / start), list.c_str(),
      refused_memory.empty()
          ? ""
          : str_cat(" (", refused_memory, ": activations over ",
                    p.memory_limit_mb > 0 ? "parallel.memory_limit_mb" : "this machine's memory", ")")
                .c_str(),
      refused_schedule.empty()
          ? ""
          : str_cat(" (", refused_schedule,
                    ": not taken by parallel.pp_schedule=", parallel::pipe_schedule_name(p.pp_schedule),
                    p.virtual_stages > 1 ? str_cat(" with parallel.virtual_stages=", p.virtual_stages) : "", ")")
                .c_str());
}

void Trainer::tune_micro_batches(double step_s) {
  if (micro_tuner_->settled()) return;  // every rank settles at the same step
  // The slowest rank's step and the longest stage idle time: max is exact, so every rank feeds
  // its tuner the same numbers and takes the same decision.
  Tensor t = Tensor::from_vector<double>({step_s, pipe_ ? last_bubble_s_ : 0.0}, {2});
  if (mesh_->world().size() > 1) mesh_->world().all_reduce(t, comm::ReduceOp::max);
  const auto change = micro_tuner_->observe(t.data<double>()[0], t.data<double>()[1]);
  if (!change) return;
  const int64_t before = cfg_.parallel.micro_batches;
  if (change->m != before) set_micro_batches(change->m);
  if (main_rank()) {
    const int64_t per_rank = cfg_.data.batch_size / mesh_->data_size();
    std::fprintf(opt_.log, "[micro-batches] step %lld: %s%s\n", (long long)step_, change->reason.c_str(),
                 change->m != before
                     ? str_cat("; next steps: ", change->m, " of ", per_rank / change->m, " sequences").c_str()
                     : "");
    std::fflush(opt_.log);
  }
}

void Trainer::set_micro_batches(int64_t m) {
  const int64_t per_rank = cfg_.data.batch_size / mesh_->data_size();
  LOOM_CHECK(m >= 1 && per_rank % m == 0, "train", m, " micro-batches do not divide the per-rank batch ", per_rank);
  cfg_.parallel.micro_batches = m;
  cfg_.data.micro_batch_size = per_rank / m;
  if (pipe_) pipe_->set_micro_batches(int(m));
}

}  // namespace loom::train

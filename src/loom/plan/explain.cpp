// `explain`: the planner's pick written out for a reader, one line per step-time term with the
// numbers that decide it, and the memory of the stage that needs the most. Formatting only;
// the figures come from predict() in planner.cpp.
#include <cstdio>
#include <sstream>

#include "loom/core/allocator.h"
#include "loom/core/error.h"
#include "loom/parallel/pipeline_schedule.h"
#include "loom/plan/planner.h"

namespace loom::plan {

std::string explain(const Job& job, const Cluster& c, const Prediction& p) {
  const TimePrediction& t = p.time;
  const Layout& l = p.layout;
  std::ostringstream o;
  char line[256];
  auto row = [&](const char* name, double s, const std::string& why) {
    std::snprintf(line, sizeof line, "  %-22s %10.2f ms %5.1f%%  %s\n", name, s * 1e3,
                  t.step > 0 ? 100 * s / t.step : 0.0, why.c_str());
    o << line;
  };
  o << "layout " << l.describe() << " on " << l.ranks() << " devices of " << c.name << " (" << job.nodes << " node"
    << (job.nodes > 1 ? "s" : "") << " x " << c.devices_per_node << ")\n";
  o << "step time " << str_cat(t.step * 1e3) << " ms, " << int64_t(p.tokens_per_s) << " tokens/s, MFU "
    << str_cat(int(1000 * p.mfu) / 10.0) << "%\n";
  row("matrix products", t.gemm,
      str_cat("forward + backward (3x forward) of ", l.micro_batches, " micro-batches of ", l.micro_batch, " x ",
              job.seq, " tokens on the slowest stage"));
  row("attention products", t.attention, "causal QK^T and AV, T/2 keys per query on average");
  row("elementwise", t.elementwise, str_cat("bytes moved / ", c.device.memory_bytes_per_s / 1e9, " GB/s"));
  if (t.recompute > 0)
    row("recomputation", t.recompute, str_cat("checkpoint interval ", l.checkpoint, ": forward again"));
  if (t.tp_comm > 0) row("tensor-parallel comm", t.tp_comm, str_cat("4 all-reduces of [N, C] per block, tp=", l.tp));
  if (t.ep_a2a > 0)
    row("expert all-to-all", t.ep_a2a, str_cat("dispatch and combine, forward and backward, per MoE block, ep=", l.ep));
  if (t.pp_p2p > 0) row("pipeline transfers", t.pp_p2p, "activations forward, gradients backward");
  if (t.bubble > 0) {
    // What the schedule idles with equal stages and passes; the term itself is from the stages' times.
    const double f = parallel::predicted_bubble(l.pp_schedule, int(l.pp), int(l.micro_batches), int(l.virtual_stages));
    row("pipeline bubble", t.bubble,
        str_cat(parallel::pipe_schedule_name(l.pp_schedule), ": ",
                parallel::bubble_formula(l.pp_schedule, int(l.virtual_stages)), " = ", int(1000.0 * f) / 10.0,
                "% of an ideal pipeline"));
  }
  if (t.dp_comm > 0)
    row("data-parallel exposed", t.dp_exposed,
        str_cat("of ", t.dp_comm * 1e3, " ms of ZeRO-", l.zero_stage, " collectives over dp=", l.dp,
                l.ep > 1 ? str_cat(" (dense parameters over dp x ep=", l.dp * l.ep, ")") : std::string(),
                "; the rest hides behind backward"));
  row("optimizer", t.optimizer,
      str_cat(
          l.zero_stage >= 1 ? str_cat("AdamW on a 1/", l.dp * l.ep, " shard") : std::string("AdamW on all parameters"),
          l.offload != optim::OffloadTarget::none ? str_cat("; moments of offloaded stages copied from and to ",
                                                            optim::offload_target_name(l.offload), " beside it")
                                                  : std::string()));
  const MemoryPrediction& m = p.memory;
  o << "memory on stage " << p.memory_stage << ": " << format_bytes(int64_t(m.total())) << " of "
    << format_bytes(int64_t(c.device.memory_bytes)) << " (params " << format_bytes(int64_t(m.params)) << ", grads "
    << format_bytes(int64_t(m.grads)) << ", optimizer " << format_bytes(int64_t(m.optimizer)) << ", activations "
    << format_bytes(int64_t(m.activations)) << ", workspace " << format_bytes(int64_t(m.workspace)) << ", comm "
    << format_bytes(int64_t(m.comm)) << ")";
  if (m.offloaded > 0) o << "; Adam moments offloaded: " << format_bytes(int64_t(m.offloaded));
  o << "\n";
  return o.str();
}

}  // namespace loom::plan

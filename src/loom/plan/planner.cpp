#include "loom/plan/planner.h"

#include <algorithm>
#include <cmath>
#include <sstream>

#include "loom/core/allocator.h"
#include "loom/core/error.h"
#include "loom/model/block.h"
#include "loom/model/memory_estimate.h"
#include "loom/model/param_layout.h"
#include "loom/parallel/data_parallel_plan.h"
#include "loom/parallel/partition.h"

namespace loom::plan {

std::string Layout::describe() const {
  std::ostringstream o;
  o << "dp" << dp << " tp" << tp << " pp" << pp;
  if (ep > 1) o << " ep" << ep;
  o << " z" << zero_stage << " mb" << micro_batch << "x" << micro_batches;
  if (checkpoint) o << " ckpt" << checkpoint;
  if (pp > 1) o << " " << parallel::pipe_schedule_name(pp_schedule);
  if (virtual_stages > 1 && pp_schedule != parallel::PipeSchedule::zero_bubble_v) o << " v" << virtual_stages;
  return o.str();
}

namespace {

// The rank at these coordinates of the layout's mesh. The search and `loom plan` use the
// default order (tp innermost, so a tp group shares a node, as check_layout assumes).
int64_t rank_of(const Layout& l, int64_t pp_i, int64_t dp_i, int64_t ep_i, int64_t tp_i) {
  return l.mesh().rank_of(parallel::MeshCoord{pp_i, dp_i, ep_i, tp_i});
}

comm::Topology topology(const std::vector<int64_t>& ranks, int devices_per_node) {
  comm::Topology t;
  for (int64_t r : ranks) t.host_of.push_back(int(r / devices_per_node));
  return t;
}

// What comm.algorithm auto runs: inside one node MPI's collectives (at their measured time when the
// cluster has it), otherwise the fastest of the measured and modelled algorithms.
double collective_seconds(comm::CollectiveOp op, double bytes, const comm::Topology& topo, const comm::CostModel& m,
                          comm::Algorithm algorithm = comm::Algorithm::auto_select) {
  if (topo.size() < 2 || bytes <= 0) return 0;
  double best = -1;
  std::vector<comm::Algorithm> candidates = {comm::Algorithm::ring, comm::Algorithm::tree,
                                             comm::Algorithm::hierarchical};
  if (algorithm != comm::Algorithm::auto_select) {
    candidates = {algorithm};
  } else if (const double mpi = m.measured_time(comm::Algorithm::mpi, op, topo.size(), topo.hosts(), int64_t(bytes));
             mpi >= 0) {
    // Inside one node, comm.algorithm auto without a calibration file runs MPI's own
    // collectives, as a training run does by default: its measured time.
    if (topo.hosts() == 1) return mpi;
    candidates.push_back(comm::Algorithm::mpi);
  }
  for (comm::Algorithm a : candidates) {
    const comm::Algorithm run = comm::resolve_algorithm(a, op, int64_t(bytes), topo, m);
    double t = m.measured_time(run, op, topo.size(), topo.hosts(), int64_t(bytes));
    if (t < 0) t = comm::predict_seconds(run, op, int64_t(bytes), topo, m);
    if (t >= 0 && (best < 0 || t < best)) best = t;
  }
  return std::max(0.0, best);
}

// Every rank of a node runs its own group's collective at the same time (the tp ranks of a
// node each in their own dp group, every stage's ranks sending to the next stage): the node's
// one link to the others is shared by the groups whose members are on it. `members_here`:
// how many of the group's members are on one node.
comm::CostModel shared_links(const Cluster& c, const Layout& l, int64_t members_here) {
  comm::CostModel m = c.links;
  const double ranks_here = double(std::min<int64_t>(c.devices_per_node, l.ranks()));
  m.inter.beta_s_per_byte *= std::max(1.0, ranks_here / double(std::max<int64_t>(1, members_here)));
  return m;
}

double p2p_seconds(double bytes, bool same_node, const Cluster& c, const Layout& l) {
  const comm::LinkCost& link = same_node ? c.links.intra : shared_links(c, l, 1).inter;
  return link.alpha_s + bytes * link.beta_s_per_byte;
}

struct StageWork {
  double gemm = 0, attention = 0, elementwise = 0;  // per micro-batch, forward + backward
  double recompute = 0;                             // per micro-batch
  double tp = 0;                                    // per micro-batch
  double a2a = 0;                                   // per micro-batch
  double backward = 0;                              // the backward share of the above
  double total() const { return gemm + attention + elementwise + recompute + tp + a2a; }
};

double gemm_seconds(double flops, const Cluster& c, bool bf16) {
  const DeviceSpec& d = c.device;
  const double peak = bf16 && d.peak_bf16_flops > 0 ? d.peak_bf16_flops : d.peak_fp32_flops;
  return flops / (peak * std::max(1e-3, d.gemm_efficiency.at(flops)));
}

StageWork stage_work(const Job& job, const Cluster& c, const Layout& l, const model::ModelSlice& slice) {
  const StageCounts k = count_stage(job, l, slice);
  const double bw = c.device.memory_bytes_per_s;
  StageWork w;
  double fwd_gemm = 0;
  for (double f : k.fwd_products) fwd_gemm += gemm_seconds(f, c, job.bf16);
  const double fwd_att = c.device.attention_flops > 0 ? k.attention_fwd_flops / c.device.attention_flops
                                                      : gemm_seconds(k.attention_fwd_flops, c, job.bf16);
  w.gemm = 3 * fwd_gemm;
  w.attention = 3 * fwd_att;
  w.elementwise = (k.elem_fwd_bytes + k.elem_bwd_bytes) / bw;
  // Checkpointing runs every block's forward again in the backward (not embedding or head).
  if (l.checkpoint > 0) {
    double block_gemm = 0;
    for (size_t i = 0; i + (slice.has_head ? 1 : 0) < k.fwd_products.size(); ++i)
      block_gemm += gemm_seconds(k.fwd_products[i], c, job.bf16);
    w.recompute = block_gemm + fwd_att + k.elem_fwd_bytes / bw;
  }
  if (l.tp > 1) {
    std::vector<int64_t> members;
    for (int64_t t = 0; t < l.tp; ++t) members.push_back(rank_of(l, 0, 0, 0, t));
    const comm::Topology topo = topology(members, c.devices_per_node);
    w.tp = c.comm_under_compute * k.tp_allreduces *
           collective_seconds(comm::CollectiveOp::all_reduce, k.tp_allreduce_bytes, topo, c.links, job.algorithm);
  }
  if (l.ep > 1 && k.ep_a2as > 0) {
    // Pairwise exchange over the ep group: every rank sends each other rank its share.
    std::vector<int64_t> members;
    for (int64_t e = 0; e < l.ep; ++e) members.push_back(rank_of(l, 0, 0, e, 0));
    const comm::Topology topo = topology(members, c.devices_per_node);
    int64_t here = 0;
    for (int h : topo.host_of) here += h == topo.host_of.front();
    const comm::LinkCost link = topo.hosts() > 1 ? shared_links(c, l, here).inter : c.links.intra;
    const double peers = double(l.ep - 1);
    w.a2a = c.comm_under_compute * k.ep_a2as *
            (peers * link.alpha_s + k.ep_a2a_bytes * peers / double(l.ep) * link.beta_s_per_byte);
  }
  w.backward = 2 * fwd_gemm + 2 * fwd_att + k.elem_bwd_bytes / bw + w.recompute + w.tp / 2 + w.a2a / 2;
  return w;
}

}  // namespace

StageCounts count_stage(const Job& job, const Layout& l, const model::ModelSlice& slice) {
  const model::ModelConfig& cfg = job.model;
  const double N = double(l.micro_batch * job.seq), T = double(job.seq), C = double(cfg.d_model);
  const model::BlockDims d = model::BlockDims::of(cfg, l.tp, 0);
  const double G = cfg.family == model::Family::gpt2 ? 1 : 2;
  StageCounts k;
  const int64_t last = slice.last_layer < 0 ? cfg.n_layer : slice.last_layer;
  k.layers = last - slice.first_layer;
  for (int64_t layer = slice.first_layer; layer < last; ++layer) {
    k.fwd_products.push_back(2 * N * C * double(d.qkv_width()));
    k.fwd_products.push_back(2 * N * double(d.H * d.D) * C);
    if (cfg.is_moe_layer(layer)) {
      const double E = double(cfg.moe.num_experts), topk = double(cfg.moe.top_k), Fe = double(cfg.expert_d_ff());
      k.fwd_products.push_back(2 * N * C * E);  // router
      // Balanced routing: each local expert gets N top_k / E of every ep rank's tokens.
      const double rows = N * topk / E * double(l.ep);
      for (int64_t e = 0; e < cfg.moe.num_experts / l.ep; ++e) {
        k.fwd_products.push_back(2 * rows * C * G * Fe);
        k.fwd_products.push_back(2 * rows * Fe * C);
      }
      if (cfg.shared_d_ff() > 0) {
        k.fwd_products.push_back(2 * N * C * G * double(cfg.shared_d_ff()));
        k.fwd_products.push_back(2 * N * double(cfg.shared_d_ff()) * C);
      }
      if (l.ep > 1) {
        k.ep_a2a_bytes = N * topk * C * 4;
        k.ep_a2as += 4 + (l.checkpoint > 0 ? 2 : 0);
      }
    } else {
      k.fwd_products.push_back(2 * N * C * G * double(d.F));
      k.fwd_products.push_back(2 * N * double(d.F) * C);
    }
    // Causal attention: QK^T and AV over T/2 keys on average, per local head.
    k.attention_fwd_flops += 2 * 2 * N * (T / 2) * double(d.D) * double(d.H);
  }
  // Elementwise traffic per token and block, in floats: the forward writes what it saves and
  // reads its inputs (2x the saved activations); the backward reads them and writes and reads
  // its scratch.
  const model::ModelSlice one_block{0, 1, false, false, l.tp, 0, l.ep, 0},
      no_block{0, 0, false, false, l.tp, 0, l.ep, 0};
  // Counted as f32; 16-bit saved activations (model.activation_dtype) add their narrowing after
  // forward and widening before backward, 6 bytes each way per stored element.
  model::ModelConfig f32 = cfg;
  f32.activation_dtype = DType::f32;
  const auto one = model::estimate_slice_activations(f32, one_block, 1, 1, 0, 1);
  const auto none = model::estimate_slice_activations(f32, no_block, 1, 1, 0, 1);
  const double block_floats = double(one.per_slot - none.per_slot) / 4;  // saved per token and block
  const double scratch_floats = double(one.workspace) / 4 - C;           // backward scratch per token
  const double stored16 =
      l.checkpoint > 0
          ? 0
          : double(one.per_slot - model::estimate_slice_activations(cfg, one_block, 1, 1, 0, 1).per_slot) / 2;
  const double L = double(k.layers);
  k.elem_fwd_bytes = L * N * (4 * 2 * block_floats + 6 * stored16);
  k.elem_bwd_bytes = L * N * (4 * (block_floats + 2 * scratch_floats) + 6 * stored16);
  if (slice.has_embedding) k.elem_fwd_bytes += N * 4 * 3 * C, k.elem_bwd_bytes += N * 4 * 2 * C;
  if (slice.has_head) {
    const double V = double(l.tp == 1 ? cfg.vocab_size : model::vocab_rows_per_rank(cfg, l.tp));
    k.fwd_products.push_back(2 * N * C * V);
    // Softmax over each logits row and its gradient: three passes over the chunk.
    k.elem_fwd_bytes += N * 4 * 3 * V;
  }
  // Tensor parallelism: per block two all-reduces of [N, C] forward and two backward (and the
  // forward ones again when recomputing); the vocabulary-parallel embedding and head one each.
  if (l.tp > 1) {
    k.tp_allreduce_bytes = N * C * 4;
    k.tp_allreduces = 4 * L + (l.checkpoint > 0 ? 2 * L : 0) + (slice.has_embedding ? 2 : 0) + (slice.has_head ? 2 : 0);
  }
  return k;
}

std::string check_layout(const Job& job, const Cluster& c, const Layout& l) {
  const model::ModelConfig& cfg = job.model;
  if (l.dp < 1 || l.tp < 1 || l.pp < 1 || l.ep < 1 || l.micro_batch < 1 || l.micro_batches < 1)
    return "every dimension must be at least 1";
  if (l.zero_stage < 0 || l.zero_stage > 3) return str_cat("zero stage ", l.zero_stage, " is not 0-3");
  if (cfg.n_head % l.tp != 0) return str_cat("tp=", l.tp, " does not divide n_head=", cfg.n_head);
  if (cfg.d_ff % l.tp != 0) return str_cat("tp=", l.tp, " does not divide d_ff=", cfg.d_ff);
  if (l.tp > c.devices_per_node) return str_cat("tp=", l.tp, " spans nodes (", c.devices_per_node, " devices each)");
  if (l.pp > cfg.n_layer) return str_cat("pp=", l.pp, " exceeds n_layer=", cfg.n_layer);
  if (l.ep > 1 && (!cfg.moe.enabled() || cfg.moe.num_experts % l.ep != 0))
    return str_cat("ep=", l.ep, " needs a MoE model whose num_experts it divides");
  if (l.dp * l.micro_batch * l.micro_batches * l.ep != job.global_batch)
    return str_cat("dp x ep x micro_batch x micro_batches = ", l.dp * l.ep * l.micro_batch * l.micro_batches,
                   " is not the global batch ", job.global_batch);
  if (job.seq > cfg.n_ctx) return str_cat("seq ", job.seq, " exceeds n_ctx ", cfg.n_ctx);
  if (l.pp > 1 && l.zero_stage >= 2)
    return str_cat("ZeRO-", l.zero_stage, " with pp=", l.pp,
                   " (loom's trainer shards gradients only without pipelining)");
  if (l.virtual_stages > 1 || l.pp_schedule == parallel::PipeSchedule::zero_bubble_v) {
    try {
      parallel::check_virtual_stages(l.pp_schedule, int(l.pp), int(l.micro_batches), int(l.virtual_stages),
                                     int(cfg.n_layer));
    } catch (const Error& e) {
      return e.what();
    }
  }
  if (l.pp > 1 && l.checkpoint > 0 &&
      (l.pp_schedule == parallel::PipeSchedule::zero_bubble_h1 ||
       l.pp_schedule == parallel::PipeSchedule::zero_bubble_v))
    return str_cat(parallel::pipe_schedule_name(l.pp_schedule),
                   " with activation checkpointing (its deferred weight passes read the saved activations)");
  if (l.offload_params != optim::OffloadTarget::none && l.zero_stage != 3)
    return str_cat("offload_params with ZeRO-", l.zero_stage, " (only ZeRO-3 keeps parameter shards)");
  if (job.onebit() && (l.zero_stage >= 2 || l.ep > 1))
    return str_cat("1-bit Adam with ", l.ep > 1 ? str_cat("ep=", l.ep) : str_cat("ZeRO-", l.zero_stage),
                   " (loom's trainer runs it at ZeRO 0-1 without expert parallelism)");
  return "";
}

namespace {

// Communication buffers of one stage: pipeline transfer buffers; ZeRO-0/1 bucket staging (two
// in flight); ZeRO-2 the embedding and head staging; ZeRO-3 gathered units (embedding, head
// and the two blocks around the one computing).
double comm_buffer_bytes(const Job& job, const Layout& l, const model::ModelSlice& slice,
                         const model::ParamLayout& layout, int64_t N, int64_t dense, bool replica) {
  const model::ModelConfig& cfg = job.model;
  double bytes = 0;
  const double act_bytes = double(N) * double(cfg.d_model) * 4;
  if (l.pp > 1) bytes += 2 * act_bytes;
  if (l.dp * l.ep > 1) {
    double block_unit = 0, embed_unit = 0, head_unit = 0, expert_unit = 0;
    for (const auto& u : layout.units()) {
      if (u.layer >= 0 && !u.experts) block_unit = std::max(block_unit, double(u.size()) * 4);
      if (u.experts) expert_unit = std::max(expert_unit, double(u.size()) * 4);
      if (u.name == "embed") embed_unit = double(u.size()) * 4;
      if (u.name == "head") head_unit = double(u.size()) * 4;
    }
    if (l.zero_stage < 2) {
      // Gradients reduce in place; bf16 ones through a bucket-sized copy (two in flight).
      // A stage with both embedding and head and no tp gathers every rank's embedding
      // gradient rows (tokens, positions, rows) instead of reducing the whole table.
      if (job.bf16) bytes += std::min(2 * job.bucket_mb * 1024 * 1024 / 4, double(dense)) * 2;
      if (slice.has_embedding && slice.has_head && l.tp == 1)
        bytes += double(N) * double(l.dp * l.ep) * double(2 + cfg.d_model) * 4 + double(N) * double(cfg.d_model) * 4;
    } else if (l.zero_stage == 2) {
      // Embedding and head staging for the whole step, and the block reductions in flight.
      bytes += embed_unit + head_unit + 3 * block_unit;
    } else {
      // Gathered units: embedding, head, and the blocks in flight around the computing one.
      const double L = double(slice.last_layer - slice.first_layer);
      bytes += embed_unit + head_unit + (std::min(L, 4.0) + 1) * block_unit;
    }
    // The replica's units widened for use: the head and the computing block with its experts
    // (a unit without 16-bit weights, the embedding's, is read in place).
    if (replica) bytes += head_unit + block_unit + expert_unit;
  }
  return bytes;
}

// Pipeline: the slowest stage runs m micro-batches; the others' fill and drain add the sum
// of their per-micro-batch times once (1F1B and GPipe alike). Fills t's compute, tp, ep and
// pipeline terms; returns the slowest stage.
size_t pipeline_time(const Job& job, const Cluster& c, const Layout& l, const std::vector<StageWork>& work,
                     TimePrediction& t) {
  const model::ModelConfig& cfg = job.model;
  const int64_t N = l.micro_batch * job.seq;
  double t_max = 0;
  size_t slow = 0;
  std::vector<double> stage_s(work.size());
  for (size_t s = 0; s < work.size(); ++s) {
    double& ts = stage_s[s];
    ts = work[s].total();
    if (l.pp > 1) {
      const bool same = rank_of(l, int64_t(s), 0, 0, 0) / c.devices_per_node ==
                        rank_of(l, int64_t(s) + 1, 0, 0, 0) / c.devices_per_node;
      // An activation out and a gradient back per micro-batch, once per chunk (interleaved: v).
      ts += 2 * double(l.virtual_stages) *
            p2p_seconds(double(N) * double(cfg.d_model) * (job.bf16 ? 2 : 4), same, c, l);  // parallel.pp_dtype
    }
    if (ts > t_max) t_max = ts, slow = s;
  }
  // The bubble: every other stage's micro-batch time, once (GPipe and 1F1B: (p-1)/(m+p-1) of the
  // step with equal stages); interleaved over v chunks a v-th of it ((p-1)/(vm+p-1)). ZB-H1 fills
  // the drain with the deferred weight-gradient passes (a third of a stage's matrix products, W);
  // what stays idle is T_F + T_B - T_W of each other stage, the whole time less 2 W
  // (pipeline_schedule.h; a third of 1F1B's when F, B and W are equal). ZB-V has no closed form: its own schedule
  // replayed with each stage's chunk passes (half the stage's work each; W a third of the matrix products, F and B
  // splitting the rest), the slowest stage's idle over the step.
  double idle = 0;
  if (l.pp > 1 && l.pp_schedule == parallel::PipeSchedule::zero_bubble_v) {
    std::vector<double> tf, tb, tw;
    for (size_t s = 0; s < work.size(); ++s) {
      const double w = work[s].gemm / 3, rest = std::max(0.0, stage_s[s] - w);
      tf.push_back(rest / 4), tb.push_back(rest / 4), tw.push_back(w / 2);
    }
    const auto tl = parallel::simulate_schedule(parallel::zero_bubble_v_schedule(int(l.pp), int(l.micro_batches)), tf,
                                                tb, tw, parallel::ChunkPlacement::vee);
    idle = tl.makespan - tl.busy[slow];
  } else {
    for (size_t s = 0; s < work.size(); ++s) {
      if (s == slow) continue;
      const double ts = stage_s[s];
      idle += l.pp_schedule == parallel::PipeSchedule::zero_bubble_h1 ? std::max(0.0, ts - 2 * work[s].gemm / 3) : ts;
    }
    idle /= double(l.virtual_stages);
  }
  const StageWork& ws = work[slow];
  const double m = double(l.micro_batches);
  t.gemm = m * ws.gemm;
  t.attention = m * ws.attention;
  t.elementwise = m * ws.elementwise;
  t.recompute = m * ws.recompute;
  t.tp_comm = m * ws.tp;
  t.ep_a2a = m * ws.a2a;
  t.pp_p2p = m * (t_max - ws.total());
  t.bubble = l.pp > 1 ? idle : 0;
  return slow;
}

// Data parallelism on the slowest stage: dense parameters over the dp x ep ranks, a MoE
// model's experts over the dp ranks that hold the same ones (as the trainer shards them).
// Fills t.dp_comm and t.dp_exposed.
void data_parallel_time(const Job& job, const Cluster& c, const Layout& l, size_t slow, const StageWork& ws,
                        double grad_bytes, double dense_params, double expert_params, double gather_bytes,
                        TimePrediction& t) {
  const model::ModelConfig& cfg = job.model;
  const double m = double(l.micro_batches);
  using Op = comm::CollectiveOp;
  double grads = 0, gathers = 0, overlapped = 0;
  auto data_parallel = [&](double P, int64_t ep_span) {
    std::vector<int64_t> members;
    for (int64_t d = 0; d < l.dp; ++d)
      for (int64_t e = 0; e < ep_span; ++e) members.push_back(rank_of(l, int64_t(slow), d, e, 0));
    if (members.size() < 2 || P <= 0) return;
    const comm::Topology topo = topology(members, c.devices_per_node);
    int64_t here = 0;
    for (int h : topo.host_of) here += h == topo.host_of.front();
    const comm::CostModel links = shared_links(c, l, here);
    // Gradients: ZeRO-0/1 all-reduce once per step (no_sync before the last micro-batch), in
    // buckets whose last one cannot overlap; ZeRO-2/3 reduce-scatter every micro-batch.
    const double bucket = std::min(job.bucket_mb * 1024 * 1024 / 4, P);
    if (l.zero_stage < 2) {
      const double g = collective_seconds(Op::all_reduce, P * grad_bytes, topo, links, job.algorithm);
      const double last = collective_seconds(Op::all_reduce, bucket * grad_bytes, topo, links, job.algorithm);
      grads += g;
      overlapped += std::min(g - last, c.overlap_fraction * ws.backward);
    } else {
      const double g = m * collective_seconds(Op::reduce_scatter, P * grad_bytes, topo, links, job.algorithm);
      grads += g;
      overlapped += std::min(g * (1 - 1 / std::max(1.0, P / bucket)), c.overlap_fraction * m * ws.backward);
    }
    if (l.zero_stage == 1 || l.zero_stage == 2)
      gathers += collective_seconds(Op::all_gather, P * gather_bytes, topo, links, job.algorithm);
    if (l.zero_stage == 3) {
      // Parameters gathered for every micro-batch's forward and backward, prefetched a unit
      // ahead: hidden behind compute except the first unit.
      const double g = 2 * m * collective_seconds(Op::all_gather, P * gather_bytes, topo, links, job.algorithm);
      gathers += g;
      overlapped += std::min(g * (1 - 1.0 / double(cfg.n_layer + 2)), c.overlap_fraction * m * ws.total());
    }
  };
  data_parallel(dense_params, l.ep);
  data_parallel(expert_params, 1);
  t.dp_comm = c.comm_under_compute * (grads + gathers);
  overlapped *= c.comm_under_compute;
  t.dp_exposed = std::max(0.0, t.dp_comm - std::max(0.0, overlapped));
}

}  // namespace

Prediction predict(const Job& job, const Cluster& c, const Layout& l) {
  Prediction p;
  p.layout = l;
  p.why_not = check_layout(job, c, l);
  if (!p.why_not.empty()) {
    p.fits = false;
    return p;
  }
  const model::ModelConfig& cfg = job.model;
  const auto stages = parallel::partition_uniform(int(cfg.n_layer), int(l.pp));
  const int64_t N = l.micro_batch * job.seq;
  const double grad_bytes = job.grad_wire_bytes > 0 ? job.grad_wire_bytes : job.bf16 ? 2 : 4;
  std::vector<StageWork> work;
  std::vector<double> stage_params, stage_experts, gather_bytes, staging, widest_chunk;
  for (int64_t s = 0; s < l.pp; ++s) {
    model::ModelSlice slice;
    slice.first_layer = stages[size_t(s)].first_layer;
    slice.last_layer = stages[size_t(s)].last_layer;
    slice.has_embedding = s == 0;
    slice.has_head = s == l.pp - 1;
    slice.tp = l.tp;
    slice.ep = l.ep;
    const model::ParamLayout layout(cfg, 1, slice);
    int64_t expert_params = 0, product = 0;
    for (const auto& pi : layout.params()) {
      if (pi.expert >= 0) expert_params += pi.numel();
      if (pi.product_operand) product += pi.numel();
    }
    // ZeRO-1/2 under bf16 keep the 16-bit weight replica and the owned fp32 masters where that
    // takes fewer bytes (parallel.weight_replica=auto), as the trainer decides: the same plan.
    const parallel::DataParallelPlan dp_plan = parallel::plan_data_parallel(
        {int(l.zero_stage), job.bucket_mb, DType::f32, job.bf16 ? DType::bf16 : DType::f32},
        job.onebit() ? optim::OptimizerKind::onebit_adam : optim::OptimizerKind::adamw, layout,
        l.data_parallel_ranks());
    // ZeRO's weight all-gathers under bf16 (parallel.gather_dtype): product weights in 2 bytes,
    // tables, norms and biases in 4.
    gather_bytes.push_back(job.bf16 ? 4.0 - 2.0 * double(product) / double(std::max<int64_t>(1, layout.num_params()))
                                    : 4.0);
    const int64_t dense = layout.num_params() - expert_params;
    // Dense parameters shard over dp x ep ranks, experts over dp; 1-bit Adam's error feedback
    // counts with the optimizer.
    MemoryPrediction m;
    m.params = double(dp_plan.model_states.params);
    m.grads = double(dp_plan.model_states.grads);
    m.optimizer = double(dp_plan.model_states.optimizer);
    const auto a = model::estimate_slice_activations(cfg, slice, l.micro_batch, job.seq, l.checkpoint, job.xent_chunk);
    // Activation sets in flight on stage s (pipeline_schedule.h): 1F1B holds at most pp - s
    // micro-batches, GPipe all of them, ZB-H1 pp (between forward and weight pass) on every stage;
    // interleaved 1F1B its warm-up's 2 (pp - s - 1) + (v - 1) pp chunk sets and one more, each a
    // v-th of the stage's blocks.
    const parallel::PipeSchedule k = l.pp_schedule;
    const int64_t v = l.virtual_stages, mb = l.micro_batches;
    // ZB-V: at most 2 pp chunk sets (pp of a whole stage) on every stage.
    const int64_t sets = l.pp == 1                                    ? 1
                         : k == parallel::PipeSchedule::zero_bubble_v ? std::min(2 * mb, 2 * l.pp)
                         : v > 1 ? std::min(v * mb, 2 * (l.pp - s - 1) + (v - 1) * l.pp + 1)
                         : k == parallel::PipeSchedule::gpipe          ? mb
                         : k == parallel::PipeSchedule::zero_bubble_h1 ? std::min(mb, l.pp)
                                                                       : std::min(mb, l.pp - s);
    m.activations = double(a.shared) + double(sets) * double(a.per_slot) / double(v);
    m.workspace = double(a.workspace) + double(sets) * double(a.per_slot_workspace) / double(v);
    m.comm = comm_buffer_bytes(job, l, slice, layout, N, dense, dp_plan.weight_replica);
    p.stage_memory.push_back(m);
    int64_t widest = 0;  // MomentOffload stages two pieces' m and v at a time (pieces: 1M elements)
    for (const auto& u : layout.units()) widest = std::max(widest, u.size());
    widest_chunk.push_back(double(widest) / double(l.zero_stage >= 1 ? l.dp * l.ep : 1));
    staging.push_back(16.0 * std::min(double(int64_t(1) << 20), widest_chunk.back()));
    stage_params.push_back(double(dense));
    stage_experts.push_back(double(expert_params));
    work.push_back(stage_work(job, c, l, slice));
  }
  // parallel.offload: the stages offloads_stage picks (the device's memory as the limit) keep only
  // the staging buffers of their moments on it; with parallel.offload.params (ZeRO-3) also only
  // the parameter chunks staged at once (the unit in use, the one gathering, the one being read).
  double offloaded_bytes = 0, offloaded_params = 0;
  std::vector<double> predicted;
  for (const auto& m : p.stage_memory) predicted.push_back(m.total());
  for (size_t s = 0; s < p.stage_memory.size(); ++s) {
    if (!parallel::offloads_stage(l, predicted, int64_t(s), c.device.memory_bytes)) continue;
    MemoryPrediction& m = p.stage_memory[s];
    if (l.offload != optim::OffloadTarget::none) {
      m.offloaded = m.optimizer;
      m.optimizer = std::min(m.optimizer, staging[s]);
      offloaded_bytes = std::max(offloaded_bytes, m.offloaded);
    }
    if (l.offload_params != optim::OffloadTarget::none && l.zero_stage == 3) {
      const double staged = std::min(m.params, 12.0 * widest_chunk[s]);  // three fp32 chunks of the widest unit
      m.offloaded += m.params - staged;
      offloaded_params = std::max(offloaded_params, m.params - staged);
      m.params = staged;
    }
  }
  for (size_t s = 0; s < p.stage_memory.size(); ++s)
    if (p.stage_memory[s].total() > p.memory.total()) p.memory = p.stage_memory[s], p.memory_stage = int(s);

  TimePrediction& t = p.time;
  const size_t slow = pipeline_time(job, c, l, work, t);
  const StageWork& ws = work[slow];

  data_parallel_time(job, c, l, slow, ws, grad_bytes, stage_params[slow], stage_experts[slow], gather_bytes[slow], t);
  const double P = stage_params[slow] + stage_experts[slow];
  // Optimizer on the rank's shard: AdamW reads parameters, gradients and both moments and
  // writes three of them; the gradient norm reads the gradients; zeroing writes them.
  const double dense_shard = stage_params[slow] / double(l.dp * l.ep),
               expert_shard = stage_experts[slow] / double(l.dp);
  const double shard = l.zero_stage >= 1 ? dense_shard + expert_shard : P;
  const double grads_held = l.zero_stage >= 2 ? dense_shard + expert_shard : P;
  const double stream = c.device.stream_bytes_per_s > 0 ? c.device.stream_bytes_per_s : c.device.memory_bytes_per_s;
  t.optimizer = (28 * shard + 4 * grads_held + 4 * P) / stream;
  // Offloaded moments are read and written back once a step, beside the update of the unit
  // before (two staging buffers): the slower of the two streams sets the optimizer's time.
  const double rate = c.device.offload_bytes_per_s > 0 ? c.device.offload_bytes_per_s : stream;
  if (offloaded_bytes > 0 || offloaded_params > 0)
    t.optimizer = std::max(t.optimizer, 2 * (offloaded_bytes + offloaded_params) / rate);
  // Offloaded parameter shards are read again for every gather (each micro-batch's forward,
  // backward and recompute), a unit ahead: what the compute does not hide waits.
  if (offloaded_params > 0) {
    const double passes = double(l.micro_batches) * (l.checkpoint > 0 ? 3 : 2);
    const double compute = t.gemm + t.attention + t.elementwise + t.recompute;
    t.dp_exposed += std::max(0.0, passes * offloaded_params / rate - compute);
  }
  t.step = t.gemm + t.attention + t.elementwise + t.recompute + t.tp_comm + t.ep_a2a + t.pp_p2p + t.bubble +
           t.dp_exposed + t.optimizer;

  p.model_flops = model::training_flops(cfg, model::ParamLayout(cfg).num_params(), job.global_batch, job.seq);
  p.tokens_per_s = double(job.global_batch * job.seq) / t.step;
  const double peak = job.bf16 && c.device.peak_bf16_flops > 0 ? c.device.peak_bf16_flops : c.device.peak_fp32_flops;
  p.mfu = p.model_flops / t.step / (double(l.ranks()) * peak);
  const double budget = c.device.memory_bytes;
  if (p.memory.total() > budget) {
    p.fits = false;
    p.why_not = str_cat("needs ", format_bytes(int64_t(p.memory.total())), " on stage ", p.memory_stage, ", ",
                        format_bytes(int64_t(budget)), " per device");
  }
  return p;
}

std::vector<Prediction> search(const Job& job, const Cluster& c, const SearchOptions& opt) {
  const int64_t devices = int64_t(job.nodes) * c.devices_per_node;
  std::vector<Prediction> out;
  auto divisors = [](int64_t n) {
    std::vector<int64_t> d;
    for (int64_t i = 1; i <= n; ++i)
      if (n % i == 0) d.push_back(i);
    return d;
  };
  const int64_t max_ep = job.model.moe.enabled() ? job.model.moe.num_experts : 1;
  for (int64_t tp : divisors(devices))
    for (int64_t pp : divisors(devices / tp))
      for (int64_t ep : divisors(devices / tp / pp)) {
        if (ep > max_ep) continue;
        const int64_t dp = devices / tp / pp / ep;
        if (job.global_batch % (dp * ep) != 0) continue;
        const int64_t per_rank = job.global_batch / (dp * ep);
        for (int64_t mb : divisors(per_rank))
          for (int zero : opt.zero_stages) {
            if (dp * ep == 1 && zero > 0) continue;  // nothing to shard over
            for (int ckpt : {0, 1}) {
              if (ckpt && !opt.allow_checkpointing) continue;
              for (const parallel::PipeSchedule sched : opt.schedules) {
                if (pp == 1 && sched != opt.schedules.front()) continue;
                const Layout l = Layout::of(dp, tp, pp, ep, zero, mb, per_rank / mb, ckpt, sched);
                if (!check_layout(job, c, l).empty()) continue;
                Prediction p = predict(job, c, l);
                if (p.fits && p.memory.total() > opt.memory_headroom * c.device.memory_bytes) {
                  p.fits = false;
                  p.why_not =
                      str_cat("needs ", format_bytes(int64_t(p.memory.total())), ", over ",
                              int(opt.memory_headroom * 100), "% of ", format_bytes(int64_t(c.device.memory_bytes)));
                }
                out.push_back(std::move(p));
              }
            }
          }
      }
  std::stable_sort(out.begin(), out.end(), [](const Prediction& a, const Prediction& b) {
    if (a.fits != b.fits) return a.fits;
    if (a.fits) return a.time.step < b.time.step;
    return a.memory.total() < b.memory.total();
  });
  return out;
}

}  // namespace loom::plan

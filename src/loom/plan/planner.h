// The planner: for a model, a cluster and a global batch, what one training step of a layout
// (dp, tp, pp, ep, ZeRO stage, micro-batches, activation checkpointing, pipeline schedule)
// needs in memory per rank, by category, and how long it takes, term by term; and the search
// over layouts that ranks the ones that fit. Closed forms only: memory from the estimators the
// trainer's allocations are checked against (model/memory_estimate.h, the ZeRO formulas),
// compute from each product's FLOPs at the device's efficiency for its size, elementwise work
// from bytes moved, collectives from comm's alpha-beta model on the rank-to-node placement
// the mesh makes, the pipeline bubble from the schedule. Nothing here runs a model.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "loom/comm/algorithm.h"
#include "loom/model/config.h"
#include "loom/model/param_layout.h"
#include "loom/parallel/layout.h"
#include "loom/plan/cluster.h"

namespace loom::plan {

// A candidate: the trainer's layout (parallel::Layout, what parallel.* sets) and the two
// settings the search varies beside it.
struct Layout : parallel::Layout {
  int64_t micro_batch = 1;       // sequences per micro-batch and rank (data.micro_batch_size)
  int checkpoint = 0;            // model.activation_checkpoint_interval (0: off)
  std::string describe() const;  // "dp2 tp1 pp2 z1 mb4x2 ckpt1 1f1b"
  // Every field in the order describe() prints them (the default mesh order).
  static Layout of(int64_t dp, int64_t tp, int64_t pp, int64_t ep, int zero_stage, int64_t micro_batch,
                   int64_t micro_batches, int checkpoint = 0,
                   parallel::PipeSchedule schedule = parallel::PipeSchedule::one_f_one_b) {
    return Layout{{dp, tp, pp, ep, zero_stage, micro_batches, schedule}, micro_batch, checkpoint};
  }
};

struct Job {
  model::ModelConfig model;
  int64_t global_batch = 8;  // sequences per step
  int64_t seq = 256;
  int nodes = 1;
  int64_t xent_chunk = 1024;
  double bucket_mb = 25.0;
  // model.precision=bf16: products at the 16-bit rate, ZeRO gathers and pipeline transfers in
  // 16 bits (their defaults); model.activation_dtype is the model's own setting.
  bool bf16 = false;
  // Bytes per gradient element on the data-parallel wire: 4 (fp32), 2 (bf16, comm.grad_dtype),
  // 1/8 (1-bit Adam's signs after its warm-up); 0: bf16's 2 when bf16, else 4.
  double grad_wire_bytes = 0;
  bool onebit() const { return grad_wire_bytes > 0 && grad_wire_bytes < 1; }
  // Collectives: auto_select (the fastest of ring, tree and two-level hierarchical, as comm's
  // auto chooses) or one of them.
  comm::Algorithm algorithm = comm::Algorithm::auto_select;
};

struct MemoryPrediction {
  double params = 0, grads = 0, optimizer = 0, activations = 0, workspace = 0, comm = 0;
  // Adam moments (and, parallel.offload.params at ZeRO-3, parameter shards) kept off the device
  // (parallel.offload), not counted in total(); optimizer (params) then holds their staging
  // buffers.
  double offloaded = 0;
  double total() const { return params + grads + optimizer + activations + workspace + comm; }
};

// Seconds of one step on the critical rank, by term. step = compute + tp + pp_p2p + bubble
// + dp_exposed + optimizer (the compute of the slowest stage times the micro-batches it runs).
struct TimePrediction {
  double gemm = 0;         // matrix products (forward, backward, recomputation)
  double attention = 0;    // score and value products
  double elementwise = 0;  // norms, activations, softmax, residual adds, losses: bytes / bandwidth
  double recompute = 0;    // of gemm + attention + elementwise: checkpoint recomputation
  double tp_comm = 0;      // tensor-parallel all-reduces (not overlapped)
  double ep_a2a = 0;       // expert parallelism: token dispatch and combine all-to-alls
  double pp_p2p = 0;       // pipeline activation/gradient transfers on the critical path
  double bubble = 0;       // pipeline fill and drain
  double dp_comm = 0;      // data-parallel collectives' total time
  double dp_exposed = 0;   // the part not hidden behind backward
  double optimizer = 0;    // AdamW on the rank's shard, gradient norm, zeroing; with offloaded
                           // moments, the slower of that and their copies (double-buffered)
  double step = 0;
};

struct Prediction {
  Layout layout;
  std::vector<MemoryPrediction> stage_memory;  // per pipeline stage (tp rank 0)
  MemoryPrediction memory;                     // the stage that needs the most
  int memory_stage = 0;
  TimePrediction time;
  double model_flops = 0;  // per step, all ranks (MFU convention: no recomputation)
  double tokens_per_s = 0;
  double mfu = 0;  // model FLOP/s over all devices' peak
  bool fits = true;
  std::string why_not;  // when !fits or the layout is invalid
};

// What one micro-batch's forward and backward on one stage (tp rank 0) does, counted: the
// FLOPs of each forward matrix product (the backward runs two of the same size for each),
// of the attention score and value products, and the bytes the elementwise kernels move.
struct StageCounts {
  std::vector<double> fwd_products;
  double attention_fwd_flops = 0;
  double elem_fwd_bytes = 0, elem_bwd_bytes = 0;
  int64_t layers = 0;
  double tp_allreduce_bytes = 0;  // each tensor-parallel all-reduce's payload
  double tp_allreduces = 0;       // per micro-batch, forward and backward
  double ep_a2a_bytes = 0;        // each expert all-to-all's payload per rank (routed rows)
  double ep_a2as = 0;             // per micro-batch: dispatch and combine, forward and backward
};
StageCounts count_stage(const Job& job, const Layout& l, const model::ModelSlice& slice);

// Whether the layout is valid for the job on the cluster ("" when it is; else the reason,
// e.g. "tp=3 does not divide n_head=8").
std::string check_layout(const Job& job, const Cluster& cluster, const Layout& l);
Prediction predict(const Job& job, const Cluster& cluster, const Layout& l);

struct SearchOptions {
  bool allow_checkpointing = true;
  std::vector<int> zero_stages = {0, 1, 2, 3};
  std::vector<parallel::PipeSchedule> schedules = {parallel::PipeSchedule::one_f_one_b};
  double memory_headroom = 0.9;  // use at most this fraction of device memory
};
// Every valid layout on all devices of job.nodes nodes; fitting ones first, fastest first.
std::vector<Prediction> search(const Job& job, const Cluster& cluster, const SearchOptions& opt = {});

// The top pick's terms, one per line, with the numbers that decide them.
std::string explain(const Job& job, const Cluster& cluster, const Prediction& p);

}  // namespace loom::plan

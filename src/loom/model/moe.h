// The Mixture-of-Experts MLP of a MoE block, forward and backward side by side: router
// (logits, softmax or sigmoid scores, top-k with normalised weights, DeepSeek-V3's selection
// bias), capacity and dropping, grouping of the tokens by expert so each expert runs one
// matrix product over its rows (its weights read once per call), the family's MLP per expert,
// the weighted combine, and the two router losses (Switch/GShard balance, ST-MoE z-loss) with
// their exact gradients. The block (block.cpp) adds the shared experts, which every token runs
// as one dense MLP, and the residual. The inference runner calls moe_forward too.
#pragma once
#include <cstdint>
#include <vector>

#include "loom/core/tensor.h"
#include "loom/model/config.h"

namespace loom::model {

struct BlockWeights;

// Expert parallelism's exchange (implemented over the ep group in parallel/expert_parallel):
// the model only packs rows by destination and unpacks them by source.
class ExpertParallelOps {
 public:
  virtual ~ExpertParallelOps() = default;
  virtual int size() const = 0;
  virtual int rank() const = 0;
  // All-to-all of equal chunks: send[q * n .. (q + 1) * n) goes to rank q, recv has the same
  // layout by source (n = send.size() / size()).
  virtual void exchange_counts(const std::vector<int64_t>& send, std::vector<int64_t>& recv) = 0;
  // Starts sending in's rows packed by destination (send_rows[q] for rank q) into out's rows
  // packed by source (recv_rows[s]); one exchange in flight at a time.
  virtual void start_rows(const Tensor& in, const std::vector<int64_t>& send_rows, const Tensor& out,
                          const std::vector<int64_t>& recv_rows) = 0;
  virtual void wait_rows() = 0;
};

// Seconds the MoE layers spent (summed over calls until reset): routing (router product,
// scores, top-k, grouping, gathers and combines) and the experts' MLPs, forward and backward.
struct MoeTimes {
  double route_s = 0, expert_s = 0;
};

// What a MoE forward keeps for its backward (and reports), for up to N tokens.
struct MoeActs {
  int64_t tokens = 0;            // rows of the last forward
  Tensor logits;                 // [N, E] router logits
  Tensor scores;                 // [N, E] softmax or sigmoid of the logits
  Tensor topk;                   // i32 [N, k] chosen experts, in descending biased score
  Tensor gates;                  // [N, k] normalised weights of the chosen experts
  Tensor row_of;                 // i32 [N, k] row of each choice in the grouped buffers; -1: dropped
  Tensor choice_of;              // i32 [N*k] choice (token * k + j) of each grouped row
  Tensor fc, act;                // [N*k, Fe or 2 Fe] and [N*k, Fe]: the experts' MLP, rows grouped by expert
  Tensor eout;                   // [N*k, C] each row's expert output (before its weight)
  std::vector<int64_t> offsets;  // E+1: expert e's rows are [offsets[e], offsets[e+1])
  std::vector<int64_t> load;     // E: tokens routed to each expert (before capacity)
  int64_t dropped = 0;           // choices over capacity
  double aux = 0, z = 0;         // the balance loss E * sum f_i P_i and the z-loss
  // Set before backward: d(training objective) / d(coef_aux * aux + coef_z * z).
  double loss_weight = 0;
  MoeTimes* times = nullptr;  // where to add the time spent (optional)
  // Expert parallelism: rows per peer, the rows of each (source, local expert), and on the
  // owner the received rows regrouped by local expert (perm: expert-major row -> received
  // row), with the experts' activations for backward. Sized per call.
  std::vector<int64_t> send_rows, recv_rows, recv_counts, local_offsets;
  std::vector<int32_t> perm;
  Tensor ep_recv, ep_x, ep_fc, ep_act, ep_out;
  static MoeActs allocate(const ModelConfig& cfg, int64_t N, DType dt, Allocator& alloc,
                          MemCategory cat = MemCategory::activations);
  int64_t bytes() const;
};

// Backward temporaries, shared by all MoE blocks.
struct MoeScratch {
  Tensor rows;  // [N*k, C] gathered inputs, then each row's input gradient
  Tensor dout;  // [N*k, C] weighted output gradient per row
  Tensor dfc, dact;
  Tensor dlogits;                                // [N, E]
  Tensor dgate;                                  // [N * k]
  Tensor ep_recv, ep_d, ep_dfc, ep_dact, ep_dx;  // expert parallelism, sized per call
  static MoeScratch allocate(const ModelConfig& cfg, int64_t N, DType dt, Allocator& alloc);
};

// y[N, C] (+)= sum over each token's kept choices of gate * expert(x); accumulate = false
// overwrites y. w.router_w, w.experts (and w.router_bias when defined) are read. In two
// halves, so the caller can compute (the shared experts) while the tokens travel: dispatch
// routes and, under expert parallelism (ep with size() > 1; w.experts then holds this rank's
// experts), starts sending each row to its expert's rank; combine runs the experts, brings
// their outputs back and adds them up.
void moe_dispatch(const ModelConfig& cfg, const BlockWeights& w, const Tensor& x, MoeActs& a,
                  ExpertParallelOps* ep = nullptr);
void moe_combine(const ModelConfig& cfg, const BlockWeights& w, MoeActs& a, const Tensor& y, bool accumulate,
                 ExpertParallelOps* ep = nullptr);
// Both halves at once.
void moe_forward(const ModelConfig& cfg, const BlockWeights& w, const Tensor& x, MoeActs& a, const Tensor& y,
                 bool accumulate = false, ExpertParallelOps* ep = nullptr);

// dy: gradient of y. Writes (accumulate_dx: adds) the gradient of x to dx, and accumulates into
// gw's router and experts, including the router losses' gradient weighted by a.loss_weight.
// Also in two halves around the caller's work (the shared experts' backward).
void moe_backward_dispatch(const ModelConfig& cfg, MoeActs& a, MoeScratch& s, const Tensor& dy,
                           ExpertParallelOps* ep = nullptr);
void moe_backward_combine(const ModelConfig& cfg, const BlockWeights& w, const BlockWeights& gw, const Tensor& x,
                          MoeActs& a, MoeScratch& s, const Tensor& dx, bool accumulate_dx,
                          ExpertParallelOps* ep = nullptr);
void moe_backward(const ModelConfig& cfg, const BlockWeights& w, const BlockWeights& gw, const Tensor& x, MoeActs& a,
                  MoeScratch& s, const Tensor& dy, const Tensor& dx, bool accumulate_dx,
                  ExpertParallelOps* ep = nullptr);

// max/mean over experts of the tokens routed to each (1 when even; 0 when none were routed).
double load_max_over_mean(const std::vector<int64_t>& tokens_per_expert);

// Router statistics of the MoE layers over some forwards (a training step's micro-batches).
struct MoeLayerStats {
  int layer = -1;
  std::vector<int64_t> load;         // tokens routed per expert
  int64_t choices = 0, dropped = 0;  // tokens * top_k, and those over capacity
  double aux_sum = 0, z_sum = 0;     // summed over forwards
  int64_t forwards = 0;
  double load_max_over_mean() const;
  // Adds another forward's (or step's) statistics: loads, choices, drops and the loss sums.
  void add(const MoeLayerStats& o);
  double dropped_fraction() const { return choices ? double(dropped) / double(choices) : 0.0; }
  double aux() const { return forwards ? aux_sum / double(forwards) : 0.0; }
  double z() const { return forwards ? z_sum / double(forwards) : 0.0; }
};

// Every block's statistics as num_experts + 5 doubles (loads, choices, dropped, aux and z
// sums, forwards), to be summed over the ranks that route tokens, and back (unpacking also
// names each entry's block).
std::vector<double> pack_moe_stats(const ModelConfig& cfg, const std::vector<MoeLayerStats>& stats);
void unpack_moe_stats(const ModelConfig& cfg, const double* packed, std::vector<MoeLayerStats>& stats);

// Over all blocks: the worst block's load max/mean, the dropped share of all choices, the mean
// balance loss.
struct MoeSummary {
  double worst_load = 0, dropped_fraction = 0, aux = 0;
};
MoeSummary summarize_moe_stats(const std::vector<MoeLayerStats>& stats);

}  // namespace loom::model

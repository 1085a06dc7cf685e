// One stage of a pipeline-parallel model: runs this stage's list of schedule actions
// (pipeline_schedule.h) on its Decoder slice, receiving activations from the previous stage
// and gradients from the next one with asynchronous send/recv on the pp group, posted one
// transfer ahead so that transfers overlap computation. With v virtual stages the slice holds v
// chunks and the stages form a ring: the last stage's chunk c feeds the first stage's c + 1. Also
// keeps a tied token table identical on the first and last stages (their gradients are summed).
// Gradients accumulate through the decoder's ParamSource (the DataParallel engine); optimizer
// steps are the caller's.
#pragma once
#include <functional>
#include <map>
#include <vector>

#include "loom/comm/group.h"
#include "loom/model/decoder.h"
#include "loom/parallel/mesh.h"
#include "loom/parallel/partition.h"
#include "loom/parallel/pipeline_schedule.h"

namespace loom::parallel {

struct PipelineOptions {
  PipeSchedule schedule = PipeSchedule::one_f_one_b;
  int micro_batches = 1;
  // Chunks of blocks per stage (parallel.virtual_stages): > 1 runs interleaved 1F1B (zbv: 2), and
  // the decoder's slice must hold that many chunks (ModelSlice::later_chunks).
  int virtual_stages = 1;
  // The activations sent to the next stage and the gradients sent back (parallel.pp_dtype):
  // f32, or bf16/f16 (half the bytes; each is rounded to nearest even before it leaves and
  // widened to f32 on arrival, so the next stage starts from the rounded residual stream).
  DType wire_dtype = DType::f32;
  // Rows pack several documents (model::Decoder::stage_forward's positions): the fill function
  // gets a positions buffer to write, and every stage runs with them.
  bool packed_documents = false;
};

// What one step did on this stage.
struct PipelineStepStats {
  double loss_sum = 0;  // last stage: sum of token losses; elsewhere 0
  int64_t n_valid = 0;  // last stage: counted targets
  double wall_s = 0;    // the whole step on this stage
  // The stage's work: its passes (TP collectives included) and the copies into and out of the
  // transfer buffers that serve them. wall_s - busy_s is the time it was blocked on its peers:
  // the bubble.
  double busy_s = 0;
  double forward_s = 0, backward_s = 0;  // busy_s split by action kind (backward_s: the input-gradient
  double weight_s = 0;                   // passes of a split schedule, weight_s its weight passes)
  std::vector<double> action_s;          // each action's share of busy_s, in this stage's schedule order
  int max_in_flight = 0;                 // (chunk, micro-batch) pairs whose forward ran and backward had not
};

// The decoder slice of pipeline stage `stage`: its `chunks_per_stage` of `chunks` (the model's
// stages x chunks_per_stage block ranges, in model order) where `placement` puts them, the
// embeddings if it holds the model's first chunk and the head if it holds the last. Tensor,
// expert and LoRA fields keep their defaults.
model::ModelSlice stage_slice(const std::vector<StageRange>& chunks, int stage, int stages, int chunks_per_stage,
                              ChunkPlacement placement);

class PipelineStage {
 public:
  // Collective over mesh.world(): every rank constructs its stage at the same point (the
  // first and last stages of each pipeline form the tied-table group).
  PipelineStage(model::Decoder& model, const Mesh& mesh, const PipelineOptions& opt);

  // Fills micro-batch m's tokens and targets ([B, T] each), and its positions when the options
  // say packed_documents (null otherwise).
  using FillFn = std::function<void(int micro, int32_t* tokens, int32_t* targets, int32_t* positions)>;
  // Forward and backward of every micro-batch in schedule order; parameter gradients
  // accumulate as grad_scale * d(sum of token losses). before_backward(m) runs before each
  // backward (the caller turns on data-parallel reduction for the last one).
  PipelineStepStats train_step(const FillFn& fill, int64_t B, int64_t T, double grad_scale,
                               const std::function<void(int)>& before_backward = {});
  // Forward only, micro-batch after micro-batch; per micro-batch the loss sum and counted
  // targets (the last stage's; zeros elsewhere).
  std::vector<std::pair<double, int64_t>> evaluate(const FillFn& fill, int micro_batches, int64_t B, int64_t T);

  // After the data-parallel reduction: the first and last stages each add the other's
  // gradient of the tied token table (a no-op without tied embeddings or with one stage).
  // grads: the model's flat gradient buffer.
  void sync_tied_grads(const Tensor& grads);
  bool first() const { return stage_ == 0; }
  bool last() const { return stage_ == stages_ - 1; }
  // Whether this stage holds the embeddings (the model's first chunk) or the head (its last).
  bool holds_embedding() const { return !from(0).valid(); }
  bool holds_head() const { return !to(opt_.virtual_stages - 1).valid(); }
  int stage() const { return stage_; }
  int stages() const { return stages_; }
  const PipelineOptions& options() const { return opt_; }
  // Between steps: the next steps split the batch into m micro-batches (the schedule is rebuilt;
  // parallel.micro_batches=auto). Every stage of the pipeline must make the same change.
  void set_micro_batches(int m);
  // The most micro-batches a step can have: each (micro-batch, chunk) has two MPI tags.
  static int max_micro_batches(int virtual_stages) { return kMaxKeys / virtual_stages; }

 private:
  static constexpr int kMaxKeys = 16000;  // MPI guarantees tags up to 32767
  struct Transfer {
    Tensor buf;
    comm::Work work;
  };
  Tensor take_buffer(int64_t n, DType dt);
  Tensor wire_buffer() { return take_buffer(n_elems_, opt_.wire_dtype); }
  bool narrow() const { return opt_.wire_dtype != DType::f32; }
  // dst (f32) = a transfer buffer's values (widened from the wire type).
  void land(const Tensor& wire, const Tensor& dst);
  // A wire buffer holding src (narrowed to the wire type).
  Tensor pack(const Tensor& src);
  // Transfers are keyed by (micro-batch, chunk): micro * v + chunk. A transfer's tag is the
  // receiving action's key: an output goes to the chunk after it in the model, an input gradient
  // back to the chunk before it (chunk_output_to, chunk_input_from).
  int key_of(const PipeAction& a) const { return a.micro * opt_.virtual_stages + a.chunk; }
  int key_of(int micro, const ChunkAt& c) const { return micro * opt_.virtual_stages + c.chunk; }
  ChunkAt from(int chunk) const { return chunk_input_from(stage_, chunk, stages_, opt_.virtual_stages, placement_); }
  ChunkAt to(int chunk) const { return chunk_output_to(stage_, chunk, stages_, opt_.virtual_stages, placement_); }
  // Where a chunk's input comes from or its output goes (invalid: the embeddings, the head): a
  // neighbour on this stage (ZB-V's turn) exchanges in memory, another through the pp group.
  bool local(const ChunkAt& c) const { return c.valid() && c.stage == stage_; }
  bool remote(const ChunkAt& c) const { return c.valid() && c.stage != stage_; }
  void post_recv(std::map<int, Transfer>& into, int key, int peer, int kind);
  void wait_sends(bool all);

  model::Decoder& model_;
  comm::Group pp_, tied_;
  PipelineOptions opt_;
  int stage_, stages_;
  ChunkPlacement placement_;
  std::vector<StageActions> schedule_;
  std::vector<Tensor> pool_;                      // free [N, C] transfer buffers
  std::map<int, Transfer> act_recv_, grad_recv_;  // posted receives by key_of
  std::vector<Transfer> grad_sends_;              // gradient sends in flight (own buffers)
  // Activation sends: f32 straight from the slot's output (buf undefined), or a narrowed copy.
  std::map<int, Transfer> act_sends_;
  // Input gradients handed to this stage's own chunk (ZB-V's turn), by the receiving key.
  std::map<int, Tensor> local_grads_;
  int64_t n_elems_ = 0;
};

}  // namespace loom::parallel

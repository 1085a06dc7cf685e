// Pipeline schedules as data (ARCHITECTURE.md, invariant 5): for p stages and m micro-batches,
// each stage's ordered list of forward/backward actions (with v virtual stages, each action also
// names the chunk of blocks it runs). No communication here: the executor
// (pipeline.h) derives the sends and receives, and the tests check the lists directly. Also a
// dependency-driven simulator that replays a schedule with given action times (bubble figures).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace loom::parallel {

enum class PipeSchedule { gpipe, one_f_one_b, zero_bubble_h1, zero_bubble_v };
// "gpipe", "1f1b", "zb1p" or "zbv"; throws "[config] parallel.pp_schedule: ..." otherwise.
PipeSchedule pipe_schedule_from_name(const std::string& name);
const char* pipe_schedule_name(PipeSchedule s);

// backward: the whole backward of a micro-batch, or in a split schedule (zb1p) its input-gradient
// pass, whose weight-gradient pass is a `weight` action of its own.
struct PipeAction {
  enum class Kind : uint8_t { forward, backward, weight };
  Kind kind;
  int micro;
  // Schedules with several chunks per stage: which of the stage's chunks runs (model_chunk()
  // says which of the model's chunks that is); 0 otherwise.
  int chunk = 0;
  bool operator==(const PipeAction& o) const { return kind == o.kind && micro == o.micro && chunk == o.chunk; }
};
using StageActions = std::vector<PipeAction>;

// Where the model's p * v chunks of blocks live. loop (Megatron-LM's interleaved layout): chunk c
// of stage s is the model's chunk c * p + s, so a micro-batch passes every stage v times, in
// stage order each time. vee (ZB-V, v = 2): stage s holds the model's chunks s and 2p - 1 - s, so a
// micro-batch goes down the stages and back up; stage 0 holds both the embeddings and the head,
// and stage p - 1 hands its chunk 0's output to its own chunk 1.
enum class ChunkPlacement { loop, vee };
ChunkPlacement chunk_placement(PipeSchedule s);
// Chunks per stage the schedule needs: zbv 2, interleaved 1F1B v, the others 1.
int schedule_chunk_count(PipeSchedule s, int virtual_stages);
// The model's chunk that stage s's chunk c holds.
int model_chunk(int stage, int chunk, int stages, int chunks, ChunkPlacement placement);
// A stage's chunk: where a chunk's input comes from or its output goes (stage -1: nowhere, the
// embedding chunk's input and the head chunk's output).
struct ChunkAt {
  int stage = -1, chunk = -1;
  bool valid() const { return stage >= 0; }
};
ChunkAt chunk_input_from(int stage, int chunk, int stages, int chunks, ChunkPlacement placement);
ChunkAt chunk_output_to(int stage, int chunk, int stages, int chunks, ChunkPlacement placement);

// GPipe (Huang et al. 2019): all forwards, then all backwards in the same micro-batch order.
std::vector<StageActions> gpipe_schedule(int stages, int micro_batches);
// 1F1B, non-interleaved (Narayanan et al. 2021, PipeDream-Flush): stage s runs
// min(p - s - 1, m) warm-up forwards, then alternates one forward and one backward, then
// drains the remaining backwards; at most p - s micro-batches are in flight on stage s.
std::vector<StageActions> one_f_one_b_schedule(int stages, int micro_batches);
// Interleaved 1F1B (Narayanan et al. 2021, section 2.2; Megatron-LM's layout): each stage holds
// v chunks, model chunk c * p + s on stage s, so a micro-batch passes every stage v times. In
// units of one chunk's work the stage runs forwards k = 0, 1, ... of micro-batch
// (k / (p v)) p + k % p in chunk (k / p) % v (groups of p micro-batches per chunk), backwards
// likewise with the chunks reversed; 2 (p - s - 1) + (v - 1) p warm-up forwards, then one
// forward and one backward alternate. m must be a multiple of p. Bubble (p - 1) / (v m + p - 1).
// v = 1 is one_f_one_b_schedule.
std::vector<StageActions> interleaved_schedule(int stages, int micro_batches, int virtual_stages);
// ZB-H1 (Qi et al. 2023, "Zero Bubble Pipeline Parallelism", section 3.1): 1F1B's order of forwards
// and input-gradient passes; stage s runs the weight-gradient pass of micro-batch i after the
// input-gradient pass of micro-batch i + s, and the rest at the end, where they fill the drain.
// Every stage then keeps at most p micro-batches between forward and weight pass (1F1B's peak,
// that of its stage 0), and with equal forward, input- and weight-gradient times the bubble is a
// third of 1F1B's: (p - 1) of those times per stage instead of 3 (p - 1).
std::vector<StageActions> zero_bubble_h1_schedule(int stages, int micro_batches);
// ZB-V (Qi et al. 2024, "Pipeline Parallelism with Controllable Memory"): the vee placement, the
// backward split into input- and weight-gradient passes as in ZB-H1, and every stage keeping at
// most 2p chunk activation sets between a forward and its weight pass: p sets of a whole
// stage's blocks, 1F1B's peak (stage 0, which also holds the head's buffers, 2p - 1 where that
// costs no idle time; it can with an odd m). The order is built by a list scheduler: it replays the pipeline
// with given pass times and, whenever a stage is free, starts the pass that can start first,
// breaking ties by a priority among forward, input-gradient and weight passes; a forward waits
// while the stage is at its activation limit. A handful of priorities and nominal pass times are
// tried, and the order whose worst idle over a set of pass-time ratios (equal passes, and input-
// gradient passes up to 1.7x the weight pass's) is least is kept. The result depends on p and m
// only; with equal passes each stage idles about (p - 1) chunk forwards, a sixth of 1F1B's
// bubble. Needs p >= 2.
std::vector<StageActions> zero_bubble_v_schedule(int stages, int micro_batches);
// virtual_stages > 1 needs kind == one_f_one_b (the interleaved schedule); zbv ignores it (2 chunks).
std::vector<StageActions> make_schedule(PipeSchedule kind, int stages, int micro_batches, int virtual_stages = 1);
// Throws "[config] parallel.virtual_stages=..." naming the key and the fix when v virtual stages
// cannot run: no pipeline, GPipe, an n_layer that p * v chunks do not divide, or m not a
// multiple of p.
void check_virtual_stages(PipeSchedule kind, int stages, int micro_batches, int virtual_stages, int n_layer);

// "" when every stage runs each (chunk, micro-batch)'s forward once, then its backward once (and,
// in a split schedule, then its weight pass once), and the whole schedule can execute (no stage
// waits for an action that can never run); otherwise what is wrong.
std::string check_schedule(const std::vector<StageActions>& schedule, int micro_batches,
                           ChunkPlacement placement = ChunkPlacement::loop);
// Largest number of (chunk, micro-batch) pairs whose forward has run and backward (in a split
// schedule: weight pass) has not, on one stage: how many activation sets the stage keeps at once
// (each of one chunk's blocks).
int max_in_flight(const StageActions& actions);
// Whether the schedule splits backwards into input- and weight-gradient passes.
bool splits_backward(const std::vector<StageActions>& schedule);
// The chunks per stage the schedule uses (1 + the largest chunk named).
int schedule_chunks(const std::vector<StageActions>& schedule);

// Replays a schedule as soon as dependencies allow: a chunk's forward of micro-batch i after the
// forward of the chunk before it in the model (chunk_input_from); its backward after the backward
// of the chunk after it (chunk_output_to), the head chunk's after its own forward; each stage runs
// its actions in order; W(s, c, i) after B(s, c, i). An activation or gradient that goes to another
// stage arrives transfer seconds after the action that made it (0: communication is free); one that
// stays on its stage (ZB-V's turn) at once. Times are per action of each stage (forward_time[s],
// backward_time[s], weight_time[s]: one chunk's work); weight_time is needed for split schedules only.
struct Timeline {
  double makespan = 0;
  std::vector<double> busy;                   // per stage: seconds computing
  std::vector<double> idle_fraction() const;  // (makespan - busy) / makespan per stage
  // Start time of every action, per stage, in schedule order.
  std::vector<std::vector<double>> start;
};
Timeline simulate_schedule(const std::vector<StageActions>& schedule, const std::vector<double>& forward_time,
                           const std::vector<double>& backward_time, const std::vector<double>& weight_time = {},
                           ChunkPlacement placement = ChunkPlacement::loop, double transfer = 0);
// The same with each action's own time: action_time[s][k] for schedule[s][k] (a step's measured
// actions, PipelineStepStats::action_s), so that a replay sees the step's uneven passes too.
Timeline replay_schedule(const std::vector<StageActions>& schedule, const std::vector<std::vector<double>>& action_time,
                         ChunkPlacement placement = ChunkPlacement::loop, double transfer = 0);

// The idle fraction of GPipe and 1F1B with equal stages, (p - 1) / (m + p - 1); of interleaved
// 1F1B with v virtual stages, (p - 1) / (v m + p - 1).
double bubble_fraction(int stages, int micro_batches, int virtual_stages = 1);
// ZB-H1's with equal forward, input-gradient and weight-gradient passes: (p - 1) / (3 m + p - 1).
double zero_bubble_h1_fraction(int stages, int micro_batches);
// ZB-V's with equal passes: no closed form (its order comes from a search), so the idle fraction
// of its own schedule replayed with equal forward, input- and weight-gradient passes.
double zero_bubble_v_fraction(int stages, int micro_batches);
// The schedule's formula: one of the three above.
double predicted_bubble(PipeSchedule kind, int stages, int micro_batches, int virtual_stages = 1);
// That formula for a reader: "(p-1)/(m+p-1)", "(p-1)/(vm+p-1)", "(p-1)/(3m+p-1)", or ZB-V's
// "its schedule replayed with equal F, B and W passes".
const char* bubble_formula(PipeSchedule kind, int virtual_stages = 1);

}  // namespace loom::parallel

#include "loom/parallel/partition_profile.h"

#include <algorithm>
#include <vector>

#include "loom/core/stats.h"
#include "loom/core/timer.h"
#include "loom/model/decoder.h"

namespace loom::parallel {

namespace {

// One piece as a pipeline stage of its own: forward + backward of one micro-batch.
double time_piece(const model::ModelConfig& cfg, const model::ModelSlice& slice, int64_t B, int64_t T, int reps) {
  model::DecoderOptions o;
  o.slice = slice;
  model::Decoder d(cfg, o);
  d.init_weights(1);
  const int64_t N = B * T;
  std::vector<int32_t> tok(static_cast<size_t>(N)), tgt(static_cast<size_t>(N));
  for (int64_t i = 0; i < N; ++i) {
    tok[size_t(i)] = int32_t((i * 7919) % cfg.vocab_size);
    tgt[size_t(i)] = int32_t((i * 104729 + 1) % cfg.vocab_size);
  }
  Tensor dy = Tensor::zeros({N, cfg.d_model}, DType::f32, MemCategory::workspace);
  for (int64_t i = 0; i < dy.numel(); i += 3) dy.data<float>()[i] = 1e-3f;
  std::vector<double> times;
  for (int r = 0; r <= reps; ++r) {
    const int id = d.stage_begin(B, T, true);
    if (!slice.has_embedding) d.stage_input(id).copy_from(dy);  // any finite input will do
    Stopwatch sw;
    d.stage_forward(id, tok.data(), tgt.data(), 1.0 / double(N));
    d.stage_backward(id, slice.has_head ? Tensor{} : dy);
    if (r > 0) times.push_back(sw.seconds());  // the first run allocates and warms up
  }
  return median(std::move(times));
}

}  // namespace

PartitionCosts profile_costs(const model::ModelConfig& cfg, int64_t B, int64_t T, int reps) {
  LOOM_CHECK(reps >= 1, "pipeline", "profiling needs at least one timed run, got ", reps);
  PartitionCosts c;
  const int L = int(cfg.n_layer);
  c.embedding = time_piece(cfg, {0, 0, true, false}, B, T, reps);
  for (int l = 0; l < L; ++l) c.block.push_back(time_piece(cfg, {l, l + 1, false, false}, B, T, reps));
  c.head = time_piece(cfg, {L, L, false, true}, B, T, reps);
  return c;
}

}  // namespace loom::parallel

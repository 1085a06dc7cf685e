#include "loom/parallel/pipeline.h"

#include <algorithm>

#include "loom/core/timer.h"
#include "loom/core/trace.h"
#include "loom/kernels/ops.h"

namespace loom::parallel {

namespace {
// Activations (kind 0) and gradients (kind 1) of a (micro-batch, chunk) key get their own tags.
int tag_of(int key, int kind) { return key * 2 + kind; }

// Times one action of the schedule. Its pass and the copies into and out of the transfer buffers
// that serve it are the stage's work; the time blocked on a peer is not (that is the bubble).
class ActionClock {
 public:
  // Waits for a transfer, traced as `what` (micro-batch, chunk, peer) and not counted as work.
  void wait(const comm::Work& w, const char* what, int micro, int chunk, int peer) {
    trace::Span span(what, "wait", {{"micro", micro}, {"chunk", chunk}, {"peer", peer}});
    Stopwatch sw;
    w.wait();
    waited_ += sw.seconds();
  }
  double busy() const { return clock_.seconds() - waited_; }

 private:
  Stopwatch clock_;
  double waited_ = 0;
};
}  // namespace

model::ModelSlice stage_slice(const std::vector<StageRange>& chunks, int stage, int stages, int v,
                              ChunkPlacement placement) {
  LOOM_CHECK(int(chunks.size()) == stages * v, "pipeline", stages, " stages of ", v, " chunk(s) each need ", stages * v,
             " block ranges, got ", chunks.size());
  auto chunk = [&](int c) { return chunks[size_t(model_chunk(stage, c, stages, v, placement))]; };
  model::ModelSlice slice;
  slice.first_layer = chunk(0).first_layer;
  slice.last_layer = chunk(0).last_layer;
  slice.has_embedding = !chunk_input_from(stage, 0, stages, v, placement).valid();
  slice.has_head = !chunk_output_to(stage, v - 1, stages, v, placement).valid();
  for (int c = 1; c < v; ++c) slice.later_chunks.push_back({chunk(c).first_layer, chunk(c).last_layer});
  return slice;
}

PipelineStage::PipelineStage(model::Decoder& model, const Mesh& mesh, const PipelineOptions& opt)
    : model_(model),
      pp_(mesh.pp()),
      opt_(opt),
      stage_(int(mesh.coord().pp)),
      stages_(int(mesh.shape().size(Dim::pp))),
      placement_(chunk_placement(opt.schedule)) {
  LOOM_CHECK(opt.virtual_stages >= 1 && model.num_chunks() == opt.virtual_stages, "pipeline", "stage ", stage_,
             " holds ", model.num_chunks(), " chunk(s) of blocks but the schedule runs ", opt.virtual_stages);
  set_micro_batches(opt.micro_batches);
  const auto& slice = model.layout().slice();
  LOOM_CHECK(slice.has_embedding == holds_embedding() && slice.has_head == holds_head(), "pipeline", "stage ", stage_,
             " of ", stages_, " was built with has_embedding=", slice.has_embedding, " has_head=", slice.has_head,
             " but ", pipe_schedule_name(opt.schedule), " gives it the embeddings: ", holds_embedding(),
             ", the head: ", holds_head());
  // Under LoRA the token table is frozen (no gradient to share between the stages holding it).
  // ZB-V's first stage holds both ends: one table.
  if (model.config().tied_embeddings && stages_ > 1 && !model.lora() && placement_ == ChunkPlacement::loop) {
    // Every rank takes part in the split; the first and last stage of each pipeline pair up.
    MeshCoord c = mesh.coord();
    int color = -1;
    if (first() || last()) {
      c.pp = 0;
      color = int(mesh.shape().rank_of(c));
    }
    tied_ = mesh.world().split(color, stage_, "tied_embedding");
  }
}

void PipelineStage::set_micro_batches(int m) {
  LOOM_CHECK(
      act_recv_.empty() && grad_recv_.empty() && act_sends_.empty() && grad_sends_.empty() && local_grads_.empty(),
      "pipeline", "the micro-batch count changes between steps, not with transfers in flight");
  const int max_micro = max_micro_batches(opt_.virtual_stages);
  LOOM_CHECK(m >= 1 && m <= max_micro, "pipeline", "parallel.micro_batches=", m, " must be between 1 and ", max_micro);
  schedule_ = make_schedule(opt_.schedule, stages_, m, opt_.virtual_stages);
  opt_.micro_batches = m;
  pool_.clear();  // wire buffers of the old micro-batch size
}

Tensor PipelineStage::take_buffer(int64_t n, DType dt) {
  for (size_t i = 0; i < pool_.size(); ++i)
    if (pool_[i].numel() == n && pool_[i].dtype() == dt) {
      Tensor t = pool_[i];
      pool_.erase(pool_.begin() + long(i));
      return t;
    }
  return Tensor::empty({n}, dt, MemCategory::comm);
}

void PipelineStage::land(const Tensor& wire, const Tensor& dst) {
  if (narrow())
    ops::widen_from_16(wire, dst);
  else
    dst.copy_from(wire.view(dst.shape()));
}

Tensor PipelineStage::pack(const Tensor& src) {
  Tensor buf = wire_buffer();
  if (narrow())
    ops::narrow_to_16(src, buf);
  else
    buf.view(src.shape()).copy_from(src);
  return buf;
}

void PipelineStage::post_recv(std::map<int, Transfer>& into, int key, int peer, int kind) {
  Transfer t;
  t.buf = wire_buffer();
  t.work = pp_.recv_async(t.buf, peer, tag_of(key, kind));
  into[key] = std::move(t);
}

void PipelineStage::wait_sends(bool all) {
  for (auto it = grad_sends_.begin(); it != grad_sends_.end();) {
    if (all) it->work.wait();
    if (all || it->work.test()) {
      it->work.wait();  // rethrows a failed send
      pool_.push_back(it->buf);
      it = grad_sends_.erase(it);
    } else {
      ++it;
    }
  }
  if (all) {
    for (auto& [m, t] : act_sends_) {
      t.work.wait();
      if (t.buf.defined()) pool_.push_back(t.buf);
    }
    act_sends_.clear();
  }
}

PipelineStepStats PipelineStage::train_step(const FillFn& fill, int64_t B, int64_t T, double grad_scale,
                                            const std::function<void(int)>& before_backward) {
  using Kind = PipeAction::Kind;
  Stopwatch wall;
  PipelineStepStats st;
  const int M = opt_.micro_batches;
  n_elems_ = B * T * model_.config().d_model;
  std::vector<std::vector<int32_t>> tok(static_cast<size_t>(M)), tgt(static_cast<size_t>(M)),
      pos(static_cast<size_t>(M));
  std::vector<int> slot(size_t(M * opt_.virtual_stages), -1);
  // The receives in the order this stage consumes them; each is posted when the one before it
  // is consumed, so the next transfer travels while the current action computes.
  const StageActions& actions = schedule_[size_t(stage_)];
  st.action_s.reserve(actions.size());
  const bool split = splits_backward(schedule_);  // zb1p, zbv: weight passes are actions of their own
  std::vector<PipeAction> act_in, grad_in;
  for (const PipeAction& a : actions) {
    if (a.kind == Kind::forward && remote(from(a.chunk))) act_in.push_back(a);
    if (a.kind == Kind::backward && remote(to(a.chunk))) grad_in.push_back(a);
  }
  size_t next_act = 0, next_grad = 0;
  auto post_next_act = [&] {
    if (next_act >= act_in.size()) return;
    const PipeAction& a = act_in[next_act++];
    post_recv(act_recv_, key_of(a), from(a.chunk).stage, 0);
  };
  auto post_next_grad = [&] {
    if (next_grad >= grad_in.size()) return;
    const PipeAction& a = grad_in[next_grad++];
    post_recv(grad_recv_, key_of(a), to(a.chunk).stage, 1);
  };
  model_.begin_pass(true);
  post_next_act();
  post_next_grad();
  int live = 0;
  for (const PipeAction& a : actions) {
    const int m = a.micro, key = key_of(a);
    const size_t mi = size_t(m);
    ActionClock clock;
    if (a.kind == Kind::forward) {
      if (a.chunk == 0) {  // a micro-batch's first forward on this stage
        tok[mi].resize(size_t(B * T));
        tgt[mi].resize(size_t(B * T));
        if (opt_.packed_documents) pos[mi].resize(size_t(B * T));
        fill(m, tok[mi].data(), tgt[mi].data(), opt_.packed_documents ? pos[mi].data() : nullptr);
      }
      slot[size_t(key)] = model_.stage_begin(B, T, true, a.chunk);
      if (const ChunkAt src = from(a.chunk); local(src)) {
        // Its own chunk's output, kept in that chunk's slot until the chunk's backward.
        model_.stage_input(slot[size_t(key)]).copy_from(model_.stage_output(slot[size_t(key_of(m, src))]));
      } else if (remote(src)) {
        post_next_act();
        Transfer& in = act_recv_.at(key);
        clock.wait(in.work, "wait recv activation", m, a.chunk, src.stage);
        land(in.buf, model_.stage_input(slot[size_t(key)]));
        pool_.push_back(in.buf);
        act_recv_.erase(key);
      }
      int64_t n = 0;
      {
        trace::Span span("forward micro-batch", "compute", {{"micro", m}, {"chunk", a.chunk}});
        st.loss_sum += model_.stage_forward(slot[size_t(key)], tok[mi].data(), tgt[mi].data(), grad_scale, &n,
                                            opt_.packed_documents ? pos[mi].data() : nullptr);
      }
      st.n_valid += n;
      if (const ChunkAt dst = to(a.chunk); remote(dst)) {
        const Tensor y = model_.stage_output(slot[size_t(key)]);
        Transfer out;
        if (narrow()) out.buf = pack(y);
        out.work = pp_.send_async(out.buf.defined() ? out.buf : y, dst.stage, tag_of(key_of(m, dst), 0));
        act_sends_[key] = std::move(out);
      }
      st.action_s.push_back(clock.busy());
      st.forward_s += st.action_s.back();
      st.max_in_flight = std::max(st.max_in_flight, ++live);
    } else if (a.kind == Kind::weight) {
      if (before_backward) before_backward(m);  // the blocks' gradients are complete after it
      {
        trace::Span span("weight gradients micro-batch", "compute", {{"micro", m}, {"chunk", a.chunk}});
        model_.stage_backward_weights(slot[size_t(key)]);
      }
      st.action_s.push_back(clock.busy());
      st.weight_s += st.action_s.back();
      --live;
    } else {
      if (before_backward) before_backward(m);
      Tensor dy;
      if (const ChunkAt dst = to(a.chunk); local(dst)) {
        dy = local_grads_.at(key);
        local_grads_.erase(key);
      } else if (remote(dst)) {
        post_next_grad();
        Transfer& g = grad_recv_.at(key);
        clock.wait(g.work, "wait recv gradient", m, a.chunk, dst.stage);
        if (narrow()) {
          dy = take_buffer(n_elems_, DType::f32);
          ops::widen_from_16(g.buf, dy);
          pool_.push_back(g.buf);
        } else {
          dy = g.buf;
        }
        grad_recv_.erase(key);
        // The slot's output must not be overwritten while it is still being sent.
        Transfer& sent = act_sends_.at(key);
        clock.wait(sent.work, "wait send activation", m, a.chunk, dst.stage);
        if (sent.buf.defined()) pool_.push_back(sent.buf);
        act_sends_.erase(key);
      }
      const int id = slot[size_t(key)];
      {
        trace::Span span("backward micro-batch", "compute", {{"micro", m}, {"chunk", a.chunk}});
        const Tensor g = dy.defined() ? dy.view(model_.stage_output(id).shape()) : dy;
        if (split)
          model_.stage_backward_input(id, g);
        else
          model_.stage_backward(id, g);
      }
      if (dy.defined()) pool_.push_back(dy);
      if (const ChunkAt src = from(a.chunk); local(src)) {
        Tensor g = take_buffer(n_elems_, DType::f32);  // the decoder's buffer changes with the next backward
        g.copy_from(model_.stage_input_grad().view({n_elems_}));
        local_grads_[key_of(m, src)] = g;
      } else if (remote(src)) {
        Transfer out;
        out.buf = pack(model_.stage_input_grad());
        out.work = pp_.send_async(out.buf, src.stage, tag_of(key_of(m, src), 1));
        grad_sends_.push_back(std::move(out));
        wait_sends(false);
      }
      st.action_s.push_back(clock.busy());
      st.backward_s += st.action_s.back();
      if (!split) --live;
    }
  }
  {
    trace::Span wait("wait pipeline sends", "wait");
    wait_sends(true);
  }
  model_.end_pass(true);
  st.busy_s = st.forward_s + st.backward_s + st.weight_s;
  st.wall_s = wall.seconds();
  return st;
}

std::vector<std::pair<double, int64_t>> PipelineStage::evaluate(const FillFn& fill, int micro_batches, int64_t B,
                                                                int64_t T) {
  const int64_t N = B * T;
  n_elems_ = N * model_.config().d_model;
  std::vector<int32_t> tok(static_cast<size_t>(N)), tgt(static_cast<size_t>(N));
  std::vector<int32_t> pos(opt_.packed_documents ? size_t(N) : 0);
  int32_t* positions = opt_.packed_documents ? pos.data() : nullptr;
  std::vector<std::pair<double, int64_t>> out;
  model_.begin_pass(false);
  // Micro-batch after micro-batch, each through every chunk in model order: one chain of
  // blocking transfers that every stage walks in the same order.
  for (int m = 0; m < micro_batches; ++m) {
    fill(m, tok.data(), tgt.data(), positions);
    double sum = 0;
    int64_t counted = 0;
    Tensor handed;  // ZB-V's turn: chunk 0's output for chunk 1 on this stage
    for (int c = 0; c < opt_.virtual_stages; ++c) {
      const int id = model_.stage_begin(B, T, false, c);
      if (const ChunkAt src = from(c); local(src)) {
        model_.stage_input(id).copy_from(handed.view(model_.stage_input(id).shape()));
        pool_.push_back(handed);
      } else if (remote(src)) {
        Tensor in = wire_buffer();
        pp_.recv(in, src.stage, tag_of(key_of(m, {stage_, c}), 0));
        land(in, model_.stage_input(id));
        pool_.push_back(in);
      }
      int64_t n = 0;
      sum += model_.stage_forward(id, tok.data(), tgt.data(), 1.0, &n, positions);
      counted += n;
      if (const ChunkAt dst = to(c); local(dst)) {
        handed = take_buffer(n_elems_, DType::f32);
        handed.copy_from(model_.stage_output(id).view({n_elems_}));
      } else if (remote(dst)) {
        Tensor sent = pack(model_.stage_output(id));
        pp_.send(sent, dst.stage, tag_of(key_of(m, dst), 0));
        pool_.push_back(sent);
      }
      model_.stage_release(id);
    }
    out.push_back({sum, counted});
  }
  model_.end_pass(false);
  return out;
}

void PipelineStage::sync_tied_grads(const Tensor& grads) {
  if (!tied_.valid()) return;
  const auto& p = model_.layout().get(model::token_table_name(model_.config()));
  tied_.all_reduce(grads.slice(p.offset, {p.numel()}));
}

}  // namespace loom::parallel

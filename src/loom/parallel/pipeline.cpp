#include "loom/parallel/pipeline.h"

#include <algorithm>

#include "loom/core/timer.h"
#include "loom/core/trace.h"
#include "loom/kernels/ops.h"

namespace loom::parallel {

namespace {
// Activations (kind 0) and gradients (kind 1) of a micro-batch get their own tags. MPI
// guarantees tags up to 32767.
constexpr int kMaxMicroBatches = 16000;
int tag_of(int micro, int kind) { return micro * 2 + kind; }
}  // namespace

PipelineStage::PipelineStage(model::Decoder& model, const Mesh& mesh, const PipelineOptions& opt)
    : model_(model), pp_(mesh.pp()), opt_(opt), stage_(int(mesh.coord().pp)), stages_(int(mesh.shape().size(Dim::pp))) {
  LOOM_CHECK(opt.micro_batches >= 1 && opt.micro_batches <= kMaxMicroBatches, "pipeline",
             "parallel.micro_batches=", opt.micro_batches, " must be between 1 and ", kMaxMicroBatches);
  schedule_ = make_schedule(opt.schedule, stages_, opt.micro_batches);
  const auto& slice = model.layout().slice();
  LOOM_CHECK(slice.has_embedding == first() && slice.has_head == last(), "pipeline", "stage ", stage_, " of ", stages_,
             " was built with has_embedding=", slice.has_embedding, " has_head=", slice.has_head,
             "; the first stage holds the embeddings, the last the head");
  // Under LoRA the token table is frozen (no gradient to share between the stages holding it).
  if (model.config().tied_embeddings && stages_ > 1 && !model.lora()) {
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

void PipelineStage::post_recv(std::map<int, Transfer>& into, int micro, int peer, int kind) {
  Transfer t;
  t.buf = wire_buffer();
  t.work = pp_.recv_async(t.buf, peer, tag_of(micro, kind));
  into[micro] = std::move(t);
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
  std::vector<int> slot(size_t(M), -1);
  model_.begin_pass(true);
  if (!first()) post_recv(act_recv_, 0, stage_ - 1, 0);
  if (!last()) post_recv(grad_recv_, 0, stage_ + 1, 1);
  int live = 0;
  for (const PipeAction& a : schedule_[size_t(stage_)]) {
    const int m = a.micro;
    const size_t mi = size_t(m);
    if (a.kind == Kind::forward) {
      // The next micro-batch's input travels while this one computes.
      if (!first() && m + 1 < M) post_recv(act_recv_, m + 1, stage_ - 1, 0);
      tok[mi].resize(size_t(B * T));
      tgt[mi].resize(size_t(B * T));
      if (opt_.packed_documents) pos[mi].resize(size_t(B * T));
      fill(m, tok[mi].data(), tgt[mi].data(), opt_.packed_documents ? pos[mi].data() : nullptr);
      slot[mi] = model_.stage_begin(B, T, true);
      if (!first()) {
        Transfer& in = act_recv_.at(m);
        {
          trace::Span wait("wait recv activation", "wait", {{"micro", m}, {"peer", stage_ - 1}});
          in.work.wait();
        }
        land(in.buf, model_.stage_input(slot[mi]));
        pool_.push_back(in.buf);
        act_recv_.erase(m);
      }
      Stopwatch sw;
      int64_t n = 0;
      {
        trace::Span span("forward micro-batch", "compute", {{"micro", m}});
        st.loss_sum += model_.stage_forward(slot[mi], tok[mi].data(), tgt[mi].data(), grad_scale, &n,
                                            opt_.packed_documents ? pos[mi].data() : nullptr);
      }
      st.forward_s += sw.seconds();
      st.n_valid += n;
      if (!last()) {
        Transfer out;
        if (narrow()) out.buf = pack(model_.stage_output(slot[mi]));
        out.work =
            pp_.send_async(out.buf.defined() ? out.buf : model_.stage_output(slot[mi]), stage_ + 1, tag_of(m, 0));
        act_sends_[m] = std::move(out);
      }
      st.max_in_flight = std::max(st.max_in_flight, ++live);
    } else {
      if (!last() && m + 1 < M) post_recv(grad_recv_, m + 1, stage_ + 1, 1);
      if (before_backward) before_backward(m);
      Tensor dy;
      if (!last()) {
        Transfer& g = grad_recv_.at(m);
        {
          trace::Span wait("wait recv gradient", "wait", {{"micro", m}, {"peer", stage_ + 1}});
          g.work.wait();
        }
        if (narrow()) {
          dy = take_buffer(n_elems_, DType::f32);
          ops::widen_from_16(g.buf, dy);
          pool_.push_back(g.buf);
        } else {
          dy = g.buf;
        }
        grad_recv_.erase(m);
        // The slot's output must not be overwritten while it is still being sent.
        trace::Span wait("wait send activation", "wait", {{"micro", m}, {"peer", stage_ + 1}});
        Transfer& sent = act_sends_.at(m);
        sent.work.wait();
        if (sent.buf.defined()) pool_.push_back(sent.buf);
        act_sends_.erase(m);
      }
      Stopwatch sw;
      {
        trace::Span span("backward micro-batch", "compute", {{"micro", m}});
        model_.stage_backward(slot[mi], dy.defined() ? dy.view(model_.stage_output(slot[mi]).shape()) : dy);
      }
      st.backward_s += sw.seconds();
      if (dy.defined()) pool_.push_back(dy);
      if (!first()) {
        Transfer out;
        out.buf = pack(model_.stage_input_grad());
        out.work = pp_.send_async(out.buf, stage_ - 1, tag_of(m, 1));
        grad_sends_.push_back(std::move(out));
        wait_sends(false);
      }
      --live;
    }
  }
  {
    trace::Span wait("wait pipeline sends", "wait");
    wait_sends(true);
  }
  model_.end_pass(true);
  st.busy_s = st.forward_s + st.backward_s;
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
  for (int m = 0; m < micro_batches; ++m) {
    fill(m, tok.data(), tgt.data(), positions);
    const int id = model_.stage_begin(B, T, false);
    if (!first()) {
      Tensor in = wire_buffer();
      pp_.recv(in, stage_ - 1, tag_of(m, 0));
      land(in, model_.stage_input(id));
      pool_.push_back(in);
    }
    int64_t n = 0;
    const double sum = model_.stage_forward(id, tok.data(), tgt.data(), 1.0, &n, positions);
    out.push_back({sum, n});
    if (!last()) {
      Tensor sent = pack(model_.stage_output(id));
      pp_.send(sent, stage_ + 1, tag_of(m, 0));
      pool_.push_back(sent);
    }
    model_.stage_release(id);
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

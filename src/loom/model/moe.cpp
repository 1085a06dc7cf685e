#include "loom/model/moe.h"

#include <algorithm>
#include <cmath>

#include "loom/core/timer.h"
#include "loom/kernels/cpu/moe_routing.h"
#include "loom/kernels/ops.h"
#include "loom/model/block.h"
#include "loom/model/moe_router.h"

namespace loom::model {

MoeActs MoeActs::allocate(const ModelConfig& cfg, int64_t N, DType dt, Allocator& alloc, MemCategory cat) {
  const int64_t E = cfg.moe.num_experts, k = cfg.moe.top_k, C = cfg.d_model, F = cfg.expert_d_ff();
  const int64_t G = cfg.traits().mlp_fan_out();
  MoeActs a;
  a.logits = Tensor::empty({N, E}, dt, cat, alloc);
  a.scores = Tensor::empty({N, E}, dt, cat, alloc);
  a.topk = Tensor::empty({N, k}, DType::i32, cat, alloc);
  a.gates = Tensor::empty({N, k}, dt, cat, alloc);
  a.row_of = Tensor::empty({N, k}, DType::i32, cat, alloc);
  a.choice_of = Tensor::empty({N * k}, DType::i32, cat, alloc);
  a.fc = Tensor::empty({N * k, G * F}, dt, cat, alloc);
  a.act = Tensor::empty({N * k, F}, dt, cat, alloc);
  a.eout = Tensor::empty({N * k, C}, dt, cat, alloc);
  a.offsets.assign(size_t(E + 1), 0);
  a.load.assign(size_t(E), 0);
  return a;
}

int64_t MoeActs::bytes() const {
  int64_t b = 0;
  for (const Tensor* t : {&logits, &scores, &topk, &gates, &row_of, &choice_of, &fc, &act, &eout})
    if (t->defined()) b += int64_t(t->nbytes());
  return b;
}

MoeScratch MoeScratch::allocate(const ModelConfig& cfg, int64_t N, DType dt, Allocator& alloc) {
  const int64_t E = cfg.moe.num_experts, k = cfg.moe.top_k, C = cfg.d_model, F = cfg.expert_d_ff();
  const int64_t G = cfg.traits().mlp_fan_out();
  const auto cat = MemCategory::workspace;
  MoeScratch s;
  s.rows = Tensor::empty({N * k, C}, dt, cat, alloc);
  s.dout = Tensor::empty({N * k, C}, dt, cat, alloc);
  s.dfc = Tensor::empty({N * k, G * F}, dt, cat, alloc);
  s.dact = Tensor::empty({N * k, F}, dt, cat, alloc);
  s.dlogits = Tensor::empty({N, E}, dt, cat, alloc);
  s.dgate = Tensor::empty({N * k}, dt, cat, alloc);
  return s;
}

namespace {

// (Re)sizes a per-call buffer to at least rows x cols and returns the [rows, cols] view.
Tensor sized(Tensor& t, int64_t rows, int64_t cols, DType dt, MemCategory cat) {
  const int64_t need = std::max<int64_t>(rows, 1) * cols;
  if (!t.defined() || t.numel() < need || t.dtype() != dt) t = Tensor::empty({need}, dt, cat);
  return t.slice(0, {rows, cols});
}

bool distributed(const ExpertParallelOps* ep) { return ep && ep->size() > 1; }

// Copies rows m in [m0, m1): dst[m] = src[perm[m]] (gather) or dst[perm[m]] = src[m] (scatter).
template <class T>
void permute_rows(const T* src, T* dst, int64_t C, const std::vector<int32_t>& perm, bool scatter, int64_t m0 = 0,
                  int64_t m1 = -1) {
  if (m1 < 0) m1 = int64_t(perm.size());
#pragma omp parallel for schedule(static) if ((m1 - m0) * C > 32768)
  for (int64_t m = m0; m < m1; ++m) {
    const T* a = scatter ? src + m * C : src + int64_t(perm[size_t(m)]) * C;
    T* b = scatter ? dst + int64_t(perm[size_t(m)]) * C : dst + m * C;
    std::copy(a, a + C, b);
  }
}

// One expert's MLP over n rows: fc, activation, out (out may alias rows).
void expert_forward(const ExpertWeights& ew, const Tensor& rows, const Tensor& fc, const Tensor& act, const Tensor& out,
                    bool gelu, ops::ProductPrecision prec) {
  ops::linear_forward(rows, ew.fc_w, ew.fc_b, fc, prec);
  if (gelu)
    ops::gelu_forward(fc, act);
  else
    ops::swiglu_forward(fc, act);
  ops::linear_forward(act, ew.out_w, ew.out_b, out, prec);
}

// Its backward: dout -> weight gradients (added into *gew; none when gew is null) and, into
// drows (may alias dout unless gew is null), the rows' gradient.
void expert_backward(const ExpertWeights& ew, const ExpertWeights* gew, const Tensor& rows, const Tensor& fc,
                     const Tensor& act, const Tensor& dout, const Tensor& dfc, const Tensor& dact, const Tensor& drows,
                     bool gelu, ops::ProductPrecision prec) {
  const Tensor none;
  ops::linear_backward(dout, act, ew.out_w, dact, gew ? gew->out_w : none, gew ? gew->out_b : none, false, prec);
  if (gelu)
    ops::gelu_backward(fc, dact, dfc);
  else
    ops::swiglu_backward(fc, dact, dfc);
  ops::linear_backward(dfc, rows, ew.fc_w, drows, gew ? gew->fc_w : none, gew ? gew->fc_b : none, false, prec);
}

// The weight gradients expert_backward(ew, nullptr, ...) left out, from its dout and dfc: the
// same products, so the same values.
void expert_weight_grads(const ExpertWeights& ew, const ExpertWeights& gew, const Tensor& rows, const Tensor& act,
                         const Tensor& dout, const Tensor& dfc, ops::ProductPrecision prec) {
  ops::linear_backward(dout, act, ew.out_w, {}, gew.out_w, gew.out_b, false, prec);
  ops::linear_backward(dfc, rows, ew.fc_w, {}, gew.fc_w, gew.fc_b, false, prec);
}

struct Timed {  // adds the scope's seconds to *out (when out is set)
  explicit Timed(double* out) : out_(out) {}
  ~Timed() {
    if (out_) *out_ += sw_.seconds();
  }
  double* out_;
  Stopwatch sw_;
};

template <class T>
void dispatch_impl(const ModelConfig& cfg, const BlockWeights& w, const Tensor& x, MoeActs& a, ExpertParallelOps* ep) {
  Timed timed(a.times ? &a.times->route_s : nullptr);
  const int64_t N = x.size(0), C = cfg.d_model, E = cfg.moe.num_experts, k = cfg.moe.top_k;
  const int64_t P = distributed(ep) ? ep->size() : 1, El = E / P;
  LOOM_CHECK(N <= a.logits.size(0), "moe", N, " tokens but buffers for ", a.logits.size(0));
  LOOM_CHECK(int64_t(w.experts.size()) == El, "moe", "the block has ", w.experts.size(), " experts bound, expected ",
             El, " (", E, " over ep=", P, ")");
  a.tokens = N;
  ops::linear_forward(x, w.router_w, {}, a.logits.slice(0, {N, E}));
  route<T>(cfg, w, N, a);
  // Every kept choice's input row, grouped by expert, where the expert's output will land.
  const int64_t A = a.offsets[size_t(E)];
  cpu::moe_gather_rows<T>(x.data<T>(), C, a.choice_of.data<int32_t>(), k, nullptr, A, a.eout.data<T>());
  if (P == 1) return;
  // Rows for experts [q El, (q + 1) El) go to rank q; each rank learns how many of its
  // experts' rows come from every source.
  std::vector<int64_t> counts(static_cast<size_t>(E));
  for (int64_t e = 0; e < E; ++e) counts[size_t(e)] = a.offsets[size_t(e) + 1] - a.offsets[size_t(e)];
  ep->exchange_counts(counts, a.recv_counts);
  a.send_rows.assign(size_t(P), 0);
  a.recv_rows.assign(size_t(P), 0);
  for (int64_t q = 0; q < P; ++q) {
    a.send_rows[size_t(q)] = a.offsets[size_t((q + 1) * El)] - a.offsets[size_t(q * El)];
    for (int64_t j = 0; j < El; ++j) a.recv_rows[size_t(q)] += a.recv_counts[size_t(q * El + j)];
  }
  int64_t R = 0;
  for (int64_t r : a.recv_rows) R += r;
  const Tensor recv = sized(a.ep_recv, R, C, x.dtype(), MemCategory::activations);
  ep->start_rows(a.eout.slice(0, {A, C}), a.send_rows, recv, a.recv_rows);
  // Received rows arrive by source, then by local expert; the experts want them by expert,
  // this rank's own rows first: those need no exchange, so the experts start on them while
  // the other ranks' rows travel.
  std::vector<int64_t> src_base(static_cast<size_t>(P), 0);
  for (int64_t q = 1; q < P; ++q) src_base[size_t(q)] = src_base[size_t(q - 1)] + a.recv_rows[size_t(q - 1)];
  const int64_t me = ep->rank();
  a.local_offsets.assign(size_t(El + 1), 0);
  a.perm.resize(size_t(R));
  int64_t m = 0;
  for (int64_t j = 0; j < El; ++j) {
    a.local_offsets[size_t(j)] = m;
    for (int64_t k2 = 0; k2 < P; ++k2) {
      const int64_t q = k2 == 0 ? me : k2 <= me ? k2 - 1 : k2;
      int64_t at = src_base[size_t(q)];
      for (int64_t jj = 0; jj < j; ++jj) at += a.recv_counts[size_t(q * El + jj)];
      for (int64_t i = 0; i < a.recv_counts[size_t(q * El + j)]; ++i) a.perm[size_t(m++)] = int32_t(at + i);
    }
  }
  a.local_offsets[size_t(El)] = m;
}

// The owner's side of an exchange. Each local expert's rows are expert-major: first the rows
// this rank routed to itself, copied from `own` (its grouped send buffer) and needing no
// exchange, then the other ranks' rows, taken from `received` (packed by source) once the
// exchange is done.
template <class T>
void copy_own_rows(ExpertParallelOps* ep, const MoeActs& a, int64_t C, const T* own, T* rows) {
  const int64_t El = int64_t(a.local_offsets.size()) - 1, me = ep->rank();
  for (int64_t j = 0; j < El; ++j)
    std::copy_n(own + a.offsets[size_t(me * El + j)] * C, a.recv_counts[size_t(me * El + j)] * C,
                rows + a.local_offsets[size_t(j)] * C);
}

int64_t own_rows(ExpertParallelOps* ep, const MoeActs& a, int64_t j) {
  const int64_t El = int64_t(a.local_offsets.size()) - 1;
  return a.recv_counts[size_t(ep->rank() * El + j)];
}

// The return exchange: the results of the other ranks' rows (expert-major in `others`) go back
// to their sources, packed into `send` by destination, and land in `dest` (the grouped layout
// of the dispatch's send buffer). This rank's own rows do not travel: finish_return copies them
// into place, so they may still be computed while the exchange runs.
template <class T>
void start_return(ExpertParallelOps* ep, const MoeActs& a, int64_t C, const T* others, const Tensor& send,
                  const Tensor& dest) {
  const int64_t me = ep->rank(), R = int64_t(a.perm.size()), n_self = a.recv_rows[size_t(me)];
  int64_t own_begin = 0;
  for (int64_t q = 0; q < me; ++q) own_begin += a.recv_rows[size_t(q)];
  const int64_t own_end = own_begin + n_self;
  T* out = send.data<T>();
#pragma omp parallel for schedule(static) if (R * C > 32768)
  for (int64_t m = 0; m < R; ++m) {
    int64_t p = a.perm[size_t(m)];
    if (p >= own_begin && p < own_end) continue;
    if (p >= own_end) p -= n_self;
    std::copy_n(others + m * C, C, out + p * C);
  }
  std::vector<int64_t> send_rows = a.recv_rows, recv_rows = a.send_rows;
  send_rows[size_t(me)] = 0;
  recv_rows[size_t(me)] = 0;
  const int64_t A = a.offsets.back();
  ep->start_rows(send.slice(0, {R - n_self, C}), send_rows, dest.slice(0, {A - n_self, C}), recv_rows);
}

// Waits for the return exchange, moves the rows of the sources after this rank to their place
// (the exchange packed them n_self rows early) and copies this rank's own rows' results (first
// in each local expert's range of `own`) into theirs.
template <class T>
void finish_return(ExpertParallelOps* ep, const MoeActs& a, int64_t C, const T* own, T* dest) {
  ep->wait_rows();
  const int64_t El = int64_t(a.local_offsets.size()) - 1, me = ep->rank();
  const int64_t n_self = a.send_rows[size_t(me)], own_at = a.offsets[size_t(me * El)], A = a.offsets.back();
  std::copy_backward(dest + own_at * C, dest + (A - n_self) * C, dest + A * C);
  for (int64_t j = 0; j < El; ++j)
    std::copy_n(own + a.local_offsets[size_t(j)] * C, own_rows(ep, a, j) * C,
                dest + a.offsets[size_t(me * El + j)] * C);
}

template <class T>
void combine_impl(const ModelConfig& cfg, const BlockWeights& w, MoeActs& a, const Tensor& y, bool accumulate,
                  ExpertParallelOps* ep) {
  const int64_t N = a.tokens, C = cfg.d_model, E = cfg.moe.num_experts, k = cfg.moe.top_k;
  const int64_t F = cfg.expert_d_ff(), G = cfg.traits().mlp_fan_out();
  const ops::ProductPrecision prec = cfg.products();
  const bool gelu = G == 1;
  if (!distributed(ep)) {
    Timed timed(a.times ? &a.times->expert_s : nullptr);
    for (int64_t e = 0; e < E; ++e) {
      const int64_t r0 = a.offsets[size_t(e)], n = a.offsets[size_t(e) + 1] - r0;
      if (n == 0) continue;
      const Tensor rows = a.eout.slice(r0 * C, {n, C});
      expert_forward(w.experts[size_t(e)], rows, a.fc.slice(r0 * G * F, {n, G * F}), a.act.slice(r0 * F, {n, F}), rows,
                     gelu, prec);
    }
  } else {
    const int64_t R = int64_t(a.perm.size());
    const DType dt = y.dtype();
    const auto cat = MemCategory::activations;
    const Tensor x = sized(a.ep_x, R, C, dt, cat), fc = sized(a.ep_fc, R, G * F, dt, cat);
    const Tensor act = sized(a.ep_act, R, F, dt, cat), out = sized(a.ep_out, R, C, dt, cat);
    // The inputs stay in x (backward needs them). Half of this rank's own rows run while the
    // dispatch is in flight, the other half while the results travel back.
    double* expert_s = a.times ? &a.times->expert_s : nullptr;
    auto run = [&](int64_t j, int64_t r0, int64_t n) {
      if (n > 0)
        expert_forward(w.experts[size_t(j)], x.slice(r0 * C, {n, C}), fc.slice(r0 * G * F, {n, G * F}),
                       act.slice(r0 * F, {n, F}), out.slice(r0 * C, {n, C}), gelu, prec);
    };
    const int64_t El = int64_t(a.local_offsets.size()) - 1;
    {
      Timed timed(expert_s);
      copy_own_rows<T>(ep, a, C, a.eout.data<T>(), x.data<T>());
      for (int64_t j = 0; j < El; ++j) run(j, a.local_offsets[size_t(j)], (own_rows(ep, a, j) + 1) / 2);
    }
    ep->wait_rows();
    {
      Timed timed(expert_s);
      for (int64_t j = 0; j < El; ++j) {
        const int64_t r0 = a.local_offsets[size_t(j)] + own_rows(ep, a, j), r1 = a.local_offsets[size_t(j) + 1];
        permute_rows<T>(a.ep_recv.data<T>(), x.data<T>(), C, a.perm, false, r0, r1);
        run(j, r0, r1 - r0);
      }
      start_return<T>(ep, a, C, out.data<T>(), a.ep_recv, a.eout);
      for (int64_t j = 0; j < El; ++j) {
        const int64_t n = own_rows(ep, a, j), h = (n + 1) / 2;
        run(j, a.local_offsets[size_t(j)] + h, n - h);
      }
    }
    finish_return<T>(ep, a, C, out.data<T>(), a.eout.data<T>());
  }
  Timed timed(a.times ? &a.times->route_s : nullptr);
  cpu::moe_combine<T>(a.eout.data<T>(), C, a.row_of.data<int32_t>(), a.gates.data<T>(), N, k, accumulate, y.data<T>());
}

template <class T>
void backward_dispatch_impl(const ModelConfig& cfg, MoeActs& a, MoeScratch& s, const Tensor& dy,
                            ExpertParallelOps* ep) {
  Timed timed(a.times ? &a.times->route_s : nullptr);
  const int64_t N = a.tokens, C = cfg.d_model, E = cfg.moe.num_experts, k = cfg.moe.top_k;
  LOOM_CHECK(dy.size(0) == N, "moe", "backward over ", dy.size(0), " rows after a forward over ", N);
  const int64_t A = a.offsets[size_t(E)];
  cpu::moe_gate_grads<T>(dy.data<T>(), a.eout.data<T>(), C, a.row_of.data<int32_t>(), N, k, s.dgate.data<T>());
  // Each kept row's output gradient, gate-weighted, grouped like the forward's rows.
  cpu::moe_gather_rows<T>(dy.data<T>(), C, a.choice_of.data<int32_t>(), k, a.gates.data<T>(), A, s.dout.data<T>());
  if (!distributed(ep)) return;
  const int64_t R = int64_t(a.perm.size());
  const Tensor recv = sized(s.ep_recv, R, C, dy.dtype(), MemCategory::workspace);
  ep->start_rows(s.dout.slice(0, {A, C}), a.send_rows, recv, a.recv_rows);
}

template <class T>
void backward_combine_impl(const ModelConfig& cfg, const BlockWeights& w, const BlockWeights& gw, const Tensor& x,
                           MoeActs& a, MoeScratch& s, const Tensor& dx, bool accumulate_dx, ExpertParallelOps* ep) {
  const int64_t N = a.tokens, C = cfg.d_model, E = cfg.moe.num_experts, k = cfg.moe.top_k;
  const int64_t F = cfg.expert_d_ff(), G = cfg.traits().mlp_fan_out();
  const ops::ProductPrecision prec = cfg.products();
  const bool gelu = G == 1;
  LOOM_CHECK(x.size(0) == N, "moe", "backward over ", x.size(0), " rows after a forward over ", N);
  if (!distributed(ep)) {
    Timed timed(a.times ? &a.times->expert_s : nullptr);
    const int32_t* choice_of = a.choice_of.data<int32_t>();
    for (int64_t e = 0; e < E; ++e) {
      const int64_t r0 = a.offsets[size_t(e)], n = a.offsets[size_t(e) + 1] - r0;
      if (n == 0) continue;
      const Tensor rows = s.rows.slice(r0 * C, {n, C}), dout = s.dout.slice(r0 * C, {n, C});
      cpu::moe_gather_rows<T>(x.data<T>(), C, choice_of + r0, k, nullptr, n, rows.data<T>());
      expert_backward(w.experts[size_t(e)], &gw.experts[size_t(e)], rows, a.fc.slice(r0 * G * F, {n, G * F}),
                      a.act.slice(r0 * F, {n, F}), dout, s.dfc.slice(r0 * G * F, {n, G * F}),
                      s.dact.slice(r0 * F, {n, F}), dout, gelu, prec);
    }
  } else {
    const int64_t R = int64_t(a.perm.size());
    const DType dt = dx.dtype();
    const auto cat = MemCategory::workspace;
    const Tensor d = sized(s.ep_d, R, C, dt, cat), dfc = sized(s.ep_dfc, R, G * F, dt, cat);
    const Tensor dact = sized(s.ep_dact, R, F, dt, cat);
    // d holds each row's output gradient; this rank's own rows (in flight: the dispatch) then
    // their input gradient in place. The other ranks' rows' input gradients go to dx and back
    // to their sources first; their weight gradients are computed while those travel.
    const Tensor dx_others = sized(s.ep_dx, R, C, dt, cat);
    double* expert_s = a.times ? &a.times->expert_s : nullptr;
    const int64_t El = int64_t(a.local_offsets.size()) - 1;
    auto rows_of = [&](const Tensor& t, int64_t width, int64_t r0, int64_t n) {
      return t.slice(r0 * width, {n, width});
    };
    {
      Timed timed(expert_s);
      copy_own_rows<T>(ep, a, C, s.dout.data<T>(), d.data<T>());
      for (int64_t j = 0; j < El; ++j) {
        const int64_t r0 = a.local_offsets[size_t(j)], n = own_rows(ep, a, j);
        if (n == 0) continue;
        const Tensor dj = rows_of(d, C, r0, n);
        expert_backward(w.experts[size_t(j)], &gw.experts[size_t(j)], rows_of(a.ep_x, C, r0, n),
                        rows_of(a.ep_fc, G * F, r0, n), rows_of(a.ep_act, F, r0, n), dj, rows_of(dfc, G * F, r0, n),
                        rows_of(dact, F, r0, n), dj, gelu, prec);
      }
    }
    ep->wait_rows();
    {
      Timed timed(expert_s);
      for (int64_t j = 0; j < El; ++j) {
        const int64_t r0 = a.local_offsets[size_t(j)] + own_rows(ep, a, j), n = a.local_offsets[size_t(j) + 1] - r0;
        permute_rows<T>(s.ep_recv.data<T>(), d.data<T>(), C, a.perm, false, r0, r0 + n);
        if (n == 0) continue;
        expert_backward(w.experts[size_t(j)], nullptr, rows_of(a.ep_x, C, r0, n), rows_of(a.ep_fc, G * F, r0, n),
                        rows_of(a.ep_act, F, r0, n), rows_of(d, C, r0, n), rows_of(dfc, G * F, r0, n),
                        rows_of(dact, F, r0, n), rows_of(dx_others, C, r0, n), gelu, prec);
      }
      start_return<T>(ep, a, C, dx_others.data<T>(), s.ep_recv, s.dout);
      for (int64_t j = 0; j < El; ++j) {
        const int64_t r0 = a.local_offsets[size_t(j)] + own_rows(ep, a, j), n = a.local_offsets[size_t(j) + 1] - r0;
        if (n == 0) continue;
        expert_weight_grads(w.experts[size_t(j)], gw.experts[size_t(j)], rows_of(a.ep_x, C, r0, n),
                            rows_of(a.ep_act, F, r0, n), rows_of(d, C, r0, n), rows_of(dfc, G * F, r0, n), prec);
      }
    }
    finish_return<T>(ep, a, C, d.data<T>(), s.dout.data<T>());
  }
  Timed timed(a.times ? &a.times->route_s : nullptr);
  cpu::moe_combine<T>(s.dout.data<T>(), C, a.row_of.data<int32_t>(), nullptr, N, k, accumulate_dx, dx.data<T>());
  const std::vector<T> dgate(s.dgate.data<T>(), s.dgate.data<T>() + N * k);
  const Tensor dz = s.dlogits.slice(0, {N, E});
  router_backward<T>(cfg, N, a, dgate, dz.data<T>());
  ops::linear_backward(dz, x, w.router_w, dx, gw.router_w, {}, /*accumulate_dx=*/true);
}

}  // namespace

void moe_dispatch(const ModelConfig& cfg, const BlockWeights& w, const Tensor& x, MoeActs& a, ExpertParallelOps* ep) {
  if (x.dtype() == DType::f32)
    dispatch_impl<float>(cfg, w, x, a, ep);
  else
    dispatch_impl<double>(cfg, w, x, a, ep);
}

void moe_combine(const ModelConfig& cfg, const BlockWeights& w, MoeActs& a, const Tensor& y, bool accumulate,
                 ExpertParallelOps* ep) {
  if (y.dtype() == DType::f32)
    combine_impl<float>(cfg, w, a, y, accumulate, ep);
  else
    combine_impl<double>(cfg, w, a, y, accumulate, ep);
}

void moe_forward(const ModelConfig& cfg, const BlockWeights& w, const Tensor& x, MoeActs& a, const Tensor& y,
                 bool accumulate, ExpertParallelOps* ep) {
  moe_dispatch(cfg, w, x, a, ep);
  moe_combine(cfg, w, a, y, accumulate, ep);
}

void moe_backward_dispatch(const ModelConfig& cfg, MoeActs& a, MoeScratch& s, const Tensor& dy, ExpertParallelOps* ep) {
  if (dy.dtype() == DType::f32)
    backward_dispatch_impl<float>(cfg, a, s, dy, ep);
  else
    backward_dispatch_impl<double>(cfg, a, s, dy, ep);
}

void moe_backward_combine(const ModelConfig& cfg, const BlockWeights& w, const BlockWeights& gw, const Tensor& x,
                          MoeActs& a, MoeScratch& s, const Tensor& dx, bool accumulate_dx, ExpertParallelOps* ep) {
  if (dx.dtype() == DType::f32)
    backward_combine_impl<float>(cfg, w, gw, x, a, s, dx, accumulate_dx, ep);
  else
    backward_combine_impl<double>(cfg, w, gw, x, a, s, dx, accumulate_dx, ep);
}

void moe_backward(const ModelConfig& cfg, const BlockWeights& w, const BlockWeights& gw, const Tensor& x, MoeActs& a,
                  MoeScratch& s, const Tensor& dy, const Tensor& dx, bool accumulate_dx, ExpertParallelOps* ep) {
  moe_backward_dispatch(cfg, a, s, dy, ep);
  moe_backward_combine(cfg, w, gw, x, a, s, dx, accumulate_dx, ep);
}

}  // namespace loom::model

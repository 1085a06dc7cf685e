// The MoE router (forward and backward side by side) and the per-layer routing statistics
// (expert loads, drops, router losses) packed for reduction across ranks and summarised.
#include "loom/model/moe_router.h"

#include <algorithm>
#include <cmath>

#include "loom/model/block.h"

namespace loom::model {

double load_max_over_mean(const std::vector<int64_t>& load) {
  int64_t sum = 0, mx = 0;
  for (int64_t l : load) {
    sum += l;
    mx = std::max(mx, l);
  }
  return sum ? double(mx) * double(load.size()) / double(sum) : 0.0;
}

double MoeLayerStats::load_max_over_mean() const { return model::load_max_over_mean(load); }

void MoeLayerStats::add(const MoeLayerStats& o) {
  layer = o.layer;
  load.resize(std::max(load.size(), o.load.size()), 0);
  for (size_t e = 0; e < o.load.size(); ++e) load[e] += o.load[e];
  choices += o.choices;
  dropped += o.dropped;
  aux_sum += o.aux_sum;
  z_sum += o.z_sum;
  forwards += o.forwards;
}

std::vector<double> pack_moe_stats(const ModelConfig& cfg, const std::vector<MoeLayerStats>& stats) {
  const int64_t E = cfg.moe.num_experts;
  const size_t per = size_t(E) + 5;
  std::vector<double> v(stats.size() * per, 0.0);
  for (size_t i = 0; i < stats.size(); ++i) {
    const MoeLayerStats& st = stats[i];
    double* o = v.data() + i * per;
    for (size_t e = 0; e < st.load.size() && e < size_t(E); ++e) o[e] = double(st.load[e]);
    o[E] = double(st.choices);
    o[E + 1] = double(st.dropped);
    o[E + 2] = st.aux_sum;
    o[E + 3] = st.z_sum;
    o[E + 4] = double(st.forwards);
  }
  return v;
}

void unpack_moe_stats(const ModelConfig& cfg, const double* packed, std::vector<MoeLayerStats>& stats) {
  const int64_t E = cfg.moe.num_experts;
  for (size_t i = 0; i < stats.size(); ++i) {
    MoeLayerStats& st = stats[i];
    const double* o = packed + i * size_t(E + 5);
    st.layer = cfg.moe_layer(int64_t(i));
    st.load.assign(size_t(E), 0);
    for (int64_t e = 0; e < E; ++e) st.load[size_t(e)] = int64_t(o[e]);
    st.choices = int64_t(o[E]);
    st.dropped = int64_t(o[E + 1]);
    st.aux_sum = o[E + 2];
    st.z_sum = o[E + 3];
    st.forwards = int64_t(o[E + 4]);
  }
}

MoeSummary summarize_moe_stats(const std::vector<MoeLayerStats>& stats) {
  MoeSummary s;
  int64_t choices = 0, dropped = 0;
  for (const auto& st : stats) {
    s.worst_load = std::max(s.worst_load, st.load_max_over_mean());
    s.aux += st.aux() / double(stats.size());
    choices += st.choices;
    dropped += st.dropped;
  }
  s.dropped_fraction = choices ? double(dropped) / double(choices) : 0.0;
  return s;
}

template <class T>
void route(const ModelConfig& cfg, const BlockWeights& w, int64_t N, MoeActs& a) {
  const MoeConfig& m = cfg.moe;
  const int64_t E = m.num_experts, k = m.top_k;
  const T* z = a.logits.data<T>();
  T* s = a.scores.data<T>();
  int32_t* topk = a.topk.data<int32_t>();
  T* gates = a.gates.data<T>();
  const float* bias = w.router_bias.defined() ? w.router_bias.data<float>() : nullptr;
  const bool softmax = m.score == RouterScore::softmax;
  double z_sum = 0;
  std::vector<double> p_sum(static_cast<size_t>(E), 0.0);
  std::vector<T> key(static_cast<size_t>(E));
  for (int64_t t = 0; t < N; ++t) {
    const T* zt = z + t * E;
    T* st = s + t * E;
    const T mx = *std::max_element(zt, zt + E);
    double sum = 0;
    for (int64_t e = 0; e < E; ++e) sum += std::exp(double(zt[e] - mx));
    const double lse = double(mx) + std::log(sum);
    z_sum += lse * lse;
    double ssum = 0;
    for (int64_t e = 0; e < E; ++e) {
      st[e] = softmax ? T(std::exp(double(zt[e]) - lse)) : T(1.0 / (1.0 + std::exp(-double(zt[e]))));
      ssum += double(st[e]);
    }
    for (int64_t e = 0; e < E; ++e) p_sum[size_t(e)] += double(st[e]) / (softmax ? 1.0 : ssum);
    // Top-k by score (+ selection bias); ties go to the lower expert index.
    for (int64_t e = 0; e < E; ++e) key[size_t(e)] = st[e] + (bias ? T(bias[e]) : T(0));
    double chosen = 0;
    for (int64_t j = 0; j < k; ++j) {
      int64_t best = -1;
      for (int64_t e = 0; e < E; ++e) {
        bool taken = false;
        for (int64_t i = 0; i < j; ++i) taken = taken || topk[t * k + i] == e;
        if (!taken && (best < 0 || key[size_t(e)] > key[size_t(best)])) best = e;
      }
      topk[t * k + j] = int32_t(best);
      chosen += double(st[best]);
    }
    for (int64_t j = 0; j < k; ++j) gates[t * k + j] = T(double(st[topk[t * k + j]]) / chosen);
  }
  // Loads and capacity: first choices of every token before second choices (GShard's priority).
  std::fill(a.load.begin(), a.load.end(), 0);
  for (int64_t c = 0; c < N * k; ++c) ++a.load[size_t(topk[c])];
  const int64_t cap = m.capacity_factor > 0 ? int64_t(std::ceil(m.capacity_factor * double(N * k) / double(E))) : N * k;
  std::vector<int64_t> kept(static_cast<size_t>(E), 0);
  int32_t* row_of = a.row_of.data<int32_t>();
  a.dropped = 0;
  for (int64_t j = 0; j < k; ++j)
    for (int64_t t = 0; t < N; ++t) {
      const int64_t e = topk[t * k + j];
      if (kept[size_t(e)] < cap) {
        ++kept[size_t(e)];
        row_of[t * k + j] = 0;
      } else {
        row_of[t * k + j] = -1;
        ++a.dropped;
      }
    }
  a.offsets[0] = 0;
  for (int64_t e = 0; e < E; ++e) a.offsets[size_t(e) + 1] = a.offsets[size_t(e)] + kept[size_t(e)];
  std::vector<int64_t> next(a.offsets.begin(), a.offsets.end() - 1);
  int32_t* choice_of = a.choice_of.data<int32_t>();
  for (int64_t j = 0; j < k; ++j)
    for (int64_t t = 0; t < N; ++t) {
      const int64_t c = t * k + j;
      if (row_of[c] < 0) continue;
      const int64_t r = next[size_t(topk[c])]++;
      row_of[c] = int32_t(r);
      choice_of[r] = int32_t(c);
    }
  // Balance loss E * sum_i f_i P_i: f_i the fraction of choices routed to i, P_i the mean
  // probability (for sigmoid scores, normalised per token) of i.
  double aux = 0;
  for (int64_t e = 0; e < E; ++e) aux += double(a.load[size_t(e)]) / double(N * k) * p_sum[size_t(e)] / double(N);
  a.aux = double(E) * aux;
  a.z = z_sum / double(N);
}

template <class T>
void router_backward(const ModelConfig& cfg, int64_t N, const MoeActs& a, const std::vector<T>& dgate, T* dz) {
  const MoeConfig& m = cfg.moe;
  const int64_t E = m.num_experts, k = m.top_k;
  const T* z = a.logits.data<T>();
  const T* s = a.scores.data<T>();
  const int32_t* topk = a.topk.data<int32_t>();
  const T* gates = a.gates.data<T>();
  const bool softmax = m.score == RouterScore::softmax;
  const double w_aux = a.loss_weight * m.router_aux_loss_coef;
  const double w_z = a.loss_weight * m.router_z_loss_coef;
  std::vector<double> ds(static_cast<size_t>(E)), f(static_cast<size_t>(E));
  for (int64_t e = 0; e < E; ++e) f[size_t(e)] = double(a.load[size_t(e)]) / double(N * k);
  for (int64_t t = 0; t < N; ++t) {
    const T* st = s + t * E;
    std::fill(ds.begin(), ds.end(), 0.0);
    // Gates g_j = s_j / S over the chosen: ds_j = (dg_j - sum_i g_i dg_i) / S.
    double S = 0, gdg = 0;
    for (int64_t j = 0; j < k; ++j) {
      S += double(st[topk[t * k + j]]);
      gdg += double(gates[t * k + j]) * double(dgate[size_t(t * k + j)]);
    }
    for (int64_t j = 0; j < k; ++j) ds[size_t(topk[t * k + j])] += (double(dgate[size_t(t * k + j)]) - gdg) / S;
    double ssum = 0;
    for (int64_t e = 0; e < E; ++e) ssum += double(st[e]);
    if (w_aux != 0) {
      // d(E sum_i f_i P_i) / dp_{t,i} = E f_i / N; sigmoid: p = s / sum(s).
      double pdp = 0;
      for (int64_t e = 0; e < E; ++e) pdp += double(st[e]) / ssum * double(E) * f[size_t(e)];
      for (int64_t e = 0; e < E; ++e) {
        const double dp = w_aux * double(E) * f[size_t(e)] / double(N);
        ds[size_t(e)] += softmax ? dp : (dp - w_aux * pdp / double(N)) / ssum;
      }
    }
    T* dzt = dz + t * E;
    if (softmax) {
      double sds = 0;
      for (int64_t e = 0; e < E; ++e) sds += double(st[e]) * ds[size_t(e)];
      for (int64_t e = 0; e < E; ++e) dzt[e] = T(double(st[e]) * (ds[size_t(e)] - sds));
    } else {
      for (int64_t e = 0; e < E; ++e) dzt[e] = T(ds[size_t(e)] * double(st[e]) * (1.0 - double(st[e])));
    }
    if (w_z != 0) {  // d(mean_t lse_t^2) / dz = 2 lse_t softmax(z_t) / N
      const T* zt = z + t * E;
      const double mx = double(*std::max_element(zt, zt + E));
      double sum = 0;
      for (int64_t e = 0; e < E; ++e) sum += std::exp(double(zt[e]) - mx);
      const double lse = mx + std::log(sum);
      for (int64_t e = 0; e < E; ++e) dzt[e] += T(w_z * 2.0 * lse * std::exp(double(zt[e]) - lse) / double(N));
    }
  }
}

template void route<float>(const ModelConfig&, const BlockWeights&, int64_t, MoeActs&);
template void route<double>(const ModelConfig&, const BlockWeights&, int64_t, MoeActs&);
template void router_backward<float>(const ModelConfig&, int64_t, const MoeActs&, const std::vector<float>&, float*);
template void router_backward<double>(const ModelConfig&, int64_t, const MoeActs&, const std::vector<double>&, double*);

}  // namespace loom::model

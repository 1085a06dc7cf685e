// Topology arithmetic, the alpha-beta cost model of the collective algorithms, and the
// calibration file.
#include "loom/comm/algorithm.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <set>
#include <sstream>

#include "loom/core/enum_names.h"
#include "loom/core/error.h"

namespace loom::comm {

namespace {
constexpr EnumName<Algorithm> kAlgorithmNames[] = {{Algorithm::auto_select, "auto"},
                                                   {Algorithm::ring, "ring"},
                                                   {Algorithm::tree, "tree"},
                                                   {Algorithm::hierarchical, "hierarchical"},
                                                   {Algorithm::mpi, "mpi"}};
}  // namespace

Algorithm parse_algorithm(const std::string& text) {
  if (const auto a = enum_from_name(kAlgorithmNames, text)) return *a;
  fail("comm", "comm.algorithm '", text, "' is not one of auto, ring, tree, hierarchical, mpi");
}

const char* algorithm_name(Algorithm a) { return enum_name(kAlgorithmNames, a); }

const char* collective_op_name(CollectiveOp op) {
  static constexpr EnumName<CollectiveOp> kNames[] = {{CollectiveOp::all_reduce, "all_reduce"},
                                                      {CollectiveOp::reduce_scatter, "reduce_scatter"},
                                                      {CollectiveOp::all_gather, "all_gather"}};
  return enum_name(kNames, op);
}

// --- Topology ---------------------------------------------------------------------------

namespace {

// Host ids in order of their lowest rank.
std::vector<int> host_order(const std::vector<int>& host_of) {
  std::vector<int> order;
  for (int h : host_of)
    if (std::find(order.begin(), order.end(), h) == order.end()) order.push_back(h);
  return order;
}

bool is_pow2(int n) { return n > 0 && (n & (n - 1)) == 0; }

}  // namespace

int Topology::hosts() const { return int(host_order(host_of).size()); }

int Topology::uniform_local_size() const {
  std::map<int, int> count;
  for (int h : host_of) ++count[h];
  int l = count.empty() ? 0 : count.begin()->second;
  for (const auto& [h, c] : count)
    if (c != l) return 0;
  return l;
}

int Topology::host_index(int rank) const {
  std::vector<int> order = host_order(host_of);
  return int(std::find(order.begin(), order.end(), host_of[size_t(rank)]) - order.begin());
}

int Topology::local_index(int rank) const {
  int l = 0;
  for (int r = 0; r < rank; ++r) l += host_of[size_t(r)] == host_of[size_t(rank)];
  return l;
}

std::vector<int> Topology::host_members(int rank) const {
  std::vector<int> m;
  for (int r = 0; r < size(); ++r)
    if (host_of[size_t(r)] == host_of[size_t(rank)]) m.push_back(r);
  return m;
}

std::vector<int> Topology::peers_across_hosts(int rank) const {
  std::vector<int> order = host_order(host_of);
  std::vector<int> peers(order.size(), -1);
  const int l = local_index(rank);
  for (int r = 0; r < size(); ++r)
    if (local_index(r) == l) peers[size_t(host_index(r))] = r;
  peers.erase(std::remove(peers.begin(), peers.end(), -1), peers.end());
  return peers;
}

// --- The cost model ---------------------------------------------------------------------

std::string CostModel::key(Algorithm a, CollectiveOp op, int ranks, int hosts) {
  return str_cat(algorithm_name(a), "/", collective_op_name(op), "/", ranks, "/", hosts);
}

double CostModel::measured_time(Algorithm a, CollectiveOp op, int ranks, int hosts, int64_t bytes) const {
  auto it = measured.find(key(a, op, ranks, hosts));
  if (it == measured.end() || it->second.empty()) return -1;
  const auto& t = it->second;
  auto hi = t.lower_bound(bytes);
  if (hi != t.end() && hi->first == bytes) return hi->second;
  if (hi == t.begin()) return hi->second;  // below the smallest size: latency-bound
  auto lo = std::prev(hi);
  if (hi == t.end()) return lo->second * double(bytes) / double(lo->first);
  double f = (std::log(double(bytes)) - std::log(double(lo->first))) /
             (std::log(double(hi->first)) - std::log(double(lo->first)));
  return std::exp(std::log(lo->second) + f * (std::log(hi->second) - std::log(lo->second)));
}

namespace {

// The part of the cost model the alpha-beta formulas use (a CostModel also carries its
// measurement tables, which the formulas never read and should not copy).
struct Links {
  LinkCost intra, inter;
  double reduce_s_per_byte;
};

Links links_of(const CostModel& m) { return {m.intra, m.inter, m.reduce_s_per_byte}; }

// One synchronous exchange step of a group: every rank sends `msg` bytes to a peer given by
// `peer_of`, all at once; the step lasts as long as its slowest link. Flows leaving one
// host share that host's link.
double step_time(const Topology& topo, const Links& m, double msg, bool reduces, const std::vector<int>& peer_of) {
  std::map<int, int> crossing;  // host -> flows leaving it
  bool any_intra = false;
  for (int r = 0; r < topo.size(); ++r) {
    int p = peer_of[size_t(r)];
    if (p < 0 || p == r) continue;
    if (topo.host_of[size_t(p)] != topo.host_of[size_t(r)])
      ++crossing[topo.host_of[size_t(r)]];
    else
      any_intra = true;
  }
  double t = 0;
  if (any_intra) t = m.intra.alpha_s + msg * m.intra.beta_s_per_byte;
  int flows = 0;
  for (const auto& [h, c] : crossing) flows = std::max(flows, c);
  if (flows > 0) t = std::max(t, m.inter.alpha_s + msg * flows * m.inter.beta_s_per_byte);
  if (reduces) t += msg * m.reduce_s_per_byte;
  return t;
}

std::vector<int> ring_next(int n) {
  std::vector<int> p(static_cast<size_t>(n));
  for (int r = 0; r < n; ++r) p[size_t(r)] = (r + 1) % n;
  return p;
}

// Partners r ^ mask among ranks [0, active) of a group of n (the rest idle in this step).
std::vector<int> xor_partner(int n, int mask, int active) {
  std::vector<int> p(static_cast<size_t>(n), -1);
  for (int r = 0; r < active; ++r)
    if ((r ^ mask) < active) p[size_t(r)] = r ^ mask;
  return p;
}

int pow2_floor(int n) {
  int p = 1;
  while (p * 2 <= n) p *= 2;
  return p;
}

double ring_time(CollectiveOp op, double s, const Topology& topo, const Links& m) {
  const int n = topo.size();
  if (n < 2) return 0;
  auto next = ring_next(n);
  double rs = (n - 1) * step_time(topo, m, s / n, true, next);
  double ag = (n - 1) * step_time(topo, m, s / n, false, next);
  if (op == CollectiveOp::all_reduce) return rs + ag;
  return op == CollectiveOp::reduce_scatter ? rs : ag;
}

double tree_time(CollectiveOp op, double s, const Topology& topo, const Links& m) {
  const int n = topo.size();
  if (n < 2) return 0;
  double t = 0;
  if (op == CollectiveOp::all_reduce) {
    const int p2 = pow2_floor(n);
    if (p2 < n) {  // the ranks above p2 fold into their partner first and get the result last
      std::vector<int> fold(size_t(n), -1);
      for (int r = p2; r < n; ++r) fold[size_t(r)] = r - p2;
      t += step_time(topo, m, s, true, fold) + step_time(topo, m, s, false, fold);
    }
    for (int mask = 1; mask < p2; mask *= 2) t += step_time(topo, m, s, true, xor_partner(n, mask, p2));
    return t;
  }
  // Recursive halving (reduce-scatter) and doubling (all-gather) halve/double the message.
  for (int mask = n / 2; mask >= 1; mask /= 2)
    t += step_time(topo, m, s * mask / n, op == CollectiveOp::reduce_scatter, xor_partner(n, mask, n));
  return t;
}

// Ranks of a sub-grid of the topology (one host's members, or one rank per host), as a
// topology of their own.
Topology sub_topology(const Topology& topo, const std::vector<int>& members) {
  Topology t;
  for (int r : members) t.host_of.push_back(topo.host_of[size_t(r)]);
  return t;
}

// The cross-host phase of hierarchical: L groups of H ranks (one per local index) run at
// once and share every host's link, which the single-group step model sees as L flows.
// Its algorithm (ring or tree) and time, for a share of s bytes per rank.
std::pair<Algorithm, double> cross_phase(CollectiveOp op, double s, const Topology& topo, const Links& m) {
  const int l = topo.uniform_local_size();
  Topology cross = sub_topology(topo, topo.peers_across_hosts(0));
  Links shared = m;
  shared.inter.beta_s_per_byte *= l;
  const double ring = ring_time(op, s, cross, shared);
  if (op == CollectiveOp::all_reduce || is_pow2(cross.size())) {
    const double tree = tree_time(op, s, cross, shared);
    if (tree < ring) return {Algorithm::tree, tree};
  }
  return {Algorithm::ring, ring};
}

double hierarchical_time(CollectiveOp op, double s, const Topology& topo, const Links& m) {
  const int l = topo.uniform_local_size();
  Topology local = sub_topology(topo, topo.host_members(0));
  auto intra = [&](CollectiveOp o, double bytes) { return ring_time(o, bytes, local, m); };
  const double cross = cross_phase(op, s / l, topo, m).second;
  const double permute = s * m.reduce_s_per_byte;  // reordering chunks by host: one pass over s
  switch (op) {
    case CollectiveOp::all_reduce:
      return intra(CollectiveOp::reduce_scatter, s) + cross + intra(CollectiveOp::all_gather, s);
    case CollectiveOp::reduce_scatter: return permute + intra(op, s) + cross;
    case CollectiveOp::all_gather: return cross + intra(op, s) + permute;
  }
  return 0;
}

}  // namespace

double predict_seconds(Algorithm a, CollectiveOp op, int64_t bytes, const Topology& topo, const CostModel& m) {
  const double s = double(bytes);
  switch (a) {
    case Algorithm::ring: return ring_time(op, s, topo, links_of(m));
    case Algorithm::tree: return tree_time(op, s, topo, links_of(m));
    case Algorithm::hierarchical: return hierarchical_time(op, s, topo, links_of(m));
    case Algorithm::mpi: return m.measured_time(Algorithm::mpi, op, topo.size(), topo.hosts(), bytes);
    case Algorithm::auto_select: break;
  }
  return predict_seconds(choose_algorithm(op, bytes, topo, m), op, bytes, topo, m);
}

Algorithm choose_algorithm(CollectiveOp op, int64_t bytes, const Topology& topo, const CostModel& m) {
  const int n = topo.size();
  if (n < 2) return Algorithm::mpi;
  const int hosts = topo.hosts();
  double mpi = m.measured_time(Algorithm::mpi, op, n, hosts, bytes);
  std::vector<Algorithm> candidates = {Algorithm::ring};
  if (op == CollectiveOp::all_reduce || is_pow2(n)) candidates.push_back(Algorithm::tree);
  if (hosts > 1 && topo.uniform_local_size() > 1) candidates.push_back(Algorithm::hierarchical);
  if (hosts == 1 && mpi < 0) return Algorithm::mpi;
  Algorithm best = Algorithm::mpi;
  double best_t = mpi;
  for (Algorithm a : candidates) {
    double t = m.measured_time(a, op, n, hosts, bytes);
    if (t < 0) t = predict_seconds(a, op, bytes, topo, m);
    if (best_t < 0 || t < best_t) best = a, best_t = t;
  }
  return best;
}

Algorithm cross_phase_algorithm(CollectiveOp op, int64_t share_bytes, const Topology& topo, const CostModel& m) {
  return cross_phase(op, double(share_bytes), topo, links_of(m)).first;
}

Algorithm resolve_algorithm(Algorithm requested, CollectiveOp op, int64_t bytes, const Topology& topo,
                            const CostModel& m) {
  if (topo.size() < 2) return Algorithm::mpi;
  Algorithm a = requested == Algorithm::auto_select ? choose_algorithm(op, bytes, topo, m) : requested;
  if (a == Algorithm::hierarchical && (topo.hosts() < 2 || topo.uniform_local_size() < 2)) a = Algorithm::ring;
  if (a == Algorithm::tree && op != CollectiveOp::all_reduce && !is_pow2(topo.size())) a = Algorithm::ring;
  return a;
}

// --- The calibration file ---------------------------------------------------------------

CostModel load_cost_model(const std::string& path) {
  std::ifstream f(path);
  LOOM_CHECK(f.good(), "comm", "cannot read the calibration file ", path,
             "; write one with `loom bench comm --calibrate ", path, "`");
  CostModel m;
  m.calibrated = true;
  m.source = path;
  std::string line;
  int lineno = 0;
  auto positive = [&](double v, const std::string& key) {
    LOOM_CHECK(std::isfinite(v) && v > 0, "comm", path, ":", lineno, ": ", key, " ", v, " must be a positive number");
    return v;
  };
  while (std::getline(f, line)) {
    ++lineno;
    if (auto hash = line.find('#'); hash != std::string::npos) line.erase(hash);
    std::istringstream in(line);
    std::string key;
    if (!(in >> key)) continue;
    if (key == "time") {
      std::string alg, op;
      int ranks = 0, hosts = 0;
      int64_t bytes = 0;
      double us = 0;
      LOOM_CHECK(bool(in >> alg >> op >> ranks >> hosts >> bytes >> us), "comm", path, ":", lineno,
                 ": expected 'time <algorithm> <op> <ranks> <hosts> <bytes> <microseconds>'");
      const Algorithm a = parse_algorithm(alg);
      CollectiveOp c;
      if (op == "all_reduce")
        c = CollectiveOp::all_reduce;
      else if (op == "reduce_scatter")
        c = CollectiveOp::reduce_scatter;
      else if (op == "all_gather")
        c = CollectiveOp::all_gather;
      else
        fail("comm", path, ":", lineno, ": op '", op, "' is not all_reduce, reduce_scatter or all_gather");
      m.measured[CostModel::key(a, c, ranks, hosts)][bytes] = positive(us, "time") * 1e-6;
      continue;
    }
    double v = 0;
    LOOM_CHECK(bool(in >> v), "comm", path, ":", lineno, ": '", key, "' needs a number");
    if (key == "intra_alpha_us")
      m.intra.alpha_s = positive(v, key) * 1e-6;
    else if (key == "intra_gbps")
      m.intra.beta_s_per_byte = 1e-9 / positive(v, key);
    else if (key == "inter_alpha_us")
      m.inter.alpha_s = positive(v, key) * 1e-6;
    else if (key == "inter_gbps")
      m.inter.beta_s_per_byte = 1e-9 / positive(v, key);
    else if (key == "reduce_gbps")
      m.reduce_s_per_byte = 1e-9 / positive(v, key);
    else
      fail("comm", path, ":", lineno, ": unknown key '", key,
           "' (intra_alpha_us, intra_gbps, inter_alpha_us, inter_gbps, reduce_gbps, time)");
  }
  return m;
}

void save_cost_model(const CostModel& m, const std::string& path) {
  std::ofstream f(path);
  LOOM_CHECK(f.good(), "comm", "cannot write the calibration file ", path);
  f << "# loom collective cost model (loom bench comm --calibrate); alpha-beta per link class\n";
  f << "intra_alpha_us " << m.intra.alpha_s * 1e6 << "\n";
  f << "intra_gbps " << m.intra.gbps() << "\n";
  f << "inter_alpha_us " << m.inter.alpha_s * 1e6 << "\n";
  f << "inter_gbps " << m.inter.gbps() << "\n";
  f << "reduce_gbps " << 1e-9 / m.reduce_s_per_byte << "\n";
  f << "# measured times: time <algorithm> <op> <ranks> <hosts> <bytes> <us>\n";
  for (const auto& [key, table] : m.measured) {
    std::string k = key;
    std::replace(k.begin(), k.end(), '/', ' ');
    for (const auto& [bytes, s] : table) f << "time " << k << " " << bytes << " " << s * 1e6 << "\n";
  }
  LOOM_CHECK(f.good(), "comm", "writing the calibration file ", path, " failed");
}

}  // namespace loom::comm

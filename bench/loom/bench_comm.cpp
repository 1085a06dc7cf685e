// `loom bench comm`: time collectives over the world group for doubling message sizes, like
// nccl-tests: median time over iterations after warm-up (the slowest rank's time per
// iteration), algorithm and bus bandwidth (factors in comm/bandwidth.h), a result check,
// and `SUMMARY {json}` as the last line. --algorithms runs each collective algorithm in turn
// (and says which one `auto` picked per size); --calibrate measures the links and MPI's
// collectives and writes the cost model `auto` uses. With --nproc or --hosts it relaunches
// itself via `loom launch`.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <map>
#include <sstream>

#include "bench/loom/bench.h"
#include "loom/comm/algorithm.h"
#include "loom/comm/bandwidth.h"
#include "loom/comm/launch.h"
#include "loom/comm/world.h"
#include "loom/core/stats.h"
#include "loom/core/timer.h"

namespace loom::cli {

namespace {

// The options; min/max bytes, iters and warmup have other defaults under --calibrate.
struct CommOptions {
  int64_t nproc = 0, iters = 0, warmup = 0;
  std::string hosts, ops = "all_reduce,reduce_scatter,all_gather,all_to_all", min_bytes, max_bytes, algorithms,
                     calibrate;
};

struct Buffers {
  Tensor in, out;
};

// Buffers for `op` with `count` f32 elements in total, filled so the result is checkable.
Buffers make_buffers(const std::string& op, int64_t count, int n, int r) {
  Buffers b;
  if (op == "all_reduce" || op == "broadcast") {
    b.in = Tensor::empty({count}, DType::f32, MemCategory::comm);
    b.in.fill(op == "broadcast" && r != 0 ? -1.0 : r + 1.0);
  } else if (op == "reduce_scatter") {
    b.in = Tensor::empty({count}, DType::f32, MemCategory::comm);
    b.in.fill(r + 1.0);
    b.out = Tensor::zeros({count / n}, DType::f32, MemCategory::comm);
  } else if (op == "all_gather") {
    b.in = Tensor::empty({count / n}, DType::f32, MemCategory::comm);
    b.in.fill(r + 1.0);
    b.out = Tensor::zeros({count}, DType::f32, MemCategory::comm);
  } else {  // all_to_all: chunk j of rank r holds r + 1
    b.in = Tensor::empty({count}, DType::f32, MemCategory::comm);
    b.in.fill(r + 1.0);
    b.out = Tensor::zeros({count}, DType::f32, MemCategory::comm);
  }
  return b;
}

void run_op(const comm::Group& g, const std::string& op, const Buffers& b) {
  if (op == "all_reduce")
    g.all_reduce(b.in);
  else if (op == "reduce_scatter")
    g.reduce_scatter(b.in, b.out);
  else if (op == "all_gather")
    g.all_gather(b.in, b.out);
  else if (op == "all_to_all")
    g.all_to_all(b.in, b.out);
  else
    g.broadcast(b.in, 0);
}

// Checks first, middle and last element of the result of one run on fresh buffers.
bool result_ok(const std::string& op, const Buffers& b, int n) {
  const Tensor& t = b.out.defined() ? b.out : b.in;
  const float* p = t.data<float>();
  int64_t m = t.numel();
  for (int64_t i : {int64_t(0), m / 2, m - 1}) {
    double want;
    if (op == "all_reduce" || op == "reduce_scatter")
      want = n * (n + 1) / 2.0;
    else if (op == "broadcast")
      want = 1.0;
    else
      want = double(i / (m / n) + 1);  // chunk q came from rank q
    if (p[i] != float(want)) return false;
  }
  return true;
}

std::vector<std::string> split_list(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  for (std::string item; std::getline(ss, item, ',');)
    if (!item.empty()) out.push_back(item);
  return out;
}

struct Peak {
  double busbw = 0;
  int64_t bytes = 0;
};

// Median over iterations of the slowest rank's time of one `op` on `b`, after warm-up.
double time_op(const comm::Group& g, const std::string& op, const Buffers& b, int iters, int warmup) {
  for (int i = 0; i < warmup; ++i) run_op(g, op, b);
  Tensor times = Tensor::zeros({iters}, DType::f64);
  for (int i = 0; i < iters; ++i) {
    g.barrier();
    Stopwatch sw;
    run_op(g, op, b);
    times.data<double>()[i] = sw.seconds();
  }
  g.set_algorithm(comm::Algorithm::mpi);     // the bookkeeping below is not what is measured
  g.all_reduce(times, comm::ReduceOp::max);  // an iteration lasts as long as its slowest rank
  std::vector<double> t(times.data<double>(), times.data<double>() + iters);
  return median(std::move(t));
}

bool has_algorithms(const std::string& op) {
  return op == "all_reduce" || op == "reduce_scatter" || op == "all_gather";
}

comm::CollectiveOp collective_op(const std::string& op) {
  if (op == "reduce_scatter") return comm::CollectiveOp::reduce_scatter;
  if (op == "all_gather") return comm::CollectiveOp::all_gather;
  return comm::CollectiveOp::all_reduce;
}

std::string fmt3(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.3f", v);
  return buf;
}

// Latency and bandwidth of the link between rank 0 and `peer`: alpha from an 8-byte
// message, beta from a large one.
comm::LinkCost measure_link(const comm::Group& g, int peer, int64_t large, int iters) {
  comm::LinkCost c;
  c.alpha_s = one_way_seconds(g, peer, 8, iters);
  double t = one_way_seconds(g, peer, large, std::max(3, iters / 4));
  c.beta_s_per_byte = std::max(1e-13, (t - c.alpha_s) / double(large));
  return c;
}

int calibrate(const CommOptions& a, const CLI::App& app) {
  const std::string path = a.calibrate;
  int64_t min_bytes = comm::parse_byte_size(a.min_bytes.empty() ? "4K" : a.min_bytes);
  int64_t max_bytes = comm::parse_byte_size(a.max_bytes.empty() ? "64M" : a.max_bytes);
  int iters = app.count("--iters") ? int(a.iters) : 10, warmup = app.count("--warmup") ? int(a.warmup) : 2;
  if (iters < 1 || warmup < 0 || min_bytes > max_bytes)
    throw UsageError("[bench comm] --calibrate needs --iters >= 1, --warmup >= 0 and --min-bytes <= --max-bytes");
  comm::World world;
  const comm::Group& g = world.group();
  const int n = g.size(), r = g.rank();
  g.set_algorithm(comm::Algorithm::mpi);
  comm::Topology topo{g.host_of()};
  int intra_peer = -1, inter_peer = -1;
  for (int q = 1; q < n; ++q) {
    bool same = topo.host_of[size_t(q)] == topo.host_of[0];
    if (same && intra_peer < 0) intra_peer = q;
    if (!same && inter_peer < 0) inter_peer = q;
  }
  comm::CostModel m;
  m.calibrated = true;
  m.source = path;
  const int64_t large = std::min<int64_t>(max_bytes, 4 << 20);
  if (intra_peer > 0) m.intra = measure_link(g, intra_peer, large, iters);
  if (inter_peer > 0) m.inter = measure_link(g, inter_peer, large, iters);
  {  // the reduction rate of the algorithms' add step, on 16 MB of f32
    const int64_t count = 4 << 20;
    Tensor x = Tensor::zeros({count}, DType::f32), y = Tensor::zeros({count}, DType::f32);
    std::vector<double> t;
    for (int i = 0; i < 5; ++i) {
      Stopwatch sw;
      comm::reduce_into(x.raw(), y.raw(), count, DType::f32, comm::ReduceOp::sum);
      t.push_back(sw.seconds());
    }
    m.reduce_s_per_byte = median(std::move(t)) / double(count * 4);
  }
  if (r == 0) {
    std::printf("# loom bench comm --calibrate: %d ranks on %d host%s\n", n, topo.hosts(), topo.hosts() > 1 ? "s" : "");
    if (intra_peer > 0)
      std::printf("  intra-host link (rank 0 <-> %d): alpha %.1f us, %.3f GB/s\n", intra_peer, m.intra.alpha_s * 1e6,
                  m.intra.gbps());
    if (inter_peer > 0)
      std::printf("  inter-host link (rank 0 <-> %d): alpha %.1f us, %.3f GB/s\n", inter_peer, m.inter.alpha_s * 1e6,
                  m.inter.gbps());
    std::printf("  reduction: %.2f GB/s\n", 1e-9 / m.reduce_s_per_byte);
    std::fflush(stdout);
  }
  // Every algorithm that runs as itself on this group shape (not a fall-back), so `auto`
  // can go by measurement where it has one.
  for (const std::string op : {"all_reduce", "reduce_scatter", "all_gather"}) {
    for (comm::Algorithm alg :
         {comm::Algorithm::mpi, comm::Algorithm::ring, comm::Algorithm::tree, comm::Algorithm::hierarchical}) {
      if (alg != comm::Algorithm::mpi && comm::resolve_algorithm(alg, collective_op(op), max_bytes, topo, m) != alg)
        continue;
      for (int64_t bytes = min_bytes; bytes <= max_bytes; bytes *= 2) {
        int64_t count = std::max<int64_t>(n, bytes / 4 / n * n);
        Buffers b = make_buffers(op, count, n, r);
        g.set_algorithm(alg);
        double t = time_op(g, op, b, iters, warmup);
        m.measured[comm::CostModel::key(alg, collective_op(op), n, topo.hosts())][count * 4] = t;
        if (r == 0) {
          std::printf("  %-12s %-14s %10s %12.1f us\n", comm::algorithm_name(alg), op.c_str(),
                      comm::short_byte_size(count * 4).c_str(), t * 1e6);
          std::fflush(stdout);
        }
      }
    }
  }
  if (r == 0) {
    comm::save_cost_model(m, path);
    std::printf("[bench comm] wrote %s; use it with comm.calibration: %s or LOOM_COMM_CALIBRATION=%s\n", path.c_str(),
                path.c_str(), path.c_str());
    std::printf(
        "SUMMARY {\"bench\":\"comm_calibrate\",\"ranks\":%d,\"hosts\":%d,\"intra_alpha_us\":%.3f,"
        "\"intra_gbps\":%.4f,\"inter_alpha_us\":%.3f,\"inter_gbps\":%.4f,\"reduce_gbps\":%.3f,\"file\":\"%s\"}\n",
        n, topo.hosts(), m.intra.alpha_s * 1e6, m.intra.gbps(), inter_peer > 0 ? m.inter.alpha_s * 1e6 : 0.0,
        inter_peer > 0 ? m.inter.gbps() : 0.0, 1e-9 / m.reduce_s_per_byte, path.c_str());
  }
  return 0;
}

}  // namespace

int bench_comm(const std::vector<std::string>& args) {
  auto app = bench_app("comm",
                       "Sizes double from --min-bytes to --max-bytes (f32 elements; the total buffer of the op). "
                       "--nproc N relaunches through `loom launch --nproc N` unless already under MPI; --hosts also "
                       "(test hosts from scripts/testhosts.sh or real ones; --nproc defaults to its slots). --trace "
                       "DIR writes each rank's trace, collectives included (docs/OBSERVABILITY.md).");
  CommOptions a;
  add_run_default_option(*app, "--nproc", a.nproc, "ranks, through loom launch", "N", positive());
  app->add_option("--hosts", a.hosts, "hosts and ranks per host, through loom launch")->type_name("h1:2,h2:2");
  app->add_option("--ops", a.ops, "of all_reduce, reduce_scatter, all_gather, all_to_all, broadcast")
      ->type_name("LIST");
  app->add_option("--min-bytes", a.min_bytes, "smallest size (default 1K; 4K under --calibrate)")->type_name("SIZE");
  app->add_option("--max-bytes", a.max_bytes, "largest size (default 256M; 64M under --calibrate)")->type_name("SIZE");
  add_run_default_option(*app, "--iters", a.iters, "timed iterations per size (default 20; 10 under --calibrate)", "",
                         positive());
  add_run_default_option(*app, "--warmup", a.warmup, "untimed iterations per size (default 5; 2 under --calibrate)", "",
                         non_negative());
  app->add_option("--algorithms", a.algorithms,
                  "run all_reduce, reduce_scatter and all_gather with each of ring, tree, hierarchical, auto, mpi "
                  "(default: the run's comm algorithm, $LOOM_COMM_ALGORITHM or auto); 'auto' rows name its pick")
      ->type_name("LIST");
  app->add_option("--calibrate", a.calibrate,
                  "measure latency and bandwidth inside and between hosts, the reduction rate and every algorithm's "
                  "time over the sizes, and write the cost model to FILE (for comm.calibration or "
                  "$LOOM_COMM_CALIBRATION)")
      ->type_name("FILE");
  if (auto rc = parse(*app, args)) return *rc;
  if ((app->count("--nproc") || app->count("--hosts")) && !comm::launch_env().under_mpi)
    return relaunch_bench("comm", args);
  if (!a.calibrate.empty()) return calibrate(a, *app);
  std::vector<std::string> ops = split_list(a.ops);
  const std::string min_text = a.min_bytes.empty() ? "1K" : a.min_bytes,
                    max_text = a.max_bytes.empty() ? "256M" : a.max_bytes;
  int64_t min_bytes = comm::parse_byte_size(min_text);
  int64_t max_bytes = comm::parse_byte_size(max_text);
  int iters = app->count("--iters") ? int(a.iters) : 20, warmup = app->count("--warmup") ? int(a.warmup) : 5;
  if (min_bytes > max_bytes)
    throw UsageError("[bench comm] --min-bytes " + min_text + " exceeds --max-bytes " + max_text);

  comm::World world;
  const comm::Group& g = world.group();
  const int n = g.size(), r = g.rank();
  for (const auto& op : ops) comm::bus_bandwidth_factor(op, n);  // rejects unknown ops early
  std::vector<comm::Algorithm> algorithms;
  for (const auto& name : split_list(a.algorithms.empty() ? comm::algorithm_name(g.algorithm()) : a.algorithms))
    algorithms.push_back(comm::parse_algorithm(name));
  const bool compare = !a.algorithms.empty();
  const int hosts = g.hosts();
  bool primary = r == 0;
  if (primary) {
    std::printf("# loom bench comm: %d rank%s on %d host%s (%s), f32, iters %d, warmup %d, cost model: %s\n", n,
                n > 1 ? "s" : "", hosts, hosts > 1 ? "s" : "", g.backend_name(), iters, warmup,
                world.cost_model().source.c_str());
    std::printf("# %-14s %-18s %10s %12s %12s %12s %6s\n", "op", "algorithm", "bytes", "time_us", "algbw_GB/s",
                "busbw_GB/s", "check");
    std::fflush(stdout);
  }
  std::vector<std::pair<std::string, Peak>> peaks;
  // op -> algorithm -> bytes -> seconds; and auto's pick per op and size
  std::map<std::string, std::map<std::string, std::map<int64_t, double>>> seconds;
  std::map<std::string, std::map<int64_t, std::string>> picks;
  std::map<std::string, std::map<std::string, Peak>> algo_peaks;
  int wrong = 0;
  for (const auto& op : ops) {
    Peak peak;
    double factor = comm::bus_bandwidth_factor(op, n);
    std::vector<comm::Algorithm> run =
        has_algorithms(op) ? algorithms : std::vector<comm::Algorithm>{comm::Algorithm::mpi};
    for (comm::Algorithm alg : run) {
      const std::string alg_name = comm::algorithm_name(alg);
      for (int64_t bytes = min_bytes; bytes <= max_bytes; bytes *= 2) {
        int64_t count = std::max<int64_t>(n, bytes / 4 / n * n);  // equal chunks per rank
        int64_t real_bytes = count * 4;
        std::string label = alg_name;
        g.set_algorithm(alg);
        if (has_algorithms(op)) {
          comm::Algorithm ran = g.algorithm_for(collective_op(op), real_bytes);
          if (ran != alg) label += str_cat(":", comm::algorithm_name(ran));
          if (alg == comm::Algorithm::auto_select) picks[op][real_bytes] = comm::algorithm_name(ran);
        }
        Buffers b = make_buffers(op, count, n, r);
        run_op(g, op, b);
        bool ok = result_ok(op, b, n);
        const double med = time_op(g, op, b, iters, warmup);
        Tensor okt = Tensor::from_vector<int32_t>({ok ? 0 : 1}, {1});
        g.all_reduce(okt);
        ok = okt.data<int32_t>()[0] == 0;
        wrong += !ok;
        seconds[op][alg_name][real_bytes] = med;
        double algbw = real_bytes / med / 1e9, busbw = algbw * factor;
        if (busbw > peak.busbw || peak.bytes == 0) peak = {busbw, real_bytes};
        Peak& ap = algo_peaks[op][alg_name];
        if (busbw > ap.busbw || ap.bytes == 0) ap = {busbw, real_bytes};
        if (primary) {
          std::printf("  %-14s %-18s %10s %12.1f %12.3f %12.3f %6s\n", op.c_str(), label.c_str(),
                      comm::short_byte_size(real_bytes).c_str(), med * 1e6, algbw, busbw, ok ? "ok" : "WRONG");
          std::fflush(stdout);
        }
      }
    }
    peaks.emplace_back(op, peak);
  }
  if (primary) {
    std::ostringstream js;
    js << "{\"bench\":\"comm\",\"ranks\":" << n << ",\"backend\":\"" << g.backend_name()
       << "\",\"dtype\":\"f32\",\"iters\":" << iters << ",\"wrong\":" << wrong << ",\"ops\":{";
    for (size_t i = 0; i < peaks.size(); ++i) {
      char bw[32];
      std::snprintf(bw, sizeof bw, "%.3f", peaks[i].second.busbw);
      js << (i ? "," : "") << "\"" << peaks[i].first << "\":{\"peak_busbw_gbps\":" << bw
         << ",\"at_bytes\":" << peaks[i].second.bytes << "}";
    }
    js << "}";
    if (compare) {
      js << ",\"hosts\":" << hosts << ",\"algorithms\":{";
      bool first_op = true;
      for (const auto& [op, by_alg] : algo_peaks) {
        js << (first_op ? "" : ",") << "\"" << op << "\":{";
        first_op = false;
        bool first = true;
        for (const auto& [alg, p] : by_alg) {
          js << (first ? "" : ",") << "\"" << alg << "\":" << fmt3(p.busbw);
          first = false;
        }
        js << "}";
      }
      js << "}";
      // hierarchical over ring: all-reduce bus bandwidth ratio at the largest size.
      const auto& ar = seconds["all_reduce"];
      if (ar.count("ring") && ar.count("hierarchical") && !ar.at("ring").empty())
        js << ",\"hierarchical_over_ring\":"
           << fmt3(ar.at("ring").rbegin()->second / ar.at("hierarchical").rbegin()->second);
      // auto against the best other algorithm at each size: its worst slowdown.
      double worst = 0;
      bool have_auto = false;
      for (const auto& [op, by_alg] : seconds) {
        auto it = by_alg.find("auto");
        if (it == by_alg.end()) continue;
        for (const auto& [bytes, t_auto] : it->second) {
          double best = t_auto;
          for (const auto& [alg, table] : by_alg)
            if (alg != "auto" && table.count(bytes)) best = std::min(best, table.at(bytes));
          worst = std::max(worst, t_auto / best - 1);
          have_auto = true;
        }
      }
      if (have_auto) js << ",\"auto_max_slowdown\":" << fmt3(worst);
      if (!picks.empty()) {  // "4K:tree,1M:hierarchical": each pick from that size on
        js << ",\"auto_picks\":{";
        bool first_op2 = true;
        for (const auto& [op, by_size] : picks) {
          js << (first_op2 ? "" : ",") << "\"" << op << "\":\"";
          first_op2 = false;
          std::string last;
          for (const auto& [bytes, alg] : by_size) {
            if (alg == last) continue;
            js << (last.empty() ? "" : ",") << comm::short_byte_size(bytes) << ":" << alg;
            last = alg;
          }
          js << "\"";
        }
        js << "}";
      }
    }
    js << "}";
    std::printf("SUMMARY %s\n", js.str().c_str());
  }
  return wrong ? 1 : 0;
}

}  // namespace loom::cli

// `loom bench comm`: time collectives over the world group for doubling message sizes, like
// nccl-tests: median time over iterations after warm-up (the slowest rank's time per
// iteration), algorithm and bus bandwidth (factors in comm/bandwidth.h), a result check,
// and `SUMMARY {json}` as the last line. With --nproc it relaunches itself via `loom launch`.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <sstream>

#include "loom/core/stats.h"
#include "loom/comm/bandwidth.h"
#include "loom/comm/launch.h"
#include "loom/comm/world.h"
#include "loom/core/timer.h"
#include "tools/loom/commands.h"

namespace loom::cli {

namespace {

const char* kHelp =
    "usage: loom bench comm [--nproc N] [--ops all_reduce,reduce_scatter,all_gather,all_to_all]\n"
    "                       [--min-bytes 1K] [--max-bytes 256M] [--iters 20] [--warmup 5]\n"
    "                       [--trace DIR]\n\n"
    "Sizes double from --min-bytes to --max-bytes (f32 elements; the total buffer of the op).\n"
    "Ops: all_reduce, reduce_scatter, all_gather, all_to_all, broadcast.\n"
    "--nproc N relaunches through `loom launch --nproc N` unless already under MPI.\n"
    "--trace DIR writes each rank's comm trace (Chrome/Perfetto JSON) there.\n";

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
  if (op == "all_reduce") g.all_reduce(b.in);
  else if (op == "reduce_scatter") g.reduce_scatter(b.in, b.out);
  else if (op == "all_gather") g.all_gather(b.in, b.out);
  else if (op == "all_to_all") g.all_to_all(b.in, b.out);
  else g.broadcast(b.in, 0);
}

// Checks first, middle and last element of the result of one run on fresh buffers.
bool result_ok(const std::string& op, const Buffers& b, int n) {
  const Tensor& t = b.out.defined() ? b.out : b.in;
  const float* p = t.data<float>();
  int64_t m = t.numel();
  for (int64_t i : {int64_t(0), m / 2, m - 1}) {
    double want;
    if (op == "all_reduce" || op == "reduce_scatter") want = n * (n + 1) / 2.0;
    else if (op == "broadcast") want = 1.0;
    else want = double(i / (m / n) + 1);  // chunk q came from rank q
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

}  // namespace

int bench_comm(const std::vector<std::string>& args) {
  Args a("bench comm", args,
         {{"nproc", true}, {"ops", true}, {"min-bytes", true}, {"max-bytes", true},
          {"iters", true}, {"warmup", true}, {"trace", true}, {"help", false}});
  if (a.has("help")) {
    std::printf("%s", kHelp);
    return 0;
  }
  if (a.has("nproc") && !comm::launch_env().under_mpi) {
    std::vector<std::string> launch = {"--nproc", a.get("nproc", "1"), "--", "bench", "comm"};
    for (const auto& s : without_nproc(args)) launch.push_back(s);
    return cmd_launch(launch);
  }
  std::vector<std::string> ops = split_list(a.get("ops", "all_reduce,reduce_scatter,all_gather,all_to_all"));
  int64_t min_bytes = comm::parse_byte_size(a.get("min-bytes", "1K"));
  int64_t max_bytes = comm::parse_byte_size(a.get("max-bytes", "256M"));
  int iters = int(a.get_int("iters", 20)), warmup = int(a.get_int("warmup", 5));
  if (iters < 1 || warmup < 0) throw UsageError("[bench comm] --iters must be >= 1 and --warmup >= 0");
  if (min_bytes > max_bytes)
    throw UsageError("[bench comm] --min-bytes " + a.get("min-bytes", "") + " exceeds --max-bytes " +
                     a.get("max-bytes", ""));

  comm::World world;
  const comm::Group& g = world.group();
  const int n = g.size(), r = g.rank();
  for (const auto& op : ops) comm::bus_bandwidth_factor(op, n);  // rejects unknown ops early
  bool primary = r == 0;
  if (primary) {
    std::printf("# loom bench comm: %d rank%s (%s), f32, iters %d, warmup %d\n", n, n > 1 ? "s" : "",
                g.backend_name(), iters, warmup);
    std::printf("# %-14s %10s %12s %12s %12s %6s\n", "op", "bytes", "time_us", "algbw_GB/s",
                "busbw_GB/s", "check");
    std::fflush(stdout);
  }
  std::vector<std::pair<std::string, Peak>> peaks;
  int wrong = 0;
  Tensor times = Tensor::zeros({iters}, DType::f64);
  for (const auto& op : ops) {
    Peak peak;
    double factor = comm::bus_bandwidth_factor(op, n);
    for (int64_t bytes = min_bytes; bytes <= max_bytes; bytes *= 2) {
      int64_t count = std::max<int64_t>(n, bytes / 4 / n * n);  // equal chunks per rank
      int64_t real_bytes = count * 4;
      Buffers b = make_buffers(op, count, n, r);
      run_op(g, op, b);
      bool ok = result_ok(op, b, n);
      for (int i = 0; i < warmup; ++i) run_op(g, op, b);
      for (int i = 0; i < iters; ++i) {
        g.barrier();
        Stopwatch sw;
        run_op(g, op, b);
        times.data<double>()[i] = sw.seconds();
      }
      g.all_reduce(times, comm::ReduceOp::max);  // an iteration lasts as long as its slowest rank
      Tensor okt = Tensor::from_vector<int32_t>({ok ? 0 : 1}, {1});
      g.all_reduce(okt);
      ok = okt.data<int32_t>()[0] == 0;
      wrong += !ok;
      std::vector<double> t(times.data<double>(), times.data<double>() + iters);
      const double med = median(std::move(t));
      double algbw = real_bytes / med / 1e9, busbw = algbw * factor;
      if (busbw > peak.busbw || peak.bytes == 0) peak = {busbw, real_bytes};
      if (primary) {
        std::printf("  %-14s %10s %12.1f %12.3f %12.3f %6s\n", op.c_str(),
                    comm::short_byte_size(real_bytes).c_str(), med * 1e6, algbw, busbw,
                    ok ? "ok" : "WRONG");
        std::fflush(stdout);
      }
    }
    peaks.emplace_back(op, peak);
  }
  if (a.has("trace")) {
    std::string path = str_cat(a.get("trace", "."), "/comm_trace_rank", r, ".json");
    std::ofstream f(path);
    LOOM_CHECK(f.good(), "bench comm", "cannot write ", path, "; does the --trace directory exist?");
    comm::write_chrome_trace(world.record(), r, f);
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
    js << "}}";
    std::printf("SUMMARY %s\n", js.str().c_str());
  }
  return wrong ? 1 : 0;
}

}  // namespace loom::cli

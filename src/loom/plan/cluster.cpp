#include "loom/plan/cluster.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <sstream>

#include <yaml-cpp/yaml.h>

#include "loom/core/error.h"
#include "loom/io/yaml_load.h"

namespace loom::plan {

double Curve::at(double x) const {
  if (points.empty()) return 1.0;
  if (x <= points.front().first) return points.front().second;
  if (x >= points.back().first) return points.back().second;
  for (size_t i = 1; i < points.size(); ++i)
    if (x <= points[i].first) {
      const auto [x0, y0] = points[i - 1];
      const auto [x1, y1] = points[i];
      const double t = std::log(x / x0) / std::log(x1 / x0);
      return y0 + t * (y1 - y0);
    }
  return points.back().second;
}

namespace {

struct Reader {
  const std::string& source;
  double number(const YAML::Node& parent, const std::string& path, const char* key, bool required, double def) const {
    const YAML::Node n = parent[key];
    if (!n) {
      LOOM_CHECK(!required, "plan", source, ": missing key '", path, key, "'");
      return def;
    }
    double v = 0;
    try {
      v = n.as<double>();
    } catch (const YAML::Exception&) {
      fail("plan", source, ": key '", path, key, "' is not a number");
    }
    LOOM_CHECK(std::isfinite(v) && v >= 0, "plan", source, ": key '", path, key,
               "' must be a non-negative number, got ", v);
    return v;
  }
};

}  // namespace

Cluster parse_cluster(const std::string& text, const std::string& source) {
  const YAML::Node root = io::load_yaml(text, source, "plan", "a cluster file");
  LOOM_CHECK(root.IsMap(), "plan", source, ": expected a map with name, node, links");
  const Reader r{source};
  Cluster c;
  c.name = root["name"] ? root["name"].as<std::string>() : source;
  if (root["description"]) c.description = root["description"].as<std::string>();
  if (const YAML::Node s = root["sources"]; s && s.IsSequence())
    for (const auto& e : s) c.sources.push_back(e.as<std::string>());
  const YAML::Node node = root["node"];
  LOOM_CHECK(node && node.IsMap(), "plan", source, ": missing map 'node'");
  c.devices_per_node = int(r.number(node, "node.", "devices", true, 1));
  LOOM_CHECK(c.devices_per_node >= 1, "plan", source, ": node.devices must be at least 1");
  c.max_nodes = int(r.number(node, "node.", "max_nodes", false, 0));
  DeviceSpec& d = c.device;
  d.name = node["device"] ? node["device"].as<std::string>() : "device";
  d.memory_bytes = r.number(node, "node.", "device_memory_gib", true, 0) * 1024.0 * 1024.0 * 1024.0;
  d.peak_fp32_flops = r.number(node, "node.", "peak_fp32_tflops", true, 0) * 1e12;
  d.peak_bf16_flops = r.number(node, "node.", "peak_bf16_tflops", false, 0) * 1e12;
  d.memory_bytes_per_s = r.number(node, "node.", "memory_gbps", true, 0) * 1e9;
  d.threads = int(r.number(node, "node.", "threads_per_device", false, 0));
  d.attention_flops = r.number(node, "node.", "attention_tflops", false, 0) * 1e12;
  d.stream_bytes_per_s = r.number(node, "node.", "stream_gbps", false, 0) * 1e9;
  d.offload_bytes_per_s = r.number(node, "node.", "offload_gbps", false, 0) * 1e9;
  LOOM_CHECK(d.peak_fp32_flops > 0 && d.memory_bytes_per_s > 0 && d.memory_bytes > 0, "plan", source,
             ": node.peak_fp32_tflops, node.memory_gbps and node.device_memory_gib must be positive");
  if (const YAML::Node e = node["gemm_efficiency"]) {
    LOOM_CHECK(e.IsSequence(), "plan", source, ": node.gemm_efficiency must be a list of [gflop, fraction] pairs");
    for (const auto& p : e) {
      LOOM_CHECK(p.IsSequence() && p.size() == 2, "plan", source,
                 ": node.gemm_efficiency entries are [gflop of one product, fraction of peak]");
      const double x = p[0].as<double>() * 1e9, y = p[1].as<double>();
      LOOM_CHECK(x > 0 && y > 0 && y <= 1.5, "plan", source, ": node.gemm_efficiency entry [", x / 1e9, ", ", y,
                 "] needs a positive size and a fraction in (0, 1.5]");
      d.gemm_efficiency.points.emplace_back(x, y);
    }
    std::sort(d.gemm_efficiency.points.begin(), d.gemm_efficiency.points.end());
  }
  c.overlap_fraction = r.number(root, "", "overlap_fraction", false, 1.0);
  c.comm_under_compute = std::max(1.0, r.number(root, "", "comm_under_compute", false, 1.0));
  const YAML::Node links = root["links"];
  LOOM_CHECK(links && links.IsMap(), "plan", source, ": missing map 'links' (intra, inter)");
  for (const char* cls : {"intra", "inter"}) {
    const YAML::Node l = links[cls];
    LOOM_CHECK(l && l.IsMap(), "plan", source, ": missing map 'links.", cls, "' (alpha_us, gbps)");
    const std::string path = std::string("links.") + cls + ".";
    comm::LinkCost& lc = std::string(cls) == "intra" ? c.links.intra : c.links.inter;
    lc.alpha_s = r.number(l, path, "alpha_us", true, 0) * 1e-6;
    const double gbps = r.number(l, path, "gbps", true, 0);
    LOOM_CHECK(gbps > 0, "plan", source, ": key '", path, "gbps' must be positive");
    lc.beta_s_per_byte = 1.0 / (gbps * 1e9);
  }
  const double reduce = r.number(links, "links.", "reduce_gbps", false, d.memory_bytes_per_s / 3 / 1e9);
  c.links.reduce_s_per_byte = 1.0 / (std::max(reduce, 1e-3) * 1e9);
  // Measured collective times (loom bench comm --calibrate), which `auto` prefers to the model
  // for the group shapes they cover: [algorithm, op, ranks, hosts, bytes, microseconds].
  if (const YAML::Node m = links["measured"]) {
    LOOM_CHECK(m.IsSequence(), "plan", source, ": links.measured must be a list");
    for (const auto& e : m) {
      LOOM_CHECK(e.IsSequence() && e.size() == 6, "plan", source,
                 ": links.measured entries are [algorithm, op, ranks, hosts, bytes, us]");
      const comm::Algorithm a = comm::parse_algorithm(e[0].as<std::string>());
      const std::string op = e[1].as<std::string>();
      comm::CollectiveOp o = comm::CollectiveOp::all_reduce;
      if (op == "reduce_scatter")
        o = comm::CollectiveOp::reduce_scatter;
      else if (op == "all_gather")
        o = comm::CollectiveOp::all_gather;
      else
        LOOM_CHECK(op == "all_reduce", "plan", source, ": links.measured op '", op, "' is not a collective");
      c.links.measured[comm::CostModel::key(a, o, e[2].as<int>(), e[3].as<int>())][e[4].as<int64_t>()] =
          e[5].as<double>() * 1e-6;
    }
  }
  c.links.calibrated = true;
  c.links.source = source;
  return c;
}

Cluster load_cluster(const std::string& path) {
  std::ifstream f(path);
  LOOM_CHECK(f.good(), "plan", "cannot read the cluster file ", path,
             "; see configs/clusters/ or write one with `loom plan --calibrate ", path, "`");
  std::stringstream ss;
  ss << f.rdbuf();
  Cluster c = parse_cluster(ss.str(), path);
  c.path = path;
  return c;
}

std::string cluster_yaml(const Cluster& c) {
  std::ostringstream o;
  o.precision(6);
  o << "name: " << c.name << "\n";
  if (!c.description.empty()) o << "description: \"" << c.description << "\"\n";
  if (!c.sources.empty()) {
    o << "sources:\n";
    for (const auto& s : c.sources) o << "  - \"" << s << "\"\n";
  }
  const DeviceSpec& d = c.device;
  o << "node:\n"
    << "  devices: " << c.devices_per_node << "\n";
  if (c.max_nodes) o << "  max_nodes: " << c.max_nodes << "\n";
  o << "  device: \"" << d.name << "\"\n"
    << "  threads_per_device: " << d.threads << "\n"
    << "  device_memory_gib: " << d.memory_bytes / (1024.0 * 1024.0 * 1024.0) << "\n"
    << "  peak_fp32_tflops: " << d.peak_fp32_flops / 1e12 << "\n"
    << "  peak_bf16_tflops: " << d.peak_bf16_flops / 1e12 << "\n"
    << "  memory_gbps: " << d.memory_bytes_per_s / 1e9 << "\n"
    << "  attention_tflops: " << d.attention_flops / 1e12 << "\n"
    << "  stream_gbps: " << d.stream_bytes_per_s / 1e9 << "\n";
  if (d.offload_bytes_per_s > 0) o << "  offload_gbps: " << d.offload_bytes_per_s / 1e9 << "\n";
  o << "  gemm_efficiency:  # [GFLOP of one product, fraction of peak_fp32]\n";
  for (const auto& [x, y] : d.gemm_efficiency.points) o << "    - [" << x / 1e9 << ", " << y << "]\n";
  o << "overlap_fraction: " << c.overlap_fraction << "\n"
    << "comm_under_compute: " << c.comm_under_compute << "\n"
    << "links:\n"
    << "  intra: {alpha_us: " << c.links.intra.alpha_s * 1e6 << ", gbps: " << c.links.intra.gbps() << "}\n"
    << "  inter: {alpha_us: " << c.links.inter.alpha_s * 1e6 << ", gbps: " << c.links.inter.gbps() << "}\n"
    << "  reduce_gbps: " << 1e-9 / c.links.reduce_s_per_byte << "\n";
  if (!c.links.measured.empty()) {
    o << "  measured:  # [algorithm, op, ranks, hosts, bytes, us] from loom bench comm --calibrate\n";
    for (const auto& [key, times] : c.links.measured) {
      std::string k = key;  // "ring/all_reduce/2/1"
      for (char& ch : k)
        if (ch == '/') ch = ' ';
      std::istringstream in(k);
      std::string alg, op;
      int ranks = 0, hosts = 0;
      in >> alg >> op >> ranks >> hosts;
      for (const auto& [bytes, s] : times)
        o << "    - [" << alg << ", " << op << ", " << ranks << ", " << hosts << ", " << bytes << ", " << s * 1e6
          << "]\n";
    }
  }
  return o.str();
}

}  // namespace loom::plan

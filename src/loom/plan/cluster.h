// A cluster as the planner sees it: how many devices a node has, what one device computes
// (peak matrix FLOP/s, the fraction of it a product of a given size reaches, memory bandwidth
// for the elementwise work) and what the links cost (alpha-beta per link class, as comm's
// cost model). Read from and written to YAML files (configs/clusters/); every number there
// says where it came from. Pure data and file IO.
#pragma once
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "loom/comm/algorithm.h"

namespace loom::plan {

// y(x) through measured points, interpolated linearly in log x and clamped at both ends.
struct Curve {
  std::vector<std::pair<double, double>> points;  // ascending x
  double at(double x) const;
};

struct DeviceSpec {
  std::string name;
  double memory_bytes = 0;        // usable by one rank
  double peak_fp32_flops = 0;     // dense matrix products, per device
  double peak_bf16_flops = 0;     // 0: no 16-bit matrix engine (bf16 runs at the fp32 rate)
  Curve gemm_efficiency;          // fraction of peak reached by one product of x FLOPs
  double memory_bytes_per_s = 0;  // what the model's elementwise kernels stream (read + write)
  double stream_bytes_per_s = 0;  // a plain streaming kernel (the optimizer); 0: memory_bytes_per_s
  // Copies to and from offloaded optimizer state (parallel.offload: host pool or disk); 0: the
  // stream rate (a host pool, or files the page cache holds).
  double offload_bytes_per_s = 0;
  double attention_flops = 0;  // causal attention kernels' rate; 0: at the product curve
  int threads = 0;             // CPU ranks: threads per rank the figures were measured with
};

struct Cluster {
  std::string name;
  std::string description;
  std::vector<std::string> sources;  // where the numbers come from
  int devices_per_node = 1;
  int max_nodes = 0;  // 0: any number
  DeviceSpec device;
  comm::CostModel links;  // intra: inside a node; inter: a node's link to the others
  // Fraction of the backward pass that data-parallel gradient reduction can hide behind
  // (1: all of it, as bucketed overlap allows; 0 where communication takes the cores that
  // compute, as CPU ranks copying through shared memory do).
  double overlap_fraction = 1.0;
  // How much longer collectives take while the ranks compute than on idle links (>= 1): CPU
  // ranks copy with the cores and memory bandwidth the compute uses. 1 for GPUs (copy engines
  // and NICs of their own).
  double comm_under_compute = 1.0;
  std::string path;  // the file it was read from
};

// Throws "[plan] FILE: key 'node.devices' ..." naming the file and key on bad input.
Cluster load_cluster(const std::string& path);
Cluster parse_cluster(const std::string& yaml_text, const std::string& source);
std::string cluster_yaml(const Cluster& c);

}  // namespace loom::plan

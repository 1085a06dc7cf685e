// How collective benchmarks turn a time into bandwidths, with the conventions of
// nccl-tests (doc/PERFORMANCE.md there): algorithm bandwidth = bytes / time, and bus
// bandwidth = algorithm bandwidth x a per-operation factor that makes it comparable with
// the link speed whatever the number of ranks n.
#pragma once
#include <cstdint>
#include <string>

namespace loom::comm {

// all_reduce 2(n-1)/n; reduce_scatter, all_gather, all_to_all (n-1)/n; broadcast 1.
// Throws naming the operation when it has no factor.
double bus_bandwidth_factor(const std::string& op, int n);
// "1K" -> 1024, "256M", "2G", "4096"; throws naming the text when it is not a size.
int64_t parse_byte_size(const std::string& text);
// 1024 -> "1K", 3 << 20 -> "3M", 1000 -> "1000": the shortest exact form.
std::string short_byte_size(int64_t bytes);

}  // namespace loom::comm

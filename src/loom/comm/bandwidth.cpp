// Bus-bandwidth factors and byte-size parsing for `loom bench comm`.
#include "loom/comm/bandwidth.h"

#include <cstdlib>

#include "loom/core/error.h"

namespace loom::comm {

double bus_bandwidth_factor(const std::string& op, int n) {
  LOOM_CHECK(n >= 1, "comm", "bus bandwidth needs at least one rank, got ", n);
  // A ring all-reduce moves 2(n-1)/n of the buffer over each link (reduce-scatter, then
  // all-gather); the one-phase operations move (n-1)/n; a pipelined broadcast moves it once.
  if (op == "all_reduce") return 2.0 * (n - 1) / n;
  if (op == "reduce_scatter" || op == "all_gather" || op == "all_to_all") return double(n - 1) / n;
  if (op == "broadcast") return 1.0;
  fail("comm", "no bus bandwidth factor for '", op,
       "'; known: all_reduce, reduce_scatter, all_gather, all_to_all, broadcast");
}

int64_t parse_byte_size(const std::string& text) {
  char* end = nullptr;
  long long v = std::strtoll(text.c_str(), &end, 10);
  int64_t mult = 1;
  std::string suffix = end ? end : "";
  if (suffix == "K" || suffix == "k" || suffix == "KiB")
    mult = int64_t(1) << 10;
  else if (suffix == "M" || suffix == "MiB")
    mult = int64_t(1) << 20;
  else if (suffix == "G" || suffix == "GiB")
    mult = int64_t(1) << 30;
  else if (!suffix.empty() && suffix != "B")
    mult = 0;
  LOOM_CHECK(end != text.c_str() && v > 0 && mult > 0, "comm", "'", text,
             "' is not a byte size; use e.g. 4096, 1K, 256M or 2G");
  return int64_t(v) * mult;
}

std::string short_byte_size(int64_t bytes) {
  const char* units[] = {"", "K", "M", "G"};
  int u = 0;
  while (u < 3 && bytes >= 1024 && bytes % 1024 == 0) {
    bytes /= 1024;
    ++u;
  }
  return str_cat(bytes, units[u]);
}

}  // namespace loom::comm

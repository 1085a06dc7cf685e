#include "loom/core/allocator.h"

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <new>

#include "loom/core/enum_names.h"
#include "loom/core/error.h"

namespace loom {

const char* mem_category_name(MemCategory c) {
  static constexpr EnumName<MemCategory> kNames[] = {
      {MemCategory::params, "params"},       {MemCategory::grads, "grads"},
      {MemCategory::optimizer, "optimizer"}, {MemCategory::activations, "activations"},
      {MemCategory::workspace, "workspace"}, {MemCategory::kv_cache, "kv_cache"},
      {MemCategory::comm, "comm"},           {MemCategory::other, "other"},
      {MemCategory::offloaded, "offloaded"}};
  return enum_name(kNames, c);
}

MemorySnapshot Allocator::snapshot() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stats_;
}

void Allocator::reset_peaks() {
  std::lock_guard<std::mutex> lock(mu_);
  for (auto& c : stats_.by_category) c.peak = c.current;
  stats_.total.peak = stats_.total.current;
}

void Allocator::record_alloc(size_t bytes, MemCategory cat) {
  std::lock_guard<std::mutex> lock(mu_);
  auto& c = stats_.by_category[size_t(cat)];
  c.current += int64_t(bytes);
  if (c.current > c.peak) c.peak = c.current;
  stats_.total.current += int64_t(bytes);
  if (stats_.total.current > stats_.total.peak) stats_.total.peak = stats_.total.current;
}

void Allocator::record_free(size_t bytes, MemCategory cat) {
  std::lock_guard<std::mutex> lock(mu_);
  stats_.by_category[size_t(cat)].current -= int64_t(bytes);
  stats_.total.current -= int64_t(bytes);
}

void* CpuAllocator::allocate(size_t bytes, MemCategory cat) {
  size_t rounded = (bytes + 63) / 64 * 64;
  if (rounded == 0) rounded = 64;
  void* p = std::aligned_alloc(64, rounded);
  if (!p)
    fail("alloc", "out of host memory allocating ", format_bytes(int64_t(bytes)), " for ", mem_category_name(cat));
  record_alloc(bytes, cat);
  return p;
}

void CpuAllocator::deallocate(void* p, size_t bytes, MemCategory cat) {
  if (!p) return;
  std::free(p);
  record_free(bytes, cat);
}

Allocator& cpu_allocator() {
  static CpuAllocator instance;
  return instance;
}

std::map<std::string, int64_t> memory_stats(const Allocator& a) {
  MemorySnapshot s = a.snapshot();
  std::map<std::string, int64_t> out;
  for (int i = 0; i < kNumMemCategories; ++i) {
    std::string n = mem_category_name(MemCategory(i));
    out[n + ".current"] = s.by_category[i].current;
    out[n + ".peak"] = s.by_category[i].peak;
  }
  out["allocated_bytes.all.current"] = s.total.current;
  out["allocated_bytes.all.peak"] = s.total.peak;
  return out;
}

int64_t physical_memory_bytes() { return int64_t(sysconf(_SC_PHYS_PAGES)) * int64_t(sysconf(_SC_PAGESIZE)); }

std::string format_bytes(int64_t bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double v = double(bytes);
  int u = 0;
  while ((v >= 1024.0 || v <= -1024.0) && u < 4) {
    v /= 1024.0;
    ++u;
  }
  char buf[32];
  std::snprintf(buf, sizeof buf, u == 0 ? "%.0f %s" : "%.2f %s", v, units[u]);
  return buf;
}

}  // namespace loom

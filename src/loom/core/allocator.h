// Byte-accounted memory: every allocation carries a category, and an Allocator keeps the
// current and peak bytes per category and in total. It does not pool or cache blocks.
#pragma once
#include <array>
#include <cstddef>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>

namespace loom {

enum class Device : uint8_t { cpu, cuda };

// offloaded: state moved off the device between uses (parallel.offload's host pool), counted apart
// from what a rank holds resident.
enum class MemCategory : uint8_t { params, grads, optimizer, activations, workspace, kv_cache, comm, other, offloaded };
inline constexpr int kNumMemCategories = 9;
const char* mem_category_name(MemCategory c);

struct MemCounter {
  int64_t current = 0;
  int64_t peak = 0;
};

struct MemorySnapshot {
  std::array<MemCounter, kNumMemCategories> by_category{};
  MemCounter total;
  const MemCounter& operator[](MemCategory c) const { return by_category[size_t(c)]; }
};

class Allocator {
 public:
  virtual ~Allocator() = default;
  virtual void* allocate(size_t bytes, MemCategory cat) = 0;
  virtual void deallocate(void* p, size_t bytes, MemCategory cat) = 0;
  virtual const char* device_name() const = 0;
  virtual Device device() const { return Device::cpu; }

  MemorySnapshot snapshot() const;
  // Sets every peak to the current value (start of a measured region).
  void reset_peaks();

 protected:
  void record_alloc(size_t bytes, MemCategory cat);
  void record_free(size_t bytes, MemCategory cat);

 private:
  mutable std::mutex mu_;
  MemorySnapshot stats_;
};

// Host memory, 64-byte aligned (one cache line, one AVX-512 register).
class CpuAllocator final : public Allocator {
 public:
  void* allocate(size_t bytes, MemCategory cat) override;
  void deallocate(void* p, size_t bytes, MemCategory cat) override;
  const char* device_name() const override { return "cpu"; }
};

// The process's host allocator, used when a caller passes none. Tests that need isolated
// figures construct their own CpuAllocator.
Allocator& cpu_allocator();

// Flat view of an allocator's counters: "<category>.current", "<category>.peak",
// "allocated_bytes.all.current", "allocated_bytes.all.peak" (the keys PyTorch users know).
std::map<std::string, int64_t> memory_stats(const Allocator& a = cpu_allocator());

// "1.23 GiB" style.
std::string format_bytes(int64_t bytes);

// This machine's physical memory (the fits-in-memory checks' bound when none is configured).
int64_t physical_memory_bytes();

}  // namespace loom

// The safetensors format (github.com/huggingface/safetensors): an 8-byte little-endian header
// length, a JSON header {name: {dtype, shape, data_offsets: [begin, end)}, "__metadata__":
// {str: str}} padded with spaces to 8 bytes, then one hole-free data section. Reading maps the
// file and validates every offset before any tensor is handed out. No model knowledge here.
#pragma once
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "loom/core/tensor.h"
#include "loom/io/file.h"

namespace loom::io {

// "F32", "F64", "BF16", "F16", "I32", "I64", "I8", "U8".
const char* safetensors_dtype_name(DType t);
// Throws "[safetensors] unsupported dtype 'X' (supported: ...)".
DType safetensors_dtype_from_name(const std::string& name);

struct SafetensorsEntry {
  std::string name;
  DType dtype = DType::f32;
  std::vector<int64_t> shape;   // any rank; get() needs <= Shape::kMaxDims
  uint64_t begin = 0, end = 0;  // byte range within the data section
  int64_t numel() const;
  std::string shape_str() const;  // "[2, 3]"
};

// Collects tensors and metadata, then writes one file atomically. Tensors are laid out by
// decreasing element size (then name), so every tensor is aligned to its element size.
class SafetensorsWriter {
 public:
  // Shares t's storage (no copy): the bytes written are those t holds when write() runs.
  void add(const std::string& name, const Tensor& t);
  // Copies `bytes`, which must be numel(shape) * dtype_size(dtype) long.
  void add(const std::string& name, DType dtype, const std::vector<int64_t>& shape, const void* bytes, size_t n_bytes);
  void set_metadata(const std::string& key, const std::string& value);
  size_t size() const { return items_.size(); }
  // Writes to "<path>.tmp.<pid>" and renames; returns the file's CRC32C.
  uint32_t write(const std::string& path) const;

 private:
  struct Item {
    std::string name;
    DType dtype;
    std::vector<int64_t> shape;
    Tensor tensor;      // shared storage, or
    std::string owned;  // copied bytes
  };
  void check_new_name(const std::string& name) const;
  std::vector<Item> items_;
  std::map<std::string, std::string> metadata_;
};

// A validated, memory-mapped safetensors file. Errors read
// "[safetensors] <path>: <problem>", e.g. a tensor whose data_offsets pass the data section.
class SafetensorsFile {
 public:
  static SafetensorsFile open(const std::string& path);

  const std::string& path() const { return map_->path(); }
  // Sorted by name.
  const std::vector<SafetensorsEntry>& entries() const { return entries_; }
  std::vector<std::string> names() const;
  bool contains(const std::string& name) const { return index_.count(name) != 0; }
  const SafetensorsEntry& entry(const std::string& name) const;  // throws naming the file
  const std::map<std::string, std::string>& metadata() const { return metadata_; }

  // A tensor borrowing the mapping (kept alive by the tensor). The mapping is private:
  // writing into the tensor never changes the file. A tensor whose offset is not aligned to
  // its element size (legal in files from other writers) is copied instead.
  Tensor get(const std::string& name) const;
  const unsigned char* data(const SafetensorsEntry& e) const { return data_ + e.begin; }

 private:
  std::shared_ptr<const MappedFile> map_;
  const unsigned char* data_ = nullptr;  // start of the data section
  std::vector<SafetensorsEntry> entries_;
  std::map<std::string, size_t> index_;
  std::map<std::string, std::string> metadata_;
};

}  // namespace loom::io

// The GGUF container (llama.cpp's model file, versions 2 and 3): a header, typed key/value
// metadata, tensor descriptions and one aligned data section. Reading maps the file and checks
// every length, count and offset before anything is handed out; errors read
// "[gguf] <path>: <problem>; <fix>". What the tensors' bytes mean (block quantization) is
// gguf_quants.h; what the keys mean for a model (architecture, tokenizer) lives in model/ and
// data/. No model knowledge here.
#pragma once
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "loom/io/file.h"

namespace loom::io {

// Metadata value types, numbered as the format numbers them.
enum class GgufType : uint32_t {
  u8 = 0,
  i8 = 1,
  u16 = 2,
  i16 = 3,
  u32 = 4,
  i32 = 5,
  f32 = 6,
  boolean = 7,
  string = 8,
  array = 9,
  u64 = 10,
  i64 = 11,
  f64 = 12,
};
const char* gguf_type_name(GgufType t);

// One metadata value. Integers of every width are held in `i` (u64 values above INT64_MAX in
// `u` too), floats in `f`; an array holds its elements in `items`, all of `elem_type`.
struct GgufValue {
  GgufType type = GgufType::u8;
  GgufType elem_type = GgufType::u8;  // arrays only
  int64_t i = 0;
  uint64_t u = 0;
  double f = 0;
  bool b = false;
  std::string s;
  std::vector<GgufValue> items;
  bool is_integer() const;
  bool is_number() const { return is_integer() || type == GgufType::f32 || type == GgufType::f64; }
  // The value as text, for `loom inspect`-style listings (arrays abbreviated past `max_items`).
  std::string describe(size_t max_items = 8) const;
};

// Tensor element types, numbered as ggml numbers them. Only the ones loom reads have names
// here; any other number is kept and reported by number.
enum class GgmlType : uint32_t {
  f32 = 0,
  f16 = 1,
  q4_0 = 2,
  q4_1 = 3,
  q5_0 = 6,
  q5_1 = 7,
  q8_0 = 8,
  q8_1 = 9,
  q2_k = 10,
  q3_k = 11,
  q4_k = 12,
  q5_k = 13,
  q6_k = 14,
  q8_k = 15,
  i8 = 24,
  i16 = 25,
  i32 = 26,
  i64 = 27,
  f64 = 28,
  bf16 = 30,
};
// "F32", "Q4_K", ...; "type 23" for a number loom does not know.
std::string ggml_type_name(GgmlType t);
// Elements per block and bytes per block of a type; false for a type loom does not know.
bool ggml_block_shape(GgmlType t, int64_t* block_elems, int64_t* block_bytes);

struct GgufTensor {
  std::string name;
  std::vector<int64_t> ne;  // ggml order: ne[0] is the contiguous (row) dimension
  GgmlType type = GgmlType::f32;
  uint64_t offset = 0;  // within the data section
  uint64_t nbytes = 0;
  int64_t numel() const;
  int64_t rows() const { return ne.empty() ? 1 : numel() / ne[0]; }
  // The shape in PyTorch order (ne reversed), "[576, 49152]" style for ggml order too.
  std::vector<int64_t> torch_shape() const { return {ne.rbegin(), ne.rend()}; }
  std::string shape_str() const;  // ggml order, as gguf-dump prints it
};

class GgufFile {
 public:
  // Maps and validates `path`: magic, version 2 or 3, every string and array length within
  // the file, tensor types known, tensor byte ranges inside the data section, aligned and
  // not overlapping.
  static GgufFile open(const std::string& path);

  const std::string& path() const { return map_->path(); }
  uint32_t version() const { return version_; }
  uint64_t alignment() const { return alignment_; }

  const std::map<std::string, GgufValue>& metadata() const { return metadata_; }
  bool has(const std::string& key) const { return metadata_.count(key) != 0; }
  const GgufValue* find(const std::string& key) const;
  // Typed reads: a missing key or a value of another kind throws naming the file and the key.
  const GgufValue& value(const std::string& key) const;
  int64_t get_int(const std::string& key) const;
  int64_t get_int(const std::string& key, int64_t fallback) const;
  double get_float(const std::string& key) const;  // any numeric type
  double get_float(const std::string& key, double fallback) const;
  bool get_bool(const std::string& key, bool fallback) const;
  std::string get_string(const std::string& key) const;
  std::string get_string(const std::string& key, const std::string& fallback) const;
  std::vector<std::string> get_strings(const std::string& key) const;
  std::vector<int64_t> get_ints(const std::string& key) const;
  std::vector<double> get_floats(const std::string& key) const;

  const std::vector<GgufTensor>& tensors() const { return tensors_; }
  bool contains(const std::string& name) const { return index_.count(name) != 0; }
  const GgufTensor& tensor(const std::string& name) const;  // throws naming the file
  const unsigned char* data(const GgufTensor& t) const { return data_ + t.offset; }
  uint64_t file_size() const { return map_->size(); }

 private:
  std::shared_ptr<const MappedFile> map_;
  const unsigned char* data_ = nullptr;
  uint32_t version_ = 0;
  uint64_t alignment_ = 32;
  std::map<std::string, GgufValue> metadata_;
  std::vector<GgufTensor> tensors_;
  std::map<std::string, size_t> index_;
};

// Writes a GGUF v3 file (tests, fuzz seeds and `loom export` use it): metadata in the order
// given, tensors' bytes already in their ggml type.
class GgufWriter {
 public:
  void set(const std::string& key, GgufValue v);
  void add_tensor(const std::string& name, GgmlType type, const std::vector<int64_t>& ne, std::string bytes);
  void set_alignment(uint64_t a) { alignment_ = a; }
  void write(const std::string& path) const;  // atomically, streamed
  std::string bytes() const;                  // the whole file in memory

 private:
  void emit(const std::function<void(std::string_view)>& out) const;  // the file's bytes, in order
  std::vector<std::pair<std::string, GgufValue>> kv_;
  struct Item {
    std::string name;
    GgmlType type;
    std::vector<int64_t> ne;
    std::string bytes;
  };
  std::vector<Item> tensors_;
  uint64_t alignment_ = 32;
};

// Value builders for the writer.
GgufValue gguf_int(int64_t v, GgufType t = GgufType::i32);
GgufValue gguf_uint(uint64_t v, GgufType t = GgufType::u32);
GgufValue gguf_float(double v, GgufType t = GgufType::f32);
GgufValue gguf_bool(bool v);
GgufValue gguf_string(std::string v);
GgufValue gguf_array(GgufType elem, std::vector<GgufValue> items);
GgufValue gguf_strings(const std::vector<std::string>& v);

}  // namespace loom::io

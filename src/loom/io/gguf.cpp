#include "loom/io/gguf.h"

#include <algorithm>
#include <cstring>

#include "loom/core/enum_names.h"
#include "loom/core/error.h"

namespace loom::io {

namespace {

constexpr uint32_t kMagic = 0x46554747;  // "GGUF" read little-endian
// Counts past these are treated as a corrupt file rather than allocated.
constexpr uint64_t kMaxStringBytes = uint64_t(1) << 30;
constexpr uint64_t kMaxArrayItems = uint64_t(1) << 28;
constexpr uint64_t kMaxTensors = uint64_t(1) << 20;
constexpr uint32_t kMaxDims = 4;
constexpr int kMaxArrayDepth = 4;

struct TypeInfo {
  GgmlType type;
  const char* name;
  int64_t block_elems, block_bytes;
};
constexpr TypeInfo kTypes[] = {
    {GgmlType::f32, "F32", 1, 4},       {GgmlType::f16, "F16", 1, 2},       {GgmlType::q4_0, "Q4_0", 32, 18},
    {GgmlType::q4_1, "Q4_1", 32, 20},   {GgmlType::q5_0, "Q5_0", 32, 22},   {GgmlType::q5_1, "Q5_1", 32, 24},
    {GgmlType::q8_0, "Q8_0", 32, 34},   {GgmlType::q8_1, "Q8_1", 32, 36},   {GgmlType::q2_k, "Q2_K", 256, 84},
    {GgmlType::q3_k, "Q3_K", 256, 110}, {GgmlType::q4_k, "Q4_K", 256, 144}, {GgmlType::q5_k, "Q5_K", 256, 176},
    {GgmlType::q6_k, "Q6_K", 256, 210}, {GgmlType::q8_k, "Q8_K", 256, 292}, {GgmlType::i8, "I8", 1, 1},
    {GgmlType::i16, "I16", 1, 2},       {GgmlType::i32, "I32", 1, 4},       {GgmlType::i64, "I64", 1, 8},
    {GgmlType::f64, "F64", 1, 8},       {GgmlType::bf16, "BF16", 1, 2},
};

const TypeInfo* type_info(GgmlType t) {
  for (const auto& i : kTypes)
    if (i.type == t) return &i;
  return nullptr;
}

// Bounds-checked little-endian reads over the mapped header; every failure names the file,
// the offset and what was being read.
class Cursor {
 public:
  Cursor(const std::string& path, const unsigned char* p, uint64_t size) : path_(path), p_(p), size_(size) {}
  uint64_t pos() const { return pos_; }
  void need(uint64_t n, const char* what) const {
    if (n > size_ - pos_)
      fail("gguf", path_, ": the file ends at byte ", size_, " inside ", what, " (at byte ", pos_,
           "); the file is truncated: download it again");
  }
  template <class T>
  T read(const char* what) {
    need(sizeof(T), what);
    T v;
    std::memcpy(&v, p_ + pos_, sizeof(T));
    pos_ += sizeof(T);
    return v;
  }
  std::string string(const char* what) {
    const uint64_t n = read<uint64_t>(what);
    if (n > kMaxStringBytes)
      fail("gguf", path_, ": ", what, " at byte ", pos_ - 8, " claims ", n, " bytes; the file is corrupt");
    need(n, what);
    std::string s(reinterpret_cast<const char*>(p_ + pos_), n);
    pos_ += n;
    return s;
  }

 private:
  const std::string& path_;
  const unsigned char* p_;
  uint64_t size_, pos_ = 0;
};

bool known_value_type(uint32_t t) { return t <= uint32_t(GgufType::f64); }

GgufValue read_value(Cursor& c, GgufType type, const std::string& path, const std::string& key, int depth) {
  GgufValue v;
  v.type = type;
  const char* what = "a metadata value";
  switch (type) {
    case GgufType::u8: v.i = c.read<uint8_t>(what); break;
    case GgufType::i8: v.i = c.read<int8_t>(what); break;
    case GgufType::u16: v.i = c.read<uint16_t>(what); break;
    case GgufType::i16: v.i = c.read<int16_t>(what); break;
    case GgufType::u32: v.i = c.read<uint32_t>(what); break;
    case GgufType::i32: v.i = c.read<int32_t>(what); break;
    case GgufType::u64:
      v.u = c.read<uint64_t>(what);
      v.i = int64_t(std::min<uint64_t>(v.u, uint64_t(INT64_MAX)));
      break;
    case GgufType::i64: v.i = c.read<int64_t>(what); break;
    case GgufType::f32: v.f = c.read<float>(what); break;
    case GgufType::f64: v.f = c.read<double>(what); break;
    case GgufType::boolean: {
      const uint8_t b = c.read<uint8_t>(what);
      LOOM_CHECK(b <= 1, "gguf", path, ": key '", key, "' holds a boolean of value ", int(b), "; the file is corrupt");
      v.b = b != 0;
      break;
    }
    case GgufType::string: v.s = c.string("a metadata string"); break;
    case GgufType::array: {
      LOOM_CHECK(depth < kMaxArrayDepth, "gguf", path, ": key '", key, "' nests arrays deeper than ", kMaxArrayDepth,
                 "; the file is corrupt");
      const uint32_t et = c.read<uint32_t>("an array's element type");
      LOOM_CHECK(known_value_type(et), "gguf", path, ": key '", key, "' is an array of unknown type ", et,
                 "; the file is corrupt or from a newer GGUF version");
      const uint64_t n = c.read<uint64_t>("an array's length");
      LOOM_CHECK(n <= kMaxArrayItems, "gguf", path, ": key '", key, "' claims ", n,
                 " array items; the file is corrupt");
      // Each item takes at least one byte: a count past the bytes left is corrupt, and
      // checking it first keeps a bad count from allocating.
      c.need(n, "an array");
      v.elem_type = GgufType(et);
      v.items.reserve(n);
      for (uint64_t k = 0; k < n; ++k) v.items.push_back(read_value(c, v.elem_type, path, key, depth + 1));
      break;
    }
  }
  return v;
}

}  // namespace

const char* gguf_type_name(GgufType t) {
  static constexpr EnumName<GgufType> kNames[] = {
      {GgufType::u8, "uint8"},      {GgufType::i8, "int8"},     {GgufType::u16, "uint16"},  {GgufType::i16, "int16"},
      {GgufType::u32, "uint32"},    {GgufType::i32, "int32"},   {GgufType::f32, "float32"}, {GgufType::boolean, "bool"},
      {GgufType::string, "string"}, {GgufType::array, "array"}, {GgufType::u64, "uint64"},  {GgufType::i64, "int64"},
      {GgufType::f64, "float64"}};
  return enum_name(kNames, t, "unknown");
}

bool GgufValue::is_integer() const {
  switch (type) {
    case GgufType::u8:
    case GgufType::i8:
    case GgufType::u16:
    case GgufType::i16:
    case GgufType::u32:
    case GgufType::i32:
    case GgufType::u64:
    case GgufType::i64: return true;
    default: return false;
  }
}

std::string GgufValue::describe(size_t max_items) const {
  if (type == GgufType::u64) return str_cat(u);
  if (is_integer()) return str_cat(i);
  switch (type) {
    case GgufType::f32:
    case GgufType::f64: return str_cat(f);
    case GgufType::boolean: return b ? "true" : "false";
    case GgufType::string: return s.size() > 60 ? str_cat("\"", s.substr(0, 57), "...\"") : str_cat("\"", s, "\"");
    case GgufType::array: {
      std::string out = str_cat("[", gguf_type_name(elem_type), " x ", items.size(), ": ");
      for (size_t k = 0; k < items.size() && k < max_items; ++k) out += str_cat(k ? ", " : "", items[k].describe());
      return out + (items.size() > max_items ? ", ...]" : "]");
    }
    default: return "?";
  }
}

std::string ggml_type_name(GgmlType t) {
  const TypeInfo* i = type_info(t);
  return i ? i->name : str_cat("type ", uint32_t(t));
}

bool ggml_block_shape(GgmlType t, int64_t* block_elems, int64_t* block_bytes) {
  const TypeInfo* i = type_info(t);
  if (!i) return false;
  *block_elems = i->block_elems;
  *block_bytes = i->block_bytes;
  return true;
}

int64_t GgufTensor::numel() const {
  int64_t n = 1;
  for (int64_t d : ne) n *= d;
  return n;
}

std::string GgufTensor::shape_str() const {
  std::string s = "[";
  for (size_t k = 0; k < ne.size(); ++k) s += str_cat(k ? ", " : "", ne[k]);
  return s + "]";
}

GgufFile GgufFile::open(const std::string& path) {
  GgufFile g;
  g.map_ = MappedFile::open(path, "gguf", "check the path to the .gguf file");
  const unsigned char* base = g.map_->data();
  const uint64_t size = g.map_->size();
  Cursor c(path, base, size);
  const uint32_t magic = c.read<uint32_t>("the magic number");
  LOOM_CHECK(magic == kMagic, "gguf", path, ": not a GGUF file (its first bytes are not \"GGUF\")");
  g.version_ = c.read<uint32_t>("the version");
  LOOM_CHECK(g.version_ == 2 || g.version_ == 3, "gguf", path, ": GGUF version ", g.version_,
             " is not supported (loom reads versions 2 and 3); convert it again with a current llama.cpp");
  const uint64_t n_tensors = c.read<uint64_t>("the tensor count");
  const uint64_t n_kv = c.read<uint64_t>("the metadata count");
  LOOM_CHECK(n_tensors <= kMaxTensors, "gguf", path, ": claims ", n_tensors, " tensors; the file is corrupt");
  LOOM_CHECK(n_kv <= kMaxArrayItems, "gguf", path, ": claims ", n_kv, " metadata keys; the file is corrupt");

  for (uint64_t k = 0; k < n_kv; ++k) {
    std::string key = c.string("a metadata key");
    const uint32_t t = c.read<uint32_t>("a metadata type");
    LOOM_CHECK(known_value_type(t), "gguf", path, ": key '", key, "' has unknown value type ", t,
               "; the file is corrupt or from a newer GGUF version");
    GgufValue v = read_value(c, GgufType(t), path, key, 0);
    LOOM_CHECK(!g.metadata_.count(key), "gguf", path, ": key '", key, "' appears twice; the file is corrupt");
    g.metadata_.emplace(std::move(key), std::move(v));
  }
  if (const GgufValue* a = g.find("general.alignment")) {
    LOOM_CHECK(a->is_integer() && a->i > 0 && (a->i & (a->i - 1)) == 0, "gguf", path,
               ": general.alignment must be a power of two, got ", a->describe());
    g.alignment_ = uint64_t(a->i);
  }

  g.tensors_.reserve(n_tensors);
  for (uint64_t k = 0; k < n_tensors; ++k) {
    GgufTensor t;
    t.name = c.string("a tensor name");
    const uint32_t nd = c.read<uint32_t>("a tensor's dimension count");
    LOOM_CHECK(nd >= 1 && nd <= kMaxDims, "gguf", path, ": tensor '", t.name, "' has ", nd,
               " dimensions (1 to 4 allowed); the file is corrupt");
    uint64_t numel = 1;
    for (uint32_t d = 0; d < nd; ++d) {
      const uint64_t n = c.read<uint64_t>("a tensor's dimensions");
      LOOM_CHECK(n > 0 && n < (uint64_t(1) << 40) && !__builtin_mul_overflow(numel, n, &numel), "gguf", path,
                 ": tensor '", t.name, "' has a dimension of ", n, "; the file is corrupt");
      t.ne.push_back(int64_t(n));
    }
    const uint32_t type = c.read<uint32_t>("a tensor's type");
    t.type = GgmlType(type);
    int64_t be = 0, bb = 0;
    LOOM_CHECK(ggml_block_shape(t.type, &be, &bb), "gguf", path, ": tensor '", t.name, "' has tensor type ", type,
               ", which loom does not know; re-quantize the model to a common type (Q8_0, Q4_K_M, ...)");
    LOOM_CHECK(t.ne[0] % be == 0, "gguf", path, ": tensor '", t.name, "' rows of ", t.ne[0],
               " elements are not whole blocks of ", be, " (", ggml_type_name(t.type), "); the file is corrupt");
    t.nbytes = numel / uint64_t(be) * uint64_t(bb);
    t.offset = c.read<uint64_t>("a tensor's offset");
    LOOM_CHECK(t.offset % g.alignment_ == 0, "gguf", path, ": tensor '", t.name, "' starts at offset ", t.offset,
               ", not a multiple of the alignment ", g.alignment_, "; the file is corrupt");
    LOOM_CHECK(!g.index_.count(t.name), "gguf", path, ": tensor '", t.name, "' appears twice; the file is corrupt");
    g.index_[t.name] = g.tensors_.size();
    g.tensors_.push_back(std::move(t));
  }
  const uint64_t data_start = (c.pos() + g.alignment_ - 1) / g.alignment_ * g.alignment_;
  LOOM_CHECK(data_start <= size, "gguf", path, ": the file ends before its data section (", size, " < ", data_start,
             " bytes); the file is truncated: download it again");
  g.data_ = base + data_start;
  const uint64_t data_size = size - data_start;
  std::vector<const GgufTensor*> by_offset;
  for (const auto& t : g.tensors_) {
    LOOM_CHECK(t.offset <= data_size && t.nbytes <= data_size - t.offset, "gguf", path, ": tensor '", t.name, "' (",
               ggml_type_name(t.type), " ", t.shape_str(), ", ", t.nbytes, " bytes at data offset ", t.offset,
               ") ends past the file's ", data_size,
               " data bytes; the file is truncated or corrupt: download it again");
    by_offset.push_back(&t);
  }
  std::sort(by_offset.begin(), by_offset.end(),
            [](const GgufTensor* a, const GgufTensor* b) { return a->offset < b->offset; });
  for (size_t k = 1; k < by_offset.size(); ++k)
    LOOM_CHECK(by_offset[k - 1]->offset + by_offset[k - 1]->nbytes <= by_offset[k]->offset, "gguf", path, ": tensors '",
               by_offset[k - 1]->name, "' and '", by_offset[k]->name, "' overlap; the file is corrupt");
  return g;
}

const GgufValue* GgufFile::find(const std::string& key) const {
  auto it = metadata_.find(key);
  return it == metadata_.end() ? nullptr : &it->second;
}

const GgufValue& GgufFile::value(const std::string& key) const {
  const GgufValue* v = find(key);
  LOOM_CHECK(v, "gguf", path(), ": metadata key '", key, "' is missing; the file was not written for this use");
  return *v;
}

namespace {
[[noreturn]] void wrong_kind(const std::string& path, const std::string& key, const GgufValue& v, const char* want) {
  fail("gguf", path, ": metadata key '", key, "' holds a ", gguf_type_name(v.type), " (", v.describe(), "), not ",
       want);
}
}  // namespace

int64_t GgufFile::get_int(const std::string& key) const {
  const GgufValue& v = value(key);
  if (!v.is_integer()) wrong_kind(path(), key, v, "an integer");
  return v.i;
}

int64_t GgufFile::get_int(const std::string& key, int64_t fallback) const { return has(key) ? get_int(key) : fallback; }

double GgufFile::get_float(const std::string& key) const {
  const GgufValue& v = value(key);
  if (!v.is_number()) wrong_kind(path(), key, v, "a number");
  return v.is_integer() ? double(v.i) : v.f;
}

double GgufFile::get_float(const std::string& key, double fallback) const {
  return has(key) ? get_float(key) : fallback;
}

bool GgufFile::get_bool(const std::string& key, bool fallback) const {
  const GgufValue* v = find(key);
  if (!v) return fallback;
  if (v->type != GgufType::boolean) wrong_kind(path(), key, *v, "a boolean");
  return v->b;
}

std::string GgufFile::get_string(const std::string& key) const {
  const GgufValue& v = value(key);
  if (v.type != GgufType::string) wrong_kind(path(), key, v, "a string");
  return v.s;
}

std::string GgufFile::get_string(const std::string& key, const std::string& fallback) const {
  return has(key) ? get_string(key) : fallback;
}

std::vector<std::string> GgufFile::get_strings(const std::string& key) const {
  const GgufValue& v = value(key);
  if (v.type != GgufType::array || v.elem_type != GgufType::string) wrong_kind(path(), key, v, "an array of strings");
  std::vector<std::string> out;
  out.reserve(v.items.size());
  for (const auto& x : v.items) out.push_back(x.s);
  return out;
}

namespace {
// The elements of array `v` (key `key`) converted by `get`, when `elem_ok` accepts a value of
// the array's element type; otherwise the error that names `what` was expected.
template <class T, class ElemOk, class Get>
std::vector<T> numeric_array(const std::string& path, const std::string& key, const GgufValue& v, const char* what,
                             ElemOk elem_ok, Get get) {
  GgufValue probe;
  probe.type = v.elem_type;
  if (v.type != GgufType::array || !elem_ok(probe)) wrong_kind(path, key, v, what);
  std::vector<T> out;
  out.reserve(v.items.size());
  for (const auto& x : v.items) out.push_back(get(x));
  return out;
}
}  // namespace

std::vector<int64_t> GgufFile::get_ints(const std::string& key) const {
  return numeric_array<int64_t>(
      path(), key, value(key), "an array of integers", [](const GgufValue& p) { return p.is_integer(); },
      [](const GgufValue& x) { return x.i; });
}

std::vector<double> GgufFile::get_floats(const std::string& key) const {
  return numeric_array<double>(
      path(), key, value(key), "an array of numbers", [](const GgufValue& p) { return p.is_number(); },
      [](const GgufValue& x) { return x.is_integer() ? double(x.i) : x.f; });
}

const GgufTensor& GgufFile::tensor(const std::string& name) const {
  auto it = index_.find(name);
  LOOM_CHECK(it != index_.end(), "gguf", path(), ": tensor '", name,
             "' is missing; the file does not hold the model loom expected");
  return tensors_[it->second];
}

}  // namespace loom::io

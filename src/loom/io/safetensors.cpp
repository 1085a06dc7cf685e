// safetensors reader and writer. The reader trusts nothing in the header: lengths, offsets,
// shapes and dtypes are checked against the file before a tensor is handed out.
#include "loom/io/safetensors.h"

#include <algorithm>
#include <cstring>
#include <nlohmann/json.hpp>

#include "loom/core/error.h"

namespace loom::io {

namespace {

// The reference implementation refuses headers over 100 MB; a larger "length" means the file
// is not safetensors (or its first bytes are damaged).
constexpr uint64_t kMaxHeaderBytes = 100'000'000;

struct DTypeName {
  DType dtype;
  const char* name;
};
constexpr DTypeName kDTypes[] = {{DType::f32, "F32"}, {DType::f64, "F64"}, {DType::bf16, "BF16"}, {DType::f16, "F16"},
                                 {DType::i32, "I32"}, {DType::i64, "I64"}, {DType::i8, "I8"},     {DType::u8, "U8"}};

std::string supported_list() {
  std::string s;
  for (const auto& d : kDTypes) s += str_cat(s.empty() ? "" : ", ", d.name);
  return s;
}

// numel * element size, or false on overflow / negative dims.
bool byte_size(const std::vector<int64_t>& shape, DType dt, uint64_t* out) {
  uint64_t n = dtype_size(dt);
  for (int64_t d : shape) {
    if (d < 0 || __builtin_mul_overflow(n, uint64_t(d), &n)) return false;
  }
  *out = n;
  return true;
}

std::string range_str(uint64_t b, uint64_t e) { return str_cat("[", b, ", ", e, ")"); }

}  // namespace

const char* safetensors_dtype_name(DType t) {
  for (const auto& d : kDTypes)
    if (d.dtype == t) return d.name;
  fail("safetensors", "dtype ", dtype_name(t), " has no safetensors name");
}

DType safetensors_dtype_from_name(const std::string& name) {
  for (const auto& d : kDTypes)
    if (name == d.name) return d.dtype;
  fail("safetensors", "unsupported dtype '", name, "' (supported: ", supported_list(), ")");
}

int64_t SafetensorsEntry::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

std::string SafetensorsEntry::shape_str() const {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += str_cat(i ? ", " : "", shape[i]);
  return s + "]";
}

// ---- writer ------------------------------------------------------------------------------

void SafetensorsWriter::check_new_name(const std::string& name) const {
  LOOM_CHECK(!name.empty() && name != "__metadata__", "safetensors", "tensor name '", name, "' is reserved or empty");
  for (const auto& it : items_) LOOM_CHECK(it.name != name, "safetensors", "tensor '", name, "' added twice");
}

void SafetensorsWriter::add(const std::string& name, const Tensor& t) {
  check_new_name(name);
  LOOM_CHECK(t.defined(), "safetensors", "tensor '", name, "' is undefined");
  LOOM_CHECK(t.device() == Device::cpu, "safetensors", "tensor '", name, "' lives on ", device_name(t.device()),
             "; copy it to the host before saving");
  safetensors_dtype_name(t.dtype());  // throws for dtypes the format cannot name
  items_.push_back({name, t.dtype(), t.shape().to_vector(), t, {}});
}

void SafetensorsWriter::add(const std::string& name, DType dtype, const std::vector<int64_t>& shape, const void* bytes,
                            size_t n_bytes) {
  check_new_name(name);
  uint64_t want = 0;
  LOOM_CHECK(byte_size(shape, dtype, &want) && want == n_bytes, "safetensors", "tensor '", name, "': ", n_bytes,
             " bytes given for ", dtype_name(dtype), " shape of ", want, " bytes");
  safetensors_dtype_name(dtype);
  items_.push_back({name, dtype, shape, {}, std::string(static_cast<const char*>(bytes), n_bytes)});
}

void SafetensorsWriter::set_metadata(const std::string& key, const std::string& value) { metadata_[key] = value; }

uint32_t SafetensorsWriter::write(const std::string& path) const {
  // Largest elements first keeps every tensor aligned to its element size without padding
  // (the format forbids holes in the data section).
  std::vector<const Item*> order;
  for (const auto& it : items_) order.push_back(&it);
  std::stable_sort(order.begin(), order.end(), [](const Item* a, const Item* b) {
    const size_t sa = dtype_size(a->dtype), sb = dtype_size(b->dtype);
    return sa != sb ? sa > sb : a->name < b->name;
  });
  nlohmann::json header = nlohmann::json::object();
  if (!metadata_.empty()) header["__metadata__"] = metadata_;
  uint64_t offset = 0;
  for (const Item* it : order) {
    const uint64_t n = it->tensor.defined() ? it->tensor.nbytes() : it->owned.size();
    header[it->name] = {
        {"dtype", safetensors_dtype_name(it->dtype)}, {"shape", it->shape}, {"data_offsets", {offset, offset + n}}};
    offset += n;
  }
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');
  const uint64_t len = text.size();
  unsigned char len_le[8];
  for (int i = 0; i < 8; ++i) len_le[i] = static_cast<unsigned char>(len >> (8 * i));

  AtomicFileWriter out(path);
  out.write(len_le, 8);
  out.write(text);
  for (const Item* it : order) {
    if (it->tensor.defined())
      out.write(it->tensor.raw(), it->tensor.nbytes());
    else
      out.write(it->owned);
  }
  out.commit();
  return out.crc32c();
}

// ---- reader ------------------------------------------------------------------------------

SafetensorsFile SafetensorsFile::open(const std::string& path) {
  SafetensorsFile f;
  f.map_ = MappedFile::open(path, "safetensors", "", /*writable=*/true);  // tensors borrow it
  auto bad = [&](const auto&... parts) { fail("safetensors", path, ": ", parts...); };
  const uint64_t size = f.map_->size();
  if (size < 8) bad("file is ", size, " bytes, too short for the 8-byte header length (not a safetensors file?)");
  uint64_t n = 0;
  for (int i = 0; i < 8; ++i) n |= uint64_t(f.map_->data()[i]) << (8 * i);
  if (n > kMaxHeaderBytes)
    bad("header length ", n, " is implausible (limit ", kMaxHeaderBytes, "); not a safetensors file or a damaged one");
  if (n > size - 8) bad("header length ", n, " runs past the end of the ", size, "-byte file (file truncated?)");
  const char* text = reinterpret_cast<const char*>(f.map_->data() + 8);
  if (n == 0 || text[0] != '{') bad("header does not start with '{' (not a safetensors file?)");
  nlohmann::json header;
  try {
    header = nlohmann::json::parse(text, text + n);
  } catch (const nlohmann::json::exception& e) {
    bad("header is not valid JSON: ", e.what());
  }
  if (!header.is_object()) bad("header is not a JSON object");
  f.data_ = f.map_->data() + 8 + n;
  const uint64_t data_size = size - 8 - n;

  for (auto it = header.begin(); it != header.end(); ++it) {
    const std::string& name = it.key();
    const nlohmann::json& v = it.value();
    if (name == "__metadata__") {
      if (!v.is_object()) bad("__metadata__ is not an object of strings");
      for (auto m = v.begin(); m != v.end(); ++m) {
        if (!m.value().is_string()) bad("__metadata__ value '", m.key(), "' is not a string");
        f.metadata_[m.key()] = m.value().get<std::string>();
      }
      continue;
    }
    SafetensorsEntry e;
    e.name = name;
    if (!v.is_object() || !v.contains("dtype") || !v.contains("shape") || !v.contains("data_offsets"))
      bad("tensor '", name, "' lacks dtype, shape or data_offsets");
    if (!v["dtype"].is_string()) bad("tensor '", name, "': dtype is not a string");
    const std::string dt = v["dtype"].get<std::string>();
    bool known = false;
    for (const auto& d : kDTypes)
      if (dt == d.name) e.dtype = d.dtype, known = true;
    if (!known)
      bad("tensor '", name, "' has dtype '", dt, "', which loom does not read (supported: ", supported_list(), ")");
    if (!v["shape"].is_array()) bad("tensor '", name, "': shape is not an array");
    for (const auto& d : v["shape"]) {
      if (!d.is_number_unsigned())
        bad("tensor '", name, "': shape ", v["shape"].dump(), " holds a non-integer or negative dimension");
      e.shape.push_back(d.get<int64_t>());
    }
    const auto& off = v["data_offsets"];
    if (!off.is_array() || off.size() != 2 || !off[0].is_number_unsigned() || !off[1].is_number_unsigned())
      bad("tensor '", name, "': data_offsets ", off.dump(), " is not a pair of byte offsets");
    e.begin = off[0].get<uint64_t>();
    e.end = off[1].get<uint64_t>();
    if (e.end < e.begin)
      bad("tensor '", name, "' has data_offsets ", range_str(e.begin, e.end), " ending before they begin");
    uint64_t want = 0;
    if (!byte_size(e.shape, e.dtype, &want)) bad("tensor '", name, "': shape ", e.shape_str(), " overflows");
    if (e.end > data_size)
      bad("tensor '", name, "' has data_offsets ", range_str(e.begin, e.end), " but the data section is ", data_size,
          " bytes (file truncated?)");
    if (e.end - e.begin != want)
      bad("tensor '", name, "' is ", dt, e.shape_str(), " = ", want, " bytes but its data_offsets ",
          range_str(e.begin, e.end), " span ", e.end - e.begin);
    f.entries_.push_back(std::move(e));
  }

  // The format requires the tensors to tile the data section exactly: no overlap, no holes.
  std::vector<const SafetensorsEntry*> by_offset;
  for (const auto& e : f.entries_) by_offset.push_back(&e);
  std::sort(by_offset.begin(), by_offset.end(),
            [](const auto* a, const auto* b) { return a->begin != b->begin ? a->begin < b->begin : a->end < b->end; });
  uint64_t covered = 0;
  const SafetensorsEntry* prev = nullptr;
  for (const auto* e : by_offset) {
    if (e->begin < covered)
      bad("tensors '", prev->name, "' ", range_str(prev->begin, prev->end), " and '", e->name, "' ",
          range_str(e->begin, e->end), " overlap");
    if (e->begin > covered) bad("bytes ", range_str(covered, e->begin), " of the data section belong to no tensor");
    covered = e->end;
    prev = e;
  }
  if (covered != data_size)
    bad("the data section is ", data_size, " bytes but the tensors cover ", covered,
        " (trailing bytes: file damaged or written by a broken tool)");

  std::sort(f.entries_.begin(), f.entries_.end(), [](const auto& a, const auto& b) { return a.name < b.name; });
  for (size_t i = 0; i < f.entries_.size(); ++i) f.index_[f.entries_[i].name] = i;
  return f;
}

std::vector<std::string> SafetensorsFile::names() const {
  std::vector<std::string> out;
  for (const auto& e : entries_) out.push_back(e.name);
  return out;
}

const SafetensorsEntry& SafetensorsFile::entry(const std::string& name) const {
  auto it = index_.find(name);
  if (it == index_.end())
    fail("safetensors", path(), ": no tensor named '", name, "' (the file holds ", entries_.size(), " tensors)");
  return entries_[it->second];
}

Tensor SafetensorsFile::get(const std::string& name) const {
  const SafetensorsEntry& e = entry(name);
  LOOM_CHECK(int(e.shape.size()) <= Shape::kMaxDims, "safetensors", path(), ": tensor '", name, "' has ",
             e.shape.size(), " dimensions; loom tensors hold at most ", Shape::kMaxDims);
  const Shape shape(e.shape);
  const unsigned char* p = data(e);
  if (reinterpret_cast<uintptr_t>(p) % dtype_size(e.dtype) != 0) {
    Tensor t = Tensor::empty(shape, e.dtype);
    if (t.nbytes()) std::memcpy(t.raw(), p, t.nbytes());
    return t;
  }
  // The mapping is private and writable (see MappedFile), so dropping const is safe.
  std::shared_ptr<void> keep_alive = std::const_pointer_cast<MappedFile>(map_);
  return Tensor::borrow(const_cast<unsigned char*>(p), shape, e.dtype, std::move(keep_alive));
}

}  // namespace loom::io

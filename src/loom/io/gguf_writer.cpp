// GgufWriter and the value builders of gguf.h: a GGUF v3 file from metadata and tensors whose
// bytes are already in their ggml type. Tests, fuzz seeds and `loom export` write models with it;
// a file is streamed to disk, never assembled in memory.
#include <cstring>
#include <functional>
#include <string_view>

#include "loom/core/error.h"
#include "loom/io/gguf.h"

namespace loom::io {

namespace {

template <class T>
void put(std::string& out, T v) {
  char b[sizeof(T)];
  std::memcpy(b, &v, sizeof(T));
  out.append(b, sizeof(T));
}

void put_string(std::string& out, const std::string& s) {
  put<uint64_t>(out, s.size());
  out += s;
}

void put_value(std::string& out, const GgufValue& v) {
  switch (v.type) {
    case GgufType::u8: put<uint8_t>(out, uint8_t(v.i)); break;
    case GgufType::i8: put<int8_t>(out, int8_t(v.i)); break;
    case GgufType::u16: put<uint16_t>(out, uint16_t(v.i)); break;
    case GgufType::i16: put<int16_t>(out, int16_t(v.i)); break;
    case GgufType::u32: put<uint32_t>(out, uint32_t(v.i)); break;
    case GgufType::i32: put<int32_t>(out, int32_t(v.i)); break;
    case GgufType::u64: put<uint64_t>(out, v.u ? v.u : uint64_t(v.i)); break;
    case GgufType::i64: put<int64_t>(out, v.i); break;
    case GgufType::f32: put<float>(out, float(v.f)); break;
    case GgufType::f64: put<double>(out, v.f); break;
    case GgufType::boolean: put<uint8_t>(out, v.b ? 1 : 0); break;
    case GgufType::string: put_string(out, v.s); break;
    case GgufType::array:
      put<uint32_t>(out, uint32_t(v.elem_type));
      put<uint64_t>(out, v.items.size());
      for (const auto& x : v.items) {
        LOOM_CHECK(x.type == v.elem_type, "gguf", "an array of ", gguf_type_name(v.elem_type), " holds a ",
                   gguf_type_name(x.type));
        put_value(out, x);
      }
      break;
  }
}

void pad_to(std::string& out, uint64_t alignment) {
  while (out.size() % alignment) out.push_back('\0');
}

}  // namespace

void GgufWriter::set(const std::string& key, GgufValue v) {
  for (auto& kv : kv_)
    if (kv.first == key) {
      kv.second = std::move(v);
      return;
    }
  kv_.emplace_back(key, std::move(v));
}

void GgufWriter::add_tensor(const std::string& name, GgmlType type, const std::vector<int64_t>& ne, std::string bytes) {
  int64_t be = 0, bb = 0;
  LOOM_CHECK(ggml_block_shape(type, &be, &bb), "gguf", "tensor '", name, "': unknown type ", uint32_t(type));
  int64_t n = 1;
  for (int64_t d : ne) n *= d;
  LOOM_CHECK(!ne.empty() && ne[0] % be == 0 && uint64_t(n / be * bb) == bytes.size(), "gguf", "tensor '", name,
             "': ", bytes.size(), " bytes do not hold ", n, " elements of ", ggml_type_name(type));
  tensors_.push_back({name, type, ne, std::move(bytes)});
}

void GgufWriter::emit(const std::function<void(std::string_view)>& out) const {
  std::string head;
  put<uint32_t>(head, 0x46554747);
  put<uint32_t>(head, 3);
  put<uint64_t>(head, tensors_.size());
  const bool own_alignment = alignment_ != 32;
  put<uint64_t>(head, kv_.size() + (own_alignment ? 1 : 0));
  for (const auto& [k, v] : kv_) {
    put_string(head, k);
    put<uint32_t>(head, uint32_t(v.type));
    put_value(head, v);
  }
  if (own_alignment) {
    put_string(head, "general.alignment");
    put<uint32_t>(head, uint32_t(GgufType::u32));
    put<uint32_t>(head, uint32_t(alignment_));
  }
  uint64_t offset = 0;
  for (const auto& t : tensors_) {
    put_string(head, t.name);
    put<uint32_t>(head, uint32_t(t.ne.size()));
    for (int64_t d : t.ne) put<uint64_t>(head, uint64_t(d));
    put<uint32_t>(head, uint32_t(t.type));
    put<uint64_t>(head, offset);
    offset = (offset + t.bytes.size() + alignment_ - 1) / alignment_ * alignment_;
  }
  pad_to(head, alignment_);
  out(head);
  // Each tensor starts aligned; the file ends with the last tensor's bytes.
  const std::string zeros(alignment_, '\0');
  for (size_t k = 0; k < tensors_.size(); ++k) {
    out(tensors_[k].bytes);
    const uint64_t pad = (alignment_ - tensors_[k].bytes.size() % alignment_) % alignment_;
    if (k + 1 < tensors_.size() && pad) out(std::string_view(zeros).substr(0, pad));
  }
}

std::string GgufWriter::bytes() const {
  std::string out;
  emit([&](std::string_view b) { out += b; });
  return out;
}

void GgufWriter::write(const std::string& path) const {
  AtomicFileWriter f(path);
  emit([&](std::string_view b) { f.write(b); });
  f.commit();
}

GgufValue gguf_int(int64_t v, GgufType t) {
  GgufValue x;
  x.type = t;
  x.i = v;
  return x;
}

GgufValue gguf_uint(uint64_t v, GgufType t) {
  GgufValue x;
  x.type = t;
  x.u = v;
  x.i = int64_t(v);
  return x;
}

GgufValue gguf_float(double v, GgufType t) {
  GgufValue x;
  x.type = t;
  x.f = v;
  return x;
}

GgufValue gguf_bool(bool v) {
  GgufValue x;
  x.type = GgufType::boolean;
  x.b = v;
  return x;
}

GgufValue gguf_string(std::string v) {
  GgufValue x;
  x.type = GgufType::string;
  x.s = std::move(v);
  return x;
}

GgufValue gguf_array(GgufType elem, std::vector<GgufValue> items) {
  GgufValue x;
  x.type = GgufType::array;
  x.elem_type = elem;
  x.items = std::move(items);
  return x;
}

GgufValue gguf_strings(const std::vector<std::string>& v) {
  std::vector<GgufValue> items;
  items.reserve(v.size());
  for (const auto& s : v) items.push_back(gguf_string(s));
  return gguf_array(GgufType::string, std::move(items));
}

}  // namespace loom::io

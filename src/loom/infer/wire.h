// Plain bytes for what a tensor-parallel leader broadcasts to its followers (engine_tp.cpp):
// trivially copyable values, vectors of them and strings, in the host's byte order (every rank
// of a tp group runs the same build). Not a file format.
#pragma once
#include <cstdint>
#include <cstring>
#include <string>
#include <type_traits>
#include <vector>

#include "loom/core/error.h"

namespace loom::infer {

class ByteWriter {
 public:
  template <class T>
  void put(const T& v) {
    static_assert(std::is_trivially_copyable_v<T>);
    const auto* p = reinterpret_cast<const uint8_t*>(&v);
    bytes_.insert(bytes_.end(), p, p + sizeof(T));
  }
  template <class T>
  void put_vec(const std::vector<T>& v) {
    static_assert(std::is_trivially_copyable_v<T>);
    put(int64_t(v.size()));
    const auto* p = reinterpret_cast<const uint8_t*>(v.data());
    bytes_.insert(bytes_.end(), p, p + v.size() * sizeof(T));
  }
  void put_str(const std::string& s) { put_vec(std::vector<char>(s.begin(), s.end())); }
  std::vector<uint8_t>& bytes() { return bytes_; }

 private:
  std::vector<uint8_t> bytes_;
};

// Reads what a ByteWriter wrote, in the same order; reading past the end throws.
class ByteReader {
 public:
  explicit ByteReader(const std::vector<uint8_t>& bytes) : p_(bytes.data()), end_(bytes.data() + bytes.size()) {}
  template <class T>
  T get() {
    static_assert(std::is_trivially_copyable_v<T>);
    T v;
    take(&v, sizeof(T));
    return v;
  }
  template <class T>
  std::vector<T> get_vec() {
    const int64_t n = get<int64_t>();
    LOOM_CHECK(n >= 0 && uint64_t(n) <= uint64_t(end_ - p_) / sizeof(T), "wire", "a vector of ", n,
               " elements runs past the ", end_ - p_, " bytes left");
    std::vector<T> v(static_cast<size_t>(n));
    take(v.data(), v.size() * sizeof(T));
    return v;
  }
  std::string get_str() {
    const auto v = get_vec<char>();
    return std::string(v.begin(), v.end());
  }
  bool done() const { return p_ == end_; }

 private:
  void take(void* to, size_t n) {
    LOOM_CHECK(n <= size_t(end_ - p_), "wire", "reading ", n, " bytes past the end (", end_ - p_, " left)");
    if (n) std::memcpy(to, p_, n);
    p_ += n;
  }
  const uint8_t* p_;
  const uint8_t* end_;
};

}  // namespace loom::infer

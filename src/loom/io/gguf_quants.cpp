// ggml block formats to f32 and back (see gguf_quants.h). Layouts follow ggml's block structs
// (ggml-common.h). Dequantized values are bit-identical to gguf-py's whatever the evaluation
// order: every product (11-bit f16 scale x sub-block scale x quant, at most 24 significant bits,
// Q6_K's 11 + 7 + 6 the widest) is exact in f32, so each value is rounded once, FMA or not.
// The quantizers are not so lucky: see rounded_product.
#include "loom/io/gguf_quants.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "loom/core/dtype.h"
#include "loom/core/error.h"

namespace loom::io {
namespace {

using Block = void (*)(const uint8_t* src, float* dst);

float load_f16(const uint8_t* p) {
  f16_t h;
  std::memcpy(&h.bits, p, 2);
  return f16_to_f32(h);
}

void store_f16(uint8_t* p, float f) {
  const f16_t h = f32_to_f16(f);
  std::memcpy(p, &h.bits, 2);
}

// ---- plain floats (one element per block) ----

void dequant_f32(const uint8_t* s, float* d) { std::memcpy(d, s, 4); }
void dequant_f16(const uint8_t* s, float* d) { *d = load_f16(s); }
void dequant_bf16(const uint8_t* s, float* d) {
  bf16_t b;
  std::memcpy(&b.bits, s, 2);
  *d = bf16_to_f32(b);
}
void dequant_f64(const uint8_t* s, float* d) {
  double v;
  std::memcpy(&v, s, 8);
  *d = float(v);
}

// ---- 32-element blocks: element j < 16 is the low nibble of byte j, j + 16 its high one ----

void dequant_q8_0(const uint8_t* s, float* d) {  // f16 d, int8 q[32]
  const float scale = load_f16(s);
  for (int j = 0; j < 32; ++j) d[j] = float(int8_t(s[2 + j])) * scale;
}

void dequant_q4_0(const uint8_t* s, float* d) {  // f16 d, q[16]: d * (q - 8)
  const float scale = load_f16(s);
  const uint8_t* q = s + 2;
  for (int j = 0; j < 16; ++j) {
    d[j] = scale * float((q[j] & 0xF) - 8);
    d[j + 16] = scale * float((q[j] >> 4) - 8);
  }
}

void dequant_q4_1(const uint8_t* s, float* d) {  // f16 d, f16 m, q[16]: d * q + m
  const float scale = load_f16(s), min = load_f16(s + 2);
  const uint8_t* q = s + 4;
  for (int j = 0; j < 16; ++j) {
    d[j] = scale * float(q[j] & 0xF) + min;
    d[j + 16] = scale * float(q[j] >> 4) + min;
  }
}

// The fifth bit of element j is bit j of a little-endian u32.
uint32_t load_u32(const uint8_t* p) {
  return uint32_t(p[0]) | uint32_t(p[1]) << 8 | uint32_t(p[2]) << 16 | uint32_t(p[3]) << 24;
}

void dequant_q5_0(const uint8_t* s, float* d) {  // f16 d, u32 high bits, q[16]: d * (q - 16)
  const float scale = load_f16(s);
  const uint32_t hi = load_u32(s + 2);
  const uint8_t* q = s + 6;
  for (int j = 0; j < 16; ++j) {
    const int lo = (q[j] & 0xF) | int((hi >> j) & 1) << 4;
    const int up = (q[j] >> 4) | int((hi >> (j + 16)) & 1) << 4;
    d[j] = scale * float(lo - 16);
    d[j + 16] = scale * float(up - 16);
  }
}

void dequant_q5_1(const uint8_t* s, float* d) {  // f16 d, f16 m, u32 high bits, q[16]
  const float scale = load_f16(s), min = load_f16(s + 2);
  const uint32_t hi = load_u32(s + 4);
  const uint8_t* q = s + 8;
  for (int j = 0; j < 16; ++j) {
    const int lo = (q[j] & 0xF) | int((hi >> j) & 1) << 4;
    const int up = (q[j] >> 4) | int((hi >> (j + 16)) & 1) << 4;
    d[j] = scale * float(lo) + min;
    d[j + 16] = scale * float(up) + min;
  }
}

// ---- 256-element super-blocks ----

// Q2_K: scales[16] (low nibble scale, high nibble min, one pair per 16 elements), q[64] with
// four 2-bit values per byte, f16 d, f16 dmin. Element h*128 + s*32 + l is bits 2s..2s+1 of
// q[h*32 + l].
void dequant_q2_k(const uint8_t* s, float* d) {
  const uint8_t* sc = s;
  const uint8_t* q = s + 16;
  const float dd = load_f16(s + 80), dmin = load_f16(s + 82);
  for (int g = 0; g < 16; ++g) {
    const float scale = dd * float(sc[g] & 0xF), min = dmin * float(sc[g] >> 4);
    for (int k = 0; k < 16; ++k) {
      const int e = g * 16 + k, h = e / 128, sh = (e % 128) / 32, l = e % 32;
      d[e] = scale * float((q[h * 32 + l] >> (2 * sh)) & 3) - min;
    }
  }
}

// Q3_K: hmask[32] (element e's bit is bit e/32 of hmask[e%32]; a clear bit subtracts 4),
// q[64] low 2 bits as in Q2_K, 16 signed 6-bit scales packed in 12 bytes, f16 d.
void dequant_q3_k(const uint8_t* s, float* d) {
  const uint8_t* hmask = s;
  const uint8_t* q = s + 32;
  const uint8_t* sc = s + 96;
  const float dd = load_f16(s + 108);
  for (int g = 0; g < 16; ++g) {
    const int lo = (g < 8 ? sc[g] : sc[g - 8] >> 4) & 0xF;
    const int hi = (sc[8 + g % 4] >> (2 * (g / 4))) & 3;
    const float scale = dd * float((lo | hi << 4) - 32);
    for (int k = 0; k < 16; ++k) {
      const int e = g * 16 + k, h = e / 128, sh = (e % 128) / 32, l = e % 32;
      const int low = (q[h * 32 + l] >> (2 * sh)) & 3;
      const int high_set = (hmask[l] >> (e / 32)) & 1;
      d[e] = scale * float(low - (high_set ? 0 : 4));
    }
  }
}

// Q4_K/Q5_K: eight 6-bit scales and eight 6-bit mins in 12 bytes. Bytes 0-3 hold scales 0-3
// (low 6 bits) and the top 2 bits of scales 4-7; bytes 4-7 the same for mins; bytes 8-11 the
// low 4 bits of scale 4+j (low nibble) and min 4+j (high nibble).
void unpack_k_scales(const uint8_t* p, int sc[8], int mn[8]) {
  for (int j = 0; j < 4; ++j) {
    sc[j] = p[j] & 0x3F;
    mn[j] = p[4 + j] & 0x3F;
    sc[4 + j] = (p[8 + j] & 0xF) | ((p[j] >> 2) & 0x30);
    mn[4 + j] = (p[8 + j] >> 4) | ((p[4 + j] >> 2) & 0x30);
  }
}

// Q4_K: f16 d, f16 dmin, scales[12], q[128]; 8 groups of 32, group 2c the low nibbles of
// q[32c .. 32c+31], group 2c+1 their high nibbles. Value: d*sc[g] * q - dmin*mn[g].
void dequant_q4_k(const uint8_t* s, float* d) {
  const float dd = load_f16(s), dmin = load_f16(s + 2);
  int sc[8], mn[8];
  unpack_k_scales(s + 4, sc, mn);
  const uint8_t* q = s + 16;
  for (int g = 0; g < 8; ++g) {
    const float scale = dd * float(sc[g]), min = dmin * float(mn[g]);
    const uint8_t* qg = q + (g / 2) * 32;
    const int shift = (g % 2) * 4;
    for (int l = 0; l < 32; ++l) d[g * 32 + l] = scale * float((qg[l] >> shift) & 0xF) - min;
  }
}

// Q5_K: Q4_K plus qh[32] before q: element e's fifth bit is bit e/32 of qh[e%32].
void dequant_q5_k(const uint8_t* s, float* d) {
  const float dd = load_f16(s), dmin = load_f16(s + 2);
  int sc[8], mn[8];
  unpack_k_scales(s + 4, sc, mn);
  const uint8_t* qh = s + 16;
  const uint8_t* q = s + 48;
  for (int g = 0; g < 8; ++g) {
    const float scale = dd * float(sc[g]), min = dmin * float(mn[g]);
    const uint8_t* qg = q + (g / 2) * 32;
    const int shift = (g % 2) * 4;
    for (int l = 0; l < 32; ++l) {
      const int v = ((qg[l] >> shift) & 0xF) | ((qh[l] >> g) & 1) << 4;
      d[g * 32 + l] = scale * float(v) - min;
    }
  }
}

// Q6_K: ql[128] (low 4 bits), qh[64] (high 2 bits), int8 scales[16] (one per 16), f16 d.
// In half h, element h*128 + s*32 + l takes nibble s/2 of ql[h*64 + (s%2)*32 + l] and bits
// 2s..2s+1 of qh[h*32 + l]; the 6-bit value is offset by -32.
void dequant_q6_k(const uint8_t* s, float* d) {
  const uint8_t* ql = s;
  const uint8_t* qh = s + 128;
  const int8_t* sc = reinterpret_cast<const int8_t*>(s + 192);
  const float dd = load_f16(s + 208);
  for (int g = 0; g < 16; ++g) {
    const float scale = dd * float(sc[g]);
    for (int k = 0; k < 16; ++k) {
      const int e = g * 16 + k, h = e / 128, sh = (e % 128) / 32, l = e % 32;
      const int low = (ql[h * 64 + (sh % 2) * 32 + l] >> (4 * (sh / 2))) & 0xF;
      const int high = (qh[h * 32 + l] >> (2 * sh)) & 3;
      d[e] = scale * float((low | high << 4) - 32);
    }
  }
}

// Each type's block sizes are template arguments of its loop; find_type checks them once against
// gguf.h's table (ggml_block_shape), the one the reader sizes tensors by. Names: ggml_type_name.
struct TypeInfo {
  GgmlType type;
  int64_t block_elems;
  int64_t block_bytes;
  void (*dequant)(const uint8_t* src, float* dst, int64_t n_blocks);
};

// Blocks in parallel once there is enough work to pay for waking the team.
template <Block kBlock, int64_t kElems, int64_t kBytes>
void dequant_blocks(const uint8_t* src, float* dst, int64_t n_blocks) {
#pragma omp parallel for schedule(static) if (n_blocks * kElems > (1 << 16))
  for (int64_t b = 0; b < n_blocks; ++b) kBlock(src + b * kBytes, dst + b * kElems);
}

template <Block kBlock, int64_t kElems, int64_t kBytes>
constexpr TypeInfo info(GgmlType t) {
  return {t, kElems, kBytes, &dequant_blocks<kBlock, kElems, kBytes>};
}

constexpr TypeInfo kTypes[] = {
    info<dequant_f32, 1, 4>(GgmlType::f32),       info<dequant_f16, 1, 2>(GgmlType::f16),
    info<dequant_bf16, 1, 2>(GgmlType::bf16),     info<dequant_f64, 1, 8>(GgmlType::f64),
    info<dequant_q8_0, 32, 34>(GgmlType::q8_0),   info<dequant_q4_0, 32, 18>(GgmlType::q4_0),
    info<dequant_q4_1, 32, 20>(GgmlType::q4_1),   info<dequant_q5_0, 32, 22>(GgmlType::q5_0),
    info<dequant_q5_1, 32, 24>(GgmlType::q5_1),   info<dequant_q2_k, 256, 84>(GgmlType::q2_k),
    info<dequant_q3_k, 256, 110>(GgmlType::q3_k), info<dequant_q4_k, 256, 144>(GgmlType::q4_k),
    info<dequant_q5_k, 256, 176>(GgmlType::q5_k), info<dequant_q6_k, 256, 210>(GgmlType::q6_k),
};

const TypeInfo* find_type(GgmlType t) {
  static const bool agree = [] {
    for (const TypeInfo& i : kTypes) {
      int64_t elems = 0, bytes = 0;
      LOOM_CHECK(ggml_block_shape(i.type, &elems, &bytes) && elems == i.block_elems && bytes == i.block_bytes, "gguf",
                 "the dequantizer of ", ggml_type_name(i.type), " and gguf.h disagree on its block shape");
    }
    return true;
  }();
  (void)agree;
  for (const TypeInfo& i : kTypes)
    if (i.type == t) return &i;
  return nullptr;
}

std::string supported_names() {
  std::string s;
  for (const TypeInfo& i : kTypes) s += (s.empty() ? "" : ", ") + ggml_type_name(i.type);
  return s;
}

// ---- quantizers: gguf-py's quantize_blocks, one 32-element block at a time, in f32 ----

float inverse_or_zero(float d) { return d == 0.f ? 0.f : 1.f / d; }

// x * id rounded to f32 before the caller adds the zero point, as numpy does. Compilers may
// otherwise fuse the multiply and add into one FMA (GCC does by default where the target has
// FMA), which moves some values across a rounding boundary and changes their q.
float rounded_product(float a, float b) {
  volatile float p = a * b;
  return p;
}

// The element of largest magnitude, sign kept; the first one on ties.
float signed_absmax(const float* x) {
  float best = x[0];
  for (int j = 1; j < 32; ++j)
    if (std::fabs(x[j]) > std::fabs(best)) best = x[j];
  return best;
}

// trunc then clip to [0, hi]; NaN (only from a degenerate scale) gives 0 rather than UB.
int truncate_clamped(float v, int hi) {
  if (!(v >= 0.f)) return 0;
  return v >= float(hi) ? hi : int(v);
}

void quant_q8_0(const float* x, uint8_t* out) {
  float amax = 0.f;
  for (int j = 0; j < 32; ++j) amax = std::max(amax, std::fabs(x[j]));
  const float d = amax / 127.f, id = inverse_or_zero(d);
  store_f16(out, d);
  for (int j = 0; j < 32; ++j) {  // std::round rounds halfway cases away from zero, as ggml does
    const float r = std::round(x[j] * id);
    out[2 + j] = uint8_t(int8_t(std::isnan(r) ? 0.f : std::clamp(r, -127.f, 127.f)));
  }
}

void quant_q4_0(const float* x, uint8_t* out) {
  const float d = signed_absmax(x) / -8.f, id = inverse_or_zero(d);
  store_f16(out, d);
  for (int j = 0; j < 16; ++j) {
    const int lo = truncate_clamped(rounded_product(x[j], id) + 8.5f, 15);
    const int hi = truncate_clamped(rounded_product(x[j + 16], id) + 8.5f, 15);
    out[2 + j] = uint8_t(lo | hi << 4);
  }
}

void quant_q4_1(const float* x, uint8_t* out) {
  const float mx = *std::max_element(x, x + 32), mn = *std::min_element(x, x + 32);
  const float d = (mx - mn) / 15.f, id = inverse_or_zero(d);
  store_f16(out, d);
  store_f16(out + 2, mn);
  for (int j = 0; j < 16; ++j) {
    const int lo = truncate_clamped(rounded_product(x[j] - mn, id) + 0.5f, 15);
    const int hi = truncate_clamped(rounded_product(x[j + 16] - mn, id) + 0.5f, 15);
    out[4 + j] = uint8_t(lo | hi << 4);
  }
}

// Q5_0/Q5_1 share the packing: low nibbles as in Q4, fifth bits into a little-endian u32.
void pack_5bit(const int q[32], uint8_t* qh, uint8_t* qs) {
  uint32_t hi = 0;
  for (int j = 0; j < 32; ++j) hi |= uint32_t(q[j] >> 4) << j;
  for (int b = 0; b < 4; ++b) qh[b] = uint8_t(hi >> (8 * b));
  for (int j = 0; j < 16; ++j) qs[j] = uint8_t((q[j] & 0xF) | (q[j + 16] & 0xF) << 4);
}

void quant_q5_0(const float* x, uint8_t* out) {
  const float d = signed_absmax(x) / -16.f, id = inverse_or_zero(d);
  int q[32];
  for (int j = 0; j < 32; ++j) q[j] = truncate_clamped(rounded_product(x[j], id) + 16.5f, 31);
  store_f16(out, d);
  pack_5bit(q, out + 2, out + 6);
}

void quant_q5_1(const float* x, uint8_t* out) {
  const float mx = *std::max_element(x, x + 32), mn = *std::min_element(x, x + 32);
  const float d = (mx - mn) / 31.f, id = inverse_or_zero(d);
  int q[32];
  for (int j = 0; j < 32; ++j) q[j] = truncate_clamped(rounded_product(x[j] - mn, id) + 0.5f, 31);
  store_f16(out, d);
  store_f16(out + 2, mn);
  pack_5bit(q, out + 4, out + 8);
}

}  // namespace

bool ggml_type_supported(GgmlType t) { return find_type(t) != nullptr; }

void dequantize(GgmlType t, const void* src, float* dst, int64_t n) {
  const TypeInfo* ti = find_type(t);
  if (!ti)
    fail("gguf", "tensor type ", ggml_type_name(t), " is not supported (supported: ", supported_names(),
         "); convert the model to one of these, e.g. with llama.cpp's llama-quantize");
  if (n < 0 || n % ti->block_elems != 0)
    fail("gguf", ggml_type_name(t), " stores blocks of ", ti->block_elems, " elements, so ", n,
         " elements cannot be dequantized; the tensor's row length must be a multiple of ", ti->block_elems);
  ti->dequant(static_cast<const uint8_t*>(src), dst, n / ti->block_elems);
}

std::string quantize(GgmlType t, const float* src, int64_t n) {
  void (*block)(const float*, uint8_t*) = nullptr;
  switch (t) {
    case GgmlType::q8_0: block = quant_q8_0; break;
    case GgmlType::q4_0: block = quant_q4_0; break;
    case GgmlType::q4_1: block = quant_q4_1; break;
    case GgmlType::q5_0: block = quant_q5_0; break;
    case GgmlType::q5_1: block = quant_q5_1; break;
    case GgmlType::f32:
    case GgmlType::f16:
    case GgmlType::bf16: break;
    default:
      fail("gguf", "quantizing to ", ggml_type_name(t),
           " is not supported (supported: F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1); "
           "choose one of these");
  }
  const int64_t block_elems = block ? 32 : 1;
  if (n < 0 || n % block_elems != 0)
    fail("gguf", "quantizing ", n, " elements to ", ggml_type_name(t), ": the count must be a multiple of ",
         block_elems, ", the type's block size");
  if (t == GgmlType::f32) return std::string(reinterpret_cast<const char*>(src), size_t(n) * 4);
  std::string out;
  if (!block) {  // F16 / BF16: round to nearest even, as numpy's astype and ggml do
    out.resize(size_t(n) * 2);
    for (int64_t i = 0; i < n; ++i) {
      const uint16_t bits = t == GgmlType::f16 ? f32_to_f16(src[i]).bits : f32_to_bf16(src[i]).bits;
      std::memcpy(out.data() + 2 * i, &bits, 2);
    }
    return out;
  }
  int64_t block_bytes = 0, elems = 0;
  ggml_block_shape(t, &elems, &block_bytes);
  out.resize(size_t(n / 32 * block_bytes));
  auto* dst = reinterpret_cast<uint8_t*>(out.data());
  for (int64_t b = 0; b < n / 32; ++b) block(src + b * 32, dst + b * block_bytes);
  return out;
}

}  // namespace loom::io

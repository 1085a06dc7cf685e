// DataParallel's 16-bit weight all-gathers (parallel.gather_dtype bf16 or fp16): ZeRO-3's
// gathers before use and the stage 1-2 gathers after the optimizer step send the product
// operands of each chunk in the 16-bit type the products round them to, and every other element
// in f32, so the weights every rank computes with are those of an f32 gather.
#include <algorithm>
#include <cstring>

#include "loom/core/timer.h"
#include "loom/core/trace.h"
#include "loom/kernels/cpu/rounded_operands.h"
#include "loom/parallel/data_parallel.h"

namespace loom::parallel {

using model::ParamUnit;

void DataParallel::build_wire_units() {
  wire_units_.clear();
  if (!sixteen_bit_gathers()) return;
  for (const ParamUnit& u : layout_.units()) {
    WireUnit w;
    const int n = n_of(u);
    const int64_t cs = chunk_size(u);
    // The unit's exact (f32) ranges, relative to its start; the rest (product operands and the
    // padding, which is zero) travels rounded. A unit without product operands (an embedding
    // unit) is exact throughout, padding included, so its slots are its f32 chunks in order.
    std::vector<std::pair<int64_t, int64_t>> exact;
    bool any_rounded = false;
    for (const auto& p : layout_.params()) {
      if (p.offset < u.begin || p.offset >= u.end || p.numel() == 0) continue;
      any_rounded |= p.product_operand;
      if (p.product_operand) continue;
      const int64_t b = p.offset - u.begin, e = b + p.numel();
      if (!exact.empty() && exact.back().second == b)
        exact.back().second = e;
      else
        exact.push_back({b, e});
    }
    if (!any_rounded && u.size() > 0) exact = {{0, u.size()}};
    w.runs.resize(size_t(n));
    for (int q = 0; q < n; ++q) {
      const int64_t c0 = q * cs, c1 = c0 + cs;
      int64_t pos = c0, n16 = 0, n32 = 0;
      auto& runs = w.runs[size_t(q)];
      for (const auto& [b, e] : exact) {
        if (e <= c0 || b >= c1) continue;
        const int64_t eb = std::max(b, c0), ee = std::min(e, c1);
        if (eb > pos) {
          runs.push_back({pos - c0, eb - pos, true});
          n16 += eb - pos;
        }
        runs.push_back({eb - c0, ee - eb, false});
        n32 += ee - eb;
        pos = ee;
      }
      if (pos < c1) {
        runs.push_back({pos - c0, c1 - pos, true});
        n16 += c1 - pos;
      }
      w.n16 = std::max(w.n16, n16);
      w.n32 = std::max(w.n32, n32);
    }
    w.n16 += w.n16 & 1;  // keeps the f32 values 4-byte aligned
    wire_units_.push_back(std::move(w));
  }
}

void DataParallel::pack_chunk(const ParamUnit& u, const float* chunk, const Tensor& wire, int q) const {
  const WireUnit& w = wire_units_[index_of(u)];
  const bool bf16 = opt_.gather_dtype == DType::bf16;
  uint16_t* slot = static_cast<uint16_t*>(wire.raw()) + int64_t(q) * w.slot_elems();
  float* exact = reinterpret_cast<float*>(slot + w.n16);
  int64_t i16 = 0, i32 = 0;
  for (const WireRun& run : w.runs[size_t(q)]) {
    const float* src = chunk + run.offset;
    if (run.rounded) {
      cpu::narrow_to_16(bf16, src, slot + i16, run.n);
      i16 += run.n;
    } else {
      std::memcpy(exact + i32, src, size_t(run.n) * sizeof(float));
      i32 += run.n;
    }
  }
  std::fill(slot + i16, slot + w.n16, uint16_t(0));  // padding: sent, never read
  std::fill(exact + i32, exact + w.n32, 0.f);
}

void DataParallel::unpack_unit(const ParamUnit& u, const Tensor& wire, float* unit, int skip_rank) const {
  const WireUnit& w = wire_units_[index_of(u)];
  const bool bf16 = opt_.gather_dtype == DType::bf16;
  const int64_t cs = chunk_size(u);
  const uint16_t* base = static_cast<const uint16_t*>(wire.raw());
  // Pieces of at most kPiece elements, spread over the threads: stages 1-2 widen every unit
  // from the replica before each use, on the step's critical path.
  constexpr int64_t kPiece = 1 << 15;
  struct Piece {
    const void* src;
    float* dst;
    int64_t n;
    bool rounded;
  };
  std::vector<Piece> pieces;
  for (int q = 0; q < n_of(u); ++q) {
    if (q == skip_rank) continue;
    const uint16_t* slot = base + int64_t(q) * w.slot_elems();
    const float* exact = reinterpret_cast<const float*>(slot + w.n16);
    int64_t i16 = 0, i32 = 0;
    for (const WireRun& run : w.runs[size_t(q)]) {
      float* dst = unit + q * cs + run.offset;
      for (int64_t j = 0; j < run.n; j += kPiece) {
        const int64_t n = std::min(kPiece, run.n - j);
        if (run.rounded)
          pieces.push_back({slot + i16 + j, dst + j, n, true});
        else
          pieces.push_back({exact + i32 + j, dst + j, n, false});
      }
      (run.rounded ? i16 : i32) += run.n;
    }
  }
#pragma omp parallel for schedule(static) if (pieces.size() > 4)
  for (size_t i = 0; i < pieces.size(); ++i) {
    const Piece& p = pieces[i];
    if (p.rounded)
      cpu::widen_from_16(bf16, static_cast<const uint16_t*>(p.src), p.dst, p.n);
    else
      std::memcpy(p.dst, p.src, size_t(p.n) * sizeof(float));
  }
}

comm::Work DataParallel::start_unit_gather(const ParamUnit& u, const Tensor& chunk, const Tensor& out, Tensor& wire) {
  if (!sixteen_bit_gathers()) return group_of(u).all_gather_async(chunk, out);
  const int64_t e = wire_units_[index_of(u)].slot_elems();
  wire = take_buffer(n_of(u) * e, opt_.gather_dtype);  // 2-byte elements; an f32 value takes two
  pack_chunk(u, chunk.data<float>(), wire, r_of(u));
  return group_of(u).all_gather_async(wire.slice(r_of(u) * e, {e}), wire);
}

void DataParallel::finish_unit_gather(const ParamUnit& u, Tensor& wire, const Tensor& out, bool in_place) {
  if (!wire.defined()) return;
  // In place (stages 1-2 without the replica), this rank's own chunk keeps its fp32 master.
  unpack_unit(u, wire, out.data<float>(), in_place ? r_of(u) : -1);
  recycle(std::move(wire));
  wire = Tensor();
}

int64_t DataParallel::gather_wire_bytes(const ParamUnit& u) const {
  const int64_t others = n_of(u) - 1;
  if (!sixteen_bit_gathers()) return others * chunk_size(u) * 4;
  return others * wire_units_[index_of(u)].slot_elems() * 2;
}

}  // namespace loom::parallel

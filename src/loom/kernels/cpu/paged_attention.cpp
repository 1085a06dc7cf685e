// Paged attention forward (CPU). Work items are (sequence, KV head, tile of queries), so a
// GQA group's query heads share each loaded key block. Each query keeps its own online-softmax
// state (FlashAttention-2 style) and walks the key blocks in order, so its result does not
// depend on how its sequence was chunked or batched. The f32 item is compiled for AVX-512,
// AVX2 and the baseline and chosen at run time, like the hot kernels.
#include "loom/kernels/cpu/paged_attention.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <type_traits>
#include <vector>

#include "loom/core/error.h"
#include "loom/core/isa_target.h"
#include "loom/kernels/cpu/cpu_kernels.h"
#include "loom/kernels/cpu/vec_math.h"

namespace loom::cpu {
namespace {

constexpr int64_t kQueryTile = 64;  // queries per item: a key block is transposed once per item
constexpr double kNegBig = -1e30;

struct ItemArgs {
  int64_t q_stride, out_stride, block_size, H, KVH, D;
};

// Keys are scored W at a time: one vector of W lanes per query row, accumulated over d, for
// kRows rows at once (independent chains that share each load of the transposed keys), so no
// horizontal sum is needed per key. W is one register of f32: 16 (zmm) on AVX-512, 8 (ymm)
// on AVX2, 4 (xmm) in the portable build; 8 rows of 16 lanes would be all 16 ymm registers,
// which left AVX2 slower than the portable build. Scratch rows are padded to kW, a multiple of
// every W; the f64 reference build takes kW.
constexpr int64_t kW = 16;
constexpr int64_t kRows = 8;

// Per-thread scratch sized for one item.
template <class T>
struct Scratch {
  std::vector<T> qs, acc, m, l, s, kt;
  void size(const ItemArgs& a) {
    const int64_t group = a.H / a.KVH, bw = (a.block_size + kW - 1) / kW * kW;
    qs.resize(size_t(kQueryTile * group * a.D));
    acc.resize(qs.size());
    m.resize(size_t(kQueryTile * group));
    l.resize(m.size());
    s.resize(size_t(kRows * bw));
    kt.resize(size_t(bw * a.D));  // a key block transposed: [D, bw]
  }
};

// Vector helpers below are always inlined into the per-ISA items, so the baseline ABI of a
// vector argument or return (what -Wpsabi warns about) never applies.
#pragma GCC diagnostic ignored "-Wpsabi"

// W lanes of T as one GCC vector (a zmm or ymm of f32; split on narrower targets),
// so that accumulators stay in registers.
// Loads and stores are plain dereferences of a copy of the type aligned as T: through memcpy,
// GCC kept the AVX2 build's vectors on the stack (3x slower than the portable build).
template <class T, int W>
struct Lanes {
  typedef T type __attribute__((vector_size(W * sizeof(T))));
  typedef T unaligned __attribute__((vector_size(W * sizeof(T)), aligned(alignof(T)), may_alias));
};
template <class T, int W>
using Vec = typename Lanes<T, W>::type;
template <class T, int W>
[[gnu::always_inline]] inline Vec<T, W> vload(const T* p) {
  return *reinterpret_cast<const typename Lanes<T, W>::unaligned*>(p);
}
template <class T, int W>
[[gnu::always_inline]] inline void vstore(T* p, const Vec<T, W>& v) {
  *reinterpret_cast<typename Lanes<T, W>::unaligned*>(p) = v;
}

// acc[0, DC*W) = acc * corr + sum over j < nj (in order) of p[j] * v[j]; the DC vectors of
// acc stay in registers over j (independent chains, one per vector).
template <class T, int W, int DC>
[[gnu::always_inline]] inline void pv_fixed(T* acc, T corr, const T* p, const T* v, int64_t D, int64_t nj) {
  Vec<T, W> av[DC];
#pragma GCC unroll 8
  for (int c = 0; c < DC; ++c) av[c] = vload<T, W>(acc + c * W) * corr;
  for (int64_t j = 0; j < nj; ++j) {
    const T pj = p[j];
    const T* vj = v + j * D;
#pragma GCC unroll 8
    for (int c = 0; c < DC; ++c) av[c] += pj * vload<T, W>(vj + c * W);
  }
#pragma GCC unroll 8
  for (int c = 0; c < DC; ++c) vstore<T, W>(acc + c * W, av[c]);
}

template <class T, int W>
[[gnu::always_inline]] inline void pv(T* acc, T corr, const T* p, const T* v, int64_t D, int64_t nj) {
  int64_t d0 = 0;
  for (; d0 + 4 * W <= D; d0 += 4 * W) pv_fixed<T, W, 4>(acc + d0, corr, p, v + d0, D, nj);
  for (; d0 + W <= D; d0 += W) pv_fixed<T, W, 1>(acc + d0, corr, p, v + d0, D, nj);
  for (; d0 < D; ++d0) {
    T x = acc[d0] * corr;
    for (int64_t j = 0; j < nj; ++j) x += p[j] * v[j * D + d0];
    acc[d0] = x;
  }
}

// Scores of kRows query rows against W keys (lanes) of the transposed block: for each row,
// s[t] = sum over d (in order) of q[d] * kt[d][t]. Rows past the real ones repeat the last.
template <class T, int W>
[[gnu::always_inline]] inline void score_rows(const T* const* qr, const T* kt, int64_t bw, int64_t D, T* s,
                                              int64_t s_stride) {
  Vec<T, W> sv[kRows] = {};
  for (int64_t d = 0; d < D; ++d) {
    const Vec<T, W> kd = vload<T, W>(kt + d * bw);
#pragma GCC unroll 8
    for (int u = 0; u < kRows; ++u) sv[u] += qr[u][d] * kd;
  }
#pragma GCC unroll 8
  for (int u = 0; u < kRows; ++u) vstore<T, W>(s + u * s_stride, sv[u]);
}

// Each query row walks the key blocks in order with its own online-softmax state: scores of a
// block as s[j] = sum over d (in order) of q[d] * k[j][d], its exponentials, then acc = acc *
// correction + sum over j (in order) of p[j] * v[j]. The arithmetic of a row does not depend on
// the tile, the chunking of its sequence or the other rows, so prefill and decode agree.
template <class T, int W>
[[gnu::always_inline]] inline void attend_item(const T* q, const T* k_cache, const T* v_cache, const PagedSeq& sq,
                                               int64_t g, int64_t i0, int64_t i1, T* out, const ItemArgs& a,
                                               Scratch<T>& w) {
  const int64_t D = a.D, bs = a.block_size, group = a.H / a.KVH, nq = i1 - i0;
  const int64_t bw = (bs + kW - 1) / kW * kW, R = nq * group;
  const T scale = T(1.0 / std::sqrt(double(D)));
  for (int64_t i = 0; i < nq; ++i)
    for (int64_t hh = 0; hh < group; ++hh) {
      const T* src = q + (sq.row0 + i0 + i) * a.q_stride + (g * group + hh) * D;
      T* dst = &w.qs[size_t((i * group + hh) * D)];
      for (int64_t d = 0; d < D; ++d) dst[d] = src[d] * scale;
      w.m[size_t(i * group + hh)] = T(kNegBig);
      w.l[size_t(i * group + hh)] = 0;
    }
  std::fill(w.acc.begin(), w.acc.begin() + R * D, T(0));
  const int64_t n_keys_max = sq.pos0 + i1;  // the tile's last query sees this many keys
  T* kt = w.kt.data();
  // Row r is query i = r / group: it sees keys up to position pos0 + i0 + i in block kb.
  auto keys_in_block = [&](int64_t r, int64_t kb) { return std::min(bs, sq.pos0 + i0 + r / group + 1 - kb * bs); };
  for (int64_t kb = 0; kb * bs < n_keys_max; ++kb) {
    const int64_t blk = sq.block_table[kb];
    const T* kblk = k_cache + (blk * a.KVH + g) * bs * D;
    const T* vblk = v_cache + (blk * a.KVH + g) * bs * D;
    // Lanes past the keys a row sees hold other finite keys (or zeros) and are never read.
    const int64_t used = std::min(bs, n_keys_max - kb * bs);
    for (int64_t d = 0; d < D; ++d)
      for (int64_t j = 0; j < used; ++j) kt[d * bw + j] = kblk[j * D + d];
    for (int64_t r0 = 0; r0 < R; r0 += kRows) {
      const int64_t rn = std::min(kRows, R - r0);
      const int64_t nj_max = keys_in_block(r0 + rn - 1, kb);  // rows ascend in position
      if (nj_max <= 0) continue;
      const T* qr[kRows];
      for (int64_t u = 0; u < kRows; ++u) qr[u] = &w.qs[size_t((r0 + std::min(u, rn - 1)) * D)];
      for (int64_t c = 0; c * W < nj_max; ++c) score_rows<T, W>(qr, kt + c * W, bw, D, w.s.data() + c * W, bw);
      for (int64_t u = 0; u < rn; ++u) {
        const int64_t r = r0 + u, nj = keys_in_block(r, kb);
        if (nj <= 0) continue;
        // Max, exponentials and their sum lane-wise over whole vectors (lanes past nj: -big,
        // then 0), the lanes summed last: the same for this row in any tile.
        T* s = w.s.data() + u * bw;
        const int64_t nw = (nj + W - 1) / W * W;
        for (int64_t j = nj; j < nw; ++j) s[j] = T(kNegBig);
        const T mold = w.m[size_t(r)];
        T lane[W];
        for (int t = 0; t < W; ++t) lane[t] = mold;
        for (int64_t c = 0; c < nw; c += W)
          for (int t = 0; t < W; ++t) lane[t] = s[c + t] > lane[t] ? s[c + t] : lane[t];
        T mx = lane[0];
        for (int t = 1; t < W; ++t) mx = lane[t] > mx ? lane[t] : mx;
        const T corr = vexp<T>(mold - mx);
        for (int t = 0; t < W; ++t) lane[t] = 0;
        for (int64_t c = 0; c < nw; c += W)
          for (int t = 0; t < W; ++t) {
            const T x = vexp<T>(s[c + t] - mx);
            const T e = c + t < nj ? x : T(0);
            s[c + t] = e;
            lane[t] += e;
          }
        T sum = 0;
        for (int t = 0; t < W; ++t) sum += lane[t];
        w.l[size_t(r)] = w.l[size_t(r)] * corr + sum;
        w.m[size_t(r)] = mx;
        pv<T, W>(&w.acc[size_t(r * D)], corr, s, vblk, D, nj);
      }
    }
  }
  for (int64_t i = 0; i < nq; ++i)
    for (int64_t hh = 0; hh < group; ++hh) {
      const int64_t r = i * group + hh;
      T* o = out + (sq.row0 + i0 + i) * a.out_stride + (g * group + hh) * D;
      const T inv = T(1) / w.l[size_t(r)];
      const T* acc = &w.acc[size_t(r * D)];
      for (int64_t d = 0; d < D; ++d) o[d] = acc[d] * inv;
    }
}

using ItemFn = void (*)(const float*, const float*, const float*, const PagedSeq&, int64_t, int64_t, int64_t, float*,
                        const ItemArgs&, Scratch<float>&);

#define LOOM_PAGED_ITEM(name, attr, W)                                                                      \
  attr void name(const float* q, const float* k, const float* v, const PagedSeq& sq, int64_t g, int64_t i0, \
                 int64_t i1, float* out, const ItemArgs& a, Scratch<float>& w) {                            \
    attend_item<float, W>(q, k, v, sq, g, i0, i1, out, a, w);                                               \
  }
LOOM_PAGED_ITEM(item_avx512, LOOM_TARGET_AVX512, 16)
LOOM_PAGED_ITEM(item_avx2, LOOM_TARGET_AVX2, 8)
LOOM_PAGED_ITEM(item_base, , 4)
#undef LOOM_PAGED_ITEM

}  // namespace

std::string paged_attention_isa() { return hot_kernels_isa(); }

namespace {

ItemFn item_for(const std::string& isa) {
  if (isa == "avx512") return item_avx512;
  if (isa == "avx2") return item_avx2;
  return item_base;
}

// f32_item: the f32 build to run (null: the one the hot kernels were given, by CPU features or
// LOOM_ISA).
template <class T>
void run_items(const T* q, const T* k_cache, const T* v_cache, const PagedSeq* seqs, int64_t n_seqs, T* out,
               const ItemArgs& a, [[maybe_unused]] ItemFn f32_item = nullptr) {
  // Flatten (sequence, KV head, query tile) into one index space for the thread team.
  std::vector<int64_t> first(size_t(n_seqs) + 1, 0);
  for (int64_t s = 0; s < n_seqs; ++s)
    first[size_t(s) + 1] = first[size_t(s)] + a.KVH * ((seqs[s].n_q + kQueryTile - 1) / kQueryTile);
  const int64_t n_items = first.back();
  if constexpr (std::is_same_v<T, float>) {
    static const ItemFn picked = item_for(paged_attention_isa());
    if (!f32_item) f32_item = picked;
  }
#pragma omp parallel if (n_items > 1)
  {
    // Per thread, kept across calls (OpenMP reuses its threads): resized, never reallocated,
    // on each layer of each step.
    thread_local Scratch<T> w;
    w.size(a);
#pragma omp for schedule(dynamic, 1)
    for (int64_t it = 0; it < n_items; ++it) {
      const int64_t s = std::upper_bound(first.begin(), first.end(), it) - first.begin() - 1;
      const int64_t local = it - first[size_t(s)];
      const int64_t n_tiles = (seqs[s].n_q + kQueryTile - 1) / kQueryTile;
      // Latest (heaviest) tiles first within a sequence.
      const int64_t tile = n_tiles - 1 - local % n_tiles, g = local / n_tiles;
      const int64_t i0 = tile * kQueryTile, i1 = std::min(seqs[s].n_q, i0 + kQueryTile);
      if constexpr (std::is_same_v<T, float>)
        f32_item(q, k_cache, v_cache, seqs[s], g, i0, i1, out, a, w);
      else
        attend_item<T, kW>(q, k_cache, v_cache, seqs[s], g, i0, i1, out, a, w);
    }
  }
}

}  // namespace

template <class T>
void paged_attention_forward(const T* q, int64_t q_stride, const T* k_cache, const T* v_cache, int64_t block_size,
                             const PagedSeq* seqs, int64_t n_seqs, T* out, int64_t out_stride, int64_t H, int64_t KVH,
                             int64_t D) {
  const ItemArgs a{q_stride, out_stride, block_size, H, KVH, D};
  run_items<T>(q, k_cache, v_cache, seqs, n_seqs, out, a);
}

void paged_attention_forward_on(const std::string& isa, const float* q, int64_t q_stride, const float* k_cache,
                                const float* v_cache, int64_t block_size, const PagedSeq* seqs, int64_t n_seqs,
                                float* out, int64_t out_stride, int64_t H, int64_t KVH, int64_t D) {
  check_isa_runs_here(isa, "paged_attention");
  const ItemArgs a{q_stride, out_stride, block_size, H, KVH, D};
  run_items<float>(q, k_cache, v_cache, seqs, n_seqs, out, a, item_for(isa));
}

template <class T>
void paged_kv_write(const T* k, const T* v, int64_t stride, const int64_t* slots, int64_t rows, T* k_cache, T* v_cache,
                    int64_t block_size, int64_t KVH, int64_t D) {
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t blk = slots[r] / block_size, off = slots[r] % block_size;
    for (int64_t g = 0; g < KVH; ++g) {
      const int64_t dst = ((blk * KVH + g) * block_size + off) * D;
      std::memcpy(k_cache + dst, k + r * stride + g * D, size_t(D) * sizeof(T));
      std::memcpy(v_cache + dst, v + r * stride + g * D, size_t(D) * sizeof(T));
    }
  }
}

template <class T>
void paged_block_copy(T* cache, const int32_t* src, const int32_t* dst, int64_t n, int64_t block_elems) {
  for (int64_t i = 0; i < n; ++i)
    std::memcpy(cache + int64_t(dst[i]) * block_elems, cache + int64_t(src[i]) * block_elems,
                size_t(block_elems) * sizeof(T));
}

#define INSTANTIATE(T)                                                                                               \
  template void paged_attention_forward<T>(const T*, int64_t, const T*, const T*, int64_t, const PagedSeq*, int64_t, \
                                           T*, int64_t, int64_t, int64_t, int64_t);                                  \
  template void paged_kv_write<T>(const T*, const T*, int64_t, const int64_t*, int64_t, T*, T*, int64_t, int64_t,    \
                                  int64_t);                                                                          \
  template void paged_block_copy<T>(T*, const int32_t*, const int32_t*, int64_t, int64_t);
INSTANTIATE(float)
INSTANTIATE(double)
#undef INSTANTIATE

}  // namespace loom::cpu

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

#include "loom/kernels/cpu/cpu_kernels.h"
#include "loom/kernels/cpu/vec_math.h"

namespace loom::cpu {
namespace {

constexpr int64_t kQueryTile = 16;
constexpr double kNegBig = -1e30;

struct ItemArgs {
  int64_t q_stride, out_stride, block_size, H, KVH, D;
};

// Per-thread scratch sized for one item.
template <class T>
struct Scratch {
  std::vector<T> qs, acc, m, l, s;
  void size(const ItemArgs& a) {
    const int64_t group = a.H / a.KVH;
    qs.resize(size_t(kQueryTile * group * a.D));
    acc.resize(qs.size());
    m.resize(size_t(kQueryTile * group));
    l.resize(m.size());
    s.resize(size_t(a.block_size));
  }
};

// q . k over D with sixteen partial sums in a fixed order (vectorises without -ffast-math, and
// gives the same bits whichever tile the query sits in).
template <class T>
[[gnu::always_inline]] inline T dot(const T* q, const T* k, int64_t D) {
  T part[16] = {};
  int64_t d = 0;
  for (; d + 16 <= D; d += 16)
    for (int j = 0; j < 16; ++j) part[j] += q[d + j] * k[d + j];
  T sum = 0;
  for (int j = 0; j < 16; ++j) sum += part[j];
  for (; d < D; ++d) sum += q[d] * k[d];
  return sum;
}

template <class T>
[[gnu::always_inline]] inline void attend_item(const T* q, const T* k_cache, const T* v_cache,
                                               const PagedSeq& sq, int64_t g, int64_t i0,
                                               int64_t i1, T* out, const ItemArgs& a,
                                               Scratch<T>& w) {
  const int64_t D = a.D, bs = a.block_size, group = a.H / a.KVH, nq = i1 - i0;
  const T scale = T(1.0 / std::sqrt(double(D)));
  for (int64_t i = 0; i < nq; ++i)
    for (int64_t hh = 0; hh < group; ++hh) {
      const T* src = q + (sq.row0 + i0 + i) * a.q_stride + (g * group + hh) * D;
      T* dst = &w.qs[size_t((i * group + hh) * D)];
      for (int64_t d = 0; d < D; ++d) dst[d] = src[d] * scale;
      w.m[size_t(i * group + hh)] = T(kNegBig);
      w.l[size_t(i * group + hh)] = 0;
    }
  std::fill(w.acc.begin(), w.acc.begin() + nq * group * D, T(0));
  const int64_t n_keys_max = sq.pos0 + i1;  // the tile's last query sees this many keys
  T* s = w.s.data();
  for (int64_t kb = 0; kb * bs < n_keys_max; ++kb) {
    const int64_t blk = sq.block_table[kb];
    const T* kblk = k_cache + (blk * a.KVH + g) * bs * D;
    const T* vblk = v_cache + (blk * a.KVH + g) * bs * D;
    for (int64_t i = 0; i < nq; ++i) {
      const int64_t nj = std::min(bs, sq.pos0 + i0 + i + 1 - kb * bs);  // causal
      if (nj <= 0) continue;
      for (int64_t hh = 0; hh < group; ++hh) {
        const int64_t r = i * group + hh;
        const T* qi = &w.qs[size_t(r * D)];
        for (int64_t j = 0; j < nj; ++j) s[j] = dot(qi, kblk + j * D, D);
        const T mold = w.m[size_t(r)];
        T mx = mold;
        for (int64_t j = 0; j < nj; ++j) mx = s[j] > mx ? s[j] : mx;
        const T corr = vexp<T>(mold - mx);
        T sum = 0;
        for (int64_t j = 0; j < nj; ++j) {
          s[j] = vexp<T>(s[j] - mx);
          sum += s[j];
        }
        w.l[size_t(r)] = w.l[size_t(r)] * corr + sum;
        w.m[size_t(r)] = mx;
        T* acc = &w.acc[size_t(r * D)];
        for (int64_t d = 0; d < D; ++d) acc[d] *= corr;
        for (int64_t j = 0; j < nj; ++j) {
          const T p = s[j];
          const T* vj = vblk + j * D;
          for (int64_t d = 0; d < D; ++d) acc[d] += p * vj[d];
        }
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

using ItemFn = void (*)(const float*, const float*, const float*, const PagedSeq&, int64_t,
                        int64_t, int64_t, float*, const ItemArgs&, Scratch<float>&);

#define LOOM_PAGED_ITEM(name, attr)                                                          \
  attr void name(const float* q, const float* k, const float* v, const PagedSeq& sq,         \
                 int64_t g, int64_t i0, int64_t i1, float* out, const ItemArgs& a,           \
                 Scratch<float>& w) {                                                        \
    attend_item<float>(q, k, v, sq, g, i0, i1, out, a, w);                                   \
  }
LOOM_PAGED_ITEM(item_avx512,
                [[gnu::target("avx512f,avx512vl,avx512bw,avx512dq,avx2,fma,prefer-vector-width=512")]])
LOOM_PAGED_ITEM(item_avx2, [[gnu::target("avx2,fma")]])
LOOM_PAGED_ITEM(item_base, )
#undef LOOM_PAGED_ITEM

// The instruction set the hot kernels were given (CPU features, or LOOM_ISA).
ItemFn pick_item_f32() {
  const std::string isa = hot_kernels_isa();
  if (isa == "avx512") return item_avx512;
  if (isa == "avx2") return item_avx2;
  return item_base;
}

template <class T>
void run_items(const T* q, const T* k_cache, const T* v_cache, const PagedSeq* seqs,
               int64_t n_seqs, T* out, const ItemArgs& a) {
  // Flatten (sequence, KV head, query tile) into one index space for the thread team.
  std::vector<int64_t> first(size_t(n_seqs) + 1, 0);
  for (int64_t s = 0; s < n_seqs; ++s)
    first[size_t(s) + 1] = first[size_t(s)] + a.KVH * ((seqs[s].n_q + kQueryTile - 1) / kQueryTile);
  const int64_t n_items = first.back();
  [[maybe_unused]] ItemFn f32_item = nullptr;
  if constexpr (std::is_same_v<T, float>) {
    static const ItemFn picked = pick_item_f32();
    f32_item = picked;
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
        attend_item<T>(q, k_cache, v_cache, seqs[s], g, i0, i1, out, a, w);
    }
  }
}

}  // namespace

template <class T>
void paged_attention_forward(const T* q, int64_t q_stride, const T* k_cache, const T* v_cache,
                             int64_t block_size, const PagedSeq* seqs, int64_t n_seqs, T* out,
                             int64_t out_stride, int64_t H, int64_t KVH, int64_t D) {
  const ItemArgs a{q_stride, out_stride, block_size, H, KVH, D};
  run_items<T>(q, k_cache, v_cache, seqs, n_seqs, out, a);
}

template <class T>
void paged_kv_write(const T* k, const T* v, int64_t stride, const int64_t* slots, int64_t rows,
                    T* k_cache, T* v_cache, int64_t block_size, int64_t KVH, int64_t D) {
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
void paged_block_copy(T* cache, const int32_t* src, const int32_t* dst, int64_t n,
                      int64_t block_elems) {
  for (int64_t i = 0; i < n; ++i)
    std::memcpy(cache + int64_t(dst[i]) * block_elems, cache + int64_t(src[i]) * block_elems,
                size_t(block_elems) * sizeof(T));
}

#define INSTANTIATE(T)                                                                        \
  template void paged_attention_forward<T>(const T*, int64_t, const T*, const T*, int64_t,    \
                                           const PagedSeq*, int64_t, T*, int64_t, int64_t,    \
                                           int64_t, int64_t);                                 \
  template void paged_kv_write<T>(const T*, const T*, int64_t, const int64_t*, int64_t, T*,   \
                                  T*, int64_t, int64_t, int64_t);                             \
  template void paged_block_copy<T>(T*, const int32_t*, const int32_t*, int64_t, int64_t);
INSTANTIATE(float)
INSTANTIATE(double)
#undef INSTANTIATE

}  // namespace loom::cpu

// Paged attention on the CPU: causal attention whose keys and values live in fixed-size
// cache blocks found through a per-sequence block table (prefill chunks and decode alike),
// plus the scatter of new K/V rows into those blocks. Cache layout per layer:
// [num_blocks, KVH, block_size, D]. Pointer level, like cpu_kernels.h: no argument checks.
#pragma once
#include <cstdint>
#include <string>

namespace loom::cpu {

// One sequence's queries: rows [row0, row0 + n_q) of q/out hold positions pos0 .. pos0+n_q-1;
// query i sees keys 0 .. pos0 + i.
struct PagedSeq {
  const int32_t* block_table = nullptr;
  int64_t pos0 = 0;
  int64_t n_q = 0;
  int64_t row0 = 0;
};

// q: rows of stride q_stride holding H heads of D (head h at column h*D); out likewise with
// stride out_stride. Query head h reads key/value head h / (H / KVH) (grouped-query).
template <class T>
void paged_attention_forward(const T* q, int64_t q_stride, const T* k_cache, const T* v_cache, int64_t block_size,
                             const PagedSeq* seqs, int64_t n_seqs, T* out, int64_t out_stride, int64_t H, int64_t KVH,
                             int64_t D);

// The instruction-set build the f32 forward runs: the hot kernels' (CPU features, or LOOM_ISA).
std::string paged_attention_isa();

// The f32 forward on a given instruction-set build (one of cpu::isas_here(); throws for one
// this CPU lacks): for tests and comparisons.
void paged_attention_forward_on(const std::string& isa, const float* q, int64_t q_stride, const float* k_cache,
                                const float* v_cache, int64_t block_size, const PagedSeq* seqs, int64_t n_seqs,
                                float* out, int64_t out_stride, int64_t H, int64_t KVH, int64_t D);

// Scatters rows: for row r, k[r*stride .. + KVH*D) and v likewise go to cache slot slots[r]
// (= block * block_size + offset).
template <class T>
void paged_kv_write(const T* k, const T* v, int64_t stride, const int64_t* slots, int64_t rows, T* k_cache, T* v_cache,
                    int64_t block_size, int64_t KVH, int64_t D);

// Copies whole blocks (copy-on-write): for each i, block dst[i] = block src[i].
template <class T>
void paged_block_copy(T* cache, const int32_t* src, const int32_t* dst, int64_t n, int64_t block_elems);

}  // namespace loom::cpu

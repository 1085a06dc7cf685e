// Paged attention against the dense causal attention (loom::ops::attention_forward): several
// sequences batched in one call, K/V scattered over shuffled cache blocks, queries split into
// prefill chunks and single decode tokens, for multi-head (GPT-2) and grouped-query (LLaMA).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

#include "loom/kernels/cpu/cpu_kernels.h"
#include "loom/kernels/cpu/paged_attention.h"
#include "loom/kernels/ops.h"

using namespace loom;

namespace {

struct Case {
  int64_t H, KVH, D, bs;
};

// isa: the f32 build to run (empty: the default one; f64 has one build).
template <class T>
void check(const Case& c, double tol, const std::string& isa = "") {
  const int64_t H = c.H, KVH = c.KVH, D = c.D, bs = c.bs, W = (H + 2 * KVH) * D;
  const std::vector<int64_t> lens{37, 1, 16, 50};
  const int64_t n_blocks = 64;
  std::mt19937 g(11);
  std::normal_distribution<double> nd(0.0, 1.0);
  // Shuffled block ids so tables are not contiguous.
  std::vector<int32_t> free_blocks(static_cast<size_t>(n_blocks));
  for (int32_t i = 0; i < int32_t(n_blocks); ++i) free_blocks[size_t(i)] = i;
  std::shuffle(free_blocks.begin(), free_blocks.end(), g);
  std::vector<T> kc(size_t(n_blocks * KVH * bs * D), T(0)), vc(kc.size(), T(0));

  std::vector<std::vector<T>> qkvs, dense_out;
  std::vector<std::vector<int32_t>> tables;
  size_t next_block = 0;
  for (int64_t T_ : lens) {
    std::vector<T> qkv(static_cast<size_t>(T_ * W));
    for (auto& v : qkv) v = T(nd(g));
    Tensor tq = Tensor::from_vector(qkv, {1, T_, W});
    Tensor out = Tensor::zeros({1, T_, H * D}, dtype_of<T>());
    Tensor lse = Tensor::zeros({1, H, T_}, dtype_of<T>());
    ops::attention_forward(tq, out, lse, H, KVH);
    std::vector<T> o(out.data<T>(), out.data<T>() + out.numel());
    std::vector<int32_t> table;
    for (int64_t b = 0; b < (T_ + bs - 1) / bs; ++b) table.push_back(free_blocks[next_block++]);
    std::vector<int64_t> slots;
    for (int64_t p = 0; p < T_; ++p) slots.push_back(int64_t(table[size_t(p / bs)]) * bs + p % bs);
    cpu::paged_kv_write<T>(qkv.data() + H * D, qkv.data() + (H + KVH) * D, W, slots.data(), T_, kc.data(), vc.data(),
                           bs, KVH, D);
    qkvs.push_back(std::move(qkv));
    dense_out.push_back(std::move(o));
    tables.push_back(std::move(table));
  }
  // Each sequence's queries in one batched call: chunk boundaries differ per sequence.
  const std::vector<std::vector<int64_t>> chunks{{0, 5, 20, 37}, {0, 1}, {0, 16}, {0, 49, 50}};
  std::vector<T> out_paged;
  for (size_t round = 0; round < 3; ++round) {
    std::vector<T> q_rows;
    std::vector<cpu::PagedSeq> seqs;
    std::vector<std::pair<size_t, int64_t>> who;  // (sequence, first position) per descriptor
    int64_t row = 0;
    for (size_t s = 0; s < lens.size(); ++s) {
      if (round + 1 >= chunks[s].size()) continue;
      const int64_t p0 = chunks[s][round], p1 = chunks[s][round + 1];
      for (int64_t p = p0; p < p1; ++p)
        q_rows.insert(q_rows.end(), qkvs[s].begin() + p * W, qkvs[s].begin() + (p + 1) * W);
      seqs.push_back({tables[s].data(), p0, p1 - p0, row});
      who.push_back({s, p0});
      row += p1 - p0;
    }
    if (seqs.empty()) continue;
    std::vector<T> out(size_t(row * H * D), T(-7));
    const bool on_isa = std::is_same_v<T, float> && !isa.empty();
    if constexpr (std::is_same_v<T, float>)
      if (on_isa)
        cpu::paged_attention_forward_on(isa, q_rows.data(), W, kc.data(), vc.data(), bs, seqs.data(),
                                        int64_t(seqs.size()), out.data(), H * D, H, KVH, D);
    if (!on_isa)
      cpu::paged_attention_forward<T>(q_rows.data(), W, kc.data(), vc.data(), bs, seqs.data(), int64_t(seqs.size()),
                                      out.data(), H * D, H, KVH, D);
    for (size_t k = 0; k < seqs.size(); ++k) {
      const auto [s, p0] = who[k];
      for (int64_t i = 0; i < seqs[k].n_q; ++i)
        for (int64_t j = 0; j < H * D; ++j) {
          const double got = double(out[size_t((seqs[k].row0 + i) * H * D + j)]);
          const double want = double(dense_out[s][size_t((p0 + i) * H * D + j)]);
          ASSERT_NEAR(got, want, tol) << "seq " << s << " pos " << p0 + i << " col " << j;
        }
    }
  }
}

}  // namespace

TEST(PagedAttention, MatchesDenseMultiHeadF32) { check<float>({4, 4, 16, 4}, 2e-5); }
TEST(PagedAttention, MatchesDenseGroupedQueryF32) { check<float>({4, 2, 8, 16}, 2e-5); }
// Every instruction-set build this CPU runs, with head sizes that take the vector paths of
// every register width (64: 4 vectors of 16 lanes; 24: 3 of 8, 6 of 4) and their tails.
class PagedAttentionIsa : public ::testing::TestWithParam<std::string> {};
TEST_P(PagedAttentionIsa, MatchesDense) {
  for (const Case& c : {Case{4, 4, 16, 4}, Case{4, 2, 8, 16}, Case{2, 1, 64, 16}, Case{3, 3, 24, 8}, Case{2, 2, 40, 4}})
    check<float>(c, 2e-5, GetParam());
}
INSTANTIATE_TEST_SUITE_P(Runnable, PagedAttentionIsa, ::testing::ValuesIn(cpu::isas_here()),
                         [](const ::testing::TestParamInfo<std::string>& info) { return info.param; });

TEST(PagedAttention, MatchesDenseMultiHeadF64) { check<double>({3, 3, 8, 16}, 1e-12); }
TEST(PagedAttention, MatchesDenseGroupedQueryF64) { check<double>({6, 2, 4, 4}, 1e-12); }

// A query's result must not depend on how its sequence was chunked: the scheduler's
// preemption and chunked prefill rely on it for identical outputs.
TEST(PagedAttention, ChunkingDoesNotChangeAQuerysBits) {
  const int64_t H = 2, KVH = 1, D = 16, bs = 4, W = (H + 2 * KVH) * D, T_ = 23;
  std::mt19937 g(5);
  std::normal_distribution<float> nd(0.f, 1.f);
  std::vector<float> qkv(static_cast<size_t>(T_ * W));
  for (auto& v : qkv) v = nd(g);
  std::vector<int32_t> table{3, 0, 5, 1, 4, 2};
  std::vector<float> kc(static_cast<size_t>(6 * KVH * bs * D)), vc(kc.size());
  std::vector<int64_t> slots;
  for (int64_t p = 0; p < T_; ++p) slots.push_back(int64_t(table[size_t(p / bs)]) * bs + p % bs);
  cpu::paged_kv_write<float>(qkv.data() + H * D, qkv.data() + (H + KVH) * D, W, slots.data(), T_, kc.data(), vc.data(),
                             bs, KVH, D);
  std::vector<float> whole(static_cast<size_t>(T_ * H * D)), piece(whole.size());
  cpu::PagedSeq all{table.data(), 0, T_, 0};
  cpu::paged_attention_forward<float>(qkv.data(), W, kc.data(), vc.data(), bs, &all, 1, whole.data(), H * D, H, KVH, D);
  for (int64_t p = 0; p < T_; ++p) {  // one query at a time, as decode would
    cpu::PagedSeq one{table.data(), p, 1, 0};
    cpu::paged_attention_forward<float>(qkv.data() + p * W, W, kc.data(), vc.data(), bs, &one, 1,
                                        piece.data() + p * H * D, H * D, H, KVH, D);
  }
  EXPECT_EQ(whole, piece);
}

// The slice estimator (model/memory_estimate.h) against what a decoder slice allocates:
// pipeline stages (first, middle, last) with 1-3 micro-batches in flight, with and without
// checkpointing, GPT-2 and LLaMA (GQA) families, activations saved in f32 and in 16 bits. The
// planner's memory figures stand on it.
#include <gtest/gtest.h>

#include "loom/core/allocator.h"
#include "loom/model/decoder.h"
#include "loom/model/memory_estimate.h"

namespace loom::model {
namespace {

TEST(SliceMemory, StagesAndSlotsMatchTheDecodersAllocations) {
  for (const char* name : {"gpt2-tiny", "llama-tiny", "gpt2-shakespeare"})
    for (DType act : {DType::f32, DType::bf16}) {
      ModelConfig cfg = preset(name);
      cfg.activation_dtype = act;
      const int L = int(cfg.n_layer);
      struct Stage {
        int first, last;
        bool embed, head;
      };
      const std::vector<Stage> stages = {
          {0, L, true, true}, {0, 1, true, false}, {1, L, false, true}, {0, L / 2, true, false}};
      for (const Stage& st : stages)
        for (int ckpt : {0, 1})
          for (int slots : {1, 3}) {
            CpuAllocator alloc;
            DecoderOptions opt;
            opt.activation_checkpoint_interval = ckpt;
            opt.xent_chunk = 48;
            opt.slice = ModelSlice{st.first, st.last, st.embed, st.head};
            Decoder m(cfg, opt, DType::f32, alloc);
            const int64_t B = 2, T = 16;
            const auto before = alloc.snapshot();
            for (int i = 0; i < slots; ++i) m.stage_begin(B, T, true);
            const auto after = alloc.snapshot();
            const auto est = estimate_slice_activations(cfg, opt.slice, B, T, ckpt, opt.xent_chunk);
            const std::string what = std::string(name) + " " + dtype_name(act) + " layers [" +
                                     std::to_string(st.first) + "," + std::to_string(st.last) + ") ckpt " +
                                     std::to_string(ckpt) + " slots " + std::to_string(slots);
            EXPECT_EQ(m.activation_bytes(), est.activations(slots)) << what;
            EXPECT_EQ(after[MemCategory::activations].current - before[MemCategory::activations].current,
                      est.activations(slots))
                << what;
            EXPECT_EQ(after[MemCategory::workspace].current - before[MemCategory::workspace].current,
                      est.workspace_bytes(slots))
                << what;
          }
    }
}

TEST(SliceMemory, TheWholeModelAgreesWithTheTrainingEstimate) {
  for (const char* name : {"gpt2-tiny", "llama-tiny", "llama-moe-tiny"})
    for (DType act : {DType::f32, DType::bf16}) {
      ModelConfig cfg = preset(name);
      cfg.activation_dtype = act;
      for (int ckpt : {0, 1}) {
        const auto whole = estimate_training_memory(cfg, 0, 3, 20, ckpt, 32);
        const auto slice = estimate_slice_activations(cfg, ModelSlice{}, 3, 20, ckpt, 32);
        EXPECT_EQ(slice.activations(1), whole.activations) << name << " " << dtype_name(act);
        EXPECT_EQ(slice.workspace_bytes(1), whole.workspace) << name << " " << dtype_name(act);
      }
    }
}

}  // namespace
}  // namespace loom::model

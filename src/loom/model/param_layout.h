// The flat parameter layout: every parameter is a named {offset, shape} range in one buffer
// (names follow Hugging Face's GPT2LMHeadModel / LlamaForCausalLM / MixtralForCausalLM),
// ordered embeddings, blocks 0..L-1 (a MoE block followed by its routed experts), final norm,
// head, so a block is one contiguous range (ZeRO-3 gathers and pipeline stages are then offset
// ranges). Linear weights are [out, in] (GPT-2's Conv1D weights are stored transposed relative
// to Hugging Face; the safetensors mapping transposes).
// A layout may describe only the slice of the model one rank holds (ModelSlice): a pipeline
// stage's blocks, under tensor parallelism each parameter's tp slice, under expert parallelism
// each MoE block's share of the experts; every local element still knows its index in the
// whole Hugging Face parameter, so initialisation by (seed, name, element index) gives every
// layout the same model.
#pragma once
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "loom/core/tensor.h"
#include "loom/model/config.h"

namespace loom::model {

enum class Init { normal, zeros, ones };

// The part of the model one rank holds. Pipeline: blocks [first_layer, last_layer), plus the
// embeddings on the first stage and the final norm + head on the last (which, with tied
// embeddings and no embedding unit, holds its own copy of the token table); an interleaved
// stage (parallel.virtual_stages) holds further chunks of blocks (later_chunks). Tensor parallel:
// slice tp_rank of tp of every split parameter (see ParamInfo::split_dim).
struct LayerRange {
  int first = 0, last = 0;  // blocks [first, last)
  bool operator==(const LayerRange& o) const { return first == o.first && last == o.last; }
};
struct ModelSlice {
  int first_layer = 0;
  int last_layer = -1;  // -1: model.n_layer
  bool has_embedding = true, has_head = true;
  int64_t tp = 1, tp_rank = 0;
  // Expert parallelism: MoE blocks hold experts [ep_rank * E / ep, (ep_rank + 1) * E / ep).
  int64_t ep = 1, ep_rank = 0;
  // LoRA training (cfg.lora): the layout holds the adapters of the slice's blocks (units embed
  // and head empty) instead of the model's parameters, which stay frozen outside it.
  bool lora_adapters = false;
  // Interleaved pipelines: the block ranges this rank holds after [first_layer, last_layer), in
  // model order. The embeddings belong to the first chunk, the head to the last; the decoder
  // runs one chunk per micro-batch slot (Decoder::stage_begin). Empty: one chunk.
  std::vector<LayerRange> later_chunks = {};
  // Every chunk: [first_layer, last_layer) (last_layer -1 read as n_layer), then later_chunks.
  std::vector<LayerRange> chunks(int64_t n_layer) const;
  int64_t local_experts(const ModelConfig& cfg) const { return cfg.moe.num_experts / ep; }
  int64_t first_expert(const ModelConfig& cfg) const { return ep_rank * local_experts(cfg); }
};
// Throws "[config] parallel.tp=3 does not divide model.n_head=8" (and likewise d_ff); `setting`
// names the option as its users spell it ("--tp" on the inference commands).
void check_tensor_parallel(const ModelConfig& cfg, int64_t tp, const char* setting = "parallel.tp");
// Throws "[config] parallel.ep=3 does not divide model.moe.num_experts=8" (or names the dense
// model that ep > 1 needs experts for).
void check_expert_parallel(const ModelConfig& cfg, int64_t ep);

// Hugging Face names of the token table and of the LM head (the table itself when tied).
const char* token_table_name(const ModelConfig& cfg);
const char* lm_head_name(const ModelConfig& cfg);
// The learned position table (families with PositionKind::learned) and the final norm's gain
// ("weight") or shift ("bias").
const char* position_table_name(const ModelConfig& cfg);
std::string final_norm_name(const ModelConfig& cfg, const char* part);
// Rows of the token table (and untied head) each tp rank holds: ceil(vocab / tp). The rows
// past the vocabulary on the last rank are padding: zero, and masked out of the loss.
int64_t vocab_rows_per_rank(const ModelConfig& cfg, int64_t tp);

struct ParamInfo {
  std::string name;
  Shape shape;
  int64_t offset = 0;  // elements into the flat buffer
  int layer = -1;      // block index, -1 outside blocks
  Init init = Init::normal;
  float init_std = 0.02f;
  bool weight_decay = false;   // 2-D weights decay; biases and norm gains do not
  bool hf_transposed = false;  // stored [out, in] where Hugging Face stores [in, out]
  // Tensor parallelism. The whole parameter is full_shape ([out, in] like shape); split_dim 0:
  // this rank holds rows (the output features; the token table's vocabulary rows), taken
  // separately from each of split_parts equal row blocks (GPT-2's fused q|k|v: 3); 1: columns
  // (the input features of a row-parallel linear); -1: all of it.
  Shape full_shape;
  int split_dim = -1;
  int split_parts = 1;
  bool tp_replicated = false;    // tp > 1 and every tp rank holds all of it
  bool tp_grad_partial = false;  // replicated, but each tp rank computes only a part of its
                                 // gradient (LLaMA k/v projections when tp does not divide
                                 // n_kv_head): the gradients are summed over the tp group
  bool tied_copy = false;        // the last stage's copy of the tied token table
  int expert = -1;               // a routed expert's parameter: its expert index
  // Read by forward and backward only as the weight operand of a matrix product, which under
  // 16-bit precision rounds it to 16 bits first (linear and head weights; not the router, whose
  // product is f32, nor lookup tables, norms and biases). A 16-bit copy of it is then exact for
  // training: ZeRO gathers it in 16 bits.
  bool product_operand = false;
  int64_t numel() const { return shape.numel(); }
};

// A run of local elements [local, local + n) holding whole-parameter elements [global,
// global + n) (row-major in full_shape).
struct ElementRun {
  int64_t local, global, n;
};

// A sharding unit: the embeddings, one block, a MoE block's routed experts (right after its
// block unit), or the final norm + head. Units are contiguous and (with unit_align = N) padded
// so that N equal chunks tile each one; ZeRO shards, gathers and reduce-scatters unit by unit.
// Expert units are data-parallel over the ranks holding the same experts, every other unit
// over all the ranks that see different data.
struct ParamUnit {
  std::string name;  // "embed", "block.3", "experts.3", "head"
  int layer = -1;    // block index, -1 for embed/head
  bool experts = false;
  int64_t begin = 0, end = 0;  // padded element range in the flat buffer
  int64_t size() const { return end - begin; }
};

// The roles of a block's parameters: the BlockWeights members (model/block.h) they bind to.
// MoE blocks: fc_*/out_* are the shared experts, router_w the router, e_* expert `expert`'s MLP.
enum class BlockSlot : uint8_t {
  ln1_w,
  ln1_b,
  qkv_w,
  qkv_b,
  proj_w,
  proj_b,
  ln2_w,
  ln2_b,
  fc_w,
  fc_b,
  out_w,
  out_b,
  router_w,
  e_fc_w,
  e_fc_b,
  e_out_w,
  e_out_b
};

// One parameter of a block, as ParamLayout creates it and block_weights binds it; the one list
// of a block's parameters for each family. Parameters with the same slot (and expert) are
// consecutive and adjacent in the layout, and bind as one fused view (LLaMA's q|k|v and
// gate|up, a Mixtral expert's w1|w3).
struct BlockParamSpec {
  std::string suffix;  // the name after block_prefix(l), e.g. "attn.c_attn.weight"
  Shape shape;         // whole (unsplit) shape, [out, in] for linear weights
  BlockSlot slot;
  Init init;
  bool residual_proj;  // normal init scaled by 1/sqrt(2 L) (GPT-2's residual projections)
  bool decay;          // weight decay (2-D weights)
  bool hf_transposed;  // GPT-2 Conv1D: Hugging Face stores it [in, out]
  int split;           // tensor parallel: 0 rows (column-parallel), 1 columns, -1 replicated
  int parts;           // row blocks split separately (GPT-2's fused q|k|v: 3)
  bool kv;             // a LLaMA k/v projection: replicated unless tp divides n_kv_head
  int expert = -1;     // routed expert index (slots e_*)
};
// Block `layer`'s parameters. MoE blocks (cfg.is_moe_layer) hold, instead of the dense MLP, the
// router, the shared experts (as one MLP of width num_shared * expert_d_ff) and each expert's
// MLP, under Mixtral's names for LLaMA (block_sparse_moe.gate, .experts.E.w1/w3/w2; the shared
// experts as block_sparse_moe.shared_experts.gate_proj/up_proj/down_proj) and mlp.router,
// mlp.experts.E.c_fc/c_proj, mlp.shared_experts.* for GPT-2. MoE parameters are not split by
// tensor parallelism: every tp rank holds and runs them whole.
std::vector<BlockParamSpec> block_param_specs(const ModelConfig& cfg, int layer);

// One LoRA adapter of a block (cfg.lora): A [rank, in] and B [out, rank] beside the projection
// named `proj` (e.g. "self_attn.q_proj"), stored as proj + ".lora_A.weight" / ".lora_B.weight"
// (PEFT's names without its "base_model.model." prefix). Under tensor parallelism the adapter is
// split like its projection: a column-parallel one (q, k, v, gate, up) splits B's rows, a
// row-parallel one (o, down) A's columns; the other matrix is replicated and its gradient summed
// over the tp group.
struct LoraSpec {
  LoraTarget target;
  std::string proj;
  int64_t in = 0, out = 0;
  bool column_parallel = true;
  bool kv = false;  // k or v: replicated with its projection when tp does not divide n_kv_head
};
std::vector<LoraSpec> lora_specs(const ModelConfig& cfg);
// PEFT's target_modules of cfg.lora, in lora_specs' order ("q_proj", "v_proj").
std::vector<std::string> lora_modules(const ModelConfig& cfg);

class ParamLayout {
 public:
  // unit_align: every unit's padded size is a multiple of it (the data-parallel degree).
  // Units are always embed, the slice's blocks, head (embed and head empty when the slice
  // lacks them).
  explicit ParamLayout(const ModelConfig& cfg, int64_t unit_align = 1, const ModelSlice& slice = {});

  const ModelConfig& config() const { return cfg_; }
  const std::vector<ParamInfo>& params() const { return params_; }
  int64_t total() const { return total_; }          // including unit padding
  int64_t num_params() const { return n_params_; }  // without padding
  const std::vector<ParamUnit>& units() const { return units_; }
  const ParamUnit& block_unit(int layer) const { return units_.at(block_unit_index(layer)); }
  size_t block_unit_index(int layer) const;  // throws when the slice lacks the block
  // The unit of MoE block `layer`'s routed experts; -1 for dense blocks.
  int expert_unit_index(int layer) const;
  const ModelSlice& slice() const { return slice_; }
  // The first chunk's blocks [first_layer, last_layer); all of the slice's unless it is
  // interleaved (chunks()).
  int first_layer() const { return slice_.first_layer; }
  int last_layer() const { return slice_.last_layer; }
  const std::vector<LayerRange>& chunks() const { return chunks_; }
  // The slice's blocks in model order, over every chunk, and a block's place among them.
  const std::vector<int>& layers() const { return layers_; }
  int num_layers() const { return int(layers_.size()); }
  bool has_block(int layer) const {
    return layer >= 0 && size_t(layer) < local_of_.size() && local_of_[size_t(layer)] >= 0;
  }
  int local_index(int layer) const;  // throws when the slice lacks the block
  // True when this layout is the whole model on one rank (no stage, no tp slicing).
  bool whole_model() const;
  // Where this rank's elements of p sit in the whole parameter (padding rows are in no run).
  std::vector<ElementRun> element_runs(const ParamInfo& p) const;
  const ParamInfo& get(const std::string& name) const;  // throws naming the parameter
  bool contains(const std::string& name) const { return index_.count(name) != 0; }
  // [begin, end) element range of block l's parameters.
  std::pair<int64_t, int64_t> block_range(int layer) const;
  // Parameter name prefix of block l, e.g. "transformer.h.3." or "model.layers.3.".
  std::string block_prefix(int layer) const;

 private:
  // full: the whole parameter's shape; split: see ParamInfo::split_dim.
  ParamInfo& add(const std::string& name, Shape full, int layer, Init init, float std, bool decay,
                 bool transposed = false, int split = -1, int parts = 1);
  void close_unit(const std::string& name, int layer, bool experts = false);
  void add_lora_adapters();  // ModelSlice::lora_adapters: the adapters' units
  ModelConfig cfg_;
  ModelSlice slice_;
  std::vector<ParamInfo> params_;
  std::map<std::string, size_t> index_;
  int64_t total_ = 0, n_params_ = 0, unit_align_ = 1, unit_begin_ = 0;
  std::vector<ParamUnit> units_;
  std::vector<int> block_unit_, expert_unit_;  // per local block: unit indices (-1: none)
  std::vector<LayerRange> chunks_;
  std::vector<int> layers_, local_of_;  // local_of_[layer]: index into layers_, -1 when absent
};

// Fills params per its layout: each value depends only on (seed, parameter name, element index
// in the whole parameter), so any slice of the model initialises to the same values.
void init_params(const ParamLayout& layout, uint64_t seed, float* params);
// The same values for flat indices [begin, end) only, written to out[0 .. end - begin)
// (padding is zero): what a rank holding one shard initialises.
void init_params_range(const ParamLayout& layout, uint64_t seed, int64_t begin, int64_t end, float* out);

}  // namespace loom::model

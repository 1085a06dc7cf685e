// The flat parameter layout: every parameter is a named {offset, shape} range in one buffer
// (names follow Hugging Face's GPT2LMHeadModel / LlamaForCausalLM), ordered embeddings,
// blocks 0..L-1, final norm, head, so a block is one contiguous range (ZeRO-3 gathers and
// pipeline stages are then offset ranges). Linear weights are [out, in] (GPT-2's Conv1D
// weights are stored transposed relative to Hugging Face; the safetensors mapping transposes).
#pragma once
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "loom/core/tensor.h"
#include "loom/model/config.h"

namespace loom::model {

enum class Init { normal, zeros, ones };

struct ParamInfo {
  std::string name;
  Shape shape;
  int64_t offset = 0;     // elements into the flat buffer
  int layer = -1;         // block index, -1 outside blocks
  Init init = Init::normal;
  float init_std = 0.02f;
  bool weight_decay = false;  // 2-D weights decay; biases and norm gains do not
  bool hf_transposed = false; // stored [out, in] where Hugging Face stores [in, out]
  int64_t numel() const { return shape.numel(); }
};

// A sharding unit: the embeddings, one block, or the final norm + head. Units are
// contiguous and (with unit_align = N) padded so that N equal chunks tile each one; ZeRO
// shards, gathers and reduce-scatters unit by unit.
struct ParamUnit {
  std::string name;  // "embed", "block.3", "head"
  int layer = -1;    // block index, -1 for embed/head
  int64_t begin = 0, end = 0;  // padded element range in the flat buffer
  int64_t size() const { return end - begin; }
};

class ParamLayout {
 public:
  // unit_align: every unit's padded size is a multiple of it (the data-parallel degree).
  explicit ParamLayout(const ModelConfig& cfg, int64_t unit_align = 1);

  const std::vector<ParamInfo>& params() const { return params_; }
  int64_t total() const { return total_; }  // including unit padding
  int64_t num_params() const { return n_params_; }  // without padding
  const std::vector<ParamUnit>& units() const { return units_; }
  const ParamUnit& block_unit(int layer) const { return units_.at(size_t(layer) + 1); }
  const ParamInfo& get(const std::string& name) const;  // throws naming the parameter
  bool contains(const std::string& name) const { return index_.count(name) != 0; }
  // [begin, end) element range of block l's parameters.
  std::pair<int64_t, int64_t> block_range(int layer) const;
  // Parameter name prefix of block l, e.g. "transformer.h.3." or "model.layers.3.".
  std::string block_prefix(int layer) const;

 private:
  void add(const std::string& name, Shape shape, int layer, Init init, float std, bool decay,
           bool transposed = false);
  void close_unit(const std::string& name, int layer);
  ModelConfig cfg_;
  std::vector<ParamInfo> params_;
  std::map<std::string, size_t> index_;
  int64_t total_ = 0, n_params_ = 0, unit_align_ = 1, unit_begin_ = 0;
  std::vector<ParamUnit> units_;
};

// Fills params per its layout: each value depends only on (seed, parameter name, element index).
void init_params(const ParamLayout& layout, uint64_t seed, float* params);
// The same values for flat indices [begin, end) only, written to out[0 .. end - begin)
// (padding is zero): what a rank holding one shard initialises.
void init_params_range(const ParamLayout& layout, uint64_t seed, int64_t begin, int64_t end,
                       float* out);

}  // namespace loom::model

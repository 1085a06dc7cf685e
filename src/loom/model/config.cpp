#include "loom/model/config.h"

#include <cmath>

#include "loom/core/enum_names.h"
#include "loom/core/error.h"

namespace loom::model {

namespace {
constexpr EnumName<Family> kFamilyNames[] = {{Family::gpt2, "gpt2"}, {Family::llama, "llama"}};
// The first name of each is the one printed; f32 and f16 are accepted as well.
constexpr EnumName<Precision> kPrecisionNames[] = {{Precision::fp32, "fp32"},
                                                   {Precision::bf16, "bf16"},
                                                   {Precision::fp16, "fp16"},
                                                   {Precision::fp32, "f32"},
                                                   {Precision::fp16, "f16"}};
constexpr EnumName<RouterScore> kRouterScoreNames[] = {{RouterScore::softmax, "softmax"},
                                                       {RouterScore::sigmoid, "sigmoid"}};
}  // namespace

const char* family_name(Family f) { return enum_name(kFamilyNames, f); }

Family family_from_name(const std::string& s) {
  if (const auto f = enum_from_name(kFamilyNames, s)) return *f;
  fail("config", "model.family: expected \"gpt2\" or \"llama\", got \"", s, "\"");
}

const char* precision_name(Precision p) { return enum_name(kPrecisionNames, p); }

Precision precision_from_name(const std::string& s) {
  if (const auto p = enum_from_name(kPrecisionNames, s)) return *p;
  fail("config", "model.precision: expected fp32, bf16 or fp16, got \"", s, "\"");
}

const char* router_score_name(RouterScore s) { return enum_name(kRouterScoreNames, s); }

RouterScore router_score_from_name(const std::string& s) {
  if (const auto r = enum_from_name(kRouterScoreNames, s)) return *r;
  fail("config", "model.moe.score: expected \"softmax\" or \"sigmoid\", got \"", s, "\"");
}

FamilyTraits ModelConfig::traits() const {
  FamilyTraits t;
  if (family == Family::gpt2) {
    t.norm = NormKind::layer_norm;
    t.mlp = MlpKind::gelu;
    t.position = PositionKind::learned;
    t.linear_biases = true;
  }
  return t;
}

std::string RopeScaling::describe() const {
  switch (type) {
    case Type::none: return "none";
    case Type::linear: return str_cat("linear (factor ", factor, ")");
    case Type::llama3:
      return str_cat("llama3 (factor ", factor, ", low ", low_freq_factor, ", high ", high_freq_factor, ", original ",
                     original_max_position, ")");
    case Type::factors: return str_cat("per-frequency factors (", freq_factors.size(), ")");
  }
  return "?";
}

std::vector<double> ModelConfig::rope_inv_freq() const {
  const int64_t D = head_dim(), half = D / 2;
  std::vector<double> f(size_t(std::max<int64_t>(half, 0)));
  const double pi = 3.14159265358979323846;
  for (int64_t i = 0; i < half; ++i) {
    double x = std::pow(rope_theta, -double(2 * i) / double(D));
    switch (rope_scaling.type) {
      case RopeScaling::Type::none: break;
      case RopeScaling::Type::linear: x /= rope_scaling.factor; break;
      case RopeScaling::Type::factors: x /= rope_scaling.freq_factors[size_t(i)]; break;
      case RopeScaling::Type::llama3: {
        // Meta's reference (llama-models, apply_scaling): compare each wavelength with the
        // original context divided by the low and high frequency factors.
        const RopeScaling& r = rope_scaling;
        const double old = double(r.original_max_position), wavelen = 2 * pi / x;
        const double low_wavelen = old / r.low_freq_factor, high_wavelen = old / r.high_freq_factor;
        if (wavelen > low_wavelen) {
          x /= r.factor;
        } else if (wavelen >= high_wavelen) {
          const double smooth = (old / wavelen - r.low_freq_factor) / (r.high_freq_factor - r.low_freq_factor);
          x = (1 - smooth) * x / r.factor + smooth * x;
        }
        break;
      }
    }
    f[size_t(i)] = x;
  }
  return f;
}

void ModelConfig::validate() const {
  auto positive = [](const char* field, int64_t v) {
    LOOM_CHECK(v > 0, "config", "model.", field, " must be positive, got ", v);
  };
  positive("vocab_size", vocab_size);
  positive("n_ctx", n_ctx);
  positive("n_layer", n_layer);
  positive("n_head", n_head);
  positive("n_kv_head", n_kv_head);
  positive("d_model", d_model);
  positive("d_ff", d_ff);
  LOOM_CHECK(d_model % n_head == 0, "config", "model.n_head=", n_head, " does not divide model.d_model=", d_model,
             "; pick n_head among the divisors of ", d_model);
  LOOM_CHECK(n_head % n_kv_head == 0, "config", "model.n_kv_head=", n_kv_head,
             " does not divide model.n_head=", n_head);
  LOOM_CHECK(head_dim() % 2 == 0 || family == Family::gpt2, "config", "model.d_model / model.n_head = ", head_dim(),
             " must be even for RoPE");
  LOOM_CHECK(family == Family::llama || n_kv_head == n_head, "config", "model.n_kv_head=", n_kv_head,
             " differs from model.n_head=", n_head, ": grouped-query attention needs model.family=llama");
  LOOM_CHECK(norm_eps > 0, "config", "model.norm_eps must be positive, got ", norm_eps);
  LOOM_CHECK(!qkv_bias || family == Family::llama, "config",
             "q/k/v biases (Qwen2's) are a LLaMA-family option; GPT-2 has biases everywhere already");
  if (rope_scaling.enabled()) {
    const RopeScaling& r = rope_scaling;
    LOOM_CHECK(family == Family::llama, "config", "rope_scaling applies to RoPE models (model.family=llama)");
    LOOM_CHECK(r.type == RopeScaling::Type::factors || r.factor >= 1, "config",
               "rope_scaling factor must be >= 1, got ", r.factor);
    LOOM_CHECK(r.type != RopeScaling::Type::llama3 ||
                   (r.high_freq_factor > r.low_freq_factor && r.low_freq_factor > 0 && r.original_max_position > 0),
               "config",
               "llama3 rope_scaling needs high_freq_factor > low_freq_factor > 0 and a positive "
               "original_max_position_embeddings, got ",
               r.describe());
    LOOM_CHECK(r.type != RopeScaling::Type::factors || int64_t(r.freq_factors.size()) == head_dim() / 2, "config",
               "rope frequency factors: ", r.freq_factors.size(), " given, the head needs ", head_dim() / 2);
    for (double x : r.freq_factors) LOOM_CHECK(x > 0, "config", "rope frequency factors must be positive, got ", x);
  }
  LOOM_CHECK(vocab_size < (int64_t(1) << 31), "config", "model.vocab_size=", vocab_size,
             " does not fit 32-bit token ids");
  validate_lora();
  if (!moe.enabled()) {
    LOOM_CHECK(moe.num_experts == 0, "config", "model.moe.num_experts must be 0 (dense) or positive, got ",
               moe.num_experts);
    return;
  }
  LOOM_CHECK(moe.top_k >= 1 && moe.top_k <= moe.num_experts, "config", "model.moe.top_k=", moe.top_k,
             " must be between 1 and model.moe.num_experts=", moe.num_experts);
  LOOM_CHECK(moe.num_shared_experts >= 0, "config", "model.moe.num_shared_experts must be >= 0, got ",
             moe.num_shared_experts);
  LOOM_CHECK(moe.expert_d_ff >= 0, "config", "model.moe.expert_d_ff must be >= 0 (0: model.d_ff), got ",
             moe.expert_d_ff);
  LOOM_CHECK(moe.first_dense >= 0 && moe.first_dense < n_layer, "config", "model.moe.first_dense=", moe.first_dense,
             " must be between 0 and model.n_layer-1=", n_layer - 1, " (the first first_dense blocks are dense)");
  LOOM_CHECK(moe.moe_every >= 1 && moe.moe_every <= n_layer - moe.first_dense, "config",
             "model.moe.moe_every=", moe.moe_every,
             " must be between 1 and model.n_layer - model.moe.first_dense=", n_layer - moe.first_dense,
             " (blocks first_dense + moe_every-1, first_dense + 2*moe_every-1, ... are MoE)");
  LOOM_CHECK(moe.capacity_factor == 0 || moe.capacity_factor >= 1.0 / double(moe.num_experts), "config",
             "model.moe.capacity_factor=", moe.capacity_factor,
             " leaves experts room for almost no token; use 0 (dropless) or a value near 1.25");
  LOOM_CHECK(moe.router_aux_loss_coef >= 0 && moe.router_z_loss_coef >= 0 && moe.bias_update_rate >= 0, "config",
             "model.moe.router_aux_loss_coef, router_z_loss_coef and bias_update_rate must be >= 0");
}

const char* lora_target_name(LoraTarget t) {
  static const char* const names[kLoraTargets] = {"q", "k", "v", "o", "gate", "up", "down"};
  return names[int(t)];
}

std::string lora_module_name(LoraTarget t) { return str_cat(lora_target_name(t), "_proj"); }

bool LoraConfig::adapts(LoraTarget t) const { return std::find(targets.begin(), targets.end(), t) != targets.end(); }

std::string LoraConfig::describe() const {
  std::string on;
  for (LoraTarget t : targets) on += str_cat(on.empty() ? "" : ", ", lora_target_name(t));
  return str_cat("rank ", rank, ", alpha ", alpha, " on ", on, dropout > 0 ? str_cat(", dropout ", dropout) : "",
                 base_dtype == DType::bf16 ? ", bf16 base" : "");
}

void ModelConfig::validate_lora() const {
  if (lora.rank == 0) return;
  LOOM_CHECK(lora.rank > 0, "config", "model.lora.rank must be positive (0: no adapters), got ", lora.rank);
  LOOM_CHECK(lora.rank <= std::min(d_model, head_dim() * n_kv_head), "config", "model.lora.rank=", lora.rank,
             " is not low: it must be at most ", std::min(d_model, head_dim() * n_kv_head),
             " (the narrowest adapted projection); 8 or 16 is usual");
  LOOM_CHECK(lora.alpha > 0, "config", "model.lora.alpha must be positive, got ", lora.alpha);
  LOOM_CHECK(lora.base_dtype == DType::f32 || lora.base_dtype == DType::bf16, "config",
             "model.lora.base_dtype must be fp32 or bf16, got ", dtype_name(lora.base_dtype));
  LOOM_CHECK(lora.dropout >= 0 && lora.dropout < 1, "config", "model.lora.dropout=", lora.dropout,
             " must be in [0, 1)");
  LOOM_CHECK(!lora.targets.empty(), "config",
             "model.lora.targets is empty: name at least one of q, k, v, o, gate, "
             "up, down");
  for (size_t i = 0; i < lora.targets.size(); ++i)
    for (size_t j = 0; j < i; ++j)
      LOOM_CHECK(lora.targets[i] != lora.targets[j], "config", "model.lora.targets names ",
                 lora_target_name(lora.targets[i]), " twice");
  LOOM_CHECK(family == Family::llama, "config", "model.lora needs a LLaMA-family model: ", name,
             " is GPT-2, whose fused c_attn and c_fc have no separate q, k, v, gate and up projections");
  LOOM_CHECK(!moe.enabled(), "config", "model.lora on a Mixture-of-Experts model (", name,
             ") is not built yet: its experts' backward and balancing bias assume trained experts; fine-tune it "
             "fully");
}

std::string ModelConfig::summary() const {
  return str_cat(name, " (", family_name(family), ": ", n_layer, " layers, d_model ", d_model, ", ", n_head, " heads",
                 n_kv_head != n_head ? str_cat("/", n_kv_head, " kv") : "", ", d_ff ", d_ff, ", vocab ", vocab_size,
                 ", context ", n_ctx, qkv_bias ? ", q/k/v biases" : "",
                 rope_scaling.enabled() ? ", rope scaling " + rope_scaling.describe() : "",
                 moe.enabled() ? str_cat(", MoE ", moe.num_experts, " experts top-", moe.top_k, " d_ff ", expert_d_ff(),
                                         moe.num_shared_experts ? str_cat(" +", moe.num_shared_experts, " shared") : "",
                                         moe.moe_every > 1 ? str_cat(" every ", moe.moe_every, " blocks") : "",
                                         moe.first_dense > 0 ? str_cat(" after ", moe.first_dense, " dense") : "")
                               : "",
                 precision == Precision::fp32 ? "" : str_cat(", ", precision_name(precision), " products"), ")");
}

static ModelConfig gpt2(const char* name, int64_t L, int64_t C, int64_t H, int64_t V, int64_t ctx) {
  ModelConfig c;
  c.name = name;
  c.family = Family::gpt2;
  c.n_layer = L;
  c.d_model = C;
  c.n_head = c.n_kv_head = H;
  c.d_ff = 4 * C;
  c.vocab_size = V;
  c.n_ctx = ctx;
  c.tied_embeddings = true;
  return c;
}

static ModelConfig llama(const char* name, int64_t L, int64_t C, int64_t H, int64_t KVH, int64_t F, int64_t V,
                         int64_t ctx) {
  ModelConfig c;
  c.name = name;
  c.family = Family::llama;
  c.n_layer = L;
  c.d_model = C;
  c.n_head = H;
  c.n_kv_head = KVH;
  c.d_ff = F;
  c.vocab_size = V;
  c.n_ctx = ctx;
  c.tied_embeddings = false;
  c.norm_eps = 1e-5;
  return c;
}

// E experts, top-k, each of width d_ff / k: the dense model's active MLP parameters.
static ModelConfig with_experts(ModelConfig c, int64_t E, int64_t k) {
  c.moe.num_experts = E;
  c.moe.top_k = k;
  c.moe.expert_d_ff = c.d_ff / k;
  return c;
}

ModelConfig preset(const std::string& name) {
  if (name == "gpt2-124m") return gpt2("gpt2-124m", 12, 768, 12, 50257, 1024);
  if (name == "gpt2-350m") return gpt2("gpt2-350m", 24, 1024, 16, 50257, 1024);
  if (name == "gpt2-tiny") return gpt2("gpt2-tiny", 2, 32, 4, 97, 64);
  if (name == "gpt2-shakespeare") return gpt2("gpt2-shakespeare", 4, 192, 6, 256, 128);
  if (name == "llama-tiny") return llama("llama-tiny", 2, 32, 4, 2, 48, 97, 64);
  if (name == "llama-60m") return llama("llama-60m", 8, 512, 8, 4, 1408, 32000, 1024);
  // Mixtral-style: every block MoE, top-2, each expert half the dense width, so a token runs
  // as many MLP parameters as in the dense preset (llama-60m: 2 x 704 = 1408 columns).
  if (name == "llama-moe-60m") return with_experts(llama("llama-moe-60m", 8, 512, 8, 4, 1408, 32000, 1024), 8, 2);
  if (name == "llama-moe-tiny") return with_experts(llama("llama-moe-tiny", 2, 32, 4, 2, 48, 97, 64), 4, 2);
  fail("config", "model.preset: unknown preset \"", name, "\"; known presets: gpt2-124m, ",
       "gpt2-350m, gpt2-tiny, gpt2-shakespeare, llama-tiny, llama-60m, llama-moe-tiny, llama-moe-60m");
}

std::vector<std::string> preset_names() {
  return {"gpt2-124m",  "gpt2-350m", "gpt2-tiny",      "gpt2-shakespeare",
          "llama-tiny", "llama-60m", "llama-moe-tiny", "llama-moe-60m"};
}

}  // namespace loom::model

// A Decoder written as a GGUF file laid out the way llama.cpp's converter lays one out: llama.*,
// qwen2.* or gpt2.* metadata, llama.cpp's tensor names, ggml dims (ne = the torch shape reversed),
// llama's q and k rows permuted into llama.cpp's interleaved-pair RoPE order (qwen2 keeps Hugging
// Face's order, since llama.cpp rotates halves there), matrices in a chosen type and 1-D tensors in F32. Written
// independently of model/gguf_model.cpp, which reads it back; used by tests/model and by the write_test_gguf helper of
// the convert CLI test.
#pragma once
#include <cstdint>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "loom/core/error.h"
#include "loom/io/gguf.h"
#include "loom/io/gguf_quants.h"
#include "loom/model/decoder.h"

namespace loom::testing {

struct GgufFixture {
  io::GgmlType matrix_type = io::GgmlType::f32;  // 2-D tensors; 1-D ones stay F32
  bool tokenizer = false;  // a byte-level vocabulary (256 bytes, then <|endoftext|>): vocab_size must be 257
  std::string chat_template;
  // general.architecture: "" for the family's own ("llama" or "gpt2"); "qwen2" for a llama-family
  // model (with or without q/k/v biases) written as llama.cpp writes Qwen2.
  std::string arch;
  // Called for every tensor before it is added: may rename it, change its dims (its bytes stay)
  // or return false to leave it out.
  std::function<bool(std::string& name, std::vector<int64_t>& ne)> edit;
};

// llama.cpp's name of a parameter (Hugging Face name), "" for none.
inline std::string gguf_name_of(const model::ModelConfig& cfg, const std::string& hf) {
  const bool gpt2 = cfg.family == model::Family::gpt2;
  static const std::pair<const char*, const char*> kTop[] = {
      {"model.embed_tokens.weight", "token_embd.weight"},
      {"model.norm.weight", "output_norm.weight"},
      {"lm_head.weight", "output.weight"},
      {"transformer.wte.weight", "token_embd.weight"},
      {"transformer.wpe.weight", "position_embd.weight"},
      {"transformer.ln_f.weight", "output_norm.weight"},
      {"transformer.ln_f.bias", "output_norm.bias"},
  };
  for (const auto& [from, to] : kTop)
    if (hf == from) return to;
  const std::string prefix = gpt2 ? "transformer.h." : "model.layers.";
  if (hf.rfind(prefix, 0) != 0) return "";
  const size_t dot = hf.find('.', prefix.size());
  const std::string layer = hf.substr(prefix.size(), dot - prefix.size()), rest = hf.substr(dot + 1);
  static const std::pair<const char*, const char*> kLlama[] = {
      {"input_layernorm.weight", "attn_norm.weight"},    {"self_attn.q_proj.weight", "attn_q.weight"},
      {"self_attn.k_proj.weight", "attn_k.weight"},      {"self_attn.v_proj.weight", "attn_v.weight"},
      {"self_attn.o_proj.weight", "attn_output.weight"}, {"post_attention_layernorm.weight", "ffn_norm.weight"},
      {"mlp.gate_proj.weight", "ffn_gate.weight"},       {"mlp.up_proj.weight", "ffn_up.weight"},
      {"mlp.down_proj.weight", "ffn_down.weight"},       {"self_attn.q_proj.bias", "attn_q.bias"},
      {"self_attn.k_proj.bias", "attn_k.bias"},          {"self_attn.v_proj.bias", "attn_v.bias"},
  };
  static const std::pair<const char*, const char*> kGpt2[] = {
      {"ln_1.weight", "attn_norm.weight"},          {"ln_1.bias", "attn_norm.bias"},
      {"attn.c_attn.weight", "attn_qkv.weight"},    {"attn.c_attn.bias", "attn_qkv.bias"},
      {"attn.c_proj.weight", "attn_output.weight"}, {"attn.c_proj.bias", "attn_output.bias"},
      {"ln_2.weight", "ffn_norm.weight"},           {"ln_2.bias", "ffn_norm.bias"},
      {"mlp.c_fc.weight", "ffn_up.weight"},         {"mlp.c_fc.bias", "ffn_up.bias"},
      {"mlp.c_proj.weight", "ffn_down.weight"},     {"mlp.c_proj.bias", "ffn_down.bias"},
  };
  if (gpt2) {
    for (const auto& [from, to] : kGpt2)
      if (rest == from) return str_cat("blk.", layer, ".", to);
  } else {
    for (const auto& [from, to] : kLlama)
      if (rest == from) return str_cat("blk.", layer, ".", to);
  }
  return "";
}

// What llama.cpp's converter does to q and k (per head of D rows): Hugging Face's row
// h*D + s*D/2 + i becomes row h*D + 2i + s, so that rotating adjacent pairs computes HF's
// rotate-half RoPE.
inline void permute_rope_rows_forward(const float* src, float* dst, int64_t heads, int64_t D, int64_t cols) {
  for (int64_t h = 0; h < heads; ++h)
    for (int64_t s = 0; s < 2; ++s)
      for (int64_t i = 0; i < D / 2; ++i)
        std::memcpy(dst + (h * D + 2 * i + s) * cols, src + (h * D + s * (D / 2) + i) * cols,
                    size_t(cols) * sizeof(float));
}

// GPT-2's byte-level alphabet: the text of the token for each byte (printable Latin-1 bytes
// stand for themselves, the others for U+0100 onwards, in byte order), UTF-8 encoded.
inline std::vector<std::string> byte_level_alphabet() {
  auto utf8 = [](uint32_t cp) {
    std::string s;
    if (cp < 0x80) {
      s += char(cp);
    } else {
      s += char(0xC0 | (cp >> 6));
      s += char(0x80 | (cp & 0x3F));
    }
    return s;
  };
  std::vector<std::string> out(256);
  uint32_t next = 256;
  for (uint32_t b = 0; b < 256; ++b) {
    const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
    out[b] = utf8(printable ? b : next++);
  }
  return out;
}

// The writer holding `m` (the whole model, f32) as llama.cpp writes it; callers may set more
// metadata or add tensors before writing.
inline io::GgufWriter gguf_writer_of(const model::Decoder& m, const GgufFixture& f = {}) {
  const model::ModelConfig& cfg = m.config();
  const bool gpt2 = cfg.family == model::Family::gpt2;
  const std::string arch = !f.arch.empty() ? f.arch : gpt2 ? "gpt2" : "llama";
  LOOM_CHECK(gpt2 ? arch == "gpt2" : arch == "llama" || arch == "qwen2", "test", "a ", model::family_name(cfg.family),
             " model cannot be written as architecture '", arch, "'");
  auto key = [&](const char* k) { return arch + "." + k; };
  io::GgufWriter w;
  w.set("general.architecture", io::gguf_string(arch));
  w.set("general.name", io::gguf_string(cfg.name));
  w.set(key("block_count"), io::gguf_uint(uint64_t(cfg.n_layer)));
  w.set(key("context_length"), io::gguf_uint(uint64_t(cfg.n_ctx)));
  w.set(key("embedding_length"), io::gguf_uint(uint64_t(cfg.d_model)));
  w.set(key("feed_forward_length"), io::gguf_uint(uint64_t(cfg.d_ff)));
  w.set(key("attention.head_count"), io::gguf_uint(uint64_t(cfg.n_head)));
  if (gpt2) {
    w.set(key("attention.layer_norm_epsilon"), io::gguf_float(cfg.norm_eps));
  } else {
    w.set(key("attention.head_count_kv"), io::gguf_uint(uint64_t(cfg.n_kv_head)));
    w.set(key("rope.freq_base"), io::gguf_float(cfg.rope_theta));
    w.set(key("attention.layer_norm_rms_epsilon"), io::gguf_float(cfg.norm_eps));
    w.set(key("rope.dimension_count"), io::gguf_uint(uint64_t(cfg.head_dim())));
    w.set(key("vocab_size"), io::gguf_uint(uint64_t(cfg.vocab_size)));
  }
  if (f.tokenizer) {
    LOOM_CHECK(cfg.vocab_size == 257, "test", "a byte-level vocabulary needs vocab_size 257, not ", cfg.vocab_size);
    std::vector<std::string> tokens = byte_level_alphabet();
    tokens.push_back("<|endoftext|>");
    std::vector<io::GgufValue> types(256, io::gguf_int(1));
    types.push_back(io::gguf_int(3));  // control
    w.set("tokenizer.ggml.model", io::gguf_string("gpt2"));
    w.set("tokenizer.ggml.pre", io::gguf_string("default"));
    w.set("tokenizer.ggml.tokens", io::gguf_strings(tokens));
    w.set("tokenizer.ggml.token_type", io::gguf_array(io::GgufType::i32, types));
    w.set("tokenizer.ggml.merges", io::gguf_strings({}));
    w.set("tokenizer.ggml.bos_token_id", io::gguf_uint(256));
    w.set("tokenizer.ggml.eos_token_id", io::gguf_uint(256));
  }
  if (!f.chat_template.empty()) w.set("tokenizer.chat_template", io::gguf_string(f.chat_template));
  std::vector<float> buf;
  for (const model::ParamInfo& p : m.layout().params()) {
    std::string name = gguf_name_of(cfg, p.name);
    LOOM_CHECK(!name.empty(), "test", "no GGUF name for ", p.name);
    const std::vector<int64_t> shape = p.shape.to_vector();
    std::vector<int64_t> ne(shape.rbegin(), shape.rend());
    const Tensor t = m.param(p.name);
    const float* data = t.data<float>();
    const bool permuted = arch == "llama" && (name.ends_with("attn_q.weight") || name.ends_with("attn_k.weight"));
    if (permuted) {
      buf.resize(size_t(t.numel()));
      const int64_t heads = name.ends_with("attn_q.weight") ? cfg.n_head : cfg.n_kv_head;
      permute_rope_rows_forward(data, buf.data(), heads, cfg.head_dim(), cfg.d_model);
      data = buf.data();
    }
    const io::GgmlType type = shape.size() == 2 ? f.matrix_type : io::GgmlType::f32;
    std::string bytes = io::quantize(type, data, t.numel());
    if (f.edit && !f.edit(name, ne)) continue;
    w.add_tensor(name, type, ne, std::move(bytes));
  }
  return w;
}

}  // namespace loom::testing

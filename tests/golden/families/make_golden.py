#!/usr/bin/env python3
"""Tiny random checkpoints of the LLaMA-family variants loom runs, in Hugging Face's layout, with
logits from an independent float64 numpy model written from the published equations:

  qwen2/          Qwen2: q/k/v biases, grouped-query attention, tied head, rope_theta 1e6
  llama3_scaled/  Llama 3.1's rope_scaling (rope_type llama3, factor 8, low 1, high 4, original
                  context 64: with head_dim 8 the four frequencies fall one in each regime: kept,
                  blended, divided), untied head
  llama_linear/   rope_scaling linear, factor 2

Each directory holds config.json, model.safetensors (F32, random normal 0.02, q and k 0.5; norm gains
1 + N(0, 0.1); biases N(0, 0.1)) and golden.safetensors (tokens I32 [24], logits F32 [24, 97]).
RoPE here rotates halves (Hugging Face's convention); the llama3 rule follows Meta's reference
(llama-models, apply_scaling). Needs only numpy.   make_golden.py [OUT_DIR]
"""
import json
import math
import struct
import sys
from pathlib import Path

import numpy as np

V, C, H, KV, F, L, T = 97, 32, 4, 2, 48, 2, 24
D = C // H


def save_safetensors(path, tensors):
    header, offset, blobs = {}, 0, []
    for name, arr in tensors.items():
        dtype = {np.float32: "F32", np.int32: "I32"}[arr.dtype.type]
        b = np.ascontiguousarray(arr).tobytes()
        header[name] = {"dtype": dtype, "shape": list(arr.shape), "data_offsets": [offset, offset + len(b)]}
        offset += len(b)
        blobs.append(b)
    header["__metadata__"] = {"format": "pt"}
    h = json.dumps(header).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    Path(path).write_bytes(struct.pack("<Q", len(h)) + h + b"".join(blobs))


def inv_freq(cfg):
    theta = cfg.get("rope_theta", 10000.0)
    f = theta ** (-np.arange(0, D, 2, dtype=np.float64) / D)
    s = cfg.get("rope_scaling")
    if not s:
        return f
    if s["rope_type"] == "linear":
        return f / s["factor"]
    old, lo, hi, factor = s["original_max_position_embeddings"], s["low_freq_factor"], s["high_freq_factor"], s["factor"]
    out = []
    for x in f:
        wavelen = 2 * math.pi / x
        if wavelen < old / hi:
            out.append(x)
        elif wavelen > old / lo:
            out.append(x / factor)
        else:
            smooth = (old / wavelen - lo) / (hi - lo)
            out.append((1 - smooth) * x / factor + smooth * x)
    return np.array(out)


def rope(x, freqs):  # x [T, heads, D], rotate-half
    ang = np.arange(x.shape[0])[:, None] * freqs[None, :]
    cos, sin = np.cos(ang)[:, None, :], np.sin(ang)[:, None, :]
    a, b = x[..., : D // 2], x[..., D // 2:]
    return np.concatenate([a * cos - b * sin, b * cos + a * sin], axis=-1)


def forward(cfg, w, ids):
    eps = cfg["rms_norm_eps"]
    norm = lambda x, g: x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * g
    freqs = inv_freq(cfg)
    x = w["model.embed_tokens.weight"][ids]
    mask = np.triu(np.full((T, T), -np.inf), 1)
    for l in range(L):
        p = f"model.layers.{l}."
        h = norm(x, w[p + "input_layernorm.weight"])
        proj = lambda n: h @ w[p + f"self_attn.{n}_proj.weight"].T + w.get(p + f"self_attn.{n}_proj.bias", 0)
        q, k, v = rope(proj("q").reshape(T, H, D), freqs), rope(proj("k").reshape(T, KV, D), freqs), proj("v").reshape(T, KV, D)
        att = np.empty((T, H, D))
        for hd in range(H):
            s = q[:, hd] @ k[:, hd // (H // KV)].T / math.sqrt(D) + mask
            s = np.exp(s - s.max(1, keepdims=True))
            att[:, hd] = (s / s.sum(1, keepdims=True)) @ v[:, hd // (H // KV)]
        x = x + att.reshape(T, C) @ w[p + "self_attn.o_proj.weight"].T
        h = norm(x, w[p + "post_attention_layernorm.weight"])
        g = h @ w[p + "mlp.gate_proj.weight"].T
        x = x + (g / (1 + np.exp(-g)) * (h @ w[p + "mlp.up_proj.weight"].T)) @ w[p + "mlp.down_proj.weight"].T
    x = norm(x, w["model.norm.weight"])
    return x @ w.get("lm_head.weight", w["model.embed_tokens.weight"]).T


def make(out, name, cfg, bias, tied, seed):
    rng = np.random.default_rng(seed)
    n = lambda *shape: (rng.standard_normal(shape) * 0.02).astype(np.float32)
    gain = lambda: (1 + rng.standard_normal(C) * 0.1).astype(np.float32)
    w = {"model.embed_tokens.weight": n(V, C), "model.norm.weight": gain()}
    for l in range(L):
        p = f"model.layers.{l}."
        w[p + "input_layernorm.weight"] = gain()
        w[p + "post_attention_layernorm.weight"] = gain()
        for proj, rows in (("q", H * D), ("k", KV * D), ("v", KV * D)):
            # q and k large enough that attention is far from uniform, so RoPE's frequencies matter.
            w[p + f"self_attn.{proj}_proj.weight"] = n(rows, C) * (25 if proj in "qk" else 1)
            if bias:
                w[p + f"self_attn.{proj}_proj.bias"] = (rng.standard_normal(rows) * 0.1).astype(np.float32)
        w[p + "self_attn.o_proj.weight"] = n(C, H * D)
        w[p + "mlp.gate_proj.weight"], w[p + "mlp.up_proj.weight"], w[p + "mlp.down_proj.weight"] = n(F, C), n(F, C), n(C, F)
    if not tied:
        w["lm_head.weight"] = n(V, C)
    base = {"vocab_size": V, "hidden_size": C, "intermediate_size": F, "num_hidden_layers": L,
            "num_attention_heads": H, "num_key_value_heads": KV, "max_position_embeddings": 128,
            "rms_norm_eps": 1e-6, "hidden_act": "silu", "tie_word_embeddings": tied}
    cfg = {**base, **cfg}
    ids = rng.integers(0, V, T).astype(np.int32)
    logits = forward(cfg, {k: v.astype(np.float64) for k, v in w.items()}, ids)
    d = out / name
    d.mkdir(parents=True, exist_ok=True)
    (d / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    save_safetensors(d / "model.safetensors", w)
    save_safetensors(d / "golden.safetensors", {"tokens": ids, "logits": logits.astype(np.float32)})


out = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).parent
make(out, "qwen2", {"model_type": "qwen2", "architectures": ["Qwen2ForCausalLM"], "rope_theta": 1e6,
                    "use_sliding_window": False}, bias=True, tied=True, seed=1)
make(out, "llama3_scaled", {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "rope_theta": 10000.0,
                            "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                             "high_freq_factor": 4.0, "original_max_position_embeddings": 64}},
     bias=False, tied=False, seed=2)
make(out, "llama_linear", {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "rope_theta": 10000.0,
                           "rope_scaling": {"rope_type": "linear", "factor": 2.0}}, bias=False, tied=True, seed=3)

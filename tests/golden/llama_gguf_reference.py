#!/usr/bin/env python3
"""An independent float64 reference of a LLaMA-architecture GGUF model, to check loom's logits.

  llama_gguf_reference.py --gguf MODEL.gguf --check IDS.txt LOGITS.f32 [--check ...] [--tol 1e-3]

Reads the weights with the `gguf` package (its GGUFReader and its dequantizers, which follow
llama.cpp's reference code), runs the model in float64 numpy straight from the published
equations (Touvron et al. 2023: RMSNorm, SwiGLU, grouped-query attention, RoPE), and compares
with the logits loom wrote for the same token ids (raw little-endian float32, [T, vocab]).

It is independent of loom's code path on purpose: it applies RoPE the way llama.cpp does, on
adjacent pairs (2i, 2i+1) of the q and k rows as the GGUF stores them, while loom permutes
those rows back to Hugging Face's order and rotates halves. The two agree only if loom's
permutation is right. Prints the max absolute difference and whether the argmax of every
position agrees; exit status 1 when the difference exceeds --tol.
Needs the PyPI packages gguf and numpy.
"""
import argparse
import sys

try:
    import numpy as np
    import gguf
    from gguf.quants import dequantize
except ImportError as e:
    sys.exit(f"[reference] missing Python package ({e.name}); install gguf and numpy into a venv")


def field(reader, key, default=None):
    f = reader.fields.get(key)
    if f is None:
        return default
    v = f.parts[f.data[0]]
    return v.tobytes().decode() if f.types[0] == gguf.GGUFValueType.STRING else v[0].item()


def load(path):
    r = gguf.GGUFReader(path)
    arch = field(r, "general.architecture")
    if arch != "llama":
        sys.exit(f"[reference] {path}: architecture {arch!r}; this reference runs 'llama'")
    cfg = dict(
        n_layer=field(r, "llama.block_count"),
        n_head=field(r, "llama.attention.head_count"),
        n_kv=field(r, "llama.attention.head_count_kv"),
        eps=field(r, "llama.attention.layer_norm_rms_epsilon"),
        theta=field(r, "llama.rope.freq_base", 10000.0),
    )
    w = {}
    for t in r.tensors:
        shape = tuple(int(d) for d in reversed(t.shape.tolist()))  # ggml order reversed: [rows, cols]
        w[t.name] = dequantize(t.data, t.tensor_type).astype(np.float64).reshape(shape)
    return cfg, w


def rms_norm(x, g, eps):
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * g


def rope_adjacent_pairs(x, theta):
    # x: [T, heads, D]; rotates (x[2i], x[2i+1]) by pos * theta^(-2i/D).
    T, _, D = x.shape
    inv = theta ** (-np.arange(0, D, 2, dtype=np.float64) / D)
    ang = np.arange(T, dtype=np.float64)[:, None] * inv[None, :]
    cos, sin = np.cos(ang)[:, None, :], np.sin(ang)[:, None, :]
    a, b = x[..., 0::2], x[..., 1::2]
    out = np.empty_like(x)
    out[..., 0::2] = a * cos - b * sin
    out[..., 1::2] = a * sin + b * cos
    return out


def forward(cfg, w, ids):
    H, KV = cfg["n_head"], cfg["n_kv"]
    x = w["token_embd.weight"][ids]
    T, C = x.shape
    D = C // H
    mask = np.triu(np.full((T, T), -np.inf), 1)
    for l in range(cfg["n_layer"]):
        p = f"blk.{l}."
        h = rms_norm(x, w[p + "attn_norm.weight"], cfg["eps"])
        q = rope_adjacent_pairs((h @ w[p + "attn_q.weight"].T).reshape(T, H, D), cfg["theta"])
        k = rope_adjacent_pairs((h @ w[p + "attn_k.weight"].T).reshape(T, KV, D), cfg["theta"])
        v = (h @ w[p + "attn_v.weight"].T).reshape(T, KV, D)
        att = np.empty((T, H, D))
        for hd in range(H):
            kv = hd // (H // KV)
            s = q[:, hd, :] @ k[:, kv, :].T / np.sqrt(D) + mask
            s = np.exp(s - s.max(axis=1, keepdims=True))
            att[:, hd, :] = (s / s.sum(axis=1, keepdims=True)) @ v[:, kv, :]
        x = x + att.reshape(T, C) @ w[p + "attn_output.weight"].T
        h = rms_norm(x, w[p + "ffn_norm.weight"], cfg["eps"])
        gate = h @ w[p + "ffn_gate.weight"].T
        x = x + ((gate / (1 + np.exp(-gate))) * (h @ w[p + "ffn_up.weight"].T)) @ w[p + "ffn_down.weight"].T
    x = rms_norm(x, w["output_norm.weight"], cfg["eps"])
    head = w.get("output.weight", w["token_embd.weight"])
    return x @ head.T


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--gguf", required=True)
    ap.add_argument("--check", nargs=2, action="append", required=True, metavar=("IDS", "LOGITS"),
                    help="token ids (whitespace-separated) and loom's logits for them (raw float32 [T, vocab])")
    ap.add_argument("--tol", type=float, default=1e-3)
    a = ap.parse_args()
    cfg, w = load(a.gguf)
    ok = all([check(cfg, w, ids, logits, a.tol) for ids, logits in a.check])
    sys.exit(0 if ok else 1)


def check(cfg, w, ids_file, logits_file, tol):
    ids = np.array([int(t) for t in open(ids_file).read().split()], dtype=np.int64)
    vocab = w["token_embd.weight"].shape[0]
    got = np.fromfile(logits_file, dtype="<f4").astype(np.float64)
    # loom scores a window's inputs, which may stop one token before the list; the model is
    # causal, so the reference runs on exactly those positions.
    rows = got.size // vocab
    if got.size % vocab or not 0 < rows <= len(ids):
        print(f"[reference] {logits_file}: {got.size} logits are not rows of {vocab} for at most {len(ids)} tokens")
        return False
    ids = ids[:rows]
    ref = forward(cfg, w, ids)
    got = got.reshape(ref.shape)
    diff = np.abs(got - ref)
    worst = np.unravel_index(np.argmax(diff), diff.shape)
    agree = int((got.argmax(axis=1) == ref.argmax(axis=1)).sum())
    print(f"[reference] {ids_file}: {len(ids)} tokens: max |loom - reference| = {diff.max():.3e} at position "
          f"{worst[0]}, id {worst[1]} (logits span {ref.min():.2f} .. {ref.max():.2f}); argmax agrees at {agree} of "
          f"{len(ids)} positions; tolerance {tol:g}")
    return diff.max() <= tol


if __name__ == "__main__":
    main()

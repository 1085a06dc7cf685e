#!/usr/bin/python3
"""Generates the PyTorch golden files that tests/model/golden_test.cpp compares loom against.

For a tiny GPT-2 and a tiny LLaMA it builds the model in plain torch (float64, written to match
loom's math and Hugging Face's conventions), draws random parameters and a random batch, and
records logits, the loss, every gradient and the parameters after 3 AdamW steps into
safetensors files under tests/golden/model/. CI never runs this; see tests/golden/README.md.

Run:  /usr/bin/python3 tests/golden/make_golden.py      (needs Debian's python3-torch only)
"""
import json
import math
import os
import struct
import sys

import torch
import torch.nn.functional as F

OUT_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "model")
B, T = 2, 16
ADAMW = dict(lr=1e-2, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)
STEPS = 3

# The tiny configurations; field names are loom's ModelConfig fields.
CONFIGS = {
    "gpt2": dict(family="gpt2", vocab_size=97, n_ctx=64, n_layer=2, n_head=4, n_kv_head=4,
                 d_model=32, d_ff=128, norm_eps=1e-5, rope_theta=10000.0, tied_embeddings=True),
    "llama": dict(family="llama", vocab_size=97, n_ctx=64, n_layer=2, n_head=4, n_kv_head=2,
                  d_model=32, d_ff=48, norm_eps=1e-5, rope_theta=10000.0, tied_embeddings=False),
    # Mixture of Experts: Mixtral-style softmax top-2 with a shared expert in every block, and
    # GPT-2 experts with sigmoid scores in every second block with capacity (tokens dropped).
    "llama_moe": dict(family="llama", vocab_size=97, n_ctx=64, n_layer=2, n_head=4, n_kv_head=2,
                      d_model=32, d_ff=48, norm_eps=1e-5, rope_theta=10000.0, tied_embeddings=False,
                      moe=dict(num_experts=4, top_k=2, num_shared_experts=1, expert_d_ff=16,
                               moe_every=1, capacity_factor=0.0, router_aux_loss_coef=0.01,
                               router_z_loss_coef=0.001, score="softmax")),
    "gpt2_moe": dict(family="gpt2", vocab_size=97, n_ctx=64, n_layer=2, n_head=4, n_kv_head=4,
                     d_model=32, d_ff=128, norm_eps=1e-5, rope_theta=10000.0, tied_embeddings=True,
                     moe=dict(num_experts=4, top_k=2, num_shared_experts=0, expert_d_ff=24,
                              moe_every=2, capacity_factor=1.0, router_aux_loss_coef=0.05,
                              router_z_loss_coef=0.01, score="sigmoid")),
}


def is_moe_layer(cfg, l):
    m = cfg.get("moe")
    return m is not None and (l + 1) % m["moe_every"] == 0


def mlp_specs(cfg, prefix, Fd, expert):
    """The family's MLP of width Fd; Mixtral's w1/w3/w2 names for LLaMA experts."""
    C = cfg["d_model"]
    if cfg["family"] == "gpt2":
        return [(prefix + "c_fc.weight", (Fd, C), "matrix"), (prefix + "c_fc.bias", (Fd,), "bias"),
                (prefix + "c_proj.weight", (C, Fd), "matrix"), (prefix + "c_proj.bias", (C,), "bias")]
    n = ("w1", "w3", "w2") if expert else ("gate_proj", "up_proj", "down_proj")
    return [(prefix + n[0] + ".weight", (Fd, C), "matrix"), (prefix + n[1] + ".weight", (Fd, C), "matrix"),
            (prefix + n[2] + ".weight", (C, Fd), "matrix")]


def moe_specs(cfg, p):
    """A MoE block's router, shared experts and experts in loom's order."""
    m, C = cfg["moe"], cfg["d_model"]
    base = p + ("mlp." if cfg["family"] == "gpt2" else "block_sparse_moe.")
    specs = [(base + ("router.weight" if cfg["family"] == "gpt2" else "gate.weight"),
              (m["num_experts"], C), "matrix")]
    if m["num_shared_experts"]:
        specs += mlp_specs(cfg, base + "shared_experts.", m["num_shared_experts"] * m["expert_d_ff"], False)
    for e in range(m["num_experts"]):
        specs += mlp_specs(cfg, f"{base}experts.{e}.", m["expert_d_ff"], True)
    return specs


# ---- a minimal safetensors writer (the format: u64 header length, JSON header, data) -------

_ST_DTYPES = {torch.float32: "F32", torch.float64: "F64", torch.int32: "I32"}


def write_safetensors(path, tensors, metadata):
    """tensors: list of (name, tensor); written in order, largest element size first."""
    items = sorted(tensors, key=lambda nt: (-nt[1].element_size(), nt[0]))
    header, offset, blobs = {"__metadata__": metadata}, 0, []
    for name, t in items:
        t = t.detach().contiguous().cpu()
        data = t.numpy().tobytes()  # host order: little-endian on every machine we run
        header[name] = {"dtype": _ST_DTYPES[t.dtype], "shape": list(t.shape),
                        "data_offsets": [offset, offset + len(data)]}
        offset += len(data)
        blobs.append(data)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for b in blobs:
            f.write(b)


# ---- parameters in loom's layout and order (Linear weights [out, in]) -----------------------

def param_specs(cfg):
    """(name, shape, kind) in loom's ParamLayout order. kind: matrix|bias|gain|shift."""
    C, V, Fd, L = cfg["d_model"], cfg["vocab_size"], cfg["d_ff"], cfg["n_layer"]
    H, KVH = cfg["n_head"], cfg["n_kv_head"]
    D = C // H
    specs = []
    if cfg["family"] == "gpt2":
        specs += [("transformer.wte.weight", (V, C), "matrix"),
                  ("transformer.wpe.weight", (cfg["n_ctx"], C), "matrix")]
        for l in range(L):
            p = f"transformer.h.{l}."
            specs += [(p + "ln_1.weight", (C,), "gain"), (p + "ln_1.bias", (C,), "shift"),
                      (p + "attn.c_attn.weight", (3 * C, C), "matrix"),
                      (p + "attn.c_attn.bias", (3 * C,), "bias"),
                      (p + "attn.c_proj.weight", (C, C), "matrix"),
                      (p + "attn.c_proj.bias", (C,), "bias"),
                      (p + "ln_2.weight", (C,), "gain"), (p + "ln_2.bias", (C,), "shift")]
            specs += moe_specs(cfg, p) if is_moe_layer(cfg, l) else mlp_specs(cfg, p + "mlp.", Fd, False)
        specs += [("transformer.ln_f.weight", (C,), "gain"), ("transformer.ln_f.bias", (C,), "shift")]
    else:
        specs += [("model.embed_tokens.weight", (V, C), "matrix")]
        for l in range(L):
            p = f"model.layers.{l}."
            specs += [(p + "input_layernorm.weight", (C,), "gain"),
                      (p + "self_attn.q_proj.weight", (H * D, C), "matrix"),
                      (p + "self_attn.k_proj.weight", (KVH * D, C), "matrix"),
                      (p + "self_attn.v_proj.weight", (KVH * D, C), "matrix"),
                      (p + "self_attn.o_proj.weight", (C, H * D), "matrix"),
                      (p + "post_attention_layernorm.weight", (C,), "gain")]
            specs += moe_specs(cfg, p) if is_moe_layer(cfg, l) else mlp_specs(cfg, p + "mlp.", Fd, False)
        specs += [("model.norm.weight", (C,), "gain")]
    if not cfg["tied_embeddings"]:
        specs += [("lm_head.weight", (V, C), "matrix")]
    return specs


def init_params(cfg, gen):
    """Random parameters, rounded to float32 (what loom loads) and held as float64."""
    params = {}
    for name, shape, kind in param_specs(cfg):
        z = torch.randn(shape, generator=gen, dtype=torch.float64)
        # Norm gains/shifts and biases are perturbed away from 1/0 so their gradients (and
        # the LayerNorm/RMSNorm weight paths) are generic.
        v = {"matrix": 0.02 * z, "bias": 0.02 * z, "gain": 1.0 + 0.1 * z, "shift": 0.1 * z}[kind]
        params[name] = v.float().double().requires_grad_(True)
    return params


# ---- the model (float64), mirroring src/loom/model/{block,decoder}.cpp ---------------------

def causal_attention(q, k, v):
    """q [B,H,T,D], k/v [B,H,T,D] (kv heads already repeated): softmax(q k^T / sqrt(D)) v."""
    Tq, D = q.shape[-2], q.shape[-1]
    scores = q @ k.transpose(-1, -2) / math.sqrt(D)
    mask = torch.ones(Tq, Tq, dtype=torch.bool).tril()
    scores = scores.masked_fill(~mask, float("-inf"))
    return torch.softmax(scores, dim=-1) @ v


def rms_norm(x, w, eps):
    # Zhang & Sennrich 2019; as Hugging Face's LlamaRMSNorm: x * rsqrt(mean(x^2) + eps) * w.
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def rope(x, theta):
    """Rotate-half RoPE (Su et al. 2021) as Hugging Face LLaMA: x [B,H,T,D], positions 0..T-1."""
    D, Tn = x.shape[-1], x.shape[-2]
    inv_freq = theta ** (-torch.arange(0, D, 2, dtype=torch.float64) / D)
    ang = (torch.arange(Tn, dtype=torch.float64)[:, None] * inv_freq[None, :]).to(x.dtype)
    cos, sin = torch.cat([ang.cos()] * 2, -1), torch.cat([ang.sin()] * 2, -1)
    x1, x2 = x[..., : D // 2], x[..., D // 2:]
    return x * cos + torch.cat([-x2, x1], -1) * sin


def mlp(cfg, P, prefix, h, expert):
    if cfg["family"] == "gpt2":
        f = F.gelu(F.linear(h, P[prefix + "c_fc.weight"], P[prefix + "c_fc.bias"]), approximate="tanh")
        return F.linear(f, P[prefix + "c_proj.weight"], P[prefix + "c_proj.bias"])
    n = ("w1", "w3", "w2") if expert else ("gate_proj", "up_proj", "down_proj")
    g = F.silu(F.linear(h, P[prefix + n[0] + ".weight"])) * F.linear(h, P[prefix + n[1] + ".weight"])
    return F.linear(g, P[prefix + n[2] + ".weight"])


def moe(cfg, P, p, h, router_losses):
    """A MoE block's MLP on h [B, T, C], written from the definitions: top-k of the scores,
    gates normalised over the chosen, capacity per expert ceil(cf * N * k / E) filled by first
    choices (in token order) before second choices, the balance loss E * sum_i f_i P_i (f_i:
    fraction of choices, no gradient; P_i: mean probability, for sigmoid scores normalised per
    token) and the z-loss mean(logsumexp(logits)^2)."""
    m = cfg["moe"]
    E, k = m["num_experts"], m["top_k"]
    gpt2 = cfg["family"] == "gpt2"
    base = p + ("mlp." if gpt2 else "block_sparse_moe.")
    shape = h.shape
    x = h.reshape(-1, shape[-1])
    N = x.shape[0]
    logits = F.linear(x, P[base + ("router.weight" if gpt2 else "gate.weight")])
    s = torch.softmax(logits, -1) if m["score"] == "softmax" else torch.sigmoid(logits)
    top_s, top_i = s.topk(k, dim=-1)
    gates = top_s / top_s.sum(-1, keepdim=True)
    cap = math.ceil(m["capacity_factor"] * N * k / E) if m["capacity_factor"] > 0 else N * k
    kept = torch.zeros(N, k, dtype=torch.bool)
    used = [0] * E
    for j in range(k):
        for t in range(N):
            e = int(top_i[t, j])
            if used[e] < cap:
                used[e] += 1
                kept[t, j] = True
    y = torch.zeros_like(x)
    if m["num_shared_experts"]:
        y = y + mlp(cfg, P, base + "shared_experts.", x, False)
    for e in range(E):
        for j in range(k):
            rows = ((top_i[:, j] == e) & kept[:, j]).nonzero().flatten()
            if len(rows):
                out = mlp(cfg, P, f"{base}experts.{e}.", x[rows], True)
                y = y.index_add(0, rows, gates[rows, j:j + 1] * out)
    f = torch.stack([(top_i == e).sum() for e in range(E)]).double() / (N * k)
    prob = s if m["score"] == "softmax" else s / s.sum(-1, keepdim=True)
    aux = E * (f * prob.mean(0)).sum()
    z = (torch.logsumexp(logits, -1) ** 2).mean()
    router_losses.append(m["router_aux_loss_coef"] * aux + m["router_z_loss_coef"] * z)
    return y.reshape(shape)


def forward_logits(cfg, P, tokens, router_losses=None):
    router_losses = [] if router_losses is None else router_losses
    C, H, KVH, eps = cfg["d_model"], cfg["n_head"], cfg["n_kv_head"], cfg["norm_eps"]
    D = C // H
    Bn, Tn = tokens.shape
    heads = lambda t, n: t.view(Bn, Tn, n, D).transpose(1, 2)  # [B,T,n*D] -> [B,n,T,D]
    merge = lambda t: t.transpose(1, 2).reshape(Bn, Tn, -1)
    if cfg["family"] == "gpt2":
        x = P["transformer.wte.weight"][tokens] + P["transformer.wpe.weight"][torch.arange(Tn)]
        for l in range(cfg["n_layer"]):
            p = f"transformer.h.{l}."
            h = F.layer_norm(x, (C,), P[p + "ln_1.weight"], P[p + "ln_1.bias"], eps)
            qkv = F.linear(h, P[p + "attn.c_attn.weight"], P[p + "attn.c_attn.bias"])
            q, k, v = qkv.split(C, dim=-1)
            a = merge(causal_attention(heads(q, H), heads(k, H), heads(v, H)))
            x = x + F.linear(a, P[p + "attn.c_proj.weight"], P[p + "attn.c_proj.bias"])
            h = F.layer_norm(x, (C,), P[p + "ln_2.weight"], P[p + "ln_2.bias"], eps)
            x = x + (moe(cfg, P, p, h, router_losses) if is_moe_layer(cfg, l) else mlp(cfg, P, p + "mlp.", h, False))
        x = F.layer_norm(x, (C,), P["transformer.ln_f.weight"], P["transformer.ln_f.bias"], eps)
        head = P["transformer.wte.weight"] if cfg["tied_embeddings"] else P["lm_head.weight"]
    else:
        rep = H // KVH
        x = P["model.embed_tokens.weight"][tokens]
        for l in range(cfg["n_layer"]):
            p = f"model.layers.{l}."
            h = rms_norm(x, P[p + "input_layernorm.weight"], eps)
            q = rope(heads(F.linear(h, P[p + "self_attn.q_proj.weight"]), H), cfg["rope_theta"])
            k = rope(heads(F.linear(h, P[p + "self_attn.k_proj.weight"]), KVH), cfg["rope_theta"])
            v = heads(F.linear(h, P[p + "self_attn.v_proj.weight"]), KVH)
            # GQA as Hugging Face's repeat_kv: query head i reads kv head i // rep.
            k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
            x = x + F.linear(merge(causal_attention(q, k, v)), P[p + "self_attn.o_proj.weight"])
            h = rms_norm(x, P[p + "post_attention_layernorm.weight"], eps)
            x = x + (moe(cfg, P, p, h, router_losses) if is_moe_layer(cfg, l) else mlp(cfg, P, p + "mlp.", h, False))
        x = rms_norm(x, P["model.norm.weight"], eps)
        head = P["model.embed_tokens.weight"] if cfg["tied_embeddings"] else P["lm_head.weight"]
    return F.linear(x, head)


def mean_loss(cfg, P, tokens, targets):
    """The mean token cross-entropy plus every MoE block's weighted router losses."""
    router_losses = []
    logits = forward_logits(cfg, P, tokens, router_losses)
    loss = F.cross_entropy(logits.reshape(-1, cfg["vocab_size"]), targets.reshape(-1))
    return logits, loss + sum(router_losses)


# ---- generation ----------------------------------------------------------------------------

def generate(family, seed):
    cfg = CONFIGS[family]
    gen = torch.Generator().manual_seed(seed)
    P = init_params(cfg, gen)
    names = [n for n, _, _ in param_specs(cfg)]
    tokens = torch.randint(0, cfg["vocab_size"], (B, T), generator=gen, dtype=torch.int64)
    targets = torch.randint(0, cfg["vocab_size"], (B, T), generator=gen, dtype=torch.int64)
    init = {n: P[n].detach().clone() for n in names}

    logits, loss = mean_loss(cfg, P, tokens, targets)
    loss.backward()
    grads = {n: P[n].grad.detach().clone() for n in names}

    # AdamW over the same batch; weight decay only where loom's ParamInfo::weight_decay is set
    # (matrices and embeddings), as in GPT-2/LLaMA training recipes.
    decay = [P[n] for n, _, kind in param_specs(cfg) if kind == "matrix"]
    no_decay = [P[n] for n, _, kind in param_specs(cfg) if kind != "matrix"]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": ADAMW["weight_decay"]},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=ADAMW["lr"], betas=ADAMW["betas"], eps=ADAMW["eps"])
    for _ in range(STEPS):
        opt.zero_grad(set_to_none=True)
        _, step_loss = mean_loss(cfg, P, tokens, targets)
        step_loss.backward()
        # An expert that no token chose has no gradient in torch, and AdamW would skip it;
        # loom's flat gradient holds zeros there and its step decays it like any parameter.
        for n in names:
            if P[n].grad is None:
                P[n].grad = torch.zeros_like(P[n])
        opt.step()
    after = {n: P[n].detach().clone() for n in names}

    meta = {"generator": "tests/golden/make_golden.py", "torch": torch.__version__,
            "seed": str(seed), "config": json.dumps(cfg, sort_keys=True),
            "batch": json.dumps({"B": B, "T": T}), "loss": repr(loss.item()),
            "adamw": json.dumps(dict(ADAMW, steps=STEPS, decay="matrices and embeddings"))}
    f32 = lambda d: [(n, d[n].float()) for n in names]
    os.makedirs(OUT_DIR, exist_ok=True)
    base = os.path.join(OUT_DIR, family)
    write_safetensors(base + "_init.safetensors",
                      f32(init) + [("tokens", tokens.int()), ("targets", targets.int())], meta)
    write_safetensors(base + "_grads.safetensors",
                      f32(grads) + [("logits", logits.detach().float()),
                                    ("loss", loss.detach().reshape(()))], meta)
    write_safetensors(base + "_adamw3.safetensors", f32(after), meta)
    small = min(g.abs()[g != 0].min().item() for g in grads.values() if (g != 0).any())
    print(f"{family}: loss {loss.item():.6f}, {sum(t.numel() for t in init.values())} params, "
          f"smallest nonzero |grad| {small:.3e}")


def main():
    torch.set_num_threads(1)
    generate("gpt2", seed=1234)
    generate("llama", seed=5678)
    generate("llama_moe", seed=91)
    generate("gpt2_moe", seed=92)
    for f in sorted(os.listdir(OUT_DIR)):
        print(f"  {f}: {os.path.getsize(os.path.join(OUT_DIR, f))} bytes")
    return 0


if __name__ == "__main__":
    sys.exit(main())

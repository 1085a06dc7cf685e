#!/usr/bin/env python3
"""PyTorch eager peer for `loom bench train --peer torch`.

Builds the same decoder (GPT-2 or LLaMA family, sizes from the command line), then serves
the benchmark over stdin/stdout so runs can alternate with loom's in one invocation:
  prints `READY <params>` once built; on `run K` performs K full training steps (forward,
  backward, AdamW) and prints `TIMES ms1 ms2 ...`; exits on `quit` or end of input.
Attention is the eager formulation (scores materialised), as Hugging Face's GPT-2 does in
PyTorch 1.13 (no fused attention there). `--precision bf16` runs forward and loss under
torch.autocast("cpu", dtype=torch.bfloat16) (fp32 master weights, as loom's bf16). Runs on
Debian's python3-torch; without it, says how to install it and exits with status 3.
"""
import argparse
import contextlib
import math
import sys
import time

try:
    import torch
    import torch.nn as nn
    import torch.nn.functional as F
except ImportError as e:
    sys.stderr.write(f"[torch peer] PyTorch is not importable by {sys.executable} ({e}). Install Debian's "
                     "package: sudo apt-get install python3-torch, or pass --peer-python PYTHON for an "
                     "interpreter that has torch.\n")
    sys.exit(3)


class Block(nn.Module):
    def __init__(self, a):
        super().__init__()
        self.a = a
        C, H, KVH, D, Fd = a.d_model, a.n_head, a.n_kv_head, a.d_model // a.n_head, a.d_ff
        gpt2 = a.family == "gpt2"
        self.ln1 = nn.LayerNorm(C) if gpt2 else RMSNorm(C)
        self.qkv = nn.Linear(C, (H + 2 * KVH) * D, bias=gpt2)
        self.proj = nn.Linear(H * D, C, bias=gpt2)
        self.ln2 = nn.LayerNorm(C) if gpt2 else RMSNorm(C)
        self.fc = nn.Linear(C, Fd if gpt2 else 2 * Fd, bias=gpt2)
        self.out = nn.Linear(Fd, C, bias=gpt2)

    def forward(self, x, cos, sin, mask):
        a = self.a
        B, T, C = x.shape
        H, KVH, D = a.n_head, a.n_kv_head, a.d_model // a.n_head
        qkv = self.qkv(self.ln1(x))
        q, k, v = qkv.split([H * D, KVH * D, KVH * D], dim=-1)
        q = q.view(B, T, H, D).transpose(1, 2)
        k = k.view(B, T, KVH, D).transpose(1, 2)
        v = v.view(B, T, KVH, D).transpose(1, 2)
        if a.family == "llama":
            q, k = rope(q, cos, sin), rope(k, cos, sin)
            if KVH != H:
                k = k.repeat_interleave(H // KVH, dim=1)
                v = v.repeat_interleave(H // KVH, dim=1)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(D))
        att = att.masked_fill(mask[:T, :T], float("-inf")).softmax(dim=-1)
        y = (att @ v).transpose(1, 2).reshape(B, T, H * D)
        x = x + self.proj(y)
        h = self.fc(self.ln2(x))
        if a.family == "gpt2":
            h = F.gelu(h, approximate="tanh")
        else:
            g, u = h.chunk(2, dim=-1)
            h = F.silu(g) * u
        return x + self.out(h)


class RMSNorm(nn.Module):
    def __init__(self, C, eps=1e-5):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(C))
        self.eps = eps

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def rope(x, cos, sin):
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    return x * cos + torch.cat([-x2, x1], dim=-1) * sin


class Model(nn.Module):
    def __init__(self, a):
        super().__init__()
        self.a = a
        self.wte = nn.Embedding(a.vocab, a.d_model)
        self.wpe = nn.Embedding(a.n_ctx, a.d_model) if a.family == "gpt2" else None
        self.blocks = nn.ModuleList([Block(a) for _ in range(a.n_layer)])
        self.lnf = nn.LayerNorm(a.d_model) if a.family == "gpt2" else RMSNorm(a.d_model)
        self.head = None if a.family == "gpt2" else nn.Linear(a.d_model, a.vocab, bias=False)
        for p in self.parameters():
            if p.dim() == 2:
                nn.init.normal_(p, std=0.02)
        D = a.d_model // a.n_head
        inv = 1.0 / (10000.0 ** (torch.arange(0, D, 2).float() / D))
        f = torch.outer(torch.arange(a.n_ctx).float(), inv)
        emb = torch.cat([f, f], dim=-1)
        self.register_buffer("cos", emb.cos(), persistent=False)
        self.register_buffer("sin", emb.sin(), persistent=False)
        self.register_buffer("mask", torch.triu(torch.ones(a.n_ctx, a.n_ctx, dtype=torch.bool), 1),
                             persistent=False)

    def forward(self, idx, targets):
        B, T = idx.shape
        x = self.wte(idx)
        if self.wpe is not None:
            x = x + self.wpe(torch.arange(T))
        cos, sin = self.cos[:T], self.sin[:T]
        for b in self.blocks:
            x = b(x, cos, sin, self.mask)
        x = self.lnf(x)
        logits = x @ self.wte.weight.t() if self.head is None else self.head(x)
        return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))


def main():
    p = argparse.ArgumentParser()
    for k in ["vocab", "n_ctx", "n_layer", "n_head", "n_kv_head", "d_model", "d_ff", "batch",
              "seq", "threads"]:
        p.add_argument("--" + k, type=int, required=True)
    p.add_argument("--family", default="gpt2")
    p.add_argument("--precision", default="fp32", choices=["fp32", "bf16"])
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    model = Model(a)
    decay = [p for p in model.parameters() if p.dim() >= 2]
    other = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1},
                             {"params": other, "weight_decay": 0.0}], lr=1e-4, betas=(0.9, 0.95))
    g = torch.Generator().manual_seed(1)
    idx = torch.randint(0, a.vocab, (a.batch, a.seq), generator=g)
    tgt = torch.randint(0, a.vocab, (a.batch, a.seq), generator=g)
    n = sum(p.numel() for p in model.parameters())
    print(f"READY {n} torch {torch.__version__} {a.precision}", flush=True)
    autocast = (lambda: torch.autocast("cpu", dtype=torch.bfloat16)) if a.precision == "bf16" \
        else contextlib.nullcontext
    for line in sys.stdin:
        cmd = line.split()
        if not cmd or cmd[0] == "quit":
            break
        if cmd[0] == "run":
            times = []
            for _ in range(int(cmd[1])):
                t0 = time.perf_counter()
                opt.zero_grad(set_to_none=True)
                with autocast():
                    loss = model(idx, tgt)
                loss.backward()
                torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
                opt.step()
                times.append((time.perf_counter() - t0) * 1e3)
            print("TIMES " + " ".join(f"{t:.3f}" for t in times), flush=True)


if __name__ == "__main__":
    main()

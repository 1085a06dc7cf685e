#!/usr/bin/env python3
"""PyTorch peer of `loom bench finetune`: fine-tunes a Hugging Face directory with transformers.

Loads --model (config.json + model.safetensors, f32, as `loom bench finetune` writes it) with
AutoModelForCausalLM and eager attention (transformers 4.44 on Debian's torch 1.13 has no fused
attention), then times --warmup + --steps training steps on --nproc ranks: forward and backward
over the micro-batches (cross-entropy of every position against the next token), global-norm
clipping at 1, AdamW (lr 3e-5, betas 0.9/0.99, eps 1e-8, no weight decay). With --nproc N > 1
the ranks are processes joined by torch.distributed over gloo, the model wrapped in
DistributedDataParallel (25 MB buckets, gradients as bucket views), rank r training on the rows
from r * batch * seq of the --tokens stream, as loom's ranks do.

--lora trains LoRA adapters instead of the whole model (Hu et al. 2021, "LoRA: Low-Rank
Adaptation of Large Language Models"): rank 8, alpha 16, on every attention block's q_proj and
v_proj, the base weights frozen; the adapters are written out here (LoRALinear), no peft.

Rank 0 prints one line `RESULT {json}` per rank: its step times (ms), losses, parameters trained, and
resident memory: VmRSS when the steps start and VmHWM after them, the high-water mark having been
reset after loading (/proc/self/clear_refs, as loom's ranks do). Without torch or transformers it
says what is missing on stderr and exits with status 3.
"""
import argparse
import contextlib
import json
import math
import os
import re
import socket
import sys
import time

try:
    import torch
    import torch.distributed as dist
    import torch.nn as nn
    import torch.nn.functional as F
except ImportError as e:
    sys.stderr.write(f"[torch finetune peer] PyTorch is not importable by {sys.executable} ({e}); install Debian's "
                     "python3-torch (apt-get install python3-torch)\n")
    sys.exit(3)
try:
    import transformers
    from transformers import AutoModelForCausalLM
except ImportError as e:
    sys.stderr.write(f"[torch finetune peer] transformers is not importable by {sys.executable} ({e}); "
                     "bench/peers/setup_transformers.sh VENV installs it into a venv over the system's torch\n")
    sys.exit(3)


class LoRALinear(nn.Module):
    """A frozen linear layer plus a trained low-rank update: y = W x + (alpha / r) B A x.

    A starts random (Kaiming-uniform, as nn.Linear's weights) and B at zero, so the adapted
    model starts as the base model (LoRA section 4.1)."""

    def __init__(self, base, r, alpha):
        super().__init__()
        self.base = base
        self.lora_a = nn.Parameter(torch.empty(r, base.in_features))
        self.lora_b = nn.Parameter(torch.zeros(base.out_features, r))
        nn.init.kaiming_uniform_(self.lora_a, a=math.sqrt(5))
        self.scale = alpha / r

    def forward(self, x):
        return self.base(x) + F.linear(F.linear(x, self.lora_a), self.lora_b) * self.scale


def add_lora(model, r=8, alpha=16, targets=("q_proj", "v_proj")):
    """Freezes every weight and wraps the target projections of each attention block."""
    for p in model.parameters():
        p.requires_grad_(False)
    for layer in model.model.layers:
        for name in targets:
            setattr(layer.self_attn, name, LoRALinear(getattr(layer.self_attn, name), r, alpha))


def status_bytes(field):
    with open("/proc/self/status") as f:
        m = re.search(rf"^{field}:\s+(\d+) kB", f.read(), re.M)
    return int(m.group(1)) * 1024 if m else 0


def reset_peak_rss():
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def run_rank(rank, a, port):
    n = a.nproc
    threads = max(1, a.threads // n)
    torch.set_num_threads(threads)
    if n > 1:
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=n)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(a.model, torch_dtype=torch.float32, attn_implementation="eager")
    if a.lora:
        add_lora(model)
    model.train()
    trained = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(trained, lr=3e-5, betas=(0.9, 0.99), eps=1e-8, weight_decay=0.0)
    net = model
    if n > 1:
        net = nn.parallel.DistributedDataParallel(model, bucket_cap_mb=25, gradient_as_bucket_view=True)
    B, M, T = a.batch, a.micro_batch, a.seq
    stream = torch.frombuffer(bytearray(open(a.tokens, "rb").read()), dtype=torch.int32).long()
    assert stream.numel() >= n * B * T + 1, f"{a.tokens} holds {stream.numel()} tokens; {n * B * T + 1} needed"
    rows = stream[rank * B * T: rank * B * T + B * T + 1]
    tok, tgt = rows[:-1].view(B, T), rows[1:].view(B, T)

    peak_reset = reset_peak_rss()
    rss_start = status_bytes("VmRSS")
    times, losses = [], []
    for i in range(a.warmup + a.steps):
        if n > 1:
            dist.barrier()
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        loss_sum = 0.0
        for b0 in range(0, B, M):
            last = b0 + M >= B
            sync = net.no_sync() if n > 1 and not last else contextlib.nullcontext()
            with sync:
                logits = net(input_ids=tok[b0:b0 + M]).logits
                loss = F.cross_entropy(logits.view(-1, logits.size(-1)), tgt[b0:b0 + M].reshape(-1))
                (loss * (M / B)).backward()
            loss_sum += loss.item() * M / B
        torch.nn.utils.clip_grad_norm_(trained, 1.0)
        opt.step()
        ms = (time.perf_counter() - t0) * 1e3
        losses.append(loss_sum)
        if i >= a.warmup:
            times.append(ms)
        if rank == 0:
            what = f"warm-up {i + 1}" if i < a.warmup else f"step {i - a.warmup + 1}"
            print(f"torch dp={n} {what}: {ms:.1f} ms, loss {loss_sum:.4f} (rank 0's rows)", flush=True)
    result = {"rank": rank, "dp": n, "threads": threads, "mode": "lora" if a.lora else "full",
              "params": sum(p.numel() for p in model.parameters()),
              "trained_params": sum(p.numel() for p in trained), "step_ms": times, "loss": losses,
              "rss_start_bytes": rss_start, "rss_peak_bytes": status_bytes("VmHWM"),
              "rss_peak_is_steps_only": peak_reset, "torch": torch.__version__,
              "transformers": transformers.__version__, "attention": model.config._attn_implementation}
    results = [result]
    if n > 1:  # rank 0 prints every rank's line, so that no two ranks' writes interleave
        results = [None] * n
        dist.all_gather_object(results, result)
    if rank == 0:
        for r in results:
            print("RESULT " + json.dumps(r), flush=True)
    if n > 1:
        # Tearing down DDP's reducer and the gloo group can deadlock in torch 1.13 (the group's
        # destructor joins a worker thread that waits for the GIL the destructor holds): leave
        # without destructors once every rank's figures are out.
        dist.barrier()
        sys.stdout.flush()
        os._exit(0)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", required=True, help="Hugging Face directory (config.json, model.safetensors)")
    p.add_argument("--tokens", required=True, help="int32 little-endian token ids: nproc * batch * seq + 1 of them")
    for k, d in [("batch", 4), ("micro-batch", 0), ("seq", 256), ("steps", 3), ("warmup", 1),
                 ("threads", os.cpu_count()), ("nproc", 1)]:
        p.add_argument("--" + k, type=int, default=d)
    p.add_argument("--lora", action="store_true", help="train LoRA adapters (r 8, alpha 16, q_proj and v_proj)")
    a = p.parse_args()
    a.micro_batch = a.micro_batch or a.batch
    if a.batch % a.micro_batch:
        p.error(f"--micro-batch {a.micro_batch} does not divide --batch {a.batch}")
    if a.nproc == 1:
        run_rank(0, a, None)
    else:
        torch.multiprocessing.spawn(run_rank, args=(a, free_port()), nprocs=a.nproc)


if __name__ == "__main__":
    main()

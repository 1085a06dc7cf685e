#!/usr/bin/env python3
"""llama.cpp peer for `loom bench infer --peer llama.cpp`, through PyPI's llama-cpp-python.

  llama_cpp_peer.py --gguf FILE --threads N [--ctx N] [--exact] [--logits-all]

Serves the benchmark over stdin/stdout so its runs alternate with loom's in one invocation:
  prints `READY <system info>` once the model is loaded; then, per command line,
  `decode P N`   a P-token prompt, then N greedy tokens one at a time (batch 1); prints
                 `DECODE <tokens/s, median over the N steps>`;
  `prefill P`    one P-token prompt in one batch; prints `PREFILL <tokens/s>`;
  `greedy N t1 t2 ...` prompt t1..tk, then N greedy tokens; prints `TOKENS id id ...`;
  `nll N t0 .. t(N-1) [tN]` (needs --logits-all) one window of N input tokens from an empty
                 cache, each scored against the token after it; prints `NLL <sum> <count>`, the
                 sum of -log softmax(logits)[next] in float64, as `loom eval` computes it;
  `quit` (or end of input) exits.
Prompts for decode/prefill are the same token formulas loom's benchmark uses, so both sides
see the same ids. --exact runs an F32 KV cache with flash attention off (for comparing
greedy tokens with loom); otherwise llama.cpp's defaults for this API (F16 KV cache).
--logits-all keeps the logits of every position (for `nll`; it slows prompts, so the timing
runs go without it).
"""
import argparse
import contextlib
import ctypes
import io
import os
import statistics
import sys
import time

try:
    import numpy as np
    import llama_cpp
    from llama_cpp import Llama
except ImportError as e:
    sys.exit(f"[peer llama.cpp] {e}; run bench/peers/setup_llama_cpp.sh VENV and use VENV/bin/python")


def quiet_logs():
    """llama.cpp logs every tensor at load; pass on only warnings and errors (ggml levels 3, 4,
    and 5 continuing one of them). Llama(verbose=False) would hide load errors with the rest."""
    shown = [False]

    @llama_cpp.llama_log_callback
    def log(level, text, _):
        show = level in (3, 4) or (level == 5 and shown[0])
        if level != 5:
            shown[0] = show
        if show and text:
            os.write(2, text)
    llama_cpp.llama_log_set(log, ctypes.c_void_p(0))
    return log  # keep the callback alive


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--gguf", required=True)
    p.add_argument("--threads", type=int, required=True)
    p.add_argument("--ctx", type=int, default=1024)
    p.add_argument("--exact", action="store_true")
    p.add_argument("--logits-all", action="store_true")
    a = p.parse_args()
    keep = quiet_logs()
    kw = dict(type_k=0, type_v=0, flash_attn=False) if a.exact else {}
    with contextlib.redirect_stderr(io.StringIO()):  # the binding's own chatter (metadata, chat format)
        llm = Llama(model_path=a.gguf, n_ctx=a.ctx, n_batch=a.ctx, n_ubatch=a.ctx, n_threads=a.threads,
                    n_threads_batch=a.threads, logits_all=a.logits_all, verbose=True, **kw)
    vocab = llm.n_vocab()

    def argmax_last():
        logits = np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(llm.ctx, -1), shape=(vocab,))
        return int(np.argmax(logits))

    def prompt(n, salt=0, mul=7):
        return [(i * mul + salt + 1) % vocab for i in range(n)]

    info = llama_cpp.llama_print_system_info().decode(errors="replace").strip().replace("\n", " ")
    print(f"READY llama-cpp-python {llama_cpp.__version__}; {info}", flush=True)
    rep = 0
    for line in sys.stdin:
        cmd = line.split()
        if not cmd:
            continue
        if cmd[0] == "quit":
            break
        if cmd[0] == "decode":
            P, N = int(cmd[1]), int(cmd[2])
            llm.reset()
            llm.eval(prompt(P))
            tok = argmax_last()
            dt = []
            for _ in range(N):
                t = time.perf_counter()
                llm.eval([tok])
                tok = argmax_last()
                dt.append(time.perf_counter() - t)
            print(f"DECODE {1.0 / statistics.median(dt)}", flush=True)
        elif cmd[0] == "prefill":
            P = int(cmd[1])
            rep += 1
            llm.reset()
            toks = prompt(P, salt=7 * rep, mul=13)
            t = time.perf_counter()
            llm.eval(toks)
            argmax_last()
            print(f"PREFILL {P / (time.perf_counter() - t)}", flush=True)
        elif cmd[0] == "greedy":
            N, toks = int(cmd[1]), [int(x) for x in cmd[2:]]
            llm.reset()
            llm.eval(toks)
            out = []
            for i in range(N):
                out.append(argmax_last())
                if i + 1 < N:
                    llm.eval([out[-1]])
            print("TOKENS " + " ".join(map(str, out)), flush=True)
        elif cmd[0] == "nll":
            N, toks = int(cmd[1]), [int(x) for x in cmd[2:]]
            if not a.logits_all or not 0 < N <= len(toks) <= N + 1 or N > a.ctx:
                sys.exit(f"[peer llama.cpp] nll needs --logits-all and 1 to {a.ctx} inputs plus at most one "
                         f"target; got N={N} and {len(toks)} ids")
            llm.reset()
            llm.eval(toks[:N])
            logits = np.asarray(llm.scores[:N], dtype=np.float64)
            total, count = 0.0, 0
            for i in range(min(N, len(toks) - 1)):
                row = logits[i]
                mx = row.max()
                total += mx + np.log(np.exp(row - mx).sum()) - row[toks[i + 1]]
                count += 1
            print(f"NLL {float(total)!r} {count}", flush=True)
        else:
            print(f"ERROR unknown command {cmd[0]!r}", flush=True)
    llm.close()
    del keep


if __name__ == "__main__":
    main()

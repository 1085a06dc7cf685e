#!/usr/bin/env bash
# `loom bench finetune` with its PyTorch peer (bench/peers/torch_finetune.py: transformers 4.44 on
# Debian's PyTorch, bench/peers/setup_transformers.sh) on the tiny LLaMA preset:
#   - at dp 1 and 2 the peer reports positive figures, trains every parameter, and starts from
#     loom's loss (same weights, same tokens) within 1e-4;
#   - the peer's --lora path, on a LLaMA model transformers builds from a config (no download),
#     trains only the rank-8 adapters of q_proj and v_proj (r * (in + out) each), starts from the
#     full model's loss (B starts at zero) and lowers it, on 2 ranks over gloo.
# Skips (exit 77, "SKIPPED:") when transformers cannot be installed (no PyTorch for the system's
# python3, or no package index).
# usage: finetune_peer_test.sh LOOM_BINARY SOURCE_DIR BUILD_DIR
set -euo pipefail
LOOM="$1"
SRC="$2"
BUILD="$3"
VENV="$BUILD/peers/transformers-venv"
WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT
source "$SRC/tests/infer/cli_helpers.sh"

transformers_or_skip "$VENV"

echo "== loom bench finetune --model llama-tiny, PyTorch beside it"
run "$WORK/bench.log" "$LOOM" bench finetune --model llama-tiny --peer-venv "$VENV" --batch 2 --micro-batch 1 \
  --seq 32 --steps 2 --warmup 1 --threads 2
cat "$WORK/bench.log"
python3 - "$WORK/bench.log" <<'PY'
import json, sys
s = json.loads([l for l in open(sys.argv[1]) if l.startswith("SUMMARY ")][-1][len("SUMMARY "):])
bad = []
if s["peer"] != "torch" or [r["dp"] for r in s["runs"]] != [1, 2]:
    bad.append(f"peer {s['peer']} ({s['peer_state']}), runs at dp {[r['dp'] for r in s['runs']]}")
for r in s["runs"]:
    for k in ["peer_ms_median", "peer_tokens_per_s", "peer_peak_rss_bytes", "speedup", "memory_ratio"]:
        if not (r.get(k) or 0) > 0:
            bad.append(f"dp={r['dp']}: {k} = {r.get(k)}")
    if r.get("peer_trained_params") != s["params"]:
        bad.append(f"dp={r['dp']}: the peer trains {r.get('peer_trained_params')} parameters, loom {s['params']}")
    if abs(r["loom_first_loss"] - (r["peer_first_loss"] or 0)) > 1e-4:
        bad.append(f"dp={r['dp']}: first loss loom {r['loom_first_loss']}, PyTorch {r['peer_first_loss']}")
if bad:
    sys.exit("FAIL: " + "; ".join(bad))
print("the peer ran at dp 1 and 2 from loom's first loss")
PY

echo "== the peer's LoRA path on 2 ranks"
"$VENV/bin/python" - "$WORK" <<'PY'
import sys, torch
from transformers import LlamaConfig, LlamaForCausalLM
work = sys.argv[1]
c = LlamaConfig(vocab_size=97, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
                num_key_value_heads=2, max_position_embeddings=64)
torch.manual_seed(0)
LlamaForCausalLM(c).save_pretrained(f"{work}/tiny-hf")
torch.randint(0, 97, (2 * 2 * 32 + 1,), dtype=torch.int32).numpy().tofile(f"{work}/tokens.i32")
PY
for mode in full lora; do
  run "$WORK/$mode.log" "$VENV/bin/python" "$SRC/bench/peers/torch_finetune.py" --model "$WORK/tiny-hf" \
    --tokens "$WORK/tokens.i32" --batch 2 --micro-batch 1 --seq 32 --steps 3 --warmup 0 --threads 2 --nproc 2 \
    $([ $mode = lora ] && echo --lora)
  cat "$WORK/$mode.log"
done
python3 - "$WORK/full.log" "$WORK/lora.log" <<'PY'
import json, sys
def results(path):
    return sorted((json.loads(l[len("RESULT "):]) for l in open(path) if l.startswith("RESULT ")), key=lambda r: r["rank"])
full, lora = results(sys.argv[1]), results(sys.argv[2])
C, KV = 32, 16  # d_model; kv heads x head dim
want = 2 * (8 * (C + C) + 8 * (C + KV))  # 2 layers, q_proj C->C and v_proj C->KV, rank 8
bad = []
if len(full) != 2 or len(lora) != 2:
    bad.append(f"{len(full)} and {len(lora)} RESULT lines, not 2 each")
for f, l in zip(full, lora):
    if l["mode"] != "lora" or l["trained_params"] != want or l["params"] != f["params"] + want:
        bad.append(f"rank {l['rank']}: LoRA trains {l['trained_params']} of {l['params']} parameters, expected {want} "
                   f"of {f['params'] + want}")
    if abs(l["loss"][0] - f["loss"][0]) > 1e-6:
        bad.append(f"rank {l['rank']}: LoRA's first loss {l['loss'][0]}, the full model's {f['loss'][0]}")
    if not l["loss"][-1] < l["loss"][0]:
        bad.append(f"rank {l['rank']}: LoRA's loss went from {l['loss'][0]} to {l['loss'][-1]}")
if bad:
    sys.exit("FAIL: " + "; ".join(bad))
print(f"LoRA: {want} adapter parameters trained of {lora[0]['params']}, loss {lora[0]['loss'][0]:.5f} -> "
      f"{lora[0]['loss'][-1]:.5f} on rank 0")
PY
echo "PASS"

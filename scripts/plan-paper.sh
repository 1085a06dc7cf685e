#!/usr/bin/env bash
# The planner's predictions behind docs/PLANNING.md ("Validation on paper"): published
# large-scale configurations and claims, evaluated with `loom plan` on the public cluster
# files. Prints one line per prediction (layout, step ms, tokens/s, MFU, memory, and the
# terms that decide). Usage: scripts/plan-paper.sh [path/to/loom]
set -euo pipefail
LOOM="${1:-build/bin/loom}"
SRC="$(cd "$(dirname "$0")/.." && pwd)"
A100="$SRC/configs/clusters/dgx-a100-80g.yaml"
M="$SRC/configs/models"
row() {  # label, then loom plan arguments
  local label="$1"; shift
  "$LOOM" plan --precision bf16 --seq 2048 "$@" | grep '^SUMMARY' | sed 's/^SUMMARY //' |
    python3 "$SRC/scripts/plan_row.py" "$label"
}
echo "== Megatron-LM on DGX A100 (Narayanan et al. 2021): published 140 TFLOP/s/GPU (175B), 163 (1T)"
row "GPT-3 175B, 1024 GPUs, batch 1536" --model "$M/gpt3-175b.yaml" --cluster "$A100" --nodes 128 --global-batch 1536 \
  --layout dp=16,tp=8,pp=8,zero=0,mb=1,m=96,ckpt=1
row "1T, 3072 GPUs, batch 3072" --model "$M/megatron-1t.yaml" --cluster "$A100" --nodes 384 --global-batch 3072 \
  --layout dp=6,tp=8,pp=64,zero=0,mb=1,m=512,ckpt=1
echo "== Weak scaling of the 175B layout: dp 1 -> 16 with the batch (64 -> 1024 GPUs)"
row "GPT-3 175B, 64 GPUs, batch 96" --model "$M/gpt3-175b.yaml" --cluster "$A100" --nodes 8 --global-batch 96 \
  --layout dp=1,tp=8,pp=8,zero=0,mb=1,m=96,ckpt=1
row "GPT-3 175B, 1024 GPUs, batch 1536" --model "$M/gpt3-175b.yaml" --cluster "$A100" --nodes 128 --global-batch 1536 \
  --layout dp=16,tp=8,pp=8,zero=0,mb=1,m=96,ckpt=1
echo "== Pure data parallelism above 10B: GPT-3 13B on 64 GPUs, ZeRO-3 (the only stage that fits)"
for g in 200 100 50 25; do
  row "13B dp64 ZeRO-3, inter-node $g GB/s" --model "$M/gpt3-13b.yaml" --cluster "$A100" --nodes 8 --global-batch 512 \
    --inter-gbps $g --layout dp=64,zero=3,mb=1,m=8,ckpt=1
done
row "13B, the planner's pick (200 GB/s)" --model "$M/gpt3-13b.yaml" --cluster "$A100" --nodes 8 --global-batch 512 --top 1
echo "== Communication share on 64 GPUs (8 nodes), GPT-3 1.3B, data parallel (ZeRO-0), 100 Gb/s between nodes"
row "flat ring, fp32 gradients, no overlap" --model "$M/gpt3-1.3b.yaml" --cluster "$A100" --nodes 8 --global-batch 512 \
  --inter-gbps 12.5 --algorithm ring --grad-dtype fp32 --no-overlap --layout dp=64,zero=0,mb=8,m=1
row "+ hierarchical collectives" --model "$M/gpt3-1.3b.yaml" --cluster "$A100" --nodes 8 --global-batch 512 \
  --inter-gbps 12.5 --grad-dtype fp32 --no-overlap --layout dp=64,zero=0,mb=8,m=1
row "+ overlap with backward" --model "$M/gpt3-1.3b.yaml" --cluster "$A100" --nodes 8 --global-batch 512 \
  --inter-gbps 12.5 --grad-dtype fp32 --layout dp=64,zero=0,mb=8,m=1
row "+ bf16 gradients" --model "$M/gpt3-1.3b.yaml" --cluster "$A100" --nodes 8 --global-batch 512 \
  --inter-gbps 12.5 --grad-dtype bf16 --layout dp=64,zero=0,mb=8,m=1
row "+ 1-bit compression (1-bit Adam)" --model "$M/gpt3-1.3b.yaml" --cluster "$A100" --nodes 8 --global-batch 512 \
  --inter-gbps 12.5 --grad-dtype 1bit --layout dp=64,zero=0,mb=8,m=1
echo "== Team-size advice: the planner's pick per size"
row "1.3B on 1 node (8 GPUs)" --model "$M/gpt3-1.3b.yaml" --cluster "$A100" --nodes 1 --global-batch 256 --top 1
row "13B on 32 nodes (256 GPUs)" --model "$M/gpt3-13b.yaml" --cluster "$A100" --nodes 32 --global-batch 1024 --top 1
row "175B on 128 nodes (1024 GPUs)" --model "$M/gpt3-175b.yaml" --cluster "$A100" --nodes 128 --global-batch 1536 --top 1

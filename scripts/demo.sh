#!/usr/bin/env bash
# `make demo`: prepare Tiny Shakespeare as bytes, train a small GPT on it for a few minutes,
# then sample from it. Assumes `make build` ran (the Makefile does that first).
set -euo pipefail
cd "$(dirname "$0")/.."
LOOM=build/bin/loom
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-$(nproc)}"
RUN=runs/shakespeare

echo "== 1/3 prepare: data/tinyshakespeare/input.txt -> token shards (byte tokenizer)"
$LOOM prepare --input data/tinyshakespeare/input.txt --tokenizer byte --out runs/shakespeare-data --force

echo
echo "== 2/3 train: configs/shakespeare.yaml ($OMP_NUM_THREADS threads)"
rm -rf "$RUN"
mkdir -p "$RUN"
$LOOM train configs/shakespeare.yaml | tee "$RUN/train.log"

echo
echo "== 3/3 sample: loom generate --checkpoint $RUN --prompt 'ROMEO:'"
$LOOM generate --checkpoint "$RUN" --prompt "ROMEO:" --max-tokens 240 --temperature 0.8 --top-k 40 --seed 7

val=$(grep '^SUMMARY' "$RUN/train.log" | sed 's/.*"final_val_loss":\([0-9.]*\).*/\1/')
echo
echo "validation loss ${val} nats/byte vs 3.347 for the unigram baseline (last 10% of the text);"
awk -v v="$val" 'BEGIN { printf "that is %.0f%% below the baseline.\n", 100 * (1 - v / 3.347) }'

#!/usr/bin/env bash
# `loom generate` end to end: train a tiny byte-level model for a few steps, then sample from
# the checkpoint twice with the same seed (identical output) and once with another seed.
set -euo pipefail
LOOM="$1"
SRC="$2"
WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT
head -c 40000 "$SRC/data/tinyshakespeare/input.txt" > "$WORK/in.txt"
"$LOOM" prepare --input "$WORK/in.txt" --tokenizer byte --out "$WORK/data" > /dev/null
"$LOOM" train "$SRC/configs/shakespeare.yaml" --set data.dir="$WORK/data" --set schedule.steps=4 \
  --set data.batch_size=2 --set data.seq_len=64 --set checkpoint.dir="$WORK/run" \
  --set log.metrics_path="$WORK/m.jsonl" --set log.progress=off > /dev/null
gen() { "$LOOM" generate --checkpoint "$WORK/run" --prompt "ROMEO:" --max-tokens 40 --temperature 1.0 --seed "$1" 2>/dev/null; }
a="$(gen 7)"
b="$(gen 7)"
c="$(gen 8)"
[ "${a:0:6}" = "ROMEO:" ] || { echo "output does not start with the prompt: $a"; exit 1; }
[ "$a" = "$b" ] || { echo "same seed, different output:"; echo "$a"; echo "$b"; exit 1; }
[ "$a" != "$c" ] || { echo "different seeds gave the same output: $a"; exit 1; }
# A prompt longer than the context is refused with both numbers.
long="$(head -c 400 "$WORK/in.txt")"
if out="$("$LOOM" generate --checkpoint "$WORK/run" --prompt "$long" 2>&1)"; then
  echo "a 400-token prompt on a 128-token model was accepted"; exit 1
fi
echo "$out" | grep -q "400" || { echo "refusal does not name the prompt length: $out"; exit 1; }
echo "generate: deterministic per seed (${#a} bytes), long prompts refused"

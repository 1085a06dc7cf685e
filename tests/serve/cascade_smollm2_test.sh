#!/usr/bin/env bash
# The edge/center cascade with a real model pair: SmolLM2-135M-Instruct's GGUF
# (scripts/fetch-test-model.sh) in fp32 at the center and quantized at the edges.
#   1. `loom quantize --model X.gguf --to int4` writes a checkpoint that stands alone: it chats
#      through the model's template with the tokenizer it carries;
#   2. `loom bench cascade --quick --thresholds 0,1` with the GGUF as the center and as the int8
#      edge (quantized by the bench) and the int4 checkpoint above: chat questions through the
#      template, no failed request, every answer ended by the model's end token rather than shown
#      as text. The two ends of the sweep suffice here; the tiny pair (cascade_cli_test.sh) runs
#      the middle too.
# The int4 checkpoint of step 1 is requantized with groups of 64 so that its greedy answer to the
# France question is Paris: with the file's own Q4_1 blocks (groups of 32, the default) the
# first token's lead of 0.08 flips and the answer is "L'Étoile, la Cité, ...", which is what
# llama.cpp answers on this file too. The bench's own edges take the defaults.
# Skips (exit 77, "SKIPPED:") only when the model cannot be downloaded.
# usage: cascade_smollm2_test.sh LOOM_BINARY SOURCE_DIR
set -euo pipefail
LOOM="$1"
SRC="$2"
WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT
source "$SRC/tests/infer/cli_helpers.sh"

smollm2_or_skip

refused "--edge-int8 $WORK/none: " "$LOOM" bench cascade --center "$MODEL" --edge-int8 "$WORK/none" \
  --edge-int4 "$MODEL" --out "$WORK/refused"
refused "give a \`loom quantize\` output or a model path" "$LOOM" bench cascade --center "$MODEL" \
  --edge-int8 "$WORK/none" --edge-int4 "$MODEL" --out "$WORK/refused"

"$LOOM" quantize --model "$MODEL" --to int4 --group 64 --out "$WORK/int4" > "$WORK/quantize.out" 2> "$WORK/quantize.err" ||
  { cat "$WORK/quantize.out" "$WORK/quantize.err"; exit 1; }
for f in quant.safetensors config.json tokenizer.gguf tokenizer_config.json trainer_state.json; do
  [ -f "$WORK/int4/$f" ] || { echo "the quantized checkpoint lacks $f:"; ls "$WORK/int4"; exit 1; }
done
"$LOOM" generate --checkpoint "$WORK/int4" --chat --prompt "What is the capital of France?" --temperature 0 \
  --max-tokens 16 > "$WORK/answer.txt" 2> "$WORK/generate.err" || { cat "$WORK/generate.err"; exit 1; }
grep -q "Paris" "$WORK/answer.txt" || { echo "int4 checkpoint answered: $(cat "$WORK/answer.txt")"; exit 1; }

LOOM_BENCH_CASCADE_TRACE=1 "$LOOM" bench cascade --quick --center "$MODEL" --edge-int8 "$MODEL" \
  --edge-int4 "$WORK/int4" --out "$WORK/bench" --center-threads 1 --wan 40ms,1gbit --thresholds 0,1 \
  > "$WORK/bench.out" 2> "$WORK/bench.err" || { echo "bench cascade failed:"; cat "$WORK/bench.out" "$WORK/bench.err"; exit 1; }
cat "$WORK/bench.out"
if grep "\[trace\].*answer" "$WORK/bench.err" | grep -q "<|im_"; then
  echo "an answer shows a special token as text:"
  grep "<|im_" "$WORK/bench.err"
  exit 1
fi
tail -1 "$WORK/bench.out" | python3 -c '
import json, sys
line = sys.stdin.read()
assert line.startswith("SUMMARY "), line
s = json.loads(line[8:])
assert s["failed"] == 0, s
assert s["workload"] == "chat", s["workload"]
sweep = {r["threshold"]: r for r in s["sweep"]}
assert sorted(sweep) == [0, 1], sweep
assert sweep[0]["edge_fraction"] == 1, "threshold 0 answers everything at the edge"
assert sweep[1]["edge_fraction"] <= 0.5, "threshold 1 forwards what is not certain"
for k in ("threshold", "latency_speedup", "center_load_reduction", "quality_ratio"):
    assert k in s, k
'
echo "cascade with SmolLM2: ok"

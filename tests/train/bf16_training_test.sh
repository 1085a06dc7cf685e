#!/usr/bin/env bash
# bf16 training, CI-sized: the demo model (configs/shakespeare.yaml) trained for the same steps
# on the same data with model.precision fp32 and bf16 must reach validation losses within 1% of
# each other, the bf16 run must say how its products run, and the two must differ (the policy
# was applied). fp16 without loss scaling is refused with the reason.
set -euo pipefail
LOOM="$1"
SRC="$2"
WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT
head -c 200000 "$SRC/data/tinyshakespeare/input.txt" > "$WORK/in.txt"
"$LOOM" prepare --input "$WORK/in.txt" --tokenizer byte --out "$WORK/data" > /dev/null
train() {
  "$LOOM" train "$SRC/configs/shakespeare.yaml" --set data.dir="$WORK/data" --set schedule.steps=100 \
    --set schedule.warmup_steps=10 --set data.batch_size=16 --set data.seq_len=64 --set schedule.eval_interval=100 \
    --set schedule.eval_batches=20 --set checkpoint.dir="$WORK/$1" --set log.metrics_path="$WORK/$1.jsonl" \
    --set log.progress=off --set model.precision="$1" > "$WORK/$1.log" 2>&1
}
final_loss() {
  grep '^SUMMARY' "$WORK/$1.log" | sed 's/^SUMMARY //' | python3 -c "import json,sys; print(json.load(sys.stdin)['final_val_loss'])"
}
# The two runs side by side, one thread each (CTest gives this test two processors).
OMP_NUM_THREADS=1 train fp32 &
f32_pid=$!
trap 'kill $f32_pid 2>/dev/null || true; rm -rf "$WORK"' EXIT
OMP_NUM_THREADS=1 train bf16 || { echo "the bf16 run failed:"; tail -20 "$WORK/bf16.log"; exit 1; }
wait $f32_pid || { echo "the fp32 run failed:"; tail -20 "$WORK/fp32.log"; exit 1; }
f32="$(final_loss fp32)"
b16="$(final_loss bf16)"
grep -q "model.precision=bf16 runs its products " "$WORK/bf16.log" ||
  { echo "the bf16 run did not say how its products run:"; head -20 "$WORK/bf16.log"; exit 1; }
python3 - "$f32" "$b16" <<'PY'
import sys
f32, b16 = map(float, sys.argv[1:])
print(f"validation loss after 100 steps: fp32 {f32:.4f}, bf16 {b16:.4f} ({100 * (b16 / f32 - 1):+.2f}%)")
assert 1.0 < f32 < 3.2, f"fp32 loss {f32} is not that of a byte model trained 100 steps"
assert b16 != f32, "bf16 and fp32 losses are identical: were the products rounded?"
assert abs(b16 / f32 - 1) < 0.01, f"bf16 loss {b16} is more than 1% from fp32's {f32}"
PY
out="$("$LOOM" train "$SRC/configs/shakespeare.yaml" --set data.dir="$WORK/data" --set model.precision=fp16 \
  --set optim.loss_scale=off 2>&1)" && { echo "fp16 without loss scaling was accepted"; exit 1; }
case "$out" in *"model.precision=fp16 needs optim.loss_scale=dynamic"*) ;; *) echo "fp16 refusal unclear: $out"; exit 1 ;; esac
echo "bf16 training: ok"

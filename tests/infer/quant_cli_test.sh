#!/usr/bin/env bash
# Quantized inference end to end: train a tiny byte-level model, `loom quantize` it to int8,
# int4 and bf16, then check that generate on the quantized checkpoint equals generate --quant on the f32
# one (same weights either way), that eval's losses stay close to fp32's, that bench infer runs
# quantized, and that bad input is refused with a clear message.
set -euo pipefail
LOOM="$1"
SRC="$2"
WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT
source "$SRC/tests/infer/cli_helpers.sh"
tiny_data
train_tiny run
summary() { grep '^SUMMARY' | sed 's/^SUMMARY //'; }
field() { python3 -c "import json,sys; print(json.loads(sys.stdin.read())['$1'])"; }

"$LOOM" quantize --checkpoint "$WORK/run" --to int8 --out "$WORK/q8" > "$WORK/q8.log"
"$LOOM" quantize --checkpoint "$WORK/run" --to int4 --group 32 --out "$WORK/q4" > "$WORK/q4.log"
"$LOOM" quantize --checkpoint "$WORK/run" --to bf16 --out "$WORK/qb" > "$WORK/qb.log"
grep -q "int4 g32 head int8" "$WORK/q4.log" || { echo "quantize did not report its format:"; cat "$WORK/q4.log"; exit 1; }
grep -q "bf16 head bf16" "$WORK/qb.log" || { echo "quantize did not report bf16:"; cat "$WORK/qb.log"; exit 1; }
[ -f "$WORK/q4/quant.safetensors" ] || { echo "no quant.safetensors written"; exit 1; }

gen() { "$LOOM" generate --prompt "ROMEO:" --max-tokens 40 --temperature 0.9 --seed 3 "$@" 2>/dev/null; }
for q in "q8 int8" "q4 int4 --group 32" "qb bf16"; do
  set -- $q
  dir="$1"; shift
  from_file="$(gen --checkpoint "$WORK/$dir")"
  on_load="$(gen --checkpoint "$WORK/run" --quant "$@")"
  [ "$from_file" = "$on_load" ] || { echo "$dir: quantized checkpoint and --quant $* differ:"; echo "$from_file"; echo "$on_load"; exit 1; }
  [ "${from_file:0:6}" = "ROMEO:" ] || { echo "$dir: output does not start with the prompt: $from_file"; exit 1; }
done

ev() { "$LOOM" eval --data "$WORK/data" --max-windows 20 --seq-len 64 "$@" 2>/dev/null | summary | field loss; }
f32="$(ev --checkpoint "$WORK/run")"
i8="$(ev --checkpoint "$WORK/q8")"
i4="$(ev --checkpoint "$WORK/q4")"
b16="$(ev --checkpoint "$WORK/qb")"
python3 - "$f32" "$i8" "$i4" "$b16" <<'PY'
import sys
f32, i8, i4, b16 = map(float, sys.argv[1:])
print(f"eval loss fp32 {f32:.4f}, int8 {i8:.4f} ({100*(i8/f32-1):+.2f}%), int4 g32 {i4:.4f} ({100*(i4/f32-1):+.2f}%), "
      f"bf16 {b16:.4f} ({100*(b16/f32-1):+.2f}%)")
assert b16 != f32, "bf16 loss equals fp32's exactly: were the weights rounded at all?"
assert abs(b16 / f32 - 1) < 0.005, f"bf16 loss {b16} is more than 0.5% from fp32's {f32}"
assert 1.0 < f32 < 5.6, f"fp32 loss {f32} is not that of a byte model trained a little"
assert abs(i8 / f32 - 1) < 0.01, f"int8 loss {i8} is more than 1% from fp32's {f32}"
assert abs(i4 / f32 - 1) < 0.05, f"int4 loss {i4} is more than 5% from fp32's {f32}"
PY

out="$("$LOOM" bench infer --checkpoint "$WORK/q4" --mode continuous --requests 2 --rate 0 --prompt-len 8 \
  --output-len 4 --batch1-tokens 8 --prefill-tokens 32 2>/dev/null | summary)"
[ "$(echo "$out" | field quant)" = "int4 g32 head int8" ] || { echo "bench infer SUMMARY lacks the quant: $out"; exit 1; }
echo "$out" | field prefill_tokens_per_s > /dev/null

# Every integer path this CPU runs gives the same model to activation rounding, and says so.
for path in avx2-int avx-vnni avx512-vnni; do
  log="$(LOOM_QUANT_PATH=$path "$LOOM" bench infer --checkpoint "$WORK/q4" --mode continuous --requests 1 --rate 0 \
    --prompt-len 8 --output-len 2 --no-batch1 2>&1)" || {
    grep -q "needs instructions this CPU lacks" <<<"$log" && { echo "$path: not on this CPU"; continue; }
    echo "LOOM_QUANT_PATH=$path failed:"; echo "$log"; exit 1; }
  grep -q "quantized linears $path" <<<"$log" || { echo "LOOM_QUANT_PATH=$path: the path is not printed:"; echo "$log"; exit 1; }
  p4="$(LOOM_QUANT_PATH=$path ev --checkpoint "$WORK/q4")"
  python3 -c "import sys; a, b = float(sys.argv[1]), float(sys.argv[2]); print(f'int4 g32 eval loss on $path {a:.4f}'); assert abs(a / b - 1) < 2e-3, (a, b)" "$p4" "$i4"
done
refused "LOOM_QUANT_PATH='avx9': expected one of base-f32, avx2-f32" env LOOM_QUANT_PATH=avx9 "$LOOM" generate --checkpoint "$WORK/q4" --prompt "A"
refused "[quantize] --to int3: expected int8, int4 or bf16" "$LOOM" quantize --checkpoint "$WORK/run" --to int3 --out "$WORK/x"
refused "group" "$LOOM" quantize --checkpoint "$WORK/run" --to int4 --group 50 --out "$WORK/x"
refused "is already quantized" "$LOOM" quantize --checkpoint "$WORK/q8" --to int4 --out "$WORK/x"
refused "is already quantized" "$LOOM" generate --checkpoint "$WORK/q8" --quant int4 --prompt "A"
refused "[generate] --quant int5: expected fp32, bf16, int8 or int4" "$LOOM" generate --checkpoint "$WORK/run" --quant int5 --prompt "A"
refused "bf16 weights have no scales" "$LOOM" quantize --checkpoint "$WORK/run" --to bf16 --group 32 --out "$WORK/x"
refused "--resume" "$LOOM" train "$SRC/configs/shakespeare.yaml" --set data.dir="$WORK/data" --resume "$WORK/q8"
echo "quantized inference CLI: ok"

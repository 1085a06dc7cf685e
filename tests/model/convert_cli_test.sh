#!/usr/bin/env bash
# loom convert end to end (docs/MODELS.md, "Converting"), on a tiny Q8_0 llama GGUF that
# write_test_gguf makes:
#   1. the converted checkpoint's eval loss on a list of ids is the GGUF's, exactly (f32 keeps
#      the dequantized weights); greedy generate gives the same text through the tokenizer the
#      checkpoint carries; quantize, and --dtype bf16, load and stay close;
#   2. a Hugging Face directory (the checkpoint without its manifest) converts the same way;
#   3. refusals: a loom checkpoint as --model, an --out that is not a checkpoint (kept intact);
#   4. when SmolLM2-135M-Instruct's GGUF is already in the cache (scripts/fetch-test-model.sh;
#      not fetched here), the same loss and greedy text for it.
# usage: convert_cli_test.sh LOOM_BINARY WRITE_TEST_GGUF_BINARY SOURCE_DIR
set -euo pipefail
LOOM="$1"
WRITE_GGUF="$2"
SRC="$3"
WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT

fail() { echo "FAIL: $*"; exit 1; }
# run LOG CMD...: CMD must exit 0; its stdout and stderr go to LOG (shown on failure).
run() {
  local log="$1"; shift
  local rc=0
  "$@" > "$log" 2>&1 || rc=$?
  [ $rc -eq 0 ] || { cat "$log"; fail "exit status $rc from: $*"; }
}
# refused LOG STATUS TEXT CMD...: CMD must exit with STATUS and say TEXT.
refused() {
  local log="$1" want="$2" text="$3"; shift 3
  local rc=0
  "$@" > "$log" 2>&1 || rc=$?
  [ $rc -eq "$want" ] || { cat "$log"; fail "exit status $rc (expected $want) from: $*"; }
  grep -qF -- "$text" "$log" || { cat "$log"; fail "no '$text' in the error of: $*"; }
}
loss_of() { grep '^SUMMARY ' "$1" | grep -o '"loss":[-0-9.e+]*' | cut -d: -f2; }
close() { awk -v a="$1" -v b="$2" -v t="$3" 'BEGIN { d = a - b; if (d < 0) d = -d; exit !(d <= t) }'; }

run "$WORK/write.log" "$WRITE_GGUF" "$WORK/tiny.gguf" q8_0
seq 0 7 250 | tr '\n' ' ' > "$WORK/ids.txt"

# 1. GGUF -> checkpoint.
run "$WORK/eval_gguf.log" "$LOOM" eval --model "$WORK/tiny.gguf" --ids "$WORK/ids.txt"
want=$(loss_of "$WORK/eval_gguf.log")
[ -n "$want" ] || { cat "$WORK/eval_gguf.log"; fail "no loss in eval's SUMMARY"; }
run "$WORK/convert.log" "$LOOM" convert --model "$WORK/tiny.gguf" --out "$WORK/ckpt"
cat "$WORK/convert.log"
grep -q '^SUMMARY .*"format":"GGUF"' "$WORK/convert.log" || fail "no SUMMARY line"
for f in manifest.json model.safetensors config.json trainer_state.json tokenizer.gguf tokenizer_config.json; do
  [ -f "$WORK/ckpt/$f" ] || fail "the checkpoint has no $f"
done
grep -q '"chat_template"' "$WORK/ckpt/tokenizer_config.json" || fail "the chat template was not carried"
run "$WORK/eval_ckpt.log" "$LOOM" eval --checkpoint "$WORK/ckpt" --ids "$WORK/ids.txt"
got=$(loss_of "$WORK/eval_ckpt.log")
echo "loss: GGUF $want, converted $got"
[ "$got" = "$want" ] || fail "the converted checkpoint's loss $got differs from the GGUF's $want"

gen=(--prompt "Once upon a time" --max-tokens 12 --temperature 0)
run "$WORK/gen_gguf.log" "$LOOM" generate --model "$WORK/tiny.gguf" "${gen[@]}"
(cd "$WORK" && "$LOOM" generate --checkpoint ckpt "${gen[@]}" > gen_ckpt.txt 2> gen_ckpt.log) ||
  { cat "$WORK/gen_ckpt.log"; fail "generate --checkpoint (from another directory) failed"; }
"$LOOM" generate --model "$WORK/tiny.gguf" "${gen[@]}" > "$WORK/gen_gguf.txt" 2>/dev/null
cmp -s "$WORK/gen_gguf.txt" "$WORK/gen_ckpt.txt" ||
  fail "greedy text differs: GGUF '$(cat "$WORK/gen_gguf.txt")', converted '$(cat "$WORK/gen_ckpt.txt")'"

run "$WORK/quantize.log" "$LOOM" quantize --checkpoint "$WORK/ckpt" --to int8 --out "$WORK/ckpt_int8"
run "$WORK/eval_int8.log" "$LOOM" eval --checkpoint "$WORK/ckpt_int8" --ids "$WORK/ids.txt"
close "$(loss_of "$WORK/eval_int8.log")" "$want" 0.05 || fail "int8 loss $(loss_of "$WORK/eval_int8.log") far from $want"

run "$WORK/convert_bf16.log" "$LOOM" convert --model "$WORK/tiny.gguf" --out "$WORK/ckpt_bf16" --dtype bf16
run "$WORK/eval_bf16.log" "$LOOM" eval --checkpoint "$WORK/ckpt_bf16" --ids "$WORK/ids.txt"
close "$(loss_of "$WORK/eval_bf16.log")" "$want" 0.02 || fail "bf16 loss $(loss_of "$WORK/eval_bf16.log") far from $want"
[ "$(stat -c %s "$WORK/ckpt_bf16/model.safetensors")" -lt "$(stat -c %s "$WORK/ckpt/model.safetensors")" ] ||
  fail "--dtype bf16 did not shrink the weights"

# 2. A Hugging Face directory -> checkpoint; converting onto an earlier checkpoint replaces it.
mkdir "$WORK/hf"
cp "$WORK/ckpt/config.json" "$WORK/ckpt/model.safetensors" "$WORK/ckpt/tokenizer_config.json" "$WORK/hf/"
run "$WORK/convert_hf.log" "$LOOM" convert --model "$WORK/hf" --out "$WORK/ckpt_bf16"
grep -q '^SUMMARY .*"format":"Hugging Face"' "$WORK/convert_hf.log" || { cat "$WORK/convert_hf.log"; fail "not read as Hugging Face"; }
[ -f "$WORK/ckpt_bf16/tokenizer_config.json" ] || fail "tokenizer_config.json was not copied"
run "$WORK/eval_hf.log" "$LOOM" eval --checkpoint "$WORK/ckpt_bf16" --ids "$WORK/ids.txt"
[ "$(loss_of "$WORK/eval_hf.log")" = "$want" ] || fail "the Hugging Face conversion's loss $(loss_of "$WORK/eval_hf.log") differs from $want"

# 3. Refusals.
refused "$WORK/r1.log" 2 "is a loom checkpoint already" "$LOOM" convert --model "$WORK/ckpt" --out "$WORK/again"
mkdir "$WORK/precious" && echo keep > "$WORK/precious/notes.txt"
refused "$WORK/r2.log" 2 "exists and is not a loom checkpoint" "$LOOM" convert --model "$WORK/tiny.gguf" --out "$WORK/precious"
[ -f "$WORK/precious/notes.txt" ] || fail "convert removed a directory that was not a checkpoint"
refused "$WORK/r3.log" 1 "does not exist" "$LOOM" convert --model "$WORK/nothing.gguf" --out "$WORK/x"

# 4. The real model, when it is already here.
MODEL="${LOOM_MODEL_CACHE:-$HOME/.cache/loom/models}/SmolLM2-135M-Instruct.Q4_1.gguf"
if [ ! -f "$MODEL" ]; then
  echo "note: $MODEL is not in the cache (scripts/fetch-test-model.sh fetches it); its part is skipped"
  echo "PASS"
  exit 0
fi
IDS="$SRC/tests/golden/smollm2/chat_prompt.ids"
run "$WORK/s_eval_gguf.log" "$LOOM" eval --model "$MODEL" --ids "$IDS"
run "$WORK/s_convert.log" "$LOOM" convert --model "$MODEL" --out "$WORK/smollm2"
run "$WORK/s_eval_ckpt.log" "$LOOM" eval --checkpoint "$WORK/smollm2" --ids "$IDS"
a=$(loss_of "$WORK/s_eval_gguf.log") b=$(loss_of "$WORK/s_eval_ckpt.log")
echo "SmolLM2 loss: GGUF $a, converted $b"
[ -n "$a" ] && [ "$a" = "$b" ] || fail "SmolLM2: the converted loss $b differs from the GGUF's $a"
gen=(--prompt "The capital of France is" --max-tokens 8 --temperature 0)
"$LOOM" generate --model "$MODEL" "${gen[@]}" > "$WORK/s_gguf.txt" 2>/dev/null || fail "SmolLM2: generate --model"
"$LOOM" generate --checkpoint "$WORK/smollm2" "${gen[@]}" > "$WORK/s_ckpt.txt" 2>/dev/null || fail "SmolLM2: generate --checkpoint"
echo "SmolLM2 greedy: '$(cat "$WORK/s_ckpt.txt")'"
cmp -s "$WORK/s_gguf.txt" "$WORK/s_ckpt.txt" || fail "SmolLM2: greedy text differs from the GGUF's '$(cat "$WORK/s_gguf.txt")'"
echo "PASS"

#!/usr/bin/env bash
# loom export end to end on tiny models trained here (no download; docs/FINETUNING.md, "Give it
# back"): a GPT-2 and a LLaMA model, 80 steps each on bytes of Tiny Shakespeare.
#   1. --format hf --dtype f32: model.safetensors is the checkpoint's byte for byte; the directory
#      gives loom eval the checkpoint's logits bit for bit and generate its greedy text; loom convert
#      of it gives the checkpoint's weights back; its tokenizer.json encodes as the byte tokenizer;
#      bf16 halves the weights and stays close.
#   2. --format gguf --type f32: the file gives the checkpoint's loss and greedy text and its
#      tokenizer the byte tokenizer's ids; f16, q8_0 and q4_1 load, generate, and stay close.
#   3. refusals, each naming the fix: an existing --out (kept), --force onto a directory that is not
#      an export (kept), unknown --format and --type, --type with hf and --dtype with gguf, a GGUF
#      file, a quantized checkpoint and a directory without a model as --checkpoint, MoE to GGUF.
# usage: export_cli_test.sh LOOM_BINARY SOURCE_DIR
set -euo pipefail
LOOM="$1"
SRC="$2"
WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT
source "$SRC/tests/infer/cli_helpers.sh"

refused_with() {  # refused_with STATUS TEXT CMD...: CMD exits with STATUS saying TEXT
  local want="$1" text="$2" rc=0 out; shift 2
  out="$("$@" 2>&1)" || rc=$?
  [ "$rc" = "$want" ] || { echo "$out"; fail "exit status $rc (expected $want) from: $*"; }
  grep -qF -- "$text" <<< "$out" || { echo "$out"; fail "no '$text' in the error of: $*"; }
}
# train NAME STEPS [--set KEY=VALUE]...: WORK/NAME, a model trained STEPS steps of 4 x 64 bytes on WORK/data.
train() {
  local name="$1" steps="$2"
  shift 2
  run "$WORK/$name.train.log" "$LOOM" train "$SRC/configs/shakespeare.yaml" --set data.dir="$WORK/data" \
    --set schedule.steps="$steps" --set data.batch_size=4 --set data.seq_len=64 --set checkpoint.dir="$WORK/$name" \
    --set log.metrics_path="$WORK/$name.jsonl" --set log.progress=off --set model.vocab_size=256 \
    --set schedule.warmup_steps=2 --set schedule.eval_batches=2 "$@"
}
loss_of() { grep '^SUMMARY ' "$1" | grep -o '"loss":[-0-9.e+]*' | cut -d: -f2; }
close() { awk -v a="$1" -v b="$2" -v t="$3" 'BEGIN { d = a - b; if (d < 0) d = -d; exit !(d <= t * (a < 0 ? -a : a)) }'; }

tiny_data
seq 0 3 255 | tr '\n' ' ' > "$WORK/ids.txt"
head -c 3000 "$SRC/data/tinyshakespeare/input.txt" | tail -c 1000 > "$WORK/text.txt"
"$LOOM" tokenize --tokenizer byte < "$WORK/text.txt" > "$WORK/text.byte.ids"
gen=(--prompt "ROMEO:" --max-tokens 40 --temperature 0)

for family in gpt2 llama; do
  train "$family" 80 --set model.preset=$family-tiny --set optim.lr=1e-2
  ck="$WORK/$family/step_000080"
  run "$WORK/$family.eval.log" "$LOOM" eval --checkpoint "$ck" --ids "$WORK/ids.txt" --logits-out "$WORK/$family.logits"
  want=$(loss_of "$WORK/$family.eval.log")
  "$LOOM" generate --checkpoint "$ck" "${gen[@]}" > "$WORK/$family.gen" 2>/dev/null

  # 1. Hugging Face.
  hf="$WORK/$family-hf"
  run "$WORK/$family.hf.log" "$LOOM" export --checkpoint "$WORK/$family" --format hf --out "$hf"
  grep -q '^SUMMARY .*"format":"hf"' "$WORK/$family.hf.log" || fail "$family: no SUMMARY"
  for f in config.json model.safetensors tokenizer.json tokenizer_config.json generation_config.json; do
    [ -f "$hf/$f" ] || fail "$family: the export has no $f"
  done
  cmp -s "$ck/model.safetensors" "$hf/model.safetensors" || fail "$family: model.safetensors differs from the checkpoint's"
  run "$WORK/$family.hfeval.log" "$LOOM" eval --model "$hf" --ids "$WORK/ids.txt" --logits-out "$WORK/$family.hf.logits"
  cmp -s "$WORK/$family.logits" "$WORK/$family.hf.logits" || fail "$family: the export's logits differ from the checkpoint's"
  "$LOOM" generate --model "$hf" "${gen[@]}" > "$WORK/$family.hf.gen" 2>/dev/null
  cmp -s "$WORK/$family.gen" "$WORK/$family.hf.gen" || fail "$family: greedy text differs: '$(cat "$WORK/$family.gen")' vs '$(cat "$WORK/$family.hf.gen")'"
  run "$WORK/$family.back.log" "$LOOM" convert --model "$hf" --out "$WORK/$family-back"
  cmp -s "$ck/model.safetensors" "$WORK/$family-back/model.safetensors" || fail "$family: converting the export back changed the weights"
  "$LOOM" tokenize --tokenizer "$hf" < "$WORK/text.txt" | cmp -s - "$WORK/text.byte.ids" ||
    fail "$family: the exported tokenizer.json does not encode as the byte tokenizer"
  run "$WORK/$family.bf16.log" "$LOOM" export --checkpoint "$ck" --format hf --dtype bf16 --out "$WORK/$family-bf16"
  grep -q '"torch_dtype": "bfloat16"' "$WORK/$family-bf16/config.json" || fail "$family: config.json does not say bfloat16"
  [ "$(stat -c %s "$WORK/$family-bf16/model.safetensors")" -lt "$(( $(stat -c %s "$hf/model.safetensors") * 6 / 10 ))" ] ||
    fail "$family: --dtype bf16 did not halve the weights"
  run "$WORK/$family.bf16eval.log" "$LOOM" eval --model "$WORK/$family-bf16" --ids "$WORK/ids.txt"
  close "$(loss_of "$WORK/$family.bf16eval.log")" "$want" 0.01 || fail "$family: bf16 loss $(loss_of "$WORK/$family.bf16eval.log") far from $want"

  # 2. GGUF.
  gg="$WORK/$family.gguf"
  run "$WORK/$family.gguf.log" "$LOOM" export --checkpoint "$ck" --format gguf --out "$gg"
  run "$WORK/$family.ggufeval.log" "$LOOM" eval --model "$gg" --ids "$WORK/ids.txt"
  got=$(loss_of "$WORK/$family.ggufeval.log")
  close "$got" "$want" 1e-6 || fail "$family: the GGUF's loss $got differs from the checkpoint's $want"
  "$LOOM" generate --model "$gg" "${gen[@]}" > "$WORK/$family.gguf.gen" 2>/dev/null
  cmp -s "$WORK/$family.gen" "$WORK/$family.gguf.gen" || fail "$family: the GGUF's greedy text differs"
  "$LOOM" tokenize --tokenizer "$gg" < "$WORK/text.txt" | cmp -s - "$WORK/text.byte.ids" ||
    fail "$family: the GGUF's tokenizer does not encode as the byte tokenizer"
  for type in f16 q8_0 q4_1; do
    run "$WORK/$family.$type.log" "$LOOM" export --checkpoint "$ck" --format gguf --type $type --out "$WORK/$family.$type.gguf"
    run "$WORK/$family.$type.eval.log" "$LOOM" eval --model "$WORK/$family.$type.gguf" --ids "$WORK/ids.txt"
    l=$(loss_of "$WORK/$family.$type.eval.log")
    close "$l" "$want" 0.05 || fail "$family $type: loss $l far from $want"
    run "$WORK/$family.$type.gen.log" "$LOOM" generate --model "$WORK/$family.$type.gguf" "${gen[@]}"
    echo "$family $type: $(stat -c %s "$WORK/$family.$type.gguf") bytes, loss $l (f32 $want)"
  done
  echo "$family: hf and gguf f32 give the checkpoint's logits/loss and greedy text '$(tr '\n' '|' < "$WORK/$family.gen")'"
done

# 3. Refusals.
ck="$WORK/llama"
refused_with 2 "[export] --out $WORK/llama-hf exists; give a new path, or --force to replace it" \
  "$LOOM" export --checkpoint "$ck" --format hf --out "$WORK/llama-hf"
run "$WORK/force.log" "$LOOM" export --checkpoint "$ck" --format hf --out "$WORK/llama-hf" --force
mkdir "$WORK/precious" && echo keep > "$WORK/precious/notes.txt"
refused_with 2 "is not a Hugging Face directory (no config.json); --force replaces only an earlier export or an empty directory" \
  "$LOOM" export --checkpoint "$ck" --format hf --out "$WORK/precious" --force
[ -f "$WORK/precious/notes.txt" ] || fail "--force removed a directory that was not an export"
refused_with 2 "[export] --format onnx is not supported; use hf or gguf" \
  "$LOOM" export --checkpoint "$ck" --format onnx --out "$WORK/x"
refused_with 2 "[export] --type q5_k is not supported; use f32, f16, bf16, q8_0, q5_1, q5_0, q4_1 or q4_0" \
  "$LOOM" export --checkpoint "$ck" --format gguf --type q5_k --out "$WORK/x.gguf"
refused_with 2 "[export] --type applies to --format gguf; for --format hf give --dtype" \
  "$LOOM" export --checkpoint "$ck" --format hf --type q8_0 --out "$WORK/x"
refused_with 2 "[export] --dtype applies to --format hf; for --format gguf give --type" \
  "$LOOM" export --checkpoint "$ck" --format gguf --dtype bf16 --out "$WORK/x.gguf"
refused_with 2 "[export] --dtype f64 is not supported; use f32, bf16 or f16" \
  "$LOOM" export --checkpoint "$ck" --format hf --dtype f64 --out "$WORK/x"
refused_with 2 "is a GGUF model, not a loom checkpoint; loom convert --model $WORK/llama.gguf --out DIR makes one" \
  "$LOOM" export --checkpoint "$WORK/llama.gguf" --format hf --out "$WORK/x"
run "$WORK/quantize.log" "$LOOM" quantize --checkpoint "$ck" --to int8 --out "$WORK/llama-int8"
refused_with 2 "is a quantized checkpoint (loom quantize); export the f32 checkpoint it was made from" \
  "$LOOM" export --checkpoint "$WORK/llama-int8" --format gguf --out "$WORK/x.gguf"
mkdir "$WORK/empty"
refused_with 1 "no valid checkpoint in $WORK/empty" "$LOOM" export --checkpoint "$WORK/empty" --format hf --out "$WORK/x"
refused_with 1 "does not exist" "$LOOM" export --checkpoint "$WORK/nothing" --format hf --out "$WORK/x"
train moe 2 --set model.preset=llama-moe-tiny
refused_with 1 "is a Mixture-of-Experts model (4 experts); GGUF export writes dense llama, qwen2 and gpt2 models: use --format hf" \
  "$LOOM" export --checkpoint "$WORK/moe" --format gguf --out "$WORK/moe.gguf"
[ ! -e "$WORK/moe.gguf" ] && [ ! -e "$WORK/x" ] && [ ! -e "$WORK/x.gguf" ] || fail "a refused export left a file behind"
run "$WORK/moe.hf.log" "$LOOM" export --checkpoint "$WORK/moe" --format hf --out "$WORK/moe-hf"
grep -q '"MixtralForCausalLM"' "$WORK/moe-hf/config.json" || fail "the MoE export is not a Mixtral config"
ls "$WORK" | grep -q '\.tmp' && fail "a temporary file or directory was left behind: $(ls "$WORK" | grep '\.tmp')"
echo "PASS"

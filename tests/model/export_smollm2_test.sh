#!/usr/bin/env bash
# loom export of a real model: SmolLM2-135M-Instruct (scripts/fetch-test-model.sh) converted to a
# loom checkpoint (`loom convert`, f32), then exported both ways (docs/FINETUNING.md, "Give it back"):
#   1. --format hf --dtype f32: model.safetensors is the checkpoint's byte for byte, and loom convert
#      of the directory gives them back; the directory's logits on the 37-token chat prompt are the
#      checkpoint's bit for bit; greedy text, plain and through the chat template, is the same;
#      its tokenizer.json (written from the GGUF vocabulary) encodes a text with special tokens to
#      the GGUF tokenizer's ids, and its tokenizer_config.json renders the chat template as the
#      GGUF's does;
#   2. --format gguf --type f32: the same logits bit for bit, greedy text, tokenizer ids and chat
#      prompt; q8_0 and q4_1 files load and answer;
#   3. a checkpoint fine-tuned from the GGUF (model.init_from, 2 steps) exports both ways, its
#      weights as they are, and both answer the chat question as the checkpoint does.
# Prints each file's size and each export's time. Skips (exit 77, "SKIPPED:") only when the model
# cannot be downloaded.
# usage: export_smollm2_test.sh LOOM_BINARY SOURCE_DIR
set -euo pipefail
LOOM="$1"
SRC="$2"
WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT
source "$SRC/tests/infer/cli_helpers.sh"

seconds_of() { grep '^SUMMARY ' "$1" | grep -o '"seconds":[0-9.e+-]*' | cut -d: -f2 | xargs printf '%.1f'; }
mb() { awk -v b="$(du -sb "$1" | cut -f1)" 'BEGIN { printf "%.1f MB", b / 1e6 }'; }

smollm2_or_skip
IDS="$SRC/tests/golden/smollm2/chat_prompt.ids"
CK="$WORK/smollm2"
run "$WORK/convert.log" "$LOOM" convert --model "$MODEL" --out "$CK"
run "$WORK/eval.log" "$LOOM" eval --checkpoint "$CK" --ids "$IDS" --logits-out "$WORK/ck.logits"
printf 'Thou art <|im_start|>user\nWhat is 2+2? 1234 caf\xc3\xa9 \xe6\x9d\xb1\xe4\xba\xac<|im_end|>\n' > "$WORK/text.txt"
"$LOOM" tokenize --special --tokenizer "$CK/tokenizer.gguf" < "$WORK/text.txt" > "$WORK/text.ids"
echo '[{"role": "user", "content": "What is the capital of France?"}]' > "$WORK/messages.json"
"$LOOM" chat-template --model "$MODEL" --messages "$WORK/messages.json" --now "2026-01-01 00:00:00" > "$WORK/prompt.txt"
plain=(--prompt "The capital of France is" --max-tokens 24 --temperature 0)
chat=(--chat --prompt "What is the capital of France?" --max-tokens 24 --temperature 0)
"$LOOM" generate --checkpoint "$CK" "${plain[@]}" > "$WORK/ck.plain" 2>/dev/null
"$LOOM" generate --checkpoint "$CK" "${chat[@]}" > "$WORK/ck.chat" 2>/dev/null
grep -qx "The capital of France is Paris." "$WORK/ck.chat" || fail "the checkpoint answers '$(cat "$WORK/ck.chat")'"

# same_as_checkpoint NAME MODEL: logits, greedy text, tokenizer ids and the chat prompt of MODEL are the checkpoint's.
same_as_checkpoint() {
  local name="$1" model="$2"
  run "$WORK/$name.eval.log" "$LOOM" eval --model "$model" --ids "$IDS" --logits-out "$WORK/$name.logits"
  cmp -s "$WORK/ck.logits" "$WORK/$name.logits" || fail "$name: logits differ from the checkpoint's"
  "$LOOM" generate --model "$model" "${plain[@]}" > "$WORK/$name.plain" 2>/dev/null
  cmp -s "$WORK/ck.plain" "$WORK/$name.plain" || fail "$name: greedy text '$(cat "$WORK/$name.plain")' differs"
  "$LOOM" generate --model "$model" "${chat[@]}" > "$WORK/$name.chat" 2> "$WORK/$name.chat.log"
  cmp -s "$WORK/ck.chat" "$WORK/$name.chat" || fail "$name: chat answer '$(cat "$WORK/$name.chat")' differs"
  grep -q "chat format the model's template" "$WORK/$name.chat.log" || fail "$name: the model's template was not used"
  "$LOOM" tokenize --special --tokenizer "$model" < "$WORK/text.txt" | cmp -s - "$WORK/text.ids" ||
    fail "$name: its tokenizer encodes the text differently"
  "$LOOM" chat-template --model "$model" --messages "$WORK/messages.json" --now "2026-01-01 00:00:00" |
    cmp -s - "$WORK/prompt.txt" || fail "$name: its chat template renders differently"
}

# 1. Hugging Face.
HF="$WORK/smollm2-hf"
run "$WORK/hf.log" "$LOOM" export --checkpoint "$CK" --format hf --out "$HF"
cat "$WORK/hf.log"
cmp -s "$CK/model.safetensors" "$HF/model.safetensors" || fail "model.safetensors differs from the checkpoint's"
same_as_checkpoint hf "$HF"
run "$WORK/back.log" "$LOOM" convert --model "$HF" --out "$WORK/back"
cmp -s "$CK/model.safetensors" "$WORK/back/model.safetensors" || fail "converting the export back changed the weights"
run "$WORK/hf_bf16.log" "$LOOM" export --checkpoint "$CK" --format hf --dtype bf16 --out "$WORK/smollm2-bf16"
"$LOOM" generate --model "$WORK/smollm2-bf16" "${chat[@]}" > "$WORK/bf16.chat" 2>/dev/null
echo "hf f32: $(mb "$HF") in $(seconds_of "$WORK/hf.log") s; hf bf16: $(mb "$WORK/smollm2-bf16") in" \
  "$(seconds_of "$WORK/hf_bf16.log") s, answers '$(cat "$WORK/bf16.chat")'"

# 2. GGUF.
run "$WORK/gguf.log" "$LOOM" export --checkpoint "$CK" --format gguf --out "$WORK/smollm2.gguf"
cat "$WORK/gguf.log"
same_as_checkpoint gguf "$WORK/smollm2.gguf"
echo "gguf f32: $(mb "$WORK/smollm2.gguf") in $(seconds_of "$WORK/gguf.log") s"
for type in q8_0 q4_1; do
  run "$WORK/$type.log" "$LOOM" export --checkpoint "$CK" --format gguf --type $type --out "$WORK/smollm2.$type.gguf"
  "$LOOM" generate --model "$WORK/smollm2.$type.gguf" "${chat[@]}" > "$WORK/$type.chat" 2>/dev/null
  [ -s "$WORK/$type.chat" ] || fail "$type: no answer"
  echo "gguf $type: $(mb "$WORK/smollm2.$type.gguf") in $(seconds_of "$WORK/$type.log") s, answers '$(cat "$WORK/$type.chat")'"
done

# 3. A fine-tuned checkpoint (2 steps from the GGUF at lr 1e-7, so that the answer stays the same
# text; tests/train/init_from_smollm2_test.sh says why), exported both ways.
head -c 20000 "$SRC/data/tinyshakespeare/input.txt" > "$WORK/in.txt"
run "$WORK/prepare.log" "$LOOM" prepare --input "$WORK/in.txt" --tokenizer "$MODEL" --out "$WORK/data"
run "$WORK/train.log" "$LOOM" train "$SRC/configs/finetune-smollm2.yaml" --set model.init_from="$MODEL" \
  --set data.dir="$WORK/data" --set data.seq_len=64 --set data.batch_size=2 --set data.micro_batch_size=2 \
  --set schedule.steps=2 --set optim.lr=1e-7 --set schedule.min_lr=1e-8 --set schedule.warmup_steps=1 \
  --set schedule.eval_interval=0 --set schedule.eval_batches=1 --set log.progress=off \
  --set checkpoint.dir="$WORK/ft" --set checkpoint.every_steps=2 --set log.metrics_path="$WORK/ft.jsonl"
cmp -s "$CK/model.safetensors" "$WORK/ft/step_000002/model.safetensors" && fail "the fine-tuned weights did not change"
run "$WORK/ft_hf.log" "$LOOM" export --checkpoint "$WORK/ft" --format hf --out "$WORK/ft-hf"
cmp -s "$WORK/ft/step_000002/model.safetensors" "$WORK/ft-hf/model.safetensors" ||
  fail "fine-tuned: model.safetensors differs from the checkpoint's"
run "$WORK/ft_gguf.log" "$LOOM" export --checkpoint "$WORK/ft" --format gguf --out "$WORK/ft.gguf"
"$LOOM" generate --checkpoint "$WORK/ft" "${chat[@]}" > "$WORK/ft.chat" 2>/dev/null
for m in "$WORK/ft-hf" "$WORK/ft.gguf"; do
  "$LOOM" generate --model "$m" "${chat[@]}" > "$WORK/ft.out" 2>/dev/null
  cmp -s "$WORK/ft.chat" "$WORK/ft.out" || fail "fine-tuned: $m answers '$(cat "$WORK/ft.out")', the checkpoint '$(cat "$WORK/ft.chat")'"
done
echo "fine-tuned checkpoint: both exports answer '$(cat "$WORK/ft.chat")' as the checkpoint does"
echo "PASS: the checkpoint, its Hugging Face export and its GGUF export answer '$(cat "$WORK/ck.chat")'"

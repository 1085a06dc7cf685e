#!/usr/bin/env bash
# model.init_from with a real model: SmolLM2-135M-Instruct's GGUF (scripts/fetch-test-model.sh)
# continues training on Tiny Shakespeare tokenized with its own tokenizer.
#   1. `loom prepare --tokenizer MODEL.gguf` records the model's 49152-token vocabulary;
#   2. refusals: an architecture key beside model.init_from, and byte-level data for it (the
#      error names the `loom prepare --tokenizer` that fixes it);
#   3. `loom train configs/finetune-smollm2.yaml`, 2 steps: the start-up line says the weights
#      were dequantized, the first loss is that of a trained model (a random one starts at
#      ln 49152 = 10.8 nats), and the checkpoint carries the model's tokenizer and chat template
#      (tokenizer.gguf, tokenizer_config.json) as `loom convert`'s do;
#   4. `loom generate --checkpoint --chat` on that checkpoint answers the France question as the
#      GGUF itself does through the model's template ("The capital of France is Paris.", as
#      smollm2_serve_test.sh checks of the file; without the template it answers "The answer is:
#      France"). The steps use lr 1e-7 so that the answer must be the same text: the greedy
#      answer of a 135M model is close enough to a tie that a few steps of Shakespeare at the
#      config's 3e-5 can change it.
# Skips (exit 77, "SKIPPED:") only when the model cannot be downloaded.
# usage: init_from_smollm2_test.sh LOOM_BINARY SOURCE_DIR
set -euo pipefail
LOOM="$1"
SRC="$2"
WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT
source "$SRC/tests/infer/cli_helpers.sh"

smollm2_or_skip

head -c 60000 "$SRC/data/tinyshakespeare/input.txt" > "$WORK/in.txt"
"$LOOM" prepare --input "$WORK/in.txt" --tokenizer "$MODEL" --out "$WORK/data" > "$WORK/prepare.out"
python3 - "$WORK/data/meta.json" "$MODEL" <<'PY'
import json, sys
m = json.load(open(sys.argv[1]))
assert m["vocab_size"] == 49152, m
assert m["tokenizer"] == sys.argv[2], m
PY
"$LOOM" prepare --input "$WORK/in.txt" --tokenizer byte --out "$WORK/bytes" > /dev/null

train=(train "$SRC/configs/finetune-smollm2.yaml" --set model.init_from="$MODEL" --set data.seq_len=64
       --set data.batch_size=2 --set data.micro_batch_size=2 --set schedule.steps=2 --set optim.lr=1e-7
       --set schedule.min_lr=1e-8 --set schedule.warmup_steps=1 --set schedule.eval_interval=0
       --set schedule.eval_batches=1 --set log.every=1 --set log.progress=off --set checkpoint.dir="$WORK/ck"
       --set checkpoint.every_steps=2 --set log.metrics_path="$WORK/m.jsonl")
refused "model.n_layer: the architecture comes from model.init_from=$MODEL; remove model.n_layer" \
  "$LOOM" "${train[@]}" --set data.dir="$WORK/data" --set model.n_layer=2
refused "holds tokens of a 256-token vocabulary, but model.init_from=$MODEL comes with a tokenizer of 49152 tokens ($MODEL); tokenize the text with it: loom prepare --tokenizer $MODEL" \
  "$LOOM" "${train[@]}" --set data.dir="$WORK/bytes"
[ ! -e "$WORK/ck" ] || { echo "a refused run left $WORK/ck behind"; exit 1; }

"$LOOM" "${train[@]}" --set data.dir="$WORK/data" > "$WORK/train.out" 2>&1 || { cat "$WORK/train.out"; exit 1; }
grep -q "^\[train\] weights from model.init_from=$MODEL (GGUF: .*dequantized to f32" "$WORK/train.out" ||
  { echo "no start-up line naming the source and the dequantization:"; cat "$WORK/train.out"; exit 1; }
python3 - "$WORK/m.jsonl" <<'PY'
import json, sys
steps = [json.loads(l) for l in open(sys.argv[1]) if '"loss"' in l]
first = steps[0]["loss"]
print(f"first loss {first:.3f} nats (a random model: 10.8)")
assert first < 6.0, f"the first loss {first} is not that of SmolLM2's weights"
PY
ck="$WORK/ck/step_000002"
grep -q '"tokenizer": "tokenizer.gguf"' "$ck/trainer_state.json" ||
  { echo "the checkpoint does not record the tokenizer it carries:"; cat "$ck/trainer_state.json"; exit 1; }
grep -q '"chat_template"' "$ck/tokenizer_config.json" && grep -q '"tokenizer.gguf"' "$ck/manifest.json" ||
  { echo "the checkpoint lacks the model's chat files:"; ls "$ck"; exit 1; }

"$LOOM" generate --checkpoint "$WORK/ck" --chat --prompt "What is the capital of France?" --temperature 0 \
  --max-tokens 12 > "$WORK/answer.txt" 2> "$WORK/generate.err" || { cat "$WORK/generate.err"; exit 1; }
grep -qx "The capital of France is Paris." "$WORK/answer.txt" ||
  { echo "the checkpoint answered '$(cat "$WORK/answer.txt")', not the GGUF's own answer"; exit 1; }
echo "init_from SmolLM2: ok"

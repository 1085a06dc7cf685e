#!/usr/bin/env bash
# Supervised fine-tuning of a real model on conversations, end to end (label `long`: about 15
# minutes on 2 cores, so `make test` leaves it to `make test-all` and CI):
#   1. `loom prepare --chat` renders data/zorblax's conversations about a made-up planet through
#      SmolLM2-135M-Instruct's chat template, training only the replies; the held-out phrasings
#      (heldout.jsonl, never in train.jsonl) are the validation split.
#   2. The held-out reply-token loss of the model as downloaded (one step at lr 0).
#   3. 81 steps (3 epochs) of full fine-tuning from model.init_from, pad layout: the held-out loss
#      must fall by at least half.
#   4. The fine-tuned checkpoint, through the chat template, answers held-out questions about
#      Zorblax correctly, and still answers "What is the capital of France?" with Paris.
# Skips (exit 77) only when the model cannot be downloaded.
# usage: sft_zorblax_test.sh LOOM_BINARY SOURCE_DIR
set -euo pipefail
LOOM="$1"
SRC="$2"
WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT
source "$SRC/tests/infer/cli_helpers.sh"
smollm2_or_skip

source "$SRC/data/zorblax/prepare.sh"
prepare_zorblax "$LOOM" "$MODEL" "$WORK"
grep -q "$((all - held)) + $held conversations through" "$WORK/prepare.out" || { cat "$WORK/prepare.out"; exit 1; }

train=(train "$SRC/configs/finetune-smollm2.yaml" --set model.init_from="$MODEL" --set data.dir="$WORK/data"
       --set data.chat_layout=pad --set data.seq_len=192 --set data.batch_size=8 --set data.micro_batch_size=4
       --set schedule.eval_batches=7 --set log.every=1 --set log.progress=off)
val_of() { python3 -c "import json,sys; print(json.loads(sys.argv[1][8:])['final_val_loss'])" "$(grep '^SUMMARY ' "$1")"; }

"$LOOM" "${train[@]}" --set schedule.steps=1 --set optim.lr=0 --set schedule.min_lr=0 \
  --set checkpoint.dir="$WORK/ck0" > "$WORK/before.out" 2>&1 || { tail -20 "$WORK/before.out"; exit 1; }
before=$(val_of "$WORK/before.out")
rm -rf "$WORK/ck0"
"$LOOM" "${train[@]}" --set schedule.steps=81 --set optim.lr=1e-4 --set schedule.min_lr=1e-5 \
  --set schedule.warmup_steps=8 --set schedule.eval_interval=27 --set checkpoint.dir="$WORK/ck" \
  --set checkpoint.every_steps=0 > "$WORK/sft.out" 2>&1 || { tail -20 "$WORK/sft.out"; exit 1; }
after=$(val_of "$WORK/sft.out")
grep 'val_loss' "$WORK/sft.out"
echo "held-out reply loss: $before before, $after after 81 steps"
python3 -c "import sys; b, a = float(sys.argv[1]), float(sys.argv[2]); sys.exit(0 if a <= b / 2 else 1)" \
  "$before" "$after" || { echo "FAIL: the held-out loss did not fall by half"; exit 1; }

ask() {  # ask QUESTION WORD: the greedy reply through the chat template must contain WORD
  local reply
  reply=$("$LOOM" generate --checkpoint "$WORK/ck" --chat --prompt "$1" --temperature 0 --max-tokens 40 2>/dev/null)
  echo "Q: $1 -> $reply"
  grep -qi -- "$2" <<< "$reply" || { echo "FAIL: the reply to '$1' lacks '$2'"; exit 1; }
}
ask "Name the capital city of Zorblax." "Quennith"
ask "How many moons does Zorblax have?" "three"
ask "What is the sun of Zorblax called?" "Kelmara"
ask "What is the capital of France?" "Paris"
echo PASS

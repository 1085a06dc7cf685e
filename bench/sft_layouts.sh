#!/usr/bin/env bash
# Packing against padding for chat fine-tuning (docs/FINETUNING.md, "Packing or padding"):
# SmolLM2-135M-Instruct fine-tuned on data/zorblax for the same number of epochs in each of
# data.chat_layout=pad (one conversation per row) and pack (whole conversations one after another
# in a row, each attending only to itself), rows of seq_len tokens, batch_size rows a step. Prints, per
# layout: steps, wall seconds, trained (reply) tokens per second, the held-out reply loss of the
# final checkpoint as `loom eval` computes it (one conversation per window, the same for both),
# and the greedy answers to three held-out questions and one general one.
#
# usage: [LAYOUTS="pack pad"] bench/sft_layouts.sh LOOM_BINARY [EPOCHS] [SEQ_LEN]   (defaults 3, 192)
# About 15 minutes on 2 cores (the pad run is most of it). Needs the model: scripts/fetch-test-model.sh.
set -euo pipefail
LOOM="$(realpath "$1")"
EPOCHS="${2:-3}"
T="${3:-192}"
SRC="$(cd "$(dirname "$0")/.." && pwd)"
WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT
MODEL="$(bash "$SRC/scripts/fetch-test-model.sh")" || { echo "[sft_layouts] SmolLM2's GGUF is not available"; exit 1; }
B=8

source "$SRC/data/zorblax/prepare.sh"
prepare_zorblax "$LOOM" "$MODEL" "$WORK"
# "trained tokens (assistant replies): R of N in train.bin"
read -r replies tokens < <(sed -n 's/.*: \([0-9]*\) of \([0-9]*\) in train.bin.*/\1 \2/p' "$WORK/prepare.out")
convs=$((all - held))
echo "[sft_layouts] $convs training conversations, $tokens tokens ($replies trained), seq_len $T, batch $B rows,"\
  "$EPOCHS epochs; $(nproc) cores"

run_layout() {  # LAYOUT STEPS
  local layout="$1" steps="$2" warm
  warm=$(( (steps + 9) / 10 ))
  local t0 t1
  t0=$(date +%s.%N)
  "$LOOM" train "$SRC/configs/finetune-smollm2.yaml" --set model.init_from="$MODEL" --set data.dir="$WORK/data" \
    --set data.chat_layout="$layout" --set data.seq_len="$T" --set data.batch_size=$B --set data.micro_batch_size=4 \
    --set schedule.steps="$steps" --set optim.lr=1e-4 --set schedule.min_lr=1e-5 --set schedule.warmup_steps=$warm \
    --set schedule.eval_interval=0 --set checkpoint.dir="$WORK/ck_$layout" --set checkpoint.every_steps=0 \
    --set log.every=1 --set log.progress=off > "$WORK/$layout.out" 2>&1 || { tail -20 "$WORK/$layout.out"; exit 1; }
  t1=$(date +%s.%N)
  local loss
  loss=$("$LOOM" eval --checkpoint "$WORK/ck_$layout" --data "$WORK/data" --split val --seq-len "$T" 2>/dev/null |
         sed -n 's/^SUMMARY //p' | python3 -c "import json,sys; print('%.4f' % json.load(sys.stdin)['loss'])")
  local secs
  secs=$(python3 -c "print('%.0f' % ($t1 - $t0))")
  echo "[sft_layouts] $layout: $steps steps in ${secs} s, $(python3 -c "print('%.0f' % ($EPOCHS * $replies / ($t1 - $t0)))")"\
    "trained tokens/s, held-out reply loss $loss"
  for q in "Name the capital city of Zorblax." "How many moons does Zorblax have?" \
           "What is the sun of Zorblax called?" "What is the capital of France?"; do
    echo "    Q: $q -> $("$LOOM" generate --checkpoint "$WORK/ck_$layout" --chat --prompt "$q" --temperature 0 \
      --max-tokens 40 2>/dev/null | tr '\n' ' ')"
  done
}

# pad: one conversation per row, so an epoch is convs / B steps; pack: an epoch is its rows / B
# (the training start-up line says how many rows the conversations packed into).
"$LOOM" train "$SRC/configs/finetune-smollm2.yaml" --set model.init_from="$MODEL" --set data.dir="$WORK/data" \
  --set data.chat_layout=pack --set data.seq_len="$T" --set data.batch_size=$B --set schedule.steps=1 \
  --set optim.lr=0 --set schedule.min_lr=0 --set schedule.eval_interval=0 --set checkpoint.dir="$WORK/probe" \
  --set log.progress=off > "$WORK/probe.out" 2>&1 || { tail -20 "$WORK/probe.out"; exit 1; }
rows=$(sed -n 's/.*packed into \([0-9]*\) rows.*/\1/p' "$WORK/probe.out" | head -1)
grep 'packed into' "$WORK/probe.out"
pad_steps=$(( (EPOCHS * convs + B - 1) / B ))
pack_steps=$(( (EPOCHS * rows + B - 1) / B ))
for layout in ${LAYOUTS:-pack pad}; do
  if [ "$layout" = pack ]; then run_layout pack "$pack_steps"; else run_layout pad "$pad_steps"; fi
done

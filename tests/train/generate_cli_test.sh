#!/usr/bin/env bash
# `loom generate` end to end: train a tiny byte-level model for a few steps, then sample from
# the checkpoint twice with the same seed (identical output) and once with another seed.
# Bad options are usage errors naming the option and its range; the KV cache is sized by the
# request, so a model whose full context needs more than the old fixed 64 MiB still generates,
# and a --kv-cache-mb cap too small is refused with the size needed.
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
# A prompt longer than the context is refused (an error, exit 1) with both numbers: the
# prompt's 400 tokens and the model's context of 128.
long="$(head -c 400 "$WORK/in.txt")"
rc=0
out="$("$LOOM" generate --checkpoint "$WORK/run" --prompt "$long" 2>&1)" || rc=$?
[ "$rc" = 1 ] || { echo "a 400-token prompt on a 128-token model exited $rc, expected 1: $out"; exit 1; }
want="[generate] the prompt is 400 tokens but the model's context is 128 tokens; shorten the prompt"
case "$out" in *"$want"*) ;; *) echo "refusal does not name both numbers; expected \"$want\" in: $out"; exit 1 ;; esac
# refused CHECKPOINT EXPECTED OPTIONS...: a usage error (exit 2) that says EXPECTED.
refused() {
  local ckpt="$1" want="$2" out rc=0
  shift 2
  out="$("$LOOM" generate --checkpoint "$ckpt" --prompt "ROMEO:" "$@" 2>&1)" || rc=$?
  [ "$rc" = 2 ] || { echo "generate $* exited $rc, expected a usage error (2): $out"; exit 1; }
  case "$out" in *"$want"*) ;; *) echo "generate $*: expected \"$want\" in: $out"; exit 1 ;; esac
}
refused "$WORK/run" "[generate] --max-tokens must be at least 1, got 0" --max-tokens 0
refused "$WORK/run" "[generate] --max-tokens must be at least 1, got -5" --max-tokens -5
refused "$WORK/run" "[generate] --temperature must be between 0 and 2 (0: greedy), got -1" --temperature -1
refused "$WORK/run" "[generate] --top-p must be greater than 0 and at most 1, got 1.5" --top-p 1.5
refused "$WORK/run" "[generate] --top-k must be a positive integer, or 0 or -1 for no limit, got -2" --top-k -2
# Context 16384: its full context needs 96 MiB of KV cache (4 layers x 2 x 192 x 4 bytes a
# token), more than the 64 MiB generate used to allocate whatever the request.
"$LOOM" train "$SRC/configs/shakespeare.yaml" --set data.dir="$WORK/data" --set schedule.steps=2 \
  --set data.batch_size=2 --set data.seq_len=64 --set model.n_ctx=16384 --set checkpoint.dir="$WORK/long" \
  --set log.metrics_path="$WORK/m_long.jsonl" --set log.progress=off > /dev/null
d="$("$LOOM" generate --checkpoint "$WORK/long" --prompt "ROMEO:" --max-tokens 20 --seed 1 --kv-cache-mb 1 2>/dev/null)"
[ "${d:0:6}" = "ROMEO:" ] || { echo "the long-context model did not generate: $d"; exit 1; }
refused "$WORK/long" "[generate] --kv-cache-mb 64 is too small: 16006 tokens (the prompt's 6 + --max-tokens 16000, at most the model's context of 16384) need 93.84 MiB of KV cache; give --kv-cache-mb 94 or more" \
  --max-tokens 16000 --kv-cache-mb 64
echo "generate: deterministic per seed (${#a} bytes), long prompts and bad options refused, KV cache sized by the request"

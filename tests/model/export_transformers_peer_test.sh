#!/usr/bin/env bash
# Hugging Face transformers loads the directories `loom export --format hf` writes, and computes
# what loom computes: tiny GPT-2 and LLaMA models trained here (byte tokenizer) and, when it can be
# fetched, SmolLM2-135M-Instruct converted to a loom checkpoint (GGUF tokenizer written as
# tokenizer.json). For each, with AutoModelForCausalLM and AutoTokenizer (bench/peers/
# setup_transformers.sh: transformers 4.44 on Debian's PyTorch, eager attention, float32):
#   - the logits of a list of ids are loom's (`loom eval --logits-out` on the same directory)
#     within 1e-4 of their largest magnitude, and the argmax is the same at every position;
#   - AutoTokenizer encodes a text with special-token texts to the ids `loom tokenize --special`
#     gives, and decodes them back;
#   - for SmolLM2, apply_chat_template renders the prompt `loom chat-template` renders.
# Skips (exit 77, "SKIPPED:") when transformers cannot be installed (no PyTorch for the system's
# python3, or no package index).
# usage: export_transformers_peer_test.sh LOOM_BINARY SOURCE_DIR BUILD_DIR
set -euo pipefail
LOOM="$1"
SRC="$2"
BUILD="$3"
VENV="$BUILD/peers/transformers-venv"
WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT
source "$SRC/tests/infer/cli_helpers.sh"

transformers_or_skip "$VENV"

# The models: NAME DIR IDS TEXT [chat]
tiny_data
printf 'ROMEO:\nWhat say you, caf\xc3\xa9?' > "$WORK/byte.txt"
seq 1 4 250 | tr '\n' ' ' > "$WORK/byte.ids"
cases=()
for family in gpt2 llama; do
  run "$WORK/$family.train.log" "$LOOM" train "$SRC/configs/shakespeare.yaml" --set data.dir="$WORK/data" \
    --set schedule.steps=40 --set data.batch_size=4 --set data.seq_len=64 --set checkpoint.dir="$WORK/$family" \
    --set log.metrics_path="$WORK/$family.jsonl" --set log.progress=off --set model.vocab_size=256 \
    --set model.preset=$family-tiny --set optim.lr=1e-2 --set schedule.warmup_steps=2 --set schedule.eval_batches=2
  run "$WORK/$family.export.log" "$LOOM" export --checkpoint "$WORK/$family" --format hf --out "$WORK/$family-hf"
  cases+=("$family $WORK/$family-hf $WORK/byte.ids $WORK/byte.txt")
done
rc=0
MODEL="$(bash "$SRC/scripts/fetch-test-model.sh" 2> "$WORK/fetch.log")" || rc=$?
if [ $rc -eq 0 ]; then
  run "$WORK/convert.log" "$LOOM" convert --model "$MODEL" --out "$WORK/smollm2"
  run "$WORK/smollm2.export.log" "$LOOM" export --checkpoint "$WORK/smollm2" --format hf --out "$WORK/smollm2-hf"
  printf 'Thou art <|im_start|>user\nWhat is 2+2? 1234 caf\xc3\xa9 \xe6\x9d\xb1\xe4\xba\xac<|im_end|>\n' > "$WORK/smollm2.txt"
  cases+=("smollm2 $WORK/smollm2-hf $SRC/tests/golden/smollm2/chat_prompt.ids $WORK/smollm2.txt chat")
else
  echo "note: SmolLM2 cannot be fetched ($(tail -n 1 "$WORK/fetch.log")); only the tiny models are compared"
fi
echo '[{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is the capital of France?"}]' \
  > "$WORK/messages.json"

for c in "${cases[@]}"; do
  read -r name dir ids text chat <<< "$c"
  run "$WORK/$name.eval.log" "$LOOM" eval --model "$dir" --ids "$ids" --logits-out "$WORK/$name.logits"
  "$LOOM" tokenize --special --tokenizer "$dir" < "$text" > "$WORK/$name.text.ids"
  if [ -n "${chat:-}" ]; then
    "$LOOM" chat-template --model "$dir" --messages "$WORK/messages.json" --now "2026-01-01 00:00:00" > "$WORK/$name.prompt"
  else
    : > "$WORK/$name.prompt"
  fi
  "$VENV/bin/python" - "$name" "$dir" "$ids" "$WORK/$name.logits" "$text" "$WORK/$name.text.ids" \
    "$WORK/messages.json" "$WORK/$name.prompt" <<'PY'
import json, sys, warnings
warnings.filterwarnings("ignore")
import numpy as np
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, logging
logging.set_verbosity_error()

name, d, ids_path, logits_path, text_path, text_ids_path, messages_path, prompt_path = sys.argv[1:]
ids = [int(t) for t in open(ids_path).read().split()]
model = AutoModelForCausalLM.from_pretrained(d, torch_dtype=torch.float32, attn_implementation="eager").eval()
with torch.no_grad():
    ref = model(torch.tensor([ids])).logits[0].double().numpy()
got = np.fromfile(logits_path, dtype="<f4").astype(np.float64)
if got.size != ref.size:
    sys.exit(f"{name}: loom wrote {got.size} logits, transformers has {ref.shape}")
got = got.reshape(ref.shape)
scale = float(np.abs(ref).max())
diff = float(np.abs(got - ref).max())
agree = int((got.argmax(1) == ref.argmax(1)).sum())
print(f"{name}: {type(model).__name__}, {ref.shape[0]} positions x {ref.shape[1]} logits: max |loom - transformers| "
      f"{diff:.3e} ({diff / scale:.2e} of the largest {scale:.3f}), argmax equal at {agree} of {ref.shape[0]}")
bad = []
if diff > 1e-4 * scale:
    bad.append(f"logits differ by {diff:.3e}, over 1e-4 of {scale:.3f}")
if agree != ref.shape[0]:
    bad.append(f"argmax differs at {ref.shape[0] - agree} positions")

tok = AutoTokenizer.from_pretrained(d)
text = open(text_path, "rb").read().decode("utf-8")
want = [int(t) for t in open(text_ids_path).read().split()]
enc = tok(text, add_special_tokens=True).input_ids
if enc != want:
    bad.append(f"AutoTokenizer ({type(tok).__name__}) encodes the text as {enc[:20]}..., loom as {want[:20]}...")
if tok.decode(want) != text:
    bad.append(f"AutoTokenizer decodes loom's ids as {tok.decode(want)!r}, not {text!r}")
prompt = open(prompt_path, "rb").read().decode("utf-8")
if prompt:
    messages = json.load(open(messages_path))
    rendered = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    if rendered != prompt:
        bad.append(f"apply_chat_template renders {rendered!r}, loom {prompt!r}")
    print(f"{name}: apply_chat_template renders loom's prompt ({len(prompt)} bytes)")
print(f"{name}: AutoTokenizer gives loom's {len(want)} ids and decodes them back")
if bad:
    sys.exit(f"{name}: " + "; ".join(bad))
PY
done
echo "PASS"

#!/usr/bin/env bash
# llama.cpp runs the GGUFs loom exports (`loom export --format gguf --type f32`), through
# llama-cpp-python (bench/peers/setup_llama_cpp.sh; F32 KV cache, no flash attention):
#   - tiny GPT-2 and LLaMA models trained here on bytes: llama.cpp's logits are loom's, and its
#     tokenizer gives the byte tokenizer's ids;
#   - SmolLM2-135M-Instruct (scripts/fetch-test-model.sh) converted to a loom checkpoint and
#     exported; for three plain prompts and one chat prompt rendered by the model's template:
#       llama.cpp's tokenizer gives the prompt the ids loom's does (the exported tokenizer keys);
#       llama.cpp's greedy tokens, up to 32 or an end-of-generation token, are the tokens loom's
#       logits pick at every step of the same sequence (`loom eval --logits-out`), and decode to
#       the text `loom generate --temperature 0` prints from the checkpoint.
# Skips (exit 77, "SKIPPED:") when the model or the peer cannot be had.
# usage: export_llama_cpp_peer_test.sh LOOM_BINARY SOURCE_DIR BUILD_DIR
set -euo pipefail
LOOM="$1"
SRC="$2"
BUILD="$3"
VENV="$BUILD/peers/llama-venv"
WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT
source "$SRC/tests/infer/cli_helpers.sh"
. "$SRC/tests/infer/llama_cpp_peer_venv.sh"

ensure_llama_peer "$VENV" "$SRC" "$WORK"

# Tiny GPT-2 and LLaMA models trained here on bytes, exported as F32 GGUF: llama.cpp's logits of 64
# ids are loom's within the bounds of tests/model/gguf_arch_peer_test.sh (1e-4 of the largest, 2e-3
# for GPT-2, whose GELU llama.cpp takes from an f16 table), the same argmax everywhere, and its
# tokenizer gives a text the byte tokenizer's ids.
tiny_data
seq 1 4 255 | tr '\n' ' ' > "$WORK/byte.ids"
printf 'ROMEO:\nWhat say you, caf\xc3\xa9?' > "$WORK/byte.txt"
"$LOOM" tokenize --tokenizer byte < "$WORK/byte.txt" > "$WORK/byte.txt.ids"
for family in gpt2 llama; do
  "$LOOM" train "$SRC/configs/shakespeare.yaml" --set data.dir="$WORK/data" --set schedule.steps=40 \
    --set data.batch_size=4 --set data.seq_len=64 --set checkpoint.dir="$WORK/$family" \
    --set log.metrics_path="$WORK/$family.jsonl" --set log.progress=off --set model.vocab_size=256 \
    --set model.preset=$family-tiny --set optim.lr=1e-2 --set schedule.warmup_steps=2 --set schedule.eval_batches=2 \
    > "$WORK/$family.train.log" 2>&1 || { cat "$WORK/$family.train.log"; fail "$family: train"; }
  "$LOOM" export --checkpoint "$WORK/$family" --format gguf --out "$WORK/$family.gguf" > "$WORK/$family.export.log" 2>&1 ||
    { cat "$WORK/$family.export.log"; fail "$family: export"; }
  "$LOOM" eval --model "$WORK/$family.gguf" --ids "$WORK/byte.ids" --logits-out "$WORK/$family.logits" \
    > "$WORK/$family.eval.log" 2>&1 || { cat "$WORK/$family.eval.log"; fail "$family: eval"; }
  "$VENV/bin/python" - "$WORK/$family.gguf" "$WORK/byte.ids" "$WORK/$family.logits" "$WORK/byte.txt" \
    "$WORK/byte.txt.ids" "$family" <<'PY'
import sys
import numpy as np
from llama_cpp import Llama

path, ids_path, logits_path, text_path, text_ids_path, family = sys.argv[1:]
ids = [int(t) for t in open(ids_path).read().split()]
llm = Llama(model_path=path, logits_all=True, n_ctx=64, n_threads=2, type_k=0, type_v=0, flash_attn=False,
            verbose=False)
llm.eval(ids)
ref = np.asarray(llm.scores[: len(ids)], dtype=np.float64)
got = np.fromfile(logits_path, dtype="<f4").astype(np.float64).reshape(ref.shape)
scale, diff = float(np.abs(ref).max()), float(np.abs(got - ref).max())
agree = int((got.argmax(1) == ref.argmax(1)).sum())
rel = 2e-3 if family == "gpt2" else 1e-4
print(f"{family}: llama.cpp's logits of {len(ids)} ids within {diff / scale:.2e} of the largest ({scale:.3f}) of "
      f"loom's, argmax equal at {agree} of {len(ids)}")
bad = []
if diff > rel * scale:
    bad.append(f"logits differ by {diff:.3e}, over {rel:g} of {scale:.3f}")
if agree != len(ids):
    bad.append(f"argmax differs at {len(ids) - agree} positions")
text_ids = llm.tokenize(open(text_path, "rb").read(), add_bos=False, special=False)
want = [int(t) for t in open(text_ids_path).read().split()]
if text_ids != want:
    bad.append(f"llama.cpp tokenizes the text as {text_ids}, loom's byte tokenizer as {want}")
if bad:
    sys.exit(f"{family}: " + "; ".join(bad))
PY
done

# SmolLM2-135M-Instruct.
smollm2_or_skip

"$LOOM" convert --model "$MODEL" --out "$WORK/ck" > "$WORK/convert.log" 2>&1 || { cat "$WORK/convert.log"; fail "convert"; }
"$LOOM" export --checkpoint "$WORK/ck" --format gguf --out "$WORK/smollm2.gguf" > "$WORK/export.log" 2>&1 ||
  { cat "$WORK/export.log"; fail "export"; }
grep '^\[export\]' "$WORK/export.log"

# Each case: a name, whether it is a chat, and the prompt (a chat's is what the template renders).
echo '[{"role": "user", "content": "What is the capital of France?"}]' > "$WORK/messages.json"
"$LOOM" chat-template --model "$WORK/smollm2.gguf" --messages "$WORK/messages.json" > "$WORK/chat.prompt"
printf 'The capital of France is' > "$WORK/capital.prompt"
printf 'def fibonacci(n):' > "$WORK/code.prompt"
printf 'Once upon a time, in a small village,' > "$WORK/story.prompt"
N=32
for c in capital code story chat; do
  "$LOOM" tokenize --special --tokenizer "$WORK/smollm2.gguf" < "$WORK/$c.prompt" > "$WORK/$c.loom_prompt.ids"
  if [ "$c" = chat ]; then
    "$LOOM" generate --checkpoint "$WORK/ck" --chat --prompt "What is the capital of France?" --temperature 0 \
      --max-tokens $N > "$WORK/$c.loom.txt" 2>/dev/null
  else
    "$LOOM" generate --checkpoint "$WORK/ck" --prompt "$(cat "$WORK/$c.prompt")" --temperature 0 --max-tokens $N \
      > "$WORK/$c.loom.txt" 2>/dev/null
  fi
done

# llama.cpp: prompt ids, greedy ids and their text (what loom generate prints: a plain prompt
# followed by its continuation, a chat's reply alone, then a newline).
"$VENV/bin/python" - "$WORK" "$N" <<'PY'
import sys
import numpy as np
import llama_cpp
from llama_cpp import Llama

work, n = sys.argv[1], int(sys.argv[2])
llm = Llama(model_path=f"{work}/smollm2.gguf", n_ctx=512, n_threads=2, type_k=0, type_v=0, flash_attn=False,
            verbose=False)
vocab = llm.n_vocab()
for case in ("capital", "code", "story", "chat"):
    prompt = open(f"{work}/{case}.prompt", "rb").read()
    ids = llm.tokenize(prompt, add_bos=False, special=True)
    llm.reset()
    llm.eval(ids)
    out = []
    for _ in range(n):
        logits = np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(llm.ctx, -1), shape=(vocab,))
        tok = int(np.argmax(logits))
        if llama_cpp.llama_vocab_is_eog(llama_cpp.llama_model_get_vocab(llm.model), tok):
            break
        out.append(tok)
        llm.eval([tok])
    open(f"{work}/{case}.peer_prompt.ids", "w").write(" ".join(map(str, ids)) + "\n")
    open(f"{work}/{case}.peer.ids", "w").write(" ".join(map(str, out)) + "\n")
    text = llm.detokenize(out)
    open(f"{work}/{case}.peer.txt", "wb").write((text if case == "chat" else prompt + text) + b"\n")
PY

for c in capital code story chat; do
  cmp -s "$WORK/$c.loom_prompt.ids" "$WORK/$c.peer_prompt.ids" ||
    fail "$c: prompt ids differ: loom $(cat "$WORK/$c.loom_prompt.ids"), llama.cpp $(cat "$WORK/$c.peer_prompt.ids")"
  # loom's logits over the prompt and llama.cpp's tokens: the argmax after each prefix.
  cat "$WORK/$c.peer_prompt.ids" "$WORK/$c.peer.ids" | tr '\n' ' ' > "$WORK/$c.all.ids"
  "$LOOM" eval --checkpoint "$WORK/ck" --ids "$WORK/$c.all.ids" --logits-out "$WORK/$c.logits" > "$WORK/$c.eval.log" 2>&1 ||
    { cat "$WORK/$c.eval.log"; fail "$c: loom eval"; }
  python3 - "$WORK/$c.logits" "$WORK/$c.peer_prompt.ids" "$WORK/$c.peer.ids" "$c" <<'PY'
import sys
from array import array
logits_path, prompt_path, peer_path, case = sys.argv[1:]
prompt = [int(t) for t in open(prompt_path).read().split()]
peer = [int(t) for t in open(peer_path).read().split()]
raw = array("f")
raw.frombytes(open(logits_path, "rb").read())
V = 49152
rows = len(raw) // V
picks = [max(range(V), key=raw[r * V:(r + 1) * V].__getitem__) for r in range(len(prompt) - 1, rows)]
if picks[:len(peer)] != peer:
    first = next(i for i, (a, b) in enumerate(zip(picks, peer)) if a != b)
    sys.exit(f"{case}: loom picks {picks[first]} where llama.cpp picked {peer[first]} (greedy step {first} of {len(peer)})")
print(f"{case}: llama.cpp's {len(peer)} greedy tokens are loom's picks at every step")
PY
  cmp -s "$WORK/$c.loom.txt" "$WORK/$c.peer.txt" ||
    fail "$c: loom generate printed '$(cat "$WORK/$c.loom.txt")', llama.cpp '$(cat "$WORK/$c.peer.txt")'"
  echo "$c: same text: $(tr '\n' '|' < "$WORK/$c.peer.txt")"
done
echo "PASS"

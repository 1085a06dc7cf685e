#!/usr/bin/env bash
# The llama.cpp peer of `loom bench infer`: bad input is refused first; then (building the peer
# with bench/peers/setup_llama_cpp.sh when BUILD/peers/llama-venv is not ready: PyPI's
# llama-cpp-python compiles llama.cpp, about 5 minutes on 2 cores) a tiny GPT-2 trained for a
# few steps is written as GGUF F32/Q8_0/Q4_0, both engines run every precision, and loom's
# greedy tokens must equal llama.cpp's at F32 token for token. Skips (exit 77, "SKIPPED:")
# only when the peer cannot be installed (no python3 venv, no network to PyPI).
# usage: llama_cpp_peer_test.sh LOOM_BINARY SOURCE_DIR BUILD_DIR
set -euo pipefail
LOOM="$1"
SRC="$2"
BUILD="$3"
VENV="$BUILD/peers/llama-venv"
WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT

expect_error() {  # expect_error "message part" args...
  local want="$1"; shift
  if "$LOOM" bench infer "$@" > "$WORK/err.log" 2>&1; then
    echo "bench infer $* should have failed"; exit 1
  fi
  grep -qF -- "$want" "$WORK/err.log" || { echo "bench infer $*: expected \"$want\" in:"; cat "$WORK/err.log"; exit 1; }
}
expect_error "only 'llama.cpp' is supported" --peer vllm --model gpt2-tiny
expect_error "runs GPT-2-family models" --peer llama.cpp --model llama-tiny --peer-venv "$WORK/none"
expect_error "choose them with --precisions" --peer llama.cpp --model gpt2-tiny --quant int8 --peer-venv "$WORK/none"
expect_error "is not fp32, bf16, int8 or int4" --peer llama.cpp --model gpt2-tiny --precisions fp16 --peer-venv "$WORK/none"
expect_error "goes with --peer llama.cpp" --model gpt2-tiny --rounds 2

if [ ! -f "$VENV"/.loom-peer-ready-* ] 2>/dev/null; then
  command -v python3 >/dev/null || { echo "SKIPPED: python3 is not installed"; exit 77; }
  python3 -c 'import venv, ensurepip' 2>/dev/null || { echo "SKIPPED: python3 venv/ensurepip missing (apt-get install python3-venv)"; exit 77; }
  echo "building the llama.cpp peer into $VENV (about 5 minutes on 2 cores)"
  if ! timeout 1500 bash "$SRC/bench/peers/setup_llama_cpp.sh" "$VENV"; then
    if ! timeout 20 "$VENV/bin/pip" download --no-deps -q -d "$WORK/probe" "gguf==0.19.0" >/dev/null 2>&1; then
      echo "SKIPPED: PyPI is not reachable, so llama-cpp-python cannot be installed"; exit 77
    fi
    echo "building the llama.cpp peer failed although PyPI is reachable"; exit 1
  fi
fi

head -c 60000 "$SRC/data/tinyshakespeare/input.txt" > "$WORK/in.txt"
"$LOOM" prepare --input "$WORK/in.txt" --tokenizer byte --out "$WORK/data" > /dev/null
"$LOOM" train "$SRC/configs/shakespeare.yaml" --set data.dir="$WORK/data" --set schedule.steps=40 \
  --set data.batch_size=8 --set data.seq_len=64 --set checkpoint.dir="$WORK/run" \
  --set log.metrics_path="$WORK/m.jsonl" --set log.progress=off > /dev/null

"$LOOM" bench infer --peer llama.cpp --checkpoint "$WORK/run" --threads 2 --rounds 1 --batch1-tokens 8 \
  --prefill-tokens 64 --compare-tokens 48 --peer-venv "$VENV" > "$WORK/bench.log" 2> "$WORK/bench.err" ||
  { cat "$WORK/bench.log" "$WORK/bench.err"; exit 1; }
cat "$WORK/bench.log"
grep '^SUMMARY' "$WORK/bench.log" | sed 's/^SUMMARY //' > "$WORK/summary.json"
python3 - "$WORK/summary.json" <<'PY'
import json, sys
s = json.load(open(sys.argv[1]))
bad = []
for p in ("fp32", "int8", "int4"):
    for k in ("batch1_tokens_per_s", "peer_batch1_tokens_per_s", "prefill_tokens_per_s", "peer_prefill_tokens_per_s"):
        if not s.get(f"{p}_{k}", 0) > 0:
            bad.append(f"{p}_{k} missing or not positive")
n, eq = s.get("greedy_tokens_compared"), s.get("greedy_tokens_equal")
if n != 48 or eq != n:
    bad.append(f"greedy tokens differ from llama.cpp at F32: {eq} of {n} equal, "
               f"first difference at {s.get('greedy_first_difference')}")
if bad:
    sys.exit("\n".join(bad))
print("llama.cpp peer: all precisions ran; 48 greedy tokens equal at F32")
PY
[ -z "$(ls -d "$BUILD"/peers/run-* 2>/dev/null)" ] || { echo "bench infer left its GGUF files behind"; exit 1; }

#!/usr/bin/env bash
# The llama.cpp peer of `loom bench infer`: bad input is refused first; then (building the peer
# with bench/peers/setup_llama_cpp.sh when BUILD/peers/llama-venv is not ready: PyPI's
# llama-cpp-python compiles llama.cpp, about 5 minutes on 2 cores) a tiny GPT-2 trained for a
# few steps is written as GGUF F32/Q8_0/Q4_0, both engines run every precision, and loom's
# greedy tokens must equal llama.cpp's at F32 token for token. Skips (exit 77, "SKIPPED:")
# only when the peer cannot be installed (no python3 venv, no network to PyPI). A GGUF file
# run as it is: llama_cpp_peer_gguf_test.sh. With BUILD/peers/llama-venv-avx2 built, the AVX2
# peer (--peer-isa avx2) runs too.
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
expect_error "goes with --peer llama.cpp" --model gpt2-tiny --ppl-text "$SRC/README.md"
expect_error "needs a model with a tokenizer" --peer llama.cpp --model gpt2-tiny --ppl-text "$SRC/README.md" --peer-venv "$WORK/none"
expect_error "goes with --peer llama.cpp" --model gpt2-tiny --peer-isa avx2
expect_error "--peer-isa" --peer llama.cpp --model gpt2-tiny --peer-isa avx512 --peer-venv "$WORK/none"
# The setup script: an unknown ISA, and one ISA's build over the other's venv, are refused.
expect_setup_error() {  # expect_setup_error "message part" args...
  local want="$1"; shift
  if bash "$SRC/bench/peers/setup_llama_cpp.sh" "$@" > "$WORK/err.log" 2>&1; then
    echo "setup_llama_cpp.sh $* should have failed"; exit 1
  fi
  grep -qF -- "$want" "$WORK/err.log" || { echo "setup_llama_cpp.sh $*: expected \"$want\" in:"; cat "$WORK/err.log"; exit 1; }
}
expect_setup_error "is not native or avx2" "$WORK/venv-x" avx512
mkdir -p "$WORK/venv-native" && touch "$WORK/venv-native/.loom-peer-ready-noamx-0.3.36-0.19.0"
expect_setup_error "holds the native build" "$WORK/venv-native" avx2

. "$SRC/tests/infer/llama_cpp_peer_venv.sh"
ensure_llama_peer "$VENV" "$SRC" "$WORK"

head -c 60000 "$SRC/data/tinyshakespeare/input.txt" > "$WORK/in.txt"
"$LOOM" prepare --input "$WORK/in.txt" --tokenizer byte --out "$WORK/data" > /dev/null
"$LOOM" train "$SRC/configs/shakespeare.yaml" --set data.dir="$WORK/data" --set schedule.steps=40 \
  --set data.batch_size=8 --set data.seq_len=64 --set checkpoint.dir="$WORK/run" \
  --set log.metrics_path="$WORK/m.jsonl" --set log.progress=off > /dev/null

"$LOOM" bench infer --peer llama.cpp --checkpoint "$WORK/run" --threads 2 --rounds 1 --batch1-tokens 8 \
  --prefill-tokens 64 --compare-tokens 48 --ppl-text "$WORK/in.txt" --ppl-seq-len 64 --ppl-max-windows 2 \
  --peer-venv "$VENV" > "$WORK/bench.log" 2> "$WORK/bench.err" ||
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
# Perplexity: the same F32 weights and ids on both sides, so the same figure to rounding.
fp32, peer = s.get("fp32_ppl", 0), s.get("peer_ppl", 0)
if not (fp32 > 0 and peer > 0 and abs(fp32 / peer - 1) < 1e-3 and s.get("ppl_tokens") == 128):
    bad.append(f"perplexity at F32: loom {fp32}, llama.cpp {peer} over {s.get('ppl_tokens')} tokens; "
               "expected equal within 0.1% over 128")
if s.get("peer_isa") != "native" or not s.get("loom_isa"):
    bad.append(f"peer_isa {s.get('peer_isa')!r} (expected 'native'), loom_isa {s.get('loom_isa')!r}")
if not (s.get("int8_loom_linears") and s.get("int4_loom_linears")) or "fp32_loom_linears" in s:
    bad.append("expected int8_loom_linears and int4_loom_linears (loom's quantized-linear paths), none for fp32")
if bad:
    sys.exit("\n".join(bad))
print(f"llama.cpp peer: all precisions ran; 48 greedy tokens equal at F32; perplexity {fp32:.4f} / {peer:.4f}")
PY
grep -q '^  loom int4 .*: quantized linears .*, other kernels ' "$WORK/bench.log" ||
  { echo "bench infer did not print loom's kernels for int4"; exit 1; }

# The AVX2 peer (--peer-isa avx2, LOOM_ISA=avx2), when BUILD/peers/llama-venv-avx2 is built
# (bench/peers/setup_llama_cpp.sh VENV avx2; not built here, it takes minutes): its system info
# lists no AVX-512, AVX-VNNI or AMX, and greedy tokens still equal llama.cpp's at F32.
if grep -qw avx2 /proc/cpuinfo && ls "$BUILD"/peers/llama-venv-avx2/.loom-peer-ready-avx2-* >/dev/null 2>&1; then
  LOOM_ISA=avx2 "$LOOM" bench infer --peer llama.cpp --peer-isa avx2 --checkpoint "$WORK/run" --threads 2 \
    --rounds 1 --batch1-tokens 8 --prefill-tokens 64 --compare-tokens 48 --precisions fp32,int8 \
    > "$WORK/avx2.log" 2> "$WORK/avx2.err" || { cat "$WORK/avx2.log" "$WORK/avx2.err"; exit 1; }
  grep -q '^peer: llama.cpp via llama-cpp-python built for AVX2' "$WORK/avx2.log" &&
    grep '^peer: llama-cpp-python' "$WORK/avx2.log" | grep -q 'AVX2 = 1' &&
    ! grep '^peer: llama-cpp-python' "$WORK/avx2.log" | grep -qE 'AVX512|AVX_VNNI|AMX' ||
    { echo "--peer-isa avx2: expected an AVX2-only peer in:"; cat "$WORK/avx2.log"; exit 1; }
  grep -q '^SUMMARY .*"peer_isa":"avx2","loom_isa":"avx2".*"greedy_tokens_compared":48,"greedy_tokens_equal":48,' \
    "$WORK/avx2.log" || { echo "--peer-isa avx2: unexpected SUMMARY in:"; cat "$WORK/avx2.log"; exit 1; }
  echo "llama.cpp peer built for AVX2: ran beside LOOM_ISA=avx2; 48 greedy tokens equal at F32"
else
  echo "llama.cpp peer built for AVX2: not built in $BUILD/peers/llama-venv-avx2, not run"
fi
[ -z "$(ls -d "$BUILD"/peers/run-* 2>/dev/null)" ] || { echo "bench infer left its GGUF files behind"; exit 1; }

#!/usr/bin/env bash
# `loom version` names the CPU, the features the probe found and the kernel each operation
# runs here, and LOOM_ISA / LOOM_QUANT_PATH change what it names (the lines come from the
# selection functions the operations call, so a forced build shows in every line that
# follows it). A LOOM_ISA that does not exist is refused, naming it.
# usage: version_test.sh path/to/loom
set -uo pipefail
LOOM=${1:?usage: version_test.sh LOOM}
failures=0
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }
has() {  # OUTPUT LINE-REGEX WHAT
  grep -qE "$2" <<<"$1" || fail "$3: no line matching '$2' in:"$'\n'"$1"
}

out=$(env -u LOOM_ISA -u LOOM_QUANT_PATH "$LOOM" version) || fail "loom version exited $?"
echo "$out"
has "$out" '^cpu: .+' "the CPU model"
has "$out" '^cpu features: .+' "the features found"
for op in "f32 GEMM" "bf16 GEMM" "int8 linear" "int4 linear" "bf16 linear" "decode_linear" "paged attention" \
  "checksum"; do
  has "$out" "^kernel $op: +[^ ]" "the kernel of $op"
done

# The portable build runs everywhere: every f32 kernel and quantized path follows it.
base=$(LOOM_ISA=base "$LOOM" version) || fail "LOOM_ISA=base loom version exited $?"
has "$base" '^cpu kernels: base$' "LOOM_ISA=base"
has "$base" '^kernel decode_linear: +base$' "LOOM_ISA=base, decode_linear"
has "$base" '^kernel paged attention: +base$' "LOOM_ISA=base, paged attention"
has "$base" '^kernel int8 linear: +base-f32$' "LOOM_ISA=base, int8 linear"
[[ $base != "$out" ]] || grep -qE '^cpu features: (none|sse4.2)$' <<<"$out" ||
  fail "LOOM_ISA=base printed what the default did on a CPU with vector extensions"

if grep -qE '^cpu features: .*\bavx2\b' <<<"$out"; then
  avx2=$(LOOM_ISA=avx2 "$LOOM" version) || fail "LOOM_ISA=avx2 loom version exited $?"
  has "$avx2" '^cpu kernels: avx2$' "LOOM_ISA=avx2"
  has "$avx2" '^kernel decode_linear: +avx2$' "LOOM_ISA=avx2, decode_linear"
  has "$avx2" '^kernel paged attention: +avx2$' "LOOM_ISA=avx2, paged attention"
  int=$(LOOM_QUANT_PATH=avx2-int "$LOOM" version) || fail "LOOM_QUANT_PATH=avx2-int loom version exited $?"
  has "$int" '^kernel int8 linear: +avx2-int$' "LOOM_QUANT_PATH=avx2-int, int8 linear"
  has "$int" '^kernel int4 linear: +avx2-int$' "LOOM_QUANT_PATH=avx2-int, int4 linear"
else
  echo "(no AVX2 here: LOOM_ISA=avx2 and LOOM_QUANT_PATH=avx2-int not checked)"
fi

bad=$(LOOM_ISA=sse9 "$LOOM" version 2>&1) && fail "LOOM_ISA=sse9 was accepted"
has "$bad" "LOOM_ISA='sse9'" "the refusal of LOOM_ISA=sse9"

[[ $failures -eq 0 ]] && echo "version: all checks passed" || { echo "$failures failure(s)"; exit 1; }

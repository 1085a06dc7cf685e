#!/usr/bin/env bash
# Speculative decoding through the CLI: train a tiny byte-level target and a smaller draft,
# then check that `loom generate --speculative` prints exactly what plain `loom generate`
# prints (greedy, with a draft and with n-gram lookup; sampled runs are reproducible), that
# `bench infer --speculative` reports its SUMMARY keys, and that bad input is refused clearly.
set -euo pipefail
LOOM="$1"
SRC="$2"
WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT
source "$SRC/tests/infer/cli_helpers.sh"
tiny_data
train_tiny target
train_tiny draft --set model.n_layer=1 --set model.d_model=64 --set model.n_head=2 --set model.d_ff=256
train_tiny wide --set model.vocab_size=300 --set model.n_layer=1 --set model.d_model=64 --set model.n_head=2 \
  --set model.d_ff=256

gen() { "$LOOM" generate --checkpoint "$WORK/target" --prompt "ROMEO: O Romeo, Romeo" --max-tokens 60 "$@" 2>"$WORK/gen.err"; }
plain="$(gen --temperature 0)"
for spec in "draft=$WORK/draft,k=4" "ngram,k=4,n=3" "draft=$WORK/draft,k=2,adaptive=off"; do
  got="$(gen --temperature 0 --speculative "$spec")"
  [ "$got" = "$plain" ] || { echo "--speculative $spec changed the greedy output:"; echo "$plain"; echo "$got"; exit 1; }
  grep -q "proposals accepted" "$WORK/gen.err" || { echo "no acceptance report:"; cat "$WORK/gen.err"; exit 1; }
done
a="$(gen --temperature 0.9 --seed 5 --speculative "draft=$WORK/draft")"
b="$(gen --temperature 0.9 --seed 5 --speculative "draft=$WORK/draft")"
[ "$a" = "$b" ] || { echo "sampled speculative output is not reproducible:"; echo "$a"; echo "$b"; exit 1; }
[ "${a:0:21}" = "ROMEO: O Romeo, Romeo" ] || { echo "output does not start with the prompt: $a"; exit 1; }

out="$("$LOOM" bench infer --checkpoint "$WORK/target" --speculative "draft=$WORK/draft,k=3" --data "$WORK/data" \
  --prompt-len 24 --output-len 32 --batch1-requests 2 --requests 4 --kv-cache-mb 8 --threads 1 2>/dev/null)"
echo "$out" | grep -q '^SUMMARY .*"plain_tokens_per_s".*"spec_tokens_per_s".*"acceptance".*"greedy_identical":2,.*"low_spec_p99_e2e_ms".*"high_spec_tokens_per_s"' \
  || { echo "bench infer --speculative SUMMARY incomplete:"; echo "$out"; exit 1; }

gen2() { "$LOOM" generate --checkpoint "$WORK/target" --prompt "ROMEO:" --max-tokens 8 "$@"; }
refused "k=0 must be at least 1" gen2 --speculative ngram,k=0
refused "it must start with draft=DIR or ngram" gen2 --speculative eagle
refused "'n=3' is not an option of draft" gen2 --speculative "draft=$WORK/draft,n=3"
refused "the draft's vocabulary has 300 tokens but the target's has 256" gen2 --speculative "draft=$WORK/wide"
refused "[speculative] the draft (draft=$WORK/nothing-here): [model] $WORK/nothing-here does not exist" gen2 --speculative "draft=$WORK/nothing-here"
# A draft larger than its target is allowed, with a warning.
"$LOOM" generate --checkpoint "$WORK/draft" --prompt "A" --max-tokens 4 --speculative "draft=$WORK/target" \
  > /dev/null 2> "$WORK/warn.err"
grep -q "not fewer than the target's" "$WORK/warn.err" || { echo "no warning for a larger draft:"; cat "$WORK/warn.err"; exit 1; }
echo "speculative decoding CLI: ok"

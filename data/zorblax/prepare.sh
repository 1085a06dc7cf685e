# Sourced by the Zorblax SFT test and benchmark: prepare_zorblax LOOM MODEL WORK tokenizes
# train.jsonl then heldout.jsonl as one chat shard with the model's tokenizer into WORK/data,
# the held-out conversations as val.bin (the last ones: prepare keeps conversations whole);
# prepare's output is WORK/prepare.out. Sets held and all (conversation counts).
prepare_zorblax() {
  local loom="$1" model="$2" work="$3" here
  here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
  cat "$here/train.jsonl" "$here/heldout.jsonl" > "$work/all.jsonl"
  held=$(wc -l < "$here/heldout.jsonl")
  all=$(wc -l < "$work/all.jsonl")
  local frac
  frac=$(python3 -c "print(($held + 0.5) / $all)")
  "$loom" prepare --chat "$work/all.jsonl" --tokenizer "$model" --val-fraction "$frac" --out "$work/data" \
    > "$work/prepare.out"
}

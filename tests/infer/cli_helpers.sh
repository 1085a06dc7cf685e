# Shared by the inference CLI tests (sourced after LOOM, SRC and WORK are set): a tiny
# byte-level corpus and models trained on it briefly, failing, running and refusal checks, and
# SmolLM2's GGUF; the transformers peer's venv (export and bench finetune peer tests).

# tiny_data: WORK/data, the first 60000 bytes of Tiny Shakespeare in bytes.
tiny_data() {
  head -c 60000 "$SRC/data/tinyshakespeare/input.txt" > "$WORK/in.txt"
  "$LOOM" prepare --input "$WORK/in.txt" --tokenizer byte --out "$WORK/data" > /dev/null
}

# train_tiny NAME [--set KEY=VALUE]...: WORK/NAME, the demo model (or its overrides) after 30
# steps of 4 x 64 tokens on WORK/data.
train_tiny() {
  local name="$1"
  shift
  "$LOOM" train "$SRC/configs/shakespeare.yaml" --set data.dir="$WORK/data" --set schedule.steps=30 \
    --set data.batch_size=4 --set data.seq_len=64 --set checkpoint.dir="$WORK/$name" \
    --set log.metrics_path="$WORK/$name.jsonl" --set log.progress=off "$@" > /dev/null
}

# fail WHY: the test fails saying WHY.
fail() { echo "FAIL: $*"; exit 1; }

# run LOG COMMAND...: COMMAND must exit 0; its output goes to LOG (shown on failure).
run() {
  local log="$1" rc=0
  shift
  "$@" > "$log" 2>&1 || rc=$?
  [ $rc -eq 0 ] || { cat "$log"; fail "exit status $rc from: $*"; }
}

# refused WANT COMMAND...: COMMAND fails (any non-zero status) saying WANT.
refused() {
  local want="$1" out rc=0
  shift
  out="$("$@" 2>&1)" || rc=$?
  [ "$rc" != 0 ] || { echo "$* was accepted"; exit 1; }
  case "$out" in *"$want"*) ;; *) echo "$*: expected \"$want\" in: $out"; exit 1 ;; esac
}

# smollm2_or_skip: MODEL, SmolLM2-135M-Instruct's GGUF (scripts/fetch-test-model.sh, which
# downloads it into a cache once); exits 77 ("SKIPPED: why") when it cannot be downloaded, 1 on
# any other failure.
smollm2_or_skip() {
  local rc=0
  MODEL="$(bash "$SRC/scripts/fetch-test-model.sh" 2>"$WORK/fetch.log")" || rc=$?
  if [ $rc -eq 3 ]; then echo "SKIPPED: $(tail -n 1 "$WORK/fetch.log")"; exit 77; fi
  [ $rc -eq 0 ] || { cat "$WORK/fetch.log"; exit 1; }
}

# transformers_or_skip VENV: bench/peers/setup_transformers.sh makes VENV (transformers on the
# system's PyTorch), or the test skips (exit 77, "SKIPPED: ...") where it cannot be installed (no
# PyTorch or venv for the system's python3, or no package index); fails when PyPI is reachable and
# the install failed all the same.
transformers_or_skip() {
  local venv="$1"
  if ! timeout 900 bash "$SRC/bench/peers/setup_transformers.sh" "$venv" 2> "$WORK/setup.err"; then
    cat "$WORK/setup.err"
    if grep -q "has no PyTorch\|needs python3 with venv" "$WORK/setup.err" ||
      ! timeout 20 python3 -m pip download --no-deps -q -d "$WORK/probe" "jinja2==3.1.6" > /dev/null 2>&1; then
      echo "SKIPPED: transformers cannot be installed here: $(tail -n 1 "$WORK/setup.err")"
      exit 77
    fi
    fail "installing transformers failed although PyPI is reachable"
  fi
}

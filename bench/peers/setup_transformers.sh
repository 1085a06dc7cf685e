#!/usr/bin/env bash
# Builds the Hugging Face transformers peer of `loom export`'s tests: a private Python venv that
# sees the system's PyTorch (Debian's python3-torch; PyPI's torch wheels bring gigabytes of CUDA
# libraries) and holds PyPI's transformers with its tokenizers and safetensors, and jinja2 for
# chat templates. transformers 4.44 is the newest that runs on Debian 12's torch 1.13. Nothing
# outside VENV is touched; a second call with the venv complete returns at once.
#   usage: setup_transformers.sh VENV_DIR      exit 2 with one line on stderr when it cannot
set -euo pipefail
venv=${1:?usage: setup_transformers.sh VENV_DIR}
transformers_version=4.44.2
jinja2_version=3.1.6
stamp="$venv/.loom-peer-ready-$transformers_version-$jinja2_version"
if [[ -f $stamp ]]; then exit 0; fi

source "$(dirname "${BASH_SOURCE[0]}")/venv_python.sh"
python=$(python_with_venv "peer transformers")
if ! "$python" -c 'import torch' 2>/dev/null; then
  echo "[peer transformers] $python has no PyTorch; install Debian's: apt-get install python3-torch" >&2
  exit 2
fi
echo "[peer transformers] installing transformers $transformers_version into $venv (once)" >&2
rm -rf "$venv"
if ! out=$("$python" -m venv --system-site-packages "$venv" 2>&1); then
  echo "[peer transformers] cannot make a venv in $venv: $(tail -1 <<<"$out")" >&2
  exit 2
fi
log="$venv/install.log"
if ! "$venv/bin/pip" install --disable-pip-version-check -q "transformers==$transformers_version" \
     "jinja2==$jinja2_version" >"$log" 2>&1; then
  echo "[peer transformers] pip could not install transformers/jinja2 from PyPI: $(tail -1 "$log")" >&2
  exit 2
fi
touch "$stamp"
echo "[peer transformers] ready: $venv" >&2

#!/usr/bin/env bash
# Builds the llama.cpp peer for `loom bench infer --peer llama.cpp`: a private Python venv
# holding PyPI's llama-cpp-python (an sdist whose build compiles its bundled llama.cpp for
# this CPU), gguf (to write loom's weights as GGUF) and numpy. Nothing outside VENV is
# touched; a second call with the venv complete returns at once.
#   usage: setup_llama_cpp.sh VENV_DIR
set -euo pipefail
venv=${1:?usage: setup_llama_cpp.sh VENV_DIR}
llama_version=0.3.36
gguf_version=0.19.0
stamp="$venv/.loom-peer-ready-$llama_version-$gguf_version"
if [[ -f $stamp ]]; then exit 0; fi

python=""
for p in /usr/bin/python3 python3; do
  if command -v "$p" >/dev/null && "$p" -c 'import venv, ensurepip' 2>/dev/null; then
    python=$p; break
  fi
done
if [[ -z $python ]]; then
  echo "[peer llama.cpp] needs python3 with venv and ensurepip (Debian: apt-get install python3-venv)" >&2
  exit 2
fi
for tool in cmake c++; do
  if ! command -v $tool >/dev/null; then
    echo "[peer llama.cpp] needs $tool to compile llama.cpp (Debian: apt-get install cmake g++)" >&2
    exit 2
  fi
done

echo "[peer llama.cpp] building llama-cpp-python $llama_version (compiles llama.cpp for this CPU," \
     "about 4-8 minutes on 2 cores; reused afterwards) into $venv" >&2
rm -rf "$venv"
"$python" -m venv "$venv"
log="$venv/build.log"
if ! "$venv/bin/pip" install --disable-pip-version-check -q "numpy<3" "gguf==$gguf_version" >"$log" 2>&1; then
  tail -20 "$log" >&2
  echo "[peer llama.cpp] pip could not install gguf/numpy from PyPI (see $log)" >&2
  exit 2
fi
# GGML_NATIVE builds for the host's ISA (AVX-512, VNNI, AMX where present); no multimodal.
if ! CMAKE_ARGS="-DGGML_NATIVE=ON -DLLAVA_BUILD=OFF -DLLAMA_CURL=OFF" \
     CMAKE_BUILD_PARALLEL_LEVEL=$(nproc) \
     "$venv/bin/pip" install --disable-pip-version-check -q --no-binary llama-cpp-python \
     "llama-cpp-python==$llama_version" >>"$log" 2>&1; then
  tail -30 "$log" >&2
  echo "[peer llama.cpp] building llama-cpp-python failed (see $log)" >&2
  exit 2
fi
touch "$stamp"
echo "[peer llama.cpp] ready: $venv" >&2

#!/usr/bin/env bash
# Builds the llama.cpp peer for `loom bench infer --peer llama.cpp`: a private Python venv
# holding PyPI's llama-cpp-python (an sdist whose build compiles its bundled llama.cpp for
# an ISA), gguf (to write loom's weights as GGUF) and numpy. Nothing outside VENV is touched;
# a second call with the venv complete returns at once.
#   usage: setup_llama_cpp.sh VENV_DIR [native|avx2]
# ISA native (the default) builds for this CPU (-march=native: AVX-512, VNNI where present)
# with llama.cpp's AMX code off: GCC 12.2 drops the stores that fill its tile configuration,
# and quantized models then die with SIGSEGV on CPUs that expose AMX
# (../shared/notes/amx-and-peers.md; docs/INFERENCE.md). avx2 builds for an AVX2-only x86 CPU (Zen 3, Intel client cores before AVX-VNNI):
# AVX2, FMA, F16C, BMI2, with AVX-512, AVX-VNNI and AMX off, whatever this CPU has. Each ISA
# keeps its own stamp, so one venv never holds the other's build.
set -euo pipefail
usage="usage: setup_llama_cpp.sh VENV_DIR [native|avx2]"
venv=${1:?$usage}
isa=${2:-native}
llama_version=0.3.36
gguf_version=0.19.0
# The flag names are ggml's (vendor/llama.cpp/ggml/CMakeLists.txt of the 0.3.36 sdist).
case $isa in
  # ggml's GGML_AMX_* switches do not apply under GGML_NATIVE (-march=native alone decides),
  # so the compiler is told: an explicit -mno-amx-* holds against -march in either order.
  native) stamp_isa="noamx-"; ggml_isa="-DGGML_NATIVE=ON"
    if [[ $(uname -m) == x86_64 ]]; then
      no_amx="-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"
      export CFLAGS="${CFLAGS:-} $no_amx" CXXFLAGS="${CXXFLAGS:-} $no_amx"
    fi ;;
  avx2) stamp_isa="avx2-"
    ggml_isa="-DGGML_NATIVE=OFF -DGGML_SSE42=ON -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON"
    ggml_isa+=" -DGGML_BMI2=ON -DGGML_AVX_VNNI=OFF -DGGML_AVX512=OFF -DGGML_AVX512_VBMI=OFF"
    ggml_isa+=" -DGGML_AVX512_VNNI=OFF -DGGML_AVX512_BF16=OFF -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF"
    ggml_isa+=" -DGGML_AMX_BF16=OFF" ;;
  *) echo "[peer llama.cpp] ISA \"$isa\" is not native or avx2; $usage" >&2; exit 2 ;;
esac
stamp="$venv/.loom-peer-ready-$stamp_isa$llama_version-$gguf_version"
if [[ -f $stamp ]]; then exit 0; fi
# A complete build for the other ISA is not replaced silently: it took minutes, and a
# benchmark pointed at this directory expects that ISA.
for other in "$venv"/.loom-peer-ready-*; do
  if [[ -f $other ]]; then
    case ${other##*/.loom-peer-ready-} in avx2-*) other_isa=avx2 ;; *) other_isa=native ;; esac
    if [[ $other_isa != "$isa" ]]; then
      echo "[peer llama.cpp] $venv holds the $other_isa build; give another directory for $isa" \
           "(loom bench infer's default for avx2 is BUILD/peers/llama-venv-avx2), or remove it" >&2
      exit 2
    fi
  fi
done

source "$(dirname "${BASH_SOURCE[0]}")/venv_python.sh"
python=$(python_with_venv "peer llama.cpp")
for tool in cmake c++; do
  if ! command -v $tool >/dev/null; then
    echo "[peer llama.cpp] needs $tool to compile llama.cpp (Debian: apt-get install cmake g++)" >&2
    exit 2
  fi
done

echo "[peer llama.cpp] building llama-cpp-python $llama_version (compiles llama.cpp for ISA $isa," \
     "about 4-8 minutes on 2 cores; reused afterwards) into $venv" >&2
rm -rf "$venv"
"$python" -m venv "$venv"
log="$venv/build.log"
if ! "$venv/bin/pip" install --disable-pip-version-check -q "numpy<3" "gguf==$gguf_version" >"$log" 2>&1; then
  tail -20 "$log" >&2
  echo "[peer llama.cpp] pip could not install gguf/numpy from PyPI (see $log)" >&2
  exit 2
fi
# No multimodal. --no-cache-dir: pip's cache of locally built wheels is keyed by the sdist,
# not by CMAKE_ARGS, so it would hand one ISA's build to the other.
if ! CMAKE_ARGS="$ggml_isa -DLLAVA_BUILD=OFF -DLLAMA_CURL=OFF" \
     CMAKE_BUILD_PARALLEL_LEVEL=$(nproc) \
     "$venv/bin/pip" install --disable-pip-version-check -q --no-cache-dir --no-binary llama-cpp-python \
     "llama-cpp-python==$llama_version" >>"$log" 2>&1; then
  tail -30 "$log" >&2
  echo "[peer llama.cpp] building llama-cpp-python failed (see $log)" >&2
  exit 2
fi
touch "$stamp"
echo "[peer llama.cpp] ready ($isa): $venv" >&2

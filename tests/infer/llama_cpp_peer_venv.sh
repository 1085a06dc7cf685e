# Sourced by the llama.cpp peer tests: ensure_llama_peer VENV SRC WORK makes the peer's venv
# ready (bench/peers/setup_llama_cpp.sh, about 5 minutes on 2 cores the first time), or exits
# 77 with "SKIPPED: <why>" when it cannot be installed (no python3 venv, no network to PyPI).
ensure_llama_peer() {
  local venv="$1" src="$2" work="$3"
  # the stamp names the build: a native venv of an older script (AMX on) is built again
  if compgen -G "$venv/.loom-peer-ready-noamx-*" >/dev/null || compgen -G "$venv/.loom-peer-ready-avx2-*" >/dev/null; then
    return 0
  fi
  command -v python3 >/dev/null || { echo "SKIPPED: python3 is not installed"; exit 77; }
  python3 -c 'import venv, ensurepip' 2>/dev/null || { echo "SKIPPED: python3 venv/ensurepip missing (apt-get install python3-venv)"; exit 77; }
  echo "building the llama.cpp peer into $venv (about 5 minutes on 2 cores)"
  if ! timeout 1500 bash "$src/bench/peers/setup_llama_cpp.sh" "$venv"; then
    if ! timeout 20 "$venv/bin/pip" download --no-deps -q -d "$work/probe" "gguf==0.19.0" >/dev/null 2>&1; then
      echo "SKIPPED: PyPI is not reachable, so llama-cpp-python cannot be installed"; exit 77
    fi
    echo "building the llama.cpp peer failed although PyPI is reachable"; exit 1
  fi
}

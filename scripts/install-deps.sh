#!/usr/bin/env bash
# Installs the Debian packages loom's build and tests need. Idempotent: packages already
# present are skipped, and nothing is done when all are there. Uses sudo when not root.
set -euo pipefail

PACKAGES=(
  build-essential cmake ninja-build ccache pkg-config git
  libopenblas-openmp-dev        # BLAS (GEMM) sharing the OpenMP thread pool with our kernels
  libopenmpi-dev openmpi-bin    # MPI: multi-process and multi-host communication
  libyaml-cpp-dev               # typed YAML configs
  nlohmann-json3-dev            # JSON (manifests, HTTP API, SUMMARY lines)
  libcli11-dev                  # the loom tool's typed, self-documenting options
  libssl-dev                    # SHA-256 (libcrypto) for cascade model versions
  googletest libgtest-dev libgmock-dev
  clang                         # make check: libFuzzer targets (tests/fuzz)
  libclang-rt-dev               # make check: libFuzzer and the sanitizer runtimes for clang (only
                                # recommended by clang, so --no-install-recommends skips it)
  clang-format                  # make check: the code's format (.clang-format)
  chromium                      # tests: loom report's page rendered headless (screenshot check)
  prometheus                    # tests: a real Prometheus scrapes loom train and loom serve
)

missing=()
for p in "${PACKAGES[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if [ ${#missing[@]} -eq 0 ]; then
  echo "[install-deps] all ${#PACKAGES[@]} packages present"
  exit 0
fi

SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
echo "[install-deps] installing: ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
echo "[install-deps] done"

#!/usr/bin/env bash
# Proves loom's GPU path on a machine with NVIDIA GPUs and the CUDA toolkit (nvcc, cuBLAS,
# NCCL): builds build-cuda (-DLOOM_WITH_CUDA=ON, Release, tests on), then runs test_cuda (the
# CUDA kernels against the CPU ones, device memory) and test_cuda_nccl (the NCCL backend, one
# rank per GPU). Any failure, and any test skipped, fails the check: a skip proves nothing.
# The GPU path is called supported only once this has passed on a GPU (docs/GPU.md).
# Not part of `make test` or CI, which have no GPU (CI only compiles these tests: .ci/run).
#   BUILD_DIR (default build-cuda), JOBS (default nproc), NCCL_HOME (NCCL outside the toolkit).
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${BUILD_DIR:-build-cuda}
JOBS=${JOBS:-$(nproc)}
export CCACHE_DIR="${CCACHE_DIR:-$HOME/.cache/loom-ccache}"

say() { echo "[gpu-check] $*"; }
die() { echo "[gpu-check] FAILED: $*" >&2; exit 1; }

if ! command -v nvcc > /dev/null 2>&1; then
  [ -x /usr/local/cuda/bin/nvcc ] ||
    die "no nvcc on PATH or in /usr/local/cuda/bin: install the CUDA toolkit (with NCCL) first"
  export PATH="$PATH:/usr/local/cuda/bin"
fi
command -v nvidia-smi > /dev/null 2>&1 ||
  die "nvidia-smi not found: no NVIDIA driver here, so no GPU to check (run this on a GPU machine)"
gpu_list=$(nvidia-smi -L 2>&1) || die "nvidia-smi -L failed: $gpu_list"
gpus=$(grep -c '^GPU ' <<< "$gpu_list" || true)
[ "$gpus" -ge 1 ] || die "nvidia-smi lists no GPU: $gpu_list"
echo "$gpu_list"
say "$(nvcc --version | tail -n 1)"

# A fresh machine gets loom's packages; one that has the build tools is left as it is (the
# full list also holds the test-only chromium and prometheus, which an offline box may lack).
if command -v cmake > /dev/null && command -v ninja > /dev/null && command -v mpiexec > /dev/null &&
  [ -d /usr/include/gtest ]; then
  say "build tools present (cmake, ninja, Open MPI, GoogleTest)"
else
  bash scripts/install-deps.sh
fi
mkdir -p "$BUILD_DIR"
cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=Release -DLOOM_WITH_CUDA=ON -DLOOM_BUILD_TESTS=ON \
  > "$BUILD_DIR/configure.log" 2>&1 || { cat "$BUILD_DIR/configure.log"; die "configuring $BUILD_DIR"; }
grep -q "loom CUDA backend: ON" "$BUILD_DIR/configure.log" ||
  { cat "$BUILD_DIR/configure.log"; die "CMake did not enable CUDA (see above)"; }
cmake --build "$BUILD_DIR" -j "$JOBS" --target loom test_cuda test_cuda_nccl || die "building $BUILD_DIR"
"$BUILD_DIR/bin/loom" version

failed=()
run() {  # label, command...
  local label=$1 log="$BUILD_DIR/gpu-check.$1.log"
  shift
  say "$label: $*"
  local rc=0
  LOOM_TEST_REQUIRE_GPU=1 OMP_NUM_THREADS=${OMP_NUM_THREADS:-4} "$@" > "$log" 2>&1 || rc=$?
  grep -E '^\[nccl test\]|^\[  (PASSED|FAILED|SKIPPED) *\] [0-9]+ tests?' "$log" || true
  if [ "$rc" -ne 0 ]; then
    tail -n 40 "$log"
    failed+=("$label (exit $rc; log: $log)")
  elif grep -q '\[  SKIPPED \]' "$log"; then
    failed+=("$label skipped tests (log: $log)")
  fi
}

run kernels "$BUILD_DIR/bin/test_cuda" --gtest_color=no
# One rank per GPU: NCCL refuses two ranks on one device.
run nccl mpiexec -n "$gpus" --oversubscribe --allow-run-as-root --bind-to none -x LOOM_TEST_REQUIRE_GPU \
  -x OMP_NUM_THREADS "$BUILD_DIR/bin/test_cuda_nccl" --gtest_color=no

if [ ${#failed[@]} -gt 0 ]; then
  printf '[gpu-check] FAILED: %s\n' "${failed[@]}" >&2
  exit 1
fi
if [ "$gpus" -ge 2 ]; then
  say "passed on $gpus GPUs: the CUDA kernels and the NCCL backend, its reductions across ranks included"
else
  # One rank: sum, max, min and avg all return the input, so no reduction was verified.
  say "passed on 1 GPU: the CUDA kernels and the NCCL calls; the NCCL reductions are NOT verified (one" \
    "rank reduces nothing: run this on a machine with 2 GPUs or more)"
fi

#!/usr/bin/env bash
# The aarch64 (ARM64) build, cross-compiled with Debian's toolchain and multiarch packages, and its
# unit suites run under qemu-user (cmake/toolchain-aarch64.cmake). Built without MPI
# (LOOM_WITH_MPI=OFF: the arm64 Open MPI cannot be installed beside the build machine's): no loom
# tool, no suites that run ranks. It runs the kernels, model and infer suites; AARCH64_LABELS
# picks others among core, io, data, kernels, model and infer. On aarch64 the x86 kernels are left out and the portable ones run
# (GCC vectorises them for NEON); speed is not measured here. Run from CI (.ci/run) and by hand:
#   bash scripts/check-aarch64.sh            # installs what is missing, builds build-aarch64, runs
#   AARCH64_LABELS='core|io|data' bash scripts/check-aarch64.sh   # other suites
set -euo pipefail
cd "$(dirname "$0")/.."
JOBS=${JOBS:-$(nproc)}
LABELS=${AARCH64_LABELS:-kernels|model|infer}
export CCACHE_DIR="${CCACHE_DIR:-$HOME/.cache/loom-ccache}"

# The target's libraries as arm64 packages beside the build machine's (Multi-Arch: same). Not
# libyaml-cpp-dev:arm64, which would replace the amd64 one: the runtime library and the build
# machine's headers suffice (CMakeLists.txt links it so in cross builds).
# The runtime libraries qemu-user runs the programs on are the multiarch ones (libc6:arm64, ...;
# see cmake/toolchain-aarch64.cmake).
PACKAGES=(g++-aarch64-linux-gnu qemu-user libc6:arm64 libstdc++6:arm64 libgomp1:arm64 libopenblas-openmp-dev:arm64
          libssl-dev:arm64 libgtest-dev:arm64 libyaml-cpp0.7:arm64)
SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
missing=()
for p in "${PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "[aarch64] installing: ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  dpkg --print-foreign-architectures | grep -qx arm64 || $SUDO dpkg --add-architecture arm64
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" > /dev/null
fi

mkdir -p build-aarch64
cmake -S . -B build-aarch64 -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_TOOLCHAIN_FILE=cmake/toolchain-aarch64.cmake \
  -DLOOM_WITH_MPI=OFF > build-aarch64/configure.log 2>&1 ||
  { cat build-aarch64/configure.log; echo "[aarch64] configuring build-aarch64 failed"; exit 1; }
targets=()
for m in ${LABELS//|/ }; do targets+=("test_$m"); done
echo "[aarch64] building ${targets[*]} ($(aarch64-linux-gnu-g++ --version | head -1))"
cmake --build build-aarch64 -j "$JOBS" --target "${targets[@]}"
echo "[aarch64] running the suites under $(qemu-aarch64 --version | head -1): ctest -L '^($LABELS)\$'"
# Emulated, tests take tens of times their native time: a longer timeout. Left out by default
# (AARCH64_EXCLUDE='' runs it): the statistical test of speculative sampling, thousands of sampled
# decodes that take about 2 minutes under qemu; it checks the acceptance rule, not a kernel, and
# runs in the native suite.
EXCLUDE=${AARCH64_EXCLUDE-^SpeculativeSampling\.OutputsFollowTheTargetsDistributionExactly\$}
cd build-aarch64 && ctest -L "^($LABELS)\$" ${EXCLUDE:+-E "$EXCLUDE"} -j "$JOBS" --timeout 600 --output-on-failure

#!/usr/bin/env bash
# Installs the Debian packages loom's build and tests need. Idempotent: packages already
# present are skipped, and nothing is done when all are there. Uses sudo when not root.
#   install-deps.sh           the build's and the tests' packages
#   install-deps.sh --slurm   only Slurm and munge, for scripts/testcluster.sh; their daemons
#                             are kept from starting with the packages' default configuration
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

# The test cluster (scripts/testcluster.sh): Debian 12's Slurm 22.05. The mpi_pmix (PMIx v4)
# and mpi_pmi2 plugins of srun are in slurm-wlm-basic-plugins, which slurmd pulls in.
SLURM_PACKAGES=(
  munge                         # authentication between the Slurm daemons and commands
  slurmctld slurmd              # the controller and the node daemon
  slurm-client                  # sbatch, srun, squeue, scontrol
  slurm-wlm-basic-plugins       # mpi/pmix and mpi/pmi2, select/cons_tres, proctrack/linuxproc
)

# Services these packages ship, kept stopped: testcluster.sh runs its own instances.
SLURM_SERVICES=(munge slurmctld slurmd)

slurm=0
case ${1:-} in
  "") ;;
  --slurm) slurm=1 ;;
  *) echo "[install-deps] usage: install-deps.sh [--slurm]" >&2; exit 2 ;;
esac
[ "$slurm" -eq 0 ] || PACKAGES=("${SLURM_PACKAGES[@]}")

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

# Debian starts a package's daemon when it is installed. For Slurm and munge that would be a
# controller, node daemon and key with the default configuration, so invoke-rc.d is told no
# (policy-rc.d exit 101) for the time of the install, where no policy says so already.
policy=/usr/sbin/policy-rc.d
own_policy=0
if [ "$slurm" -eq 1 ] && [ ! -e "$policy" ]; then
  printf '#!/bin/sh\n# install-deps.sh --slurm: no daemon starts while it installs\nexit 101\n' |
    $SUDO tee "$policy" >/dev/null
  $SUDO chmod 755 "$policy"
  own_policy=1
  trap '$SUDO rm -f "$policy"' EXIT
fi
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
if [ "$slurm" -eq 1 ] && [ -d /run/systemd/system ]; then
  # Under systemd the units are also enabled for the next boot: disable the ones installed now.
  for s in "${SLURM_SERVICES[@]}"; do
    if printf '%s\n' "${missing[@]}" | grep -qx "$s"; then
      $SUDO systemctl disable --now "$s" >/dev/null 2>&1 || true
    fi
  done
fi
[ "$own_policy" -eq 0 ] || { $SUDO rm -f "$policy"; trap - EXIT; }
echo "[install-deps] done"

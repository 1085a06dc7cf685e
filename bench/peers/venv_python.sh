# Sourced by the peers' setup scripts (setup_*.sh): the Python that makes their private venvs.
# python_with_venv TAG prints the first python3 with venv and ensurepip, or says on stderr what
# to install ("[TAG] needs ...") and returns 2; `python=$(python_with_venv TAG)` under set -e
# then ends the script with that status.
python_with_venv() {
  local tag=$1 p
  for p in /usr/bin/python3 python3; do
    if command -v "$p" >/dev/null && "$p" -c 'import venv, ensurepip' 2>/dev/null; then
      echo "$p"
      return 0
    fi
  done
  echo "[$tag] needs python3 with venv and ensurepip (Debian: apt-get install python3-venv)" >&2
  return 2
}

#!/usr/bin/env bash
# Every loom command and benchmark, found by walking the command registry ($LOOM_CLI_DESCRIBE=1
# lists subcommands, or a command's declared options): --help exits 0 and lists exactly the
# declared options, and each option parses with a sample value ($LOOM_CLI_PARSE_ONLY=1 parses,
# prints the values and exits before anything runs), as --name value and --name=value. A
# command that does not declare its options with CLI11 (commands.h) fails the walk.
# usage: options_test.sh path/to/loom
set -uo pipefail
LOOM=${1:?usage: options_test.sh LOOM}
# loom re-executes itself once at start where OpenBLAS picked generic kernels (tools/loom/main.cpp);
# this test starts loom about a thousand times and never runs a product, so it names a core.
[[ $(uname -m) == x86_64 ]] && export OPENBLAS_CORETYPE=${OPENBLAS_CORETYPE:-Haswell}
failures=0 commands=0 checked=0
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }

# Sample values an option may take, the likeliest first: a member of {a,b}, the default, numbers.
candidates() {  # TYPE DEFAULT
  local type=$1 def=$2
  if [[ $type == *"{"*"}"* ]]; then
    local members=${type#*\{}; members=${members%%\}*}; echo "${members%%,*}"; return
  fi
  [[ $def != "-" && $def != "[]" ]] && echo "$def"
  echo 1; echo 2; echo 0.5; echo x
}

# parse_only PATH... -- ARGS...: runs LOOM PATH ARGS in parse-only mode; prints its output.
parse_only() { LOOM_CLI_PARSE_ONLY=1 timeout 20 "$LOOM" "$@" 2>&1; }

# base = the required (option, value) pairs of check_command but `skip`; "" names a positional.
base_without() {  # SKIP
  base=()
  local i
  for ((i = 0; i < ${#required[@]}; i += 2)); do
    [[ -n ${required[i]} && ${required[i]} == "$1" ]] && continue
    if [[ -z ${required[i]} ]]; then base+=("${required[i + 1]}"); else base+=("${required[i]}" "${required[i + 1]}"); fi
  done
}

check_command() {  # DESCRIBE_OUTPUT PATH...
  local describe=$1; shift
  local path=("$@") name="loom $*"
  commands=$((commands + 1))
  local help rc
  help=$(timeout 20 "$LOOM" "${path[@]}" --help 2>&1); rc=$?
  [[ $rc == 0 && -n $help ]] || { fail "$name --help exited $rc: $help"; return; }
  [[ $help == *"Usage: $name"* ]] || fail "$name --help has no generated usage line: $help"
  local short; short=$(timeout 20 "$LOOM" "${path[@]}" -h 2>&1) || fail "$name -h exited $?"
  [[ $short == "$help" ]] || fail "$name -h differs from --help"

  # The options --help lists must be exactly the declared ones.
  local listed declared
  listed=$(grep -oE '^  (-[a-z],)?--[a-z0-9-]+' <<<"$help" | sed -E 's/^  (-[a-z],)?//' | grep -vx -- '--help' | sort -u)
  declared=$(awk -F'\t' 'NR > 1 && $1 != "positional" {print $2}' <<<"$describe" | sort -u)
  [[ $listed == "$declared" ]] || fail "$name: --help lists [$(echo $listed)] but declares [$(echo $declared)]"

  # Required options and positionals get a sample first, so that each option parses alone.
  local required=() kind opt type def req
  while IFS=$'\t' read -r kind opt type def req; do
    [[ $req == 1 ]] || continue
    local v; v=$(candidates "$type" "$def" | head -1)
    if [[ $kind == positional ]]; then required+=("" "$v"); else required+=("$opt" "$v"); fi
  done < <(tail -n +2 <<<"$describe")
  local base=()
  base_without ""
  local out
  out=$(parse_only "${path[@]}" "${base[@]}") || fail "$name ${base[*]}: the required options alone do not parse: $out"

  while IFS=$'\t' read -r kind opt type def req; do
    [[ $kind == positional ]] && continue
    checked=$((checked + 1))
    base_without "$opt"
    local key=${opt#--} ok=0
    if [[ $kind == flag ]]; then
      out=$(parse_only "${path[@]}" "${base[@]}" "$opt") && grep -qx "$key=true" <<<"$out" && ok=1
      [[ $ok == 1 ]] || fail "$name $opt: the flag does not parse: $out"
      continue
    fi
    local v
    while read -r v; do
      out=$(parse_only "${path[@]}" "${base[@]}" "$opt" "$v") || continue
      grep -q "^$key=" <<<"$out" || { fail "$name $opt $v: parsed, but the values printed lack $key: $out"; ok=2; break; }
      out=$(parse_only "${path[@]}" "${base[@]}" "$opt=$v") || { fail "$name $opt=$v: refused: $out"; ok=2; break; }
      if [[ $kind == list ]]; then
        out=$(parse_only "${path[@]}" "${base[@]}" "$opt" "$v" "$opt" "$v") \
          || { fail "$name $opt given twice: a list option refused it: $out"; ok=2; break; }
      elif [[ $req != 1 ]]; then
        out=$(parse_only "${path[@]}" "${base[@]}" "$opt" "$v" "$opt" "$v"); rc=$?
        [[ $rc == 2 && $out == *"$opt is given twice"* ]] || { fail "$name $opt given twice: exit $rc: $out"; ok=2; break; }
      fi
      ok=1; break
    done < <(candidates "$type" "$def")
    [[ $ok == 0 ]] && fail "$name $opt ($type, default $def): no sample value parses: $out"
  done < <(tail -n +2 <<<"$describe")

  # Unknown options are usage errors that name the option.
  base_without ""
  out=$(parse_only "${path[@]}" "${base[@]}" --no-such-option 1); rc=$?
  [[ $rc == 2 && $out == *"--no-such-option"* ]] || fail "$name --no-such-option: exit $rc: $out"
  # --help goes before anything else, --nproc (which relaunches a benchmark) included.
  if grep -qx -- '--nproc' <<<"$declared"; then
    out=$(timeout 20 "$LOOM" "${path[@]}" --nproc 2 --help 2>&1); rc=$?
    [[ $rc == 0 && $out == *"Usage: $name"* ]] || fail "$name --nproc 2 --help: exit $rc: $out"
  fi
}

walk() {  # PATH...
  local out
  out=$(LOOM_CLI_DESCRIBE=1 timeout 20 "$LOOM" "$@" 2>&1)
  case "$(head -1 <<<"$out")" in
    loom-cli-subcommands)
      local sub
      for sub in $(awk -F'\t' '$1 == "subcommand" {print $2}' <<<"$out"); do walk "$@" "$sub"; done ;;
    loom-cli-options*) check_command "$out" "$@" ;;
    *) fail "loom $*: did not describe its options (declare them with new_app/parse, commands.h): $out" ;;
  esac
}

walk
echo "$commands commands, $checked options checked, $failures failures"
[[ $commands -ge 20 ]] || fail "only $commands commands found"
[[ $failures == 0 ]]

#!/usr/bin/env bash
# `make check`: the format check, then the checking builds, each in its own tree beside `build/`.
#   0. format: every tracked C++ file as clang-format formats it with .clang-format (Debian 12's
#      clang-format 14; apply with `git ls-files '*.h' '*.cpp' '*.cu' | xargs clang-format -i`).
#   1. build-asan: AddressSanitizer + UndefinedBehaviorSanitizer (GCC); the unit suites.
#   2. build-tsan: ThreadSanitizer (GCC); the comm, infer and serve suites.
#   3. build-fuzz: clang with libFuzzer; every target in tests/fuzz for FUZZ_SECONDS each
#      (default 30), starting from its seed corpus (new inputs go to a scratch copy).
#      FUZZ_SECONDS=0 compiles every target and runs each seed input once under ASan/UBSan,
#      without fuzzing (a few minutes; CI runs it so that a fuzz tree that does not compile
#      cannot land).
# Any sanitizer report or fuzzer crash fails the check; a crash's input is kept under
# build-fuzz/crashes/ to become a regression test. CHECK_ONLY=format|asan|tsan|fuzz runs one part.
# CHECK_ONLY=sanitizer-trees (CI) configures build-asan and build-tsan and compiles, in each, what
# differs from build/ in code (the sources that test __SANITIZE_*__ or get per-file sanitizer
# options) and links test_core against the sanitizer runtime, without running the suites: a few
# minutes instead of their 25-30, so a sanitizer tree that does not configure, compile or link
# cannot land.
set -euo pipefail
cd "$(dirname "$0")/.."
JOBS=${JOBS:-$(nproc)}
FUZZ_SECONDS=${FUZZ_SECONDS:-30}
only=${CHECK_ONLY:-}
failed=()

configure() {  # dir, extra cmake args...
  local dir=$1; shift
  mkdir -p "$dir"
  # -O1 -g1: line tables are all a sanitizer report needs, and they compile far faster than -g.
  cmake -S . -B "$dir" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -g1" \
    -DCMAKE_C_FLAGS_RELWITHDEBINFO="-O1 -g1" "$@" > "$dir/configure.log" 2>&1 ||
    { cat "$dir/configure.log"; echo "[check] configuring $dir failed"; exit 1; }
}

run_suites() {  # label, bin dir, env..., -- binaries...
  local label=$1 bindir=$2; shift 2
  local envs=()
  while [ "$1" != "--" ]; do envs+=("$1"); shift; done
  shift
  for t in "$@"; do
    echo "[check] $label: $t"
    if ! env "${envs[@]}" "$bindir/$t" --gtest_brief=1 > "$bindir/$t.$label.log" 2>&1; then
      tail -60 "$bindir/$t.$label.log"
      failed+=("$label $t (log: $bindir/$t.$label.log)")
    fi
  done
}

if [ -z "$only" ] || [ "$only" = format ]; then
  if ! command -v clang-format >/dev/null; then
    failed+=("format: clang-format is not installed (scripts/install-deps.sh installs it)")
  else
    echo "[check] format: $(clang-format --version | head -1)"
    unformatted=$(git ls-files '*.h' '*.cpp' '*.cu' | xargs clang-format --dry-run 2>&1 |
                  sed -n 's/^\([^:]*\):[0-9]*:[0-9]*: .*clang-format-violations.*/\1/p' | sort -u)
    if [ -n "$unformatted" ]; then
      echo "$unformatted" | sed 's/^/  not formatted: /'
      failed+=("format: $(echo "$unformatted" | wc -l) files differ from .clang-format (apply: git ls-files '*.h' '*.cpp' '*.cu' | xargs clang-format -i)")
    fi
  fi
fi

if [ -z "$only" ] || [ "$only" = asan ]; then
  echo "[check] AddressSanitizer + UndefinedBehaviorSanitizer build (build-asan)"
  configure build-asan -DLOOM_SANITIZE=address,undefined
  cmake --build build-asan -j "$JOBS" --target test_core test_io test_net test_data test_model test_kernels test_infer \
    test_serve test_bench test_optim test_train test_parallel test_comm loom
  run_suites asan build-asan/bin OMP_NUM_THREADS=2 OMP_WAIT_POLICY=passive \
    "ASAN_OPTIONS=detect_leaks=1:abort_on_error=1:strict_string_checks=1:detect_stack_use_after_return=1" \
    "UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1" -- \
    test_core test_io test_net test_data test_model test_kernels test_infer test_serve test_bench test_optim test_train \
    test_parallel test_comm
fi

if [ -z "$only" ] || [ "$only" = tsan ]; then
  echo "[check] ThreadSanitizer build (build-tsan)"
  configure build-tsan -DLOOM_SANITIZE=thread
  cmake --build build-tsan -j "$JOBS" --target test_comm test_infer test_serve test_bench loom
  # One OpenMP thread: GCC's libgomp is not instrumented, so its worker handoffs would read as
  # races; the threads under test here are the server's, the engine loop's and the watchdog's.
  run_suites tsan build-tsan/bin OMP_NUM_THREADS=1 \
    "TSAN_OPTIONS=halt_on_error=1:second_deadlock_stack=1:suppressions=$PWD/tests/sanitizers/tsan.supp" -- \
    test_comm test_infer test_serve test_bench
fi

if [ "$only" = sanitizer-trees ]; then
  # The objects whose code depends on the sanitizer: the files including tests/sanitized.h and
  # those with sanitizer options of their own in src/CMakeLists.txt.
  objects=(src/CMakeFiles/loom_optim.dir/loom/optim/schedule.cpp.o)
  for f in $(grep -l '#include "sanitized.h"' tests/*/*.cpp); do
    dir=$(basename "$(dirname "$f")")
    objects+=("tests/CMakeFiles/test_$dir.dir/$dir/$(basename "$f").o")
  done
  for tree in "build-asan address,undefined" "build-tsan thread"; do
    set -- $tree
    echo "[check] sanitizer tree $1 (-fsanitize=$2): configured, sanitizer-dependent objects compiled, test_core linked"
    configure "$1" -DLOOM_SANITIZE="$2"
    ok=1
    # Each object alone: ninja would first build every library its target links (the whole tree).
    for o in "${objects[@]}"; do
      echo "[check]   $o"
      # An object the tree does not have (a renamed file, a unity batch) fails, not passes empty.
      (cd "$1" && ninja -t query "$o" > /dev/null && ninja -t commands "$o" | tail -1 | sh) || ok=0
    done
    cmake --build "$1" -j "$JOBS" --target test_core || ok=0
    [ $ok = 1 ] || failed+=("sanitizer tree $1 does not compile or link (errors above; rebuild: cmake --build $1)")
  done
fi

if [ -z "$only" ] || [ "$only" = fuzz ]; then
  if ! command -v clang++ >/dev/null; then
    failed+=("fuzz: clang++ is not installed (scripts/install-deps.sh installs clang)")
  else
    if [ "$FUZZ_SECONDS" = 0 ]; then
      echo "[check] libFuzzer targets (build-fuzz): compiled, seed corpora replayed once, no fuzzing"
    else
      echo "[check] libFuzzer targets (build-fuzz), ${FUZZ_SECONDS} s each"
    fi
    CC=clang CXX=clang++ configure build-fuzz -DLOOM_FUZZ=ON -DLOOM_BUILD_TESTS=OFF
    targets=()
    for f in tests/fuzz/fuzz_*.cpp; do targets+=("$(basename "$f" .cpp)"); done
    # -k 0: every target that fails to build is listed, not only the first.
    if ! cmake --build build-fuzz -j "$JOBS" --target "${targets[@]}" -- -k 0; then
      failed+=("fuzz: build-fuzz does not compile with clang (errors above; rebuild: cmake --build build-fuzz)")
      targets=()
    fi
    mkdir -p build-fuzz/crashes
    for t in "${targets[@]}"; do
      name=${t#fuzz_}
      if [ "$FUZZ_SECONDS" = 0 ]; then
        # Files as arguments: libFuzzer runs each once and exits, writing nothing into the corpus.
        mapfile -t seeds < <(find "tests/fuzz/corpus/$name" -type f | sort)
        if [ ${#seeds[@]} -eq 0 ]; then
          failed+=("fuzz $t: no seed inputs in tests/fuzz/corpus/$name")
          continue
        fi
        echo "[check] fuzz replay: $t (${#seeds[@]} inputs)"
        if ! ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
             "build-fuzz/bin/$t" -timeout=10 -rss_limit_mb=2048 "${seeds[@]}" > "build-fuzz/$t.log" 2>&1; then
          tail -40 "build-fuzz/$t.log"
          failed+=("fuzz replay $t (log: build-fuzz/$t.log)")
        fi
        continue
      fi
      scratch=build-fuzz/corpus/$name
      rm -rf "$scratch" && mkdir -p "$scratch"
      echo "[check] fuzz: $t"
      if ! ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
           "build-fuzz/bin/$t" -max_total_time="$FUZZ_SECONDS" -timeout=10 -rss_limit_mb=2048 \
           -artifact_prefix="build-fuzz/crashes/$name-" -print_final_stats=1 \
           "$scratch" "tests/fuzz/corpus/$name" > "build-fuzz/$t.log" 2>&1; then
        tail -40 "build-fuzz/$t.log"
        failed+=("fuzz $t (log: build-fuzz/$t.log; input in build-fuzz/crashes/)")
      else
        grep -E "^stat::number_of_executed_units|^#[0-9]+.*DONE" "build-fuzz/$t.log" | tail -1 || true
      fi
    done
  fi
fi

if [ ${#failed[@]} -gt 0 ]; then
  echo "[check] FAILED:"
  printf '  %s\n' "${failed[@]}"
  exit 1
fi
echo "[check] all clean${only:+ ($only)}: format, sanitizers and fuzzers as run"

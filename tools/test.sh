#!/usr/bin/env bash
# The whole test suite, as CI runs it (.ci/run):
#   1. tools/bootstrap.sh (installs what is missing)
#   2. bazel test //...                  optimised, asserts on
#   3. bazel test --config=asan //...    AddressSanitizer, LeakSanitizer, UBSan
#   4. bazel test --config=tsan //...    ThreadSanitizer
#   4b. bazel test --config=ubsan //...  UBSan with the system allocator
#                                        (ASan's allocator hides misalignment)
#   5. fuzz/run.sh                       libFuzzer (clang), bounded time
#   6. tools/newcomer-check.sh           a fresh clone used as a Bazel
#                                        dependency by a workspace written
#                                        from README.md, built offline, run
#   7. tools/torch-native-check.sh       the native PyTorch backend built and
#                                        linked against torch 2.11.0's wheel
#                                        from PyPI (no GPU, no torch import);
#                                        skipped where PyPI is unreachable
# Every step runs even after a failure, so one run shows everything that is
# broken. The last line counts tests over all steps:
#   tests: N passed, K skipped, M failed
# A test whose every case skipped (cmocka's skip(): the CUDA tests on a
# machine without a GPU) counts as skipped, not passed; cases skipped inside
# a passing test are listed. While a step runs, a line every 30 s says how
# many of its tests have finished.
set -uo pipefail

cd "$(dirname "$0")/.."
root="$(pwd)"

bash tools/bootstrap.sh || { echo "bootstrap failed"; echo "tests: 0 passed, 0 skipped, 1 failed"; exit 1; }

passed=0
skipped=0
failed=0
logdir="$(mktemp -d)"
trap 'rm -rf "$logdir"' EXIT

# CI logs are files, not terminals.
bazel_flags=(--color=no --curses=no --show_progress_rate_limit=30)

# Every 30 s while a step runs: how long, and how many of its tests have
# written their log (cached results write none).
ticker() { # name, start marker, number of tests
  local start=$SECONDS n
  while sleep 30; do
    n="$(find "$root/bazel-out/" -path '*/testlogs/*' -name test.log -newer "$2" 2>/dev/null | wc -l)"
    echo "=== $1: $((SECONDS - start)) s, $n of $3 tests run so far"
  done
}

# Sum of the N in cmocka's "[  WORD ] N test(s)" lines of a test log.
cases() { # log, PASSED or SKIPPED
  sed -nE "s/^\[  $2 +\] ([0-9]+) test\(s\).*/\1/p" "$1" 2>/dev/null | awk '{ n += $1 } END { print n + 0 }'
}

ntests="$(bazel query --noshow_progress 'tests(//...)' 2>/dev/null | wc -l)"

# Runs one `bazel test` and adds its per-test result lines to the counts.
# A run that fails before testing (a build error) counts as one failure.
run_tests() {
  local name="$1"
  shift
  echo "=== $name: bazel test $* //..."
  local log="$logdir/$name.log"
  : >"$logdir/$name.start"
  ticker "$name" "$logdir/$name.start" "$ntests" &
  local tick=$!
  bazel test "${bazel_flags[@]}" "$@" //... 2>&1 | tee "$log"
  local rc="${PIPESTATUS[0]}"
  kill "$tick" 2>/dev/null
  wait "$tick" 2>/dev/null
  # The logs of the run just made (the link follows the last command).
  local testlogs p=0 k=0 f label tlog cp cs
  testlogs="$(readlink -f bazel-testlogs)"
  for label in $(sed -nE 's/^(\/\/[^ ]+) +(\(cached\) )?PASSED.*/\1/p' "$log"); do
    tlog="$testlogs/${label#//}"
    tlog="${tlog/://}/test.log"
    cp="$(cases "$tlog" PASSED)"
    cs="$(cases "$tlog" SKIPPED)"
    if ((cs > 0 && cp == 0)); then
      k=$((k + 1))
      echo "=== $name: $label SKIPPED: all $cs cases skipped"
    else
      p=$((p + 1))
      if ((cs > 0)); then echo "=== $name: $label passed, $cs of $((cp + cs)) cases skipped"; fi
    fi
  done
  f="$(grep -cE '^//[^ ]+ +(\(cached\) )?(FAILED|TIMEOUT|NO STATUS|INCOMPLETE|FLAKY|REMOTE FAILURE)' "$log")"
  if ((rc != 0 && f == 0)); then f=1; fi
  passed=$((passed + p))
  skipped=$((skipped + k))
  failed=$((failed + f))
  echo "=== $name: $p passed, $k skipped, $f failed (bazel exit $rc)"
}

run_tests opt
run_tests asan --config=asan
run_tests tsan --config=tsan
run_tests ubsan --config=ubsan

# The libFuzzer target (clang, not Bazel: fuzz/run.sh), for a bounded time
# (FUZZ_SECONDS, default 60); one test in the tally.
echo "=== fuzz: fuzz/run.sh ${FUZZ_SECONDS:-60}"
if bash fuzz/run.sh "${FUZZ_SECONDS:-60}"; then
  passed=$((passed + 1))
  echo "=== fuzz: passed"
else
  failed=$((failed + 1))
  echo "=== fuzz: FAILED"
fi

# The README's consumer, from a fresh clone, offline (its own output base;
# the script shuts that server down).
echo "=== newcomer: tools/newcomer-check.sh"
if bash tools/newcomer-check.sh; then
  passed=$((passed + 1))
  echo "=== newcomer: passed"
else
  failed=$((failed + 1))
  echo "=== newcomer: FAILED"
fi

# The native PyTorch backend against the tested torch's headers and
# libraries: a header change in torch fails here, not on a user's machine.
# Exit 3 is a skip (no PyPI, no CUDA headers), saying why.
echo "=== torch-native: tools/torch-native-check.sh"
bash tools/torch-native-check.sh
case $? in
  0) passed=$((passed + 1)); echo "=== torch-native: passed" ;;
  3) skipped=$((skipped + 1)); echo "=== torch-native: SKIPPED" ;;
  *) failed=$((failed + 1)); echo "=== torch-native: FAILED" ;;
esac

cd "$root"
# A CI machine keeps nothing: free the server's memory at once.
if [[ "${CI:-}" == true ]]; then bazel shutdown || true; fi
echo "tests: $passed passed, $skipped skipped, $failed failed"
if ((failed > 0 || passed == 0)); then exit 1; fi
exit 0

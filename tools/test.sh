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
# Every step runs even after a failure, so one run shows everything that is
# broken. The last line counts tests over all steps:
#   tests: N passed, M failed
set -uo pipefail

cd "$(dirname "$0")/.."
root="$(pwd)"

bash tools/bootstrap.sh || { echo "bootstrap failed"; echo "tests: 0 passed, 1 failed"; exit 1; }

passed=0
failed=0
logdir="$(mktemp -d)"
trap 'rm -rf "$logdir"' EXIT

# CI logs are files, not terminals.
bazel_flags=(--color=no --curses=no --show_progress_rate_limit=30)

# Runs one `bazel test` and adds its per-test result lines to the counts.
# A run that fails before testing (a build error) counts as one failure.
run_tests() {
  local name="$1"
  shift
  echo "=== $name: bazel test $* //..."
  local log="$logdir/$name.log"
  bazel test "${bazel_flags[@]}" "$@" //... 2>&1 | tee "$log"
  local rc="${PIPESTATUS[0]}"
  local p f
  p="$(grep -cE '^//[^ ]+ +(\(cached\) )?PASSED' "$log")"
  f="$(grep -cE '^//[^ ]+ +(\(cached\) )?(FAILED|TIMEOUT|NO STATUS|INCOMPLETE|FLAKY|REMOTE FAILURE)' "$log")"
  if ((rc != 0 && f == 0)); then f=1; fi
  passed=$((passed + p))
  failed=$((failed + f))
  echo "=== $name: $p passed, $f failed (bazel exit $rc)"
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

cd "$root"
# A CI machine keeps nothing: free the server's memory at once.
if [[ "${CI:-}" == true ]]; then bazel shutdown || true; fi
echo "tests: $passed passed, $failed failed"
if ((failed > 0 || passed == 0)); then exit 1; fi
exit 0

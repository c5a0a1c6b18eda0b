#!/usr/bin/env bash
# Runs the binaries that tools/gpu-check.sh staged under .gpu/ on the GPU
# machine (which has CUDA and a driver but no Bazel, ck or cmocka), with the
# CUDA backend forced, and prints a table of results last.
#
# Staged as .gpu/run.sh; run from the repository root:
#   bash .gpu/run.sh [--only=a,b] [--sanitize=a,b|all] [--sanitize-tool=memcheck]
#                    [--bench] [--timeout=SECONDS]
#   --only       run only these tests (names without the directory)
#   --sanitize   also run these tests (or all) under compute-sanitizer
#   --bench      also run the staged benchmarks (no arguments each)
#   --timeout    per binary, default 300 (sanitized runs get 4x)
# Writes under $OUT (the device tool's folder; /tmp/gpu-out elsewhere):
# summary.txt (the table), logs.tar.gz (every binary's log), machine.txt.
set -u

cd "$(dirname "$0")/.." || exit 2
G=.gpu
OUT=${OUT:-/tmp/gpu-out}
LOGS=$(mktemp -d)
mkdir -p "$OUT"

only="" sanitize="" tool="memcheck" bench=0 timeout_s=300
for a in "$@"; do
  case "$a" in
    --only=*) only=${a#*=} ;;
    --sanitize=*) sanitize=${a#*=} ;;
    --sanitize-tool=*) tool=${a#*=} ;;
    --bench) bench=1 ;;
    --timeout=*) timeout_s=${a#*=} ;;
    *) echo "run.sh: unknown argument $a" >&2; exit 2 ;;
  esac
done

export LD_LIBRARY_PATH="$PWD/$G/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export STREAMARENA_BACKEND=${STREAMARENA_BACKEND:-cuda}

in_list() { # name, comma-separated list ("all" matches everything)
  [ "$2" = all ] && return 0
  case ",$2," in *",$1,"*) return 0 ;; esac
  return 1
}

{
  echo "staged: $(cat $G/MANIFEST 2>/dev/null | head -3 | tr '\n' ' ')"
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1
  uname -srm
} > "$OUT/machine.txt"
cat "$OUT/machine.txt"

sanitizer=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
rows=()
failed=0

# One binary: run it, keep its log, add a row. $1 kind, $2 path, $3 row name,
# remaining: the command prefix (empty, or the sanitizer).
run_one() {
  local kind=$1 bin=$2 name=$3; shift 3
  local log="$LOGS/$name.log" limit=$timeout_s
  [ $# -gt 0 ] && limit=$((timeout_s * 4))
  local t0=$(date +%s%N)
  timeout -k 10 "$limit" "$@" "$bin" > "$log" 2>&1
  local rc=$?
  local ms=$((($(date +%s%N) - t0) / 1000000))
  local p f s
  p=$(grep -oE '^\[  PASSED  \] [0-9]+' "$log" | grep -oE '[0-9]+$' | tail -1)
  f=$(grep -oE '^\[  FAILED  \] [0-9]+ test' "$log" | grep -oE '[0-9]+' | tail -1)
  s=$(grep -oE '^\[  SKIPPED \] [0-9]+ test' "$log" | grep -oE '[0-9]+' | tail -1)
  local result
  if [ $rc -eq 124 ] || [ $rc -eq 137 ]; then result="TIMEOUT"
  elif [ $# -gt 0 ] && [ $rc -ne 99 ] && [ "${f:-0}" = 0 ] && [ -n "${p:-}" ] &&
    grep -q 'terminated before first instrumented API call' "$log"; then
    # A test of the host simulator makes no CUDA call: the sanitizer has
    # nothing to check and says so with a non-zero exit; the test passed.
    result="NO-GPU-WORK"
  elif [ $rc -ne 0 ]; then result="FAIL(rc=$rc)"
  elif [ "$kind" = test ] && [ -n "${s:-}" ] && [ "${p:-0}" = 0 ]; then result="SKIP"
  else result="PASS"
  fi
  case $result in PASS|SKIP|NO-GPU-WORK) ;; *) failed=$((failed + 1)) ;; esac
  rows+=("$(printf '%-40s %-14s %6s %6s %7s %8s' "$name" "$result" "${p:--}" "${f:-0}" \
    "${s:-0}" "$ms")")
  case $result in PASS|SKIP|NO-GPU-WORK) ;; *)
    echo "---- $name: $result (last lines)"; tail -n 40 "$log" ;;
  esac
}

for bin in $G/bin/test/*; do
  [ -x "$bin" ] || continue
  name=$(basename "$bin")
  [ -n "$only" ] && ! in_list "$name" "$only" && continue
  run_one test "$bin" "$name"
  if [ -n "$sanitize" ] && in_list "$name" "$sanitize"; then
    # Tests fail driver calls on purpose (out of memory, bad mappings): only
    # errors the tool finds in device work count.
    run_one test "$bin" "$name[$tool]" "$sanitizer" --tool "$tool" --error-exitcode 99 \
      --report-api-errors no
  fi
done
if [ $bench -eq 1 ]; then
  for bin in $G/bin/bench/*; do
    [ -x "$bin" ] || continue
    run_one bench "$bin" "$(basename "$bin")"
  done
fi

tar -C "$LOGS" -czf "$OUT/logs.tar.gz" .
{
  echo "STREAMARENA_BACKEND=$STREAMARENA_BACKEND"
  printf '%-40s %-14s %6s %6s %7s %8s\n' test result passed failed skipped ms
  printf '%s\n' "${rows[@]}"
  echo "failed binaries: $failed"
} > "$OUT/summary.txt"
echo
cat "$OUT/summary.txt"
[ $failed -eq 0 ]

#!/usr/bin/env bash
# The benchmarks on the GPU machine (CUDA 13, a driver, python3 with torch;
# no Bazel, ck or cmocka), from what tools/gpu-bench.sh staged under .gpu/.
# Staged as .gpu/bench.sh; run from the repository root:
#   bash .gpu/bench.sh [--with-tests] [--quick] [--no-torch]
#   --with-tests  first run the staged tests (.gpu/run.sh, CUDA backend)
#   --quick       short repetitions (a smoke run, not figures to report)
#   --no-torch    skip bench/torch_compare.py
# Writes under $OUT (the device tool's folder; /tmp/gpu-out elsewhere):
# bench-machine.txt, alloc_bench.log, torch_compare.log, and with
# --with-tests what run.sh writes (summary.txt, logs.tar.gz, machine.txt)
# plus tests.log. Prints the tables last: the tests' summary, alloc_bench's
# table, torch_compare's table.
# Each step has a time limit so one that hangs leaves the others' results
# within the device tool's 600 s.
set -u

cd "$(dirname "$0")/.." || exit 2
G=.gpu
OUT=${OUT:-/tmp/gpu-out}
mkdir -p "$OUT"

tests=0 quick=0 torch=1
for a in "$@"; do
  case "$a" in
    --with-tests) tests=1 ;;
    --quick) quick=1 ;;
    --no-torch) torch=0 ;;
    *) echo "bench.sh: unknown argument $a" >&2; exit 2 ;;
  esac
done

export LD_LIBRARY_PATH="$PWD/$G/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
# Fail rather than fall back to the host simulator if CUDA is not usable.
export STREAMARENA_BACKEND=${STREAMARENA_BACKEND:-cuda}

{
  echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  echo "staged: $(head -2 $G/MANIFEST 2>/dev/null | tr '\n' ' ')"
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv,noheader 2>&1
  echo "cpu: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ //'), $(nproc) CPUs"
  uname -srm
  python3 -c 'import torch; print("torch", torch.__version__, "CUDA", torch.version.cuda)' 2>&1 | tail -1
  echo "load average: $(cut -d' ' -f1-3 /proc/loadavg)"
} > "$OUT/bench-machine.txt"
cat "$OUT/bench-machine.txt"

tests_rc=-
if [ $tests -eq 1 ]; then
  echo "== tests (.gpu/run.sh)"
  bash $G/run.sh --timeout=120 > "$OUT/tests.log" 2>&1
  tests_rc=$?
  echo "tests: exit $tests_rc"
fi

bench_args=()
torch_args=()
if [ $quick -eq 1 ]; then
  bench_args=(--quick)
  torch_args=(--reps 3 --rep-ms 20)
fi

echo "== alloc_bench ${bench_args[*]:-}"
timeout -k 10 240 $G/bin/bench/alloc_bench "${bench_args[@]}" > "$OUT/alloc_bench.log" 2>&1
bench_rc=$?
echo "alloc_bench: exit $bench_rc"

torch_rc=-
if [ $torch -eq 1 ]; then
  echo "== torch_compare ${torch_args[*]:-}"
  timeout -k 10 200 python3 $G/bench/torch_compare.py --workdir "$OUT/torch_build" \
    "${torch_args[@]}" > "$OUT/torch_compare.log" 2>&1
  torch_rc=$?
  echo "torch_compare: exit $torch_rc"
fi

# A log's table (from its "backend" header on), or its tail if it has none.
table() { # log, name, rc
  echo
  echo "==== $2 (exit $3; full log $(basename "$1"))"
  grep '^# \(date\|command\|machine\|gpu\|streamarena\|torch-cpp\|PYTORCH\)' "$1" 2>/dev/null
  if grep -q '^backend ' "$1" 2>/dev/null; then
    sed -n '/^backend /,$p' "$1"
  else
    tail -n 20 "$1" 2>/dev/null
  fi
}

echo
if [ $tests -eq 1 ]; then
  echo "==== tests (exit $tests_rc; $OUT/tests.log, summary.txt)"
  cat "$OUT/summary.txt" 2>/dev/null || tail -n 20 "$OUT/tests.log"
fi
table "$OUT/alloc_bench.log" alloc_bench "$bench_rc"
[ $torch -eq 1 ] && table "$OUT/torch_compare.log" torch_compare "$torch_rc"
ok=1
[ "$bench_rc" = 0 ] || ok=0
[ $torch -eq 0 ] || [ "$torch_rc" = 0 ] || ok=0
[ $tests -eq 0 ] || [ "$tests_rc" = 0 ] || ok=0
[ $ok -eq 1 ]

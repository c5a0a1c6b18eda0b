#!/usr/bin/env bash
# On the GPU machine: every staged test binary beside a soak, then a span
# pair's cost of this build against an earlier one, interleaved. Staged by
# tools/gpu-check.sh into .gpu/ (this script goes there as verify.sh); the
# earlier build's alloc_bench, if any, at .gpu/before/alloc_bench.
#
#   bash .gpu/verify.sh [SOAK_SECONDS]     default 300
# Writes soak.log, suite.log (and the runner's summary), spancost.txt under
# $OUT; prints the soak's line, the span costs and the suite's table last.
set -u
cd "$(dirname "$0")/.." || exit 2
export LD_LIBRARY_PATH="$PWD/.gpu/lib"
OUT=${OUT:-/tmp/gpu-out}
mkdir -p "$OUT"
soak_s=${1:-300}
( STREAMARENA_SOAK_SECONDS=$soak_s STREAMARENA_BACKEND=cuda timeout -k 10 $((soak_s + 150)) \
    .gpu/bin/test/gpu_soak_test > "$OUT/soak.log" 2>&1
  echo "soak rc=$?" >> "$OUT/soak.log" ) &
soak=$!
bash .gpu/run.sh --timeout=240 > "$OUT/suite.log" 2>&1
echo "suite rc=$?" >> "$OUT/suite.log"
wait $soak
builds=(after); [ -x .gpu/before/alloc_bench ] && builds=(before after)
for r in 1 2 3; do
  for b in "${builds[@]}"; do
    bin=.gpu/bin/bench/alloc_bench; [ "$b" = before ] && bin=.gpu/before/alloc_bench
    STREAMARENA_BACKEND=cuda "$bin" --cases=large,large-recorded --reps=5 --backends=streamarena 2>&1 |
      grep -E '^streamarena +large.*T=1' | sed "s/^/$b round$r /"
  done
done > "$OUT/spancost.txt"
echo "== soak"; grep -E "gpu_soak:|PASSED|FAILED|rc=" "$OUT/soak.log" | tail -6
echo "== span pairs, ns (median of 5 repetitions)"; cat "$OUT/spancost.txt"
echo "== suite"; tail -60 "$OUT/suite.log"

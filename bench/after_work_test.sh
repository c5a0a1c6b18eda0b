#!/usr/bin/env bash
# RMM's random allocations up to 4 GiB after a shipped trace, the peer
# benchmark's pairs and threads on the same arena (//bench:after_work):
# the first run costs at most 1.25 x a fresh arena's modelled driver time
# per allocation, every run at most 0.1 virtual-memory driver calls per
# allocation, and --slowest names the first run's costliest allocations.
# Before growths stitched at most SA_STITCH_MAX chunks (c90df9b and
# earlier) the first run after transformer.csv made 0.34 calls per
# allocation at 3.6 x fresh's time.
#   after_work_test.sh AFTER_WORK TRACE...
set -euo pipefail
after_work="$1"
shift
for trace in "$@"; do
  echo "== after $(basename "$trace")"
  out=$("$after_work" --check-ratio=1.25 --check-vmm=0.1 --slowest=2 "$trace")
  echo "$out"
  # --slowest: the after arena's first run grows, so it names allocations.
  grep -q '^after run 1: .* us .* MiB at .* GiB live: ' <<< "$out" ||
    { echo "after_work_test: --slowest printed no allocation of the after arena's first run"; exit 1; }
done

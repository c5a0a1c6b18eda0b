#!/usr/bin/env bash
# Instructions the span tier (large allocations) spends per operation, on
# the host backend, counted by callgrind: RMM's random loop (N=1000, sizes
# up to 4 GiB, ten runs on one instance) and one replay of each shipped
# trace, as //bench/peers:peer_bench runs them. Exact and repeatable where
# time on a shared box is not; what the simulator's own driver calls cost
# is counted too (about a tenth on the traces), the benchmark's loop too.
#
#   tools/span-ir.sh [--no-build] [--conf=SPEC] [case ...]
#     case: random, or a trace file name in bench/traces/ (default: all)
#     --conf: streamarena's configuration (sa_config_parse keys), e.g.
#             footprint_target=1.5
set -euo pipefail
cd "$(git rev-parse --show-toplevel)"

build=1
conf=""
cases=()
for a in "$@"; do
  case "$a" in
    --no-build) build=0 ;;
    --conf=*) conf=",${a#--conf=}" ;;
    -*) echo "span-ir.sh: unknown option $a" >&2; exit 2 ;;
    *) cases+=("$a") ;;
  esac
done
if [ ${#cases[@]} -eq 0 ]; then
  cases=(random)
  for t in bench/traces/*.csv bench/traces/*.csv.gz; do cases+=("$(basename "$t")"); done
fi
command -v valgrind >/dev/null || { echo "span-ir.sh: valgrind not installed" >&2; exit 1; }

[ $build -eq 1 ] && bazel build -c opt //bench/peers:peer_bench >/dev/null 2>&1
bin=$(bazel info -c opt bazel-bin 2>/dev/null)/bench/peers/peer_bench
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# valgrind cannot reserve the default range (4 x the simulated device).
sa_conf="va_reserve=40g$conf"
printf '%-26s %10s %14s %10s\n' case ops instructions Ir/op
for c in "${cases[@]}"; do
  if [ "$c" = random ]; then
    args=(--workloads=random --random-n=0,1000 --random-runs=10)
    collect='*random_runs*'
  else
    [ -f "bench/traces/$c" ] || { echo "span-ir.sh: no trace bench/traces/$c" >&2; exit 2; }
    args=(--workloads=trace --trace-round=1 "bench/traces/$c")
    collect='*replay_on*'
  fi
  valgrind --tool=callgrind --callgrind-out-file="$tmp/cg" --toggle-collect="$collect" \
    "$bin" --backends=streamarena --sa-conf="$sa_conf" --json="$tmp/out.jsonl" "${args[@]}" \
    > "$tmp/log" 2>&1 || { echo "span-ir.sh: $c failed:"; tail -5 "$tmp/log"; exit 1; }
  ir=$(callgrind_annotate "$tmp/cg" 2>/dev/null | awk '/PROGRAM TOTALS/ { gsub(",", "", $1); print $1 }')
  # The operations: a random run's allocations and frees, a trace's ops.
  ops=$(python3 - "$tmp/out.jsonl" <<'PY'
import json, sys
n = 0
for line in open(sys.argv[1]):
    j = json.loads(line)
    if j.get("type") != "result":
        continue
    n += j["allocs"] + j["frees"] if j.get("workload") == "random" else j.get("ops", 0)
print(n)
PY
)
  rm -f "$tmp/out.jsonl"
  [ "$ops" -gt 0 ] || { echo "span-ir.sh: $c: no operations counted" >&2; exit 1; }
  awk -v c="$c" -v n="$ops" -v ir="$ir" 'BEGIN { printf "%-26s %10d %14d %10.1f\n", c, n, ir, ir / n }'
done

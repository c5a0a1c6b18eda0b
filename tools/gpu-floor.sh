#!/usr/bin/env bash
# Run S of docs/BENCHMARKS.md: the driver time a footprint needs, beside the
# whole replays of RMM's pool and streamarena, in one call on a GPU machine.
# Stage first (here): tools/gpu-check.sh, then bench/peers/build.sh. Then, on
# the GPU machine from the checkout's root:
#
#   OUT=/some/dir bash tools/gpu-floor.sh [--rounds=N]
#
# For each trace and ratio R below, bench/growth_bound.py --schedule R lists
# the fewest growths a fresh allocator needs at footprint R, and
# driver_costs --schedule performs them as fast as the driver can (run twice:
# before and after the replays). Between them, peer_bench replays the traces
# through RMM's pool and streamarena, a fresh process per backend and round.
# Logs and schedules go to $OUT; the tables are printed last.
set -u
rounds=3
for a in "$@"; do
  case "$a" in
    --rounds=*) rounds=${a#*=} ;;
    *) echo "usage: OUT=DIR bash tools/gpu-floor.sh [--rounds=N]" >&2; exit 2 ;;
  esac
done
case "$rounds" in ''|*[!0-9]*|0) echo "gpu-floor.sh: --rounds needs a number > 0" >&2; exit 2 ;; esac
out=${OUT:-/tmp/floor-out}
peers=.gpu/peers
costs=.gpu/bin/bench/driver_costs
for f in "$peers/peer_bench" "$peers/plugins/peer_rmm.so" "$costs"; do
  [ -e "$f" ] || { echo "gpu-floor.sh: $f missing: stage with tools/gpu-check.sh and bench/peers/build.sh" >&2; exit 2; }
done
export LD_LIBRARY_PATH="$peers/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
mkdir -p "$out"
specs="transformer.csv:1.012 transformer.csv:1.02 dataframe.csv:1.02 fragmentation.csv:1.02 torch_transformer.csv.gz:1.008"
replayed="bench/traces/transformer.csv bench/traces/dataframe.csv bench/traces/fragmentation.csv"
{
  nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
  echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ); commit: $(git rev-parse --short HEAD 2>/dev/null || echo unknown)"
} | tee "$out/machine.txt"
for spec in $specs; do
  python3 bench/growth_bound.py "bench/traces/${spec%%:*}" --schedule "${spec##*:}" \
    > "$out/schedule-${spec/:/-}.txt" || exit 1
done
floor() { # pass
  for spec in $specs; do
    f="$out/schedule-${spec/:/-}.txt"
    "$costs" --schedule "$f" --ops "$(sed -n 's/^# ops \([0-9]*\).*/\1/p' "$f")" --rounds 5 || return 1
  done > "$out/floor-$1.txt" 2>&1
}
fail=0
floor 1 || fail=1
for round in $(seq "$rounds"); do
  for b in rmm-pool streamarena; do
    plugin=()
    [ "$b" = rmm-pool ] && plugin=(--plugin="$peers/plugins/peer_rmm.so")
    timeout 300 "$peers/peer_bench" --require-gpu --workloads=trace --backends="$b" "${plugin[@]}" \
      --trace-round="$round" --json="$out/replays.jsonl" $replayed >> "$out/replay-$b.log" 2>&1 ||
      { echo "gpu-floor.sh: $b, round $round: exit $?"; fail=1; }
  done
done
floor 2 || fail=1
cat "$out/floor-1.txt"; echo "== again, after the replays"; cat "$out/floor-2.txt"
python3 - "$out/replays.jsonl" <<'PY'
import collections, json, sys
rows = collections.defaultdict(list)
for line in open(sys.argv[1]):
    d = json.loads(line)
    if d.get("type") == "result":
        rows[(d["case"], d["backend"])].append(d)
print("\n| trace | backend | us per op, each round | peak reserved / peak live |")
print("| --- | --- | ---: | ---: |")
for (case, backend), v in sorted(rows.items()):
    print(f"| {case} | {backend} | {', '.join('%.3f' % x['us_per_op'] for x in v)} | "
          f"{max(x['ratio'] for x in v):.3f} |")
PY
exit $fail

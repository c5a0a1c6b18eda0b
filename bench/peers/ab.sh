#!/usr/bin/env bash
# Two builds of peer_bench, a process of each in turn, on the same trace
# replays: what a library change does on the GPU machine, whose CPU runs
# in spells longer than a replay (docs/BENCHMARKS.md, runs CL-CP). Staged
# beside run.sh by bench/peers/build.sh; tools/gpu-ab.sh stages the base.
#
#   bash .gpu/peers/ab.sh [--base=PATH] [--new=PATH] [--processes=N]
#                         [--ref=BACKEND] -- PEER_BENCH_ARGS...
#   --base       the base build (default: peer_bench.base beside this script)
#   --new        the new build (default: peer_bench beside this script)
#   --processes  processes of each build (default 4), alternated base, new
#   --ref        the backend each replay is paired with (default rmm-pool),
#                which PEER_BENCH_ARGS must name among --backends
#   PEER_BENCH_ARGS  must hold --trace-turns=N (the rounds in one process):
#                e.g. --plugin=.gpu/peers/plugins/peer_rmm.so
#                --backends=streamarena-ft2,rmm-pool --workloads=trace
#                --trace-turns=20 .gpu/peers/traces/transformer.csv
#
# Writes $OUT/ab.jsonl (default OUT /tmp/ab-out): every result line tagged
# with its build (ab_label: base or new) and process (ab_process), and
# $OUT/ab.md, ab.py's table, which it also prints. Exit 1 if a process
# failed or nothing was paired.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
base=$here/peer_bench.base new=$here/peer_bench processes=4 ref=rmm-pool
while [ $# -gt 0 ]; do
  case "$1" in
    --base=*) base=${1#*=} ;;
    --new=*) new=${1#*=} ;;
    --processes=*) processes=${1#*=} ;;
    --ref=*) ref=${1#*=} ;;
    --) shift; break ;;
    -h|--help) sed -n '2,/^set -e/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "ab.sh: unknown argument $1 (peer_bench's go after --)" >&2; exit 2 ;;
  esac
  shift
done
case " $* " in
  *" --trace-turns="*) ;;
  *) echo "ab.sh: give peer_bench --trace-turns=N: the pairs are a process's rounds" >&2; exit 2 ;;
esac
[[ "$processes" =~ ^[1-9][0-9]*$ ]] || { echo "ab.sh: --processes=$processes" >&2; exit 2; }
for b in "$base" "$new"; do
  [ -x "$b" ] || { echo "ab.sh: no program at $b" >&2; exit 2; }
done
out=${OUT:-/tmp/ab-out}
mkdir -p "$out"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
export LD_LIBRARY_PATH=$here/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
: > "$out/ab.jsonl"
failed=0
for i in $(seq 1 "$processes"); do
  for label in base new; do
    bin=$base
    [ "$label" = new ] && bin=$new
    json=$work/$label.$i.jsonl
    if ! "$bin" "$@" --json="$json" > "$work/log" 2>&1; then
      echo "ab.sh: $label process $i failed:" >&2
      tail -n 5 "$work/log" >&2
      failed=1
    fi
    [ -f "$json" ] || continue
    python3 - "$json" "$label" "$i" >> "$out/ab.jsonl" <<'PY'
import json, sys
for line in open(sys.argv[1]):
    if line.strip():
        r = json.loads(line)
        r["ab_label"], r["ab_process"] = sys.argv[2], int(sys.argv[3])
        print(json.dumps(r))
PY
  done
done
python3 "$here/ab.py" --ref="$ref" "$out/ab.jsonl" | tee "$out/ab.md"
exit "$failed"

#!/usr/bin/env bash
# Instructions per sa_alloc and per sa_free call, per workload of
# //bench:alloc_bench on the host backend, counted by callgrind (exact and
# repeatable where time is not: no hardware counters needed).
#
#   tools/fastpath-ir.sh [--no-build] [case ...]   (default: the one-thread cases)
#
# Each case runs single-threaded in its own process under valgrind; the
# counts are inclusive (slow paths included, averaged over every call the
# benchmark loop made, warm-up and calibration too).
set -euo pipefail
cd "$(git rev-parse --show-toplevel)"

build=1
cases=()
for a in "$@"; do
  case "$a" in
    --no-build) build=0 ;;
    -*) echo "fastpath-ir.sh: unknown option $a" >&2; exit 2 ;;
    *) cases+=("$a") ;;
  esac
done
[ ${#cases[@]} -gt 0 ] || cases=(256B 4KiB 64KiB 1MiB mixed mixed-b16 cross large)
command -v valgrind >/dev/null || { echo "fastpath-ir.sh: valgrind not installed" >&2; exit 1; }

[ $build -eq 1 ] && bazel build -c opt //bench:alloc_bench >/dev/null 2>&1
bin=$(bazel info -c opt bazel-bin 2>/dev/null)/bench/alloc_bench
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

printf '%-10s %12s %12s %12s %12s\n' case pairs Ir/sa_alloc Ir/sa_free Ir/pair
for c in "${cases[@]}"; do
  # valgrind cannot reserve the default range (4 x the simulated 16 GiB).
  valgrind --tool=callgrind --callgrind-out-file="$tmp/cg.$c" "$bin" --cases="$c" \
    --threaded=none --reps=1 --rep-ms=200 --sa-conf=backend=host,va_reserve=4GiB \
    > "$tmp/log.$c" 2>&1 || { echo "fastpath-ir.sh: $c failed:"; tail -5 "$tmp/log.$c"; exit 1; }
  # The callees of the pair loop: "<inclusive Ir> (...)  >  ???:sa_alloc (<calls>x) ...".
  callgrind_annotate --tree=calling --inclusive=yes "$tmp/cg.$c" 2>/dev/null |
    awk -v c="$c" '
      /\*  .*:pairs_streamarena / { inloop = 1; next }
      inloop && /^ *$/ { inloop = 0 }
      inloop && />   .*:sa_(alloc|free) \(/ {
        ir = $1; gsub(",", "", ir)
        fn = $0; sub(/.*:sa_/, "", fn); sub(/ .*/, "", fn)
        n = $0; sub(/.*\(/, "", n); sub(/x\).*/, "", n); gsub(",", "", n)
        cost[fn] = ir; calls[fn] = n
      }
      END {
        if (calls["alloc"] == 0 || calls["free"] == 0) { print c ": no counts found"; exit 1 }
        a = cost["alloc"] / calls["alloc"]; f = cost["free"] / calls["free"]
        printf "%-10s %12d %12.1f %12.1f %12.1f\n", c, calls["alloc"], a, f, a + f
      }'
done

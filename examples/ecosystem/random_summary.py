#!/usr/bin/env python3
"""RMM's random allocations through RMM's interface against the direct C
call, from peer_bench's JSON lines (tools/gpu-ecosystem.sh runs the two
backends, streamarena and rmm-streamarena, in interleaved rounds): the
median microseconds per allocation of each case, cold (the first run of a
process, which maps the arena's memory) and warm (every later run of every
process, pooled: a warm run of the 4 GiB case lasts about a millisecond,
so one run a process is mostly noise), and their ratio. The bound, 1.5,
is on the warm medians. Exit 1 when a warm ratio passes it, a backend
failed, or nothing was measured.

    random_summary.py RESULTS.jsonl [--bound 1.5]
"""
import argparse
import collections
import json
import statistics
import sys

DIRECT, VIA_RMM = "streamarena", "rmm-streamarena"


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("results")
    p.add_argument("--bound", type=float, default=1.5)
    a = p.parse_args()
    rows = []
    try:
        with open(a.results) as f:
            for line in f:
                try:
                    rows.append(json.loads(line))
                except ValueError:
                    continue  # a line cut short by a stopped process
    except OSError as e:
        print(f"result: no results ({e})")
        return 1
    errors = [r for r in rows if r.get("type") == "error"]
    us = collections.defaultdict(list)
    for r in rows:
        if r.get("type") == "result" and r.get("workload") == "random" and not r.get("truncated"):
            phase = 1 if r["run"] == 1 else 2
            us[(r["case"], phase, r["backend"])].append(r["us_per_alloc"])
    print(f"{'case':<12} {'run':<5} {'direct us':>10} {'via RMM us':>11} {'ratio':>6}  runs")
    worst, warm_rows = 0.0, 0
    for case in sorted({k[0] for k in us}):
        for run in (1, 2):
            d, v = us.get((case, run, DIRECT)), us.get((case, run, VIA_RMM))
            if not d or not v:
                continue
            ratio = statistics.median(v) / statistics.median(d)
            if run == 2:
                worst = max(worst, ratio)
                warm_rows += 1
            print(f"{case:<12} {'cold' if run == 1 else 'warm':<5} {statistics.median(d):10.3f} "
                  f"{statistics.median(v):11.3f} {ratio:6.2f}  {len(d)}/{len(v)}")
    for e in errors:
        print("error:", e.get("backend"), e.get("workload"), e.get("error"))
    ok = warm_rows > 0 and not errors and worst <= a.bound
    print(f"result: worst warm median ratio through RMM {worst:.2f} (bound {a.bound}): "
          f"{'within' if ok else 'NOT within'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

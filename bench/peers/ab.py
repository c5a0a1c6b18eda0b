#!/usr/bin/env python3
"""Two builds of peer_bench against one reference backend, from ab.sh's output.

    python3 bench/peers/ab.py [--ref=BACKEND] AB.jsonl

ab.sh runs a base build and a new build of peer_bench in alternate
processes, each replaying traces in turns (--trace-turns) with a reference
backend such as rmm-pool, and tags every JSON line with the build
(ab_label) and the process (ab_process). On this machine's GPU a process
draws a spell of the CPU's speed that lasts longer than a replay, so the
figure that compares builds is the paired ratio: each round's replay of a
backend over the reference's replay of the same round, in the same
process. Prints, per trace, backend and build: the median paired ratio of
the rounds after each process's first (the first is slower whatever runs),
how many of them were below 1, each process's median us per op, and the
footprints (peak reserved over peak live) seen. Exit 1 if the file holds
no pair.
"""
import argparse
import json
import sys

from plot import median  # plot.py lies beside it, staged and tested together


def summarize(rows, ref):
    """{(case, backend, label): {"ratios", "process_us", "footprints"}}."""
    # (label, process, case, round) -> {backend: result}
    turns = {}
    for r in rows:
        if r.get("type") != "result" or r.get("workload") != "trace" or "round" not in r:
            continue
        key = (r["ab_label"], r["ab_process"], r["case"], r["round"])
        turns.setdefault(key, {})[r["backend"]] = r
    out = {}
    per_process = {}
    for (label, process, case, rnd), by in sorted(turns.items()):
        if rnd == 1 or ref not in by:
            continue
        for backend, r in by.items():
            if backend == ref:
                continue
            s = out.setdefault((case, backend, label),
                               {"ratios": [], "process_us": [], "footprints": set()})
            s["ratios"].append(r["us_per_op"] / by[ref]["us_per_op"])
            s["footprints"].add(round(r["ratio"], 3))
            per_process.setdefault((case, backend, label, process), []).append(r["us_per_op"])
    for (case, backend, label, _), us in sorted(per_process.items()):
        out[(case, backend, label)]["process_us"].append(median(us))
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("file", help="ab.sh's AB.jsonl")
    ap.add_argument("--ref", default="rmm-pool", help="the reference backend (default rmm-pool)")
    args = ap.parse_args()
    rows = [json.loads(l) for l in open(args.file) if l.strip()]
    table = summarize(rows, args.ref)
    if not table:
        sys.exit(f"ab.py: no replay paired with {args.ref} in {args.file}")
    print(f"| trace | backend | build | ratio to {args.ref} (median) | below 1 | "
          "us/op per process | footprint |")
    print("| --- | --- | --- | ---: | ---: | --- | --- |")
    for (case, backend, label), s in sorted(table.items()):
        below = sum(x < 1 for x in s["ratios"])
        print(f"| {case} | {backend} | {label} | {median(s['ratios']):.3f} | "
              f"{below} of {len(s['ratios'])} | "
              f"{' '.join('%.3f' % u for u in s['process_us'])} | "
              f"{' '.join('%.3f' % f for f in sorted(s['footprints']))} |")


if __name__ == "__main__":
    main()

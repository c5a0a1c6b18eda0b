#!/usr/bin/env python3
"""Compares two runs of CuPy's test suite (cupy_suite_plugin.py's outcome
files): the counts of each outcome per run, the tests whose outcome
differs, and the streamarena run's figures.

    compare_suites.py POOL.jsonl STREAMARENA.jsonl [--max-list N]
"""
import argparse
import collections
import json
import os
import sys


def read(path):
    out = {}
    if os.path.exists(path):
        with open(path) as f:
            for line in f:
                try:
                    r = json.loads(line)
                except ValueError:
                    continue  # a line cut short by a stopped run
                out[r["test"]] = r["outcome"]
    return out


def counts(outcomes):
    c = collections.Counter(outcomes.values())
    return ", ".join(f"{c[k]} {k}" for k in sorted(c)) or "no results"


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("pool")
    p.add_argument("streamarena")
    p.add_argument("--max-list", type=int, default=60)
    a = p.parse_args()
    pool, sa = read(a.pool), read(a.streamarena)
    print(f"CuPy suite, default pool:  {len(pool)} tests: {counts(pool)}")
    print(f"CuPy suite, streamarena:   {len(sa)} tests: {counts(sa)}")
    both = sorted(set(pool) & set(sa))
    differ = [t for t in both if pool[t] != sa[t]]
    only = len(set(pool) ^ set(sa))
    print(f"run by both: {len(both)}; outcome differs: {len(differ)}; run by one only "
          f"(a run cut short): {only}")
    for t in differ[:a.max_list]:
        print(f"  {pool[t]:>8} -> {sa[t]:<8} {t}")
    if len(differ) > a.max_list:
        print(f"  ... {len(differ) - a.max_list} more")
    stats = a.streamarena + ".stats"
    if os.path.exists(stats):
        rows = [json.loads(line) for line in open(stats) if line.strip()]
        print(f"streamarena in {len(rows)} processes: "
              f"{sum(r['allocations'] for r in rows)} allocations, "
              f"{sum(r['errors'] for r in rows)} failed calls, allocator set again before "
              f"{sum(r['allocator_set_again'] for r in rows)} tests")
    # A test that fails with streamarena and not with the pool is the one
    # finding that counts against it; the list above says which.
    failed_sa = sum(1 for t in differ if sa[t] in ("failed", "error"))
    print(f"suite-compare: {len(both) - failed_sa} passed, {failed_sa} failed")
    return 1 if failed_sa or not both else 0


if __name__ == "__main__":
    sys.exit(main())

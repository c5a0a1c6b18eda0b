#!/usr/bin/env python3
"""The fewest growths any allocator needs on a trace at a given footprint.

    python3 bench/growth_bound.py TRACE.csv[.gz]... [--ratios 1.0,1.012,1.02,1.05,2]
                                   [--growth-us 63]
    python3 bench/growth_bound.py TRACE --schedule R > growths.txt

An allocator that must never hold more than r x the highest live bytes so
far (it cannot know the trace's peak in advance: the trace may end at any
point, so each prefix's footprint is at most r) has to grow whenever live
bytes pass what it holds, and can then hold at most r x the new live peak.
Even packing every byte perfectly (no fragmentation, no rounding), it makes
at least the growths this counts. Each growth is at least one driver call
pair that brings up physical memory: on an H200 with driver 580 a chunk's
create, map and access setting cost 63 us at 2 MiB and more above
(docs/DEFRAG.md), and cudaMalloc 45 us at 2 MiB. So the bound in us per
operation is what a fresh allocator at that footprint cannot beat on the
trace, whatever its design; a pool that over-allocates (RMM's doubles:
about r = 2) needs a handful.

--schedule R prints those growths at ratio R instead, one size in bytes a
line (what each adds to the holdings), after comment lines that name the
trace and its operations: `driver_costs --schedule FILE --ops N` performs
them on a GPU with the fewest driver calls there are, which measures the
bound instead of assuming a growth's cost.

Reads streamarena's trace format (thread,stream,op,id,size,...) and
PyTorch's (stream,action,addr,size,...: a block is freed at
free_requested), plain or gzipped; lines starting with # are comments.
"""
import argparse
import gzip
import sys


def events(path):
    """(is_alloc, key, size) per allocation and free, in order."""
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt") as f:
        header = None
        for line in f:
            if line.startswith("#") or not line.strip():
                continue
            cols = line.rstrip("\n").split(",")
            if header is None:
                header = {name: i for i, name in enumerate(cols)}
                if "op" not in header and "action" not in header:
                    raise ValueError(f"{path}: neither streamarena's nor PyTorch's trace header")
                continue
            if "op" in header:
                op, key = cols[header["op"]], cols[header["id"]]
                if op in ("alloc", "free"):
                    yield op == "alloc", key, int(cols[header["size"]] or 0)
            else:
                action, key = cols[header["action"]], cols[header["addr"]]
                if action == "alloc":
                    yield True, key, int(cols[header["size"]])
                elif action == "free_requested":
                    yield False, key, 0


def bound(trace, ratios):
    """Operations, peak live bytes, and {r: [bytes of each growth]} for the trace."""
    sizes, live, peak, ops = {}, 0, 0, 0
    held = {r: 0 for r in ratios}
    growths = {r: [] for r in ratios}
    for is_alloc, key, size in trace:
        ops += 1
        if not is_alloc:
            live -= sizes.pop(key, 0)
            continue
        sizes[key] = size
        live += size
        peak = max(peak, live)
        for r in ratios:
            if live > held[r]:
                now = max(live, int(r * peak))
                growths[r].append(now - held[r])
                held[r] = now
    return ops, peak, growths


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("traces", nargs="+")
    p.add_argument("--ratios", default="1.0,1.012,1.02,1.05,1.1,1.4,2")
    p.add_argument("--growth-us", type=float, default=63.0,
                   help="driver time of one growth, us (H200: a 2 MiB chunk's create, map, access)")
    p.add_argument("--schedule", type=float, metavar="R",
                   help="print the growths at ratio R, one size in bytes a line")
    args = p.parse_args(argv)
    try:
        ratios = [float(x) for x in args.ratios.split(",")]
    except ValueError:
        p.error(f"--ratios: not a list of numbers: {args.ratios}")
    if args.schedule is not None:
        if len(args.traces) != 1:
            p.error("--schedule: one trace")
        ratios = [args.schedule]
    if any(r < 1 for r in ratios):
        p.error("--ratios and --schedule: each at least 1")
    if args.schedule is None:
        print("| trace | ops | peak live MiB | r | fewest growths | us/op at %.0f us a growth |"
              % args.growth_us)
        print("| --- | ---: | ---: | ---: | ---: | ---: |")
    for path in args.traces:
        try:
            ops, peak, growths = bound(events(path), ratios)
        except (OSError, ValueError, KeyError, IndexError) as e:
            print(f"growth_bound: {path}: {e}", file=sys.stderr)
            return 1
        name = path.rsplit("/", 1)[-1]
        if args.schedule is not None:
            r = args.schedule
            print(f"# {name}: the fewest growths at r = {r:g}, bytes each")
            print(f"# ops {ops}, peak live {peak}, growths {len(growths[r])}, "
                  f"bytes {sum(growths[r])}")
            for size in growths[r]:
                print(size)
            continue
        for r in ratios:
            n = len(growths[r])
            us = n * args.growth_us / ops if ops else 0.0
            print(f"| {name} | {ops} | {peak / 2**20:.1f} | {r:g} | {n} | {us:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())

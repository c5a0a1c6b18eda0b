#!/usr/bin/env python3
"""PyTorch's memory history, from a snapshot file to the CSV //bench:replay reads.

    python3 bench/torch_trace.py SNAPSHOT.pickle [-o TRACE.csv[.gz]] [--device N]

SNAPSHOT.pickle is what torch.cuda.memory._dump_snapshot() writes after
torch.cuda.memory._record_memory_history() (examples/torch/train.py
--memory-history does both). Its `device_traces` list every event of the
caching allocator; this writes one device's as PyTorch's trace format
(docs/TRACE.md): stream,action,addr,size,time_us, one line per event, in
order. -o with .gz compresses. Reading the pickle needs no PyTorch (the
snapshot is dicts and lists).

Prints one summary line, counted the way the replay reads the trace (the
free at free_requested, or at free_completed when no request came): events, allocations, frees, streams, peak live
bytes, blocks never freed, frees of blocks allocated before the history
started.
"""
import argparse
import gzip
import pickle
import sys


def convert(events, out):
    """Write events as CSV to out; returns the summary counts."""
    live = {}  # addr -> size
    requested = set()  # freed at free_requested, free_completed still to come
    streams = set()
    n = allocs = frees = early = live_bytes = peak = 0
    out.write("stream,action,addr,size,time_us\n")
    for ev in events:
        n += 1
        action, addr, size = ev.get("action", ""), int(ev.get("addr", 0)), int(ev.get("size", 0))
        stream = int(ev.get("stream", 0))
        out.write(f"{stream},{action},{addr},{size},{int(ev.get('time_us', 0))}\n")
        if action == "alloc":
            live[addr] = size
            live_bytes += size
            peak = max(peak, live_bytes)
            streams.add(stream)
            allocs += 1
        elif action == "free_requested" or (action == "free_completed" and
                                             addr not in requested):
            if addr in live:
                live_bytes -= live.pop(addr)
                frees += 1
            elif action == "free_requested":
                early += 1
            if action == "free_requested":
                requested.add(addr)
        elif action == "free_completed":
            requested.discard(addr)
    return {"events": n, "allocs": allocs, "frees": frees, "streams": len(streams),
            "peak_live": peak, "never_freed": len(live), "early_frees": early}


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("snapshot")
    p.add_argument("-o", "--output", help="the CSV, .gz to compress (default: standard output)")
    p.add_argument("--device", type=int, default=0)
    args = p.parse_args(argv)
    try:
        with open(args.snapshot, "rb") as f:
            snapshot = pickle.load(f)
    except Exception as e:  # a missing file, or garbage: pickle raises many kinds
        print(f"torch_trace: {args.snapshot}: cannot read a snapshot: {e}", file=sys.stderr)
        return 1
    if not isinstance(snapshot, dict):
        print(f"torch_trace: {args.snapshot}: not a memory snapshot (a {type(snapshot).__name__})",
              file=sys.stderr)
        return 1
    traces = snapshot.get("device_traces", [])
    if args.device >= len(traces):
        print(f"torch_trace: {args.snapshot} has the traces of {len(traces)} devices, not of "
              f"device {args.device}", file=sys.stderr)
        return 1
    if not args.output:
        st = convert(traces[args.device], sys.stdout)
    else:
        opener = gzip.open if args.output.endswith(".gz") else open
        with opener(args.output, "wt") as out:
            st = convert(traces[args.device], out)
    print(f"torch_trace: {st['events']} events, {st['allocs']} allocs, {st['frees']} frees, "
          f"{st['streams']} streams, peak live {st['peak_live'] / (1 << 20):.1f} MiB, "
          f"{st['never_freed']} never freed, {st['early_frees']} frees of blocks allocated "
          "before the history started", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())

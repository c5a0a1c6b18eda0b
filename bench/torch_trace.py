#!/usr/bin/env python3
"""PyTorch's memory history as a trace //bench:replay reads.

    python3 bench/torch_trace.py SNAPSHOT.pickle [-o TRACE.csv] [--device N]

SNAPSHOT.pickle is what torch.cuda.memory._dump_snapshot() writes after
torch.cuda.memory._record_memory_history() (examples/torch/train.py
--memory-history does both). Its trace lists, per device, every allocator
event with its stream, address and size; this writes them in streamarena's
own trace format (docs/TRACE.md):

    alloc            -> alloc
    free_requested   -> free  (the program's free: PyTorch defers reuse behind
                               recorded streams, the replayed allocator does
                               the same by itself)
    free_completed   -> free, only for a block whose free_requested is missing
    segment_* , snapshot, oom  -> left out (the allocator's own doings)

Reading the pickle needs no PyTorch (the snapshot is dicts and lists).
Prints one summary line: events read, allocs, frees, streams, peak live.
"""
import argparse
import pickle
import sys


def convert(snapshot, device, out):
    traces = snapshot.get("device_traces", [])
    if device >= len(traces):
        raise ValueError(f"the snapshot has traces of {len(traces)} devices, not device {device}")
    live = {}  # addr -> size, allocated and not yet freed in the trace
    streams = set()
    n_alloc = n_free = n_events = n_unmatched = 0
    live_bytes = peak = 0
    out.write("thread,stream,op,id,size,time_ns\n")
    for ev in traces[device]:
        n_events += 1
        action, addr = ev.get("action"), ev.get("addr", 0)
        stream = int(ev.get("stream", 0))
        when = int(ev.get("time_us", 0)) * 1000
        s = f"0x{stream:x}" if stream else "(nil)"
        if action == "alloc":
            size = int(ev["size"])
            live[addr] = size
            live_bytes += size
            peak = max(peak, live_bytes)
            streams.add(stream)
            n_alloc += 1
            out.write(f"1,{s},alloc,0x{addr:x},{size},{when}\n")
        elif action in ("free_requested", "free_completed"):
            if addr not in live:  # its free was requested already, or it predates the trace
                n_unmatched += action == "free_requested"
                continue
            live_bytes -= live.pop(addr)
            n_free += 1
            out.write(f"1,{s},free,0x{addr:x},0,{when}\n")
    return {"events": n_events, "allocs": n_alloc, "frees": n_free, "streams": len(streams),
            "peak_live": peak, "never_freed": len(live), "unmatched_frees": n_unmatched}


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("snapshot")
    p.add_argument("-o", "--output", help="the CSV (default: standard output)")
    p.add_argument("--device", type=int, default=0)
    args = p.parse_args(argv)
    with open(args.snapshot, "rb") as f:
        snapshot = pickle.load(f)
    out = open(args.output, "w") if args.output else sys.stdout
    try:
        out.write(f"# bench/torch_trace.py from {args.snapshot}, device {args.device}\n")
        st = convert(snapshot, args.device, out)
    finally:
        if args.output:
            out.close()
    print(f"torch_trace: {st['events']} events, {st['allocs']} allocs, {st['frees']} frees, "
          f"{st['streams']} streams, peak live {st['peak_live'] / (1 << 20):.1f} MiB, "
          f"{st['never_freed']} never freed, {st['unmatched_frees']} frees of blocks "
          "allocated before the history started", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())

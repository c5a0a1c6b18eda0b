#!/usr/bin/env python3
"""Replays an allocation trace through the PyTorch plugin's hooks on the host
simulator, with the device running behind the host, and reports the peak
footprint.

    python3 bench/torch_replay.py PLUGIN.so TRACE.csv [--lag N] [--conf SPEC]

A training loop's host thread runs ahead of the GPU: when it frees a tensor
and asks for the next one, the kernels that used the freed one are usually
still queued, and the free's event has not completed. //bench:replay models
a device that keeps up (every event completes when queried); this models one
that lags. Every allocation and free enqueues a small kernel on its stream
(the work that uses the block), and the simulated device runs what the
streams were given in issue order, N allocations and frees behind the host
(--lag, default 1000; a training step of train.py makes about 1100 of them).
Events the allocator records complete when the device reaches them.

The calls are sa_torch_malloc and sa_torch_free, as PyTorch makes them (free
on the allocation's stream), on the default arena of device 0
(STREAMARENA_CONF is --conf with backend=host). TRACE.csv is in streamarena's
or PyTorch's format (docs/TRACE.md), gzipped or not; bench/torch_trace.py
writes PyTorch's memory history in the latter. Prints one line: operations, peak requested, peak reserved, ratio.
"""
import argparse
import collections
import gzip
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "python"))


def read_trace(path):
    """(stream, 'alloc' or 'free', id, size) per allocation and free of a
    trace in streamarena's or PyTorch's format (docs/TRACE.md), gzipped or
    not. PyTorch's free is at free_requested (at free_completed when no
    request came); its allocator's own events are left out."""
    with open(path, "rb") as probe:
        gz = probe.read(2) == b"\x1f\x8b"
    with (gzip.open(path, "rt") if gz else open(path)) as f:
        col = None
        requested = set()
        for line in f:
            if line.startswith("#") or not line.strip():
                continue
            fields = line.rstrip("\n").split(",")
            if col is None:
                col = {name.strip().lower(): i for i, name in enumerate(fields)}
                op, ident = ("action", "addr") if "action" in col else ("op", "id")
                if not {"stream", op, ident, "size"} <= col.keys():
                    raise ValueError(f"{path}: not a trace header (need stream, op, id, size "
                                     "or stream, action, addr, size)")
                continue
            act, key = fields[col[op]], fields[col[ident]]
            if act == "free_completed" and key in requested:
                requested.discard(key)
                continue
            if act == "free_requested":
                requested.add(key)
            kind = {"alloc": "alloc", "free": "free", "free_requested": "free",
                    "free_completed": "free"}.get(act)
            if kind is not None:
                yield fields[col["stream"]], kind, key, int(fields[col["size"]])


def replay(plugin, host, ops, lag):
    streams = {}
    live = {}
    ran = collections.Counter()     # operations completed per stream, ever
    due = collections.Counter()     # ... that the device has reached
    queue = collections.deque()     # (stream, ticket): device work in issue order
    n = failed = 0

    def stream(token):
        if token not in streams:
            streams[token] = host.stream(sah.MANUAL)
        return streams[token]

    issued = collections.Counter()  # ... enqueued, as far as the queue knows

    def advance():
        """The device's queue gets what every stream was given since the last
        call (the kernel, the allocator's event records and waits, on any
        stream); it runs lag entries behind."""
        for o in streams.values():
            t = ran[o] + host.pending(o)
            if t > issued[o]:
                issued[o] = t
                queue.append((o, t))
        reached = False
        while len(queue) > lag:
            o, ticket = queue.popleft()
            due[o] = max(due[o], ticket)
            reached = True
        while reached:  # a stream stopped at a wait may go on once another ran
            reached = False
            for o in due:
                if due[o] > ran[o]:
                    done = host.step(o, due[o] - ran[o])
                    ran[o] += done
                    reached |= done > 0

    for token, op, ident, size in ops:
        s = stream(token)
        if op == "alloc":
            p = plugin.malloc(size, 0, s)
            if not p:
                failed += 1
                continue
            live[ident] = (p, size, s)
            host.fill(s, p, 4, 0)  # one word: the work that uses the block
            advance()
            n += 1
        elif ident in live:
            p, size, s0 = live.pop(ident)
            host.fill(s0, p, 4, 0)
            plugin.free(p, size, 0, s0)
            advance()
            n += 1
    host.drain_all()
    return n, failed, len(streams)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("plugin")
    p.add_argument("trace")
    p.add_argument("--lag", type=int, default=1000, help="kernels the device runs behind")
    p.add_argument("--conf", default="", help="arena configuration (README's keys)")
    p.add_argument("--device-bytes", default="64GiB",
                   help="simulated device memory (STREAMARENA_HOST_DEVICE_BYTES)")
    args = p.parse_args(argv)
    os.environ["STREAMARENA_CONF"] = "backend=host" + (f",{args.conf}" if args.conf else "")
    os.environ["STREAMARENA_HOST_DEVICE_BYTES"] = args.device_bytes
    global sah
    import streamarena.host as sah
    import streamarena.torch as sat

    plugin = sat.Plugin(args.plugin)
    host = sah.Host(plugin.lib)
    n, failed, nstreams = replay(plugin, host, read_trace(args.trace), args.lag)
    st = plugin.stats(0)
    req, res = st["requested_bytes_peak"], st["reserved_bytes_peak"]
    print(f"{os.path.basename(args.trace)}: lag {args.lag}, conf {args.conf or '(defaults)'}: "
          f"{n} ops, {nstreams} streams, peak requested {req / 2**30:.3f} GiB, peak reserved "
          f"{res / 2**30:.3f} GiB, ratio {res / max(1, req):.4f}, {failed} failed allocations")
    return 1 if failed or plugin.errors() else 0


if __name__ == "__main__":
    sys.exit(main())

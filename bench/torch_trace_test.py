#!/usr/bin/env python3
"""bench/torch_trace.py on a memory history shaped like PyTorch's (two
streams, a free whose free_requested comes before its free_completed, one
with only free_completed, one of a block allocated before the history,
segment events), written gzipped, then //bench:replay on the result.

    torch_trace_test.py TORCH_TRACE_PY REPLAY
"""
import gzip
import os
import pickle
import subprocess
import sys
import tempfile

MiB = 1 << 20


def main():
    converter, replay = sys.argv[1], sys.argv[2]
    s1, s2 = 0x5A00, 0x5B00
    ev = [
        {"action": "segment_alloc", "addr": 0x1000_0000, "size": 20 * MiB, "stream": 0,
         "time_us": 1},
        {"action": "alloc", "addr": 0x1000_0000, "size": 4 * MiB, "stream": 0, "time_us": 2},
        {"action": "alloc", "addr": 0x1040_0000, "size": 6 * MiB, "stream": s1, "time_us": 3},
        {"action": "free_requested", "addr": 0x0900_0000, "size": MiB, "stream": 0,
         "time_us": 4},  # allocated before the history started
        {"action": "free_requested", "addr": 0x1040_0000, "size": 6 * MiB, "stream": s1,
         "time_us": 5},
        {"action": "alloc", "addr": 0x1100_0000, "size": 8 * MiB, "stream": s2, "time_us": 6},
        {"action": "free_completed", "addr": 0x1040_0000, "size": 6 * MiB, "stream": s1,
         "time_us": 7},
        {"action": "free_completed", "addr": 0x1000_0000, "size": 4 * MiB, "stream": 0,
         "time_us": 8},  # no free_requested recorded
        {"action": "alloc", "addr": 0x1040_0000, "size": 2 * MiB, "stream": s1, "time_us": 9},
        {"action": "free_requested", "addr": 0x1040_0000, "size": 2 * MiB, "stream": s1,
         "time_us": 10},
        {"action": "free_requested", "addr": 0x1100_0000, "size": 8 * MiB, "stream": s2,
         "time_us": 11},
        {"action": "segment_free", "addr": 0x1000_0000, "size": 20 * MiB, "stream": 0,
         "time_us": 12},
    ]
    with tempfile.TemporaryDirectory() as tmp:
        snap, csv = os.path.join(tmp, "snap.pickle"), os.path.join(tmp, "trace.csv.gz")
        with open(snap, "wb") as f:
            pickle.dump({"segments": [], "device_traces": [ev]}, f)
        r = subprocess.run([sys.executable, converter, snap, "-o", csv], capture_output=True,
                           text=True, check=True)
        print(r.stderr.strip())
        want = ("12 events, 4 allocs, 4 frees, 3 streams, peak live 12.0 MiB, 0 never freed, "
                "1 frees of blocks allocated before the history started")
        if want not in r.stderr:
            print(f"expected: {want}")
            return 1
        with gzip.open(csv, "rt") as f:
            lines = f.readlines()
        expect = ["stream,action,addr,size,time_us\n"] + [
            f"{e['stream']},{e['action']},{e['addr']},{e['size']},{e['time_us']}\n" for e in ev]
        if lines != expect:
            print("converted trace:\n" + "".join(lines) + "expected:\n" + "".join(expect))
            return 1
        r = subprocess.run([replay, "--capacity=64MiB", csv], capture_output=True, text=True)
        print(r.stdout + r.stderr)
        want = "trace.csv.gz: pytorch format, 8 ops, 3 streams, peak live 12.0 MiB"
        if r.returncode != 0 or want not in r.stdout:
            print(f"expected a replay with: {want}")
            return 1
        # A missing file or one that is no snapshot: a message, not a traceback.
        with open(os.path.join(tmp, "text.pickle"), "w") as f:
            f.write("not a pickle\n")
        for bad in (os.path.join(tmp, "missing.pickle"), os.path.join(tmp, "text.pickle")):
            r = subprocess.run([sys.executable, converter, bad], capture_output=True, text=True)
            if r.returncode != 1 or "Traceback" in r.stderr or bad not in r.stderr:
                print(f"{bad}: exit {r.returncode}, expected 1 and a message naming it:\n"
                      + r.stderr)
                return 1
    print("torch_trace_test: converted and replayed")
    return 0


if __name__ == "__main__":
    sys.exit(main())

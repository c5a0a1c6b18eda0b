#!/usr/bin/env python3
"""bench/growth_bound.py on small traces whose bounds are known by hand.

    growth_bound_test.py GROWTH_BOUND_PY

Sixteen allocations of 1 MiB, none freed: holding exactly the live bytes
(r = 1) takes a growth per allocation; at twice the live peak (r = 2) the
holdings go 2, 6, 14, 30 MiB: four. The same climb in PyTorch's format,
gzipped, with a block freed (free_requested) and allocated again, which
needs no growth. --schedule 2 lists those four growths' sizes (2, 4, 8
and 16 MiB). A file that is no trace is an error (exit 1).
"""
import gzip
import os
import subprocess
import sys
import tempfile

MiB = 1 << 20


def growths(tool, path):
    out = subprocess.run([sys.executable, tool, path, "--ratios", "1,2"], check=True,
                         capture_output=True, text=True).stdout
    rows = [line.split("|") for line in out.splitlines() if line.startswith("| ") and
            not line.startswith("| trace") and not line.startswith("| ---")]
    return {float(r[4]): int(r[5]) for r in rows}


def main():
    tool = sys.argv[1]
    failures = 0
    with tempfile.TemporaryDirectory() as d:
        sa = os.path.join(d, "climb.csv")
        with open(sa, "w") as f:
            f.write("# sixteen 1 MiB blocks\nthread,stream,op,id,size,time_ns\n")
            for i in range(16):
                f.write(f"1,0x10,alloc,{i + 1},{MiB},{i}\n")
        torch = os.path.join(d, "climb.csv.gz")
        with gzip.open(torch, "wt") as f:
            f.write("stream,action,addr,size,time_us\n")
            for i in range(16):
                f.write(f"0,alloc,{0x1000 + i},{MiB},{i}\n")
            f.write(f"0,free_requested,{0x1000},{MiB},16\n")
            f.write(f"0,free_completed,{0x1000},{MiB},17\n")
            f.write(f"0,alloc,{0x2000},{MiB},18\n")
        for path in (sa, torch):
            got = growths(tool, path)
            if got != {1.0: 16, 2.0: 4}:
                print(f"FAIL {os.path.basename(path)}: {got}, expected {{1.0: 16, 2.0: 4}}")
                failures += 1
        out = subprocess.run([sys.executable, tool, sa, "--schedule", "2"], check=True,
                             capture_output=True, text=True).stdout
        sizes = [int(x) for x in out.splitlines() if not x.startswith("#")]
        if sizes != [2 * MiB, 4 * MiB, 8 * MiB, 16 * MiB] or "# ops 16," not in out:
            print(f"FAIL --schedule 2: {out!r}")
            failures += 1
        bad = os.path.join(d, "bad.csv")
        with open(bad, "w") as f:
            f.write("a,b,c\n1,2,3\n")
        r = subprocess.run([sys.executable, tool, bad], capture_output=True, text=True)
        if r.returncode != 1 or "header" not in r.stderr:
            print(f"FAIL not a trace: exit {r.returncode}, {r.stderr.strip()!r}")
            failures += 1
    print("growth_bound_test:", "FAILED" if failures else "passed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())

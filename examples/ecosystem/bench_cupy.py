#!/usr/bin/env python3
"""streamarena against CuPy's default memory pool, both as CuPy's allocator
(cupy.cuda.using_allocator), in one process on a GPU:

  pairs     cupy.empty + del of one size, timed per pair: small and large
            arrays, the allocators interleaved over rounds; medians
  workload  arrays of random sizes (log-uniform, 1 KiB to 256 MiB) over many
            steps, a window of them live, each filled on the device: the
            most device memory each allocator held (the pool's total_bytes,
            streamarena's reserved_bytes_peak) against the most bytes the
            arrays needed at once

    python3 bench_cupy.py [--rounds 5] [--pairs 2000] [--steps 3000] [--json FILE]

Prints a table per part; the JSON has every figure.
"""
import argparse
import json
import statistics
import sys
import time

import cupy
import numpy as np

import streamarena.cupy as sac

SIZES = [("256 B", 256), ("4 KiB", 4 << 10), ("64 KiB", 64 << 10), ("1 MiB", 1 << 20),
         ("16 MiB", 16 << 20), ("256 MiB", 256 << 20)]


def time_pairs(malloc, size, n):
    """Microseconds per cupy.empty + del of size bytes under malloc."""
    with cupy.cuda.using_allocator(malloc):
        x = cupy.empty(size, dtype=cupy.uint8)  # warm: the first of a size may map memory
        del x
        t0 = time.perf_counter()
        for _ in range(n):
            x = cupy.empty(size, dtype=cupy.uint8)
            del x
        t1 = time.perf_counter()
    return (t1 - t0) * 1e6 / n


def pairs(allocators, rounds, n):
    times = {(a, s): [] for a in allocators for s, _ in SIZES}
    for r in range(rounds):
        order = list(allocators) if r % 2 == 0 else list(reversed(allocators))
        for label, size in SIZES:
            for a in order:
                times[(a, label)].append(time_pairs(allocators[a], size, n))
    cupy.cuda.Device().synchronize()
    return {f"{a}|{s}": {"median_us": statistics.median(v), "rounds_us": v}
            for (a, s), v in times.items()}


def workload(malloc, steps, seed, window=48):
    """(seconds, peak bytes the live arrays needed) of the random workload."""
    rng = np.random.default_rng(seed)
    live, live_bytes, peak = [], 0, 0
    t0 = time.perf_counter()
    with cupy.cuda.using_allocator(malloc):
        for _ in range(steps):
            size = int(np.exp(rng.uniform(np.log(1 << 10), np.log(256 << 20))))
            x = cupy.empty(size, dtype=cupy.uint8)
            x.fill(1)
            live.append(x)
            live_bytes += size
            peak = max(peak, live_bytes)
            while len(live) > window or (live and rng.random() < 0.3):
                y = live.pop(int(rng.integers(len(live))))
                live_bytes -= y.nbytes
                del y
        live.clear()
        cupy.cuda.Device().synchronize()
    return time.perf_counter() - t0, peak


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--pairs", type=int, default=2000)
    p.add_argument("--steps", type=int, default=3000)
    p.add_argument("--json")
    a = p.parse_args()
    pool = cupy.get_default_memory_pool()
    allocators = {"cupy-pool": pool.malloc, "streamarena": sac.allocator().malloc}
    out = {"cupy": cupy.__version__, "device": cupy.cuda.runtime.getDeviceProperties(0)["name"]
           .decode(errors="replace")}

    out["pairs"] = pairs(allocators, a.rounds, a.pairs)
    print(f"cupy.empty + del, us per pair, median of {a.rounds} rounds (interleaved)")
    print(f"{'size':>8} {'cupy-pool':>10} {'streamarena':>12} {'ratio':>6}")
    for label, _ in SIZES:
        cp_ = out["pairs"][f"cupy-pool|{label}"]["median_us"]
        sa = out["pairs"][f"streamarena|{label}"]["median_us"]
        print(f"{label:>8} {cp_:10.2f} {sa:12.2f} {sa / cp_:6.2f}")

    # The pool first, then streamarena, each starting empty.
    pool.free_all_blocks()
    held = [0]

    def pool_malloc(size):  # the pool's malloc, noting the most it held
        m = pool.malloc(size)
        held[0] = max(held[0], pool.total_bytes())
        return m

    sec_pool, need = workload(pool_malloc, a.steps, 7)
    pool_peak = held[0]
    pool.free_all_blocks()
    sac.free_all_blocks()
    sac.reset_peak()
    before = sac.memory_stats()["reserved_bytes"]
    sec_sa, need_sa = workload(allocators["streamarena"], a.steps, 7)
    sa_peak = sac.memory_stats()["reserved_bytes_peak"]
    out["workload"] = {"steps": a.steps, "peak_needed": need, "pool_peak_reserved": pool_peak,
                       "streamarena_peak_reserved": sa_peak,
                       "streamarena_reserved_before": before,
                       "pool_seconds": sec_pool, "streamarena_seconds": sec_sa}
    assert need == need_sa, "the two runs differ"
    mib = 1 << 20
    print(f"\nrandom arrays, {a.steps} steps: most needed at once {need / mib:.0f} MiB")
    print(f"{'allocator':>12} {'peak held MiB':>14} {'/ needed':>9} {'seconds':>8}")
    print(f"{'cupy-pool':>12} {pool_peak / mib:14.0f} {pool_peak / need:9.3f} {sec_pool:8.2f}")
    print(f"{'streamarena':>12} {sa_peak / mib:14.0f} {sa_peak / need:9.3f} {sec_sa:8.2f}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(out, f, indent=1)
    pr = out["pairs"]
    print("result: pair us pool/streamarena " + ", ".join(
        f"{label} {pr[f'cupy-pool|{label}']['median_us']:.2f}/"
        f"{pr[f'streamarena|{label}']['median_us']:.2f}" for label in ("4 KiB", "256 MiB")) +
        f"; workload peak held/needed pool {pool_peak / need:.2f}, streamarena {sa_peak / need:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

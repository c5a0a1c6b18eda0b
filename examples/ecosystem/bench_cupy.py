#!/usr/bin/env python3
"""streamarena against CuPy's default memory pool, both as CuPy's allocator
(cupy.cuda.using_allocator), in one process on a GPU:

  pairs     cupy.empty + del of one size, timed per pair: small and large
            arrays, the allocators interleaved over rounds; medians. With
            libcupy_floor.so (examples/ecosystem/cupy_floor.c, beside this
            script or --floor-lib) a third allocator, c-floor: CuPy's C
            allocator hook over functions that do nothing but hand out one
            block, what that path costs CuPy before any allocator runs
  workload  arrays of random sizes (log-uniform, 1 KiB to 256 MiB) over many
            steps, a window of them live, each filled on the device: the
            most device memory each allocator held (the pool's total_bytes,
            streamarena's reserved_bytes_peak) against the most bytes the
            arrays needed at once

    python3 bench_cupy.py [--rounds 5] [--pairs 2000] [--steps 3000 (0: pairs only)] [--json FILE]
                          [--floor-lib PATH]

Prints a table per part; the JSON has every figure.
"""
import argparse
import ctypes
import json
import os
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


class _FloorBlock(ctypes.Structure):
    """cupy_floor.c's floor_block."""
    _fields_ = [("base", ctypes.c_size_t), ("capacity", ctypes.c_size_t), ("out", ctypes.c_int)]


def floor_allocator(path):
    """The c-floor allocator's malloc over one block as large as the largest
    size timed (taken from CuPy's pool now, held while the process runs),
    or None where path is not there."""
    if not path or not os.path.exists(path):
        return None
    lib = ctypes.CDLL(path)
    block = cupy.cuda.memory.alloc(max(size for _, size in SIZES))
    param = _FloorBlock(block.ptr, block.mem.size, 0)

    def address(fn):
        return ctypes.cast(fn, ctypes.c_void_p).value

    owner = (lib, block, param)  # CuPy keeps the owner while the allocator lives
    c = cupy.cuda.memory.CFunctionAllocator(ctypes.addressof(param), address(lib.sa_floor_malloc),
                                            address(lib.sa_floor_free), owner)
    x = cupy.cuda.using_allocator(c.malloc)
    with x:  # it must hand the block out and take it back
        y = cupy.empty(16, dtype=cupy.uint8)
        assert y.data.ptr == block.ptr, "the floor allocator did not hand out its block"
        del y
    assert param.out == 0, "the floor allocator's block was not freed"
    return c.malloc


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


def paired_ratio(out, allocator, label):
    """The median over the rounds of allocator's time over the pool's in the
    same round: a machine that drifts between rounds moves both."""
    mine = out["pairs"][f"{allocator}|{label}"]["rounds_us"]
    pool = out["pairs"][f"cupy-pool|{label}"]["rounds_us"]
    return statistics.median(m / p for m, p in zip(mine, pool))


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--pairs", type=int, default=2000)
    p.add_argument("--steps", type=int, default=3000)
    p.add_argument("--json")
    p.add_argument("--floor-lib", default=os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                                       "libcupy_floor.so"))
    a = p.parse_args()
    pool = cupy.get_default_memory_pool()
    allocators = {"cupy-pool": pool.malloc, "streamarena": sac.allocator().malloc}
    floor = floor_allocator(a.floor_lib)
    if floor is not None:
        allocators["c-floor"] = floor
    out = {"cupy": cupy.__version__, "device": cupy.cuda.runtime.getDeviceProperties(0)["name"]
           .decode(errors="replace")}

    out["pairs"] = pairs(allocators, a.rounds, a.pairs)
    print(f"cupy.empty + del, us per pair, median of {a.rounds} rounds (interleaved); ratio: "
          "the median over the rounds of the allocator's time over the pool's in that round")
    print(f"{'size':>8} {'cupy-pool':>10} {'streamarena':>12} {'ratio':>6}"
          + (f" {'c-floor':>8} {'ratio':>6}" if floor is not None else ""))
    for label, _ in SIZES:
        cp_ = out["pairs"][f"cupy-pool|{label}"]["median_us"]
        sa = out["pairs"][f"streamarena|{label}"]["median_us"]
        line = f"{label:>8} {cp_:10.2f} {sa:12.2f} {paired_ratio(out, 'streamarena', label):6.2f}"
        if floor is not None:
            fl = out["pairs"][f"c-floor|{label}"]["median_us"]
            line += f" {fl:8.2f} {paired_ratio(out, 'c-floor', label):6.2f}"
        print(line)

    if a.steps == 0:  # the pairs alone
        if a.json:
            with open(a.json, "w") as f:
                json.dump(out, f, indent=1)
        return 0

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
